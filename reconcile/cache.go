package reconcile

import (
	"context"
	"fmt"
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
//     call (Summarizer) — or forgets everything when systemd cannot do that.
//
// Everything is forgotten at start, after a reconnect to systemd ("") and
// after a failed pass.

// Summarizer is an optional capability of Systemd: the load, active and
// sub state of many units in one call (ListUnitsByNames), for the resync.
type Summarizer interface {
	Summaries(ctx context.Context, units []string) (map[string]UnitSummary, error)
}

// UnitSummary is the part of a unit's state systemd lists for many units at
// once. A change in any other property of interest comes with a change in
// one of these (and a signal).
type UnitSummary struct {
	LoadState, ActiveState, SubState string
}

// cache is the loop's memory of systemd's and the disk's view. Loop-owned.
type cache struct {
	states map[string]UnitState
	files  map[string]LocalFile
}

func newCache() cache {
	return cache{states: map[string]UnitState{}, files: map[string]LocalFile{}}
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
func (a *Agent) takeDirty() {
	a.hand.mu.Lock()
	d := a.hand.dirty
	a.hand.dirty = dirty{}
	a.hand.mu.Unlock()
	if d.all {
		a.forgetAll()
		return
	}
	for u := range d.units {
		a.forgetUnit(u)
	}
	for p := range d.paths {
		a.forgetPath(p)
	}
	// A unit inside HealthySec is read again when its window ends: the
	// verdict rests on what systemd says then. Before that its signals say
	// when it changed (every change health looks at — a restart, an exit, a
	// new Result — moves ActiveState or SubState), and a finished job
	// forgets its unit (finish). Reading every judged unit on every pass
	// made the first sync of 1,000 units cost seconds of D-Bus decoding.
	now := time.Now()
	for u, w := range a.verify {
		if !now.Before(w.deadline()) {
			delete(a.cache.states, u)
		}
	}
}

func (a *Agent) forgetAll() { a.cache = newCache() }

// forgetUnit drops a unit's state; for a template (its file or a drop-in of
// it changed) every instance's too.
func (a *Agent) forgetUnit(u string) {
	delete(a.cache.states, u)
	if IsTemplate(u) {
		for n := range a.cache.states {
			if IsInstance(n) && TemplateOf(n) == u {
				delete(a.cache.states, n)
			}
		}
	}
}

// forgetPath drops a file (or, for a drop-in directory, every file in it)
// and the state of the unit it belongs to: systemd's NeedDaemonReload
// changes with it.
func (a *Agent) forgetPath(p string) {
	if p == "" {
		a.forgetAll()
		return
	}
	delete(a.cache.files, p)
	dir := p + "/"
	for q := range a.cache.files {
		if strings.HasPrefix(q, dir) {
			delete(a.cache.files, q)
		}
	}
	u := UnitOfPath(p)
	if strings.HasSuffix(p, ".d") && !strings.Contains(p, "/") {
		u = strings.TrimSuffix(p, ".d")
	}
	if (ValidateUnitName(u) != nil && !IsTemplate(u)) || strings.Contains(u, "-.") {
		// A drop-in directory for a whole type (service.d/) or a prefix
		// (foo-.service.d/), or a name we do not know: anything may have
		// changed.
		a.forgetAll()
		return
	}
	a.forgetUnit(u)
}

// file reads a file in the unit directory, from the cache when nothing said
// it changed.
func (a *Agent) file(p string) LocalFile {
	if lf, ok := a.cache.files[p]; ok {
		return lf
	}
	b, exists, err := a.cfg.Files.Read(p)
	lf := LocalFile{Exists: exists}
	switch {
	case err != nil:
		lf.Err = err.Error()
		return lf // not kept: read again next time
	case exists:
		lf.Hash, lf.Content = Hash(b), b
	}
	a.cache.files[p] = lf
	return lf
}

// resyncCache is the periodic safety net: every file is read again, and
// every unit whose summary differs from what the cache holds is forgotten
// (all of them when systemd cannot summarize).
func (a *Agent) resyncCache(ctx context.Context) {
	a.cache.files = map[string]LocalFile{}
	sum, ok := a.cfg.Systemd.(Summarizer)
	if !ok || len(a.cache.states) == 0 {
		a.cache.states = map[string]UnitState{}
		return
	}
	names := make([]string, 0, len(a.cache.states))
	for u := range a.cache.states {
		if !IsTemplate(u) {
			names = append(names, u)
		}
	}
	got, err := sum.Summaries(ctx, names)
	if err != nil {
		a.log.Debug("resync: unit summaries unavailable; reading every unit", "err", err)
		a.cache.states = map[string]UnitState{}
		return
	}
	stale := 0
	for _, u := range names {
		st := a.cache.states[u]
		s, ok := got[u]
		if !ok || s.LoadState != st.LoadState || s.ActiveState != st.ActiveState || s.SubState != st.SubState {
			delete(a.cache.states, u)
			stale++
		}
	}
	if stale > 0 {
		a.log.Debug("resync: unit states changed without a signal", "units", stale)
	}
}

// afterExecute forgets what the loop's own actions changed: the files it
// wrote or removed and the units they belong to, and the units it enabled,
// disabled, reset or reloaded.
func (a *Agent) afterExecute(plan []Action, reloaded bool) {
	for _, act := range plan {
		touched := act.Enable || act.Disable || act.ResetFailed
		for _, w := range act.Writes {
			a.forgetPath(w.Path)
			touched = true
		}
		for _, p := range act.Removes {
			a.forgetPath(p)
			touched = true
		}
		if touched || (reloaded && act.Changes()) {
			a.forgetUnit(act.Unit)
		}
	}
	if reloaded {
		// A file edited behind the agent's back is loaded by this reload
		// too: its NeedDaemonReload flips.
		for u, st := range a.cache.states {
			if st.NeedDaemonReload {
				delete(a.cache.states, u)
			}
		}
	}
}

// readWorkers bounds the state reads prefetch has in flight at once.
const readWorkers = 8

// prefetch reads the states of units the cache does not hold, several at a
// time: systemd answers one call after another, but the round trips and the
// agent's decoding overlap. Units systemd does not know at all need no full
// read: when many are missing, one listing (Summarizer) finds those. At the
// first sync of 1,000 new units the states were read one by one, twice
// (before and after the daemon-reload): seconds of waiting.
func (a *Agent) prefetch(ctx context.Context, units map[string]bool) error {
	var need []string
	for u := range units {
		if IsTemplate(u) || ValidateUnitName(u) != nil {
			continue
		}
		if _, ok := a.cache.states[u]; !ok {
			need = append(need, u)
		}
	}
	if len(need) < 2 {
		return nil // observe reads it
	}
	if sum, ok := a.cfg.Systemd.(Summarizer); ok && len(need) > readWorkers {
		if got, err := sum.Summaries(ctx, need); err == nil {
			rest := need[:0]
			for _, u := range need {
				if s, ok := got[u]; ok && s.LoadState == "not-found" {
					a.cache.states[u] = UnitState{LoadState: s.LoadState, ActiveState: s.ActiveState, SubState: s.SubState,
						LoadError: "Unit " + u + " not found."}
					continue
				}
				rest = append(rest, u)
			}
			need = rest
		}
	}
	states := make([]UnitState, len(need))
	errs := make([]error, len(need))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(readWorkers, len(need)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(need); i = int(next.Add(1) - 1) {
				states[i], errs[i] = a.cfg.Systemd.State(ctx, need[i])
			}
		})
	}
	wg.Wait()
	for i, u := range need {
		if errs[i] != nil {
			return fmt.Errorf("read state of %s: %w", u, errs[i])
		}
		a.cache.states[u] = states[i]
	}
	return nil
}
