package registry

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// errNothingPublished is Confirm's answer before the agent handed the
// Session a pass record to publish: it has no status to write yet.
var errNothingPublished = errors.New("no statuses handed in to publish yet")

// Confirm proves that this agent still holds the registry, for a change
// applied with [X-Agentd] ConfirmSec= (reconcile.Confirmer). All three
// steps must succeed within ctx:
//
//  1. renew the lease: one keep-alive, answered with a TTL (the leader
//     required);
//  2. a linearizable read (clientv3's default: not WithSerializable, so
//     etcd's leader confirms it is current) of the membership key, which
//     must still carry that lease;
//  3. a write of the host's status: the pass record put again, with the
//     statuses waiting to be published, in the transaction guarded by the
//     lease that every report uses (Publish).
//
// It holds the Session's lock only for step 3. An error says which step
// failed.
func (s *Session) Confirm(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrSessionClosed
	}
	if !s.alive() {
		s.mu.Unlock()
		return fmt.Errorf("confirm: renew the lease: %w", errLeaseLost)
	}
	lease := s.sess.Lease()
	s.mu.Unlock()

	c, key := s.c, s.c.agentKey(s.member.Host)
	if _, err := c.cli.KeepAliveOnce(clientv3.WithRequireLeader(ctx), lease); err != nil {
		return fmt.Errorf("confirm: renew the lease: %w", err)
	}
	resp, err := c.cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("confirm: read %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 || clientv3.LeaseID(resp.Kvs[0].Lease) != lease {
		return fmt.Errorf("confirm: read %s: %w", key, errLeaseLost)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return ErrSessionClosed
	case !s.alive() || s.sess.Lease() != lease:
		return fmt.Errorf("confirm: write the status: %w", errLeaseLost)
	case s.wantPass.Acted == 0:
		return fmt.Errorf("confirm: write the status: %w", errNothingPublished)
	}
	s.pubPass = pubPass{} // put again: the write that shows the agent can report
	if err := s.syncLocked(ctx); err != nil {
		return fmt.Errorf("confirm: write the status: %w", err)
	}
	return nil
}
