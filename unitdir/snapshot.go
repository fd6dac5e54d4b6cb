package unitdir

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// SnapshotFile, in the state directory, is the last registry snapshot the
// agent received: what it runs on when it starts while the registry is
// unreachable. SnapshotJournal holds the changes since: one JSON line per
// snapshot received after the one in SnapshotFile.
const (
	SnapshotFile    = "registry-snapshot.json"
	SnapshotJournal = "registry-snapshot.journal"
)

// SavedSnapshot is SnapshotFile's content. Host, Groups and Prefix say whose
// snapshot it is: a snapshot taken under another identity is never used.
type SavedSnapshot struct {
	Version  int                `json:"version"`
	SavedAt  time.Time          `json:"savedAt"`
	Host     string             `json:"host"`
	Groups   []string           `json:"groups"`
	Prefix   string             `json:"prefix"`
	Snapshot reconcile.Snapshot `json:"snapshot"`
}

// snapshotChange is one line of SnapshotJournal: the keys one snapshot
// changed, and its halts (few; kept whole). Base is the revision of the
// snapshot in SnapshotFile it follows: a line left from before the file
// was rewritten is not applied to the new one.
type snapshotChange struct {
	Base     int64             `json:"base"`
	Revision int64             `json:"revision"`
	SavedAt  time.Time         `json:"savedAt"`
	Put      []reconcile.Entry `json:"put,omitempty"`
	Deleted  []reconcile.Entry `json:"deleted,omitempty"` // keys only
	Halts    []reconcile.Halt  `json:"halts,omitempty"`
}

// SnapshotStore keeps the last registry snapshot in the state directory:
// the disk half of the agent's last-known-good fallback.
//
// The first snapshot saved after opening is written whole (atomically:
// temp file, fsync, rename); each one after it appends only the keys it
// changed to the journal (one line, fsync), so saving a change costs what
// changed, not what the host runs. Once the journal outgrows the whole
// snapshot, the next snapshot is written whole again and the journal
// removed. A line cut short by a crash is the last one and is ignored on
// Load. Not safe for concurrent use.
type SnapshotStore struct {
	dir    *Dir
	host   string
	prefix string
	groups []string

	// last is the saved snapshot's entries, sorted; nil when the next save
	// must write the snapshot whole (after a start or a failed append).
	last    []reconcile.Entry
	base    int64                       // the revision in SnapshotFile
	written struct{ base, journal int } // bytes
}

// OpenSnapshotStore opens the store in stateDir for this host, prefix and
// set of groups.
func OpenSnapshotStore(stateDir, host, prefix string, groups []string) (*SnapshotStore, error) {
	d, err := OpenPrivate(stateDir) // the snapshot is 0600 in a 0700 directory
	if err != nil {
		return nil, err
	}
	return &SnapshotStore{dir: d, host: host, prefix: prefix, groups: sortedGroups(groups)}, nil
}

// Close closes the state directory.
func (st *SnapshotStore) Close() error { return st.dir.Close() }

func sortedGroups(groups []string) []string {
	g := slices.Clone(groups)
	slices.Sort(g)
	return slices.Compact(g)
}

// Save appends what changed since the last save to the journal, or writes
// the snapshot whole.
func (st *SnapshotStore) Save(s reconcile.Snapshot) error {
	now := reconcile.SortedEntries(s.Entries)
	if st.last == nil || st.written.journal > st.written.base {
		return st.saveWhole(s, now)
	}
	c := snapshotChange{Base: st.base, Revision: s.Revision, SavedAt: time.Now().UTC(), Halts: s.Halts}
	reconcile.DiffEntries(st.last, now, func(e reconcile.Entry, gone bool) {
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
	if err := st.dir.Append(SnapshotJournal, append(b, '\n')); err != nil {
		st.last = nil // the journal may end in a torn line now: start afresh
		return err
	}
	st.last = now
	st.written.journal += len(b) + 1
	return nil
}

func (st *SnapshotStore) saveWhole(s reconcile.Snapshot, sorted []reconcile.Entry) error {
	s.Entries = sorted
	b, err := json.Marshal(SavedSnapshot{
		Version: 1, SavedAt: time.Now().UTC(), Host: st.host, Groups: st.groups, Prefix: st.prefix, Snapshot: s,
	})
	if err != nil {
		return err
	}
	st.last = nil
	if err := st.dir.Write(SnapshotFile, append(b, '\n')); err != nil {
		return err
	}
	// A journal left here (by a crash before this removal, or an earlier
	// agent) names another base and is not applied to this snapshot.
	if err := st.dir.Remove(SnapshotJournal); err != nil {
		return err
	}
	st.last, st.base = sorted, s.Revision
	st.written.base, st.written.journal = len(b)+1, 0
	return nil
}

// Load reads the saved snapshot: nil when there is none.
func (st *SnapshotStore) Load() (*SavedSnapshot, error) {
	return ReadSavedSnapshot(st.dir.Read, st.host, st.prefix, st.groups)
}

// ReadSavedSnapshot reads SnapshotFile and the journal after it through read
// (a Dir's Read, or the doctor's read-only look at the state directory) and
// checks the snapshot belongs to this host, prefix and set of groups: nil
// when there is none.
func ReadSavedSnapshot(read func(name string) ([]byte, bool, error), host, prefix string, groups []string) (*SavedSnapshot, error) {
	b, exists, err := read(SnapshotFile)
	if err != nil || !exists {
		return nil, err
	}
	s, err := parseSnapshot(b, host, prefix, groups)
	if err != nil {
		return nil, err
	}
	j, exists, err := read(SnapshotJournal)
	if err != nil || !exists {
		return s, err
	}
	return s, replayJournal(s, j)
}

// replayJournal applies the journal's lines for s's revision to s. The
// last line may be torn (a crash while it was written, before the agent
// used that snapshot); any other line that does not parse makes the saved
// snapshot unusable.
func replayJournal(s *SavedSnapshot, j []byte) error {
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
			return fmt.Errorf("parse %s line %d: %w", SnapshotJournal, i+1, err)
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
func parseSnapshot(b []byte, host, prefix string, groups []string) (*SavedSnapshot, error) {
	var s SavedSnapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("parse %s: %w", SnapshotFile, err)
	}
	if s.Version != 1 {
		return nil, fmt.Errorf("%s: unknown version %d", SnapshotFile, s.Version)
	}
	if s.Host != host || s.Prefix != prefix || !slices.Equal(sortedGroups(s.Groups), sortedGroups(groups)) {
		return nil, fmt.Errorf("%s was saved for host %q, prefix %q, groups %v; this agent is host %q, prefix %q, groups %v",
			SnapshotFile, s.Host, s.Prefix, s.Groups, host, prefix, sortedGroups(groups))
	}
	return &s, nil
}
