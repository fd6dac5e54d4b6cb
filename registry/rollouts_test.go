package registry_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testlog"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/rollout"
)

// hostWatch is one host's Watch, its snapshots in order.
type hostWatch struct {
	mu    sync.Mutex
	snaps []registry.Snapshot
	poke  chan struct{}
}

// watchHost runs c.Watch for host in group web until the test ends.
func watchHost(t *testing.T, c *registry.Client, host string) *hostWatch {
	t.Helper()
	w := &hostWatch{poke: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Watch(ctx, host, []string{"web"}, func(s registry.Snapshot) {
			w.mu.Lock()
			w.snaps = append(w.snaps, s)
			w.mu.Unlock()
			select {
			case w.poke <- struct{}{}:
			default:
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

func (w *hostWatch) all() []registry.Snapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.snaps)
}

// waitFor returns the newest snapshot once it satisfies ok.
func (w *hostWatch) waitFor(t *testing.T, what string, ok func(registry.Snapshot) bool) registry.Snapshot {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if s := w.all(); len(s) > 0 && ok(s[len(s)-1]) {
			return s[len(s)-1]
		}
		select {
		case <-w.poke:
		case <-deadline:
			t.Fatalf("timed out waiting for %s (%d snapshots)", what, len(w.all()))
		}
	}
}

func anySnapshot(registry.Snapshot) bool { return true }

func joinHost(t *testing.T, c *registry.Client, host string) *registry.Session {
	t.Helper()
	s, err := c.Join(context.Background(), reconcile.Member{Host: host, MachineID: "m-" + host, Groups: []string{"web"}}, 5*time.Second)
	if err != nil {
		t.Fatalf("join %s: %v", host, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A rollout put writes the keys and the record in one transaction; each
// agent's watch carries the record, known complete up to the put (so no
// key is held back for a record yet to come), with the host's own
// admission and progress, and nothing of another host's.
func TestRolloutInWatch(t *testing.T) {
	e := registrytest.StartEtcd(t)
	c := registrytest.NewClient(t, e.Endpoint())
	ctx := context.Background()
	tg := registry.Target{Group: "web"}
	const old, cur = "[Service]\nExecStart=/bin/old\n", "[Service]\nExecStart=/bin/new\n"
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte(old)}); err != nil {
		t.Fatal(err)
	}
	s := rollout.Strategy{Canary: rollout.Count{N: 1}, MaxRestarts: -1}
	r := &rollout.Record{ID: registry.NewRolloutID(time.Now()), Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	putRev, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte(cur)}, registry.WithRollout(r, false))
	if err != nil {
		t.Fatal(err)
	}
	// The same keys again: refused while it runs.
	r2 := &rollout.Record{ID: registry.NewRolloutID(time.Now()), Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte("x")}, registry.WithRollout(r2, false)); err == nil {
		t.Fatal("a second rollout of the same key was taken")
	}
	s1, s2 := joinHost(t, c, "h1"), joinHost(t, c, "h2")
	// h2's watch logs to logs: a key of another host's that reached it
	// would be logged as skipped (it is no record).
	logs := &testlog.Buffer{}
	c2, err := registry.Dial(ctx, registry.Config{Endpoints: []string{e.Endpoint()}, DialTimeout: 10 * time.Second,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c2.Close() })
	w1, w2 := watchHost(t, c, "h1"), watchHost(t, c2, "h2")

	snap := w2.waitFor(t, "h2's first snapshot", anySnapshot)
	v := snap.Rollouts
	if len(v.Records) != 1 || v.Records[0].ID != r.ID || *v.Records[0].Units["a.service"].From != old {
		t.Fatalf("snapshot rollouts: %+v", v.Records)
	}
	if v.KnownUpTo < putRev {
		t.Errorf("rollouts known up to %d, before the put at %d", v.KnownUpTo, putRev)
	}
	if _, held := rollout.HoldUnconfirmed(snap.Entries, nil, v.KnownUpTo); held {
		t.Errorf("a key is held back for a record that came with it (known up to %d)", v.KnownUpTo)
	}
	if len(v.Mine) != 0 || len(v.Admitted) != 0 {
		t.Errorf("h2's progress %v and admissions %v before anything was written", v.Mine, v.Admitted)
	}
	over := rollout.Overlay(snap.Entries, "h2", v.Records, v.Mine)
	if string(over[0].Value) != old {
		t.Fatalf("h2 runs %q before its wave", over[0].Value)
	}
	rec := v.Records[0]

	// h1, the canary, takes nothing until the coordinator admits it.
	step := func(sn registry.Snapshot, host string) rollout.Write {
		hv := sn.Rollouts
		return rollout.Step(rec, rollout.HostInput{Host: host, Mine: hv.Mine[rec.ID], Admitted: hv.Admitted[rec.ID],
			Entries: sn.Entries, Runs: rollout.Overlay(sn.Entries, host, hv.Records, hv.Mine)}, time.Now())
	}
	if w := step(w1.waitFor(t, "h1's first snapshot", anySnapshot), "h1"); !w.IsZero() {
		t.Fatalf("h1's step before its admission: %+v", w)
	}
	co, err := s1.Campaign(ctx, "web")
	if err != nil {
		t.Fatal(err)
	}
	defer co.Resign(ctx)
	if err := co.Admit(ctx, rec, []string{"h1"}, rollout.Admission{Wave: 0, At: time.Now(), By: "h1"}); err != nil {
		t.Fatal(err)
	}
	snap1 := w1.waitFor(t, "h1's admission", func(s registry.Snapshot) bool { return s.Rollouts.Admitted[rec.ID] })
	w := step(snap1, "h1")
	if w.Progress == nil || w.Progress.State != rollout.HostApplying {
		t.Fatalf("h1's step once admitted: %+v", w)
	}
	progRev, err := s1.WriteProgress(ctx, rec.ID, *w.Progress)
	if err != nil {
		t.Fatal(err)
	}
	snap1 = w1.waitFor(t, "h1's own progress", func(s registry.Snapshot) bool {
		p := s.Rollouts.Mine[rec.ID]
		return p != nil && p.State == rollout.HostApplying
	})
	if over := rollout.Overlay(snap1.Entries, "h1", snap1.Rollouts.Records, snap1.Rollouts.Mine); string(over[0].Value) != cur {
		t.Errorf("h1 runs %q once it took the change", over[0].Value)
	}

	// h2 is admitted after h1 wrote its progress, and writes its own: its
	// watch shows both, and never h1's progress or admission.
	if err := co.Admit(ctx, rec, []string{"h2"}, rollout.Admission{Wave: 1, At: time.Now(), By: "h1"}); err != nil {
		t.Fatal(err)
	}
	w2.waitFor(t, "h2's admission", func(s registry.Snapshot) bool { return s.Rollouts.Admitted[rec.ID] })
	mine := rollout.Progress{State: rollout.HostSoaking, Since: time.Now().UTC(), Reason: "h2's own"}
	if _, err := s2.WriteProgress(ctx, rec.ID, mine); err != nil {
		t.Fatal(err)
	}
	w2.waitFor(t, "h2's own progress", func(s registry.Snapshot) bool {
		p := s.Rollouts.Mine[rec.ID]
		return p != nil && p.Reason == "h2's own"
	})
	// A watch started now reads every prefix it watches at once.
	again := watchHost(t, c2, "h2").waitFor(t, "a new watch of h2", anySnapshot)
	if p := again.Rollouts.Mine[rec.ID]; len(again.Rollouts.Mine) != 1 || p == nil || p.Reason != "h2's own" || !again.Rollouts.Admitted[rec.ID] {
		t.Errorf("a new watch of h2: progress %v, admissions %v", again.Rollouts.Mine, again.Rollouts.Admitted)
	}
	for _, sn := range w2.all() {
		if sn.Revision == progRev {
			t.Errorf("h2's watch handed out a snapshot for h1's progress (revision %d)", progRev)
		}
		if p := sn.Rollouts.Mine[rec.ID]; p != nil && p.Reason != "h2's own" {
			t.Errorf("h2's watch carries another host's progress: %+v", p)
		}
	}
	if l := logs.String(); strings.Contains(l, "/rollouts/hosts/h1/") || strings.Contains(l, "/rollouts/admit/web/h1/") {
		t.Errorf("h2's watch received h1's keys:\n%s", l)
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
		v.Record.End = &rollout.End{State: rollout.Aborted, At: time.Now()}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b := &rollout.Record{ID: "rb", Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	if _, err := c.Put(ctx, tg, map[string][]byte{"a.service": []byte("v3")}, registry.WithRollout(b, false)); err != nil {
		t.Fatalf("a rollout after an aborted one: %v", err)
	}
	v, err := c.Rollout(ctx, "rb", false)
	if err != nil || v.Record.After != "ra" {
		t.Fatalf("rb follows %q (%v), want ra", v.Record.After, err)
	}
	ws := watchHost(t, c, "h2").waitFor(t, "h2's first snapshot", anySnapshot)
	over := rollout.Overlay(ws.Entries, "h2", ws.Rollouts.Records, ws.Rollouts.Mine)
	if len(ws.Rollouts.Records) != 2 || string(over[0].Value) != "v1" {
		t.Fatalf("h2 (in neither change) runs %q with %d rollouts in its snapshot, want v1", over[0].Value, len(ws.Rollouts.Records))
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
	v, err := c.Rollout(ctx, "r1", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Record.Units) != 2 || v.Record.Group != "web" {
		t.Fatalf("rollout units %+v", v.Record.Units)
	}
	for key, want := range map[string]string{"a.service": a, "a.service.d/x.conf": drop} {
		u := v.Record.Units[key]
		if u.From == nil || *u.From != want || u.FromRevision == 0 || u.FromRevision >= rev || u.ToHash != "" {
			t.Errorf("%s in the rollout: %+v, want From %q and ToHash \"\"", key, u, want)
		}
	}
	// No coordinator runs: nobody summarized it yet.
	if ph := v.Phase(); ph.State != rollout.Starting {
		t.Errorf("phase %+v, want starting", ph)
	}
	if _, err := c.Get(ctx, tg, "a.service"); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("a.service after the removal: %v", err)
	}
	// h2 (wave 2) keeps both keys; h1 (the canary) takes the removal.
	ws := watchHost(t, c, "h2").waitFor(t, "h2's first snapshot", anySnapshot)
	keys := func(es []reconcile.Entry) (out []string) {
		for _, e := range es {
			out = append(out, e.Unit)
		}
		return out
	}
	hv := ws.Rollouts
	if over := rollout.Overlay(ws.Entries, "h2", hv.Records, hv.Mine); !slices.Equal(keys(over), []string{"a.service", "a.service.d/x.conf", "b.service"}) {
		t.Errorf("h2 runs %v before its wave", keys(over))
	}
	// h1, once admitted, takes the removal (by the record h2 was handed).
	in := rollout.HostInput{Host: "h1", Admitted: true, Entries: ws.Entries, Runs: rollout.Overlay(ws.Entries, "h1", hv.Records, nil)}
	w := rollout.Step(hv.Records[0], in, time.Now())
	if w.Progress == nil || w.Progress.State != rollout.HostApplying {
		t.Fatalf("h1's step: %+v", w)
	}
	if runs := rollout.Overlay(ws.Entries, "h1", hv.Records, map[string]*rollout.Progress{"r1": w.Progress}); !slices.Equal(keys(runs), []string{"b.service"}) {
		t.Errorf("h1, taking the removal, runs %v", keys(runs))
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
	all, err := c.Rollouts(ctx, "web", false)
	if err != nil || len(all) != 2 {
		t.Errorf("rollouts after the refused ones: %d (%v), want r1 and r3", len(all), err)
	}
	// --supersede: the removal ends r3 in the same transaction.
	if _, err := c.Remove(ctx, tg, []string{"b.service"}, registry.WithRollout(newR("r5"), true)); err != nil {
		t.Fatal(err)
	}
	if v, _ := c.Rollout(ctx, "r3", false); v.Record == nil || v.Record.End == nil || v.Record.End.State != rollout.Superseded {
		t.Errorf("r3 after a superseding removal: %+v", v.Record)
	}
	if v, _ := c.Rollout(ctx, "r5", false); v.Record == nil || v.Record.Units["b.service"].ToHash != "" || *v.Record.Units["b.service"].From != "[Service]\nExecStart=/bin/b2\n" {
		t.Errorf("r5: %+v", v.Record)
	}
}
