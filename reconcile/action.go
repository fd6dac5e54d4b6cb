package reconcile

import (
	"fmt"
	"maps"
	"slices"
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

// Owned is the manifest's entry for a path the agent owns: the hash of the
// file it wrote there, or, for a template instance it started from an
// empty-valued key, Instance (it owns the running instance, not a file;
// Hash is then ""). The zero value is "not owned".
type Owned struct {
	Hash     string
	Instance bool
}

// instanceKey is the content key of an instance that has no files of its
// own (it runs its template's): ContentKey, Intent.Jobs, UnitRecord.Failed.
const instanceKey = "instance"

// Action is the plan for one unit: what the agent does (Steps), what it
// remembers once done (Record), and what it waits on first (Gate), with
// the kind and reason that sum it up and what it knows of the version.
type Action struct {
	Unit   string
	Kind   Kind
	Reason string // for humans: why this kind
	Err    string // set for KindBlocked, a held unit, and a change that cannot be applied as asked
	Steps  Steps  // what to do
	Record Record // what to remember
	Gate   Gate   // what it waits on (Kind is KindWait while it does)
	// ContentKey identifies the desired content (the unit's files, and its
	// template's for an instance); refusals and failures are remembered
	// against it so the same bad content is not retried.
	ContentKey string
	// Own is what the agent owns of the unit.
	Own Ownership
	// Policy is the unit's policy (the template's for an instance).
	Policy Policy
	// Change is the classification that chose Kind, when one was made.
	Change *Change
	// Scope is the registry target the content came from when it is a
	// group ("groups/web"): MaxUnavailable slots and halts are per scope.
	Scope string
	// Bucket is the label bucket of the unit's MaxUnavailable slot in
	// Scope (MaxUnavailableBy=, with this host's value of the label);
	// zero without MaxUnavailableBy=. Halts stay per Scope.
	Bucket Bucket
	// Hash is the desired unit file hash (the template's for an instance).
	Hash string
}

// Steps are the side effects of an action, in the order the executor does
// them: disable, write, remove, enable (one daemon-reload for the batch),
// then the job. The zero Steps touches nothing.
type Steps struct {
	Writes  []DesiredFile // files to (re)write, in path order
	Removes []string      // managed paths to delete
	Forget  []string      // manifest entries to drop without touching a file (an instance's entry)
	Enable  bool          // enable per [Install] after writing
	Disable bool          // disable before removing or rewriting the unit file
	// ResetFailed: a removed unit ended failed (its stop killed a start,
	// say): forget that, so it does not linger in systemd's failed list.
	ResetFailed bool
	// Job is the systemd job to run once the files are written and loaded.
	Job Job
	// AlsoStop lists units to stop before a restart (a socket's service).
	AlsoStop []string
	// After names a unit whose job of the same pass must end before this
	// one's starts: a service whose socket restarts with it. Run at once,
	// the service's restart raced the socket's, which stops the service
	// first and cannot start while it runs (systemd refuses: "Socket
	// service already active").
	After string
}

// Record is what an action has the agent remember of the unit.
type Record struct {
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
	// Instance marks an empty-valued instance key: the agent records that it
	// owns the running instance (an instance entry in the manifest) instead
	// of writing a file.
	Instance bool
	// TemplateKey is the template's content key when an instance runs its
	// template's new content: a failure of the instance fails it too.
	TemplateKey string
}

// Gate is what a waiting action (KindWait) waits on; the zero Gate, nothing.
type Gate struct {
	On Wait
}

// Wait names what an action waits on.
type Wait int

const (
	WaitNone    Wait = iota
	WaitJob          // a job of the unit in progress
	WaitRolling      // the rolling update of its template: one instance at a time
	WaitSlot         // a MaxUnavailable= slot
	WaitHeld         // the group's rollout of this version is halted
	WaitWriter       // another unit to write a config file its trigger names
)

var waitNames = [...]string{"none", "job", "rolling", "slot", "held", "writer"}

func (w Wait) String() string {
	if int(w) < len(waitNames) {
		return waitNames[w]
	}
	return fmt.Sprintf("Wait(%d)", int(w))
}

// Changes reports whether the action touches files (and so needs a daemon-reload).
func (a Action) Changes() bool { return len(a.Steps.Writes) > 0 || len(a.Steps.Removes) > 0 }

// changesUnitFiles says whether a write or removal is of a file systemd
// reads: a config file alone (configfile.go) needs no daemon-reload.
func (a Action) changesUnitFiles() bool {
	for _, w := range a.Steps.Writes {
		if !IsConfigPath(w.Path) {
			return true
		}
	}
	return slices.ContainsFunc(a.Steps.Removes, func(p string) bool { return !IsConfigPath(p) })
}

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
	// Confirming is the content key of the change that awaits its
	// confirmation by the control plane (ConfirmSec=, confirm.go): a
	// restarted agent confirms it again or puts it back.
	Confirming string `json:"confirming,omitempty"`
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
	// Confirm holds the units of Jobs whose change will await its
	// confirmation (ConfirmSec=): an agent that dies before recording
	// that the job ran must not wait long for a registry the change may
	// have cut off (see agentd run's fallback to the saved snapshot).
	Confirm map[string]string `json:"confirm,omitempty"`
	// Writes maps each path the pass is about to write to the hash it
	// held before ("" when absent), until the writes are done: a file
	// found at that hash after a crash is a write the agent began and
	// did not finish, which the next pass finishes — not drift.
	Writes map[string]string `json:"writes,omitempty"`
}

