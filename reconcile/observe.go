package reconcile

import (
	"context"
	"fmt"
	"maps"
)

// observe reads desired state (the last snapshot) and current state (disk,
// manifest, D-Bus), plus what the loop remembers, into one Current. Disk and
// D-Bus are read only where something changed since the last look (cache.go).
func (a *Agent) observe(ctx context.Context) (map[string]*DesiredUnit, Current, error) {
	a.takeDirty()
	a.hand.mu.Lock()
	snap := a.hand.snap
	a.hand.mu.Unlock()
	if snap == nil {
		return nil, Current{}, ErrNoRegistry
	}
	if snap != a.desired.snap {
		a.desired.units = a.desired.cache.desire(*snap)
		a.desired.snap = snap
		// Something new may be wanted of a unit whose job is in flight (a
		// removal stops a hung start): plan it from what it is now.
		a.hand.mu.Lock()
		for u, n := range a.hand.muted {
			if n > 0 {
				delete(a.cache.states, u)
			}
		}
		a.hand.mu.Unlock()
	}
	desired := a.desired.units
	cur := Current{
		Files:   map[string]LocalFile{},
		Managed: a.cfg.Manifest.Managed(),
		Units:   map[string]UnitState{},
		Blobs:   map[string][]byte{},
		Halts:   map[string]Halt{},
	}
	for _, h := range snap.Halts {
		cur.Halts[h.Unit] = h
	}
	paths := map[string]bool{}
	units := map[string]bool{}
	for name, u := range desired {
		units[name] = true
		for _, f := range u.Files() {
			paths[f.Path] = true
		}
	}
	for p, h := range cur.Managed {
		units[UnitOfPath(p)] = true
		if h != InstanceMarker {
			paths[p] = true
		}
	}
	for u := range a.mem.records {
		units[u] = true
	}
	for u := range a.jobs.inflight {
		units[u] = true
	}
	for p := range paths {
		lf := a.file(p)
		cur.Files[p] = lf
		a.noteDrift(p, cur.Managed[p], lf)
	}
	for p := range a.cache.files {
		if !paths[p] {
			delete(a.cache.files, p) // no longer watched for: would go stale
		}
	}
	for u := range a.cache.states {
		if !units[u] {
			delete(a.cache.states, u) // signals are not forwarded for it any more
		}
	}
	for u := range a.cache.fileStates {
		if !units[u] {
			delete(a.cache.fileStates, u)
		}
	}
	if err := a.prefetch(ctx, units); err != nil {
		return nil, Current{}, err
	}
	rel := map[string]bool{}
	for u := range units {
		rel[u] = true
		if ValidateUnitName(u) != nil {
			continue // not a name systemd knows: do not ask
		}
		// A unit whose registry value is rejected is still observed: its
		// running version may be inside HealthySec, judged as usual.
		st, err := a.state(ctx, u)
		if err != nil {
			return nil, Current{}, err
		}
		cur.Units[u] = st
	}
	a.hand.mu.Lock()
	a.hand.relevant = rel
	a.hand.mu.Unlock()
	a.checkSlots(ctx)
	a.remember(&cur)
	return desired, cur, nil
}

// remember fills in what the loop knows beyond disk and D-Bus. It runs
// again after health verdicts changed the records.
func (a *Agent) remember(cur *Current) {
	cur.Records = maps.Clone(a.mem.records)
	cur.Refused = a.mem.refused
	cur.Started = a.mem.started
	cur.Intent = Intent{Reload: a.mem.intent.Reload, Jobs: maps.Clone(a.mem.intent.Jobs)}
	cur.Slots = a.slots.held()
	a.rememberInFlight(cur)
	// Content of the versions units run and ran before, for classifying a
	// change and for rolling back: from the file when it still holds it,
	// else from the state directory — read once and kept while a record
	// refers to it (every pass re-read every unit's previous version).
	kept := a.blobs.kept
	a.blobs.kept = map[string][]byte{}
	for _, rec := range cur.Records {
		for _, m := range []map[string]string{rec.Applied, rec.Previous} {
			for p, h := range m {
				if _, ok := cur.Blobs[h]; ok {
					continue
				}
				if lf := cur.Files[p]; lf.Hash == h {
					cur.Blobs[h] = lf.Content
				} else if b, ok := kept[h]; ok {
					cur.Blobs[h], a.blobs.kept[h] = b, b
				} else if b, ok := a.cfg.Manifest.Blob(h); ok {
					cur.Blobs[h], a.blobs.kept[h] = b, b
				}
			}
		}
	}
}

// rememberInFlight fills in the jobs in flight and the units inside
// HealthySec: they change between the plan and the end of its execution.
func (a *Agent) rememberInFlight(cur *Current) {
	cur.Verifying = map[string]bool{}
	for u := range a.verify {
		cur.Verifying[u] = true
	}
	cur.Jobs = map[string]InFlight{}
	for u, j := range a.jobs.inflight {
		cur.Jobs[u] = InFlight{Job: j.act.Job, ContentKey: j.act.ContentKey, Rollback: j.act.Kind == KindRollback}
	}
}

// state asks systemd about a unit; a template has no state of its own
// (systemd refuses the name), only its instances do.
func (a *Agent) state(ctx context.Context, unit string) (UnitState, error) {
	if IsTemplate(unit) {
		return UnitState{LoadState: "template", ActiveState: "inactive", SubState: "template"}, nil
	}
	if st, ok := a.cache.states[unit]; ok {
		return st, nil
	}
	st, err := a.stateReader(unit)(ctx)
	if err != nil {
		return st, fmt.Errorf("read state of %s: %w", unit, err)
	}
	a.keepState(unit, st)
	return st, nil
}

// noteDrift logs, once per distinct content, a managed file changed behind
// the agent's back. The pass then restores it like any other difference.
func (a *Agent) noteDrift(path, want string, lf LocalFile) {
	if want == "" || want == InstanceMarker || lf.Err != "" {
		return
	}
	found := lf.Hash
	if !lf.Exists {
		found = "deleted"
	}
	if found == want {
		delete(a.mem.drifted, path)
		return
	}
	if a.mem.drifted[path] == found {
		return
	}
	a.mem.drifted[path] = found
	a.log.Warn("drift: managed file changed on disk; restoring the registry version",
		"unit", UnitOfPath(path), "path", path, "hash", short(want), "found_hash", short(found), "action", "drift")
	a.cfg.Observer.Drift(path)
}
