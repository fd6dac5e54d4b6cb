package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// A rollout put writes the keys and the record in one transaction; the
// agents' watch carries the record and every host's progress.
func TestRolloutInWatch(t *testing.T) {
	e := registrytest.StartEtcd(t)
	c := registrytest.NewClient(t, e.Endpoint())
	ctx := context.Background()
	tg := registry.Target{Group: "web"}
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte("[Service]\nExecStart=/bin/old\n")}); err != nil {
		t.Fatal(err)
	}
	s := reconcile.Strategy{Canary: reconcile.Count{N: 1}, MaxRestarts: -1}
	r := &reconcile.Rollout{ID: registry.NewRolloutID(time.Now()), Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte("[Service]\nExecStart=/bin/new\n")}, registry.WithRollout(r, false)); err != nil {
		t.Fatal(err)
	}
	// The same keys again: refused while it runs.
	r2 := &reconcile.Rollout{ID: registry.NewRolloutID(time.Now()), Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte("x")}, registry.WithRollout(r2, false)); err == nil {
		t.Fatal("a second rollout of the same key was taken")
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan reconcile.Snapshot, 10)
	go func() { _ = c.Watch(wctx, "h2", []string{"web"}, func(s reconcile.Snapshot) { got <- s }) }()
	snap := <-got
	if len(snap.Rollouts) != 1 || snap.Rollouts[0].ID != r.ID || *snap.Rollouts[0].Units["a.service"].From != "[Service]\nExecStart=/bin/old\n" {
		t.Fatalf("snapshot rollouts: %+v", snap.Rollouts)
	}
	over := reconcile.Overlay(snap.Entries, "h2", snap.Rollouts, snap.Progress)
	if string(over[0].Value) != "[Service]\nExecStart=/bin/old\n" {
		t.Fatalf("h2 runs %q before its wave", over[0].Value)
	}
	w := reconcile.RolloutStep(snap.Rollouts[0], "h1", snap.Progress[r.ID], snap.Entries, reconcile.Overlay(snap.Entries, "h1", snap.Rollouts, snap.Progress), nil, time.Now())
	if w.Progress == nil || w.Progress.State != reconcile.HostApplying {
		t.Fatalf("h1's step: %+v", w)
	}
}

// A rollout of keys an aborted rollout still holds follows it (After),
// and the snapshot keeps the aborted one for the hosts it holds back.
func TestRolloutFollowsAnAbortedOne(t *testing.T) {
	e := registrytest.StartEtcd(t)
	c := registrytest.NewClient(t, e.Endpoint())
	ctx := context.Background()
	tg := registry.Target{Group: "web"}
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte("v1")}); err != nil {
		t.Fatal(err)
	}
	s := reconcile.Strategy{Canary: reconcile.Count{N: 1}, MaxRestarts: -1}
	a := &reconcile.Rollout{ID: "ra", Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte("v2")}, registry.WithRollout(a, false)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UpdateRollout(ctx, "ra", func(v registry.RolloutView) error {
		v.Rollout.End = &reconcile.RolloutEnd{State: reconcile.RolloutAborted, At: time.Now()}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b := &reconcile.Rollout{ID: "rb", Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte("v3")}, registry.WithRollout(b, false)); err != nil {
		t.Fatalf("a rollout after an aborted one: %v", err)
	}
	v, err := c.Rollout(ctx, "rb")
	if err != nil || v.Rollout.After != "ra" {
		t.Fatalf("rb follows %q (%v), want ra", v.Rollout.After, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan reconcile.Snapshot, 10)
	go func() { _ = c.Watch(wctx, "h2", []string{"web"}, func(s reconcile.Snapshot) { got <- s }) }()
	ws := <-got
	over := reconcile.Overlay(ws.Entries, "h2", ws.Rollouts, ws.Progress)
	if len(ws.Rollouts) != 2 || string(over[0].Value) != "v1" {
		t.Fatalf("h2 (in neither change) runs %q with %d rollouts in its snapshot, want v1", over[0].Value, len(ws.Rollouts))
	}
}
