package registry

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testlog"
	"github.com/agentd/agentd/reconcile"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// warnings records a Client's log lines.
type warnings struct {
	testlog.Buffer
}

// mustName fails unless a warning names every key.
func (w *warnings) mustName(t *testing.T, keys ...string) {
	t.Helper()
	got := w.String()
	for _, k := range keys {
		if !strings.Contains(got, "key="+k) {
			t.Errorf("no warning names %s; warnings:\n%s", k, got)
		}
	}
}

func recordWarnings(c *Client) *warnings {
	w := &warnings{}
	c.SetLogger(slog.New(slog.NewTextHandler(w, nil)))
	return w
}

func rawPut(t *testing.T, c *Client, key, value string, opts ...clientv3.OpOption) {
	t.Helper()
	if _, err := c.cli.Put(ctxT(t), key, value, opts...); err != nil {
		t.Fatal(err)
	}
}

func rawKeys(t *testing.T, c *Client, prefix string) map[string]int64 {
	t.Helper()
	resp, err := c.cli.Get(ctxT(t), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.Lease
	}
	return out
}

// TestReadersSkipGarbage: a value no agent wrote, anywhere under the
// prefix, is left out of every read with a warning naming its key; no
// read fails for it.
func TestReadersSkipGarbage(t *testing.T) {
	t.Parallel()
	e, c := newTest(t)
	reader := NewTestClient(t, e.Endpoint())
	w := recordWarnings(reader)
	ctx := ctxT(t)

	s1 := mustJoin(t, c, member("h1", "m1"))
	if err := s1.Report(ctx, []reconcile.Status{{Unit: "a.service", Hash: "x"}}); err != nil {
		t.Fatal(err)
	}
	garbage := []string{
		"/agentd/agents/hbad",         // not JSON
		"/agentd/agents/a/b",          // not a host name
		"/agentd/agents/",             // empty host
		"/agentd/status/h1/x.service", // not JSON
		"/agentd/halts/groups/web/x.service",
		"/agentd/locks/groups/web/x.service/hz",
	}
	for _, k := range garbage {
		rawPut(t, c, k, "{garbage")
	}
	rawPut(t, c, "/agentd/status/h1/", `{"hash":"y"}`) // a status without a unit

	ms, err := reader.Members(ctx)
	if err != nil {
		t.Fatalf("Members with garbage: %v", err)
	}
	if len(ms) != 1 || ms[0].Host != "h1" {
		t.Errorf("Members = %+v, want only h1", ms)
	}
	st, err := reader.Statuses(ctx, "h1")
	if err != nil {
		t.Fatalf("Statuses with garbage: %v", err)
	}
	if len(st) != 1 || st["a.service"].Hash != "x" {
		t.Errorf("Statuses = %+v, want only a.service", st)
	}
	hs, err := reader.Halts(ctx, "")
	if err != nil || len(hs) != 0 {
		t.Errorf("Halts with garbage = %+v, %v; want none, nil", hs, err)
	}
	holders, err := reader.Holders(ctx, "groups/web", reconcile.Bucket{}, "x.service")
	if err != nil || len(holders) != 1 || holders[0].Host != "hz" {
		t.Errorf("Holders with garbage = %+v, %v; want hz (it keeps its place), nil", holders, err)
	}
	w.mustName(t, garbage...)
	w.mustName(t, "/agentd/status/h1/")

	// WatchStatuses: garbage at the start and in the watch is left out;
	// garbage replacing a real status removes it.
	type call = map[string]map[string]reconcile.Status
	calls := make(chan call, 100)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- reader.WatchStatuses(wctx, []string{"h1"}, func(m call) bool {
			calls <- m
			return m["h1"]["a.service"].Hash == "z"
		})
	}()
	next := func() call {
		t.Helper()
		select {
		case m := <-calls:
			return m
		case <-time.After(5 * time.Second):
			t.Fatal("no WatchStatuses callback")
		}
		return nil
	}
	if m := next(); len(m["h1"]) != 1 || m["h1"]["a.service"].Hash != "x" {
		t.Fatalf("first call = %+v", m)
	}
	rawPut(t, c, "/agentd/status/h1/a.service", "not json")
	if m := next(); len(m["h1"]) != 0 {
		t.Fatalf("after garbage replaced a.service: %+v, want no status", m)
	}
	rawPut(t, c, "/agentd/status/h1/a.service", `{"hash":"z"}`)
	if m := next(); m["h1"]["a.service"].Hash != "z" {
		t.Fatalf("after a good value: %+v", m)
	}
	if err := <-done; err != nil {
		t.Fatalf("WatchStatuses = %v", err)
	}

	// The agent side: Watch delivers snapshots despite a garbage halt.
	mustPut(t, c, Target{Group: "web"}, "a.service", "[Service]\nExecStart=/bin/true\n")
	r, _ := runWatch(t, c, "h1", []string{"web"})
	r.waitFor(t, "a.service despite the garbage halt", 5*time.Second, func(s Snapshot) bool {
		return has(s, "group:web:a.service=[Service]\nExecStart=/bin/true\n") && len(s.Halts) == 0
	})
}

