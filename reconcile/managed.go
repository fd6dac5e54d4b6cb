package reconcile

import (
	"iter"
	"slices"
)

// managedIndex is the loop's copy of the paths the manifest says the agent
// owns, indexed by unit. Only the loop changes the manifest, and it updates
// this copy with every change it makes (Claim, Set, Forget), so a pass looks
// up one unit's paths without cloning the whole manifest. Loop-owned.
type managedIndex struct {
	paths  map[string]Owned    // as in the manifest
	byUnit map[string][]string // unit -> its paths (most units: one)
}

func newManagedIndex(paths map[string]Owned) managedIndex {
	m := managedIndex{paths: map[string]Owned{}, byUnit: map[string][]string{}}
	for p, e := range paths {
		m.set(p, e)
	}
	return m
}

func (m *managedIndex) set(path string, e Owned) {
	if _, ok := m.paths[path]; !ok {
		u := UnitOfPath(path)
		m.byUnit[u] = append(m.byUnit[u], path)
	}
	m.paths[path] = e
}

func (m *managedIndex) forget(path string) {
	if _, ok := m.paths[path]; !ok {
		return
	}
	delete(m.paths, path)
	u := UnitOfPath(path)
	m.byUnit[u] = slices.DeleteFunc(m.byUnit[u], func(p string) bool { return p == path })
	if len(m.byUnit[u]) == 0 {
		delete(m.byUnit, u)
	}
}

// of yields the managed paths of unit with their entries.
func (m *managedIndex) of(unit string) iter.Seq2[string, Owned] {
	return func(yield func(string, Owned) bool) {
		for _, p := range m.byUnit[unit] {
			if !yield(p, m.paths[p]) {
				return
			}
		}
	}
}
