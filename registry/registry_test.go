package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testport"
	"github.com/agentd/agentd/reconcile"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// newTest starts an etcd and a client for one test.
func newTest(t *testing.T) (*Embedded, *Client) {
	t.Helper()
	e := StartTestEtcd(t)
	return e, NewTestClient(t, e.Endpoint())
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// snapRecorder collects Watch callbacks.
type snapRecorder struct {
	mu    sync.Mutex
	snaps []Snapshot
	ch    chan struct{}
}

func newRecorder() *snapRecorder { return &snapRecorder{ch: make(chan struct{}, 1)} }

func (r *snapRecorder) on(s Snapshot) {
	r.mu.Lock()
	r.snaps = append(r.snaps, s)
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

func (r *snapRecorder) all() []Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.snaps)
}

// waitFor waits until the newest snapshot satisfies ok.
func (r *snapRecorder) waitFor(t *testing.T, what string, timeout time.Duration, ok func(Snapshot) bool) Snapshot {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if s := r.all(); len(s) > 0 && ok(s[len(s)-1]) {
			return s[len(s)-1]
		}
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; snapshots: %s", what, describe(r.all()))
		}
	}
}

func describe(snaps []Snapshot) string {
	out := ""
	for _, s := range snaps {
		out += fmt.Sprintf("\n  rev %d: %v", s.Revision, units(s))
	}
	return out
}

// units renders a snapshot's entries as "scope/group/unit=value".
func units(s Snapshot) []string {
	var out []string
	for _, e := range s.Entries {
		k := e.Scope.String() + ":" + e.Unit
		if e.Scope == reconcile.ScopeGroup {
			k = "group:" + e.Group + ":" + e.Unit
		}
		out = append(out, k+"="+string(e.Value))
	}
	return out
}

func has(s Snapshot, want ...string) bool {
	u := units(s)
	for _, w := range want {
		if !slices.Contains(u, w) {
			return false
		}
	}
	return true
}

// runWatch runs c.Watch in the background until the test ends or stop is
// called.
func runWatch(t *testing.T, c *Client, host string, groups []string) (r *snapRecorder, stop func()) {
	t.Helper()
	r = newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Watch(ctx, host, groups, r.on) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Watch returned %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Watch did not return after cancel")
		}
	})
	t.Cleanup(stop)
	return r, stop
}

func mustPut(t *testing.T, c *Client, tg Target, kv ...string) int64 {
	t.Helper()
	m := map[string][]byte{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = []byte(kv[i+1])
	}
	rev, err := c.Put(ctxT(t), tg, m)
	if err != nil {
		t.Fatalf("Put(%v): %v", tg, err)
	}
	return rev
}

func TestWatchSnapshots(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	h1, web, db := Target{Host: "h1"}, Target{Group: "web"}, Target{Group: "db"}
	mustPut(t, c, h1, "a.service", "A1")
	mustPut(t, c, web, "w.service", "W1", "w.service.d/10-x.conf", "X")
	mustPut(t, c, db, "d.service", "D1")
	mustPut(t, c, Target{Host: "h2"}, "other.service", "O")
	rev := mustPut(t, c, web, "a.service", "WA")

	r, _ := runWatch(t, c, "h1", []string{"web", "all", "web"})
	first := r.waitFor(t, "initial snapshot", 5*time.Second, func(Snapshot) bool { return true })
	want := []string{"host:a.service=A1", "group:web:a.service=WA", "group:web:w.service=W1", "group:web:w.service.d/10-x.conf=X"}
	if got := units(first); !slices.Equal(got, want) {
		t.Fatalf("initial snapshot = %v, want %v (sorted by scope, group, unit)", got, want)
	}
	if first.Revision != rev {
		t.Errorf("initial snapshot revision = %d, want %d (one read at the last revision)", first.Revision, rev)
	}
	for _, e := range first.Entries {
		if e.ModRevision == 0 || e.ModRevision > first.Revision {
			t.Errorf("entry %s: ModRevision %d outside (0, %d]", e.Unit, e.ModRevision, first.Revision)
		}
	}

	// Changes for other hosts and groups produce no callback.
	n := len(r.all())
	mustPut(t, c, db, "d.service", "D2")
	mustPut(t, c, Target{Host: "h2"}, "other.service", "O2")
	mustPut(t, c, Target{Group: "web2"}, "x.service", "nope")
	mustPut(t, c, Target{Host: "h10"}, "x.service", "nope")
	// A relevant change after them: the next callback must be this one.
	rev = mustPut(t, c, h1, "a.service", "A2")
	s := r.waitFor(t, "update of a.service", 5*time.Second, func(s Snapshot) bool { return has(s, "host:a.service=A2") })
	if got := len(r.all()); got != n+1 {
		t.Errorf("callbacks after unrelated puts and one relevant put: %d, want %d:%s", got-n, 1, describe(r.all()[n:]))
	}
	if s.Revision != rev {
		t.Errorf("snapshot revision = %d, want %d", s.Revision, rev)
	}
	if len(s.Entries) != 4 {
		t.Errorf("snapshot after update = %v, want the full set of 4", units(s))
	}

	// Delete.
	if _, err := c.Remove(ctxT(t), web, []string{"w.service.d/10-x.conf"}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "drop-in removal", 5*time.Second, func(s Snapshot) bool {
		return len(s.Entries) == 3 && !slices.Contains(units(s), "group:web:w.service.d/10-x.conf=X")
	})

	// A transaction touching host and group keys (two watchers) arrives
	// as one callback too.
	n = len(r.all())
	if _, err := c.cli.Txn(ctxT(t)).Then(
		clientv3.OpPut("/agentd/hosts/h1/units/x.service", "X"),
		clientv3.OpPut("/agentd/groups/all/units/x.service", "GX"),
	).Commit(); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "cross-prefix txn", 5*time.Second, func(s Snapshot) bool {
		return has(s, "host:x.service=X", "group:all:x.service=GX")
	})
	time.Sleep(50 * time.Millisecond)
	if got := len(r.all()) - n; got != 1 {
		t.Errorf("a host+group transaction produced %d callbacks, want 1:%s", got, describe(r.all()[n:]))
	}

	// 50 units in one transaction arrive as one callback.
	n = len(r.all())
	big := map[string][]byte{}
	for i := range 50 {
		big[fmt.Sprintf("u%02d.service", i)] = []byte("x")
	}
	if _, err := c.Put(ctxT(t), Target{Group: "all"}, big); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "50 new units", 5*time.Second, func(s Snapshot) bool { return len(s.Entries) == 55 })
	time.Sleep(50 * time.Millisecond)
	if got := len(r.all()) - n; got != 1 {
		t.Errorf("a 50-unit transaction produced %d callbacks, want 1:%s", got, describe(r.all()[n:]))
	}
}

