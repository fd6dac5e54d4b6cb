package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// maxRounds bounds the plan → execute rounds of one pass. A round that
// changes files ends with the daemon-reload and the next round plans again
// from what systemd then says (a unit it refuses to load, the jobs to run);
// a round without a reload runs the jobs. Normally two rounds.
const maxRounds = 3

// pass observes, judges health, plans and executes, in rounds, then
// persists and reports. It returns the first round's plan: what the pass
// decided.
func (a *Agent) pass(ctx context.Context) ([]Action, error) {
	t0 := time.Now()
	var first []Action
	var applyErr error
	a.view.beginPass()
	for round := 0; round < maxRounds; round++ {
		a.drainResults(ctx)
		a.expireConfirms() // before observing: a change put back is planned this round
		tr := time.Now()
		desired, units, look, cur, err := a.view.observe(ctx)
		tObserved := time.Now()
		if errors.Is(err, ErrNoRegistry) {
			return nil, nil // nothing known yet: touch nothing
		}
		if err != nil {
			a.view.lookAtAll() // what this round took to look at was not looked at
			return nil, err
		}
		failures := a.judge(cur)
		a.view.remember(&cur, look)
		plan := Plan(desired, cur)
		plan, cur = a.slots.recheck(ctx, failures, desired, cur, plan)
		a.view.planned(units, plan)
		a.probes.follow(plan, look, cur)
		if a.cfg.CheckFocus && units != nil {
			all := a.view.everyUnit()
			full, err := a.view.current(ctx, all)
			if err != nil {
				return nil, err
			}
			a.view.checkFocus(units, full)
		}
		if round == 0 {
			first = plan
			// A unit that runs a version never judged healthy gets its
			// HealthySec window back (ledger.resume).
			for _, act := range a.ledger.resume(plan, cur, time.Now()) {
				a.log.Info(act.Unit+": resuming the health check of a version not yet judged healthy", "unit", act.Unit, "healthy_sec", act.Policy.Healthy.Seconds())
			}
			a.confirms.resume(plan, a.ledger.records, a.jobs.running)
		}
		tPlanned := time.Now()
		more, err := a.execute(ctx, plan, cur, round == maxRounds-1)
		a.log.Debug("round", "n", round, "units", len(look), "observe", tObserved.Sub(tr), "plan", tPlanned.Sub(tObserved), "execute", time.Since(tPlanned))
		if err != nil || !more {
			applyErr = err
			break
		}
	}
	a.keepBlobs()
	if err := a.persist(); err != nil {
		// The pass stands: what it did is done, and a later pass saves
		// the records it could not.
		a.log.Error("persist the pass", "err", err)
	}
	t1 := time.Now()
	reportErr := a.report(ctx)
	a.facts.update(a.managed.paths, a.ledger.refused, a.ledger.records)
	a.view.endPass()
	a.launchProbes(ctx)
	a.confirms.tryIfDue(ctx)
	a.log.Debug("pass", "apply", t1.Sub(t0), "report", time.Since(t1))
	err := errors.Join(applyErr, reportErr)
	if err != nil {
		a.view.lookAtAll() // the next pass looks at every unit again
	}
	return first, err
}

// judge ends the HealthySec windows Health has a verdict for (ledger.judge)
// and says so. To judge, in this package, is this alone: to give a unit's
// HealthySec window Health's verdict (healthy, unhealthy, unknown); a
// status's standing is StandingOf, a host's progress Expectation.Assess, a
// confirmation ConfirmationAt. healthy units are logged; unknown ones are shown as they
// are; the planner rolls a failure back next. It returns the failures,
// whose rollouts the gate halts.
func (a *Agent) judge(cur Current) (failures []judged) {
	for _, j := range a.ledger.judge(cur.Host.Units, a.probes.stateOf, time.Now()) {
		w, u := j.w, j.w.act.Unit
		switch j.verdict {
		case VerdictHealthy:
			a.log.Info(u+": healthy — "+j.why, "unit", u, "healthy_sec", w.act.Policy.Healthy.Seconds(), "action", "healthy")
		case VerdictUnknown:
			a.recordAs(w.act, w.op.Word(), ResultUnknown, errors.New(j.why))
		case VerdictUnhealthy:
			failures = append(failures, j)
			a.confirms.forget(u) // a failed change awaits no confirmation
			if j.template != "" {
				a.view.touch(j.template)
			}
			if why := rollbackWhyNot(w.act.Policy, j.rec); why != "" {
				a.recordAs(w.act, w.op.Word(), ResultFailed, errors.New(j.why+"; "+why))
			} else {
				// Not final: the next round of this pass rolls it back.
				a.recordAs(w.act, ActionRollingBack, ResultPending, errors.New(j.why))
			}
		}
	}
	return failures
}

