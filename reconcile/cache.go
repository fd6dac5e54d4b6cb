package reconcile

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A pass must cost what changed, not what the host runs: with 1,000 managed
// units, reading every unit's state over D-Bus and every file from disk on
// each pass made one change cost seconds. So the loop keeps what it last
// read and re-reads a unit or a file only when something says it may have
// changed:
//
//   - systemd's signals (UnitChanged, from the Watch subscription),
//   - fsnotify (FileChanged),
//   - the loop's own actions (files written, the daemon-reload, jobs),
//   - a job's end, and the end of a unit's HealthySec (the verdict is
//     judged on a fresh read),
//   - and the periodic resync, which catches a missed event: it re-hashes
//     every file and compares every unit's load/active/sub state in one
//     call (Systemd.Summaries) — or forgets everything when systemd cannot do that.
//
// Everything is forgotten at start, after a reconnect to systemd ("") and
// after a failed pass.

// UnitSummary is the part of a unit's state systemd lists for many units at
// once (Systemd.Summaries). A change in any other property of interest
// comes with a change in one of these (and a signal).
type UnitSummary struct {
	LoadState, ActiveState, SubState string
}

// cache is the loop's memory of systemd's and the disk's view. Loop-owned.
type cache struct {
	states map[string]UnitState
	files  map[string]LocalFile
	// fileStates is the UnitFileState last read per unit. Unlike states
	// it outlives a unit's changes (a unit's enablement changes only by an
	// enable or disable, or with an [Install] section it reads again); it
	// is forgotten for a unit the loop enabled or disabled, and for all at
	// the resync.
	fileStates map[string]string
	// unknown holds the units systemd last said it has no file for
	// (not-found): once a daemon-reload loads one, it has no past to read.
	unknown map[string]bool
	// reloaded holds, until the next round reads them, the states of the
	// units the loop's own daemon-reload has just loaded new files of, as
	// they were before it (see refreshReloaded).
	reloaded map[string]UnitState
	// light holds the units given a Light state since the last jobs were
	// started (afterJobs reads those that got none in full).
	light map[string]bool
}

func newCache() cache {
	return cache{states: map[string]UnitState{}, files: map[string]LocalFile{}, fileStates: map[string]string{},
		unknown: map[string]bool{}, reloaded: map[string]UnitState{}, light: map[string]bool{}}
}

// needsFileState says whether a read of unit's state must ask systemd for
// its UnitFileState, or the last one read (last; "" when none) stands in
// for it. The planner looks at UnitFileState only for a unit file the agent
// installed: to enable it when its [Install] section asks (planEnable), and
// to disable it when it is enabled and should not be (planEnable,
// planRemove). So a fresh one is needed when none was read yet, when the
// unit was last seen enabled, or when the desired file has an [Install]
// section; not for templates and instances, nor for a unit without [Install]
// last seen static or disabled — only someone else's enable could change
// that, and the resync reads it again. Pure.
//
// A unit systemd had not loaded before (none read) is read in full anyway:
// the individual reads pay off only where systemd had the unit loaded
// before the daemon-reload (measured, bursts of 100 changed units: 1.52–1.69×
// the batch floor with full reads, 1.45–1.49× without UnitFileState; the
// first sync of 100 new units: 1.50–1.86× full, 1.95–2.20× without).
func needsFileState(unit string, d *DesiredUnit, last string) bool {
	if last == "" {
		return true
	}
	if IsTemplate(unit) || IsInstance(unit) {
		return false
	}
	return last == "enabled" || (d != nil && d.File != nil && d.Policy.HasInstall)
}

// stateReader returns how to read unit's state now: in full, or without
// UnitFileState (the last one read stands in for it). It runs on the loop's
// goroutine; what it returns may run on any.
func (v *view) stateReader(unit string) func(context.Context) (UnitState, error) {
	sd, last := v.sd, v.cache.fileStates[unit]
	if needsFileState(unit, v.desired.units[unit], last) {
		return func(ctx context.Context) (UnitState, error) { return sd.State(ctx, unit) }
	}
	return func(ctx context.Context) (UnitState, error) {
		st, err := sd.StateSkippingFileState(ctx, unit)
		st.UnitFileState = last
		return st, err
	}
}

// keepState caches a unit's state read from systemd.
func (v *view) keepState(unit string, st UnitState) {
	v.cache.states[unit] = st
	if st.Light {
		v.cache.light[unit] = true
	}
	v.cache.fileStates[unit] = st.UnitFileState
	if st.LoadState == "not-found" {
		v.cache.unknown[unit] = true
	} else {
		delete(v.cache.unknown, unit)
	}
}

