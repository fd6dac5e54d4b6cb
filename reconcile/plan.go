package reconcile

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// KeyOf is a stable identity for a set of files (path -> hash).
func KeyOf(files map[string]string) string {
	switch len(files) {
	case 0:
		return ""
	case 1: // most units: no sort, one allocation (it runs per unit per pass)
		for p, h := range files {
			return p + "=" + h + ";"
		}
	}
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(files)) {
		b.WriteString(p)
		b.WriteByte('=')
		b.WriteString(files[p])
		b.WriteByte(';')
	}
	return b.String()
}

// ContentKey is a stable identity for all of a unit's desired files.
func ContentKey(u *DesiredUnit) string {
	if u.Instance && len(u.DropIns) == 0 {
		return instanceKey
	}
	return KeyOf(fileHashes(u.Files()))
}

func fileHashes(fs []DesiredFile) map[string]string {
	m := map[string]string{}
	for _, f := range fs {
		m[f.Path] = f.Hash
	}
	return m
}

// UnitOfPath returns the unit a managed path belongs to.
func UnitOfPath(path string) string {
	if u, _, ok := ConfigDest(path); ok {
		return u
	}
	if u, _, ok := strings.Cut(path, ".d/"); ok {
		return u
	}
	return path
}

// Plan computes one action per unit from desired and current state. It is
// pure: no I/O, no clock, deterministic order (sorted by unit name). Units
// neither desired nor managed nor remembered do not appear: the agent does
// not touch them.
func Plan(desired map[string]*DesiredUnit, cur Current) []Action {
	managedBy := map[string][]string{} // unit -> managed paths
	for p := range cur.Memory.Managed {
		u := UnitOfPath(p)
		managedBy[u] = append(managedBy[u], p)
	}
	names := map[string]bool{}
	for n := range desired {
		names[n] = true
	}
	for n := range managedBy {
		names[n] = true
	}
	for n := range cur.Memory.Records {
		names[n] = true
	}
	var out []Action
	rolling := map[string]bool{} // templates with an instance mid-update
	for n := range cur.Memory.Verifying {
		if IsInstance(n) {
			rolling[TemplateOf(n)] = true
		}
	}
	for n, j := range cur.Memory.Jobs {
		if IsInstance(n) && j.Job != JobStop {
			rolling[TemplateOf(n)] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		paths := managedBy[name]
		slices.Sort(paths)
		a := planUnit(name, desired[name], paths, desired, cur)
		// Instances of one template are disrupted one at a time, each
		// healthy (HealthySec) before the next: never all down at once.
		if IsInstance(name) && a.Kind.Disruptive() {
			t := TemplateOf(name)
			if rolling[t] {
				a = waiting(a, WaitRolling, "waiting for the rolling update of "+t+": one instance at a time ("+a.Reason+")")
			}
			rolling[t] = true
		}
		// MaxUnavailable: the disruptive part waits for a slot shared by
		// every host of the group (nothing is written before it either).
		// Instances share their template's slot, and a template's new files
		// wait for it too while instances run: the template set is the unit
		// of rollout.
		if (a.Kind.Disruptive() || templateChangeDisrupts(a, cur)) && a.Policy.SlotLimit > 0 && a.Scope != "" && cur.Fleet.Slots[SlotKey(name)] == "" {
			a = waiting(a, WaitSlot, fmt.Sprintf("waiting for a rollout slot (MaxUnavailable=%d in %s) to %s", a.Policy.SlotLimit, a.Scope, a.Reason))
		}
		out = append(out, a)
	}
	orderSocketServices(out, desired)
	return out
}

// orderSocketServices makes the job of a service wait for its socket's
// start or restart in the same plan: systemd refuses to start a socket
// whose service runs, and a socket's restart stops its service first.
func orderSocketServices(plan []Action, desired map[string]*DesiredUnit) {
	byUnit := make(map[string]int, len(plan))
	for i, a := range plan {
		byUnit[a.Unit] = i
	}
	for _, s := range plan {
		if !strings.HasSuffix(s.Unit, ".socket") || (s.Steps.Job != JobStart && s.Steps.Job != JobRestart) {
			continue
		}
		if i, ok := byUnit[socketService(s.Unit, desired[s.Unit])]; ok && plan[i].Steps.Job != JobNone {
			plan[i].Steps.After = s.Unit
			plan[i].Reason += "; after " + s.Unit + "'s " + s.Steps.Job.String() + " (systemd starts no socket whose service runs)"
		}
	}
}

// SlotKey is what a MaxUnavailable slot and a halt are keyed by: the unit,
// or for an instance its template — a template's instances roll out as one.
func SlotKey(unit string) string {
	if IsInstance(unit) {
		return TemplateOf(unit)
	}
	return unit
}

// templateChangeDisrupts: the action writes a template's files while some of
// its instances run; they will be restarted onto the new set.
func templateChangeDisrupts(a Action, cur Current) bool {
	if !IsTemplate(a.Unit) || !a.Changes() {
		return false
	}
	for u, st := range cur.Host.Units {
		if IsInstance(u) && TemplateOf(u) == a.Unit && st.Active() {
			return true
		}
	}
	return false
}

// SlotNeed is a MaxUnavailable slot this host needs now.
type SlotNeed struct {
	Scope string
	Hash  string
	Limit int
}

// SlotsNeeded is level-triggered slot accounting: the slots (by SlotKey)
// this host needs after this plan — for a disruptive step planned or
// waiting for its slot, a job in flight, a unit inside HealthySec or whose
// change awaits its confirmation (ConfirmSec=). Every
// other slot it holds or queues for is given back. Pure.
func SlotsNeeded(plan []Action, cur Current) map[string]SlotNeed {
	need := map[string]SlotNeed{}
	for _, a := range plan {
		if a.Policy.SlotLimit <= 0 || a.Scope == "" {
			continue
		}
		_, inflight := cur.Memory.Jobs[a.Unit]
		confirming := cur.Memory.Records[a.Unit].Confirming != "" // ConfirmSec=: not done until confirmed
		if a.Gate.On == WaitSlot || a.Kind.Disruptive() || inflight || cur.Memory.Verifying[a.Unit] || confirming {
			need[SlotKey(a.Unit)] = SlotNeed{Scope: a.Scope, Hash: a.Hash, Limit: a.Policy.SlotLimit}
		}
	}
	return need
}

// ReloadNeeded says whether the plan owes a daemon-reload before its jobs:
// files or enablement change, an earlier pass was cut off before its
// reload, or systemd itself says a unit about to get a job has a newer file
// on disk than it loaded (NeedDaemonReload). Pure.
func ReloadNeeded(plan []Action, cur Current) (bool, string) {
	if cur.Memory.Intent.Reload {
		return true, "a daemon-reload owed by an interrupted pass"
	}
	for _, a := range plan {
		if a.changesUnitFiles() || a.Steps.Enable || a.Steps.Disable {
			return true, "unit files changed"
		}
	}
	for _, a := range plan {
		if a.Steps.Job != JobNone && cur.Host.Units[a.Unit].NeedDaemonReload {
			return true, a.Unit + " has NeedDaemonReload=yes"
		}
	}
	return false, ""
}

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
	effective := fileHashes(d.Files())
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

// planChange picks the least disruption for an active unit whose content
// changes.
func planChange(a *Action, st UnitState, changed bool, rec UnitRecord, d *DesiredUnit, desired map[string]*DesiredUnit, cur Current) {
	name, p := a.Unit, a.Policy
	oldFiles, newFiles := filesForClassify(name, rec, a.Record.Effective, d, desired, cur)
	if len(rec.Applied) == 0 && cur.Memory.Intent.Jobs[name] == a.ContentKey {
		// An interrupted pass wrote these files; what the unit runs is
		// unknown: compare against nothing, i.e. restart.
		oldFiles = nil
	}
	c := Classify(name, oldFiles, newFiles)
	a.Change = &c
	what := describe(*a, rec, cur)
	canReload := CanReload(name, newFiles)
	switch p.OnChange {
	case "restart":
		a.Kind, a.Reason = restartKind(name), what+"; OnChange=restart"
	case "reload":
		if canReload {
			a.Kind, a.Reason = KindReload, what+"; OnChange=reload"
		} else {
			// Never a silent restart: write the files, keep the unit on its
			// old version, and say so.
			a.Kind, a.Reason = KindUpdate, what+"; OnChange=reload"
			a.Err = fmt.Sprintf("reload %s: the new version cannot reload (no ExecReload=); not restarting it silently — use OnChange=reload-or-restart or restart", name)
			a.Record.Effective = nil
		}
	case "reload-or-restart":
		if canReload {
			a.Kind, a.Reason = KindReload, what+"; OnChange=reload-or-restart: the unit can reload"
		} else {
			a.Kind, a.Reason = KindRestart, what+"; OnChange=reload-or-restart: the unit cannot reload"
		}
	case "stop-start":
		a.Kind, a.Reason = KindStopStart, what+"; OnChange=stop-start: stopping with the old definition first"
		// The new files are written once the old version is down (next pass).
		a.Steps.Writes, a.Steps.Removes, a.Steps.Enable, a.Steps.Disable, a.Record.Effective = nil, nil, false, false, nil
		a.Steps.Job = JobStop
		return
	case "none":
		if changed {
			a.Kind, a.Reason = KindUpdate, what+"; OnChange=none: restart pending"
		}
		a.Record.Effective = nil // the unit keeps running the old content
	default:
		a.Kind, a.Reason = autoKind(name, c)
		if a.Kind == KindReload && !canReload {
			a.Kind, a.Reason = KindRestart, c.Reason()+": the new version cannot reload, restart"
		}
		if c.Kind == ChangeInstall && a.Own == OwnFile && p.HasInstall && p.Enable {
			a.Steps.Enable, a.Steps.Disable = true, true
		}
		if a.Kind == KindUpdate && !changed {
			a.Kind = KindNone // nothing to write: just record that it runs current content
		}
		if a.Kind == KindUpdate && !a.changesUnitFiles() {
			a.Reason = "config files only, no daemon-reload, no job (" + c.Reason() + ")"
		}
		a.Reason = what + "; " + a.Reason
	}
	a.Steps.Job = jobOf(a.Kind)
	if a.Kind == KindRestart && strings.HasSuffix(name, ".socket") {
		if svc := socketService(name, d); svc != "" {
			a.Steps.AlsoStop = []string{svc}
		}
	}
}

// planForeign applies drop-ins on a unit the agent did not install: it is
// never started, stopped, enabled or disabled; an active one gets the change
// like any other (restart, reload or nothing, as the change needs).
//
// A unit systemd does not have (LoadState not-found: no unit file in any
// of its directories — unlike a vendor unit in /usr/lib, which is loaded)
// gets its drop-ins written and no job: starting, restarting or reloading
// it could only end in "Unit … not found".
func planForeign(a *Action, st UnitState, changed, stale bool, rec UnitRecord, d *DesiredUnit, desired map[string]*DesiredUnit, cur Current) {
	a.Steps.Enable, a.Steps.Disable = false, false
	switch {
	case st.LoadState == "not-found":
		a.Record.Effective = nil // it runs none of them: nothing to record or adopt
		if changed {
			a.Kind, a.Reason = KindUpdate, describe(*a, rec, cur)+"; drop-ins on "+a.Unit+", which systemd does not have (not-found): written, no job"
		}
	case st.Active() && (changed || stale):
		p := a.Policy
		note := " (drop-ins on a unit agentd did not install)"
		if p.OnChange == "stop-start" {
			a.Policy.OnChange = "restart" // never stop a unit that is not ours
			note = " (OnChange=stop-start becomes a restart: the unit is not agentd's, it is never stopped)"
		}
		planChange(a, st, changed, rec, d, desired, cur)
		a.Policy = p
		a.Reason += note
	case changed:
		a.Kind, a.Reason = KindUpdate, describe(*a, rec, cur)+"; drop-ins on a unit agentd did not install, which is "+st.ActiveState+": not started"
	}
}

// headHash names a version by its unit file's hash (else any file's).
func headHash(unit string, files map[string]string) string {
	if h, ok := files[unit]; ok {
		return h
	}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		return files[p]
	}
	return ""
}

