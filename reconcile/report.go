package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"time"
)

// statusBuilder builds the statuses of a pass from what the loop's parts
// know of each unit (status) and hands them out (report): to the statuses'
// publisher (out) and to the local API (handoff). Loop-owned: the parts it
// holds are the Agent's.
type statusBuilder struct {
	view     *view
	ledger   *ledger
	jobs     *jobs
	probes   *probes
	confirms *confirms
	out      *reports
	handoff  *handoff
	obs      Observer
	check    bool // Config.CheckFocus
}

// report builds the status of every unit the pass planned (every unit
// after a full pass), keeps the others' as they were, and offers the whole
// set to the publisher (which writes to the registry only what changed, off
// the loop). A status keeps its UpdatedAt until it changes; when none
// changed the set handed out before is handed out again.
func (b *statusBuilder) report(ctx context.Context) error {
	units := b.view.reported()
	full := units == nil
	if full {
		units = b.view.everyUnit()
	}
	changed := map[string]*Status{} // nil: the unit has no status any more
	for name := range units {
		_, had := b.out.list.index[name]
		if !b.view.hasStatus(name) {
			if had {
				changed[name] = nil
			}
			b.ledger.forgetOutcome(name)
			continue
		}
		s, err := b.status(ctx, name)
		if err != nil {
			return err
		}
		if had && sameStatus(b.out.list.list[b.out.list.index[name]], s) {
			continue
		}
		changed[name] = &s
	}
	if full {
		for name := range b.out.list.index {
			if !units[name] {
				changed[name] = nil
				b.ledger.forgetOutcome(name)
			}
		}
	}
	if b.check && !full {
		if err := b.checkStatuses(ctx, changed); err != nil {
			return err
		}
	}
	// The pass acted on the snapshot it planned from (a newer one may
	// have come in since: the next pass acts on that).
	list := b.out.offer(b.view.revision(), changed)
	rev := b.handoff.published(list)
	b.obs.Reported(rev, list)
	return nil
}

// status builds one unit's status from what the loop knows of it: the
// pass's action for it, what is on disk and what systemd says of it (the
// view), its job in flight and what the ledger remembers (unitStatus).
func (b *statusBuilder) status(ctx context.Context, name string) (Status, error) {
	in := statusInput{
		Unit:    name,
		Desired: b.view.desiredUnit(name),
		Action:  b.view.action(name),
		Now:     time.Now().UTC(),
	}
	in.Hash, in.DropIns = b.view.onDisk(name)
	if ValidateUnitName(name) == nil {
		st, err := b.view.state(ctx, name)
		if err != nil {
			return Status{}, err
		}
		in.State = &st
	}
	if j, ok := b.jobs.inflight[name]; ok {
		in.Job = &j.act
	}
	if o, ok := b.ledger.last[name]; ok {
		in.Last = &o
	}
	in.Record, in.Verifying, in.EnableErr = b.ledger.records[name], b.ledger.verifying(name), b.ledger.enableErr[name]
	in.Confirming = b.confirms.awaiting(name)
	if t := b.probes.targets[name]; t != nil {
		in.Probes, in.Probe = t.spec, t.state
	}
	return unitStatus(in), nil
}

// checkStatuses (Config.CheckFocus) builds the status of every unit the
// pass did not report on and panics if it differs from the one kept.
func (b *statusBuilder) checkStatuses(ctx context.Context, changed map[string]*Status) error {
	reported := b.view.reported()
	for u := range b.view.everyUnit() {
		if reported[u] || !b.view.hasStatus(u) {
			continue
		}
		now, err := b.status(ctx, u)
		if err != nil {
			return err
		}
		i, ok := b.out.list.index[u]
		if _, c := changed[u]; c || !ok || !sameStatus(b.out.list.list[i], now) {
			var kept Status
			if ok {
				kept = b.out.list.list[i]
			}
			panic(fmt.Sprintf("focus check: %s was left out of the report but its status is another now:\n kept %+v\n  now %+v", u, kept, now))
		}
	}
	return nil
}

// reports is the publish part: every unit's status as last handed out, and
// the publisher that writes them to the registry off the loop.
type reports struct {
	list statusList
	pub  *publisher // nil without a Reporter: statuses are only served locally
	gen  uint64     // the publisher's generation of the last statuses offered
	// acted is the registry revision of the statuses last offered: a pass
	// that changed no status but acted on a newer revision is published
	// too (its pass record moves).
	acted int64
}

func newReports(r Reporter, log *slog.Logger) reports {
	out := reports{list: statusList{index: map[string]int{}}}
	if r != nil {
		out.pub = newPublisher(r, log)
	}
	return out
}

// offer applies changed (nil: the unit has no status any more) to the
// statuses of a pass that acted on registry revision acted, offers them to
// the publisher when they or acted moved, and returns the whole set.
func (r *reports) offer(acted int64, changed map[string]*Status) []Status {
	if len(changed) > 0 || r.list.list == nil || acted != r.acted {
		r.list.update(changed)
		if r.pub != nil {
			r.gen = r.pub.offer(acted, r.list.list)
		}
		r.acted = acted
	}
	return r.list.list
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
