package unitdir

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// BenchmarkLastKnownGood: what saving the last-known-good snapshot costs
// per registry change of one key (it is saved before the agent gets the
// snapshot, so it is on the path of every change), with 100 … 5,000 keys:
// the journal as the agent does it, beside writing the whole snapshot each
// time (what every change cost before the journal, and what a compaction
// costs). Real files in a temp dir under $TMPDIR, fsync included.
//
//	go test ./unitdir -run '^$' -bench LastKnownGood -benchtime 1x -v
func BenchmarkLastKnownGood(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			for b.Loop() {
				benchLastKnownGood(b, n)
			}
		})
	}
}

func benchLastKnownGood(b *testing.B, n int) {
	const changes = 200
	l, err := OpenSnapshotStore(b.TempDir(), "h1", "/agentd", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	snap := reconcile.Snapshot{Revision: 1}
	for i := range n {
		snap.Entries = append(snap.Entries, reconcile.Entry{Unit: fmt.Sprintf("u%05d.service", i), ModRevision: 1,
			Value: fmt.Appendf(nil, "[Unit]\nDescription=unit %d\n[Service]\nExecStart=/usr/bin/sleep infinity\n[X-Agentd]\nHealthySec=0\n", i)})
	}
	snap.Entries = reconcile.SortedEntries(snap.Entries)
	change := func(i int) reconcile.Snapshot {
		snap.Revision++
		snap.Entries = slices.Clone(snap.Entries)
		e := &snap.Entries[i*7919%n]
		e.Value, e.ModRevision = fmt.Appendf(nil, "[Service]\nExecStart=/usr/bin/sleep %d\n", snap.Revision), snap.Revision
		return snap
	}
	if err := l.Save(snap); err != nil {
		b.Fatal(err)
	}
	var journal, whole time.Duration
	var wholeWrites int
	for i := range changes {
		s := change(i)
		t := time.Now()
		if err := l.Save(s); err != nil {
			b.Fatal(err)
		}
		journal += time.Since(t)
		if l.written.journal == 0 {
			wholeWrites++
		}
	}
	for i := range changes {
		s := change(i)
		t := time.Now()
		if err := l.saveWhole(s, s.Entries); err != nil {
			b.Fatal(err)
		}
		whole += time.Since(t)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / changes }
	b.ReportMetric(ms(journal), "journal-ms")
	b.ReportMetric(ms(whole), "whole-ms")
	b.Logf("%d keys, one changed per snapshot: journal %.3f ms per change (%d of %d changes wrote it whole), whole snapshot each time (baseline) %.3f ms",
		n, ms(journal), wholeWrites, changes, ms(whole))
}
