package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/agentd/agentd/reconcile"
)

// Test-only switches of `agentd run`: the hidden --test-* flags and an
// environment variable the tests set.

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
