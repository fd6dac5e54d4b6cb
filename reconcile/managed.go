package reconcile

// managedIndex is the loop's copy of the paths the manifest says the agent
// owns, indexed by unit. Only the loop changes the manifest, and it updates
// this copy with every change it makes (Claim, Set, Forget), so a pass looks
// up one unit's paths without cloning the whole manifest. Loop-owned.
type managedIndex struct {
	paths  map[string]string            // path -> hash (or InstanceMarker), as in the manifest
	byUnit map[string]map[string]string // unit -> its paths
}

func newManagedIndex(paths map[string]string) managedIndex {
	m := managedIndex{paths: map[string]string{}, byUnit: map[string]map[string]string{}}
	for p, h := range paths {
		m.set(p, h)
	}
	return m
}

func (m *managedIndex) set(path, hash string) {
	m.paths[path] = hash
	u := UnitOfPath(path)
	if m.byUnit[u] == nil {
		m.byUnit[u] = map[string]string{}
	}
	m.byUnit[u][path] = hash
}

func (m *managedIndex) forget(path string) {
	delete(m.paths, path)
	u := UnitOfPath(path)
	delete(m.byUnit[u], path)
	if len(m.byUnit[u]) == 0 {
		delete(m.byUnit, u)
	}
}
