package rollout

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// healthyStatuses are a host's statuses running content of a.service,
// active and healthy: Expectation.Assess calls that healthy.
func healthyStatuses(content string) map[string]reconcile.Status {
	h := reconcile.Hash([]byte(content))
	return map[string]reconcile.Status{"a.service": {
		Unit: "a.service", Hash: h, DesiredHash: h, LoadState: "loaded",
		ActiveState: "active", SubState: "running", Health: "healthy", Action: reconcile.ActionWord("start"), Result: "done",
	}}
}

// startingStatuses: content in place, the unit on its way up.
func startingStatuses(content string) map[string]reconcile.Status {
	h := reconcile.Hash([]byte(content))
	return map[string]reconcile.Status{"a.service": {Unit: "a.service", Hash: h, DesiredHash: h, LoadState: "loaded", ActiveState: "activating", SubState: "start"}}
}

// failedStatuses: the agent rolled content back after it failed.
func failedStatuses(content string) map[string]reconcile.Status {
	h := reconcile.Hash([]byte(content))
	return map[string]reconcile.Status{"a.service": {
		Unit: "a.service", Hash: h, DesiredHash: h, LoadState: "loaded", ActiveState: "failed", SubState: "failed",
		Action: reconcile.ActionRolledBack, Result: "failed", Error: "exited 1",
	}}
}

// restarted are statuses with a.service restarted n times (Restart=).
func restarted(st map[string]reconcile.Status, n uint32) map[string]reconcile.Status {
	st = maps.Clone(st)
	s := st["a.service"]
	s.NRestarts = n
	st["a.service"] = s
	return st
}

