package reconcile

import (
	"context"
	"maps"
)

// observe reads desired state (the last snapshot) and current state (disk,
// manifest, D-Bus), plus what the loop remembers, into one Current, for the
// units this round looks at (focus.go): units, nil for all of them; look,
// those of them the agent knows. desired and cur hold the units of look.
// Disk and D-Bus are read only where something changed since the last look
// (cache.go).
func (v *view) observe(ctx context.Context) (desired map[string]*DesiredUnit, units, look map[string]bool, cur Current, err error) {
	v.takeDirty()
	snap := v.handoff.snapshot()
	if snap == nil {
		return nil, nil, nil, Current{}, ErrNoRegistry
	}
	rescan := false
	if snap != v.desired.snap {
		changes := v.desired.update(*snap)
		v.desired.snap = snap
		if v.desired.trust != nil {
			v.accepted()
		}
		if v.check {
			checkDesired(&v.desired.desiredState, *snap)
		}
		halts := map[string]Halt{}
		for _, h := range snap.Halts {
			halts[h.Unit] = h
		}
		rescan = v.newSnapshot(changes, halts)
		// Something new may be wanted of a unit whose job is in flight (a
		// removal stops a hung start): plan it from what it is now.
		v.handoff.eachMuted(v.dropState)
	}
	units = v.focusUnits()
	look = units
	if units == nil {
		look = v.everyUnit()
		rescan = true
		v.readManager(ctx)
	} else {
		look = map[string]bool{}
		for u := range units {
			if v.known(u) {
				look[u] = true
			}
		}
	}
	if rescan {
		v.rescan()
	}
	cur, err = v.current(ctx, look)
	if err != nil {
		return nil, nil, nil, Current{}, err
	}
	desired = v.desired.units
	if units != nil {
		desired = map[string]*DesiredUnit{}
		for u := range look {
			if d := v.desired.units[u]; d != nil {
				desired[u] = d
			}
		}
	}
	return desired, units, look, cur, nil
}

// rescan follows a change in the set of units the agent knows (a unit
// came into or left the registry; and every pass over all units): which
// units' signals matter, the template → instances index, and the cached
// files and states of units and paths no longer known. A new value for a
// unit known before changes none of these — a path it no longer has stays
// cached until the next rescan, kept fresh by fsnotify like any other.
func (v *view) rescan() {
	all := v.everyUnit()
	v.indexInstances(all)
	rel := make(map[string]bool, len(all))
	paths := map[string]bool{}
	for u := range all {
		rel[u] = true
		v.addPaths(paths, u)
	}
	v.handoff.setRelevant(rel)
	for p := range v.cache.files {
		if !paths[p] {
			delete(v.cache.files, p)
		}
	}
	for u := range v.cache.states {
		if !all[u] {
			delete(v.cache.states, u) // signals are not forwarded for it any more
		}
	}
	for u := range v.cache.fileStates {
		if !all[u] {
			delete(v.cache.fileStates, u)
		}
	}
}

// addPaths adds to paths the files of unit the agent looks at: the ones
// the registry wants and the ones it manages (an instance's entry is none).
func (v *view) addPaths(paths map[string]bool, unit string) {
	if d := v.desired.units[unit]; d != nil {
		for _, f := range d.VersionFiles() {
			paths[f.Path] = true
		}
	}
	for p, e := range v.rem.managedOf(unit) {
		if !e.Instance {
			paths[p] = true
		}
	}
}

// readManager reads which service manager instance runs (Current.Manager)
// and, while no daemon-reload is owed, when it last loaded the unit files
// (Current.Loaded): unknown ("", 0) until systemd said; a failed read of
// the instance keeps the last answer (a new manager comes with a
// reconnect, and the pass after it reads again).
func (v *view) readManager(ctx context.Context) {
	m, err := v.sd.ManagerID(ctx)
	if err != nil {
		v.log.Debug("service manager instance unknown", "err", err)
		return
	}
	v.mem.manager = m
	if !v.rem.intent().Reload {
		// Only while no daemon-reload is owed: after one of the agent's
		// own, a unit started before it could pass for one started after.
		if v.mem.loaded, err = v.sd.UnitsLoaded(ctx); err != nil {
			v.mem.loaded = 0
		}
	}
}

// current reads the current state of units (all of them known).
func (v *view) current(ctx context.Context, units map[string]bool) (Current, error) {
	cur := Current{
		Host:   HostFacts{Files: map[string]LocalFile{}, Units: map[string]UnitState{}},
		Memory: Memory{Managed: map[string]Owned{}, Blobs: map[string][]byte{}},
		Fleet:  Fleet{Halts: v.focus.halts},
	}
	paths := map[string]bool{}
	for u := range units {
		v.addPaths(paths, u)
		for p, e := range v.rem.managedOf(u) {
			cur.Memory.Managed[p] = e
		}
	}
	for p := range paths {
		lf := v.file(p)
		cur.Host.Files[p] = lf
		v.noteDrift(p, cur.Memory.Managed[p].Hash, lf)
	}
	if err := v.prefetch(ctx, units); err != nil {
		return Current{}, err
	}
	for u := range units {
		if ValidateUnitName(u) != nil {
			continue // not a name systemd knows: do not ask
		}
		// A unit whose registry value is rejected is still observed: its
		// running version may be inside HealthySec, judged as usual.
		st, err := v.state(ctx, u)
		if err != nil {
			return Current{}, err
		}
		cur.Host.Units[u] = st
	}
	cur.Host.Manager, cur.Host.Loaded = v.mem.manager, v.mem.loaded // read by readManager
	cur.Host.FileRoots = v.roots
	v.remember(&cur, units)
	return cur, nil
}

