package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/agentd/agentd/metrics"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// The agent's reporter, facts publisher and coordinator are the current
// registry session, which followRegistry sets once the agent has joined
// and clears when it leaves; before that, reports succeed locally and the
// rest answer errNotJoined.

// reportWait bounds a status report: each etcd round trip has
// a request timeout of its own, and a report waits for the session's
// lease recovery, which is bounded the same way.
const reportWait = time.Minute

// sessionReporter lets the agent report before the registry session exists
// (or while it is being re-established), e.g. while it runs on the
// last-known-good snapshot: there is nothing to publish to, so the report
// succeeds locally (statuses are served on the debug socket) and
// followRegistry asks for a pass, which publishes, once it has joined.
type sessionReporter struct {
	svc *service
	met *metrics.Metrics

	mu sync.Mutex
	s  *registry.Session
}

func (r *sessionReporter) set(s *registry.Session) {
	r.mu.Lock()
	r.s = s
	r.mu.Unlock()
}

func (r *sessionReporter) current() *registry.Session {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.s
}

func (r *sessionReporter) Report(ctx context.Context, acted int64, st []reconcile.Status) error {
	s := r.current()
	if s == nil {
		return nil
	}
	defer r.svc.boundedWait(reportWait)()
	err := s.Publish(ctx, acted, st)
	if ctx.Err() == nil {
		r.met.SetEtcdConnected(err == nil)
	}
	return err
}

// errNotJoined is what the coordinator answers before the agent has joined
// the registry (or while it runs on its saved snapshot): reconcile retries.
var errNotJoined = errors.New("not joined to the registry yet")

// sessionCoordinator is reconcile.Coordinator (MaxUnavailable= slots and
// rollout halts) on the current registry session. Holding and Halt run on
// the loop: each is an etcd round trip bounded by the registry's request
// timeout, so the watchdog counts them as bounded waits. Acquire blocks
// until a slot is free, on a goroutine the agent owns, never on the loop.
type sessionCoordinator struct {
	r *sessionReporter
}

// Acquire also keeps agentd_slots_waiting and agentd_slots_held: waiting
// while it runs, held from its success until the release (the agent
// releases every slot it drops, a lost one too).
func (c sessionCoordinator) Acquire(ctx context.Context, scope string, bucket reconcile.Bucket, unit, hash string, limit int) (func(context.Context) error, error) {
	s := c.r.current()
	if s == nil {
		return nil, errNotJoined
	}
	met, group := c.r.met, strings.TrimPrefix(scope, "groups/")
	met.SlotWaiting(group, 1)
	release, err := s.Acquire(ctx, scope, bucket, unit, hash, limit)
	met.SlotWaiting(group, -1)
	if err != nil {
		return nil, err
	}
	met.SlotHeld(group, 1)
	var once sync.Once
	return func(ctx context.Context) error {
		once.Do(func() { met.SlotHeld(group, -1) })
		return release(ctx)
	}, nil
}

func (c sessionCoordinator) Holding(ctx context.Context, scope string, bucket reconcile.Bucket, unit string) (bool, error) {
	s := c.r.current()
	if s == nil {
		return false, errNotJoined
	}
	defer c.r.svc.boundedWait(reportWait)()
	return s.Holding(ctx, scope, bucket, unit)
}

func (c sessionCoordinator) Halt(ctx context.Context, h reconcile.Halt) error {
	s := c.r.current()
	if s == nil {
		return errNotJoined
	}
	defer c.r.svc.boundedWait(reportWait)()
	return s.Halt(ctx, h)
}

// sessionFacts is reconcile.FactsPublisher on the current registry
// session: before the agent has joined there is nothing to publish to, and
// the agent tries again (it costs no round trip).
type sessionFacts struct {
	r *sessionReporter
}

func (f sessionFacts) PublishFacts(ctx context.Context, facts reconcile.Facts) (<-chan struct{}, error) {
	s := f.r.current()
	if s == nil {
		return nil, errNotJoined
	}
	return s.PublishFacts(ctx, facts)
}

// sessionSlots is the FleetLock server's registry (fleetlock.Slots): the
// registry client of the current session. Before the agent has joined,
// requests fail (the server answers 503, the client asks again).
type sessionSlots struct {
	r *sessionReporter
}

func (f sessionSlots) LockReboot(ctx context.Context, group, id string, labels map[string]string, ttl time.Duration) error {
	s := f.r.current()
	if s == nil {
		return errNotJoined
	}
	return s.Client().LockReboot(ctx, group, id, labels, ttl)
}

func (f sessionSlots) UnlockReboot(ctx context.Context, group, id string) (int, error) {
	s := f.r.current()
	if s == nil {
		return 0, errNotJoined
	}
	return s.Client().UnlockReboot(ctx, group, id)
}

// sessionConfirmer is reconcile.Confirmer on the current registry session
// (registry.Session.Confirm: renew the lease, a linearizable read, a
// status write). Before the agent has joined, or while it has left, the
// control plane is not reached: the try fails, and the agent tries again
// until the change's ConfirmSec= runs out.
type sessionConfirmer struct {
	r *sessionReporter
}

func (c sessionConfirmer) Confirm(ctx context.Context) error {
	s := c.r.current()
	if s == nil {
		return errNotJoined
	}
	return s.Confirm(ctx)
}
