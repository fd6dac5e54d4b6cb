package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/unitdir"
)

// snapshotFile, in the state directory, is the last registry snapshot the
// agent received: what it runs on when it starts while the registry is
// unreachable. snapshotJournal holds the changes since: one JSON line per
// snapshot received after the one in snapshotFile.
const (
	snapshotFile    = "registry-snapshot.json"
	snapshotJournal = "registry-snapshot.journal"
)

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

// snapshotChange is one line of snapshotJournal: the keys one snapshot
// changed, and its halts (few; kept whole). Base is the revision of the
// snapshot in snapshotFile it follows: a line left from before the file
// was rewritten is not applied to the new one.
type snapshotChange struct {
	Base     int64             `json:"base"`
	Revision int64             `json:"revision"`
	SavedAt  time.Time         `json:"savedAt"`
	Put      []reconcile.Entry `json:"put,omitempty"`
	Deleted  []reconcile.Entry `json:"deleted,omitempty"` // keys only
	Halts    []reconcile.Halt  `json:"halts,omitempty"`
}

// lastKnownGood keeps the last registry snapshot in the state directory and
// falls back to it when the registry cannot be reached at start.
//
// Every snapshot from the registry is saved before the agent gets it, so
// the saved snapshot is never older than what the agent applied. The first
// one after a start is written whole (atomically: temp file, fsync,
// rename); each one after it appends only the keys it changed to the
// journal (one line, fsync), so saving a change costs what changed, not
// what the host runs. Once the journal outgrows the whole snapshot, the
// next snapshot is written whole again and the journal removed. A line cut
// short by a crash is the last one and was never applied: it is ignored.
//
// If no snapshot came from the registry within --registry-timeout of the
// start, the saved one is handed to the agent (units keep running as last
// decided; nothing reverts to older content), and once the registry
// answers its snapshots take over.
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
	// last is the saved snapshot's entries, sorted; nil when the next save
	// must write the snapshot whole (after a start or a failed append).
	last    []reconcile.Entry
	base    int64                       // the revision in snapshotFile
	written struct{ base, journal int } // bytes
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

// save appends what changed since the last save to the journal, or writes
// the snapshot whole.
func (l *lastKnownGood) save(s reconcile.Snapshot) error {
	now := reconcile.SortedEntries(s.Entries)
	if l.last == nil || l.written.journal > l.written.base {
		return l.saveWhole(s, now)
	}
	c := snapshotChange{Base: l.base, Revision: s.Revision, SavedAt: time.Now().UTC(), Halts: s.Halts}
	reconcile.DiffEntries(l.last, now, func(e reconcile.Entry, gone bool) {
		if gone {
			c.Deleted = append(c.Deleted, reconcile.Entry{Scope: e.Scope, Group: e.Group, Unit: e.Unit})
		} else {
			c.Put = append(c.Put, e)
		}
	})
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if err := l.dir.Append(snapshotJournal, append(b, '\n')); err != nil {
		l.last = nil // the journal may end in a torn line now: start afresh
		return err
	}
	l.last = now
	l.written.journal += len(b) + 1
	return nil
}

func (l *lastKnownGood) saveWhole(s reconcile.Snapshot, sorted []reconcile.Entry) error {
	s.Entries = sorted
	b, err := json.Marshal(savedSnapshot{
		Version: 1, SavedAt: time.Now().UTC(), Host: l.host, Groups: l.groups, Prefix: l.prefix, Snapshot: s,
	})
	if err != nil {
		return err
	}
	l.last = nil
	if err := l.dir.Write(snapshotFile, append(b, '\n')); err != nil {
		return err
	}
	// A journal left here (by a crash before this removal, or an earlier
	// agent) names another base and is not applied to this snapshot.
	if err := l.dir.Remove(snapshotJournal); err != nil {
		return err
	}
	l.last, l.base = sorted, s.Revision
	l.written.base, l.written.journal = len(b)+1, 0
	return nil
}

// load reads the saved snapshot: nil when there is none.
func (l *lastKnownGood) load() (*savedSnapshot, error) {
	return readSaved(l.dir.Read, l.host, l.prefix, l.groups)
}

// readSaved reads snapshotFile and the journal after it through read and
// checks the snapshot belongs to this host, prefix and set of groups.
func readSaved(read func(name string) ([]byte, bool, error), host, prefix string, groups []string) (*savedSnapshot, error) {
	b, exists, err := read(snapshotFile)
	if err != nil || !exists {
		return nil, err
	}
	s, err := parseSnapshot(b, host, prefix, groups)
	if err != nil {
		return nil, err
	}
	j, exists, err := read(snapshotJournal)
	if err != nil || !exists {
		return s, err
	}
	return s, replayJournal(s, j)
}

// replayJournal applies the journal's lines for s's revision to s. The
// last line may be torn (a crash while it was written, before the agent
// used that snapshot); any other line that does not parse makes the saved
// snapshot unusable.
func replayJournal(s *savedSnapshot, j []byte) error {
	type key struct {
		scope       reconcile.Scope
		group, unit string
	}
	keyOf := func(e reconcile.Entry) key { return key{e.Scope, e.Group, e.Unit} }
	var entries map[key]reconcile.Entry
	base := s.Snapshot.Revision
	lines := bytes.Split(j, []byte("\n"))
	for i, line := range lines {
		if len(line) == 0 {
			continue
		}
		var c snapshotChange
		if err := json.Unmarshal(line, &c); err != nil {
			if i == len(lines)-1 {
				break // torn: the file does not end in a newline
			}
			return fmt.Errorf("parse %s line %d: %w", snapshotJournal, i+1, err)
		}
		if c.Base != base || c.Revision <= s.Snapshot.Revision {
			continue
		}
		if entries == nil {
			entries = map[key]reconcile.Entry{}
			for _, e := range s.Snapshot.Entries {
				entries[keyOf(e)] = e
			}
		}
		for _, e := range c.Deleted {
			delete(entries, keyOf(e))
		}
		for _, e := range c.Put {
			entries[keyOf(e)] = e
		}
		s.SavedAt, s.Snapshot.Revision, s.Snapshot.Halts = c.SavedAt, c.Revision, c.Halts
	}
	if entries != nil {
		s.Snapshot.Entries = slices.SortedFunc(maps.Values(entries), reconcile.CompareEntries)
	}
	return nil
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