// remember fills in what the loop knows beyond disk and D-Bus about units
// (cur.Memory, and the slots it holds). It runs again after health
// verdicts changed the records.
func (v *view) remember(cur *Current, units map[string]bool) {
	cur.Memory.Records = make(map[string]UnitRecord, len(units))
	for u := range units {
		if rec, ok := v.rem.records()[u]; ok {
			cur.Memory.Records[u] = rec
		}
	}
	cur.Memory.Refused = v.rem.refused()
	cur.Memory.Started = v.rem.started()
	cur.Memory.Intent = Intent{Reload: v.rem.intent().Reload, Jobs: maps.Clone(v.rem.intent().Jobs)}
	cur.Fleet.Slots = v.rem.slotsHeld()
	v.rememberInFlight(cur)
	// Content of the versions units run and ran before, for classifying a
	// change and for rolling back: from the file when it still holds it,
	// else from the state directory — read once and kept while a record
	// refers to it (every pass re-read every unit's previous version).
	if v.kept == nil {
		v.kept = map[string][]byte{}
	}
	for _, rec := range cur.Memory.Records {
		for _, m := range []map[string]string{rec.Applied, rec.Previous} {
			for p, h := range m {
				if _, ok := cur.Memory.Blobs[h]; ok {
					continue
				}
				if lf := cur.Host.Files[p]; lf.Hash == h {
					cur.Memory.Blobs[h] = lf.Content
				} else if b, ok := v.kept[h]; ok {
					cur.Memory.Blobs[h] = b
				} else if b, ok := v.man.Blob(h); ok {
					cur.Memory.Blobs[h], v.kept[h] = b, b
				}
			}
		}
	}
}

// pruneKept drops the kept versions no record refers to any more.
func (v *view) pruneKept() {
	refs := map[string]bool{}
	for _, rec := range v.rem.records() {
		for _, h := range rec.Applied {
			refs[h] = true
		}
		for _, h := range rec.Previous {
			refs[h] = true
		}
	}
	for h := range v.kept {
		if !refs[h] {
			delete(v.kept, h)
		}
	}
}

// rememberInFlight fills in the jobs in flight and the units inside
// HealthySec: they change between the plan and the end of its execution.
func (v *view) rememberInFlight(cur *Current) {
	cur.Memory.Verifying = map[string]bool{}
	for u := range v.rem.verifying() {
		cur.Memory.Verifying[u] = true
	}
	cur.Memory.Jobs = map[string]InFlight{}
	for u, j := range v.rem.inFlight() {
		cur.Memory.Jobs[u] = InFlight{Job: j.act.Steps.Job, ContentKey: j.act.ContentKey, Rollback: j.act.Kind == KindRollback}
	}
}

// state asks systemd about a unit; a template has no state of its own
// (systemd refuses the name), only its instances do.
func (v *view) state(ctx context.Context, unit string) (UnitState, error) {
	if IsTemplate(unit) {
		return UnitState{LoadState: "template", ActiveState: "inactive", SubState: "template"}, nil
	}
	if st, ok := v.cache.states[unit]; ok {
		return st, nil
	}
	st, err := v.stateReader(unit)(ctx)
	if err != nil {
		return st, err // names the unit already (Systemd's contract)
	}
	v.keepState(unit, st)
	return st, nil
}

// noteDrift logs, once per distinct content, a managed file changed behind
// the agent's back. The pass then restores it like any other difference.
func (v *view) noteDrift(path, want string, lf LocalFile) {
	if want == "" || lf.Err != "" {
		return
	}
	found := lf.Hash
	if !lf.Exists {
		found = "deleted"
	}
	if found == want {
		delete(v.mem.drifted, path)
		return
	}
	if v.mem.drifted[path] == found {
		return
	}
	v.mem.drifted[path] = found
	shownWant, shownFound := short(want), short(found)
	if d := v.desired.units[UnitOfPath(path)]; d != nil && d.DropIns[path].Sealed != "" {
		// A secret: the hashes of the file are never logged.
		shownWant, shownFound = short(d.DropIns[path].Sealed), secretDiffers
	}
	if v.man.Intent().Interrupted(path, lf) {
		// The agent died between claiming the path and the rename: the
		// file holds what it held before. The pass finishes the write.
		v.log.Info("finishing a write begun before the agent stopped",
			"unit", UnitOfPath(path), "path", path, "hash", shownWant, "found_hash", shownFound)
		return
	}
	v.log.Warn("drift: managed file changed on disk; restoring the registry version",
		"unit", UnitOfPath(path), "path", path, "hash", shownWant, "found_hash", shownFound, "action", "drift")
	v.obs.Drift(path)
}