func jobOf(k Kind) Job {
	switch k {
	case KindStart:
		return JobStart
	case KindRestart:
		return JobRestart
	case KindReload:
		return JobReload
	case KindStop, KindStopStart:
		return JobStop
	}
	return JobNone
}

// waiting turns an action into a wait on what on says: nothing is
// written, run or adopted.
func waiting(a Action, on Wait, why string) Action {
	a.Kind, a.Reason, a.Gate = KindWait, why, Gate{On: on}
	a.Steps, a.Record.Adopt = Steps{}, false
	return a
}

// CanReload says whether the new version of a unit can reload in place:
// a service with an ExecReload= (the last assignment wins; an empty one
// resets the list), a mount (remount). Judged from the files, so the plan
// is right even before the daemon-reload that loads them.
func CanReload(name string, files []File) bool {
	switch name[strings.LastIndexByte(name, '.')+1:] {
	case "mount":
		return true
	case "service":
	default:
		return false
	}
	has := false
	for _, f := range files {
		if IsConfigPath(f.Path) {
			continue
		}
		for _, kv := range iniEntries(f.Content) {
			if kv.sec == "Service" && kv.key == "ExecReload" {
				has = kv.val != ""
			}
		}
	}
	return has
}

// autoKind is OnChange=auto: the unit type and the classification decide.
func autoKind(name string, c Change) (Kind, string) {
	typ := name[strings.LastIndexByte(name, '.')+1:]
	switch c.Kind {
	case ChangeNone, ChangeCosmetic:
		return KindUpdate, "daemon-reload only (" + c.Reason() + ")"
	case ChangeInstall:
		return KindUpdate, "[Install] only: daemon-reload and re-enable"
	}
	switch typ {
	case "slice":
		return KindUpdate, "a slice applies its settings on daemon-reload"
	case "target":
		return KindStart, "a target is started, never restarted"
	case "mount":
		if c.Kind == ChangeMountOpts {
			return KindReload, "only Options= changed: remount"
		}
		return KindRestart, c.Reason() + ": remount from scratch"
	case "service":
		if c.Kind == ChangeReload {
			return KindReload, c.Reason() + ": reload"
		}
		return KindRestart, c.Reason() + ": restart"
	case "socket":
		return KindRestart, c.Reason() + ": stop the socket and its service, start the socket"
	}
	return KindRestart, c.Reason() + ": restart"
}

