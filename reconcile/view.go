package reconcile

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"time"
)

// view is what the loop sees of the host and the registry: the cache of
// systemd's and the disk's state (cache.go), which units a pass looks at
// (focus.go), and observing a pass's Current from them (observe), with the
// desired units kept up to date from snapshot to snapshot. The loop asks it
// for each round's units and Current, and tells it what the loop's own
// steps changed (afterExecute, afterJobs) and what it planned (planned).
//
// It reads what the agent remembers, runs, manages and holds only through
// remembered, to fill in Current.Memory and Current.Fleet and to know which
// units there are, and meets the other goroutines only through inbox; it
// knows none of the agent's other parts and writes none of their state. It
// does not plan and records nothing. Loop-owned.
type view struct {
	sd    Systemd
	files Files
	man   Manifest // for the kept versions' blobs (remember)
	log   *slog.Logger
	obs   Observer // told of drift
	check bool     // Config.CheckFocus
	// labels is Config.Labels (nil: none): the host's labels, for
	// MaxUnavailableBy= buckets.
	labels func() map[string]string
	roots  []string // fileRoots(Files): never nil

	cache cache // systemd's and the disk's state, re-read on change
	focus focus // which units a round looks at, and their last actions
	// desired is Desire of the last snapshot, brought up to date when the
	// snapshot changes, for the units whose keys changed.
	desired struct {
		snap *Snapshot
		desiredState
	}
	mem memory // what it knows of the service manager and of drift
	// kept holds the versions read back from the state directory, by
	// hash, while a record refers to them (remember, pruneKept).
	kept keptVersions

	// marks saves the signature check's marks (nil: not checked, or not
	// saved).
	marks *marksOut

	rem     remembered // what the agent remembers and runs: read, never written
	handoff inbox      // the snapshot and what changed in; the units whose signals matter out (rescan)
	// pathsChanged is told which paths changed ("": any of them).
	pathsChanged func(paths map[string]bool)
}

// remembered is what the view reads of the loop's other parts, to fill in
// Current.Memory and Current.Fleet and to know which units there are. The
// maps it hands out are read, never written.
type remembered interface {
	records() map[string]UnitRecord // the ledger's records
	verifying() map[string]*window  // units inside HealthySec
	intent() Intent                 // what the ledger says is owed
	refused() map[string]Refusal
	started() map[string]string
	inFlight() map[string]*jobRun // jobs in flight, by unit
	managedOf(unit string) iter.Seq2[string, Owned]
	managedPaths() map[string]Owned
	managedUnits() map[string][]string // unit -> its managed paths
	slotsHeld() map[string]string
}

// memory is what the view knows of the host beyond what a pass reads, for
// as long as the process lives (what the agent remembers of units: ledger).
type memory struct {
	manager string            // the service manager instance (Current.Manager)
	loaded  uint64            // Current.Loaded
	drifted map[string]string // path -> on-disk hash already reported as drift
}

// newView returns the view of an agent configured with cfg, reading mem
// and h, and telling pathsChanged which paths changed.
func newView(cfg Config, mem remembered, h inbox, pathsChanged func(map[string]bool)) view {
	return view{
		sd: cfg.Systemd, files: cfg.Files, man: cfg.Manifest, log: cfg.Log, obs: cfg.Observer, check: cfg.CheckFocus, labels: cfg.Labels,
		roots: fileRoots(cfg.Files),
		cache: newCache(cfg.Systemd, cfg.Files, cfg.Log), focus: newFocus(), mem: memory{drifted: map[string]string{}},
		rem: mem, handoff: h, pathsChanged: pathsChanged,
		desired: struct {
			snap *Snapshot
			desiredState
		}{desiredState: desiredState{trust: newTrustState(cfg.Trust), secrets: cfg.Secrets, creds: cfg.Credentials}},
		marks: newMarksOut(cfg.Trust, cfg.Log),
	}
}

// accepted logs the signed changes the last snapshot brought (who signed
// which key, at which sequence) and hands the marks, when they moved, to
// their saver (marksOut): the pass does not wait for the state
// directory's fsyncs.
func (v *view) accepted() {
	keys, marks := v.desired.trust.takeAccepted()
	for _, k := range keys {
		what := "signed change accepted"
		if k.Removed {
			what = "signed removal accepted"
		}
		v.log.Info(k.Unit+": "+what+": "+k.Key+" signed by "+k.Signer.String(), "unit", k.Unit, "key", k.Key, "signer", k.Signer.Fingerprint,
			"principals", k.Signer.Principals, "seq", k.Seq, "revert", k.Revert)
	}
	if marks == nil || v.marks == nil {
		return
	}
	v.marks.offer(marks)
	v.desired.trust.changed = false
}

