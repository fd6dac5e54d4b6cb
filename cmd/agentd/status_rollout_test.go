package main

import (
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/rollout"
)

// `agentd status` prints one line per running rollout, under the table:
// the rollout's state from its record, and where this host stands in it
// (an agent sees only its own progress: no group-wide counts).
func TestStatusRolloutLine(t *testing.T) {
	now := time.Date(2025, 12, 4, 10, 0, 0, 0, time.UTC)
	base := control.RolloutInfo{ID: "r1", Group: "web", Units: []string{"web.service"}, State: rollout.Running,
		Waves: 3, Hosts: 5, Soak: 30 * time.Second, HostWave: 2}
	with := func(edit func(ri *control.RolloutInfo)) control.RolloutInfo {
		ri := base
		edit(&ri)
		return ri
	}
	for _, c := range []struct {
		ri   control.RolloutInfo
		want string
	}{
		{with(func(ri *control.RolloutInfo) {
			ri.HostState, ri.HostSince = rollout.HostSoaking, now.Add(-12*time.Second)
		}),
			"web.service: rollout r1 running, this host soaking (12 s of 30 s) in wave 2 of 3 (5 hosts)"},
		{with(func(ri *control.RolloutInfo) { ri.HostState, ri.HostWave = rollout.HostPending, 3 }),
			"web.service: rollout r1 running, this host pending in wave 3 of 3 (5 hosts)"},
		{with(func(ri *control.RolloutInfo) {
			ri.HostState, ri.HostSince, ri.HostReason = rollout.HostApplying, now.Add(-3*time.Second), "wave 2 of 3"
		}), "web.service: rollout r1 running, this host applying (3 s) in wave 2 of 3 (5 hosts)"},
		{with(func(ri *control.RolloutInfo) {
			ri.HostState, ri.HostSince, ri.HostWave = rollout.HostHealthy, now.Add(-90*time.Second), 1
		}), "web.service: rollout r1 running, this host healthy (1 min) in wave 1 of 3 (5 hosts)"},
		{with(func(ri *control.RolloutInfo) {
			ri.Units = []string{"web.service", "worker.service"}
			ri.State, ri.Reason, ri.HostState, ri.HostWave = rollout.Paused, "paused by ops@desk: dashboards red", rollout.HostPending, 3
		}), "web.service, worker.service: rollout r1 paused, this host pending in wave 3 of 3 (5 hosts) — paused by ops@desk: dashboards red"},
		{with(func(ri *control.RolloutInfo) {
			ri.State, ri.Reason = rollout.Failed, "h1 failed the change: web.service: exited 1"
			ri.HostState, ri.HostSince, ri.HostReason, ri.HostWave = rollout.HostFailed, now.Add(-2*time.Second), "web.service: exited 1", 1
		}), "web.service: rollout r1 failed, this host failed (2 s) in wave 1 of 3 (5 hosts) — h1 failed the change: web.service: exited 1; this host: web.service: exited 1"},
		{with(func(ri *control.RolloutInfo) {
			ri.State, ri.HostState, ri.HostSince, ri.HostReason, ri.HostWave = rollout.Aborted, rollout.HostReverting, now.Add(-time.Second), "the rollout aborted: going back", 1
		}), "web.service: rollout r1 aborted, this host reverting (1 s) in wave 1 of 3 (5 hosts)"},
		{with(func(ri *control.RolloutInfo) { ri.HostWave = 0 }),
			"web.service: rollout r1 running, this host not one of its 5 hosts yet (it joined the group since: it goes into the last wave)"},
	} {
		if got := rolloutLine(c.ri, now); got != c.want {
			t.Errorf("rolloutLine(%+v)\n got %s\nwant %s", c.ri, got, c.want)
		}
	}
}

