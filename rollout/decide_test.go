package rollout

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/calendar"
	"github.com/agentd/agentd/reconcile"
)

// at is a host's progress: in state s since since (healthy hosts became
// healthy then).
func at(s HostState, since time.Time, reason string) *Progress {
	p := &Progress{State: s, Since: since, Reason: reason}
	if s == HostHealthy {
		p.HealthyAt = since
	}
	return p
}

func TestDecide(t *testing.T) {
	canaryWaves := Strategy{Canary: Count{N: 1}, Waves: []Count{pct(50)}} // 5 hosts: [h1] [h2 h3] [h4 h5]
	threshold50 := Strategy{Waves: []Count{{N: 4}}, SuccessThreshold: 50} // 5 hosts: [h1 h2 h3 h4] [h5]
	byRack := Strategy{MaxUnavailable: Count{N: 1}, BudgetBy: "rack"}
	window := func(text string) *calendar.Window {
		w, err := calendar.ParseWindow(text)
		if err != nil {
			t.Fatal(err)
		}
		return &w
	}
	after := Strategy{MaxUnavailable: Count{N: 1}, Follows: &Ref{Group: "db", ID: "r0"}}
	racks := func(r *Record) {
		r.Buckets, r.BucketNames = []int{0, 0, 1, 1, 2}, []string{"rack=r1", "rack=r2", "(no rack)"}
	}
	now := t0.Add(30 * time.Second)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	healthy := func(hosts ...string) map[string]*Progress {
		m := map[string]*Progress{}
		for _, h := range hosts {
			m[h] = at(HostHealthy, ago(20*time.Second), "")
		}
		return m
	}
	with := func(m map[string]*Progress, host string, p *Progress) map[string]*Progress {
		m[host] = p
		return m
	}
	for _, tc := range []struct {
		name     string
		strategy Strategy
		hosts    int // 5 when 0
		edit     func(r *Record)
		progress map[string]*Progress
		// admitted are the hosts admitted before; nil: every host with
		// progress.
		admitted []string
		entries  []reconcile.Entry // nil: the rollout's own keys
		now      time.Time         // now when zero
		follows  *Followed
		live     []string // the hosts with a live agent; nil: not known

		want      State
		wantEnd   bool // Decide writes an end (of state want)
		wave      int
		admit     []string
		reason    []string // in the phase's reason
		notReason []string
		offenders []string
		due       time.Time
	}{
		// Waves.
		{
			name: "start: the canary is admitted first and nothing else", strategy: canaryWaves,
			want: Running, admit: []string{"h1"},
		},
		{
			name: "canary admitted, its agent not started: nothing more admitted", strategy: canaryWaves,
			admitted: []string{"h1"}, want: Running,
		},
		{
			name: "canary applying: nothing more admitted", strategy: canaryWaves,
			progress: map[string]*Progress{"h1": at(HostApplying, ago(time.Second), "wave 1 of 3")}, want: Running,
		},
		{
			name: "canary soaking: nothing more admitted", strategy: canaryWaves,
			progress: map[string]*Progress{"h1": at(HostSoaking, ago(time.Second), "")}, want: Running,
		},
		{
			name: "canary healthy: the second wave is admitted", strategy: canaryWaves,
			progress: healthy("h1"), want: Running, wave: 1, admit: []string{"h2", "h3"},
		},
		{
			name: "second wave partly healthy: the third waits", strategy: canaryWaves,
			progress: with(healthy("h1", "h2"), "h3", at(HostSoaking, ago(time.Second), "")), want: Running, wave: 1,
		},
		{
			name: "second wave healthy: the last wave is admitted", strategy: canaryWaves,
			progress: healthy("h1", "h2", "h3"), want: Running, wave: 2, admit: []string{"h4", "h5"},
		},
		{
			name: "a host of the open wave admitted before is not admitted again", strategy: canaryWaves,
			progress: healthy("h1"), admitted: []string{"h1", "h2"}, want: Running, wave: 1, admit: []string{"h3"},
		},
		{
			name: "one wave: every host admitted at once", strategy: Strategy{Soak: time.Second},
			want: Running, admit: hostNames(5),
		},

		// --max-unavailable.
		{
			name: "max-unavailable 1: one host admitted", strategy: Strategy{MaxUnavailable: Count{N: 1}},
			want: Running, admit: []string{"h1"},
		},
		{
			name: "max-unavailable 1: admitted with no progress yet holds the slot", strategy: Strategy{MaxUnavailable: Count{N: 1}},
			admitted: []string{"h1"}, want: Running,
		},
		{
			name: "max-unavailable 1: applying holds the slot", strategy: Strategy{MaxUnavailable: Count{N: 1}},
			progress: map[string]*Progress{"h1": at(HostApplying, ago(time.Second), "")}, want: Running,
		},
		{
			name: "max-unavailable 1: soaking holds the slot", strategy: Strategy{MaxUnavailable: Count{N: 1}},
			progress: map[string]*Progress{"h1": at(HostSoaking, ago(time.Second), "")}, want: Running,
		},
		{
			name: "max-unavailable 1: healthy frees the slot for the next host", strategy: Strategy{MaxUnavailable: Count{N: 1}},
			progress: healthy("h1"), want: Running, admit: []string{"h2"},
		},
		{
			name: "max-unavailable 1: a healthy host and one admitted leave no room", strategy: Strategy{MaxUnavailable: Count{N: 1}},
			progress: healthy("h1"), admitted: []string{"h1", "h2"}, want: Running,
		},
		{
			name: "max-unavailable 2: room for one beside an applying host", strategy: Strategy{MaxUnavailable: Count{N: 2}},
			progress: with(healthy("h1"), "h2", at(HostApplying, ago(time.Second), "")), want: Running, admit: []string{"h3"},
		},
		{
			name: "max-unavailable 40%: two of five", strategy: Strategy{MaxUnavailable: pct(40)},
			want: Running, admit: []string{"h1", "h2"},
		},
		{
			name: "max-unavailable 1%: still one host", strategy: Strategy{MaxUnavailable: pct(1)},
			want: Running, admit: []string{"h1"},
		},
		{
			name: "max-unavailable within the open wave only", strategy: Strategy{Canary: Count{N: 1}, MaxUnavailable: Count{N: 3}},
			want: Running, admit: []string{"h1"},
		},

		// Held: paused, waiting for promote or the gate.
		{
			name: "paused: nothing admitted", strategy: canaryWaves,
			edit:     func(r *Record) { r.Paused, r.PauseReason = true, "paused by ops" },
			progress: healthy("h1"), want: Paused, wave: 1, reason: []string{"paused by ops"},
		},
		{
			name: "paused before the canary: nothing admitted", strategy: canaryWaves,
			edit: func(r *Record) { r.Paused = true }, want: Paused,
		},
		{
			name: "pause-after-canary, canary not healthy yet: running", strategy: Strategy{Canary: Count{N: 1}, PauseAfterCanary: true},
			progress: map[string]*Progress{"h1": at(HostApplying, ago(time.Second), "")}, want: Running,
		},
		{
			name: "pause-after-canary, canary healthy: waiting for promote", strategy: Strategy{Canary: Count{N: 1}, PauseAfterCanary: true},
			progress: healthy("h1"), want: WaitingPromote, wave: 1, reason: []string{"agentd rollout promote r1"},
		},
		{
			name: "promoted: the next wave is admitted", strategy: Strategy{Canary: Count{N: 1}, PauseAfterCanary: true},
			edit:     func(r *Record) { r.Promoted = true },
			progress: healthy("h1"), want: Running, wave: 1, admit: []string{"h2", "h3", "h4", "h5"},
		},
		{
			name: "gate: the first wave does not wait for it", strategy: Strategy{Canary: Count{N: 1}, GateCmd: "true"},
			want: Running, admit: []string{"h1"},
		},
		{
			name: "gate: waiting for it before the second wave", strategy: Strategy{Canary: Count{N: 1}, Waves: []Count{pct(50)}, GateCmd: "true"},
			progress: healthy("h1"), want: WaitingGate, wave: 1, reason: []string{"before wave 2"},
		},
		{
			name: "gate passed for the second wave: admitted", strategy: Strategy{Canary: Count{N: 1}, Waves: []Count{pct(50)}, GateCmd: "true"},
			edit:     func(r *Record) { r.Gated = 1 },
			progress: healthy("h1"), want: Running, wave: 1, admit: []string{"h2", "h3"},
		},
		{
			name: "gate passed for the second wave only: waiting before the third", strategy: Strategy{Canary: Count{N: 1}, Waves: []Count{pct(50)}, GateCmd: "true"},
			edit:     func(r *Record) { r.Gated = 1 },
			progress: healthy("h1", "h2", "h3"), want: WaitingGate, wave: 2, reason: []string{"before wave 3"},
		},

		// Ends.
		{
			name: "a failed host ends it failed, naming the host", strategy: canaryWaves,
			progress: with(with(healthy("h1", "h2"), "h3", at(HostFailed, ago(time.Second), "a.service: exited 1")), "h4", at(HostApplying, ago(time.Second), "")),
			admitted: []string{"h1", "h2", "h3", "h4"},
			want:     Failed, wantEnd: true, wave: 1, reason: []string{"h3 failed the change: a.service: exited 1"}, notReason: []string{"more"},
			offenders: []string{"h3"},
		},
		{
			name: "two failed hosts: the first named, the other counted", strategy: Strategy{},
			progress: map[string]*Progress{"h2": at(HostFailed, ago(time.Second), "boom"), "h4": at(HostFailed, ago(time.Second), "bang")},
			want:     Failed, wantEnd: true, reason: []string{"h2 failed the change: boom", "(and 1 more host)"},
			offenders: []string{"h2", "h4"},
		},
		{
			name: "a failed host ends a paused rollout failed", strategy: canaryWaves,
			edit:     func(r *Record) { r.Paused = true },
			progress: map[string]*Progress{"h1": at(HostFailed, ago(time.Second), "boom")},
			want:     Failed, wantEnd: true, reason: []string{"h1 failed"}, offenders: []string{"h1"},
		},
		{
			name: "every host healthy: done", strategy: canaryWaves,
			progress: healthy(hostNames(5)...), want: Done, wantEnd: true, wave: 2,
		},
		{
			name: "every host healthy while paused: done", strategy: canaryWaves,
			edit:     func(r *Record) { r.Paused = true },
			progress: healthy(hostNames(5)...), want: Done, wantEnd: true, wave: 2,
		},
		{
			name: "keys written again: superseded", strategy: canaryWaves,
			progress: healthy("h1"), entries: overwritten(),
			want: Superseded, wantEnd: true, wave: 1, reason: []string{"written again"},
		},
		{
			name: "keys removed: superseded", strategy: canaryWaves,
			entries: []reconcile.Entry{}, want: Superseded, wantEnd: true,
		},

		// The progress deadline.
		{
			name:     "progress deadline passed: failed, naming the stuck admitted host and its state",
			strategy: Strategy{Canary: Count{N: 1}, Waves: []Count{pct(50)}, ProgressDeadline: time.Minute},
			progress: map[string]*Progress{
				"h1": at(HostHealthy, t0.Add(10*time.Second), ""),
				"h2": at(HostHealthy, t0.Add(20*time.Second), ""),
				"h3": at(HostApplying, t0.Add(67*time.Second), "wave 2 of 3"),
			},
			now:  t0.Add(81 * time.Second),
			want: Failed, wantEnd: true, wave: 1,
			reason:    []string{"no host became healthy for 1m0s (--progress-deadline)", "since " + t0.Add(20*time.Second).UTC().Format(time.DateTime), "holding it up: h3: applying for 14s (wave 2 of 3)"},
			notReason: []string{"h1", "h2:", "h4", "h5"},
			offenders: []string{"h3"},
		},
		{
			name:     "progress deadline passed: an admitted host whose agent never started holds it up",
			strategy: Strategy{Canary: Count{N: 1}, ProgressDeadline: time.Minute},
			admitted: []string{"h1"},
			now:      t0.Add(61 * time.Second),
			want:     Failed, wantEnd: true,
			reason:    []string{"h1: admitted, but its agent has not started"},
			notReason: []string{"h2", "h3", "h4", "h5"},
			offenders: []string{"h1"},
		},
		{
			name:     "progress deadline not passed: running, due at the deadline",
			strategy: Strategy{Canary: Count{N: 1}, ProgressDeadline: time.Minute},
			progress: map[string]*Progress{"h1": at(HostApplying, t0.Add(time.Second), "")},
			now:      t0.Add(59 * time.Second),
			want:     Running, due: t0.Add(time.Minute + time.Millisecond),
		},
		{
			name:     "progress deadline: a healthy host moves it on",
			strategy: Strategy{Canary: Count{N: 1}, ProgressDeadline: time.Minute},
			progress: map[string]*Progress{"h1": at(HostHealthy, t0.Add(50*time.Second), "")},
			now:      t0.Add(90 * time.Second),
			want:     Running, wave: 1, admit: []string{"h2", "h3", "h4", "h5"}, due: t0.Add(110*time.Second + time.Millisecond),
		},
		{
			name:     "progress deadline: counted from the resume",
			strategy: Strategy{Canary: Count{N: 1}, ProgressDeadline: time.Minute},
			edit:     func(r *Record) { r.ResumedAt = t0.Add(5 * time.Minute) },
			progress: map[string]*Progress{"h1": at(HostApplying, t0.Add(time.Second), "")},
			now:      t0.Add(5*time.Minute + 30*time.Second),
			want:     Running, due: t0.Add(6*time.Minute + time.Millisecond),
		},
		{
			name:     "progress deadline: does not run while paused",
			strategy: Strategy{Canary: Count{N: 1}, ProgressDeadline: time.Minute},
			edit:     func(r *Record) { r.Paused = true },
			progress: map[string]*Progress{"h1": at(HostApplying, t0.Add(time.Second), "")},
			now:      t0.Add(time.Hour),
			want:     Paused,
		},

		// Ended already: nothing moves.
		{
			name: "ended failed: nothing admitted, no second end", strategy: canaryWaves,
			edit:     func(r *Record) { r.End = &End{State: Failed, Reason: "h1 failed the change: boom", At: t0} },
			progress: map[string]*Progress{"h1": at(HostFailed, ago(time.Second), "boom")},
			want:     Failed, reason: []string{"h1 failed"}, offenders: []string{"h1"},
		},
		{
			name: "aborted: nothing admitted", strategy: canaryWaves,
			edit: func(r *Record) {
				r.Abort, r.End = &Abort{At: t0}, &End{State: Aborted, Reason: "aborted by ops", At: t0}
			},
			progress: healthy("h1"), want: Aborted, wave: 1, reason: []string{"aborted by ops"},
		},
		{
			name: "done, then its keys written again: stays done", strategy: canaryWaves,
			edit:     func(r *Record) { r.End = &End{State: Done, At: t0} },
			progress: healthy(hostNames(5)...), entries: overwritten(), want: Done, wave: 2,
		},
		{
			name: "superseded before it started: nothing admitted", strategy: Strategy{MaxUnavailable: Count{N: 2}},
			edit: func(r *Record) { r.End = &End{State: Superseded, SupersededBy: "r2", At: t0} },
			want: Superseded,
		},

		// --success-threshold 50%: 5 hosts in waves [h1 h2 h3 h4] [h5].
		{
			name: "threshold: a failed host of the open wave does not fail the rollout", strategy: threshold50,
			progress: with(with(with(healthy("h1"), "h2", at(HostFailed, ago(time.Second), "exit 1")), "h3", at(HostSoaking, ago(time.Second), "")), "h4", at(HostSoaking, ago(time.Second), "")),
			want:     Running, offenders: []string{"h2"},
		},
		{
			name: "threshold: enough healthy and the rest failed: the wave is done, the next admitted", strategy: threshold50,
			progress: with(with(healthy("h1", "h2"), "h3", at(HostFailed, ago(time.Second), "exit 1")), "h4", at(HostFailed, ago(time.Second), "exit 1")),
			want:     Running, wave: 1, admit: []string{"h5"}, offenders: []string{"h3", "h4"},
		},
		{
			name: "threshold: enough healthy, one still soaking: the wave is not done", strategy: threshold50,
			progress: with(with(healthy("h1", "h2"), "h3", at(HostFailed, ago(time.Second), "exit 1")), "h4", at(HostSoaking, ago(time.Second), "")),
			want:     Running, offenders: []string{"h3"},
		},
		{
			name: "threshold: more failed than it leaves room for: the rollout fails", strategy: threshold50,
			progress: with(with(with(healthy("h1"), "h2", at(HostFailed, ago(time.Second), "exit 1")), "h3", at(HostFailed, ago(time.Second), "exit 2")), "h4", at(HostFailed, ago(time.Second), "exit 3")),
			want:     Failed, wantEnd: true, reason: []string{"h2 failed the change: exit 1", "and 2 more", "wave 1 needs 2 of its 4 hosts healthy (--success-threshold 50%)"},
			offenders: []string{"h2", "h3", "h4"},
		},
		{
			name: "threshold: every wave done: ends done, naming the failed hosts", strategy: threshold50,
			progress: with(with(healthy("h1", "h2", "h5"), "h3", at(HostFailed, ago(time.Second), "exit 1")), "h4", at(HostFailed, ago(time.Second), "exit 1")),
			want:     Done, wantEnd: true, wave: 1, reason: []string{"2 hosts failed: h3, h4 (within --success-threshold 50%)"}, offenders: []string{"h3", "h4"},
		},
		{
			name: "threshold: the last wave's one host failed: the rollout fails", strategy: threshold50,
			progress: with(with(with(healthy("h1", "h2"), "h3", at(HostFailed, ago(time.Second), "exit 1")), "h4", at(HostFailed, ago(time.Second), "exit 1")), "h5", at(HostFailed, ago(time.Second), "boom")),
			want:     Failed, wantEnd: true, wave: 1, reason: []string{"h5 failed the change: boom", "wave 2 needs 1 of its 1 hosts"}, offenders: []string{"h3", "h4", "h5"},
		},
		{
			name: "no threshold: the first failure fails the rollout", strategy: Strategy{Waves: []Count{{N: 4}}},
			progress: with(with(healthy("h1"), "h2", at(HostFailed, ago(time.Second), "exit 1")), "h3", at(HostSoaking, ago(time.Second), "")),
			want:     Failed, wantEnd: true, reason: []string{"h2 failed the change: exit 1"}, notReason: []string{"threshold"}, offenders: []string{"h2"},
		},
		{
			name: "waves by label: the waves the record names are admitted one by one", strategy: Strategy{WavesBy: "rack"},
			edit: func(r *Record) {
				r.WaveEnds, r.WaveLabels = []int{2, 4, 5}, []string{"rack=r1", "rack=r2", "(no rack)"}
			},
			progress: healthy("h1", "h2"), want: Running, wave: 1, admit: []string{"h3", "h4"},
		},

		// --max-unavailable 1 --budget-by rack: 5 hosts, racks [h1 h2] r1, [h3 h4] r2, h5 none.
		{
			name: "budget by rack: one host of each rack at once, the unlabelled hosts a budget of their own", strategy: byRack,
			edit: racks, want: Running, admit: []string{"h1", "h3", "h5"},
		},
		{
			name: "budget by rack: a rack's host soaking holds its rack only", strategy: byRack,
			edit: racks, progress: with(healthy("h3"), "h1", at(HostSoaking, ago(time.Second), "")),
			want: Running, admit: []string{"h4", "h5"},
		},
		{
			name: "budget by rack: admitted without progress yet holds its rack", strategy: byRack,
			edit: racks, admitted: []string{"h1"}, want: Running, admit: []string{"h3", "h5"},
		},
		{
			name: "budget by rack: a reverting host holds its rack", strategy: byRack,
			edit: racks, progress: map[string]*Progress{"h2": at(HostReverting, ago(time.Second), "")},
			want: Running, admit: []string{"h3", "h5"},
		},
		{
			name: "budget by rack, 50%: half of each rack's hosts (rounded up) at once", strategy: Strategy{MaxUnavailable: pct(50), BudgetBy: "rack"},
			hosts: 6, edit: func(r *Record) { r.Buckets, r.BucketNames = []int{0, 0, 0, 0, 1, 1}, []string{"rack=r1", "rack=r2"} },
			want: Running, admit: []string{"h1", "h2", "h5"},
		},
		{
			name: "budget by rack: a joiner (no rack known) waits while any host is taking the change", strategy: byRack,
			edit: func(r *Record) {
				racks(r)
				r.Hosts = append(r.Hosts, "h6")
				r.WaveEnds = []int{6}
				r.Joined = []string{"h6"}
			},
			progress: with(healthy("h1", "h2", "h3", "h4"), "h5", at(HostApplying, ago(time.Second), "")),
			want:     Running,
		},
		{
			name: "budget by rack: a joiner goes alone once nothing else is taking the change", strategy: byRack,
			edit: func(r *Record) {
				racks(r)
				r.Hosts = append(r.Hosts, "h6")
				r.WaveEnds = []int{6}
				r.Joined = []string{"h6"}
			},
			progress: healthy("h1", "h2", "h3", "h4", "h5"), want: Running, admit: []string{"h6"},
		},
		{
			name: "budget by rack: nothing admitted beside a joiner taking the change", strategy: byRack,
			edit: func(r *Record) {
				racks(r)
				r.Hosts = append(r.Hosts, "h6")
				r.WaveEnds = []int{6}
				r.Joined = []string{"h6"}
			},
			progress: map[string]*Progress{"h6": at(HostApplying, ago(time.Second), "")}, want: Running,
		},

		// --after db/r0: waits, before its first host, for r0 to end done.
		{
			name: "after: nothing read yet: waits, nothing admitted, looks again soon", strategy: after,
			want: WaitingAfter, reason: []string{"waiting for rollout db/r0 to end done (--after)"}, due: now.Add(FollowEvery),
		},
		{
			name: "after: the other runs: waits, saying where it is", strategy: after,
			follows: &Followed{Phase: &Phase{State: Running, Wave: 1}},
			want:    WaitingAfter, reason: []string{"it is running, wave 2"}, due: now.Add(FollowEvery),
		},
		{
			name: "after: the other failed: waits, saying so and how to end this one", strategy: after,
			follows: &Followed{Phase: &Phase{State: Failed, Reason: "h9 failed the change: exit 1"}},
			want:    WaitingAfter, reason: []string{"rollout db/r0 (--after) ended failed: h9 failed the change: exit 1", "agentd rollout abort r1"}, due: now.Add(FollowEvery),
		},
		{
			name: "after: the other could not be read: waits, saying why", strategy: after,
			follows: &Followed{Err: "etcdserver: request timed out"},
			want:    WaitingAfter, reason: []string{"cannot read it: etcdserver: request timed out"}, due: now.Add(FollowEvery),
		},
		{
			name: "after: the other ended done: begins", strategy: after,
			follows: &Followed{Phase: &Phase{State: Done}, At: ago(time.Second)},
			want:    Running, admit: []string{"h1"},
		},
		{
			name: "after: begun already: reads nothing more, goes on", strategy: after,
			progress: healthy("h1"), want: Running, wave: 0, admit: []string{"h2"},
		},
		{
			name:     "after: the progress deadline counts from the other's end",
			strategy: Strategy{MaxUnavailable: Count{N: 1}, ProgressDeadline: time.Minute, Follows: &Ref{Group: "db", ID: "r0"}},
			follows:  &Followed{Phase: &Phase{State: Done}, At: t0.Add(10 * time.Minute)},
			admitted: []string{"h1"}, now: t0.Add(10*time.Minute + 30*time.Second),
			want: Running, due: t0.Add(11*time.Minute + time.Millisecond),
		},
		{
			name: "after, paused: the pause is said first", strategy: after,
			edit: func(r *Record) { r.Paused, r.PauseReason = true, "by ops" }, want: Paused, reason: []string{"by ops"},
		},

		// Hosts without a live agent (live: the others; h4 down).
		{
			name: "down: a host with no live agent is not admitted", strategy: Strategy{MaxUnavailable: Count{N: 2}},
			live: []string{"h1", "h2", "h3", "h5"}, progress: healthy("h1", "h2", "h3"),
			want: Running, admit: []string{"h5"}, offenders: []string{"h4"},
		},
		{
			name: "down: without a threshold it holds its wave, named", strategy: Strategy{},
			live: []string{"h1", "h2", "h3", "h5"}, progress: healthy("h1", "h2", "h3", "h5"),
			want: Running, offenders: []string{"h4"},
		},
		{
			name: "down, threshold: counted as not healthy, the wave done without it", strategy: threshold50,
			live: []string{"h1", "h2", "h3", "h5"}, progress: with(healthy("h1", "h2"), "h3", at(HostFailed, ago(time.Second), "exit 1")),
			want: Running, wave: 1, admit: []string{"h5"}, offenders: []string{"h3", "h4"},
		},
		{
			name: "down, threshold: the rollout ends done naming the failed and the down hosts", strategy: threshold50,
			live: []string{"h1", "h2", "h3", "h5"}, progress: with(healthy("h1", "h2", "h5"), "h3", at(HostFailed, ago(time.Second), "exit 1")),
			want: Done, wantEnd: true, wave: 1, offenders: []string{"h3", "h4"},
			reason: []string{"1 host failed: h3; 1 host had no live agent and did not take it: h4 (within --success-threshold 50%)"},
		},
		{
			name: "down, threshold: too many down holds the wave (not failed: they may come back)", strategy: threshold50,
			live: []string{"h1", "h5"}, progress: healthy("h1"),
			want: Running, offenders: []string{"h2", "h3", "h4"},
		},
		{
			name:     "down: an admitted host that went down is named so past the progress deadline",
			strategy: Strategy{Canary: Count{N: 1}, ProgressDeadline: time.Minute}, live: []string{"h2", "h3", "h4", "h5"},
			admitted: []string{"h1"}, now: t0.Add(61 * time.Second),
			want: Failed, wantEnd: true, reason: []string{"h1: admitted, but it has no live agent"}, offenders: []string{"h1"},
		},

		// --window: now is 00:17:10 UTC.
		{
			name: "window closed: nothing admitted, looks again when it opens", strategy: Strategy{Window: window("*-*-* 01:00 UTC for 1h")},
			want: WaitingWindow, reason: []string{"waiting for window Thu 01:00 UTC (in 42 min"}, due: t0.Add(43*time.Minute + 20*time.Second + time.Millisecond),
		},
		{
			name: "window open: every host admitted, looks again when it closes", strategy: Strategy{Window: window("*-*-* 00:00 UTC for 1h")},
			want: Running, admit: hostNames(5), due: t0.Add(43*time.Minute + 20*time.Second),
		},
		{
			name: "window closed with hosts admitted: they go on, no more admitted", strategy: Strategy{Window: window("*-*-* 01:00 UTC for 1h"), MaxUnavailable: Count{N: 1}},
			progress: map[string]*Progress{"h1": at(HostApplying, ago(time.Second), "")},
			want:     WaitingWindow, due: t0.Add(43*time.Minute + 20*time.Second + time.Millisecond),
		},
		{
			name: "window that never opens again: says so, never looks again", strategy: Strategy{Window: window("1970-01-01 00:00 UTC for 10min")},
			want: WaitingWindow, reason: []string{"never opens again", "agentd rollout promote"},
		},
		{
			name: "window closed, promoted outside it: admitted", strategy: Strategy{Window: window("*-*-* 01:00 UTC for 1h")},
			edit: func(r *Record) { r.OutsideWindow = true }, want: Running, admit: hostNames(5),
		},
		{
			name:     "window: the progress deadline counts from its opening",
			strategy: Strategy{Window: window("*-*-* 00:17 UTC for 1h"), MaxUnavailable: Count{N: 1}, ProgressDeadline: time.Minute},
			admitted: []string{"h1"}, want: Running, due: t0.Add(80*time.Second + time.Millisecond),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.hosts
			if n == 0 {
				n = 5
			}
			r, entries := fixture(tc.strategy, n)
			if tc.edit != nil {
				tc.edit(r)
			}
			if tc.entries != nil {
				entries = tc.entries
			}
			admitted := map[string]bool{}
			if tc.admitted == nil {
				for h := range tc.progress {
					admitted[h] = true
				}
			}
			for _, h := range tc.admitted {
				admitted[h] = true
			}
			now := tc.now
			if now.IsZero() {
				now = t0.Add(30 * time.Second)
			}
			var live map[string]bool
			if tc.live != nil {
				live = map[string]bool{}
				for _, h := range tc.live {
					live[h] = true
				}
			}
			d := Decide(r, GroupView{Progress: tc.progress, Admitted: admitted, Entries: entries, Follows: tc.follows, Live: live}, "h7", now)
			ph := d.Summary.Phase

			if ph.State != tc.want || ph.Wave != tc.wave {
				t.Errorf("phase %s in wave %d (%s), want %s in wave %d", ph.State, ph.Wave, ph.Reason, tc.want, tc.wave)
			}
			switch {
			case tc.wantEnd && d.End == nil:
				t.Errorf("no end written, want %s", tc.want)
			case !tc.wantEnd && d.End != nil:
				t.Errorf("end %+v written, want none", d.End)
			case d.End != nil && (d.End.State != ph.State || d.End.Reason != ph.Reason || !d.End.At.Equal(now)):
				t.Errorf("end %+v, but the phase is %+v", d.End, ph)
			}
			if !slices.Equal(d.Admit, tc.admit) {
				t.Errorf("admitted %v, want %v", d.Admit, tc.admit)
			}
			for _, h := range d.Admit {
				if admitted[h] || tc.progress[h] != nil {
					t.Errorf("%s admitted twice", h)
				}
			}
			for _, s := range tc.reason {
				if !strings.Contains(ph.Reason, s) {
					t.Errorf("reason %q, want it to say %q", ph.Reason, s)
				}
			}
			for _, s := range tc.notReason {
				if strings.Contains(ph.Reason, s) {
					t.Errorf("reason %q says %q", ph.Reason, s)
				}
			}
			var offenders []string
			for _, o := range d.Summary.Offenders {
				offenders = append(offenders, o.Host)
				if o.Wave != r.Wave(o.Host) || o.State != tc.progress[o.Host].StateOf() {
					t.Errorf("offender %+v: want wave %d, state %s", o, r.Wave(o.Host), tc.progress[o.Host].StateOf())
				}
			}
			if !slices.Equal(offenders, tc.offenders) {
				t.Errorf("offenders %v, want %v", offenders, tc.offenders)
			}
			if !d.Due.Equal(tc.due) {
				t.Errorf("due %v, want %v", d.Due, tc.due)
			}
			checkSummary(t, r, d, admitted, tc.progress, now)
		})
	}
}