func TestStep(t *testing.T) {
	now := t0.Add(time.Minute)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	canary := Strategy{Canary: Count{N: 1}, Waves: []Count{pct(50)}} // 5 hosts: [h1] [h2 h3] [h4 h5]
	failedEnd := func(r *Record) { r.End = &End{State: Failed, Reason: "h2 failed the change", At: ago(time.Second)} }
	abort := func(revert bool) func(r *Record) {
		return func(r *Record) {
			r.Abort = &Abort{Revert: revert, At: ago(time.Second)}
			r.End = &End{State: Aborted, Reason: "aborted", At: ago(time.Second)}
		}
	}
	for _, tc := range []struct {
		name     string
		strategy Strategy
		edit     func(r *Record)
		host     string // h1 when ""
		mine     *Progress
		admitted bool
		entries  []reconcile.Entry // nil: the rollout's own keys
		statuses map[string]reconcile.Status

		want       HostState // "": no progress written
		wantReason string
		pause      string // in the pause written ("": none)
	}{
		// Taking the change.
		{name: "not admitted: nothing", strategy: canary, statuses: healthyStatuses(oldContent)},
		{name: "not admitted, in a later wave: nothing", strategy: canary, host: "h4", statuses: healthyStatuses(oldContent)},
		{
			name: "admitted: applying", strategy: canary, admitted: true, statuses: healthyStatuses(oldContent),
			want: HostApplying, wantReason: "wave 1 of 3",
		},
		{
			name: "admitted to a later wave: applying, saying which", strategy: canary, host: "h3", admitted: true, statuses: healthyStatuses(oldContent),
			want: HostApplying, wantReason: "wave 2 of 3",
		},
		{
			name: "admitted with no statuses yet: applying", strategy: canary, admitted: true,
			want: HostApplying,
		},
		{name: "not one of its hosts (joined since): says it is here, pending", strategy: canary, host: "h9", admitted: true, statuses: healthyStatuses(oldContent), want: HostPending, wantReason: "joined the group after the rollout started"},
		{name: "admitted, keys written again since: nothing", strategy: canary, admitted: true, entries: overwritten(), statuses: healthyStatuses(oldContent)},
		{name: "admitted, the rollout failed since: nothing", strategy: canary, edit: failedEnd, admitted: true, statuses: healthyStatuses(oldContent)},
		{name: "admitted, the rollout aborted since: nothing", strategy: canary, edit: abort(false), admitted: true, statuses: healthyStatuses(oldContent)},

		// Judging it.
		{
			name: "applying, the new version not running yet: nothing", strategy: canary,
			mine: at(HostApplying, ago(time.Second), "wave 1 of 3"), admitted: true, statuses: healthyStatuses(oldContent),
		},
		{
			name: "applying, the unit on its way up: nothing", strategy: canary,
			mine: at(HostApplying, ago(time.Second), "wave 1 of 3"), admitted: true, statuses: startingStatuses(newContent),
		},
		{
			name: "applying, healthy, no soak: healthy", strategy: canary,
			mine: at(HostApplying, ago(time.Second), "wave 1 of 3"), admitted: true, statuses: healthyStatuses(newContent),
			want: HostHealthy,
		},
		{
			name: "applying, failed: failed, saying why", strategy: canary,
			mine: at(HostApplying, ago(time.Second), "wave 1 of 3"), admitted: true, statuses: failedStatuses(newContent),
			want: HostFailed, wantReason: "a.service: exited 1",
		},
		{
			name: "applying, healthy, a soak: soaking", strategy: Strategy{Canary: Count{N: 1}, Soak: 10 * time.Second},
			mine: at(HostApplying, ago(time.Second), "wave 1 of 2"), admitted: true, statuses: healthyStatuses(newContent),
			want: HostSoaking,
		},
		{
			name: "soaking, before the soak is over: nothing", strategy: Strategy{Canary: Count{N: 1}, Soak: 10 * time.Second},
			mine: at(HostSoaking, ago(9*time.Second), ""), admitted: true, statuses: healthyStatuses(newContent),
		},
		{
			name: "soaking, the soak over: healthy", strategy: Strategy{Canary: Count{N: 1}, Soak: 10 * time.Second},
			mine: at(HostSoaking, ago(10*time.Second), ""), admitted: true, statuses: healthyStatuses(newContent),
			want: HostHealthy,
		},
		{
			name: "soaking, not healthy any more: applying again", strategy: Strategy{Canary: Count{N: 1}, Soak: 10 * time.Second},
			mine: at(HostSoaking, ago(5*time.Second), ""), admitted: true, statuses: startingStatuses(newContent),
			want: HostApplying, wantReason: "not healthy any more",
		},
		{
			name: "soaking, failed: failed", strategy: Strategy{Canary: Count{N: 1}, Soak: 10 * time.Second},
			mine: at(HostSoaking, ago(5*time.Second), ""), admitted: true, statuses: failedStatuses(newContent),
			want: HostFailed, wantReason: "exited 1",
		},
		{
			name: "healthy: nothing more", strategy: canary,
			mine: at(HostHealthy, ago(5*time.Second), ""), admitted: true, statuses: failedStatuses(newContent),
		},
		{
			name: "applying while the rollout is paused: judged all the same", strategy: canary,
			edit: func(r *Record) { r.Paused = true },
			mine: at(HostApplying, ago(time.Second), ""), admitted: true, statuses: healthyStatuses(newContent),
			want: HostHealthy,
		},

		// Going back.
		{
			name: "failed with auto-revert: a healthy host reverts", strategy: Strategy{Canary: Count{N: 1}, AutoRevert: true}, edit: failedEnd,
			mine: at(HostHealthy, ago(time.Minute), ""), admitted: true, statuses: healthyStatuses(newContent),
			want: HostReverting, wantReason: "the rollout failed",
		},
		{
			name: "failed with auto-revert: the failed host reverts", strategy: Strategy{Canary: Count{N: 1}, AutoRevert: true}, edit: failedEnd,
			host: "h2", mine: at(HostFailed, ago(time.Second), "exited 1"), admitted: true, statuses: failedStatuses(newContent),
			want: HostReverting,
		},
		{
			name: "failed with auto-revert: an applying host reverts", strategy: Strategy{Canary: Count{N: 1}, AutoRevert: true}, edit: failedEnd,
			host: "h3", mine: at(HostApplying, ago(time.Second), ""), admitted: true, statuses: startingStatuses(newContent),
			want: HostReverting,
		},
		{
			name: "failed with auto-revert: a host that never took it stays", strategy: Strategy{Canary: Count{N: 1}, AutoRevert: true}, edit: failedEnd,
			host: "h4", statuses: healthyStatuses(oldContent),
		},
		{
			name: "failed without auto-revert: a healthy host keeps it", strategy: canary, edit: failedEnd,
			mine: at(HostHealthy, ago(time.Minute), ""), admitted: true, statuses: healthyStatuses(newContent),
		},
		{
			name: "aborted with revert: a healthy host reverts", strategy: canary, edit: abort(true),
			mine: at(HostHealthy, ago(time.Minute), ""), admitted: true, statuses: healthyStatuses(newContent),
			want: HostReverting, wantReason: "the rollout aborted",
		},
		{
			name: "aborted without revert, auto-revert on: a healthy host keeps it", strategy: Strategy{Canary: Count{N: 1}, AutoRevert: true}, edit: abort(false),
			mine: at(HostHealthy, ago(time.Minute), ""), admitted: true, statuses: healthyStatuses(newContent),
		},
		{
			name: "reverting, the previous version healthy: reverted", strategy: Strategy{Canary: Count{N: 1}, AutoRevert: true}, edit: failedEnd,
			mine: at(HostReverting, ago(time.Second), ""), admitted: true, statuses: healthyStatuses(oldContent),
			want: HostReverted,
		},
		{
			name: "reverting, still on the new version: nothing", strategy: Strategy{Canary: Count{N: 1}, AutoRevert: true}, edit: failedEnd,
			mine: at(HostReverting, ago(time.Second), ""), admitted: true, statuses: healthyStatuses(newContent),
		},
		{
			name: "reverting, the previous version failing: nothing, no failure", strategy: Strategy{Canary: Count{N: 1}, AutoRevert: true}, edit: failedEnd,
			mine: at(HostReverting, ago(time.Second), ""), admitted: true, statuses: failedStatuses(oldContent),
		},
		{
			name: "reverted: nothing more", strategy: Strategy{Canary: Count{N: 1}, AutoRevert: true}, edit: failedEnd,
			mine: at(HostReverted, ago(time.Second), ""), admitted: true, statuses: healthyStatuses(oldContent),
		},

		// --max-restarts.
		{
			name: "restarted more than max-restarts since it took it: pauses", strategy: Strategy{Canary: Count{N: 1}, MaxRestarts: 2},
			mine:     &Progress{State: HostApplying, Since: ago(time.Second), Restarts: map[string]uint32{"a.service": 1}},
			admitted: true, statuses: restarted(startingStatuses(newContent), 4),
			pause: "h1: a.service restarted 3 times since it took the change (--max-restarts 2)",
		},
		{
			name: "restarted too often while soaking: pauses, and keeps soaking", strategy: Strategy{Canary: Count{N: 1}, MaxRestarts: 1, Soak: time.Minute},
			mine:     &Progress{State: HostSoaking, Since: ago(time.Second), Restarts: map[string]uint32{"a.service": 0}},
			admitted: true, statuses: restarted(healthyStatuses(newContent), 2),
			pause: "restarted 2 times",
		},
		{
			name: "restarted max-restarts times: no pause", strategy: Strategy{Canary: Count{N: 1}, MaxRestarts: 2},
			mine:     &Progress{State: HostApplying, Since: ago(time.Second), Restarts: map[string]uint32{"a.service": 1}},
			admitted: true, statuses: restarted(startingStatuses(newContent), 3),
		},
		{
			name: "max-restarts off: no pause", strategy: Strategy{Canary: Count{N: 1}, MaxRestarts: -1},
			mine:     &Progress{State: HostApplying, Since: ago(time.Second), Restarts: map[string]uint32{"a.service": 1}},
			admitted: true, statuses: restarted(startingStatuses(newContent), 40),
		},
		{
			name: "restarted too often, already paused: no second pause", strategy: Strategy{Canary: Count{N: 1}, MaxRestarts: 2},
			edit:     func(r *Record) { r.Paused = true },
			mine:     &Progress{State: HostApplying, Since: ago(time.Second), Restarts: map[string]uint32{"a.service": 1}},
			admitted: true, statuses: restarted(startingStatuses(newContent), 4),
		},
		{
			name: "restarted too often and failed: failed, no pause", strategy: Strategy{Canary: Count{N: 1}, MaxRestarts: 2},
			mine:     &Progress{State: HostApplying, Since: ago(time.Second), Restarts: map[string]uint32{"a.service": 1}},
			admitted: true, statuses: restarted(failedStatuses(newContent), 4),
			want: HostFailed,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, entries := fixture(tc.strategy, 5)
			if tc.edit != nil {
				tc.edit(r)
			}
			if tc.entries != nil {
				entries = tc.entries
			}
			host := tc.host
			if host == "" {
				host = "h1"
			}
			// What the host runs under r alone.
			runs := Overlay(entries, host, []*Record{r}, map[string]*Progress{r.ID: tc.mine})
			w := Step(r, HostInput{Host: host, Mine: tc.mine, Admitted: tc.admitted, Entries: entries, Runs: runs, Statuses: tc.statuses}, now)
			switch {
			case tc.want == "" && w.Progress != nil:
				t.Errorf("wrote %+v, want nothing", *w.Progress)
			case tc.want != "" && w.Progress == nil:
				t.Errorf("wrote nothing, want %s", tc.want)
			case tc.want != "":
				p := w.Progress
				if p.State != tc.want || !strings.Contains(p.Reason, tc.wantReason) || !p.Since.Equal(now) {
					t.Errorf("wrote %+v, want %s since now with %q", *p, tc.want, tc.wantReason)
				}
			}
			if (tc.pause == "") != (w.Pause == "") || !strings.Contains(w.Pause, tc.pause) {
				t.Errorf("pause %q, want %q", w.Pause, tc.pause)
			}
			if w.IsZero() != (w.Progress == nil && w.Pause == "") {
				t.Errorf("IsZero() = %v for %+v", w.IsZero(), w)
			}
		})
	}
}

