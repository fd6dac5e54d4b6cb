package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/unitdir"
)

// The last-known-good snapshot as a base file plus a journal of changes:
// what a later start loads is the last snapshot received, whatever mix of
// whole writes, appended changes, torn lines and compactions led to it.
func TestLastKnownGoodJournal(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	dir := t.TempDir()
	open := func() *lastKnownGood {
		l, err := openLastKnownGood(dir, "h1", "/agentd", []string{"web"}, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	loaded := func() reconcile.Snapshot {
		t.Helper()
		s, err := open().load()
		if err != nil || s == nil {
			t.Fatalf("load: %v, %v", s, err)
		}
		return s.Snapshot
	}
	same := func(what string, got, want reconcile.Snapshot) {
		t.Helper()
		want.Entries = reconcile.SortedEntries(want.Entries)
		if got.Revision != want.Revision || len(got.Entries) != len(want.Entries) || !reflect.DeepEqual(got.Halts, want.Halts) {
			t.Fatalf("%s: loaded revision %d, %d entries, halts %v; want %d, %d, %v", what, got.Revision, len(got.Entries), got.Halts, want.Revision, len(want.Entries), want.Halts)
		}
		for i := range got.Entries {
			g, w := got.Entries[i], want.Entries[i]
			if reconcile.CompareEntries(g, w) != 0 || !bytes.Equal(g.Value, w.Value) || g.ModRevision != w.ModRevision {
				t.Fatalf("%s: entry %d is %+v, want %+v", what, i, g, w)
			}
		}
	}
	file := func(name string) []byte {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return b
	}
	entry := func(scope reconcile.Scope, group, unit, value string, rev int64) reconcile.Entry {
		return reconcile.Entry{Scope: scope, Group: group, Unit: unit, Value: []byte(value), ModRevision: rev}
	}
	snap := reconcile.Snapshot{Revision: 10, Entries: []reconcile.Entry{
		entry(reconcile.ScopeHost, "", "a.service", "[Service]\nExecStart=/bin/a\n", 3),
		entry(reconcile.ScopeHost, "", "b.service", "[Service]\nExecStart=/bin/b\n", 4),
		entry(reconcile.ScopeGroup, "web", "c.service", "[Service]\nExecStart=/bin/c\n", 5),
	}}
	var applied []int64
	apply := func(s reconcile.Snapshot) { applied = append(applied, s.Revision) }

	l := open()
	l.received(snap, apply)
	base := file(unitdir.SnapshotFile)
	if file(unitdir.SnapshotJournal) != nil {
		t.Fatal("the first snapshot after a start should be written whole, with no journal")
	}
	same("whole", loaded(), snap)

	// A change of one key, a deletion, a new key and a halt: appended, the
	// whole snapshot not written again.
	next := func(rev int64, edit func(es []reconcile.Entry) []reconcile.Entry) {
		snap.Revision = rev
		snap.Entries = edit(slices.Clone(snap.Entries))
		l.received(snap, apply)
	}
	next(11, func(es []reconcile.Entry) []reconcile.Entry {
		es[0] = entry(reconcile.ScopeHost, "", "a.service", "[Service]\nExecStart=/bin/a2\n", 11)
		return append(es[:1], es[2], entry(reconcile.ScopeHost, "", "d.service", "[Service]\nExecStart=/bin/d\n", 11))
	})
	snap.Halts = []reconcile.Halt{{Scope: "groups/web", Unit: "c.service", Hash: "abc", Host: "h2", Reason: "failed", At: time.Unix(100, 0).UTC()}}
	next(12, func(es []reconcile.Entry) []reconcile.Entry { return es })
	if !bytes.Equal(file(unitdir.SnapshotFile), base) {
		t.Fatal("a change rewrote the whole snapshot")
	}
	if lines := bytes.Count(file(unitdir.SnapshotJournal), []byte("\n")); lines != 2 {
		t.Fatalf("journal has %d lines, want 2", lines)
	}
	if j := string(file(unitdir.SnapshotJournal)); bytes.Contains([]byte(j), []byte("/bin/c")) {
		t.Fatalf("the journal holds an unchanged key: %s", j)
	}
	same("base and journal", loaded(), snap)

	// A line cut short by a crash is the last one, and ignored.
	good := file(unitdir.SnapshotJournal)
	torn := append(slices.Clone(good), good[:len(good)/3]...)
	if err := os.WriteFile(filepath.Join(dir, unitdir.SnapshotJournal), torn, 0o600); err != nil {
		t.Fatal(err)
	}
	same("torn last line", loaded(), snap)
	// Any other line that does not parse makes the snapshot unusable.
	bad := append([]byte("not json\n"), good...)
	if err := os.WriteFile(filepath.Join(dir, unitdir.SnapshotJournal), bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := open().load(); err == nil {
		t.Fatal("a bad line inside the journal should make the saved snapshot unusable")
	}
	if err := os.WriteFile(filepath.Join(dir, unitdir.SnapshotJournal), good, 0o600); err != nil {
		t.Fatal(err)
	}

	// Changes until the journal outgrows the whole snapshot: written whole
	// again, the journal started afresh.
	for rev := int64(13); bytes.Equal(file(unitdir.SnapshotFile), base); rev++ {
		if rev > 100 {
			t.Fatal("the journal was never folded into the snapshot")
		}
		next(rev, func(es []reconcile.Entry) []reconcile.Entry {
			es[1] = entry(es[1].Scope, es[1].Group, es[1].Unit, fmt.Sprintf("[Service]\nExecStart=/bin/v%d\n", rev), rev)
			return es
		})
	}
	if j := file(unitdir.SnapshotJournal); j != nil {
		t.Fatalf("journal left after the whole write: %q", j)
	}
	next(snap.Revision+1, func(es []reconcile.Entry) []reconcile.Entry { return es[1:] })
	same("after compaction", loaded(), snap)

	// A new start writes its first snapshot whole; the journal of the
	// base before is not applied to it (here: left by a crash before its
	// removal).
	old := file(unitdir.SnapshotJournal)
	l = open()
	next(snap.Revision+1, func(es []reconcile.Entry) []reconcile.Entry { return es })
	if err := os.WriteFile(filepath.Join(dir, unitdir.SnapshotJournal), old, 0o600); err != nil {
		t.Fatal(err)
	}
	same("stale journal", loaded(), snap)
	if fi, err := os.Stat(filepath.Join(dir, unitdir.SnapshotJournal)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("journal: %v (want mode 0600: it may hold secrets)", err)
	}
	if want := len(applied); want < 5 || applied[want-1] != snap.Revision {
		t.Fatalf("applied %v", applied)
	}
}

// An agent that died while a change awaited its confirmation runs on its
// saved snapshot soon: that change may be what cut it off.
func TestFallbackAfterAConfirmingChange(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	confirming := map[string]reconcile.UnitRecord{"a.service": {}, "b.service": {Confirming: "k"}}
	for _, tc := range []struct {
		timeout time.Duration
		recs    map[string]reconcile.UnitRecord
		want    time.Duration
	}{
		{30 * time.Second, nil, 30 * time.Second},
		{30 * time.Second, map[string]reconcile.UnitRecord{"a.service": {}}, 30 * time.Second},
		{30 * time.Second, confirming, confirmingFallback},
		{time.Second, confirming, time.Second},
		{0, confirming, 0}, // off stays off
	} {
		if got := fallbackAfter(tc.timeout, tc.recs, reconcile.Intent{}, log); got != tc.want {
			t.Errorf("fallbackAfter(%v, %v) = %v, want %v", tc.timeout, tc.recs, got, tc.want)
		}
	}
	// Killed while the job of such a change ran: only the intent knows.
	in := reconcile.Intent{Jobs: map[string]string{"a.service": "k"}, Confirm: map[string]string{"a.service": "k"}}
	if got := fallbackAfter(30*time.Second, nil, in, log); got != confirmingFallback {
		t.Errorf("with a confirming job owed: %v, want %v", got, confirmingFallback)
	}
}
