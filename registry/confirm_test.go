package registry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Session.Confirm (ConfirmSec=): it renews the lease, reads the membership
// key linearizably and writes the host's pass record, or fails saying
// which step did; with etcd away it fails within its context.
func TestConfirm(t *testing.T) {
	t.Parallel()
	e, c := newTest(t)
	ctx := ctxT(t)
	s := mustJoin(t, c, member("h1", "m1"))
	if err := s.Confirm(ctx); !errors.Is(err, errNothingPublished) {
		t.Fatalf("Confirm before any status was handed in: %v, want %v", err, errNothingPublished)
	}
	if err := s.Publish(ctx, 7, []reconcile.Status{{Unit: "a.service", ActiveState: "active"}}); err != nil {
		t.Fatal(err)
	}
	passKey := c.hostStatus("h1") + reconcile.PassKey
	modRev := func() int64 {
		resp, err := c.cli.Get(ctx, passKey)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("get %s: %v %v", passKey, resp, err)
		}
		return resp.Kvs[0].ModRevision
	}
	before := modRev()
	// Let the lease run down a little: Confirm renews it.
	time.Sleep(1100 * time.Millisecond)
	if err := s.Confirm(ctx); err != nil {
		t.Fatalf("Confirm: %v", err)
	}
	if after := modRev(); after <= before {
		t.Errorf("the pass record was not written again (mod revision %d → %d)", before, after)
	}
	ttl, err := c.cli.TimeToLive(ctx, s.Lease())
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL < 4 { // granted 5 s; 1.1 s ran down before the renewal
		t.Errorf("lease TTL %d s after Confirm, want it renewed to about 5", ttl.TTL)
	}
	if got, err := c.Statuses(ctx, "h1"); err != nil || got["a.service"].ActiveState != "active" {
		t.Errorf("statuses after Confirm: %+v %v", got, err)
	}

	// The lease revoked behind the Session's back: not confirmed.
	if _, err := c.cli.Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
	err = s.Confirm(ctx)
	if err == nil || !(errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, errLeaseLost)) || !strings.HasPrefix(err.Error(), "confirm: renew the lease") {
		t.Errorf("Confirm with the lease revoked: %v", err)
	}

	// etcd away: the try ends with its context.
	s2 := mustJoin(t, c, member("h2", "m2"))
	if err := s2.Publish(ctx, 7, nil); err != nil {
		t.Fatal(err)
	}
	c.requestTimeout = 300 * time.Millisecond // the Sessions' Close at cleanup, with etcd away
	e.Close()
	tctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = s2.Confirm(tctx)
	took := time.Since(start)
	if err == nil {
		t.Fatal("Confirm with etcd away succeeded")
	}
	if took > 2*time.Second {
		t.Errorf("Confirm with etcd away took %v, want it bounded by its 300ms context", took)
	}
	t.Logf("Confirm with etcd away: %v after %v", err, took.Round(time.Millisecond))
}