// What the loop asks of the view about a pass, beyond observe.

// lookAtAll makes the next round look at every unit: what this one looked
// at was not (fully) looked at, or nothing was kept of its plan.
func (v *view) lookAtAll() { v.focus.all = true }

// beginPass starts collecting the units the pass's rounds plan (reported).
func (v *view) beginPass() { v.focus.reported = map[string]bool{} }

// endPass drops the pass's actions: only report looks at them again (but
// under Config.CheckFocus, which compares them with the next passes' plans).
func (v *view) endPass() {
	if !v.check {
		v.focus.actions = map[string]Action{}
	}
}

// reported is the units the pass planned, whose statuses are built again;
// nil: every unit.
func (v *view) reported() map[string]bool { return v.focus.reported }

// changedUnits is the units whose records this pass can have changed: the
// ones it planned and the ones it touched for the next; nil: every unit.
func (v *view) changedUnits() map[string]bool {
	if v.focus.reported == nil {
		return nil
	}
	units := map[string]bool{}
	for u := range v.focus.reported {
		units[u] = true
	}
	for u := range v.focus.touched {
		units[u] = true
	}
	return units
}

// desiredUnit is what the registry wants of unit (nil: nothing).
func (v *view) desiredUnit(unit string) *DesiredUnit { return v.desired.units[unit] }

// action is the pass's action for unit.
func (v *view) action(unit string) Action { return v.focus.actions[unit] }

// revision is the registry revision of the snapshot the pass planned from.
func (v *view) revision() int64 { return v.desired.snap.Revision }

// manager is the service manager instance last read ("": unknown).
func (v *view) manager() string { return v.mem.manager }

// What the view does with its cache (cache.go) and focus (focus.go).

// touch makes the next round plan unit again.
func (v *view) touch(unit string) { v.focus.touch(unit) }

// planned keeps a round's plan (focus.planned).
func (v *view) planned(units map[string]bool, plan []Action) { v.focus.planned(units, plan) }

// known says whether the agent has anything to do with unit: the registry
// wants it, or it manages files of it, remembers it or runs a job on it.
func (v *view) known(unit string) bool {
	_, rec := v.rem.records()[unit]
	_, job := v.rem.inFlight()[unit]
	return v.desired.units[unit] != nil || len(v.rem.managedUnits()[unit]) > 0 || rec || job
}

// hasStatus says whether unit is reported: the registry wants it or the
// agent manages files of it (what is remembered of a unit neither wanted
// nor managed goes with its record).
func (v *view) hasStatus(unit string) bool {
	return v.desired.units[unit] != nil || len(v.rem.managedUnits()[unit]) > 0
}

// everyUnit is every unit the agent knows (see known).
func (v *view) everyUnit() map[string]bool {
	units := map[string]bool{}
	for name := range v.desired.units {
		units[name] = true
	}
	for u := range v.rem.managedUnits() {
		units[u] = true
	}
	for u := range v.rem.records() {
		units[u] = true
	}
	for u := range v.rem.inFlight() {
		units[u] = true
	}
	return units
}

// takeDirty applies what changed since the last observation to the cache.
func (v *view) takeDirty() {
	d := v.handoff.takeDirty()
	v.pathsChanged(d.paths)
	if d.all {
		v.forgetAll()
		return
	}
	for u := range d.units {
		v.forgetUnit(u)
	}
	for p := range d.paths {
		v.forgetPath(p)
	}
	// A unit inside HealthySec is read again when its window ends: the
	// verdict rests on what systemd says then. Before that its signals say
	// when it changed (every change health looks at — a restart, an exit, a
	// new Result — moves ActiveState or SubState), and a finished job
	// forgets its unit (finish). Reading every judged unit on every pass
	// made the first sync of 1,000 units cost seconds of D-Bus decoding.
	now := time.Now()
	for u, w := range v.rem.verifying() {
		if !now.Before(w.deadline()) {
			v.dropState(u)
		}
	}
}

// forgetAll forgets everything read, and makes the next round look at
// every unit.
func (v *view) forgetAll() {
	v.cache.reset()
	v.lookAgain()
}

// lookAgain makes the next round look at every unit and every path.
func (v *view) lookAgain() {
	v.focus.all = true
	v.pathsChanged(everyPath)
}

// forgetUnit drops a unit's state; for a template every instance's too.
func (v *view) forgetUnit(u string) { v.cache.dropUnit(u, v.focus.instances[u], v.touch) }