// Empty reports whether nothing is owed.
func (i Intent) Empty() bool { return !i.Reload && len(i.Jobs) == 0 && len(i.Writes) == 0 }

// Interrupted says lf is what path held before a write of the intent that
// may not have happened (the agent died between its claim and the rename).
func (i Intent) Interrupted(path string, lf LocalFile) bool {
	before, ok := i.Writes[path]
	return ok && (lf.Exists && lf.Hash == before || !lf.Exists && before == "")
}

// InFlight is a job the agent started and has not heard back from.
type InFlight struct {
	Job        Job
	ContentKey string
	Rollback   bool // the job restores the version that ran before
}

// Current is everything Plan needs to know besides the registry: what the
// host is (disk and systemd), what the agent remembers, and what the fleet
// says of this host's rollouts.
type Current struct {
	Host   HostFacts
	Memory Memory
	Fleet  Fleet
}

// HostFacts are what the unit directory and systemd say now.
type HostFacts struct {
	Files map[string]LocalFile // every desired or managed path
	Units map[string]UnitState // every desired or managed unit
	// Manager names the running service manager instance ("" when
	// unknown): see UnitRecord.StartedIn.
	Manager string
	// Loaded is when systemd last loaded the unit files (CLOCK_MONOTONIC
	// µs: its daemon-reload, or its start), read when the agent starts;
	// 0 once the agent reloaded itself or when unknown. A unit started
	// after it runs the files on disk.
	Loaded uint64
	// FileRoots are where the host takes config files (agentd run
	// --file-root; RootOf); nil when unknown (a preview of a host that
	// publishes no facts), empty when it takes none.
	FileRoots []string
}

// Memory is what the agent remembers: its state directory (the manifest,
// the records, kept content, the intent) and what this process did (the
// units it started, the jobs in flight, the windows of HealthySec).
type Memory struct {
	Managed map[string]Owned // the manifest: what the agent owns, by path
	Records map[string]UnitRecord
	// Blobs holds content by hash for the files of Applied and Previous
	// records, so a change can be classified against what the unit
	// actually runs, and rolled back.
	Blobs map[string][]byte
	// Refused maps a unit to the content key systemd refused to load and why.
	Refused map[string]Refusal
	// Started maps a unit to the content key this agent process last
	// started or restarted it with. systemd forgets that a unit ran once it
	// unloads it (an unreferenced unit is unloaded when stopped), so this is
	// what keeps an operator's stop from being undone on the next pass.
	Started map[string]string
	// Verifying lists units inside their HealthySec window after a (re)start.
	Verifying map[string]bool
	// Jobs are the jobs in flight, by unit.
	Jobs map[string]InFlight
	// Intent is the unfinished work of an earlier pass.
	Intent Intent
}

// Fleet is what the other hosts of this host's groups have a say in.
type Fleet struct {
	// Slots maps a unit to the hash for which this host holds its
	// MaxUnavailable slot.
	Slots map[string]string
	// Halts are the halted rollouts of this host's groups, by unit.
	Halts map[string]Halt
	// Labels are this host's labels as it publishes them
	// (Member.Labels): a MaxUnavailableBy= slot is taken in the bucket
	// of this host's value (BucketOf). nil: none.
	Labels map[string]string
}

// Refusal remembers content systemd would not load.
type Refusal struct {
	ContentKey string `json:"contentKey"`
	Reason     string `json:"reason"`
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
		return act.Steps.Writes[0].Shown()
	case act.Hash != "":
		return act.Hash
	}
	return headHash(act.Unit, act.Record.Effective)
}

// Word is the status word of an action of kind k.
func (k Kind) Word() ActionWord { return ActionWord(k.String()) }

// noteStarted records the manager instance a start or restart of the
// agent's ran under (StartedIn).
func (r *UnitRecord) noteStarted(job Job, manager string) {
	if job == JobStart || job == JobRestart {
		r.StartedIn = manager
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