// drainResults takes the job and probe results that are waiting, so a
// pass judges from the newest knowledge.
func (a *Agent) drainResults(ctx context.Context) {
	for {
		select {
		case r := <-a.jobs.done:
			a.finish(ctx, r)
		case r := <-a.probes.done:
			a.probeDone(r)
		case r := <-a.confirms.done:
			a.confirmed(ctx, r)
		default:
			return
		}
	}
}

// launchProbes starts the probe rounds that are due (probes.launchDue):
// on units systemd says are active (as the view last saw them) with no
// job of the agent's in flight.
func (a *Agent) launchProbes(ctx context.Context) {
	a.probes.launchDue(ctx, time.Now(), func(u string) bool {
		if a.jobs.running(u) {
			return false
		}
		st, err := a.view.state(ctx, u)
		return err == nil && st.ActiveState == "active"
	})
}

// probeDone takes a probe round's result (probes.take), the unit looked
// at again when its status changed. It says whether a pass is owed.
func (a *Agent) probeDone(r probeResult) bool {
	changed, pass := a.probes.take(r, a.ledger.verifying(r.unit))
	if changed {
		a.view.touch(r.unit)
	}
	return pass
}

// confirmed takes a try of the Confirmer (confirms.take) and tells the
// ledger of the changes it confirmed, each unit looked at again. It says
// whether a pass is owed (a status changed).
func (a *Agent) confirmed(ctx context.Context, r ConfirmTry) bool {
	units := a.confirms.take(ctx, r)
	for _, u := range units {
		a.ledger.confirmed(u)
		a.view.touch(u)
	}
	return len(units) > 0
}

// expireConfirms ends the windows whose ConfirmSec= ran out unconfirmed
// (confirms.expire): each change is a failure (ledger.unconfirmed) that
// the planner of this round rolls back, its unit touched so the round
// plans it. It runs before the round observes.
func (a *Agent) expireConfirms() {
	for _, x := range a.confirms.expire(time.Now()) {
		rec, template := a.ledger.unconfirmed(x.act, x.reason)
		a.view.touch(x.act.Unit)
		if template != "" {
			a.view.touch(template)
		}
		if why := rollbackWhyNot(x.act.Policy, rec); why != "" {
			a.recordAs(x.act, x.act.Kind.Word(), ResultFailed, errors.New(x.reason+"; "+why))
		} else {
			// Not final: this round's plan rolls it back.
			a.recordAs(x.act, ActionRollingBack, ResultPending, errors.New(x.reason))
		}
	}
}

// persist saves the records that changed, in one write (ledger.save).
// Only the records of units this pass planned, or touched for the next,
// can have changed; after a pass over every unit all are compared, and
// blobs nothing refers to any more are dropped. A failed save skips the
// clean-up.
func (a *Agent) persist() error {
	units := a.view.changedUnits() // nil: all
	full := units == nil
	if err := a.ledger.save(units); err != nil {
		return err
	}
	if !full {
		return nil
	}
	a.view.pruneKept()
	return a.ledger.gc()
}

// record notes act's outcome in the ledger, tells the Observer and logs
// it; recordAs under another action word than act's kind.
func (a *Agent) record(act Action, result ResultWord, err error) {
	a.recordAs(act, act.Kind.Word(), result, err)
}

