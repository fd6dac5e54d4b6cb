package reconcile

import (
	"fmt"
	"maps"
	"slices"
)

// planRemove: the registry no longer wants the unit. What happens follows
// what the agent owns of it.
func planRemove(a Action, managed []string, cur Current) Action {
	st := cur.Host.Units[a.Unit]
	rec := cur.Memory.Records[a.Unit]
	a.Kind = KindRemove
	if j, ok := cur.Memory.Jobs[a.Unit]; ok && (j.Job == JobStop || a.Own == OwnDropIns) {
		// A hung start is replaced by the stop; anything else is waited out.
		return waiting(a, WaitJob, "removed from the registry: "+j.Job.String()+" job in progress")
	}
	switch a.Own {
	case OwnDropIns:
		if len(managed) > 0 {
			a.Steps.Removes = managed
			a.Reason = "drop-ins removed from the registry; " + a.Unit + " itself is not agentd's: never stopped, disabled or deleted"
			a.Own = OwnDropIns
			return a
		}
		// The drop-ins are gone from disk and systemd has reloaded: apply
		// their removal to the running unit, if it had an effect.
		a.Reason = "drop-ins removed"
		if !st.Active() || len(rec.Applied) == 0 || st.LoadState == "not-found" {
			a.Kind, a.Record.DropRecord = KindNone, true
			return a
		}
		var old []File
		for _, p := range sortUnitFirst(rec.Applied) {
			b, ok := cur.Memory.Blobs[rec.Applied[p]]
			if !ok {
				old = nil // unknown: compare against nothing → restart
				break
			}
			old = append(old, File{p, b})
		}
		c := Classify(a.Unit, old, nil)
		if old == nil {
			c = Change{Kind: ChangeRestart, Note: "the removed drop-ins are not kept; restarting to be safe"}
		}
		a.Change = &c
		if c.Kind == ChangeNone || c.Kind == ChangeCosmetic {
			a.Kind, a.Record.DropRecord = KindNone, true
			a.Reason = "drop-ins removed: " + c.Reason()
			return a
		}
		a.Kind, a.Steps.Job = KindRestart, JobRestart
		a.Reason = "drop-ins removed: " + c.Reason() + ": restart (the unit is not agentd's: never stopped)"
		a.Record.Effective = map[string]string{}
		a.ContentKey = KeyOf(a.Record.Effective)
		a.Policy = Policy{State: StateStarted} // no HealthySec, no rollback: there is nothing to go back to
		return a
	case OwnFile, OwnInstance:
		if st.Active() || st.ActiveState == "deactivating" {
			a.Steps.Job = JobStop
			a.Reason = "removed from the registry: stopping"
			return a
		}
		// Stopped: disable, delete, and one daemon-reload for both.
		a.Steps.Disable = st.UnitFileState == "enabled" && a.Own == OwnFile && !IsTemplate(a.Unit) && !IsInstance(a.Unit)
		for _, p := range managed {
			if cur.Memory.Managed[p].Instance {
				a.Steps.Forget = append(a.Steps.Forget, p) // no file: the agent owns only the running instance
			} else {
				a.Steps.Removes = append(a.Steps.Removes, p)
			}
		}
		a.Reason = "removed from the registry"
		a.Record.DropRecord = true
		a.Steps.ResetFailed = st.ActiveState == "failed"
		return a
	}
	a.Kind, a.Record.DropRecord = KindNone, true
	return a
}

// ownsUnitFile says whether the agent installed name's own unit file (the
// manifest has it, and not as an instance).
func ownsUnitFile(name string, cur Current) bool {
	e, ok := cur.Memory.Managed[name]
	return ok && !e.Instance
}

// planUnitFileGone: the registry holds drop-ins of a unit but no longer
// its unit file, a file the agent installed — the unit was removed and a
// drop-in stayed (a put of a drop-in racing an rm, etcdctl, a revert). The
// unit goes as a removed unit goes (planRemove: stopped first, then
// disabled and its file deleted, its record dropped); its drop-ins are only
// written or kept, for a unit file to come. It never gets a start, restart
// or reload: with its file gone systemd answers "Unit … not found", the
// change fails and its rollback puts back the file the registry no longer
// has. a holds the plan's writes (its drop-ins) and removes (its file).
func planUnitFileGone(a Action, st UnitState, cur Current) Action {
	a.Own, a.Kind = OwnFile, KindRemove
	if j, ok := cur.Memory.Jobs[a.Unit]; ok && j.Job == JobStop {
		return waiting(a, WaitJob, "unit file removed from the registry: stop job in progress")
	}
	if st.Active() || st.ActiveState == "deactivating" {
		a.Steps = Steps{Job: JobStop} // its drop-ins are written once it is down
		a.Reason = "unit file removed from the registry, its drop-ins stay: stopping"
		return a
	}
	a.Steps.Disable = st.UnitFileState == "enabled" && !IsTemplate(a.Unit) && !IsInstance(a.Unit)
	a.Steps.ResetFailed = st.ActiveState == "failed"
	a.Record.DropRecord = true
	a.Reason = "unit file removed from the registry; its drop-ins stay, written only: no job for a unit without its file"
	return a
}

