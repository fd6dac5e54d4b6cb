package registry

import (
	"testing"
	"time"
)

// The keeper holds a lease well past its TTL, notices a revoke at its next
// keep-alive, and after Orphan leaves the lease to expire on the server.
func TestLeaseKeeper(t *testing.T) {
	_, c := newTest(t)
	grant := func() *leaseKeeper {
		t.Helper()
		g, err := c.cli.Grant(ctxT(t), 2)
		if err != nil {
			t.Fatal(err)
		}
		k := keepLease(c.cli, g.ID, 2)
		t.Cleanup(k.Orphan)
		return k
	}
	ttl := func(k *leaseKeeper) int64 {
		t.Helper()
		r, err := c.cli.TimeToLive(ctxT(t), k.Lease())
		if err != nil {
			t.Fatal(err)
		}
		return r.TTL
	}
	closedWithin := func(k *leaseKeeper, d time.Duration) bool {
		select {
		case <-k.Done():
			return true
		case <-time.After(d):
			return false
		}
	}

	kept := grant()
	if closedWithin(kept, 5*time.Second) {
		t.Fatal("Done closed while etcd was up and nobody revoked the lease")
	}
	if got := ttl(kept); got <= 0 {
		t.Fatalf("lease TTL %d after 2.5 TTLs of keeping it alive; want > 0", got)
	}

	if _, err := c.cli.Revoke(ctxT(t), kept.Lease()); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(kept, 2*time.Second) {
		t.Fatal("Done still open 2 s after the lease was revoked")
	}

	orphan := grant()
	orphan.Orphan()
	if !closedWithin(orphan, time.Second) {
		t.Fatal("Done still open 1 s after Orphan")
	}
	deadline := time.Now().Add(6 * time.Second)
	for ttl(orphan) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("orphaned lease still alive 6 s later: something keeps it")
		}
		time.Sleep(200 * time.Millisecond)
	}
}
