package reconcile

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"
)

// window is a unit after a job, until Health gives a verdict.
type window struct {
	act     Action
	op      Kind // the action that started it, for messages
	outcome JobOutcome
	jobErr  string
	base    UnitState
	ended   time.Time // when the job ended
}

func (w *window) deadline() time.Time {
	return w.ended.Add(w.act.Policy.Healthy)
}

func (a *Agent) nextHealthDeadline() (time.Time, bool) {
	var next time.Time
	for _, w := range a.verify {
		if d := w.deadline(); next.IsZero() || d.Before(next) {
			next = d
		}
	}
	return next, !next.IsZero()
}

// begin opens the HealthySec window of a unit after its job ended. A unit
// not meant to run, or with HealthySec=0 and a job that ended "done", is
// good at once.
func (a *Agent) begin(ctx context.Context, act Action, outcome JobOutcome, jobErr string, base UnitState, ended time.Time) {
	if act.Policy.State != StateStarted || (act.Policy.Healthy == 0 && outcome == JobDone) {
		a.markGood(act.Unit, act.Record.Effective)
		return
	}
	a.verify[act.Unit] = &window{act: act, op: act.Kind, outcome: outcome, jobErr: jobErr, base: base, ended: ended}
}

// judge ends the HealthySec windows Health has a verdict for: healthy units
// become the last good version; unhealthy ones are failures (the planner
// rolls them back); unknown ones are left as they are and shown.
func (a *Agent) judge(ctx context.Context, cur Current) {
	now := time.Now()
	for _, u := range slices.Sorted(maps.Keys(a.verify)) {
		w := a.verify[u]
		st, ok := cur.Host.Units[u]
		if !ok {
			continue
		}
		v, why := Health(HealthInput{
			Unit: u, Healthy: w.act.Policy.Healthy, Op: w.op.String(), Job: w.outcome, JobErr: w.jobErr,
			Base: w.base, Now: st, Elapsed: now.Sub(w.ended),
		})
		switch v {
		case VerdictPending:
			continue
		case VerdictHealthy:
			delete(a.verify, u)
			a.markGood(u, w.act.Record.Effective)
			a.log.Info(u+": healthy — "+why, "unit", u, "healthy_sec", w.act.Policy.Healthy.Seconds(), "action", "healthy")
		case VerdictUnknown:
			delete(a.verify, u)
			a.recordAs(w.act, w.op.Word(), "unknown", errors.New(why))
		case VerdictUnhealthy:
			delete(a.verify, u)
			a.fail(ctx, w, why)
		}
	}
}

// fail records that a change did not take: the content is not retried
// until the registry changes, the group's rollout is halted (before the
// slot is given back), and the planner rolls the unit back next.
func (a *Agent) fail(ctx context.Context, w *window, reason string) {
	u := w.act.Unit
	rec := a.mem.records[u]
	rec.Failed, rec.FailReason, rec.FailedOp = w.act.ContentKey, reason, w.op.String()
	a.mem.records[u] = rec
	// The halt is written now; the slot is given back at the end of the
	// pass (SlotsNeeded), after it.
	a.halt(ctx, SlotKey(u), w.act.Scope, w.act.Hash, reason)
	if w.act.Record.TemplateKey != "" {
		// The template's new content is what failed: hold it too, so the
		// other instances are not moved onto it.
		// What ran before is the template set the other instances stay on
		// (or are restarted back onto, if they had moved).
		t := TemplateOf(u)
		tr := a.mem.records[t]
		tr.Failed, tr.FailReason = w.act.Record.TemplateKey, reason
		old := map[string]string{}
		for p, h := range rec.Previous {
			if UnitOfPath(p) == t {
				old[p] = h
			}
		}
		if len(old) > 0 {
			tr.Applied = old
		}
		a.mem.records[t] = tr
		a.touch(t)
	}
	switch {
	case !w.act.Policy.Rollback:
		a.recordAs(w.act, w.op.Word(), "failed", errors.New(reason+"; Rollback=no: left as it is"))
	case len(rec.Previous) == 0 || KeyOf(rec.Previous) == rec.Failed:
		a.recordAs(w.act, w.op.Word(), "failed", errors.New(reason+"; no earlier version to roll back to"))
	default:
		// Not final: the next round of this pass rolls it back.
		a.recordAs(w.act, ActionRollingBack, "pending", errors.New(reason))
	}
}

func (a *Agent) markGood(u string, effective map[string]string) {
	rec := a.mem.records[u]
	rec.Good, rec.Previous = effective, nil
	rec.Failed, rec.FailReason, rec.FailedOp = "", "", ""
	a.mem.records[u] = rec
}

// resumeVerification reopens the HealthySec window of a unit that runs a
// version never judged healthy — the agent restarted inside the window —
// so that version is still verified (and rolled back if it dies).
func (a *Agent) resumeVerification(plan []Action, cur Current) {
	for _, act := range plan {
		rec := a.mem.records[act.Unit]
		if act.Kind != KindNone || act.Record.Effective == nil || act.Policy.State != StateStarted || act.Policy.Healthy == 0 ||
			len(rec.Applied) == 0 || KeyOf(rec.Applied) != act.ContentKey || KeyOf(rec.Good) == act.ContentKey ||
			!cur.Host.Units[act.Unit].Active() {
			continue
		}
		if _, verifying := a.verify[act.Unit]; verifying {
			continue
		}
		a.log.Info(act.Unit+": resuming the health check of a version not yet judged healthy", "unit", act.Unit, "healthy_sec", act.Policy.Healthy.Seconds())
		act.Kind = KindRestart // what put it there, as far as messages go
		a.verify[act.Unit] = &window{act: act, op: act.Kind, outcome: JobDone, base: cur.Host.Units[act.Unit], ended: time.Now()}
	}
}
