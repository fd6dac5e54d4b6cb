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

// `agentd status` prints one line per running rollout, under the table.
func TestStatusRolloutLine(t *testing.T) {
	now := time.Date(2025, 12, 4, 10, 0, 0, 0, time.UTC)
	base := control.RolloutInfo{ID: "r1", Group: "web", Units: []string{"web.service"}, State: rollout.Running,
		Wave: 2, Waves: 3, Healthy: 1, Hosts: 5, Soak: 30 * time.Second, HostWave: 2}
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
			"web.service: rollout r1 wave 2 of 3, this host soaking (12 s of 30 s), 1/5 hosts healthy"},
		{with(func(ri *control.RolloutInfo) { ri.HostState, ri.HostWave = rollout.HostPending, 3 }),
			"web.service: rollout r1 wave 2 of 3, this host pending (wave 3), 1/5 hosts healthy"},
		{with(func(ri *control.RolloutInfo) {
			ri.HostState, ri.HostSince, ri.HostReason = rollout.HostApplying, now.Add(-3*time.Second), "wave 2 of 3"
		}), "web.service: rollout r1 wave 2 of 3, this host applying (3 s), 1/5 hosts healthy"},
		{with(func(ri *control.RolloutInfo) {
			ri.HostState, ri.HostSince, ri.HostWave, ri.Wave = rollout.HostHealthy, now.Add(-90*time.Second), 1, 1
		}), "web.service: rollout r1 wave 1 of 3, this host healthy (1 min), 1/5 hosts healthy"},
		{with(func(ri *control.RolloutInfo) {
			ri.Units = []string{"web.service", "worker.service"}
			ri.State, ri.Reason, ri.HostState, ri.HostWave = rollout.Paused, "paused by ops@desk: dashboards red", rollout.HostPending, 3
		}), "web.service, worker.service: rollout r1 paused at wave 2 of 3, this host pending (wave 3), 1/5 hosts healthy — paused by ops@desk: dashboards red"},
		{with(func(ri *control.RolloutInfo) {
			ri.State, ri.Reason, ri.Wave, ri.HostState, ri.HostWave = rollout.WaitingPromote, "the canary is healthy: `agentd rollout promote r1` sends the change on", 2, rollout.HostPending, 2
		}), "web.service: rollout r1 waiting-promote at wave 2 of 3, this host pending (wave 2), 1/5 hosts healthy — the canary is healthy: `agentd rollout promote r1` sends the change on"},
		{with(func(ri *control.RolloutInfo) {
			ri.State, ri.Reason, ri.Wave, ri.Healthy = rollout.Failed, "h1 failed the change: web.service: exited 1", 1, 0
			ri.HostState, ri.HostSince, ri.HostReason, ri.HostWave = rollout.HostFailed, now.Add(-2*time.Second), "web.service: exited 1", 1
		}), "web.service: rollout r1 failed at wave 1 of 3, this host failed (2 s), 0/5 hosts healthy — h1 failed the change: web.service: exited 1; this host: web.service: exited 1"},
		{with(func(ri *control.RolloutInfo) {
			ri.State, ri.Wave, ri.HostState, ri.HostSince, ri.HostReason, ri.HostWave = rollout.Aborted, 1, rollout.HostReverting, now.Add(-time.Second), "the rollout aborted: going back", 1
		}), "web.service: rollout r1 aborted at wave 1 of 3, this host reverting (1 s), 1/5 hosts healthy"},
		{with(func(ri *control.RolloutInfo) { ri.HostWave = 0 }),
			"web.service: rollout r1 wave 2 of 3, this host not in it (it joined the group since), 1/5 hosts healthy"},
	} {
		if got := rolloutLine(c.ri, now); got != c.want {
			t.Errorf("rolloutLine(%+v)\n got %s\nwant %s", c.ri, got, c.want)
		}
	}
}

