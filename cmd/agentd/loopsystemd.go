package main

import (
	"context"
	"errors"

	"github.com/agentd/agentd/metrics"
	"github.com/agentd/agentd/reconcile"
)

// loopSystemd is the reconcile loop's view of systemd. It keeps
// agentd_systemd_connected current from the state reads every pass makes.
// Jobs need no watchdog allowance: they run outside the loop.
type loopSystemd struct {
	reconcile.Systemd
	met *metrics.Metrics
}

// noteConnected records whether a read reached systemd; a read cut short by
// ctx says nothing either way.
func (l loopSystemd) noteConnected(ctx context.Context, err error) {
	if ctx.Err() == nil {
		l.met.SetSystemdConnected(err == nil)
	}
}

func (l loopSystemd) State(ctx context.Context, unit string) (reconcile.UnitState, error) {
	st, err := l.Systemd.State(ctx, unit)
	l.noteConnected(ctx, err)
	return st, err
}

// StateSkippingFileState passes the cheaper read through, where the systemd
// underneath has it (the wedge fault has not: it reads in full, and wedges).
func (l loopSystemd) StateSkippingFileState(ctx context.Context, unit string) (reconcile.UnitState, error) {
	s, ok := l.Systemd.(reconcile.FileStateSkipper)
	if !ok {
		return l.State(ctx, unit)
	}
	st, err := s.StateSkippingFileState(ctx, unit)
	l.noteConnected(ctx, err)
	return st, err
}

// Timeouts passes the timeouts-only read through, where the systemd
// underneath has it; otherwise they come from a full read.
func (l loopSystemd) Timeouts(ctx context.Context, unit string) (start, stop uint64, err error) {
	if t, ok := l.Systemd.(reconcile.TimeoutReader); ok {
		start, stop, err = t.Timeouts(ctx, unit)
		l.noteConnected(ctx, err)
		return start, stop, err
	}
	st, err := l.State(ctx, unit)
	return st.TimeoutStartUSec, st.TimeoutStopUSec, err
}

// Queue passes the two-step job through, where the systemd underneath has
// it; otherwise waiting runs the whole job.
func (l loopSystemd) Queue(ctx context.Context, job reconcile.Job, unit string) (func(context.Context) error, error) {
	if q, ok := l.Systemd.(reconcile.JobQueuer); ok {
		return q.Queue(ctx, job, unit)
	}
	return func(ctx context.Context) error { return reconcile.DoJob(ctx, l.Systemd, job, unit) }, nil
}

// ManagerID passes the service manager's instance name through, where the
// systemd underneath has it.
func (l loopSystemd) ManagerID(ctx context.Context) (string, error) {
	m, ok := l.Systemd.(reconcile.ManagerIdentifier)
	if !ok {
		return "", errors.New("manager id not supported")
	}
	return m.ManagerID(ctx)
}

// UnitsLoaded passes when systemd last loaded the unit files through,
// where the systemd underneath says.
func (l loopSystemd) UnitsLoaded(ctx context.Context) (uint64, error) {
	u, ok := l.Systemd.(reconcile.LoadTimer)
	if !ok {
		return 0, errors.New("units load time not supported")
	}
	return u.UnitsLoaded(ctx)
}

// Summaries passes the resync's one-call listing through, where the
// systemd underneath has it.
func (l loopSystemd) Summaries(ctx context.Context, units []string) (map[string]reconcile.UnitSummary, error) {
	s, ok := l.Systemd.(reconcile.Summarizer)
	if !ok {
		return nil, errors.New("unit summaries not supported")
	}
	sum, err := s.Summaries(ctx, units)
	l.noteConnected(ctx, err)
	return sum, err
}