// The agent tells the rollouts of its last snapshot that run: not the
// ones done or superseded, and an ended one only while this host still
// goes back from it (or holds a change it must go back from); each with
// this host's own progress, the only one it sees.
func TestRolloutHandRunning(t *testing.T) {
	now := time.Now()
	v1, v2 := "[Service]\nExecStart=/bin/v1\n", "[Service]\nExecStart=/bin/v2\n"
	s := rollout.Strategy{Canary: rollout.Count{N: 1}, Soak: 30 * time.Second, MaxRestarts: -1}
	hosts := []string{"h1", "h2", "h3"}
	record := func(id string, units map[string]rollout.Unit) *rollout.Record {
		return &rollout.Record{ID: id, Group: "web", Units: units, Strategy: s, Hosts: hosts, WaveEnds: s.WaveEnds(3), CreatedAt: now.Add(-time.Minute)}
	}
	put := map[string]rollout.Unit{"a.service": {From: &v1, ToHash: reconcile.Hash([]byte(v2))}, "a.service.d/x.conf": {ToHash: reconcile.Hash(nil)}}
	removal := map[string]rollout.Unit{"b.service": {From: &v1}}
	soaking := &rollout.Progress{State: rollout.HostSoaking, Since: now.Add(-5 * time.Second)}
	healthy := &rollout.Progress{State: rollout.HostHealthy, Since: now, HealthyAt: now}
	running, rm := record("r-run", put), record("r-rm", removal)
	done := record("r-done", map[string]rollout.Unit{"c.service": {ToHash: reconcile.Hash([]byte(v1))}})
	done.End = &rollout.End{State: rollout.Done, At: now}
	failed := record("r-failed", map[string]rollout.Unit{"d.service": {From: &v1, ToHash: reconcile.Hash([]byte(v2))}})
	failed.Strategy.AutoRevert = true
	failed.End = &rollout.End{State: rollout.Failed, Reason: "h2 failed", At: now}
	superseded := record("r-old", map[string]rollout.Unit{"e.service": {ToHash: reconcile.Hash([]byte(v1))}})
	snap := reconcile.Snapshot{
		Entries: []reconcile.Entry{
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service", Value: []byte(v2)},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service.d/x.conf"},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "c.service", Value: []byte(v1)},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "d.service", Value: []byte(v2)},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "e.service", Value: []byte(v2)}, // written since r-old
		},
	}
	records := []*rollout.Record{running, rm, done, failed, superseded}
	// Each host's view holds its own progress only.
	backend := func(host string, mine map[string]*rollout.Progress) (controlBackend, *rollout.Participant) {
		p := rollout.NewParticipant(host, slog.New(slog.DiscardHandler), func() rollout.HostPort { return nil }, nil)
		return controlBackend{rollouts: p}, p
	}
	b2, p2 := backend("h2", nil)
	if got := b2.Rollouts(); got != nil {
		t.Errorf("before a snapshot: %+v", got)
	}
	p2.Overlay(snap, rollout.HostView{Records: records, Mine: map[string]*rollout.Progress{
		"r-run": soaking, "r-failed": {State: rollout.HostReverting, Since: now},
	}})
	got := b2.Rollouts()
	want := []control.RolloutInfo{
		{ID: "r-run", Group: "web", Units: []string{"a.service"}, State: rollout.Running, Waves: 2, Hosts: 3,
			Soak: 30 * time.Second, HostWave: 2, HostState: rollout.HostSoaking, HostSince: soaking.Since},
		{ID: "r-rm", Group: "web", Units: []string{"b.service"}, State: rollout.Running, Waves: 2, Hosts: 3,
			Soak: 30 * time.Second, HostWave: 2, HostState: rollout.HostPending},
		{ID: "r-failed", Group: "web", Units: []string{"d.service"}, State: rollout.Failed, Reason: "h2 failed", Waves: 2, Hosts: 3,
			Soak: 30 * time.Second, HostWave: 2, HostState: rollout.HostReverting, HostSince: now},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("running:\n got %+v\nwant %+v", got, want)
	}
	// Another host: h1 is healthy in the failed one (it did not go back
	// yet, and must), and not in a rollout of hosts it is not one of.
	b1, p1 := backend("h1", nil)
	p1.Overlay(snap, rollout.HostView{Records: records, Mine: map[string]*rollout.Progress{"r-run": healthy, "r-failed": healthy}})
	if got := b1.Rollouts(); len(got) != 3 || got[2].ID != "r-failed" || got[2].HostState != rollout.HostHealthy || got[2].HostWave != 1 {
		t.Errorf("h1's running: %+v", got)
	}
	b9, p9 := backend("h9", nil)
	p9.Overlay(snap, rollout.HostView{Records: records})
	if got := b9.Rollouts(); len(got) != 2 || got[0].HostWave != 0 || got[0].HostState != "" {
		t.Errorf("h9's running: %+v", got)
	}
}
