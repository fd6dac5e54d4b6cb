package registry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func member(host, machine string) reconcile.Member {
	return reconcile.Member{Host: host, MachineID: machine, Groups: []string{"all", "web"}, Version: "test",
		StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func mustJoin(t *testing.T, c *Client, m reconcile.Member) *Session {
	t.Helper()
	s, err := c.Join(ctxT(t), m, 5*time.Second)
	if err != nil {
		t.Fatalf("Join(%s, %s): %v", m.Host, m.MachineID, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func keyLease(t *testing.T, c *Client, key string) (clientv3.LeaseID, bool) {
	t.Helper()
	resp, err := c.cli.Get(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return 0, false
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease), true
}

func TestJoin(t *testing.T) {
	t.Parallel()
	e, c := newTest(t)
	other := NewTestClient(t, e.Endpoint())

	s1 := mustJoin(t, c, member("h1", "m1"))
	members, err := other.Members(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 1 || members[0].Host != "h1" || members[0].MachineID != "m1" || len(members[0].Groups) != 2 {
		t.Fatalf("Members = %+v", members)
	}
	if l, ok := keyLease(t, c, "/agentd/agents/h1"); !ok || l != s1.Lease() {
		t.Fatalf("membership lease = %x (exists %v), want %x", l, ok, s1.Lease())
	}
	if err := s1.Report(ctxT(t), []reconcile.Status{{Unit: "a.service", Hash: "x"}}); err != nil {
		t.Fatal(err)
	}

	// Another machine claiming h1 is refused.
	if _, err := other.Join(ctxT(t), member("h1", "m2"), 5*time.Second); !errors.Is(err, ErrHostTaken) {
		t.Fatalf("Join with a different machine ID: %v, want ErrHostTaken", err)
	} else {
		t.Logf("refusal: %v", err)
	}
	// The same machine (agent restarted) takes over; the old lease and
	// what it held are gone.
	s2 := mustJoin(t, other, member("h1", "m1"))
	if l, _ := keyLease(t, c, "/agentd/agents/h1"); l != s2.Lease() {
		t.Fatalf("membership lease after takeover = %x, want %x", l, s2.Lease())
	}
	if _, ok := keyLease(t, c, "/agentd/status/h1/a.service"); ok {
		t.Errorf("status of the previous run survived the takeover")
	}
	// A second host joins next to it.
	mustJoin(t, c, member("h2", "m2"))
	members, err = c.Members(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 2 || members[0].Host != "h1" || members[1].Host != "h2" {
		t.Fatalf("Members = %+v", members)
	}

	// Close revokes the lease: the membership disappears at once.
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := keyLease(t, c, "/agentd/agents/h1"); ok {
		t.Errorf("membership key still there after Close")
	}
	if err := s2.Report(ctxT(t), nil); !errors.Is(err, ErrSessionClosed) {
		t.Errorf("Report after Close: %v, want ErrSessionClosed", err)
	}
	if _, err := c.Join(ctxT(t), member("bad/host", "m"), 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("Join with a bad host: %v, want ErrInvalid", err)
	}
}

func TestReport(t *testing.T) {
	t.Parallel()
	e, c := newTest(t)
	reader := NewTestClient(t, e.Endpoint())
	s := mustJoin(t, c, member("h1", "m1"))
	ctx := ctxT(t)

	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := reconcile.Status{Unit: "a.service", Hash: "h", DesiredHash: "h", ActiveState: "active", SubState: "running", Action: "start", Result: "done", UpdatedAt: t0}
	b := reconcile.Status{Unit: "b.service", Hash: "h", ActiveState: "inactive", UpdatedAt: t0}
	if err := s.Report(ctx, []reconcile.Status{a, b}); err != nil {
		t.Fatal(err)
	}
	got, err := reader.Statuses(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["a.service"].SubState != "running" || !got["b.service"].UpdatedAt.Equal(t0) {
		t.Fatalf("Statuses = %+v", got)
	}
	modRev := func(unit string) int64 {
		resp, err := reader.cli.Get(ctx, "/agentd/status/h1/"+unit)
		if err != nil || len(resp.Kvs) == 0 {
			t.Fatalf("get status %s: %v", unit, err)
		}
		return resp.Kvs[0].ModRevision
	}
	revA := modRev("a.service")

	// Only UpdatedAt changed: not re-put. b changed, c new, a kept.
	a2 := a
	a2.UpdatedAt = t0.Add(time.Hour)
	b.ActiveState, b.UpdatedAt = "failed", t0.Add(time.Hour)
	c3 := reconcile.Status{Unit: "c@1.service", ActiveState: "active", DropIns: map[string]string{"c@.service.d/x.conf": "h"}}
	if err := s.Report(ctx, []reconcile.Status{a2, b, c3}); err != nil {
		t.Fatal(err)
	}
	if modRev("a.service") != revA {
		t.Errorf("a.service re-put although only UpdatedAt changed")
	}
	got, _ = reader.Statuses(ctx, "h1")
	if len(got) != 3 || got["b.service"].ActiveState != "failed" || got["c@1.service"].DropIns["c@.service.d/x.conf"] != "h" {
		t.Fatalf("Statuses after update = %+v", got)
	}
	// Same drop-in map again: no re-put either.
	revC := modRev("c@1.service")
	if err := s.Report(ctx, []reconcile.Status{a2, b, c3}); err != nil {
		t.Fatal(err)
	}
	if modRev("c@1.service") != revC {
		t.Errorf("c@1.service re-put without a change")
	}

	// b dropped from the set: its key is deleted.
	if err := s.Report(ctx, []reconcile.Status{a2, c3}); err != nil {
		t.Fatal(err)
	}
	got, _ = reader.Statuses(ctx, "h1")
	if _, ok := got["b.service"]; ok || len(got) != 2 {
		t.Fatalf("Statuses after dropping b = %+v", got)
	}

	// The lease is revoked behind the session's back (e.g. expired while
	// etcd was away): the next Report re-creates lease and membership
	// and re-publishes everything.
	old := s.Lease()
	if _, err := reader.cli.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	if got, _ := reader.Statuses(ctx, "h1"); len(got) != 0 {
		t.Fatalf("statuses survived the revoke: %+v", got)
	}
	if err := s.Report(ctx, []reconcile.Status{a2, c3}); err != nil {
		t.Fatalf("Report after the lease was revoked: %v", err)
	}
	if s.Lease() == old || s.Lease() == clientv3.NoLease {
		t.Errorf("lease not re-created: %x", s.Lease())
	}
	got, _ = reader.Statuses(ctx, "h1")
	if len(got) != 2 {
		t.Fatalf("Statuses after re-creation = %+v", got)
	}
	if l, ok := keyLease(t, reader, "/agentd/agents/h1"); !ok || l != s.Lease() {
		t.Errorf("membership after re-creation: lease %x exists %v, want %x", l, ok, s.Lease())
	}
	if l, _ := keyLease(t, reader, "/agentd/status/h1/a.service"); l != s.Lease() {
		t.Errorf("status lease after re-creation = %x, want %x", l, s.Lease())
	}

	// Without a Report, the Session's own goroutine recovers too.
	old = s.Lease()
	if _, err := reader.cli.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _ := reader.Statuses(ctx, "h1")
		members, _ := reader.Members(ctx)
		if len(got) == 2 && len(members) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no background recovery: statuses %v, members %v", got, members)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Close: statuses and membership are gone.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got, _ = reader.Statuses(ctx, "h1")
	members, _ := reader.Members(ctx)
	if len(got) != 0 || len(members) != 0 {
		t.Fatalf("after Close: statuses %v, members %v", got, members)
	}
}

func TestReportRepublishesAfterRestart(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	// A first run publishes two statuses and dies without revoking.
	s1, err := c.Join(ctx, member("h1", "m1"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.Publish(ctx, 5, []reconcile.Status{{Unit: "a.service"}, {Unit: "gone.service"}}); err != nil {
		t.Fatal(err)
	}
	s1.stop()
	s1.wg.Wait()
	s1.sess.Orphan() // keep-alive stops, lease stays until its TTL

	// The new run finds the old run's pass record among its statuses and
	// writes its own over it (once a delete and a put of the same key in
	// one transaction: "duplicate key given in txn request", and the
	// host published nothing more, seen in CI after a cluster outage).
	// The old lease may outlive the takeover (its revoke timed out while
	// the cluster came back); a pass record of no lease stands for it.
	if _, err := c.cli.Put(ctx, c.hostStatus("h1")+reconcile.PassKey, `{"acted":5}`); err != nil {
		t.Fatal(err)
	}
	s2 := mustJoin(t, c, member("h1", "m1"))
	if err := s2.Publish(ctx, 6, []reconcile.Status{{Unit: "a.service", ActiveState: "active"}}); err != nil {
		t.Fatal(err)
	}
	if reps, err := c.Reports(ctx, []string{"h1"}); err != nil || reps["h1"].Pass.Acted != 6 {
		t.Fatalf("pass record after the new run published: %+v %v, want acted 6", reps["h1"].Pass, err)
	}
	got, err := c.Statuses(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["a.service"].ActiveState != "active" {
		t.Fatalf("Statuses = %+v, want only the new a.service", got)
	}
}

func TestReportUnreachable(t *testing.T) {
	t.Parallel()
	e, c := newTest(t)
	c.requestTimeout = 300 * time.Millisecond
	s := mustJoin(t, c, member("h1", "m1"))
	e.Close()
	start := time.Now()
	err := s.Report(context.Background(), []reconcile.Status{{Unit: "a.service"}})
	if err == nil {
		t.Fatal("Report with etcd down succeeded")
	}
	t.Logf("Report with etcd down: %v after %s", err, time.Since(start).Round(time.Millisecond))
}