// checkSummary checks what holds of every summary: its counts add up to
// the host total, it names at most SampleSize hosts per state, in rollout
// order, and counts the admitted hosts, those admitted now included.
func checkSummary(t *testing.T, r *Record, d Decision, admitted map[string]bool, progress map[string]*Progress, now time.Time) {
	t.Helper()
	s := d.Summary
	if s.ID != r.ID || s.Total != len(r.Hosts) || s.Waves != len(r.WaveEnds) || s.Coordinator != "h7" || !s.At.Equal(now) {
		t.Errorf("summary %+v", s)
	}
	sum := 0
	for st, n := range s.Counts {
		sum += n
		if names := s.Hosts[st]; len(names) != min(n, SampleSize) {
			t.Errorf("%d hosts %s, %d named: %v", n, st, len(names), names)
		}
	}
	if sum != s.Total {
		t.Errorf("counts %v add up to %d, want %d", s.Counts, sum, s.Total)
	}
	for st, names := range s.Hosts {
		if len(names) > SampleSize {
			t.Errorf("%d hosts named %s, want at most %d", len(names), st, SampleSize)
		}
		if !slices.IsSortedFunc(names, func(a, b string) int { return slices.Index(r.Hosts, a) - slices.Index(r.Hosts, b) }) {
			t.Errorf("hosts %s out of rollout order: %v", st, names)
		}
		for _, h := range names {
			if progress[h].StateOf() != st {
				t.Errorf("%s named %s, but it is %s", h, st, progress[h].StateOf())
			}
		}
	}
	want := len(d.Admit)
	for _, h := range r.Hosts {
		if admitted[h] || progress[h] != nil {
			want++
		}
	}
	if s.Admitted != want {
		t.Errorf("summary counts %d admitted, want %d", s.Admitted, want)
	}
	if len(s.Offenders) > SampleSize {
		t.Errorf("%d offenders, want at most %d", len(s.Offenders), SampleSize)
	}
}

