package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentd/agentd/metrics"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// reportWait bounds a status report: each etcd round trip has
// a request timeout of its own, and a report waits for the session's
// lease recovery, which is bounded the same way.
const reportWait = time.Minute

// loopSystemd is the reconcile loop's view of systemd. It keeps
// agentd_systemd_connected current from the state reads every pass makes.
// Jobs need no watchdog allowance: they run outside the loop.
type loopSystemd struct {
	reconcile.Systemd
	met *metrics.Metrics
}

// noteConnected records whether a read reached systemd; a read cut short by
// ctx, or one the systemd underneath does not do (the wedge fault's
// listing), says nothing either way.
func (l loopSystemd) noteConnected(ctx context.Context, err error) {
	if ctx.Err() == nil && !errors.Is(err, errors.ErrUnsupported) {
		l.met.SetSystemdConnected(err == nil)
	}
}

func (l loopSystemd) State(ctx context.Context, unit string) (reconcile.UnitState, error) {
	st, err := l.Systemd.State(ctx, unit)
	l.noteConnected(ctx, err)
	return st, err
}

func (l loopSystemd) StateSkippingFileState(ctx context.Context, unit string) (reconcile.UnitState, error) {
	st, err := l.Systemd.StateSkippingFileState(ctx, unit)
	l.noteConnected(ctx, err)
	return st, err
}

func (l loopSystemd) Timeouts(ctx context.Context, unit string) (start, stop uint64, err error) {
	start, stop, err = l.Systemd.Timeouts(ctx, unit)
	l.noteConnected(ctx, err)
	return start, stop, err
}

func (l loopSystemd) Summaries(ctx context.Context, units []string) (map[string]reconcile.UnitSummary, error) {
	sum, err := l.Systemd.Summaries(ctx, units)
	l.noteConnected(ctx, err)
	return sum, err
}

// checkFocusEnv, set to 1, makes the agent check every focused pass against
// a plan of every unit (reconcile.Config.CheckFocus). The tests set it.
const checkFocusEnv = "AGENTD_TEST_CHECK_FOCUS"

// pauseAt is a test-only fault, switched on by the hidden flag
// --test-pause-at: when a pass reaches that point it writes
// <stateDir>/paused-at-<point> and blocks until the agent shuts down, so a
// crash test can SIGKILL the agent exactly there.
func pauseAt(point, stateDir string, log *slog.Logger) func(ctx context.Context, at string) {
	if point == "" {
		return nil
	}
	return func(ctx context.Context, at string) {
		if at != point {
			return
		}
		log.Warn("test fault: pausing the pass", "at", at)
		if err := os.WriteFile(filepath.Join(stateDir, "paused-at-"+at), nil, 0o600); err != nil {
			log.Error("test fault", "err", err)
		}
		<-ctx.Done()
	}
}

// wedgeSystemd is a test-only fault, switched on by the hidden flag
// --test-wedge-file: while that file exists, State blocks until the agent
// shuts down, as a loop stuck in a call that never returns would. It proves
// that the watchdog restarts a wedged agent. reconcile knows nothing of it.
// It is used through reconcile.PlainSystemd, so every read is a State.
type wedgeSystemd struct {
	reconcile.BasicSystemd
	file string
	log  *slog.Logger
}

func (w wedgeSystemd) State(ctx context.Context, unit string) (reconcile.UnitState, error) {
	if _, err := os.Stat(w.file); err == nil {
		w.log.Warn("test fault: wedging the reconcile loop", "file", w.file, "unit", unit)
		<-ctx.Done()
		return reconcile.UnitState{}, ctx.Err()
	}
	return w.BasicSystemd.State(ctx, unit)
}

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

func (c sessionCoordinator) Acquire(ctx context.Context, scope, unit, hash string, limit int) (func(context.Context) error, error) {
	s := c.r.current()
	if s == nil {
		return nil, errNotJoined
	}
	return s.Acquire(ctx, scope, unit, hash, limit)
}

func (c sessionCoordinator) Holding(ctx context.Context, scope, unit string) (bool, error) {
	s := c.r.current()
	if s == nil {
		return false, errNotJoined
	}
	defer c.r.svc.boundedWait(reportWait)()
	return s.Holding(ctx, scope, unit)
}

func (c sessionCoordinator) Halt(ctx context.Context, h reconcile.Halt) error {
	s := c.r.current()
	if s == nil {
		return errNotJoined
	}
	defer c.r.svc.boundedWait(reportWait)()
	return s.Halt(ctx, h)
}