// dropState forgets a unit's state: it is read again, and the unit planned
// again, at the next round.
func (v *view) dropState(unit string) {
	delete(v.cache.states, unit)
	delete(v.cache.reloaded, unit)
	v.touch(unit)
}

// dirty is what other goroutines learned may have changed, handed to the
// loop under handoff.mu and applied at the start of the next observation.
type dirty struct {
	all   bool
	units map[string]bool
	paths map[string]bool
}

func (d *dirty) unit(u string) {
	if d.units == nil {
		d.units = map[string]bool{}
	}
	d.units[u] = true
}

func (d *dirty) path(p string) {
	if d.paths == nil {
		d.paths = map[string]bool{}
	}
	d.paths[p] = true
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
	v.cache = newCache()
	v.focus.all = true
	v.pathsChanged(everyPath)
}

// forgetUnit drops a unit's state; for a template (its file or a drop-in of
// it changed) every instance's too.
func (v *view) forgetUnit(u string) {
	v.dropState(u)
	if IsTemplate(u) {
		for _, n := range v.focus.instances[u] {
			v.dropState(n)
		}
	}
}

// isLinkDir says whether p is, or is in, a directory of dependency links
// (<target>.wants/, .requires/, .upholds/).
func isLinkDir(p string) bool {
	dir, _, _ := strings.Cut(p, "/")
	for _, suffix := range []string{".wants", ".requires", ".upholds"} {
		if strings.HasSuffix(dir, suffix) {
			return true
		}
	}
	return false
}

// forgetPath drops a file (or, for a drop-in directory, every file in it)
// and the state of the unit it belongs to: systemd's NeedDaemonReload
// changes with it.
func (v *view) forgetPath(p string) {
	if p == "" {
		v.forgetAll()
		return
	}
	delete(v.cache.files, p)
	dir := p + "/"
	for q := range v.cache.files {
		if strings.HasPrefix(q, dir) {
			delete(v.cache.files, q)
		}
	}
	if isLinkDir(p) {
		// Enablement links (enable, add-wants — the agent's own enables
		// too: the first one makes the directory): any unit's
		// UnitFileState may have changed, so everything is read again —
		// but which units systemd had no file for stays known: a link
		// gives no unit a file, and without it the first sync of 1,000
		// units with [Install] read each unit in full before its job
		// (1.8 s) instead of planning them from one listing.
		unknown := v.cache.unknown
		v.forgetAll()
		v.cache.unknown = unknown
		return
	}
	u := UnitOfPath(p)
	if strings.HasSuffix(p, ".d") && !strings.Contains(p, "/") {
		u = strings.TrimSuffix(p, ".d")
	}
	if (ValidateUnitName(u) != nil && !IsTemplate(u)) || strings.Contains(u, "-.") {
		// A drop-in directory for a whole type (service.d/) or a prefix
		// (foo-.service.d/), or a name we do not know: anything may have
		// changed.
		v.forgetAll()
		return
	}
	if _, ok := v.cache.reloaded[u]; ok {
		// Most likely the loop's own write, seen after its daemon-reload:
		// refreshReloaded trusts the unit's state only if the disk holds
		// what the loop wrote.
		return
	}
	v.forgetUnit(u)
}

// asWritten says whether every file the agent manages for unit (and, for
// an instance, for its template) holds on disk what the agent wrote.
func (v *view) asWritten(unit string) bool {
	units := []string{unit}
	if IsInstance(unit) {
		units = append(units, TemplateOf(unit))
	}
	for _, u := range units {
		for p, e := range v.rem.managedOf(u) {
			if !e.Instance && v.file(p).Hash != e.Hash {
				return false
			}
		}
	}
	return true
}

// file reads a file in the unit directory, from the cache when nothing said
// it changed.
func (v *view) file(p string) LocalFile {
	if lf, ok := v.cache.files[p]; ok {
		return lf
	}
	b, exists, err := v.files.Read(p)
	lf := LocalFile{Exists: exists}
	switch {
	case err != nil:
		lf.Err = err.Error()
		return lf // not kept: read again next time
	case exists:
		// A copy of its own size: the read's buffer is at least 512 bytes,
		// twice or thrice a typical unit file, kept for every managed file.
		lf.Hash, lf.Content = Hash(b), bytes.Clone(b)
	}
	v.cache.files[p] = lf
	return lf
}