// A large group: the summary counts every host and names a sample.
func TestDecideSummaryOfManyHosts(t *testing.T) {
	const n = 40
	r, entries := fixture(Strategy{Waves: []Count{pct(50)}, MaxUnavailable: Count{N: 8}}, n)
	now := t0.Add(time.Minute)
	progress := map[string]*Progress{}
	admitted := map[string]bool{}
	for i, h := range r.Hosts {
		switch {
		case i < 15:
			progress[h] = at(HostHealthy, t0.Add(time.Duration(i)*time.Second), "")
		case i < 18:
			progress[h] = at(HostSoaking, now.Add(-time.Second), "")
		case i < 19:
			progress[h] = at(HostApplying, now.Add(-time.Second), "wave 1 of 2")
		case i < 20:
			admitted[h] = true // its agent has not started
		}
		if progress[h] != nil {
			admitted[h] = true
		}
	}
	d := Decide(r, GroupView{Progress: progress, Admitted: admitted, Entries: entries}, "h7", now)
	// 5 hosts of wave 1 not healthy, room for 3 more out of 8
	// unavailable: but wave 1 has no host left to admit (h1..h20 all are).
	if d.End != nil || len(d.Admit) != 0 || d.Summary.Phase.State != Running || d.Summary.Phase.Wave != 0 {
		t.Fatalf("decision %+v", d)
	}
	s := d.Summary
	want := map[HostState]int{HostHealthy: 15, HostSoaking: 3, HostApplying: 1, HostPending: 21}
	for st, n := range want {
		if s.Counts[st] != n {
			t.Errorf("%d hosts %s, want %d", s.Counts[st], st, n)
		}
	}
	if !slices.Equal(s.Hosts[HostHealthy], hostNames(SampleSize)) {
		t.Errorf("healthy hosts named %v", s.Hosts[HostHealthy])
	}
	if !slices.Equal(s.Hosts[HostPending], r.Hosts[19:19+SampleSize]) {
		t.Errorf("pending hosts named %v", s.Hosts[HostPending])
	}
	if s.Admitted != 20 {
		t.Errorf("%d admitted, want 20", s.Admitted)
	}
	if got := s.Named(HostHealthy); got != strings.Join(hostNames(SampleSize), ", ")+" and 5 more" {
		t.Errorf("Named(healthy) = %q", got)
	}
	checkSummary(t, r, d, admitted, progress, now)

	// Wave 1 healthy: wave 2 opens, as many as 8 unavailable allow.
	for _, h := range r.Hosts[:20] {
		progress[h] = at(HostHealthy, t0.Add(50*time.Second), "")
	}
	progress["h21"] = at(HostApplying, now.Add(-time.Second), "wave 2 of 2")
	admitted["h21"] = true
	d = Decide(r, GroupView{Progress: progress, Admitted: admitted, Entries: entries}, "h7", now)
	if !slices.Equal(d.Admit, r.Hosts[21:28]) || d.Summary.Phase.Wave != 1 {
		t.Fatalf("wave 2: admitted %v in wave %d, want %v", d.Admit, d.Summary.Phase.Wave, r.Hosts[21:28])
	}
	if d.Summary.Admitted != 28 {
		t.Errorf("%d admitted, want 28", d.Summary.Admitted)
	}
	checkSummary(t, r, d, admitted, progress, now)
}

