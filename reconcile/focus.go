package reconcile

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
)

// A pass plans and reports only the units something touched, not every unit
// the host runs: with 5,000 managed units, planning and reporting every one
// of them made a signal for one unit cost 60 ms of the agent's CPU. Plan is
// a function of each unit's own inputs (its desired value, files, state,
// record, jobs, window, slot, halt) and of its template's and instances',
// so a unit none of those changed for would be planned as before. The loop
// therefore keeps each unit's last status (reports), and which units'
// last action was not idle, and looks at:
//
//   - every unit, at start, after everything was forgotten (a reconnect to
//     systemd, a failed pass, `agentd sync`) and at the periodic resync;
//   - the units something touched since their last plan: a signal, a file,
//     a job's end, a verdict, the end of a HealthySec window, a changed
//     registry value or halt (touch, and dropState);
//   - the units whose last action was not idle (a wait, a job to run, a
//     change to write: planned again until it is done), the units with a
//     job in flight, inside HealthySec or owed by the intent — so a
//     MaxUnavailable slot, which matters only to those, needs no touch;
//   - with each of those, its template and the template's instances.
//
// Config.CheckFocus (tests) plans every unit beside each focused plan and
// panics when a unit outside the focus would have been planned differently.

// focus is what the loop keeps between passes to look only at what changed.
// Loop-owned.
type focus struct {
	all     bool            // the next round looks at every unit
	touched map[string]bool // units to plan again at the next round
	busy    map[string]bool // units whose last action was not idle
	// actions holds the actions of the units planned this pass (of
	// every unit planned since start under Config.CheckFocus, which
	// compares them).
	actions map[string]Action
	halts   map[string]Halt
	// instances maps a template to its instances among the units known,
	// rebuilt with them (a new instance comes only with a new snapshot).
	instances map[string][]string
	// reported collects the units a pass planned, over its rounds: the
	// ones whose status is built again.
	reported map[string]bool
}

func newFocus() focus {
	return focus{all: true, touched: map[string]bool{}, busy: map[string]bool{}, actions: map[string]Action{},
		halts: map[string]Halt{}, instances: map[string][]string{}, reported: map[string]bool{}}
}

// touch makes the next round plan unit again.
func (f *focus) touch(unit string) { f.touched[unit] = true }

// idle says an action does nothing and waits for nothing: planned again
// from the same inputs it would be the same idle action, so the unit can be
// left out of passes until something touches it.
func idle(act Action) bool {
	return act.Kind == KindNone && !act.Changes() && len(act.Steps.Forget) == 0 && act.Steps.Job == JobNone &&
		!act.Steps.Enable && !act.Steps.Disable && !act.Record.Adopt && act.Record.Refuse == nil && !act.Record.DropRecord && !act.Steps.ResetFailed
}

// units returns the units this round looks at, nil for all of them: those
// touched, those busy, those inside HealthySec (verifying), with a job in
// flight (inFlight) or owed one (owed: Intent.Jobs), and their templates'
// and instances'. It takes what was touched: a later touch is for the next
// round.
func (f *focus) units(verifying map[string]*window, inFlight map[string]*jobRun, owed map[string]string) map[string]bool {
	if f.all {
		f.all = false
		clear(f.touched)
		return nil
	}
	units := f.touched
	f.touched = map[string]bool{}
	for u := range f.busy {
		units[u] = true
	}
	for u := range verifying {
		units[u] = true
	}
	for u := range inFlight {
		units[u] = true
	}
	for u := range owed {
		units[u] = true
	}
	for u := range units {
		if IsInstance(u) {
			units[TemplateOf(u)] = true
		}
	}
	for u := range units {
		if IsTemplate(u) {
			for _, i := range f.instances[u] {
				units[i] = true
			}
		}
	}
	return units
}

// indexInstances rebuilds the template → instances index from units.
func (f *focus) indexInstances(units map[string]bool) {
	f.instances = map[string][]string{}
	for u := range units {
		if IsInstance(u) {
			t := TemplateOf(u)
			f.instances[t] = append(f.instances[t], u)
		}
	}
}

