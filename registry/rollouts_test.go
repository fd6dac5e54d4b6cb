package registry_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/rollout"
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
	s := rollout.Strategy{Canary: rollout.Count{N: 1}, MaxRestarts: -1}
	r := &rollout.Record{ID: registry.NewRolloutID(time.Now()), Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte("[Service]\nExecStart=/bin/new\n")}, registry.WithRollout(r, false)); err != nil {
		t.Fatal(err)
	}
	// The same keys again: refused while it runs.
	r2 := &rollout.Record{ID: registry.NewRolloutID(time.Now()), Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
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
	over := rollout.Overlay(snap.Entries, "h2", snap.Rollouts, snap.Progress)
	if string(over[0].Value) != "[Service]\nExecStart=/bin/old\n" {
		t.Fatalf("h2 runs %q before its wave", over[0].Value)
	}
	w := reconcile.RolloutStep(snap.Rollouts[0], "h1", snap.Progress[r.ID], snap.Entries, rollout.Overlay(snap.Entries, "h1", snap.Rollouts, snap.Progress), nil, time.Now())
	if w.Progress == nil || w.Progress.State != rollout.HostApplying {
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
	s := rollout.Strategy{Canary: rollout.Count{N: 1}, MaxRestarts: -1}
	a := &rollout.Record{ID: "ra", Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte("v2")}, registry.WithRollout(a, false)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UpdateRollout(ctx, "ra", func(v rollout.View) error {
		v.Rollout.End = &rollout.End{State: rollout.Aborted, At: time.Now()}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b := &rollout.Record{ID: "rb", Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
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
	over := rollout.Overlay(ws.Entries, "h2", ws.Rollouts, ws.Progress)
	if len(ws.Rollouts) != 2 || string(over[0].Value) != "v1" {
		t.Fatalf("h2 (in neither change) runs %q with %d rollouts in its snapshot, want v1", over[0].Value, len(ws.Rollouts))
	}
}

// A removal staged as a rollout: the same transaction removes the keys
// (each drop-in with --recursive too) and writes the record, each key
// with what it held (From) and ToHash "" (removed); a host not yet in
// the rollout keeps every key; a second rollout of one of the keys, put
// or removal, is refused while it runs, and nothing is written.
func TestRolloutRemove(t *testing.T) {
	e := registrytest.StartEtcd(t)
	c := registrytest.NewClient(t, e.Endpoint())
	ctx := context.Background()
	tg := registry.Target{Group: "web"}
	a, drop, b := "[Service]\nExecStart=/bin/a\n", "[Service]\nEnvironment=X=1\n", "[Service]\nExecStart=/bin/b\n"
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte(a), "a.service.d/x.conf": []byte(drop), "b.service": []byte(b)}); err != nil {
		t.Fatal(err)
	}
	s := rollout.Strategy{Canary: rollout.Count{N: 1}, MaxRestarts: -1}
	newR := func(id string) *rollout.Record {
		return &rollout.Record{ID: id, Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	}
	// To one host: refused.
	if _, err := c.Remove(ctx, registry.Target{Host: "h1"}, []string{"a.service"}, registry.WithRollout(newR("r0"), false)); !errors.Is(err, registry.ErrInvalid) {
		t.Fatalf("a removal rollout to one host: %v, want ErrInvalid", err)
	}
	rev, removed, err := c.RemoveRecursive(ctx, tg, []string{"a.service"}, registry.WithRollout(newR("r1"), false))
	if err != nil || !slices.Equal(removed, []string{"a.service", "a.service.d/x.conf"}) {
		t.Fatalf("remove as a rollout: %v %v", removed, err)
	}
	v, err := c.Rollout(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Rollout.Units) != 2 || v.Rollout.Group != "web" {
		t.Fatalf("rollout units %+v", v.Rollout.Units)
	}
	for key, want := range map[string]string{"a.service": a, "a.service.d/x.conf": drop} {
		u := v.Rollout.Units[key]
		if u.From == nil || *u.From != want || u.FromRevision == 0 || u.FromRevision >= rev || u.ToHash != "" {
			t.Errorf("%s in the rollout: %+v, want From %q and ToHash \"\"", key, u, want)
		}
	}
	if ph := v.Phase(time.Now()); ph.State != rollout.Running {
		t.Errorf("phase %+v, want running", ph)
	}
	if _, err := c.Get(ctx, tg, "a.service"); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("a.service after the removal: %v", err)
	}
	// h2 (wave 2) keeps both keys; h1 (the canary) takes the removal.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan reconcile.Snapshot, 10)
	go func() { _ = c.Watch(wctx, "h2", []string{"web"}, func(s reconcile.Snapshot) { got <- s }) }()
	ws := <-got
	keys := func(es []reconcile.Entry) (out []string) {
		for _, e := range es {
			out = append(out, e.Unit)
		}
		return out
	}
	if over := rollout.Overlay(ws.Entries, "h2", ws.Rollouts, ws.Progress); !slices.Equal(keys(over), []string{"a.service", "a.service.d/x.conf", "b.service"}) {
		t.Errorf("h2 runs %v before its wave", keys(over))
	}
	w := reconcile.RolloutStep(ws.Rollouts[0], "h1", ws.Progress["r1"], ws.Entries, rollout.Overlay(ws.Entries, "h1", ws.Rollouts, ws.Progress), nil, time.Now())
	if w.Progress == nil || w.Progress.State != rollout.HostApplying {
		t.Fatalf("h1's step: %+v", w)
	}
	// A second rollout of the removed keys, put or removal: refused.
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte(a)}, registry.WithRollout(newR("r2"), false)); !errors.Is(err, registry.ErrRolloutRunning) {
		t.Errorf("a put rollout of a key a removal rollout holds: %v, want ErrRolloutRunning", err)
	}
	if _, err := c.Put(ctx, tg, map[string][]byte{"b.service": []byte("[Service]\nExecStart=/bin/b2\n")}, registry.WithRollout(newR("r3"), false)); err != nil {
		t.Fatalf("a rollout of another key: %v", err)
	}
	if _, err := c.Remove(ctx, tg, []string{"b.service"}, registry.WithRollout(newR("r4"), false)); !errors.Is(err, registry.ErrRolloutRunning) {
		t.Errorf("a removal rollout of a key a put rollout holds: %v, want ErrRolloutRunning", err)
	}
	if _, err := c.Get(ctx, tg, "b.service"); err != nil {
		t.Errorf("the refused removal removed b.service: %v", err)
	}
	all, err := c.Rollouts(ctx, "web")
	if err != nil || len(all) != 2 {
		t.Errorf("rollouts after the refused ones: %d (%v), want r1 and r3", len(all), err)
	}
	// --supersede: the removal ends r3 in the same transaction.
	if _, err := c.Remove(ctx, tg, []string{"b.service"}, registry.WithRollout(newR("r5"), true)); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.Rollout(ctx, "r3"); v.Rollout == nil || v.Rollout.End == nil || v.Rollout.End.State != rollout.Superseded {
		t.Errorf("r3 after a superseding removal: %+v", v.Rollout)
	}
	if v, _ := c.Rollout(ctx, "r5"); v.Rollout == nil || v.Rollout.Units["b.service"].ToHash != "" || *v.Rollout.Units["b.service"].From != "[Service]\nExecStart=/bin/b2\n" {
		t.Errorf("r5: %+v", v.Rollout)
	}
}