// Restarts are counted from when the host took the change; HealthyAt
// outlives the states after it (the progress deadline reads it).
func TestStepKeepsRestartsAndHealthyAt(t *testing.T) {
	r, entries := fixture(Strategy{Canary: Count{N: 1}, Soak: 10 * time.Second, MaxRestarts: 5, AutoRevert: true}, 5)
	now := t0.Add(time.Minute)
	step := func(mine *Progress, st map[string]reconcile.Status, now time.Time) *Progress {
		t.Helper()
		runs := Overlay(entries, "h1", []*Record{r}, map[string]*Progress{r.ID: mine})
		w := Step(r, HostInput{Host: "h1", Mine: mine, Admitted: true, Entries: entries, Runs: runs, Statuses: st}, now)
		if w.Progress == nil || w.Pause != "" {
			t.Fatalf("step from %s: %+v", mine.StateOf(), w)
		}
		return w.Progress
	}
	p := step(nil, restarted(healthyStatuses(oldContent), 7), now)
	if p.State != HostApplying || p.Restarts["a.service"] != 7 {
		t.Fatalf("took the change: %+v", p)
	}
	p = step(p, restarted(healthyStatuses(newContent), 0), now.Add(time.Second))
	if p.State != HostSoaking || p.Restarts["a.service"] != 7 || !p.HealthyAt.IsZero() {
		t.Fatalf("soaking: %+v", p)
	}
	if due := SoakDue(r, p); !due.Equal(now.Add(11 * time.Second)) {
		t.Errorf("SoakDue = %v, want %v", due, now.Add(11*time.Second))
	}
	p = step(p, restarted(healthyStatuses(newContent), 0), now.Add(11*time.Second))
	if p.State != HostHealthy || !p.HealthyAt.Equal(now.Add(11*time.Second)) || p.Restarts["a.service"] != 7 {
		t.Fatalf("healthy: %+v", p)
	}
	if due := SoakDue(r, p); !due.IsZero() {
		t.Errorf("SoakDue of a healthy host = %v", due)
	}
	r.End = &End{State: Failed, Reason: "h2 failed the change", At: now.Add(20 * time.Second)}
	p = step(p, healthyStatuses(newContent), now.Add(21*time.Second))
	if p.State != HostReverting || !p.HealthyAt.Equal(now.Add(11*time.Second)) {
		t.Fatalf("reverting: %+v", p)
	}
	p = step(p, healthyStatuses(oldContent), now.Add(22*time.Second))
	if p.State != HostReverted || !p.HealthyAt.Equal(now.Add(11*time.Second)) {
		t.Fatalf("reverted: %+v", p)
	}
}
