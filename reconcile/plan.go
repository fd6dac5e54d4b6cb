package reconcile

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Kind is what the agent does to one unit in one pass.
type Kind int

const (
	KindNone      Kind = iota // converged: nothing to do
	KindStart                 // start a unit that should run (files written first, if any)
	KindRestart               // restart in place (files written first)
	KindReload                // ExecReload (or remount) in place; the main PID stays
	KindStopStart             // stop with the OLD definition; the next pass writes and starts
	KindStop                  // the unit should not run (State=stopped) but does
	KindUpdate                // write files and daemon-reload only; the unit keeps running untouched
	KindRemove                // gone from the registry: stop, then disable and remove its files
	KindWait                  // waits its turn: a rolling update, a slot, a job in progress
	KindBlocked               // cannot be applied; Action.Err says why. Nothing is touched.
	KindRollback              // put back the version that ran before a failed change
)

var kindNames = [...]string{"none", "start", "restart", "reload", "stop-start", "stop", "update", "remove", "wait", "blocked", "rolled-back"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Disruptive reports whether the action interrupts the running unit.
func (k Kind) Disruptive() bool {
	return k == KindRestart || k == KindStopStart || k == KindStop
}

// Job is the systemd job an action runs once its files are in place and
// loaded. Jobs run in the background: the loop never waits for one.
type Job int

const (
	JobNone Job = iota
	JobStart
	JobStop
	JobRestart
	JobReload
)

var jobNames = [...]string{"none", "start", "stop", "restart", "reload"}

func (j Job) String() string { return jobNames[j] }

// Ownership is what the agent owns of a unit; removal follows it.
type Ownership int

const (
	OwnNone     Ownership = iota
	OwnFile               // the agent installed the unit file: removal stops, disables, deletes
	OwnDropIns            // only drop-ins on a unit it did not install: removal deletes them, never stops
	OwnInstance           // a template instance it started from an empty key: removal stops it
)

var ownNames = [...]string{"", "file", "drop-ins", "instance"}

func (o Ownership) String() string { return ownNames[o] }

// MarshalText stores the ownership by name in the state directory.
func (o Ownership) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText reads an ownership name.
func (o *Ownership) UnmarshalText(b []byte) error {
	for i, n := range ownNames {
		if n == string(b) {
			*o = Ownership(i)
			return nil
		}
	}
	return fmt.Errorf("unknown ownership %q", b)
}

// InstanceMarker is the manifest "hash" of a template instance the agent
// started from an empty-valued key: it owns the running instance, not a file.
const InstanceMarker = "instance"

// Action is the plan for one unit.
type Action struct {
	Unit    string
	Kind    Kind
	Reason  string        // for humans: why this kind
	Writes  []DesiredFile // files to (re)write, in path order
	Removes []string      // managed paths to delete
	Forget  []string      // manifest entries to drop without touching a file (instance markers)
	Enable  bool          // enable per [Install] after writing
	Disable bool          // disable before removing or rewriting the unit file
	// Job is the systemd job to run once the files are written and loaded.
	Job Job
	// AlsoStop lists units to stop before a restart (a socket's service).
	AlsoStop []string
	// Instance marks an empty-valued instance key: the agent records that it
	// owns the running instance (InstanceMarker) instead of writing a file.
	Instance bool
	Err      string // set for KindBlocked, and for a change that cannot be applied as asked
	// ContentKey identifies the desired content (the unit's files, and its
	// template's for an instance); refusals and failures are remembered
	// against it so the same bad content is not retried.
	ContentKey string
	// Effective is path -> hash of every file the running unit will be on
	// once the action is done: recorded as UnitRecord.Applied.
	Effective map[string]string
	// Adopt: the unit already runs Effective without a job (a change that
	// needs only a daemon-reload): record it as applied now.
	Adopt bool
	// Ran: the job an interrupted pass owed has run (Current.Loaded): the
	// adopted version is judged like one a job just started.
	Ran bool
	// Refuse: systemd would not load this content; remember it (the
	// Writes and Removes put back what ran before).
	Refuse *Refusal
	// DropRecord: the unit is gone; forget what the agent remembered of it.
	DropRecord bool
	// ResetFailed: a removed unit ended failed (its stop killed a start,
	// say): forget that, so it does not linger in systemd's failed list.
	ResetFailed bool
	// Own is what the agent owns of the unit.
	Own Ownership
	// Policy is the unit's policy (the template's for an instance).
	Policy Policy
	// Change is the classification that chose Kind, when one was made.
	Change *Change
	// Scope is the registry target the content came from when it is a
	// group ("groups/web"): MaxUnavailable slots and halts are per scope.
	Scope string
	// Hash is the desired unit file hash (the template's for an instance).
	Hash string
	// NeedSlot marks a KindWait that waits for a MaxUnavailable slot.
	NeedSlot bool
	// TemplateKey is the template's content key when an instance runs its
	// template's new content: a failure of the instance fails it too.
	TemplateKey string
}

// Changes reports whether the action touches files (and so needs a daemon-reload).
func (a Action) Changes() bool { return len(a.Writes) > 0 || len(a.Removes) > 0 }

// LocalFile is what the unit directory holds at one path.
type LocalFile struct {
	Exists  bool
	Hash    string
	Content []byte
	Err     string // not a regular file, unreadable, ...
}

// UnitRecord is what the agent remembers about a unit across restarts
// (persisted in the state directory).
type UnitRecord struct {
	// Applied is path -> hash of the files the running unit was last
	// started, restarted or reloaded with (or judged current without one).
	// It is recorded only once the job's outcome is known.
	Applied map[string]string `json:"applied,omitempty"`
	// Previous is what ran before Applied, kept until Applied is judged
	// healthy: what a rollback restores, verified or not.
	Previous map[string]string `json:"previous,omitempty"`
	// Good is the last version that was judged healthy.
	Good map[string]string `json:"good,omitempty"`
	// Failed is the content key that failed (it is not retried until the
	// registry content changes); FailedOp the job that failed with it.
	Failed     string `json:"failed,omitempty"`
	FailReason string `json:"failReason,omitempty"`
	FailedOp   string `json:"failedOp,omitempty"`
	// Own is what the agent owns of the unit (kept after its drop-ins are
	// removed, until the change has been applied to the running unit).
	Own Ownership `json:"own,omitempty"`
	// StartedIn is the service manager instance (Current.Manager) under
	// which the agent last started or restarted the unit: systemd forgets
	// that an inactive unit ran once it unloads it, and an operator's stop
	// must outlive an agent restart.
	StartedIn string `json:"startedIn,omitempty"`
}

// Empty reports whether there is nothing worth remembering.
func (r UnitRecord) Empty() bool {
	return len(r.Applied) == 0 && len(r.Previous) == 0 && len(r.Good) == 0 && r.Failed == "" && r.Own == OwnNone
}

// Intent is the work a pass has begun and not finished, recorded in the
// state directory before its first side effect: after a crash, SIGTERM or
// a failed daemon-reload, the next pass finishes it.
type Intent struct {
	// Reload: files were (or were about to be) written and the
	// daemon-reload that loads them has not succeeded yet.
	Reload bool `json:"reload,omitempty"`
	// Jobs maps a unit to the content key of a job whose outcome is not
	// known yet.
	Jobs map[string]string `json:"jobs,omitempty"`
}

// Empty reports whether nothing is owed.
func (i Intent) Empty() bool { return !i.Reload && len(i.Jobs) == 0 }

// InFlight is a job the agent started and has not heard back from.
type InFlight struct {
	Job        Job
	ContentKey string
	Rollback   bool // the job restores the version that ran before
}

// Current is everything Plan needs to know about the host.
type Current struct {
	Files   map[string]LocalFile // every desired or managed path
	Managed map[string]string    // the manifest: path -> hash (or InstanceMarker)
	Units   map[string]UnitState // every desired or managed unit
	Records map[string]UnitRecord
	// Blobs holds content by hash for the files of Applied and Previous
	// records, so a change can be classified against what the unit
	// actually runs, and rolled back.
	Blobs map[string][]byte
	// Refused maps a unit to the content key systemd refused to load and why.
	Refused map[string]Refusal
	// Manager names the running service manager instance ("" when
	// unknown): see UnitRecord.StartedIn.
	Manager string
	// Loaded is when systemd last loaded the unit files (CLOCK_MONOTONIC
	// µs: its daemon-reload, or its start), read when the agent starts;
	// 0 once the agent reloaded itself or when unknown. A unit started
	// after it runs the files on disk.
	Loaded uint64
	// Started maps a unit to the content key this agent process last
	// started or restarted it with. systemd forgets that a unit ran once it
	// unloads it (an unreferenced unit is unloaded when stopped), so this is
	// what keeps an operator's stop from being undone on the next pass.
	Started map[string]string
	// Verifying lists units inside their HealthySec window after a (re)start.
	Verifying map[string]bool
	// Slots maps a unit to the hash for which this host holds its
	// MaxUnavailable slot.
	Slots map[string]string
	// Halts are the halted rollouts of this host's groups, by unit.
	Halts map[string]Halt
	// Jobs are the jobs in flight, by unit.
	Jobs map[string]InFlight
	// Intent is the unfinished work of an earlier pass.
	Intent Intent
}

// Refusal remembers content systemd would not load.
type Refusal struct {
	ContentKey string
	Reason     string
}

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
		return InstanceMarker
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
	for p := range cur.Managed {
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
	for n := range cur.Records {
		names[n] = true
	}
	var out []Action
	rolling := map[string]bool{} // templates with an instance mid-update
	for n := range cur.Verifying {
		if IsInstance(n) {
			rolling[TemplateOf(n)] = true
		}
	}
	for n, j := range cur.Jobs {
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
				a = waiting(a, "waiting for the rolling update of "+t+": one instance at a time ("+a.Reason+")")
			}
			rolling[t] = true
		}
		// MaxUnavailable: the disruptive part waits for a slot shared by
		// every host of the group (nothing is written before it either).
		// Instances share their template's slot, and a template's new files
		// wait for it too while instances run: the template set is the unit
		// of rollout.
		if (a.Kind.Disruptive() || templateChangeDisrupts(a, cur)) && a.Policy.MaxUnavailable > 0 && a.Scope != "" && cur.Slots[SlotKey(name)] == "" {
			a = waiting(a, fmt.Sprintf("waiting for a rollout slot (MaxUnavailable=%d in %s) to %s", a.Policy.MaxUnavailable, a.Scope, a.Reason))
			a.NeedSlot = true
		}
		out = append(out, a)
	}
	return out
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
	for u, st := range cur.Units {
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
// waiting for its slot, a job in flight, or a unit inside HealthySec. Every
// other slot it holds or queues for is given back. Pure.
func SlotsNeeded(plan []Action, cur Current) map[string]SlotNeed {
	need := map[string]SlotNeed{}
	for _, a := range plan {
		if a.Policy.MaxUnavailable <= 0 || a.Scope == "" {
			continue
		}
		_, inflight := cur.Jobs[a.Unit]
		if a.NeedSlot || a.Kind.Disruptive() || inflight || cur.Verifying[a.Unit] {
			need[SlotKey(a.Unit)] = SlotNeed{Scope: a.Scope, Hash: a.Hash, Limit: a.Policy.MaxUnavailable}
		}
	}
	return need
}

// ReloadNeeded says whether the plan owes a daemon-reload before its jobs:
// files or enablement change, an earlier pass was cut off before its
// reload, or systemd itself says a unit about to get a job has a newer file
// on disk than it loaded (NeedDaemonReload). Pure.
func ReloadNeeded(plan []Action, cur Current) (bool, string) {
	if cur.Intent.Reload {
		return true, "a daemon-reload owed by an interrupted pass"
	}
	for _, a := range plan {
		if a.Changes() || a.Enable || a.Disable {
			return true, "unit files changed"
		}
	}
	for _, a := range plan {
		if a.Job != JobNone && cur.Units[a.Unit].NeedDaemonReload {
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
	if h, ok := cur.Managed[name]; ok {
		if h == InstanceMarker {
			return OwnInstance
		}
		return OwnFile
	}
	for p := range cur.Managed {
		if UnitOfPath(p) == name {
			return OwnDropIns
		}
	}
	return cur.Records[name].Own
}

func planUnit(name string, d *DesiredUnit, managed []string, desired map[string]*DesiredUnit, cur Current) Action {
	st := cur.Units[name]
	rec := cur.Records[name]
	a := Action{Unit: name, Own: ownershipOf(name, d, cur)}
	if d == nil {
		return planRemove(a, managed, cur)
	}
	if d.Err != nil {
		return blocked(a, d.Err.Error())
	}

	// Ownership first: never overwrite what is not ours.
	isManaged := map[string]bool{}
	for _, p := range managed {
		isManaged[p] = true
	}
	for _, f := range d.Files() {
		lf := cur.Files[f.Path]
		if lf.Err != "" {
			return blocked(a, fmt.Sprintf("%s: %s", f.Path, lf.Err))
		}
		if lf.Exists && !isManaged[f.Path] {
			return blocked(a, fmt.Sprintf("unmanaged file: %s exists and agentd did not write it; not overwriting (move it away to let agentd manage it)", f.Path))
		}
		if !lf.Exists || lf.Hash != f.Hash {
			a.Writes = append(a.Writes, f)
		}
	}
	wanted := map[string]bool{}
	for _, f := range d.Files() {
		wanted[f.Path] = true
	}
	for _, p := range managed {
		switch {
		case wanted[p]:
		case cur.Managed[p] == InstanceMarker:
			if !d.Instance {
				a.Forget = append(a.Forget, p)
			}
		default:
			a.Removes = append(a.Removes, p)
		}
	}

	// What the unit runs on once converged: its own files, and for an
	// instance its template's (unless the template's change was rolled back).
	effective := fileHashes(d.Files())
	backToOld := false // an instance goes back to the template set that ran before a failure
	p := d.Policy
	if IsInstance(name) {
		a.Instance = d.Instance
		if t := desired[TemplateOf(name)]; t != nil && t.Err == nil {
			tkey := ContentKey(t)
			if tr := cur.Records[t.Name]; tr.Failed == tkey || cur.Refused[t.Name].ContentKey == tkey {
				if len(tr.Applied) > 0 {
					maps.Copy(effective, tr.Applied)
					backToOld = true
				}
			} else {
				maps.Copy(effective, fileHashes(t.Files()))
				a.TemplateKey = tkey
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
	a.Effective = effective
	a.ContentKey = KeyOf(effective)
	if d.Instance && len(effective) == 0 {
		a.ContentKey = InstanceMarker
	}
	changed := a.Changes()
	if j, ok := cur.Jobs[name]; ok && j.ContentKey == a.ContentKey && !changed {
		return waiting(a, j.Job.String()+" job in progress")
	}
	if r, ok := cur.Refused[name]; ok && r.ContentKey == a.ContentKey {
		return blocked(a, r.Reason)
	}
	if !changed && (st.LoadState == "bad-setting" || st.LoadState == "error") && !st.NeedDaemonReload && KeyOf(rec.Applied) != a.ContentKey {
		return planRefused(a, rec, st, cur)
	}
	if rec.Failed != "" && rec.Failed == a.ContentKey {
		if j, ok := cur.Jobs[name]; ok && j.Rollback {
			// The files are back; the disk differs from the registry until
			// the content changes, which must not start the rollback again.
			return waiting(a, "rollback "+j.Job.String()+" job in progress")
		}
		if IsTemplate(name) {
			if rb, ok := planTemplateRollback(a, rec, managed, cur); ok {
				return rb
			}
		} else if rb, ok := planRollback(a, rec, managed, cur); ok {
			return rb
		}
		return blocked(a, rec.FailReason+"; not retried until the registry content changes")
	}
	applied := KeyOf(rec.Applied)
	// pending: an earlier pass began this content's job and never heard back.
	pending := cur.Intent.Jobs[name] == a.ContentKey
	if pending && !changed && cur.Loaded != 0 && st.ActiveState == "active" && !st.NeedDaemonReload && st.InactiveExitMono > cur.Loaded {
		// ... but it did: the unit started after systemd last loaded the
		// unit files, which are the desired ones (nothing to write, no
		// newer file) — the agent died after the job, before recording it.
		pending, a.Ran = false, true
		a.Reason = "the job owed by a pass the agent did not finish ran: the unit started after systemd loaded its current files"
	}
	// stale: the running unit is known to run other content than desired.
	stale := len(rec.Applied) > 0 && applied != a.ContentKey && !a.Ran || pending
	// A halted rollout: another host of the group failed this version.
	if h, ok := cur.Halts[SlotKey(name)]; ok && !backToOld && a.Scope != "" && h.Scope == a.Scope && h.Hash == a.Hash && (changed || stale) {
		a = waiting(a, fmt.Sprintf("held: the rollout of %s is halted: %s failed it: %s", short(h.Hash), h.Host, h.Reason))
		a.Err, a.Effective = a.Reason, nil
		return a
	}
	planEnable(&a, st, changed)

	switch {
	case a.Own == OwnDropIns:
		planForeign(&a, st, changed, stale, rec, d, desired, cur)
	case IsTemplate(name) || p.State == StatePresent:
		if changed {
			a.Kind, a.Reason = KindUpdate, describe(a, rec, cur)+"; State=present: not started or stopped"
		}
	case p.State == StateStopped:
		switch {
		case st.Active():
			a.Kind, a.Job, a.Reason = KindStop, JobStop, "State=stopped and the unit is "+st.ActiveState
			if changed {
				a.Reason = describe(a, rec, cur) + "; " + a.Reason
			}
		case changed:
			a.Kind, a.Reason = KindUpdate, describe(a, rec, cur)+"; State=stopped"
		}
	case !st.Active():
		// State=started, and the unit is not running.
		switch {
		case changed || (stale && cur.Started[name] != a.ContentKey):
			a.Kind, a.Job, a.Reason = KindStart, JobStart, describe(a, rec, cur)
			if !changed && !pending {
				a.Reason = "content changed while the unit was stopped"
			}
			if p.OnChange == "stop-start" && (changed || stale) {
				a.Kind = KindStopStart // the second half: the old version is down
			}
		case d.Instance && !isManaged[name]:
			a.Kind, a.Job, a.Reason = KindStart, JobStart, "new instance of "+TemplateOf(name)
		case !st.Ran && st.LoadState == "loaded" && cur.Started[name] != a.ContentKey && !ranToCompletion(st, rec, a.ContentKey) &&
			!(cur.Manager != "" && rec.StartedIn == cur.Manager && KeyOf(rec.Applied) == a.ContentKey):
			// Not run since the manager started (a boot, or the agent was
			// away): start it. A unit that ran and stopped or failed is left
			// as it is — an operator's stop is respected, and a crash is
			// systemd's Restart= to handle; both show in status. So is one
			// the agent started under this very manager: systemd unloaded
			// it once stopped and forgot it ran, the agent did not.
			a.Kind, a.Job, a.Reason = KindStart, JobStart, "not started since the manager started"
		}
	case changed || stale:
		planChange(&a, st, changed, rec, d, desired, cur)
	}
	if a.Kind == KindNone && (a.Enable || a.Disable) {
		a.Kind, a.Reason = KindUpdate, "enable per [Install]"
		if a.Disable && !a.Enable {
			a.Reason = "disable: Enable=no, or no [Install] section"
		}
	}
	if (a.Kind == KindUpdate || a.Kind == KindNone) && a.Effective != nil && st.Active() && applied != a.ContentKey {
		a.Adopt = true
	}
	return a
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
		a.Enable = true
	case !want && st.UnitFileState == "enabled":
		a.Disable = true
	}
}

// planChange picks the least disruption for an active unit whose content
// changes.
func planChange(a *Action, st UnitState, changed bool, rec UnitRecord, d *DesiredUnit, desired map[string]*DesiredUnit, cur Current) {
	name, p := a.Unit, a.Policy
	oldFiles, newFiles := filesForClassify(name, rec, a.Effective, d, desired, cur)
	if len(rec.Applied) == 0 && cur.Intent.Jobs[name] == a.ContentKey {
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
			a.Effective = nil
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
		a.Writes, a.Removes, a.Enable, a.Disable, a.Effective = nil, nil, false, false, nil
		a.Job = JobStop
		return
	case "none":
		if changed {
			a.Kind, a.Reason = KindUpdate, what+"; OnChange=none: restart pending"
		}
		a.Effective = nil // the unit keeps running the old content
	default:
		a.Kind, a.Reason = autoKind(name, c)
		if a.Kind == KindReload && !canReload {
			a.Kind, a.Reason = KindRestart, c.Reason()+": the new version cannot reload, restart"
		}
		if c.Kind == ChangeInstall && a.Own == OwnFile && p.HasInstall && p.Enable {
			a.Enable, a.Disable = true, true
		}
		if a.Kind == KindUpdate && !changed {
			a.Kind = KindNone // nothing to write: just record that it runs current content
		}
		a.Reason = what + "; " + a.Reason
	}
	a.Job = jobOf(a.Kind)
	if a.Kind == KindRestart && strings.HasSuffix(name, ".socket") {
		if svc := socketService(name, d); svc != "" {
			a.AlsoStop = []string{svc}
		}
	}
}

// planForeign applies drop-ins on a unit the agent did not install: it is
// never started, stopped, enabled or disabled; an active one gets the change
// like any other (restart, reload or nothing, as the change needs).
func planForeign(a *Action, st UnitState, changed, stale bool, rec UnitRecord, d *DesiredUnit, desired map[string]*DesiredUnit, cur Current) {
	a.Enable, a.Disable = false, false
	switch {
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

// planRemove: the registry no longer wants the unit. What happens follows
// what the agent owns of it.
func planRemove(a Action, managed []string, cur Current) Action {
	st := cur.Units[a.Unit]
	rec := cur.Records[a.Unit]
	a.Kind = KindRemove
	if j, ok := cur.Jobs[a.Unit]; ok && (j.Job == JobStop || a.Own == OwnDropIns) {
		// A hung start is replaced by the stop; anything else is waited out.
		return waiting(a, "removed from the registry: "+j.Job.String()+" job in progress")
	}
	switch a.Own {
	case OwnDropIns:
		if len(managed) > 0 {
			a.Removes = managed
			a.Reason = "drop-ins removed from the registry; " + a.Unit + " itself is not agentd's: never stopped, disabled or deleted"
			a.Own = OwnDropIns
			return a
		}
		// The drop-ins are gone from disk and systemd has reloaded: apply
		// their removal to the running unit, if it had an effect.
		a.Reason = "drop-ins removed"
		if !st.Active() || len(rec.Applied) == 0 {
			a.Kind, a.DropRecord = KindNone, true
			return a
		}
		var old []File
		for _, p := range sortUnitFirst(rec.Applied) {
			b, ok := cur.Blobs[rec.Applied[p]]
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
			a.Kind, a.DropRecord = KindNone, true
			a.Reason = "drop-ins removed: " + c.Reason()
			return a
		}
		a.Kind, a.Job = KindRestart, JobRestart
		a.Reason = "drop-ins removed: " + c.Reason() + ": restart (the unit is not agentd's: never stopped)"
		a.Effective = map[string]string{}
		a.ContentKey = KeyOf(a.Effective)
		a.Policy = Policy{State: StateStarted} // no HealthySec, no rollback: there is nothing to go back to
		return a
	case OwnFile, OwnInstance:
		if st.Active() || st.ActiveState == "deactivating" {
			a.Job = JobStop
			a.Reason = "removed from the registry: stopping"
			return a
		}
		// Stopped: disable, delete, and one daemon-reload for both.
		a.Disable = st.UnitFileState == "enabled" && a.Own == OwnFile && !IsTemplate(a.Unit) && !IsInstance(a.Unit)
		for _, p := range managed {
			if cur.Managed[p] == InstanceMarker {
				a.Forget = append(a.Forget, p) // no file: the agent owns only the running instance
			} else {
				a.Removes = append(a.Removes, p)
			}
		}
		a.Reason = "removed from the registry"
		a.DropRecord = true
		a.ResetFailed = st.ActiveState == "failed"
		return a
	}
	a.Kind, a.DropRecord = KindNone, true
	return a
}

// planRefused: systemd would not load the content just written. Put back
// the files the unit ran with (or remove the new ones) and remember the
// content, so it is not tried again until the registry changes.
func planRefused(a Action, rec UnitRecord, st UnitState, cur Current) Action {
	reason := fmt.Sprintf("systemd refused to load %s (%s): %s", a.Unit, st.LoadState, orUnknown(st.LoadError))
	key, effective := a.ContentKey, a.Effective
	b := blocked(a, reason)
	b.Refuse = &Refusal{ContentKey: key, Reason: reason}
	for _, p := range slices.Sorted(maps.Keys(effective)) {
		old, ran := rec.Applied[p]
		switch {
		case ran && old == effective[p]:
		case ran:
			content, ok := cur.Blobs[old]
			if !ok {
				b.Err += fmt.Sprintf("; the previous version of %s (%s) is not kept, left as it is", p, short(old))
				continue
			}
			b.Writes = append(b.Writes, DesiredFile{Path: p, Content: content, Hash: old})
		case cur.Managed[p] != "":
			b.Removes = append(b.Removes, p)
		}
	}
	return b
}

// planRollback: a change failed and the unit still runs it. Put back the
// version that ran before it (verified or not) and restart onto it. ok is
// false when there is nothing to do: Rollback=no, no earlier version, or
// already rolled back.
func planRollback(a Action, rec UnitRecord, managed []string, cur Current) (Action, bool) {
	if !a.Policy.Rollback || len(rec.Previous) == 0 || KeyOf(rec.Applied) == KeyOf(rec.Previous) || KeyOf(rec.Previous) == rec.Failed {
		return a, false
	}
	r := a
	r.Kind, r.Job, r.Enable, r.Disable, r.Adopt = KindRollback, JobRestart, false, false, false
	r.Writes, r.Removes, r.Forget = nil, nil, nil
	r.Reason = rec.FailReason + "; rolling back to " + short(headHash(a.Unit, rec.Previous)) + " (the version that ran before)"
	for _, p := range slices.Sorted(maps.Keys(rec.Previous)) {
		h := rec.Previous[p]
		if lf := cur.Files[p]; lf.Exists && lf.Hash == h {
			continue
		}
		content, ok := cur.Blobs[h]
		if !ok {
			return blocked(a, fmt.Sprintf("%s; cannot roll back: the previous version of %s (%s) is not kept", rec.FailReason, p, short(h))), true
		}
		r.Writes = append(r.Writes, DesiredFile{Path: p, Content: content, Hash: h})
	}
	// Files the failed version added (a new drop-in, here or on the
	// template) go: the rolled-back unit must not run with them.
	gone := map[string]bool{}
	for p := range a.Effective {
		gone[p] = true
	}
	for _, p := range managed {
		gone[p] = true
	}
	for _, p := range slices.Sorted(maps.Keys(gone)) {
		if _, keep := rec.Previous[p]; !keep && cur.Managed[p] != "" && cur.Managed[p] != InstanceMarker {
			r.Removes = append(r.Removes, p)
		}
	}
	if rec.FailedOp == KindReload.String() {
		r.Job = JobNone // a failed reload left the old process running: put the files back only
		r.Adopt = true
	}
	r.Effective = rec.Previous
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
	r.Kind, r.Job, r.Enable, r.Disable, r.Adopt, r.Effective = KindRollback, JobNone, false, false, false, nil
	r.Writes, r.Removes, r.Forget = nil, nil, nil
	for _, p := range slices.Sorted(maps.Keys(rec.Applied)) {
		h := rec.Applied[p]
		if lf := cur.Files[p]; lf.Exists && lf.Hash == h {
			continue
		}
		content, ok := cur.Blobs[h]
		if !ok {
			return blocked(a, fmt.Sprintf("%s; cannot roll back: the previous version of %s (%s) is not kept", rec.FailReason, p, short(h))), true
		}
		r.Writes = append(r.Writes, DesiredFile{Path: p, Content: content, Hash: h})
	}
	for _, p := range managed {
		if _, keep := rec.Applied[p]; !keep && cur.Managed[p] != InstanceMarker {
			r.Removes = append(r.Removes, p)
		}
	}
	if !r.Changes() {
		return a, false
	}
	r.Reason = rec.FailReason + "; rolling the template set back to " + short(headHash(a.Unit, rec.Applied)) + " (what the instances ran before)"
	return r, true
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

// waiting turns an action into a wait: nothing is written or run.
func waiting(a Action, why string) Action {
	a.Kind, a.Reason, a.Job = KindWait, why, JobNone
	a.Writes, a.Removes, a.Forget, a.Enable, a.Disable, a.Adopt, a.AlsoStop = nil, nil, nil, false, false, false, nil
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
		if b, ok := cur.Blobs[hash]; ok {
			return b, true
		}
		if lf := cur.Files[path]; lf.Exists && lf.Hash == hash {
			return lf.Content, true
		}
		return nil, false
	}
	oldMap := rec.Applied
	if len(oldMap) == 0 {
		oldMap = map[string]string{}
		for p := range effective {
			if lf := cur.Files[p]; lf.Exists {
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
			byPath[f.Path] = f.Content
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
	for _, f := range a.Writes {
		old := cur.Files[f.Path]
		if old.Exists {
			parts = append(parts, fmt.Sprintf("%s changed (%s → %s)", f.Path, short(old.Hash), short(f.Hash)))
		} else {
			parts = append(parts, fmt.Sprintf("%s new (%s)", f.Path, short(f.Hash)))
		}
	}
	for _, r := range a.Removes {
		parts = append(parts, r+" removed")
	}
	if len(parts) == 0 {
		for _, p := range slices.Sorted(maps.Keys(a.Effective)) {
			switch old, ok := rec.Applied[p]; {
			case !ok:
				parts = append(parts, fmt.Sprintf("%s new (%s)", p, short(a.Effective[p])))
			case old != a.Effective[p]:
				parts = append(parts, fmt.Sprintf("%s changed (%s → %s)", p, short(old), short(a.Effective[p])))
			}
		}
		for _, p := range slices.Sorted(maps.Keys(rec.Applied)) {
			if _, ok := a.Effective[p]; !ok {
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
	a.Kind, a.Job = KindBlocked, JobNone
	a.Err = why
	a.Writes, a.Removes, a.Forget, a.Enable, a.Disable, a.Effective, a.Adopt, a.AlsoStop = nil, nil, nil, false, false, nil, false, nil
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
