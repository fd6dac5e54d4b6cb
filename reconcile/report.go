package reconcile

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
)

// report builds the status of every unit the pass planned (every unit
// after a full pass), keeps the others' as they were, and hands the whole
// set to the publisher (which writes to the registry only what changed, off
// the loop). A status keeps its UpdatedAt until it changes; when none
// changed the set handed out before is handed out again.
func (a *Agent) report(ctx context.Context) error {
	units := a.view.reported()
	full := units == nil
	if full {
		units = a.view.everyUnit()
	}
	changed := map[string]*Status{} // nil: the unit has no status any more
	for name := range units {
		_, had := a.statuses.index[name]
		if !a.view.hasStatus(name) {
			if had {
				changed[name] = nil
			}
			a.ledger.forgetOutcome(name)
			continue
		}
		s, err := a.status(ctx, name)
		if err != nil {
			return err
		}
		if had && sameStatus(a.statuses.list[a.statuses.index[name]], s) {
			continue
		}
		changed[name] = &s
	}
	if full {
		for name := range a.statuses.index {
			if !units[name] {
				changed[name] = nil
				a.ledger.forgetOutcome(name)
			}
		}
	}
	if a.cfg.CheckFocus && !full {
		if err := a.checkStatuses(ctx, changed); err != nil {
			return err
		}
	}
	// The pass acted on the snapshot it planned from (a newer one may
	// have come in since: the next pass acts on that).
	acted := a.view.revision()
	if len(changed) > 0 || a.statuses.list == nil || acted != a.acted {
		a.statuses.update(changed)
		if a.pub != nil {
			a.gen = a.pub.offer(acted, a.statuses.list)
		}
		a.acted = acted
	}
	a.hand.mu.Lock()
	a.hand.statuses = a.statuses.list
	if a.hand.snap != nil {
		a.hand.revision = a.hand.snap.Revision
	}
	rev := a.hand.revision
	a.hand.mu.Unlock()
	a.cfg.Observer.Reported(rev, a.statuses.list)
	return nil
}

// statusList is every unit's last status, sorted by unit, as last handed
// out (never written to once handed out); index says where each unit's is.
type statusList struct {
	list  []Status
	index map[string]int
}

// update makes a new list of statuses with changed applied (the old one
// may still be published or read: it is never written to).
func (f *statusList) update(changed map[string]*Status) {
	replace := true
	for name, s := range changed {
		if _, ok := f.index[name]; !ok || s == nil {
			replace = false
			break
		}
	}
	if replace {
		list := slices.Clone(f.list)
		for name, s := range changed {
			list[f.index[name]] = *s
		}
		f.list = list
		return
	}
	list := make([]Status, 0, len(f.list)+len(changed))
	for _, s := range f.list {
		if _, ok := changed[s.Unit]; !ok {
			list = append(list, s)
		}
	}
	for _, s := range changed {
		if s != nil {
			list = append(list, *s)
		}
	}
	slices.SortFunc(list, func(x, y Status) int { return strings.Compare(x.Unit, y.Unit) })
	f.list = list
	f.index = make(map[string]int, len(list))
	for i, s := range list {
		f.index[s.Unit] = i
	}
}

// sameStatus says two statuses differ at most in UpdatedAt.
func sameStatus(x, y Status) bool {
	x.UpdatedAt, y.UpdatedAt = time.Time{}, time.Time{}
	return reflect.DeepEqual(x, y)
}

// status builds one unit's status from what the loop knows of it: the
// pass's action for it, what is on disk and what systemd says of it (the
// view), its job in flight and what the ledger remembers (unitStatus).
func (a *Agent) status(ctx context.Context, name string) (Status, error) {
	in := statusInput{
		Unit:    name,
		Desired: a.view.desiredUnit(name),
		Action:  a.view.action(name),
		Now:     time.Now().UTC(),
	}
	in.Hash, in.DropIns = a.view.onDisk(name)
	if ValidateUnitName(name) == nil {
		st, err := a.view.state(ctx, name)
		if err != nil {
			return Status{}, err
		}
		in.State = &st
	}
	if j, ok := a.jobs.inflight[name]; ok {
		in.Job = &j.act
	}
	if o, ok := a.ledger.last[name]; ok {
		in.Last = &o
	}
	in.Record, in.Verifying, in.EnableErr = a.ledger.records[name], a.ledger.verifying(name), a.ledger.enableErr[name]
	return unitStatus(in), nil
}

// checkStatuses (Config.CheckFocus) builds the status of every unit the
// pass did not report on and panics if it differs from the one kept.
func (a *Agent) checkStatuses(ctx context.Context, changed map[string]*Status) error {
	reported := a.view.reported()
	for u := range a.view.everyUnit() {
		if reported[u] || !a.view.hasStatus(u) {
			continue
		}
		now, err := a.status(ctx, u)
		if err != nil {
			return err
		}
		i, ok := a.statuses.index[u]
		if _, c := changed[u]; c || !ok || !sameStatus(a.statuses.list[i], now) {
			var kept Status
			if ok {
				kept = a.statuses.list[i]
			}
			panic(fmt.Sprintf("focus check: %s was left out of the report but its status is another now:\n kept %+v\n  now %+v", u, kept, now))
		}
	}
	return nil
}