// forgetPath drops a file and the state of the unit it belongs to
// (cache.dropPath); or everything.
func (v *view) forgetPath(p string) {
	if v.cache.dropPath(p, v.focus.instances, v.touch) {
		v.lookAgain()
	}
}

// dropState forgets a unit's state: it is read again, and the unit planned
// again, at the next round.
func (v *view) dropState(unit string) { v.cache.dropState(unit, v.touch) }

// keepState caches a unit's state read from systemd.
func (v *view) keepState(unit string, st UnitState) { v.cache.keepState(unit, st) }

// stateReader returns how to read unit's state now (cache.stateReader).
func (v *view) stateReader(unit string) func(context.Context) (UnitState, error) {
	return v.cache.stateReader(unit, v.desired.units[unit])
}

// onDisk is what the disk holds of unit's managed files (cache.onDisk).
func (v *view) onDisk(unit string) (hash string, dropIns map[string]string) {
	return v.cache.onDisk(unit, v.rem.managedPaths(), v.rem.managedOf)
}

// replaced are the files plan writes as last read from disk (cache.replaced).
func (v *view) replaced(plan []Action) map[string]LocalFile { return v.cache.replaced(plan) }

// resyncCache is the periodic safety net (cache.resync); every unit is
// planned again.
func (v *view) resyncCache(ctx context.Context) {
	v.lookAgain()
	v.cache.resync(ctx, v.touch)
}

// afterExecute forgets what the loop's own actions changed
// (cache.afterExecute) and, after a daemon-reload, when systemd last
// loaded the files (Current.Loaded).
func (v *view) afterExecute(plan []Action, reloaded bool) {
	if reloaded {
		v.mem.loaded = 0 // no longer when systemd last loaded the files
	}
	if v.cache.afterExecute(plan, reloaded, v.focus.instances, v.touch) {
		v.lookAgain()
	}
}

// afterJobs runs once the pass's jobs are started (cache.afterJobs).
func (v *view) afterJobs() { v.cache.afterJobs(v.rem.inFlight(), v.touch) }

// checkFocus (Config.CheckFocus) checks the agent's copy of the manifest,
// and the focus (focus.check) against a plan of every unit from full.
func (v *view) checkFocus(units map[string]bool, full Current) {
	if got := v.man.Managed(); !maps.Equal(got, v.rem.managedPaths()) {
		panic(fmt.Sprintf("focus check: the agent's copy of the manifest differs from it:\n kept %v\n file %v", v.rem.managedPaths(), got))
	}
	v.focus.check(units, v.desired.units, full)
}

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
		rescan = v.focus.newSnapshot(changes, halts)
		// Something new may be wanted of a unit whose job is in flight (a
		// removal stops a hung start): plan it from what it is now.
		v.handoff.eachMuted(v.dropState)
	}
	units = v.focus.units(v.rem.verifying(), v.rem.inFlight(), v.rem.intent().Jobs)
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
	v.focus.indexInstances(all)
	rel := make(map[string]bool, len(all))
	paths := map[string]bool{}
	for u := range all {
		rel[u] = true
		v.addPaths(paths, u)
	}
	v.handoff.setRelevant(rel)
	v.cache.keepOnly(paths, all)
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
		lf := v.cache.file(p)
		cur.Host.Files[p] = lf
		v.noteDrift(p, cur.Memory.Managed[p].Hash, lf)
	}
	if err := v.cache.prefetch(ctx, units, v.desired.units, v.rem.managedOf); err != nil {
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
	if v.labels != nil {
		cur.Fleet.Labels = v.labels()
	}
	v.rememberInFlight(cur)
	// Content of the versions units run and ran before, for classifying a
	// change and for rolling back.
	v.kept.fill(cur, v.man)
}

// pruneKept drops the kept versions no record refers to any more.
func (v *view) pruneKept() { v.kept.prune(v.rem.records()) }

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
	v.cache.keepState(unit, st)
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

// inbox is where the view meets the goroutines that hand the loop its
// snapshot and say what changed (handoff).
type inbox interface {
	snapshot() *Snapshot // the newest snapshot; nil: none yet
	takeDirty() dirty    // what changed since the last call
	// eachMuted calls f with every unit a signal came for while its job
	// was in flight (not passed on).
	eachMuted(f func(unit string))
	setRelevant(units map[string]bool) // the units whose signals are passed on
}

// everyPath tells pathsChanged that any path may have changed.
var everyPath = map[string]bool{"": true}