func restartKind(name string) Kind {
	if strings.HasSuffix(name, ".target") {
		return KindStart
	}
	return KindRestart
}

// socketService is the service a socket activates: Service= or the same
// name. A Service= naming a unit the agent must never touch (the bus, its
// own unit, ...) or an invalid name yields "": that service is left alone.
func socketService(name string, d *DesiredUnit) string {
	svc := strings.TrimSuffix(name, ".socket") + ".service"
	if d != nil && d.File != nil {
		for _, kv := range iniEntries(d.File.Content) {
			if kv.sec == "Socket" && kv.key == "Service" && kv.val != "" {
				svc = kv.val
			}
		}
	}
	if ValidateUnitName(svc) != nil {
		return ""
	}
	return svc
}

// filesForClassify returns the old (what the unit runs) and new (desired)
// file sets. Old comes from the Applied record's blobs, falling back to
// what is on disk now.
func filesForClassify(name string, rec UnitRecord, effective map[string]string, d *DesiredUnit, desired map[string]*DesiredUnit, cur Current) (old, new []File) {
	content := func(path, hash string) ([]byte, bool) {
		if b, ok := cur.Memory.Blobs[hash]; ok {
			return b, true
		}
		if lf := cur.Host.Files[path]; lf.Exists && lf.Hash == hash {
			return lf.Content, true
		}
		return nil, false
	}
	oldMap := rec.Applied
	if len(oldMap) == 0 {
		oldMap = map[string]string{}
		for p := range effective {
			if lf := cur.Host.Files[p]; lf.Exists {
				oldMap[p] = lf.Hash
			}
		}
	}
	for _, p := range sortUnitFirst(oldMap) {
		b, ok := content(p, oldMap[p])
		if !ok { // unknown old content: compare against nothing → restart
			old = nil
			break
		}
		old = append(old, File{p, b})
	}
	byPath := map[string][]byte{}
	for _, f := range d.Files() {
		byPath[f.Path] = f.Content
	}
	if t := desired[TemplateOf(name)]; IsInstance(name) && t != nil {
		for _, f := range t.Files() {
			if effective[f.Path] == f.Hash { // not the set put back after a failure (backToOld): that one is kept
				byPath[f.Path] = f.Content
			}
		}
	}
	for _, p := range sortUnitFirst(effective) {
		if b, ok := byPath[p]; ok {
			new = append(new, File{p, b})
		} else if b, ok := content(p, effective[p]); ok {
			new = append(new, File{p, b})
		}
	}
	return old, new
}