// The agent tells the rollouts of its last snapshot that run: not the
// ones done or superseded, and an ended one only while this host still
// goes back from it.
func TestRolloutHandRunning(t *testing.T) {
	now := time.Now()
	v1, v2 := "[Service]\nExecStart=/bin/v1\n", "[Service]\nExecStart=/bin/v2\n"
	s := rollout.Strategy{Canary: rollout.Count{N: 1}, Soak: 30 * time.Second, MaxRestarts: -1}
	hosts := []string{"h1", "h2", "h3"}
	rollout := func(id string, units map[string]rollout.Unit) *rollout.Record {
		return &rollout.Record{ID: id, Group: "web", Units: units, Strategy: s, Hosts: hosts, WaveEnds: s.WaveEnds(3), CreatedAt: now.Add(-time.Minute)}
	}
	put := map[string]rollout.Unit{"a.service": {From: &v1, ToHash: reconcile.Hash([]byte(v2))}, "a.service.d/x.conf": {ToHash: reconcile.Hash(nil)}}
	removal := map[string]rollout.Unit{"b.service": {From: &v1}}
	soaking := &rollout.Progress{State: rollout.HostSoaking, Since: now.Add(-5 * time.Second)}
	healthy := &rollout.Progress{State: rollout.HostHealthy, Since: now, HealthyAt: now}
	running, rm := rollout("r-run", put), rollout("r-rm", removal)
	done := rollout("r-done", map[string]rollout.Unit{"c.service": {ToHash: reconcile.Hash([]byte(v1))}})
	done.End = &rollout.End{State: rollout.Done, At: now}
	failed := rollout("r-failed", map[string]rollout.Unit{"d.service": {From: &v1, ToHash: reconcile.Hash([]byte(v2))}})
	failed.Strategy.AutoRevert = true
	failed.End = &rollout.End{State: rollout.Failed, Reason: "h2 failed", At: now}
	superseded := rollout("r-old", map[string]rollout.Unit{"e.service": {ToHash: reconcile.Hash([]byte(v1))}})
	snap := reconcile.Snapshot{
		Entries: []reconcile.Entry{
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service", Value: []byte(v2)},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service.d/x.conf"},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "c.service", Value: []byte(v1)},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "d.service", Value: []byte(v2)},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "e.service", Value: []byte(v2)}, // written since r-old
		},
		Rollouts: []*rollout.Record{running, rm, done, failed, superseded},
		Progress: map[string]map[string]*rollout.Progress{
			"r-run":    {"h1": healthy, "h2": soaking},
			"r-failed": {"h1": healthy, "h2": {State: rollout.HostReverting, Since: now}},
		},
	}
	h := newRolloutHand("h2", slog.New(slog.DiscardHandler), nil, nil)
	if got := h.running(now); got != nil {
		t.Errorf("before a snapshot: %+v", got)
	}
	h.overlay(snap)
	got := h.running(now)
	want := []control.RolloutInfo{
		{ID: "r-run", Group: "web", Units: []string{"a.service"}, State: rollout.Running, Wave: 2, Waves: 2, Healthy: 1, Hosts: 3,
			Soak: 30 * time.Second, HostWave: 2, HostState: rollout.HostSoaking, HostSince: soaking.Since},
		{ID: "r-rm", Group: "web", Units: []string{"b.service"}, State: rollout.Running, Wave: 1, Waves: 2, Hosts: 3,
			Soak: 30 * time.Second, HostWave: 2, HostState: rollout.HostPending},
		{ID: "r-failed", Group: "web", Units: []string{"d.service"}, State: rollout.Failed, Reason: "h2 failed", Wave: 2, Waves: 2, Healthy: 1, Hosts: 3,
			Soak: 30 * time.Second, HostWave: 2, HostState: rollout.HostReverting, HostSince: now},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("running:\n got %+v\nwant %+v", got, want)
	}
	// Another host: h1 is healthy in the failed one (it did not take it
	// back), and not in a rollout of hosts it is not one of.
	h1 := newRolloutHand("h1", slog.New(slog.DiscardHandler), nil, nil)
	h1.overlay(snap)
	if got := h1.running(now); len(got) != 3 || got[2].ID != "r-failed" || got[2].HostState != rollout.HostHealthy {
		t.Errorf("h1's running: %+v", got)
	}
	h9 := newRolloutHand("h9", slog.New(slog.DiscardHandler), nil, nil)
	h9.overlay(snap)
	if got := h9.running(now); len(got) != 2 || got[0].HostWave != 0 || got[0].HostState != "" {
		t.Errorf("h9's running: %+v", got)
	}
}
