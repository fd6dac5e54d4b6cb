// Planning one unit (planUnit): what it owns, its files, the version it
// should run, what it waits on, and its job.

package reconcile

import (
	"fmt"
	"maps"
	"slices"
)

// ownershipOf says what the agent owns of a unit: from the desired keys
// when the registry wants the unit, else from the manifest, else from the
// record kept after its drop-ins were removed.
func ownershipOf(name string, d *DesiredUnit, cur Current) Ownership {
	if d != nil && d.Err == nil {
		switch {
		case d.File != nil:
			return OwnFile
		case d.Instance:
			return OwnInstance
		}
		return OwnDropIns
	}
	if e, ok := cur.Memory.Managed[name]; ok {
		if e.Instance {
			return OwnInstance
		}
		return OwnFile
	}
	for p := range cur.Memory.Managed {
		if UnitOfPath(p) == name {
			return OwnDropIns
		}
	}
	return cur.Memory.Records[name].Own
}

// planUnit plans one unit, in the order of its seams: what it owns and
// which files change (planFiles), the set of files it runs on once
// converged (planEffective), what holds it back (planGates), and what it
// takes to run that set (planRun).
func planUnit(name string, d *DesiredUnit, managed []string, desired map[string]*DesiredUnit, cur Current) Action {
	a := Action{Unit: name, Own: ownershipOf(name, d, cur)}
	if d == nil {
		return planRemove(a, managed, cur)
	}
	if d.Err != nil {
		return blocked(a, d.Err.Error())
	}
	if why := planFiles(&a, d, managed, cur); why != "" {
		return blocked(a, why)
	}
	if d.File == nil && !d.Instance && ownsUnitFile(name, cur) {
		return planUnitFileGone(a, cur.Host.Units[name], cur)
	}
	backToOld := planEffective(&a, d, desired, cur)
	u, gated := planGates(&a, managed, backToOld, cur)
	if gated {
		return a
	}
	planRun(&a, u, d, slices.Contains(managed, name), desired, cur)
	return a
}

// planFiles: ownership first — never overwrite what is not ours (why says
// what is in the way) — then the files to write, remove, or forget (an
// instance's entry).
func planFiles(a *Action, d *DesiredUnit, managed []string, cur Current) (why string) {
	isManaged := map[string]bool{}
	for _, p := range managed {
		isManaged[p] = true
	}
	for _, f := range d.Files() {
		if _, dest, ok := ConfigDest(f.Path); ok && cur.Host.FileRoots != nil {
			if _, err := RootOf(dest, cur.Host.FileRoots); err != nil {
				return fmt.Sprintf("%s: %v", f.Path, err)
			}
		}
		lf := cur.Host.Files[f.Path]
		if lf.Err != "" {
			return fmt.Sprintf("%s: %s", f.Path, lf.Err)
		}
		if lf.Exists && !isManaged[f.Path] {
			return fmt.Sprintf("unmanaged file: %s exists and agentd did not write it; not overwriting (move it away to let agentd manage it)", f.Path)
		}
		if !lf.Exists || lf.Hash != f.Hash {
			a.Steps.Writes = append(a.Steps.Writes, f)
		}
	}
	wanted := map[string]bool{}
	for _, f := range d.Files() {
		wanted[f.Path] = true
	}
	for _, p := range managed {
		switch {
		case wanted[p]:
		case cur.Memory.Managed[p].Instance:
			if !d.Instance {
				a.Steps.Forget = append(a.Steps.Forget, p)
			}
		default:
			a.Steps.Removes = append(a.Steps.Removes, p)
		}
	}
	return ""
}