func (a *Agent) recordAs(act Action, action ActionWord, result ResultWord, err error) {
	o := outcome{action: action, result: result, contentKey: act.ContentKey}
	if err != nil {
		o.err = err.Error()
	}
	a.ledger.setOutcome(act.Unit, o)
	a.cfg.Observer.Action(act.Unit, act.Kind, string(result))
	log := a.log.With("unit", act.Unit, "action", action, "result", result)
	if act.Reason != "" {
		log = log.With("reason", act.Reason)
	}
	if h := actionHash(act); h != "" {
		log = log.With("hash", short(h))
	}
	// The message names the unit and says why: in the journal it is read
	// alone (journalctl -u <unit> shows it among the unit's own lines).
	msg := func(what, detail string) string {
		if detail == "" {
			return act.Unit + ": " + what
		}
		return act.Unit + ": " + what + " — " + detail
	}
	errText := ""
	if err != nil {
		errText = err.Error()
	}
	switch {
	case err != nil && result == ResultBlocked:
		log.Warn(msg("not applied", errText), "err", err)
	case action == ActionRolledBack:
		log.Error(msg("change rolled back", errText), "err", err)
	case action == ActionRollingBack:
		log.Error(msg("change failed, rolling back", errText), "err", err)
	case result == ResultUnknown:
		log.Warn(msg(string(action)+": outcome unknown", errText), "err", err)
	case err != nil:
		log.Error(msg(string(action)+" failed", errText), "err", err)
	default:
		log.Info(msg(actionMessage(act), act.Reason))
	}
}

// finish takes a job's result: it records what the unit now runs (only now
// that the outcome is known) and opens its HealthySec window. A result of a
// job that a newer one replaced is dropped.
func (a *Agent) finish(ctx context.Context, r jobResult) {
	run := a.jobs.inflight[r.unit]
	if run == nil || run.id != r.id {
		a.log.Debug("result of a replaced job ignored", "unit", r.unit, "err", r.err)
		return
	}
	delete(a.jobs.inflight, r.unit)
	a.view.touch(r.unit)
	defer a.cfg.Pause(ctx, "job-done")                      // crash tests: the job ended, its outcome not yet recorded
	fresh := a.handoff.jobEnded(r.unit, r.muted) && r.fresh // no signal since the read
	// The job changed the unit, and its signals were not passed on: what
	// was read right after the job ended is the state to plan from, unless
	// a signal came after that read.
	if fresh {
		a.view.keepState(r.unit, r.base)
	} else {
		a.view.dropState(r.unit)
	}
	act := run.act
	a.ledger.jobEnded(r.unit, act.ContentKey)
	outcome := OutcomeOf(r.err)
	result := resultOf(r.err)
	switch {
	case act.Steps.Job == JobStop:
		a.record(act, result, r.err)
		return
	case act.Kind == KindRollback:
		rec := a.ledger.rolledBack(act, act.Steps.Job, a.view.manager())
		a.cfg.Observer.Rollback(r.unit)
		if rec.FailedOp == confirmOp {
			a.cfg.Observer.ControlPlaneRollback(r.unit)
		}
		msg := rec.FailReason + "; rolled back to " + short(headHash(r.unit, act.Record.Effective)) + " (the version that ran before)"
		if r.err != nil {
			a.recordAs(act, ActionRolledBack, ResultFailed, fmt.Errorf("%s; restarting it failed: %w", msg, r.err))
			return
		}
		a.recordAs(act, ActionRolledBack, ResultDone, errors.New(msg))
		return
	}
	if act.Record.Effective == nil {
		a.record(act, result, r.err)
		return
	}
	change := a.ledger.applied(act, act.Steps.Job, a.view.manager())
	// Before the HealthySec window: it keeps what ran before.
	if a.confirms.await(act, change, a.ledger.records[act.Unit], r.ended) {
		a.ledger.markConfirming(act.Unit, act.ContentKey)
	}
	if outcome == JobDone {
		a.record(act, ResultDone, nil)
	} else {
		a.log.Debug("job did not finish done; judging the unit", "unit", r.unit, "job", act.Steps.Job.String(), "result", result, "err", r.err)
	}
	errText := ""
	if r.err != nil {
		errText = r.err.Error()
	}
	a.ledger.begin(act, outcome, errText, r.base, r.ended)
}
