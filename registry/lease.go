package registry

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leaseKeeper keeps one lease alive with one keep-alive request every half
// of its TTL, on a stream it keeps open, and closes Done when the lease is
// gone: revoked, expired, or no keep-alive got through before its deadline.
//
// Every half, not every third as etcd's client does: the renewal is the
// idle agent's only regular work, and each wakes several of the runtime's
// threads (measured with strace: ~60–90 syscalls, most of them the
// scheduler's). A renewal that fails is retried with backoff for the half
// that is left, which is seconds.
//
// It replaces concurrency.Session (the client's KeepAlive) because the
// client's lessor runs two 500 ms loops for as long as any lease is kept:
// measured, four of an idle agent's ~20 wake-ups per second came from
// them, and each woke several threads. The stream stays open as the
// lessor's did, so etcd sees one stream per agent, not one per renewal.
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

// early spreads the renewals of agents restarted together over the last
// tenth before interval (half the TTL), never after it: a renewal later
// than half the TTL would leave less than half of it to the next, and
// etcd counts a lease's time left in whole seconds.
func early(interval time.Duration) time.Duration {
	return interval - rand.N(interval/10+1)
}

// errLeaseGone is a keep-alive answered with TTL 0: revoked or expired.
var errLeaseGone = errors.New("lease not found")

func (k *leaseKeeper) run(ctx context.Context, cli *clientv3.Client, ttl time.Duration) {
	defer close(k.done)
	interval := max(ttl/2, 100*time.Millisecond)
	deadline := time.Now().Add(ttl) // the lease was granted just before
	s := &keepAliveStream{cli: cli}
	defer s.close()
	// Spread (early): agents restarted together do not renew in step.
	t := time.NewTimer(early(interval))
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
		newTTL, err := s.renew(ctx, k.id, min(deadline.Sub(sent), interval))
		switch {
		case err == nil:
			fails = 0
			deadline = sent.Add(time.Duration(newTTL) * time.Second)
			t.Reset(early(interval))
		case errors.Is(err, errLeaseGone), ctx.Err() != nil:
			return
		default:
			// etcd unreachable or the stream broken: a new stream, quickly,
			// until the deadline.
			s.close()
			t.Reset(min(backoffDelay(fails), time.Until(deadline)))
			fails++
		}
	}
}

// keepAliveStream is a LeaseKeepAlive stream opened on first use.
type keepAliveStream struct {
	cli    *clientv3.Client
	stream pb.Lease_LeaseKeepAliveClient
	cancel context.CancelFunc
}

// renew sends one keep-alive for id and waits up to timeout for its answer:
// the lease's new TTL in seconds.
func (s *keepAliveStream) renew(ctx context.Context, id clientv3.LeaseID, timeout time.Duration) (int64, error) {
	if s.stream == nil {
		sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		stream, err := pb.NewLeaseClient(s.cli.ActiveConnection()).LeaseKeepAlive(sctx)
		if err != nil {
			cancel()
			return 0, err
		}
		s.stream, s.cancel = stream, cancel
	}
	// An answer that does not come in time ends the stream: Recv returns.
	stop := time.AfterFunc(timeout, s.cancel)
	defer stop.Stop()
	if err := s.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)}); err != nil {
		return 0, err
	}
	resp, err := s.stream.Recv()
	if err != nil {
		return 0, err
	}
	if resp.TTL <= 0 {
		return 0, errLeaseGone
	}
	return resp.TTL, nil
}

func (s *keepAliveStream) close() {
	if s.cancel != nil {
		s.cancel()
	}
	s.stream, s.cancel = nil, nil
}
