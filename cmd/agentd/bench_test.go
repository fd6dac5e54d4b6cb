package main

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// newBenchEnv is newEnv for a benchmark, with the agent logging only warnings.
func newBenchEnv(b *testing.B) *env {
	e := newEnv(b)
	e.quiet = true
	e.startAgent()
	return e
}

// waitHash blocks until host reports every unit in want (unit -> hash)
// with that hash and active.
func waitHash(ctx context.Context, reg *registry.Client, host string, want map[string]string) error {
	return reg.WatchStatuses(ctx, []string{host}, func(all map[string]map[string]reconcile.Status) bool {
		for u, h := range want {
			s, ok := all[host][u]
			if !ok || s.Hash != h || s.ActiveState != "active" {
				return false
			}
		}
		return true
	})
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// BenchmarkPutToRestart: latency from the registry put of new content to
// the agent reporting the unit restarted on it (the restart job done and the
// status published), over 200 changes.
//
//	go test ./cmd/agentd -run '^$' -bench PutToRestart -benchtime 1x
func BenchmarkPutToRestart(b *testing.B) {
	e := newBenchEnv(b)
	ctx := context.Background()
	const changes = 200
	for b.Loop() {
		var lat []time.Duration
		for i := range changes {
			content := []byte(fmt.Sprintf("[Service]\nType=exec\nExecStart=/bin/sleep %d\n"+fast, 10000+i))
			start := time.Now()
			if _, err := e.reg.Put(ctx, registry.Target{Host: e.host}, map[string][]byte{"bench.service": content}); err != nil {
				b.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := waitHash(wctx, e.reg, e.host, map[string]string{"bench.service": reconcile.Hash(content)})
			cancel()
			if err != nil {
				b.Fatalf("change %d: %v", i, err)
			}
			lat = append(lat, time.Since(start))
		}
		b.ReportMetric(float64(percentile(lat, 0.50).Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(slices.Max(lat).Microseconds())/1000, "max-ms")
	}
}

// BenchmarkBurst50: 50 changed units put in one transaction; time until all
// 50 run their new content, and the daemon-reloads systemd performed for it.
//
//	go test ./cmd/agentd -run '^$' -bench Burst50 -benchtime 5x
func BenchmarkBurst50(b *testing.B) {
	e := newBenchEnv(b)
	ctx := context.Background()
	reloads := e.h.CountReloads(b)
	round := 0
	var total time.Duration
	for b.Loop() {
		units := map[string][]byte{}
		want := map[string]string{}
		for i := range 50 {
			name := fmt.Sprintf("burst%02d.service", i)
			units[name] = []byte(fmt.Sprintf("[Service]\nType=exec\nExecStart=/bin/sleep %d\n"+fast, 100000+1000*round+i))
			want[name] = reconcile.Hash(units[name])
		}
		round++
		start := time.Now()
		if _, err := e.reg.Put(ctx, registry.Target{Host: e.host}, units); err != nil {
			b.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := waitHash(wctx, e.reg, e.host, want)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(round), "ms/burst")
	b.ReportMetric(float64(reloads())/float64(round), "reloads/burst")
}