// onDisk is what the disk holds of unit's managed files: its unit file's
// hash ("" when there is none, or the unit is an instance the agent only
// started) and its drop-ins' hashes by path (nil when none).
func (v *view) onDisk(unit string) (hash string, dropIns map[string]string) {
	if !v.rem.managedPaths()[unit].Instance {
		if lf := v.file(unit); lf.Exists {
			hash = lf.Hash
		}
	}
	for p, e := range v.rem.managedOf(unit) {
		if p == unit || e.Instance {
			continue
		}
		if lf := v.file(p); lf.Exists {
			if dropIns == nil {
				dropIns = map[string]string{}
			}
			dropIns[p] = lf.Hash
		}
	}
	return hash, dropIns
}

// replaced are the files plan writes as last read from disk (the cache):
// what each write replaces, kept for a rollback (executor.write).
func (v *view) replaced(plan []Action) map[string]LocalFile {
	files := map[string]LocalFile{}
	for _, act := range plan {
		for _, w := range act.Steps.Writes {
			if lf, ok := v.cache.files[w.Path]; ok {
				files[w.Path] = lf
			}
		}
	}
	return files
}

// resyncCache is the periodic safety net: every file is read again, every
// unit whose summary differs from what the cache holds is forgotten (all of
// them when systemd cannot summarize), and every unit is planned again.
func (v *view) resyncCache(ctx context.Context) {
	v.focus.all = true
	v.pathsChanged(everyPath)
	v.cache.files = map[string]LocalFile{}
	v.cache.fileStates = map[string]string{}
	if len(v.cache.states) == 0 {
		v.cache.states = map[string]UnitState{}
		return
	}
	names := make([]string, 0, len(v.cache.states))
	for u := range v.cache.states {
		if !IsTemplate(u) {
			names = append(names, u)
		}
	}
	got, err := v.sd.Summaries(ctx, names)
	if err != nil {
		v.log.Debug("resync: unit summaries unavailable; reading every unit", "err", err)
		v.cache.states = map[string]UnitState{}
		return
	}
	stale := 0
	for _, u := range names {
		st := v.cache.states[u]
		s, ok := got[u]
		if !ok || s.LoadState != st.LoadState || s.ActiveState != st.ActiveState || s.SubState != st.SubState {
			v.dropState(u)
			stale++
		}
	}
	if stale > 0 {
		v.log.Debug("resync: unit states changed without a signal", "units", stale)
	}
}

// afterExecute forgets what the loop's own actions changed: the files it
// wrote or removed and the units they belong to, and the units it enabled,
// disabled, reset or reloaded; and, after a daemon-reload, when systemd
// last loaded the files (Current.Loaded).
func (v *view) afterExecute(plan []Action, reloaded bool) {
	if reloaded {
		v.mem.loaded = 0 // no longer when systemd last loaded the files
	}
	// Kept before they are forgotten: the states of the units whose new
	// files the reload loads, for refreshReloaded.
	before := map[string]UnitState{}
	keep := func(u string) {
		if st, ok := v.cache.states[u]; ok && st.LoadState == "loaded" && !st.NeedDaemonReload {
			before[u] = st
		}
	}
	for _, act := range plan {
		if reloaded && len(act.Steps.Writes) > 0 && !act.Steps.Enable && !act.Steps.Disable && !act.Steps.ResetFailed {
			keep(act.Unit)
			for _, n := range v.focus.instances[act.Unit] {
				keep(n)
			}
		}
	}
	for _, act := range plan {
		touched := act.Steps.Enable || act.Steps.Disable || act.Steps.ResetFailed
		if act.Steps.Enable || act.Steps.Disable {
			delete(v.cache.fileStates, act.Unit)
		}
		for _, w := range act.Steps.Writes {
			v.forgetPath(w.Path)
			touched = true
		}
		for _, p := range act.Steps.Removes {
			v.forgetPath(p)
			touched = true
		}
		if touched || (reloaded && act.Changes()) {
			v.forgetUnit(act.Unit)
		}
	}
	if reloaded {
		// A file edited behind the agent's back is loaded by this reload
		// too: its NeedDaemonReload flips.
		for u, st := range v.cache.states {
			if st.NeedDaemonReload {
				v.dropState(u)
			}
		}
	}
	for u, st := range before {
		if _, read := v.cache.states[u]; !read {
			v.cache.reloaded[u] = st
		}
	}
}

