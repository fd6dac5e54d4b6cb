package reconcile

import (
	"errors"
	"time"
)

// judge ends the HealthySec windows Health has a verdict for (ledger.judge)
// and says so: healthy units are logged; unknown ones are shown as they
// are; the planner rolls a failure back next. It returns the failures,
// whose rollouts the gate halts.
func (a *Agent) judge(cur Current) (failures []judged) {
	for _, j := range a.ledger.judge(cur.Host.Units, a.probes.stateOf, time.Now()) {
		w, u := j.w, j.w.act.Unit
		switch j.verdict {
		case VerdictHealthy:
			a.log.Info(u+": healthy — "+j.why, "unit", u, "healthy_sec", w.act.Policy.Healthy.Seconds(), "action", "healthy")
		case VerdictUnknown:
			a.recordAs(w.act, w.op.Word(), "unknown", errors.New(j.why))
		case VerdictUnhealthy:
			failures = append(failures, j)
			a.confirms.forget(u) // a failed change awaits no confirmation
			if j.template != "" {
				a.view.touch(j.template)
			}
			if why := rollbackWhyNot(w.act.Policy, j.rec); why != "" {
				a.recordAs(w.act, w.op.Word(), "failed", errors.New(j.why+"; "+why))
			} else {
				// Not final: the next round of this pass rolls it back.
				a.recordAs(w.act, ActionRollingBack, "pending", errors.New(j.why))
			}
		}
	}
	return failures
}
