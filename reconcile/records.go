package reconcile

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

func actionMessage(act Action) string {
	switch k := act.Kind; k {
	case KindStart:
		return "started unit"
	case KindRestart:
		return "replaced unit file, restarted in place"
	case KindReload:
		return "replaced unit file, reloaded in place"
	case KindStopStart:
		if act.Steps.Job == JobStop {
			return "stopped with the old definition; the new version is written and started next"
		}
		return "started the new version (stopped with the old definition before)"
	case KindStop:
		return "stopped unit"
	case KindUpdate:
		if !act.changesUnitFiles() {
			return "wrote config files, the unit left alone (no trigger names them)"
		}
		return "replaced unit file (daemon-reload only)"
	case KindNone:
		if act.Record.Ran {
			return "recorded as running the new version, not restarted again"
		}
	case KindRemove:
		if act.Steps.Job == JobStop {
			return "stopped unit (removed from the registry)"
		}
		return "removed unit"
	}
	return act.Kind.String()
}

// actionHash names the version an action is about: the unit file's hash,
// else that of the first file it writes or runs.
func actionHash(act Action) string {
	switch {
	case act.Record.Effective[act.Unit] != "":
		return act.Record.Effective[act.Unit]
	case len(act.Steps.Writes) > 0:
		return act.Steps.Writes[0].Hash
	case act.Hash != "":
		return act.Hash
	}
	return headHash(act.Unit, act.Record.Effective)
}
