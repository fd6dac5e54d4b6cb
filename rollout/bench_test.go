package rollout

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentd/agentd/calendar"
)

// One coordinator pass's decision about a rollout of 10,000 hosts in the
// middle of its run (half healthy, 1% taking the change, every host up):
// plain --max-unavailable (the baseline), the same as a budget per rack
// (100 racks), and inside a window. Run:
//
//	go test -bench Decide -run '^$' ./rollout
func BenchmarkDecide10000(b *testing.B) {
	const n = 10000
	win, err := calendar.ParseWindow("*-*-* 00:00 UTC for 23h")
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		s    Strategy
	}{
		{"max-unavailable", Strategy{MaxUnavailable: Count{N: 100}}},
		{"budget-by-rack", Strategy{MaxUnavailable: Count{N: 1}, BudgetBy: "rack"}},
		{"window", Strategy{MaxUnavailable: Count{N: 100}, Window: &win}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r, entries := fixture(tc.s, n)
			labels := map[string]map[string]string{}
			progress, admitted, live := map[string]*Progress{}, map[string]bool{}, map[string]bool{}
			for i, h := range r.Hosts {
				labels[h] = map[string]string{"rack": fmt.Sprintf("r%02d", i%100)}
				live[h] = true
				switch {
				case i < n/2:
					progress[h], admitted[h] = &Progress{State: HostHealthy, HealthyAt: t0}, true
				case i < n/2+100:
					progress[h], admitted[h] = &Progress{State: HostSoaking, Since: t0}, true
				}
			}
			r.Buckets, r.BucketNames = tc.s.Buckets(r.Hosts, labels)
			g := GroupView{Progress: progress, Admitted: admitted, Entries: entries, Live: live}
			now := t0.Add(time.Hour)
			b.ResetTimer()
			for b.Loop() {
				Decide(r, g, "h1", now)
			}
		})
	}
}