// refreshReloaded takes, of the units need holds, those the loop's own
// daemon-reload has just loaded new files of (cache.reloaded), and plans
// them from one listing instead of a read each: a daemon-reload changes
// no part of a unit's state the plan looks at but the load state, and
// what the new file says (its type, its timeouts, NeedDaemonReload and
// UnitFileState). The listing gives the load, active and sub state; such a
// unit is Light: its job reads its own timeouts before it waits, the read
// after the job is a full one, and a unit that gets no job is read in full
// at the next round (afterJobs). A unit is read in full instead when it is
// not loaded now, its active or sub state moved, its UnitFileState must be
// read (needsFileState), or its files on disk are not what the loop wrote
// (an edit since: NeedDaemonReload may be set). It returns the units still
// to read. Measured, bursts of 100 changed units: the reads after the
// reload held their jobs back 86–162 ms; the listing takes 4 ms.
func (v *view) refreshReloaded(ctx context.Context, need []string) []string {
	if len(v.cache.reloaded) == 0 {
		return need
	}
	defer clear(v.cache.reloaded) // good for the round after the reload only
	var names []string
	for _, u := range need {
		if _, ok := v.cache.reloaded[u]; ok {
			names = append(names, u)
		}
	}
	if len(names) == 0 {
		return need
	}
	got, err := v.sd.Summaries(ctx, names)
	if err != nil {
		return need
	}
	rest := need[:0]
	for _, u := range need {
		old, ok := v.cache.reloaded[u]
		s, listed := got[u]
		if !ok || !listed || s.LoadState != "loaded" || s.ActiveState != old.ActiveState || s.SubState != old.SubState ||
			needsFileState(u, v.desired.units[u], v.cache.fileStates[u]) || !v.asWritten(u) {
			rest = append(rest, u)
			continue
		}
		old.NeedDaemonReload, old.Light = false, true
		v.keepState(u, old)
	}
	return rest
}

// afterJobs runs once the pass's jobs are started. A Light state
// (refreshReloaded, prefetch) served to plan this pass only: a unit it
// planned no job for is read in full at the next round (a job's unit is
// read in full when the job ends).
func (v *view) afterJobs() {
	for u := range v.cache.light {
		if _, inflight := v.rem.inFlight()[u]; !inflight && v.cache.states[u].Light {
			v.dropState(u)
		}
	}
	clear(v.cache.light)
}

// readWorkers bounds the state reads prefetch has in flight at once.
const readWorkers = 8

// prefetch reads the states of units the cache does not hold, several at a
// time: systemd answers one call after another, but the round trips and the
// agent's decoding overlap. Units systemd does not know at all need no full
// read: when many are missing, one listing (Systemd.Summaries) finds those. At the
// first sync of 1,000 new units the states were read one by one, twice
// (before and after the daemon-reload): seconds of waiting.
func (v *view) prefetch(ctx context.Context, units map[string]bool) error {
	var need []string
	for u := range units {
		if IsTemplate(u) || ValidateUnitName(u) != nil {
			continue
		}
		if _, ok := v.cache.states[u]; !ok {
			need = append(need, u)
		}
	}
	need = v.refreshReloaded(ctx, need)
	if len(need) < 2 {
		return nil // observe reads it
	}
	if len(need) > readWorkers {
		if got, err := v.sd.Summaries(ctx, need); err == nil {
			rest := need[:0]
			for _, u := range need {
				s, ok := got[u]
				switch {
				case ok && s.LoadState == "not-found":
					v.keepState(u, UnitState{LoadState: s.LoadState, ActiveState: s.ActiveState, SubState: s.SubState,
						LoadError: "Unit " + u + " not found."})
				case ok && v.cache.unknown[u] && s.LoadState == "loaded" && s.ActiveState == "inactive" && s.SubState == "dead":
					v.keepState(u, UnitState{LoadState: s.LoadState, ActiveState: s.ActiveState, SubState: s.SubState, Light: true})
				default:
					rest = append(rest, u)
				}
			}
			need = rest
		}
	}
	states := make([]UnitState, len(need))
	errs := make([]error, len(need))
	readers := make([]func(context.Context) (UnitState, error), len(need))
	for i, u := range need {
		readers[i] = v.stateReader(u)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(readWorkers, len(need)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(need); i = int(next.Add(1) - 1) {
				states[i], errs[i] = readers[i](ctx)
			}
		})
	}
	wg.Wait()
	for i, u := range need {
		if errs[i] != nil {
			return errs[i] // names the unit already (Systemd's contract)
		}
		v.keepState(u, states[i])
	}
	return nil
}
