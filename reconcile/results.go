// What comes back to the loop: the jobs' results, the probe rounds, the
// confirm tries, the health verdicts and the confirmations that ran out.

package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// results takes what comes back to the loop from the goroutines it
// started and from the clock, and records it: in the ledger, the view (the
// units to look at again), the confirms and the probes. It decides
// nothing. Loop-owned: the parts it holds are the Agent's.
type results struct {
	ledger   *ledger
	view     *view
	jobs     *jobs
	probes   *probes
	confirms *confirms
	handoff  *handoff
	obs      Observer
	log      *slog.Logger
	pause    func(ctx context.Context, at string) // Config.Pause
	rec      recorder
}

// judge ends the HealthySec windows Health has a verdict for (ledger.judge)
// and says so. To judge, in this package, is this alone: to give a unit's
// HealthySec window Health's verdict (healthy, unhealthy, unknown); a
// status's standing is StandingOf, a host's progress Expectation.Assess, a
// confirmation ConfirmationAt. healthy units are logged; unknown ones are shown as they
// are; the planner rolls a failure back next. It returns the failures,
// whose rollouts the gate halts.
func (rs *results) judge(cur Current) (failures []judged) {
	for _, j := range rs.ledger.judge(cur.Host.Units, rs.probes.stateOf, time.Now()) {
		w, u := j.w, j.w.act.Unit
		switch j.verdict {
		case VerdictHealthy:
			rs.log.Info(u+": healthy — "+j.why, "unit", u, "healthy_sec", w.act.Policy.Healthy.Seconds(), "action", "healthy")
		case VerdictUnknown:
			rs.rec.recordAs(w.act, w.op.Word(), ResultUnknown, errors.New(j.why))
		case VerdictUnhealthy:
			failures = append(failures, j)
			rs.confirms.forget(u) // a failed change awaits no confirmation
			if j.template != "" {
				rs.view.touch(j.template)
			}
			if why := rollbackWhyNot(w.act.Policy, j.rec); why != "" {
				rs.rec.recordAs(w.act, w.op.Word(), ResultFailed, errors.New(j.why+"; "+why))
			} else {
				// Not final: the next round of this pass rolls it back.
				rs.rec.recordAs(w.act, ActionRollingBack, ResultPending, errors.New(j.why))
			}
		}
	}
	return failures
}

// drain takes the job and probe results that are waiting, so a pass
// judges from the newest knowledge.
func (rs *results) drain(ctx context.Context) {
	for {
		select {
		case r := <-rs.jobs.done:
			rs.finish(ctx, r)
		case r := <-rs.probes.done:
			rs.probeDone(r)
		case r := <-rs.confirms.done:
			rs.confirmed(ctx, r)
		default:
			return
		}
	}
}

// launchProbes starts the probe rounds that are due (probes.launchDue):
// on units systemd says are active (as the view last saw them) with no
// job of the agent's in flight.
func (rs *results) launchProbes(ctx context.Context) {
	rs.probes.launchDue(ctx, time.Now(), func(u string) bool {
		if rs.jobs.running(u) {
			return false
		}
		st, err := rs.view.state(ctx, u)
		return err == nil && st.ActiveState == "active"
	})
}

// probeDone takes a probe round's result (probes.take), the unit looked
// at again when its status changed. It says whether a pass is owed.
func (rs *results) probeDone(r probeResult) bool {
	changed, pass := rs.probes.take(r, rs.ledger.verifying(r.unit))
	if changed {
		rs.view.touch(r.unit)
	}
	return pass
}

// confirmed takes a try of the Confirmer (confirms.take) and tells the
// ledger of the changes it confirmed, each unit looked at again. It says
// whether a pass is owed (a status changed).
func (rs *results) confirmed(ctx context.Context, r ConfirmTry) bool {
	units := rs.confirms.take(ctx, r)
	for _, u := range units {
		rs.ledger.confirmed(u)
		rs.view.touch(u)
	}
	return len(units) > 0
}

// expireConfirms ends the windows whose ConfirmSec= ran out unconfirmed
// (confirms.expire): each change is a failure (ledger.unconfirmed) that
// the planner of this round rolls back, its unit touched so the round
// plans it. It runs before the round observes.
func (rs *results) expireConfirms() {
	for _, x := range rs.confirms.expire(time.Now()) {
		rec, template := rs.ledger.unconfirmed(x.act, x.reason)
		rs.view.touch(x.act.Unit)
		if template != "" {
			rs.view.touch(template)
		}
		if why := rollbackWhyNot(x.act.Policy, rec); why != "" {
			rs.rec.recordAs(x.act, x.act.Kind.Word(), ResultFailed, errors.New(x.reason+"; "+why))
		} else {
			// Not final: this round's plan rolls it back.
			rs.rec.recordAs(x.act, ActionRollingBack, ResultPending, errors.New(x.reason))
		}
	}
}

// finish takes a job's result: it records what the unit now runs (only now
// that the outcome is known) and opens its HealthySec window. A result of a
// job that a newer one replaced is dropped.
func (rs *results) finish(ctx context.Context, r jobResult) {
	run := rs.jobs.inflight[r.unit]
	if run == nil || run.id != r.id {
		rs.log.Debug("result of a replaced job ignored", "unit", r.unit, "err", r.err)
		return
	}
	delete(rs.jobs.inflight, r.unit)
	rs.view.touch(r.unit)
	defer rs.pause(ctx, "job-done")                          // crash tests: the job ended, its outcome not yet recorded
	fresh := rs.handoff.jobEnded(r.unit, r.muted) && r.fresh // no signal since the read
	// The job changed the unit, and its signals were not passed on: what
	// was read right after the job ended is the state to plan from, unless
	// a signal came after that read.
	if fresh {
		rs.view.keepState(r.unit, r.base)
	} else {
		rs.view.dropState(r.unit)
	}
	act := run.act
	rs.ledger.jobEnded(r.unit, act.ContentKey)
	outcome := OutcomeOf(r.err)
	result := resultOf(r.err)
	switch {
	case act.Steps.Job == JobStop:
		rs.rec.record(act, result, r.err)
		return
	case act.Kind == KindRollback:
		rec := rs.ledger.rolledBack(act, act.Steps.Job, rs.view.manager())
		rs.obs.Rollback(r.unit)
		if rec.FailedOp == confirmOp {
			rs.obs.ControlPlaneRollback(r.unit)
		}
		msg := rec.FailReason + "; rolled back to " + short(headHash(r.unit, act.Record.Effective)) + " (the version that ran before)"
		if r.err != nil {
			rs.rec.recordAs(act, ActionRolledBack, ResultFailed, fmt.Errorf("%s; restarting it failed: %w", msg, r.err))
			return
		}
		rs.rec.recordAs(act, ActionRolledBack, ResultDone, errors.New(msg))
		return
	}
	if act.Record.Effective == nil {
		rs.rec.record(act, result, r.err)
		return
	}
	change := rs.ledger.applied(act, act.Steps.Job, rs.view.manager())
	// Before the HealthySec window: it keeps what ran before.
	if rs.confirms.await(act, change, rs.ledger.records[act.Unit], r.ended) {
		rs.ledger.markConfirming(act.Unit, act.ContentKey)
	}
	if outcome == JobDone {
		rs.rec.record(act, ResultDone, nil)
	} else {
		rs.log.Debug("job did not finish done; judging the unit", "unit", r.unit, "job", act.Steps.Job.String(), "result", result, "err", r.err)
	}
	errText := ""
	if r.err != nil {
		errText = r.err.Error()
	}
	rs.ledger.begin(act, outcome, errText, r.base, r.ended)
}
