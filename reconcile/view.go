package reconcile

import (
	"iter"
	"log/slog"
)

// view is what the loop sees of the host and the registry: the cache of
// systemd's and the disk's state (cache.go), observing a pass's Current
// (observe.go), and which units a pass looks at (focus.go), with the
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
	roots []string // fileRoots(Files): never nil

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
	kept map[string][]byte

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
		sd: cfg.Systemd, files: cfg.Files, man: cfg.Manifest, log: cfg.Log, obs: cfg.Observer, check: cfg.CheckFocus,
		roots: fileRoots(cfg.Files),
		cache: newCache(), focus: newFocus(), mem: memory{drifted: map[string]string{}},
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
