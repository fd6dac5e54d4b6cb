package main

import (
	"context"
	"errors"
	"time"

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

// Reload times the daemon-reload for agentd_daemon_reload_duration_seconds
// and counts its result (a failed one is run again by the next pass).
func (l loopSystemd) Reload(ctx context.Context) error {
	began := time.Now()
	err := l.Systemd.Reload(ctx)
	if ctx.Err() == nil {
		l.met.DaemonReload(time.Since(began), err)
	}
	return err
}
