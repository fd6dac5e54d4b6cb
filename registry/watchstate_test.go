package registry

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/agentd/agentd/reconcile"
)

// The watcher keeps its entries in snapshot order as keys come and go:
// every snapshot equals the map's entries sorted, and a snapshot handed out
// is not changed by what follows.
func TestUnitStateKeepsSnapshotOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s := newUnitState()
	var held []Snapshot
	var want [][]reconcile.Entry
	for i := range 3000 {
		scope, group := reconcile.ScopeHost, ""
		if g := rng.IntN(3); g > 0 {
			scope, group = reconcile.ScopeGroup, fmt.Sprintf("g%d", g)
		}
		unit := fmt.Sprintf("u%02d.service", rng.IntN(40))
		key := fmt.Sprintf("%d/%s/%s", scope, group, unit)
		if rng.IntN(3) == 0 {
			s.delete(key)
		} else {
			s.setEntry(key, reconcile.Entry{Scope: scope, Group: group, Unit: unit, ModRevision: int64(i)})
		}
		sorted := slices.SortedFunc(maps.Values(s.entries), reconcile.CompareEntries)
		snap := s.snapshot(int64(i))
		if !reflect.DeepEqual(snap.Entries, sorted) && len(sorted) > 0 {
			t.Fatalf("step %d: snapshot %v, want %v", i, snap.Entries, sorted)
		}
		if i%100 == 0 {
			held, want = append(held, snap), append(want, slices.Clone(sorted))
		}
	}
	for i := range held {
		if !reflect.DeepEqual(held[i].Entries, want[i]) && len(want[i]) > 0 {
			t.Fatalf("snapshot %d changed after it was handed out", i)
		}
	}
}

// Report takes statuses in any order, a unit twice (the last stands).
func TestStatusesByUnit(t *testing.T) {
	in := []reconcile.Status{{Unit: "b.service", Hash: "1"}, {Unit: "a.service"}, {Unit: "b.service", Hash: "2"}}
	got := statusesByUnit(in)
	if len(got) != 2 || got[0].Unit != "a.service" || got[1].Unit != "b.service" || got[1].Hash != "2" {
		t.Fatalf("statusesByUnit(%v) = %v", in, got)
	}
	if in[0].Unit != "b.service" {
		t.Fatal("the caller's list was reordered")
	}
	sorted := got
	if again := statusesByUnit(sorted); &again[0] != &sorted[0] {
		t.Error("a sorted list should be kept as it is, not copied")
	}
}
