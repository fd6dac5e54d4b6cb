package reconcile

import (
	"bytes"
	"context"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
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

// cache is the loop's memory of systemd's and the disk's view, and what
// reads them. It knows which units and paths the agent has only from what
// its callers hand it (the desired units, remembered); the units whose
// state it drops are handed to touch, to be planned again (view.touch).
// Loop-owned.
type cache struct {
	sd   Systemd
	disk Files
	log  *slog.Logger

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

func newCache(sd Systemd, disk Files, log *slog.Logger) cache {
	c := cache{sd: sd, disk: disk, log: log}
	c.reset()
	return c
}

// reset forgets everything read.
func (c *cache) reset() {
	c.states, c.files, c.fileStates = map[string]UnitState{}, map[string]LocalFile{}, map[string]string{}
	c.unknown, c.reloaded, c.light = map[string]bool{}, map[string]UnitState{}, map[string]bool{}
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

// stateReader returns how to read unit's state now (d: what the registry
// wants of it): in full, or without UnitFileState (the last one read stands
// in for it). It runs on the loop's goroutine; what it returns may run on
// any.
func (c *cache) stateReader(unit string, d *DesiredUnit) func(context.Context) (UnitState, error) {
	sd, last := c.sd, c.fileStates[unit]
	if needsFileState(unit, d, last) {
		return func(ctx context.Context) (UnitState, error) { return sd.State(ctx, unit) }
	}
	return func(ctx context.Context) (UnitState, error) {
		st, err := sd.StateSkippingFileState(ctx, unit)
		st.UnitFileState = last
		return st, err
	}
}

// keepState caches a unit's state read from systemd.
func (c *cache) keepState(unit string, st UnitState) {
	c.states[unit] = st
	if st.Light {
		c.light[unit] = true
	}
	c.fileStates[unit] = st.UnitFileState
	if st.LoadState == "not-found" {
		c.unknown[unit] = true
	} else {
		delete(c.unknown, unit)
	}
}

// dropState forgets a unit's state: it is read again, and the unit planned
// again (touch), at the next round.
func (c *cache) dropState(unit string, touch func(unit string)) {
	delete(c.states, unit)
	delete(c.reloaded, unit)
	touch(unit)
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

// dropUnit drops a unit's state; for a template (its file or a drop-in of
// it changed) every instance's too (instances).
func (c *cache) dropUnit(u string, instances []string, touch func(unit string)) {
	c.dropState(u, touch)
	if IsTemplate(u) {
		for _, n := range instances {
			c.dropState(n, touch)
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

// dropPath drops a file (or, for a drop-in directory, every file in it)
// and the state of the unit it belongs to (and of its instances):
// systemd's NeedDaemonReload changes with it. all says it forgot
// everything instead: every unit is to be looked at again.
func (c *cache) dropPath(p string, instances map[string][]string, touch func(unit string)) (all bool) {
	if p == "" {
		c.reset()
		return true
	}
	delete(c.files, p)
	dir := p + "/"
	for q := range c.files {
		if strings.HasPrefix(q, dir) {
			delete(c.files, q)
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
		unknown := c.unknown
		c.reset()
		c.unknown = unknown
		return true
	}
	u := UnitOfPath(p)
	if strings.HasSuffix(p, ".d") && !strings.Contains(p, "/") {
		u = strings.TrimSuffix(p, ".d")
	}
	if (ValidateUnitName(u) != nil && !IsTemplate(u)) || strings.Contains(u, "-.") {
		// A drop-in directory for a whole type (service.d/) or a prefix
		// (foo-.service.d/), or a name we do not know: anything may have
		// changed.
		c.reset()
		return true
	}
	if _, ok := c.reloaded[u]; ok {
		// Most likely the loop's own write, seen after its daemon-reload:
		// refreshReloaded trusts the unit's state only if the disk holds
		// what the loop wrote.
		return false
	}
	c.dropUnit(u, instances[u], touch)
	return false
}

// keepOnly drops the files not in paths and the states of units not in
// units: the agent no longer knows them (signals are not forwarded for
// them any more).
func (c *cache) keepOnly(paths, units map[string]bool) {
	for p := range c.files {
		if !paths[p] {
			delete(c.files, p)
		}
	}
	for u := range c.states {
		if !units[u] {
			delete(c.states, u)
		}
	}
	for u := range c.fileStates {
		if !units[u] {
			delete(c.fileStates, u)
		}
	}
}

// asWritten says whether every file the agent manages for unit (and, for
// an instance, for its template: managedOf) holds on disk what the agent
// wrote.
func (c *cache) asWritten(unit string, managedOf func(unit string) iter.Seq2[string, Owned]) bool {
	units := []string{unit}
	if IsInstance(unit) {
		units = append(units, TemplateOf(unit))
	}
	for _, u := range units {
		for p, e := range managedOf(u) {
			if !e.Instance && c.file(p).Hash != e.Hash {
				return false
			}
		}
	}
	return true
}

// file reads a file in the unit directory, from the cache when nothing said
// it changed.
func (c *cache) file(p string) LocalFile {
	if lf, ok := c.files[p]; ok {
		return lf
	}
	b, exists, err := c.disk.Read(p)
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
	c.files[p] = lf
	return lf
}

// onDisk is what the disk holds of unit's managed files (paths, managedOf):
// its unit file's hash ("" when there is none, or the unit is an instance
// the agent only started) and its drop-ins' hashes by path (nil when none).
func (c *cache) onDisk(unit string, paths map[string]Owned, managedOf func(unit string) iter.Seq2[string, Owned]) (hash string, dropIns map[string]string) {
	if !paths[unit].Instance {
		if lf := c.file(unit); lf.Exists {
			hash = lf.Hash
		}
	}
	for p, e := range managedOf(unit) {
		if p == unit || e.Instance {
			continue
		}
		if lf := c.file(p); lf.Exists {
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
func (c *cache) replaced(plan []Action) map[string]LocalFile {
	files := map[string]LocalFile{}
	for _, act := range plan {
		for _, w := range act.Steps.Writes {
			if lf, ok := c.files[w.Path]; ok {
				files[w.Path] = lf
			}
		}
	}
	return files
}

// resync is the periodic safety net: every file is read again, and every
// unit whose summary differs from what the cache holds is forgotten (all
// of them when systemd cannot summarize).
func (c *cache) resync(ctx context.Context, touch func(unit string)) {
	c.files = map[string]LocalFile{}
	c.fileStates = map[string]string{}
	if len(c.states) == 0 {
		c.states = map[string]UnitState{}
		return
	}
	names := make([]string, 0, len(c.states))
	for u := range c.states {
		if !IsTemplate(u) {
			names = append(names, u)
		}
	}
	got, err := c.sd.Summaries(ctx, names)
	if err != nil {
		c.log.Debug("resync: unit summaries unavailable; reading every unit", "err", err)
		c.states = map[string]UnitState{}
		return
	}
	stale := 0
	for _, u := range names {
		st := c.states[u]
		s, ok := got[u]
		if !ok || s.LoadState != st.LoadState || s.ActiveState != st.ActiveState || s.SubState != st.SubState {
			c.dropState(u, touch)
			stale++
		}
	}
	if stale > 0 {
		c.log.Debug("resync: unit states changed without a signal", "units", stale)
	}
}

// afterExecute forgets what the loop's own actions changed: the files it
// wrote or removed and the units they belong to (and their instances), and
// the units it enabled, disabled, reset or reloaded. all says it forgot
// everything (dropPath).
func (c *cache) afterExecute(plan []Action, reloaded bool, instances map[string][]string, touch func(unit string)) (all bool) {
	// Kept before they are forgotten: the states of the units whose new
	// files the reload loads, for refreshReloaded.
	before := map[string]UnitState{}
	keep := func(u string) {
		if st, ok := c.states[u]; ok && st.LoadState == "loaded" && !st.NeedDaemonReload {
			before[u] = st
		}
	}
	for _, act := range plan {
		if reloaded && len(act.Steps.Writes) > 0 && !act.Steps.Enable && !act.Steps.Disable && !act.Steps.ResetFailed {
			keep(act.Unit)
			for _, n := range instances[act.Unit] {
				keep(n)
			}
		}
	}
	for _, act := range plan {
		touched := act.Steps.Enable || act.Steps.Disable || act.Steps.ResetFailed
		if act.Steps.Enable || act.Steps.Disable {
			delete(c.fileStates, act.Unit)
		}
		for _, w := range act.Steps.Writes {
			all = c.dropPath(w.Path, instances, touch) || all
			touched = true
		}
		for _, p := range act.Steps.Removes {
			all = c.dropPath(p, instances, touch) || all
			touched = true
		}
		if touched || (reloaded && act.Changes()) {
			c.dropUnit(act.Unit, instances[act.Unit], touch)
		}
	}
	if reloaded {
		// A file edited behind the agent's back is loaded by this reload
		// too: its NeedDaemonReload flips.
		for u, st := range c.states {
			if st.NeedDaemonReload {
				c.dropState(u, touch)
			}
		}
	}
	for u, st := range before {
		if _, read := c.states[u]; !read {
			c.reloaded[u] = st
		}
	}
	return all
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
func (c *cache) refreshReloaded(ctx context.Context, need []string, desired map[string]*DesiredUnit, managedOf func(unit string) iter.Seq2[string, Owned]) []string {
	if len(c.reloaded) == 0 {
		return need
	}
	defer clear(c.reloaded) // good for the round after the reload only
	var names []string
	for _, u := range need {
		if _, ok := c.reloaded[u]; ok {
			names = append(names, u)
		}
	}
	if len(names) == 0 {
		return need
	}
	got, err := c.sd.Summaries(ctx, names)
	if err != nil {
		return need
	}
	rest := need[:0]
	for _, u := range need {
		old, ok := c.reloaded[u]
		s, listed := got[u]
		if !ok || !listed || s.LoadState != "loaded" || s.ActiveState != old.ActiveState || s.SubState != old.SubState ||
			needsFileState(u, desired[u], c.fileStates[u]) || !c.asWritten(u, managedOf) {
			rest = append(rest, u)
			continue
		}
		old.NeedDaemonReload, old.Light = false, true
		c.keepState(u, old)
	}
	return rest
}

// afterJobs runs once the pass's jobs are started (inFlight: those in
// flight). A
// Light state (refreshReloaded, prefetch) served to plan this pass only: a
// unit it planned no job for is read in full at the next round (a job's
// unit is read in full when the job ends).
func (c *cache) afterJobs(inFlight map[string]*jobRun, touch func(unit string)) {
	for u := range c.light {
		if _, inflight := inFlight[u]; !inflight && c.states[u].Light {
			c.dropState(u, touch)
		}
	}
	clear(c.light)
}

// readWorkers bounds the state reads prefetch has in flight at once.
const readWorkers = 8

// prefetch reads the states of units the cache does not hold, several at a
// time: systemd answers one call after another, but the round trips and the
// agent's decoding overlap. Units systemd does not know at all need no full
// read: when many are missing, one listing (Systemd.Summaries) finds those. At the
// first sync of 1,000 new units the states were read one by one, twice
// (before and after the daemon-reload): seconds of waiting. desired and
// managedOf are what the registry wants and what the agent manages.
func (c *cache) prefetch(ctx context.Context, units map[string]bool, desired map[string]*DesiredUnit, managedOf func(unit string) iter.Seq2[string, Owned]) error {
	var need []string
	for u := range units {
		if IsTemplate(u) || ValidateUnitName(u) != nil {
			continue
		}
		if _, ok := c.states[u]; !ok {
			need = append(need, u)
		}
	}
	need = c.refreshReloaded(ctx, need, desired, managedOf)
	if len(need) < 2 {
		return nil // observe reads it
	}
	if len(need) > readWorkers {
		if got, err := c.sd.Summaries(ctx, need); err == nil {
			rest := need[:0]
			for _, u := range need {
				s, ok := got[u]
				switch {
				case ok && s.LoadState == "not-found":
					c.keepState(u, UnitState{LoadState: s.LoadState, ActiveState: s.ActiveState, SubState: s.SubState,
						LoadError: "Unit " + u + " not found."})
				case ok && c.unknown[u] && s.LoadState == "loaded" && s.ActiveState == "inactive" && s.SubState == "dead":
					c.keepState(u, UnitState{LoadState: s.LoadState, ActiveState: s.ActiveState, SubState: s.SubState, Light: true})
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
		readers[i] = c.stateReader(u, desired[u])
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
		c.keepState(u, states[i])
	}
	return nil
}