// TestJoinTakesOverGarbageMembership: a membership key whose value is not
// a record, even bound to a live lease, is not a live agent's: Join takes
// it over and leaves that lease alone.
func TestJoinTakesOverGarbageMembership(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	g, err := c.cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	rawPut(t, c, "/agentd/agents/h1", "{garbage", clientv3.WithLease(g.ID))
	rawPut(t, c, "/agentd/other", "x", clientv3.WithLease(g.ID))
	s := mustJoin(t, c, member("h1", "m1"))
	if l, _ := keyLease(t, c, "/agentd/agents/h1"); l != s.Lease() {
		t.Errorf("membership lease = %x, want ours %x", l, s.Lease())
	}
	if _, ok := keyLease(t, c, "/agentd/other"); !ok {
		t.Errorf("the garbage's lease was revoked: it is not ours to revoke")
	}
}

// TestReportRemovesForeignStatusKeys: every Report leaves exactly the
// reported units under the host's status prefix, with this agent's lease:
// keys someone else put there are deleted, an overwritten status is put
// back.
func TestReportRemovesForeignStatusKeys(t *testing.T) {
	t.Parallel()
	e, c := newTest(t)
	reader := NewTestClient(t, e.Endpoint())
	w := recordWarnings(c)
	ctx := ctxT(t)
	s := mustJoin(t, c, member("h1", "m1"))
	a := reconcile.Status{Unit: "a.service", Hash: "x"}
	if err := s.Report(ctx, []reconcile.Status{a}); err != nil {
		t.Fatal(err)
	}
	foreign := []string{
		"/agentd/status/h1/x.service", // garbage
		"/agentd/status/h1/y.service", // a plausible status of a unit h1 does not report
		"/agentd/status/h1/a/b",       // deeper
		"/agentd/status/h1/",          // the prefix itself
	}
	rawPut(t, reader, foreign[0], "{garbage")
	rawPut(t, reader, foreign[1], `{"hash":"evil","activeState":"active"}`)
	rawPut(t, reader, foreign[2], "x")
	rawPut(t, reader, foreign[3], "x")
	rawPut(t, reader, "/agentd/status/h1/a.service", "{garbage") // ours, overwritten
	rawPut(t, reader, "/agentd/status/h10/z.service", "x")       // another host's prefix: untouched

	// The same set again: nothing of ours changed, yet one Report fixes
	// the prefix.
	if err := s.Report(ctx, []reconcile.Status{a}); err != nil {
		t.Fatal(err)
	}
	keys := rawKeys(t, reader, "/agentd/status/h1/")
	if len(keys) != 1 || keys["/agentd/status/h1/a.service"] != int64(s.Lease()) {
		t.Fatalf("status keys after Report = %v, want only a.service with lease %x", keys, s.Lease())
	}
	st, err := reader.Statuses(ctx, "h1")
	if err != nil || st["a.service"].Hash != "x" {
		t.Fatalf("Statuses = %+v, %v", st, err)
	}
	if _, ok := rawKeys(t, reader, "/agentd/status/h10/")["/agentd/status/h10/z.service"]; !ok {
		t.Errorf("another host's status key was removed")
	}
	w.mustName(t, foreign...)
	w.mustName(t, "/agentd/status/h1/a.service")

	// A foreign key put without a lease after the last Report goes with
	// the next one, also when the set changed.
	rawPut(t, reader, foreign[1], `{"hash":"evil"}`)
	b := reconcile.Status{Unit: "b.service", Hash: "y"}
	if err := s.Report(ctx, []reconcile.Status{a, b}); err != nil {
		t.Fatal(err)
	}
	keys = rawKeys(t, reader, "/agentd/status/h1/")
	got := slices.Sorted(func(yield func(string) bool) {
		for k := range keys {
			if !yield(k) {
				return
			}
		}
	})
	if !slices.Equal(got, []string{"/agentd/status/h1/a.service", "/agentd/status/h1/b.service"}) {
		t.Fatalf("status keys = %v, want a.service and b.service", got)
	}
}