// sortUnitFirst orders paths as systemd applies them: unit files before
// drop-ins, drop-ins by name.
func sortUnitFirst(m map[string]string) []string {
	ps := slices.Sorted(maps.Keys(m))
	slices.SortStableFunc(ps, func(a, b string) int {
		ad, bd := strings.Contains(a, ".d/"), strings.Contains(b, ".d/")
		switch {
		case ad == bd:
			if ad {
				return strings.Compare(a[strings.LastIndexByte(a, '/'):], b[strings.LastIndexByte(b, '/'):])
			}
			return 0
		case ad:
			return 1
		}
		return -1
	})
	return ps
}

// describe says what differs: the files being written or removed, else
// (the files are already in place) how the version the unit runs differs
// from the one it should run.
func describe(a Action, rec UnitRecord, cur Current) string {
	var parts []string
	for _, f := range a.Steps.Writes {
		old := cur.Host.Files[f.Path]
		if old.Exists {
			parts = append(parts, fmt.Sprintf("%s changed (%s → %s)", f.Path, short(old.Hash), short(f.Hash)))
		} else {
			parts = append(parts, fmt.Sprintf("%s new (%s)", f.Path, short(f.Hash)))
		}
	}
	for _, r := range a.Steps.Removes {
		parts = append(parts, r+" removed")
	}
	if len(parts) == 0 {
		for _, p := range slices.Sorted(maps.Keys(a.Record.Effective)) {
			switch old, ok := rec.Applied[p]; {
			case !ok:
				parts = append(parts, fmt.Sprintf("%s new (%s)", p, short(a.Record.Effective[p])))
			case old != a.Record.Effective[p]:
				parts = append(parts, fmt.Sprintf("%s changed (%s → %s)", p, short(old), short(a.Record.Effective[p])))
			}
		}
		for _, p := range slices.Sorted(maps.Keys(rec.Applied)) {
			if _, ok := a.Record.Effective[p]; !ok {
				parts = append(parts, p+" removed")
			}
		}
	}
	if len(parts) == 0 {
		return "running an older version"
	}
	return strings.Join(parts, ", ")
}

func blocked(a Action, why string) Action {
	a.Kind, a.Err, a.Gate = KindBlocked, why, Gate{}
	a.Steps, a.Record.Effective, a.Record.Adopt = Steps{}, nil, false
	return a
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// ranToCompletion: a Type=oneshot unit without RemainAfterExit= whose
// current content the agent already saw run to completion (its record's
// good version). Such a unit goes back to inactive, and systemd may unload
// it and forget that it ran (Ran false): started again, it would run its
// job a second time on every restart of the agent.
func ranToCompletion(st UnitState, rec UnitRecord, key string) bool {
	return st.Type == "oneshot" && !st.RemainAfterExit && len(rec.Good) > 0 && KeyOf(rec.Good) == key
}