func TestWatchResyncsAfterCompaction(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	h1 := Target{Host: "h1"}
	mustPut(t, c, h1, "a.service", "A1")

	// Between the first read and the start of the watch, the key changes
	// and history is compacted past the read revision: the watch from R+1
	// fails with ErrCompacted and Watch must re-read.
	var once sync.Once
	c.testAfterRead = func() {
		once.Do(func() {
			mustPut(t, c, h1, "a.service", "A2")
			rev := mustPut(t, c, h1, "b.service", "B")
			if _, err := c.cli.Compact(ctxT(t), rev, clientv3.WithCompactPhysical()); err != nil {
				t.Errorf("compact: %v", err)
			}
		})
	}
	r, _ := runWatch(t, c, "h1", nil)
	r.waitFor(t, "state after compaction", 5*time.Second, func(s Snapshot) bool {
		return has(s, "host:a.service=A2", "host:b.service=B")
	})
	for i, s := range r.all() {
		if len(s.Entries) == 0 {
			t.Errorf("snapshot %d is empty", i)
		}
	}
	// And the re-established watch keeps working.
	mustPut(t, c, h1, "c.service", "C")
	r.waitFor(t, "c.service", 5*time.Second, func(s Snapshot) bool { return has(s, "host:c.service=C") })
}

func TestWatchFromCompactedRevision(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	h1 := Target{Host: "h1"}
	mustPut(t, c, h1, "a.service", "A1")
	rev := mustPut(t, c, h1, "a.service", "A2")
	if _, err := c.cli.Compact(ctxT(t), rev); err != nil {
		t.Fatal(err)
	}
	w := &unitWatch{c: c, prefixes: []string{c.hostUnits("h1")}}
	err := w.watch(ctxT(t), newUnitState(), 1, func(Snapshot) { t.Error("snapshot from a compacted watch") })
	if !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("watch from a compacted revision: %v, want ErrCompacted", err)
	}
}