// planRefused: systemd would not load the content just written. Put back
// the files the unit ran with (or remove the new ones) and remember the
// content, so it is not tried again until the registry changes.
func planRefused(a Action, rec UnitRecord, st UnitState, cur Current) Action {
	reason := fmt.Sprintf("systemd refused to load %s (%s): %s", a.Unit, st.LoadState, orUnknown(st.LoadError))
	key, effective := a.ContentKey, a.Record.Effective
	b := blocked(a, reason)
	b.Record.Refuse = &Refusal{ContentKey: key, Reason: reason}
	for _, p := range slices.Sorted(maps.Keys(effective)) {
		old, ran := rec.Applied[p]
		switch {
		case ran && old == effective[p]:
		case ran:
			content, ok := cur.Memory.Blobs[old]
			if !ok {
				b.Err += fmt.Sprintf("; the previous version of %s (%s) is not kept, left as it is", p, short(old))
				continue
			}
			b.Steps.Writes = append(b.Steps.Writes, restored(p, content, old))
		case cur.Memory.Managed[p] != Owned{}:
			b.Steps.Removes = append(b.Steps.Removes, p)
		}
	}
	return b
}

// planRollback: a change failed and the unit still runs it. Put back the
// version that ran before it (verified or not) and restart onto it. ok is
// false when there is nothing to do: Rollback=no, no earlier version, or
// already rolled back.
func planRollback(a Action, rec UnitRecord, managed []string, cur Current) (Action, bool) {
	if rollbackWhyNot(a.Policy, rec) != "" || KeyOf(rec.Applied) == KeyOf(rec.Previous) { // nothing to go back to, or back already
		return a, false
	}
	r := a
	r.Kind, r.Steps, r.Record.Adopt = KindRollback, Steps{Job: JobRestart}, false
	r.Reason = rec.FailReason + "; rolling back to " + short(headHash(a.Unit, rec.Previous)) + " (the version that ran before)"
	own := maps.Clone(rec.Previous)
	maps.DeleteFunc(own, func(p, _ string) bool { return readsOnly(a.Unit, p) })
	writes, why := restoreWrites(own, cur)
	if why != "" {
		return blocked(a, rec.FailReason+"; "+why), true
	}
	r.Steps.Writes = writes
	// Files the failed version added (a new drop-in, here or on the
	// template) go: the rolled-back unit must not run with them.
	gone := map[string]bool{}
	for p := range a.Record.Effective {
		gone[p] = true
	}
	for _, p := range managed {
		gone[p] = true
	}
	for _, p := range slices.Sorted(maps.Keys(gone)) {
		if _, keep := rec.Previous[p]; !keep && cur.Memory.Managed[p].Hash != "" && !readsOnly(a.Unit, p) {
			r.Steps.Removes = append(r.Steps.Removes, p)
		}
	}
	if rec.FailedOp == KindReload.String() {
		r.Steps.Job = JobNone // a failed reload left the old process running: put the files back only
		r.Record.Adopt = true
	}
	r.Record.Effective = rec.Previous
	return r, true
}

// planTemplateRollback: an instance failed on this template set. The set
// goes back on disk as it was (rec.Applied: the template file and drop-ins
// the instances ran); files the failed set added go. The instances that had
// moved are then restarted onto it by their own plans (they are stale). ok
// is false when the disk already holds the old set.
func planTemplateRollback(a Action, rec UnitRecord, managed []string, cur Current) (Action, bool) {
	if len(rec.Applied) == 0 {
		return a, false
	}
	r := a
	r.Kind, r.Steps, r.Record.Adopt, r.Record.Effective = KindRollback, Steps{}, false, nil
	writes, why := restoreWrites(rec.Applied, cur)
	if why != "" {
		return blocked(a, rec.FailReason+"; "+why), true
	}
	r.Steps.Writes = writes
	for _, p := range managed {
		if _, keep := rec.Applied[p]; !keep && !cur.Memory.Managed[p].Instance {
			r.Steps.Removes = append(r.Steps.Removes, p)
		}
	}
	if !r.Changes() {
		return a, false
	}
	r.Reason = rec.FailReason + "; rolling the template set back to " + short(headHash(a.Unit, rec.Applied)) + " (what the instances ran before)"
	return r, true
}

// restoreWrites are the writes that put files (path → hash) back on disk
// from the kept blobs, leaving out those already there; why says which
// file cannot be, when its blob is not kept.
func restoreWrites(files map[string]string, cur Current) (writes []DesiredFile, why string) {
	for _, p := range slices.Sorted(maps.Keys(files)) {
		h := files[p]
		if lf := cur.Host.Files[p]; lf.Exists && lf.Hash == h {
			continue
		}
		content, ok := cur.Memory.Blobs[h]
		if !ok {
			return nil, fmt.Sprintf("cannot roll back: the previous version of %s (%s) is not kept", p, short(h))
		}
		w := restored(p, content, h)
		if lf := cur.Host.Files[p]; lf.Exists && lf.Hash == w.Hash {
			continue // a secret, in place: its record knows it by its ciphertext's hash
		}
		writes = append(writes, w)
	}
	return writes, ""
}

// restored is the write that puts back a kept version of path: content
// by the hash records know it by (for a secret, its ciphertext's: Sealed;
// the write's Hash is then that of the file on disk, which claims and
// drift compare).
func restored(path string, content []byte, h string) DesiredFile {
	f := DesiredFile{Path: path, Content: content, Hash: Hash(content)}
	if f.Hash != h {
		f.Sealed = h
	}
	return f
}
