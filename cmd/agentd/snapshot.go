package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/unitdir"
)

// lastKnownGood keeps the last registry snapshot in the state directory
// (unitdir.SnapshotStore: a whole file plus a journal of changes) and falls
// back to it when the registry cannot be reached at start.
//
// Every snapshot from the registry is saved before the agent gets it, so
// the saved snapshot is never older than what the agent applied.
//
// If no snapshot came from the registry within --registry-timeout of the
// start, the saved one is handed to the agent (units keep running as last
// decided; nothing reverts to older content), and once the registry
// answers its snapshots take over.
type lastKnownGood struct {
	log *slog.Logger

	mu       sync.Mutex
	store    *unitdir.SnapshotStore
	live     bool // a snapshot came from the registry
	savedRev int64
	saved    bool
}

func openLastKnownGood(stateDir, host, prefix string, groups []string, log *slog.Logger) (*lastKnownGood, error) {
	st, err := unitdir.OpenSnapshotStore(stateDir, host, prefix, groups)
	if err != nil {
		return nil, err
	}
	return &lastKnownGood{store: st, log: log}, nil
}

func (l *lastKnownGood) Close() error { return l.store.Close() }

// received saves a snapshot from the registry, then hands it to apply.
// A snapshot of the revision saved last is not written again.
func (l *lastKnownGood) received(s reconcile.Snapshot, apply func(reconcile.Snapshot)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.live = true
	if !l.saved || s.Revision != l.savedRev {
		if err := l.store.Save(s); err != nil {
			l.log.Warn("cannot save the last-known-good registry snapshot; a start without the registry will touch nothing", "err", err)
		} else {
			l.saved, l.savedRev = true, s.Revision
		}
	}
	apply(s)
}

// load reads the saved snapshot: nil when there is none.
func (l *lastKnownGood) load() (*unitdir.SavedSnapshot, error) { return l.store.Load() }

// confirmingFallback is how long an agent that died while a change awaited
// its confirmation (ConfirmSec=) waits for the registry before it runs on
// its saved snapshot: that change may be what cut the host off, and only a
// pass can put it back. A registry that answers does so well within it.
const confirmingFallback = 2 * time.Second

// fallbackAfter is how long to wait for the registry before running on the
// saved snapshot: timeout, or confirmingFallback when a unit's record says
// a change of it was awaiting its confirmation, or the intent says a job
// of such a change was under way (and timeout is not off).
func fallbackAfter(timeout time.Duration, recs map[string]reconcile.UnitRecord, in reconcile.Intent, log *slog.Logger) time.Duration {
	if timeout <= 0 || timeout <= confirmingFallback {
		return timeout
	}
	units := slices.Collect(maps.Keys(in.Confirm))
	for u, rec := range recs {
		if rec.Confirming != "" {
			units = append(units, u)
		}
	}
	if len(units) == 0 {
		return timeout
	}
	slices.Sort(units)
	log.Warn("a change was awaiting its confirmation when the agent stopped: running on the saved snapshot if the registry does not answer within "+confirmingFallback.String(),
		"units", strings.Join(slices.Compact(units), ","), "registry_timeout", timeout)
	return confirmingFallback
}

// fallback waits up to timeout for a snapshot from the registry. If none
// came, it hands the saved one to apply and tells svc, or, with none saved,
// declares the service ready with the agent touching nothing. timeout <= 0
// disables the fallback: the agent waits for the registry however long.
func (l *lastKnownGood) fallback(ctx context.Context, timeout time.Duration, apply func(reconcile.Snapshot), svc *service) {
	if timeout <= 0 {
		return
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.live {
		return
	}
	s, err := l.load()
	switch {
	case err != nil:
		l.log.Error("registry unreachable and the saved snapshot is unusable", "err", err, "timeout", timeout)
		svc.readyWithout(fmt.Sprintf("registry unreachable for %s and the saved snapshot is unusable: touching nothing until it answers", timeout))
	case s == nil:
		svc.readyWithout(fmt.Sprintf("registry unreachable for %s and no saved snapshot: touching nothing until it answers", timeout))
	default:
		desc := describeSaved(s.Snapshot.Revision, s.SavedAt)
		l.log.Warn("registry unreachable; running on the last-known-good snapshot until it answers",
			"timeout", timeout, "revision", s.Snapshot.Revision, "saved_at", s.SavedAt, "entries", len(s.Snapshot.Entries))
		svc.setOffline(desc)
		apply(s.Snapshot)
	}
}
