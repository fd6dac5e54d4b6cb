package registry

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leaseKeeper keeps one lease alive with a single keep-alive request every
// third of its TTL, and closes Done when the lease is gone: revoked,
// expired, or no keep-alive got through before its deadline.
//
// It replaces concurrency.Session (the client's KeepAlive) because the
// client's lessor runs two 500 ms loops for as long as any lease is kept:
// measured, four of an idle agent's ~20 wake-ups per second came from
// them, and each woke several threads. One request per TTL/3 is all a
// lease needs.
type leaseKeeper struct {
	id     clientv3.LeaseID
	done   chan struct{}
	cancel context.CancelFunc
}

// keepLease starts keeping id (granted just now with ttl seconds) alive.
// The goroutine it starts ends with Orphan or when the lease is gone.
func keepLease(cli *clientv3.Client, id clientv3.LeaseID, ttl int) *leaseKeeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &leaseKeeper{id: id, done: make(chan struct{}), cancel: cancel}
	go k.run(ctx, cli, time.Duration(ttl)*time.Second)
	return k
}

// Lease is the kept lease's ID.
func (k *leaseKeeper) Lease() clientv3.LeaseID { return k.id }

// Done is closed when the lease is lost or the keeper orphaned.
func (k *leaseKeeper) Done() <-chan struct{} { return k.done }

// Orphan stops keeping the lease alive without revoking it: it expires
// after its TTL unless someone revokes it.
func (k *leaseKeeper) Orphan() { k.cancel() }

func (k *leaseKeeper) run(ctx context.Context, cli *clientv3.Client, ttl time.Duration) {
	defer close(k.done)
	interval := max(ttl/3, 100*time.Millisecond)
	deadline := time.Now().Add(ttl) // the lease was granted just before
	t := time.NewTimer(interval)
	defer t.Stop()
	for fails := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			return // expired while no keep-alive got through
		}
		// One try may take until the next is due, never past the deadline.
		tctx, cancel := context.WithTimeout(ctx, min(deadline.Sub(sent), interval))
		resp, err := cli.KeepAliveOnce(tctx, k.id)
		cancel()
		switch {
		case err == nil:
			fails = 0
			deadline = sent.Add(time.Duration(resp.TTL) * time.Second)
			t.Reset(interval)
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return // revoked or expired on the server
		case ctx.Err() != nil:
			return
		default:
			// etcd unreachable: keep trying, quickly, until the deadline.
			t.Reset(min(backoffDelay(fails), time.Until(deadline)))
			fails++
		}
	}
}