// planEffective sets what the unit runs on once converged — its own files,
// and for an instance its template's (unless the template's change was
// rolled back: backToOld, the instance goes back to the template set that
// ran before the failure) — with the policy, scope and hash of that version.
func planEffective(a *Action, d *DesiredUnit, desired map[string]*DesiredUnit, cur Current) (backToOld bool) {
	name := a.Unit
	effective := fileHashes(d.VersionFiles())
	p := d.Policy
	if IsInstance(name) {
		a.Record.Instance = d.Instance
		if t := desired[TemplateOf(name)]; t != nil && t.Err == nil {
			tkey := ContentKey(t)
			if tr := cur.Memory.Records[t.Name]; tr.Failed == tkey || cur.Memory.Refused[t.Name].ContentKey == tkey {
				if len(tr.Applied) > 0 {
					maps.Copy(effective, tr.Applied)
					backToOld = true
				}
			} else {
				maps.Copy(effective, fileHashes(t.Files()))
				a.Record.TemplateKey = tkey
			}
			if d.File == nil {
				p = t.Policy // an instance key carries no policy: its template's applies
				p.Enable = false
			}
		}
	}
	a.Policy = p
	a.Scope = scopeOf(d, desired)
	if a.Scope != "" && p.SlotLimit > 0 {
		a.Bucket = BucketOf(p.SlotBy, cur.Fleet.Labels)
	}
	a.Hash = d.Hash()
	if d.File == nil && IsInstance(name) {
		if t := desired[TemplateOf(name)]; t != nil {
			a.Hash = t.Hash()
		}
	}
	a.Record.Effective = effective
	a.ContentKey = KeyOf(effective)
	if d.Instance && len(effective) == 0 {
		a.ContentKey = instanceKey
	}
	return backToOld
}

// unitCase is what the gates found out about a unit that the run decision
// goes on.
type unitCase struct {
	st      UnitState
	rec     UnitRecord
	applied string // the content key the unit is recorded as running
	changed bool   // files to write or remove
	// pending: an earlier pass began this content's job and never heard back.
	pending bool
	// stale: the running unit is known to run other content than desired.
	stale bool
}

// planGates turns a into what holds it back, when something does (gated):
// its job in progress, a refusal, a failure (a rollback, or blocked until
// the content changes), a halted rollout.
func planGates(a *Action, managed []string, backToOld bool, cur Current) (u unitCase, gated bool) {
	name := a.Unit
	u.st, u.rec = cur.Host.Units[name], cur.Memory.Records[name]
	st, rec := u.st, u.rec
	u.changed = a.Changes()
	if j, ok := cur.Memory.Jobs[name]; ok && j.ContentKey == a.ContentKey && !u.changed {
		*a = waiting(*a, WaitJob, j.Job.String()+" job in progress")
		return u, true
	}
	if r, ok := cur.Memory.Refused[name]; ok && r.ContentKey == a.ContentKey {
		*a = blocked(*a, r.Reason)
		return u, true
	}
	if !u.changed && (st.LoadState == "bad-setting" || st.LoadState == "error") && !st.NeedDaemonReload && KeyOf(rec.Applied) != a.ContentKey {
		*a = planRefused(*a, rec, st, cur)
		return u, true
	}
	if rec.Failed != "" && rec.Failed == a.ContentKey {
		*a = planFailed(*a, rec, managed, cur)
		return u, true
	}
	u.applied = KeyOf(rec.Applied)
	u.pending = cur.Memory.Intent.Jobs[name] == a.ContentKey
	if u.pending && !u.changed && cur.Host.Loaded != 0 && st.ActiveState == "active" && !st.NeedDaemonReload && st.InactiveExitMono > cur.Host.Loaded {
		// ... but it did: the unit started after systemd last loaded the
		// unit files, which are the desired ones (nothing to write, no
		// newer file) — the agent died after the job, before recording it.
		u.pending, a.Record.Ran = false, true
		a.Reason = "the job owed by a pass the agent did not finish ran: the unit started after systemd loaded its current files"
	}
	u.stale = len(rec.Applied) > 0 && u.applied != a.ContentKey && !a.Record.Ran || u.pending
	// A halted rollout: another host of the group failed this version.
	if h, ok := cur.Fleet.Halts[SlotKey(name)]; ok && !backToOld && a.Scope != "" && h.Scope == a.Scope && h.Hash == a.Hash && (u.changed || u.stale) {
		*a = waiting(*a, WaitHeld, heldText(fmt.Sprintf("the rollout of %s is halted: %s failed it: %s", short(h.Hash), h.Host, h.Reason)))
		a.Err, a.Record.Effective = a.Reason, nil
		return u, true
	}
	return u, false
}

// planFailed: the desired content failed. Wait for a rollback in progress,
// else roll back (the unit, or a template's set), else block until the
// registry content changes.
func planFailed(a Action, rec UnitRecord, managed []string, cur Current) Action {
	if j, ok := cur.Memory.Jobs[a.Unit]; ok && j.Rollback {
		// The files are back; the disk differs from the registry until
		// the content changes, which must not start the rollback again.
		return waiting(a, WaitJob, "rollback "+j.Job.String()+" job in progress")
	}
	if IsTemplate(a.Unit) {
		if rb, ok := planTemplateRollback(a, rec, managed, cur); ok {
			return rb
		}
	} else if rb, ok := planRollback(a, rec, managed, cur); ok {
		return rb
	}
	return blocked(a, rec.FailReason+"; not retried until the registry content changes")
}