// newSnapshot touches the units whose desired value or halt differs
// between two desires of the registry. It says whether a unit came or went.
func (f *focus) newSnapshot(changes []desiredChange, halts map[string]Halt) (unitsChanged bool) {
	for _, c := range changes {
		if (c.old == nil) != (c.now == nil) {
			unitsChanged = true
		}
		if !sameDesired(c.old, c.now) {
			f.touch(c.name)
		}
	}
	for u, h := range halts {
		if o, ok := f.halts[u]; !ok || !sameHalt(o, h) {
			f.touch(u)
		}
	}
	for u := range f.halts {
		if _, ok := halts[u]; !ok {
			f.touch(u)
		}
	}
	f.halts = halts
	return unitsChanged
}

func sameDesired(x, y *DesiredUnit) bool {
	if x == nil || y == nil {
		return x == y
	}
	sameFile := func(f, g DesiredFile) bool {
		// The revision too: a status says which revision of a key it runs
		// (a put of the same content moves it).
		return f.Path == g.Path && f.Hash == g.Hash && f.Source == g.Source && f.Sealed == g.Sealed && f.Revision == g.Revision
	}
	if x.Name != y.Name || x.Instance != y.Instance || x.Policy != y.Policy || (x.File == nil) != (y.File == nil) ||
		(x.Err == nil) != (y.Err == nil) || len(x.DropIns) != len(y.DropIns) {
		return false
	}
	if x.Err != nil && x.Err.Error() != y.Err.Error() {
		return false
	}
	if x.File != nil && !sameFile(*x.File, *y.File) {
		return false
	}
	for p, f := range x.DropIns {
		if g, ok := y.DropIns[p]; !ok || !sameFile(f, g) {
			return false
		}
	}
	if len(x.Reads) != len(y.Reads) {
		return false
	}
	for p, f := range x.Reads {
		if g, ok := y.Reads[p]; !ok || !sameFile(f, g) {
			return false
		}
	}
	return true
}

func sameHalt(x, y Halt) bool {
	return x.Scope == y.Scope && x.Unit == y.Unit && x.Hash == y.Hash && x.Host == y.Host && x.Reason == y.Reason && x.At.Equal(y.At)
}

// planned keeps a round's plan: units (nil: all) were planned, and those
// of them without an action in plan have none any more.
func (f *focus) planned(units map[string]bool, plan []Action) {
	if units == nil {
		clear(f.actions)
		clear(f.busy)
		f.reported = nil // every unit's status is built
	} else {
		for u := range units {
			delete(f.actions, u)
			delete(f.busy, u)
			if f.reported != nil {
				f.reported[u] = true
			}
		}
	}
	for _, act := range plan {
		f.actions[act.Unit] = act
		if !idle(act) {
			f.busy[act.Unit] = true
		}
	}
}

// check (Config.CheckFocus) plans every unit from everything the loop
// knows (desired, full) and panics if a unit outside the focus (units)
// would get another action than the one kept for it.
func (f *focus) check(units map[string]bool, desired map[string]*DesiredUnit, full Current) {
	plan := Plan(desired, full)
	want := map[string]Action{}
	for _, act := range plan {
		want[act.Unit] = act
	}
	for _, u := range slices.Sorted(maps.Keys(want)) {
		if units[u] {
			continue
		}
		if kept, ok := f.actions[u]; !ok || !reflect.DeepEqual(kept, want[u]) {
			panic(fmt.Sprintf("focus check: %s was left out of the pass but is planned differently now:\n kept %+v\n  now %+v", u, kept, want[u]))
		}
	}
	for u := range f.actions {
		if _, ok := want[u]; !ok && !units[u] {
			panic(fmt.Sprintf("focus check: %s was left out of the pass with an action kept, but has none now", u))
		}
	}
}

// checkDesired (Config.CheckFocus) panics if the desired units kept up
// to date from snapshot to snapshot differ from those built afresh from
// the snapshot (with the same identity for secrets).
// With signatures checked, Desire is the check from the marks as they are
// now: the verdict of a key depends only on its own mark, which only its
// own change moves.
func checkDesired(kept *desiredState, s Snapshot) {
	d := desiredState{secrets: kept.secrets, creds: kept.creds, sealed: kept.sealed}
	if kept.trust != nil {
		d.trust = kept.trust.fresh()
	}
	d.update(s)
	want := d.units
	if !reflect.DeepEqual(kept.units, want) {
		panic(fmt.Sprintf("focus check: the desired units kept differ from those of revision %d:\n kept %+v\n want %+v", s.Revision, kept.units, want))
	}
}
