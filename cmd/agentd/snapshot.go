package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/unitdir"
)

// snapshotFile, in the state directory, is the last registry snapshot the
// agent received: what it runs on when it starts while the registry is
// unreachable.
const snapshotFile = "registry-snapshot.json"

// savedSnapshot is snapshotFile's content. Host, Groups and Prefix say whose
// snapshot it is: a snapshot taken under another identity is never used.
type savedSnapshot struct {
	Version  int                `json:"version"`
	SavedAt  time.Time          `json:"savedAt"`
	Host     string             `json:"host"`
	Groups   []string           `json:"groups"`
	Prefix   string             `json:"prefix"`
	Snapshot reconcile.Snapshot `json:"snapshot"`
}

// lastKnownGood keeps the last registry snapshot in the state directory and
// falls back to it when the registry cannot be reached at start.
//
// Every snapshot from the registry is saved (atomically: temp file, fsync,
// rename) before the agent gets it, so the saved snapshot is never older
// than what the agent applied. If no snapshot came from the registry within
// --registry-timeout of the start, the saved one is handed to the agent
// (units keep running as last decided; nothing reverts to older content),
// and once the registry answers its snapshots take over.
type lastKnownGood struct {
	dir    *unitdir.Dir
	host   string
	prefix string
	groups []string
	log    *slog.Logger

	mu       sync.Mutex
	live     bool // a snapshot came from the registry
	savedRev int64
	saved    bool
}

func openLastKnownGood(stateDir, host, prefix string, groups []string, log *slog.Logger) (*lastKnownGood, error) {
	d, err := unitdir.OpenPrivate(stateDir) // the snapshot is 0600 in a 0700 directory
	if err != nil {
		return nil, err
	}
	return &lastKnownGood{dir: d, host: host, prefix: prefix, groups: sortedGroups(groups), log: log}, nil
}

func (l *lastKnownGood) Close() error { return l.dir.Close() }

func sortedGroups(groups []string) []string {
	g := slices.Clone(groups)
	slices.Sort(g)
	return slices.Compact(g)
}

// received saves a snapshot from the registry, then hands it to apply.
// A snapshot of the revision saved last is not written again.
func (l *lastKnownGood) received(s reconcile.Snapshot, apply func(reconcile.Snapshot)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.live = true
	if !l.saved || s.Revision != l.savedRev {
		if err := l.save(s); err != nil {
			l.log.Warn("cannot save the last-known-good registry snapshot; a start without the registry will touch nothing", "err", err)
		} else {
			l.saved, l.savedRev = true, s.Revision
		}
	}
	apply(s)
}

func (l *lastKnownGood) save(s reconcile.Snapshot) error {
	b, err := json.Marshal(savedSnapshot{
		Version: 1, SavedAt: time.Now().UTC(), Host: l.host, Groups: l.groups, Prefix: l.prefix, Snapshot: s,
	})
	if err != nil {
		return err
	}
	return l.dir.Write(snapshotFile, append(b, '\n'))
}

// load reads the saved snapshot: nil when there is none.
func (l *lastKnownGood) load() (*savedSnapshot, error) {
	b, exists, err := l.dir.Read(snapshotFile)
	if err != nil || !exists {
		return nil, err
	}
	return parseSnapshot(b, l.host, l.prefix, l.groups)
}

// parseSnapshot decodes a saved snapshot and checks it belongs to this
// host, prefix and set of groups.
func parseSnapshot(b []byte, host, prefix string, groups []string) (*savedSnapshot, error) {
	var s savedSnapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse %s: %w", snapshotFile, err)
	}
	if s.Version != 1 {
		return nil, fmt.Errorf("%s: unknown version %d", snapshotFile, s.Version)
	}
	if s.Host != host || s.Prefix != prefix || !slices.Equal(sortedGroups(s.Groups), sortedGroups(groups)) {
		return nil, fmt.Errorf("%s was saved for host %q, prefix %q, groups %v; this agent is host %q, prefix %q, groups %v",
			snapshotFile, s.Host, s.Prefix, s.Groups, host, prefix, sortedGroups(groups))
	}
	return &s, nil
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
