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
	w := reconcile.RolloutStep(snap.Rollouts[0], "h1", snap.Progress[r.ID], snap.Entries, nil, time.Now())
	if w.Progress == nil || w.Progress.State != reconcile.HostApplying {
		t.Fatalf("h1's step: %+v", w)
	}
}