// More failed hosts than a summary names: it lists SampleSize offenders.
func TestDecideManyFailed(t *testing.T) {
	const n = 30
	r, entries := fixture(Strategy{}, n)
	progress := map[string]*Progress{}
	for i, h := range r.Hosts {
		if i%2 == 0 {
			progress[h] = at(HostFailed, t0, fmt.Sprintf("boom %d", i))
		}
	}
	d := Decide(r, GroupView{Progress: progress, Entries: entries}, "h7", t0.Add(time.Second))
	if d.End == nil || d.End.State != Failed || !strings.HasPrefix(d.End.Reason, "h1 failed the change: boom 0 (and ") {
		t.Fatalf("end %+v", d.End)
	}
	if len(d.Summary.Offenders) != SampleSize || d.Summary.Offenders[1].Host != "h3" {
		t.Errorf("offenders %+v", d.Summary.Offenders)
	}
	if d.Summary.Counts[HostFailed] != 15 || d.Summary.Counts[HostPending] != 15 {
		t.Errorf("counts %v", d.Summary.Counts)
	}
	if len(d.Admit) != 0 {
		t.Errorf("a failed rollout admitted %v", d.Admit)
	}
}

// A rollout run to its end by Decide and Step alone: the coordinator
// admits, each host steps, until every host is healthy.
func TestDecideAndStepRunToTheEnd(t *testing.T) {
	r, entries := fixture(Strategy{Canary: Count{N: 1}, Waves: []Count{pct(50)}, MaxUnavailable: Count{N: 1}}, 5)
	statuses := healthyStatuses(newContent)
	progress := map[string]*Progress{}
	admitted := map[string]bool{}
	now := t0
	var order []string
	for range 50 {
		now = now.Add(time.Second)
		d := Decide(r, GroupView{Progress: progress, Admitted: admitted, Entries: entries}, "h1", now)
		if d.End != nil {
			r.End = d.End
			break
		}
		for _, h := range d.Admit {
			admitted[h] = true
			order = append(order, h)
		}
		if unavailable := d.Summary.Admitted - d.Summary.Counts[HostHealthy]; unavailable > 1 {
			t.Fatalf("%d hosts unavailable at once: %+v", unavailable, d.Summary)
		}
		for _, h := range r.Hosts {
			runs := Overlay(entries, h, []*Record{r}, map[string]*Progress{r.ID: progress[h]})
			w := Step(r, HostInput{Host: h, Mine: progress[h], Admitted: admitted[h], Entries: entries, Runs: runs, Statuses: statuses}, now)
			if w.Progress != nil {
				progress[h] = w.Progress
			}
		}
	}
	if r.End == nil || r.End.State != Done {
		t.Fatalf("end %+v; progress %v", r.End, progress)
	}
	if !slices.Equal(order, r.Hosts) {
		t.Errorf("admitted in the order %v, want %v", order, r.Hosts)
	}
}