func TestWatchPeriodicResync(t *testing.T) {
	t.Parallel()
	e := StartTestEtcd(t)
	c := New(RawTestClient(t, e.Endpoint()), "/custom/", WithResyncInterval(100*time.Millisecond)) // closed with the raw client
	if c.Prefix() != "/custom" {
		t.Errorf("Prefix() = %q", c.Prefix())
	}
	mustPut(t, c, Target{Host: "h1"}, "a.service", "A")
	r, _ := runWatch(t, c, "h1", nil)
	time.Sleep(600 * time.Millisecond)
	snaps := r.all()
	if len(snaps) < 3 {
		t.Fatalf("got %d snapshots in 600 ms with a 100 ms resync, want ≥ 3", len(snaps))
	}
	for _, s := range snaps {
		if !has(s, "host:a.service=A") {
			t.Errorf("resync snapshot %v lacks a.service", units(s))
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func TestWatchSurvivesEtcdRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := EmbedConfig{
		Dir:       dir,
		ClientURL: fmt.Sprintf("http://127.0.0.1:%d", testport.Restartable(t)),
		PeerURL:   "http://127.0.0.1:0",
		ForTests:  true,
		Logger:    slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	e, err := StartEmbedded(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := NewTestClient(t, e.Endpoint())
	mustPut(t, c, Target{Host: "h1"}, "a.service", "A")
	r, stop := runWatch(t, c, "h1", []string{"web"})
	r.waitFor(t, "initial snapshot", 5*time.Second, func(s Snapshot) bool { return has(s, "host:a.service=A") })

	n := len(r.all())
	start := time.Now()
	e.Close() // cuts the open watch stream after etcd's request timeout (~5 s)
	t.Logf("etcd closed in %s", time.Since(start).Round(time.Millisecond))
	time.Sleep(1500 * time.Millisecond) // Watch sees the outage and retries

	if got := len(r.all()); got != n {
		t.Errorf("%d callbacks while etcd was down, want none:%s", got-n, describe(r.all()[n:]))
	}
	e, err = StartEmbedded(ctxT(t), cfg)
	if err != nil {
		t.Fatalf("restart etcd on the same dir and URL: %v", err)
	}
	closeEtcd := sync.OnceFunc(e.Close)
	t.Cleanup(closeEtcd)
	start = time.Now()
	mustPut(t, c, Target{Group: "web"}, "w.service", "W")
	r.waitFor(t, "state after restart", 15*time.Second, func(s Snapshot) bool {
		return has(s, "host:a.service=A", "group:web:w.service=W")
	})
	t.Logf("recovered %s after restart", time.Since(start).Round(time.Millisecond))
	for i, s := range r.all()[n:] {
		if !has(s, "host:a.service=A") {
			t.Errorf("snapshot %d after the outage lost a.service: %v", n+i, units(s))
		}
	}
	// Stop the watcher and the client first: etcd closes at once without
	// open streams.
	stop()
	c.Close()
	closeEtcd()
}

// A transaction over several watched prefixes lands as one snapshot as soon
// as every watcher has shown its revision (etcd's progress notification),
// not after a fixed wait: with the wait made an hour long, snapshots still
// come, one per transaction.
func TestWatchSettlesOnProgressNotify(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	c.settleDelay = time.Hour
	r, _ := runWatch(t, c, "h1", []string{"web", "all"})
	r.waitFor(t, "initial snapshot", 5*time.Second, func(Snapshot) bool { return true })
	// etcd answers a progress request only once every watcher of the
	// stream has caught up: the watchers are created one after another
	// after the snapshot, and one created behind the store's revision
	// catches up within etcd's 100 ms sync interval.
	time.Sleep(300 * time.Millisecond)

	n := len(r.all())
	if _, err := c.cli.Txn(ctxT(t)).Then(
		clientv3.OpPut("/agentd/hosts/h1/units/x.service", "X"),
		clientv3.OpPut("/agentd/groups/web/units/y.service", "Y"),
		clientv3.OpPut("/agentd/groups/all/units/z.service", "Z"),
	).Commit(); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "three-prefix txn", 5*time.Second, func(s Snapshot) bool {
		return has(s, "host:x.service=X", "group:web:y.service=Y", "group:all:z.service=Z")
	})
	mustPut(t, c, Target{Group: "web"}, "y.service", "Y2")
	r.waitFor(t, "one-prefix put", 5*time.Second, func(s Snapshot) bool { return has(s, "group:web:y.service=Y2") })
	if got := len(r.all()) - n; got != 2 {
		t.Errorf("two transactions produced %d callbacks, want 2:%s", got, describe(r.all()[n:]))
	}
}

// A group key written after the rollouts were last known is held until
// they are (a rollout's record may come later than the keys it stages).
// When etcd never answers the progress request (it ignores one while a
// watcher of the stream catches up: 14 of 3,000 agents were stuck on a
// plain put until the 5-minute resync), the watch reads the rollout
// prefixes at the revision instead, and the change goes on.
func TestWatchCatchesUpWithoutProgressNotifications(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	c.testNoProgress = true
	web := Target{Group: "web"}
	mustPut(t, c, web, "a.service", "A1")
	r, _ := runWatch(t, c, "h1", []string{"web"})
	r.waitFor(t, "first snapshot", 5*time.Second, func(s Snapshot) bool { return has(s, "group:web:a.service=A1") })
	start := time.Now()
	mustPut(t, c, web, "a.service", "A2")
	r.waitFor(t, "the plain put, caught up", 5*time.Second, func(s Snapshot) bool {
		return has(s, "group:web:a.service=A2") && s.Rollouts.KnownUpTo >= s.Revision
	})
	t.Logf("a plain put reached the host %v after it was written, without a progress notification", time.Since(start).Round(time.Millisecond))
}
