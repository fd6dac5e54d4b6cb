package reconcile

import "log/slog"

// recorder notes what came of the loop's actions: each unit's last outcome
// in the ledger, the Observer told, one log line for it.
type recorder struct {
	ledger *ledger
	obs    Observer
	log    *slog.Logger
}

// record notes act's outcome in the ledger, tells the Observer and logs
// it; recordAs under another action word than act's kind.
func (r recorder) record(act Action, result ResultWord, err error) {
	r.recordAs(act, act.Kind.Word(), result, err)
}

func (r recorder) recordAs(act Action, action ActionWord, result ResultWord, err error) {
	o := outcome{action: action, result: result, contentKey: act.ContentKey}
	if err != nil {
		o.err = err.Error()
	}
	r.ledger.setOutcome(act.Unit, o)
	r.obs.Action(act.Unit, act.Kind, string(result))
	log := r.log.With("unit", act.Unit, "action", action, "result", result)
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