// A host that is not among the rollout's hosts (it joined since the
// start) and says so with its own progress goes into the last wave while
// the rollout runs, and into none once it ended.
func TestDecideJoiners(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		name     string
		progress []string // hosts with a progress key
		end      *End
		want     []string
	}{
		{"progress of its own hosts only: nobody joins", []string{"h1", "h2"}, nil, nil},
		{"two said they joined: both join, sorted", []string{"h1", "h9", "h10"}, nil, []string{"h10", "h9"}},
		{"no progress at all: nobody joins", nil, nil, nil},
		{"ended failed: nobody joins (it keeps the last good content)", []string{"h9"}, &End{State: Failed}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, entries := fixture(Strategy{Canary: Count{N: 1}}, 5)
			r.End = tc.end
			progress := map[string]*Progress{}
			for _, h := range tc.progress {
				progress[h] = &Progress{State: HostPending}
			}
			d := Decide(r, GroupView{Entries: entries, Progress: progress}, "h1", now)
			if !slices.Equal(d.Join, tc.want) {
				t.Errorf("join %v, want %v", d.Join, tc.want)
			}
		})
	}
}

// A joiner says it is here once (a pending progress key); added to the
// last wave, it is admitted with a pending key as without one.
func TestJoinerSaysItIsHereThenIsAdmitted(t *testing.T) {
	r, entries := fixture(Strategy{Canary: Count{N: 1}}, 2)
	w := Step(r, HostInput{Host: "h9", Entries: entries}, t0)
	if w.Progress == nil || w.Progress.State != HostPending {
		t.Fatalf("a joiner's first step: %+v, want a pending progress key", w.Progress)
	}
	if again := Step(r, HostInput{Host: "h9", Mine: w.Progress, Entries: entries}, t0); !again.IsZero() {
		t.Errorf("a joiner says it is here again: %+v", again)
	}
	r.Hosts, r.WaveEnds = append(r.Hosts, "h9"), []int{1, 3}
	healthy := &Progress{State: HostHealthy}
	d := Decide(r, GroupView{Entries: entries, Progress: map[string]*Progress{"h1": healthy, "h9": w.Progress}, Admitted: map[string]bool{"h1": true}}, "h1", t0)
	if !slices.Equal(d.Admit, []string{"h2", "h9"}) {
		t.Errorf("admit %v, want h2 and the joiner h9", d.Admit)
	}
}