// planRun decides what it takes for the unit to run its effective set as
// its policy asks: enablement, then a job (or none), then whether the set
// is recorded as running now (Adopt). isManaged: the manifest has the
// unit's own path (a file, or an instance's entry).
func planRun(a *Action, u unitCase, d *DesiredUnit, isManaged bool, desired map[string]*DesiredUnit, cur Current) {
	name, p, st, rec, changed, stale := a.Unit, a.Policy, u.st, u.rec, u.changed, u.stale
	planEnable(a, st, changed)
	switch {
	case a.Own == OwnDropIns:
		planForeign(a, st, changed, stale, rec, d, desired, cur)
	case IsTemplate(name) || p.State == StatePresent:
		if changed {
			a.Kind, a.Reason = KindUpdate, describe(*a, rec, cur)+"; State=present: not started or stopped"
		}
	case p.State == StateStopped:
		switch {
		case st.Active():
			a.Kind, a.Steps.Job, a.Reason = KindStop, JobStop, "State=stopped and the unit is "+st.ActiveState
			if changed {
				a.Reason = describe(*a, rec, cur) + "; " + a.Reason
			}
		case changed:
			a.Kind, a.Reason = KindUpdate, describe(*a, rec, cur)+"; State=stopped"
		}
	case !st.Active():
		planStart(a, u, d, isManaged, cur)
	case changed || stale:
		planChange(a, st, changed, rec, d, desired, cur)
	}
	if a.Kind == KindNone && (a.Steps.Enable || a.Steps.Disable) {
		a.Kind, a.Reason = KindUpdate, "enable per [Install]"
		if a.Steps.Disable && !a.Steps.Enable {
			a.Reason = "disable: Enable=no, or no [Install] section"
		}
	}
	if (a.Kind == KindUpdate || a.Kind == KindNone) && a.Record.Effective != nil && st.Active() && u.applied != a.ContentKey {
		a.Record.Adopt = true
	}
}

// planStart: State=started, and the unit is not running.
func planStart(a *Action, u unitCase, d *DesiredUnit, isManaged bool, cur Current) {
	name, st, rec := a.Unit, u.st, u.rec
	switch {
	case u.changed || (u.stale && cur.Memory.Started[name] != a.ContentKey):
		a.Kind, a.Steps.Job, a.Reason = KindStart, JobStart, describe(*a, rec, cur)
		if !u.changed && !u.pending {
			a.Reason = "content changed while the unit was stopped"
		}
		if a.Policy.OnChange == "stop-start" && (u.changed || u.stale) {
			a.Kind = KindStopStart // the second half: the old version is down
		}
	case d.Instance && !isManaged:
		a.Kind, a.Steps.Job, a.Reason = KindStart, JobStart, "new instance of "+TemplateOf(name)
	case !st.Ran && st.LoadState == "loaded" && cur.Memory.Started[name] != a.ContentKey && !ranToCompletion(st, rec, a.ContentKey) &&
		!(cur.Host.Manager != "" && rec.StartedIn == cur.Host.Manager && KeyOf(rec.Applied) == a.ContentKey):
		// Not run since the manager started (a boot, or the agent was
		// away): start it. A unit that ran and stopped or failed is left
		// as it is — an operator's stop is respected, and a crash is
		// systemd's Restart= to handle; both show in status. So is one
		// the agent started under this very manager: systemd unloaded
		// it once stopped and forgot it ran, the agent did not.
		a.Kind, a.Steps.Job, a.Reason = KindStart, JobStart, "not started since the manager started"
	}
}

// planEnable makes enablement follow the current version both ways. Only a
// unit file the agent installed is ever enabled or disabled; a state other
// than enabled/disabled (static, indirect, masked, ...) is left alone.
func planEnable(a *Action, st UnitState, changed bool) {
	if a.Own != OwnFile || IsTemplate(a.Unit) || IsInstance(a.Unit) {
		return
	}
	want := a.Policy.Enable && a.Policy.HasInstall
	unknown := st.UnitFileState == "" || st.LoadState == "not-found"
	switch {
	case want && (st.UnitFileState == "disabled" || unknown && changed):
		a.Steps.Enable = true
	case !want && st.UnitFileState == "enabled":
		a.Steps.Disable = true
	}
}
