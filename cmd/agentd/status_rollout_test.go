package main

import (
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/reconcile"
)

// `agentd status` prints one line per running rollout, under the table.
func TestStatusRolloutLine(t *testing.T) {
	now := time.Date(2025, 12, 4, 10, 0, 0, 0, time.UTC)
	base := control.RolloutInfo{ID: "r1", Group: "web", Units: []string{"web.service"}, State: reconcile.RolloutRunning,
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
			ri.HostState, ri.HostSince = reconcile.HostSoaking, now.Add(-12*time.Second)
		}),
			"web.service: rollout r1 wave 2 of 3, this host soaking (12 s of 30 s), 1/5 hosts healthy"},
		{with(func(ri *control.RolloutInfo) { ri.HostState, ri.HostWave = reconcile.HostPending, 3 }),
			"web.service: rollout r1 wave 2 of 3, this host pending (wave 3), 1/5 hosts healthy"},
		{with(func(ri *control.RolloutInfo) {
			ri.HostState, ri.HostSince, ri.HostReason = reconcile.HostApplying, now.Add(-3*time.Second), "wave 2 of 3"
		}), "web.service: rollout r1 wave 2 of 3, this host applying (3 s), 1/5 hosts healthy"},
		{with(func(ri *control.RolloutInfo) {
			ri.HostState, ri.HostSince, ri.HostWave, ri.Wave = reconcile.HostHealthy, now.Add(-90*time.Second), 1, 1
		}), "web.service: rollout r1 wave 1 of 3, this host healthy (1 min), 1/5 hosts healthy"},
		{with(func(ri *control.RolloutInfo) {
			ri.Units = []string{"web.service", "worker.service"}
			ri.State, ri.Reason, ri.HostState, ri.HostWave = reconcile.RolloutPaused, "paused by ops@desk: dashboards red", reconcile.HostPending, 3
		}), "web.service, worker.service: rollout r1 paused at wave 2 of 3, this host pending (wave 3), 1/5 hosts healthy — paused by ops@desk: dashboards red"},
		{with(func(ri *control.RolloutInfo) {
			ri.State, ri.Reason, ri.Wave, ri.HostState, ri.HostWave = reconcile.RolloutWaitingPromote, "the canary is healthy: `agentd rollout promote r1` sends the change on", 2, reconcile.HostPending, 2
		}), "web.service: rollout r1 waiting-promote at wave 2 of 3, this host pending (wave 2), 1/5 hosts healthy — the canary is healthy: `agentd rollout promote r1` sends the change on"},
		{with(func(ri *control.RolloutInfo) {
			ri.State, ri.Reason, ri.Wave, ri.Healthy = reconcile.RolloutFailed, "h1 failed the change: web.service: exited 1", 1, 0
			ri.HostState, ri.HostSince, ri.HostReason, ri.HostWave = reconcile.HostFailed, now.Add(-2*time.Second), "web.service: exited 1", 1
		}), "web.service: rollout r1 failed at wave 1 of 3, this host failed (2 s), 0/5 hosts healthy — h1 failed the change: web.service: exited 1; this host: web.service: exited 1"},
		{with(func(ri *control.RolloutInfo) {
			ri.State, ri.Wave, ri.HostState, ri.HostSince, ri.HostReason, ri.HostWave = reconcile.RolloutAborted, 1, reconcile.HostReverting, now.Add(-time.Second), "the rollout aborted: going back", 1
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
	s := reconcile.Strategy{Canary: reconcile.Count{N: 1}, Soak: 30 * time.Second, MaxRestarts: -1}
	hosts := []string{"h1", "h2", "h3"}
	rollout := func(id string, units map[string]reconcile.RolloutUnit) *reconcile.Rollout {
		return &reconcile.Rollout{ID: id, Group: "web", Units: units, Strategy: s, Hosts: hosts, WaveEnds: s.WaveEnds(3), CreatedAt: now.Add(-time.Minute)}
	}
	put := map[string]reconcile.RolloutUnit{"a.service": {From: &v1, ToHash: reconcile.Hash([]byte(v2))}, "a.service.d/x.conf": {ToHash: reconcile.Hash(nil)}}
	removal := map[string]reconcile.RolloutUnit{"b.service": {From: &v1}}
	soaking := &reconcile.HostProgress{State: reconcile.HostSoaking, Since: now.Add(-5 * time.Second)}
	healthy := &reconcile.HostProgress{State: reconcile.HostHealthy, Since: now, HealthyAt: now}
	running, rm := rollout("r-run", put), rollout("r-rm", removal)
	done := rollout("r-done", map[string]reconcile.RolloutUnit{"c.service": {ToHash: reconcile.Hash([]byte(v1))}})
	done.End = &reconcile.RolloutEnd{State: reconcile.RolloutDone, At: now}
	failed := rollout("r-failed", map[string]reconcile.RolloutUnit{"d.service": {From: &v1, ToHash: reconcile.Hash([]byte(v2))}})
	failed.Strategy.AutoRevert = true
	failed.End = &reconcile.RolloutEnd{State: reconcile.RolloutFailed, Reason: "h2 failed", At: now}
	superseded := rollout("r-old", map[string]reconcile.RolloutUnit{"e.service": {ToHash: reconcile.Hash([]byte(v1))}})
	snap := reconcile.Snapshot{
		Entries: []reconcile.Entry{
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service", Value: []byte(v2)},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service.d/x.conf"},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "c.service", Value: []byte(v1)},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "d.service", Value: []byte(v2)},
			{Scope: reconcile.ScopeGroup, Group: "web", Unit: "e.service", Value: []byte(v2)}, // written since r-old
		},
		Rollouts: []*reconcile.Rollout{running, rm, done, failed, superseded},
		Progress: map[string]map[string]*reconcile.HostProgress{
			"r-run":    {"h1": healthy, "h2": soaking},
			"r-failed": {"h1": healthy, "h2": {State: reconcile.HostReverting, Since: now}},
		},
	}
	h := newRolloutHand("h2", slog.New(slog.DiscardHandler), nil, nil)
	if got := h.running(now); got != nil {
		t.Errorf("before a snapshot: %+v", got)
	}
	h.overlay(snap)
	got := h.running(now)
	want := []control.RolloutInfo{
		{ID: "r-run", Group: "web", Units: []string{"a.service"}, State: reconcile.RolloutRunning, Wave: 2, Waves: 2, Healthy: 1, Hosts: 3,
			Soak: 30 * time.Second, HostWave: 2, HostState: reconcile.HostSoaking, HostSince: soaking.Since},
		{ID: "r-rm", Group: "web", Units: []string{"b.service"}, State: reconcile.RolloutRunning, Wave: 1, Waves: 2, Hosts: 3,
			Soak: 30 * time.Second, HostWave: 2, HostState: reconcile.HostPending},
		{ID: "r-failed", Group: "web", Units: []string{"d.service"}, State: reconcile.RolloutFailed, Reason: "h2 failed", Wave: 2, Waves: 2, Healthy: 1, Hosts: 3,
			Soak: 30 * time.Second, HostWave: 2, HostState: reconcile.HostReverting, HostSince: now},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("running:\n got %+v\nwant %+v", got, want)
	}
	// Another host: h1 is healthy in the failed one (it did not take it
	// back), and not in a rollout of hosts it is not one of.
	h1 := newRolloutHand("h1", slog.New(slog.DiscardHandler), nil, nil)
	h1.overlay(snap)
	if got := h1.running(now); len(got) != 3 || got[2].ID != "r-failed" || got[2].HostState != reconcile.HostHealthy {
		t.Errorf("h1's running: %+v", got)
	}
	h9 := newRolloutHand("h9", slog.New(slog.DiscardHandler), nil, nil)
	h9.overlay(snap)
	if got := h9.running(now); len(got) != 2 || got[0].HostWave != 0 || got[0].HostState != "" {
		t.Errorf("h9's running: %+v", got)
	}
}
