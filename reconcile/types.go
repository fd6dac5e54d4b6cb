// Package reconcile decides and applies what an agent does to the units of
// its host. It owns the domain types; the adapters (registry, systemd,
// unitdir) import it, never the other way round.
//
// Plan is pure: it maps desired state (from the registry) and current state
// (from disk and D-Bus) to actions. Agent is the loop around it: on one
// goroutine (Run) it observes state, judges health, calls Plan, executes
// the actions in a fixed order with one daemon-reload per batch, records
// the outcome and hands statuses on; systemd jobs, slot waits and
// publishing (statuses, facts) run in goroutines it owns.
package reconcile

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"
)

// Hash is the identity of a unit file's content: hex SHA-256 of its exact
// bytes, the same bytes that are written to disk.
func Hash(content []byte) string {
	sum := sha256.Sum256(content)
	return hex.EncodeToString(sum[:])
}

// Scope says where a registry entry came from.
type Scope int

const (
	ScopeHost Scope = iota
	ScopeGroup
)

func (s Scope) String() string {
	if s == ScopeGroup {
		return "group"
	}
	return "host"
}

// Entry is one unit key read from the registry, before validation.
type Entry struct {
	Scope Scope
	Group string // set when Scope is ScopeGroup
	Unit  string // key suffix after ".../units/": a unit name or "<unit>.d/<name>.conf"
	Value []byte
	// ModRevision is the etcd revision that last wrote the key.
	ModRevision int64
}

// Snapshot is a complete, consistent read of every key meant for one host.
type Snapshot struct {
	Revision int64
	Entries  []Entry
	// Halts are the stopped rollouts of this host's groups.
	Halts []Halt
	// Signatures are the signature records beside the unit keys
	// (<p>/hosts/<h>/signatures/<key>, <p>/groups/<g>/signatures/<key>),
	// as Entries: Unit is the unit key they sign for, Value the
	// SignatureRecord's JSON. Read with the keys, at the same revision.
	Signatures []Entry
}

// Halt stops a group's rollout of one unit version after a host failed it
// or rolled it back: hosts that have not applied that version hold off.
// Putting new content for the unit resumes the rollout (the hash differs).
// Stored at <prefix>/halts/<scope>/<unit>.
type Halt struct {
	Scope  string    `json:"scope"` // "groups/<group>"
	Unit   string    `json:"unit"`
	Hash   string    `json:"hash"` // the unit file hash that failed
	Host   string    `json:"host"` // who failed it
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// UnitState is what systemd says about a unit right now. Every field is one
// of systemd's own properties (named after it); health and plans are judged
// from these, never from what the agent assumes it did.
type UnitState struct {
	LoadState   string // loaded, not-found, bad-setting, error, masked
	LoadError   string // systemd's message when LoadState is not "loaded"
	ActiveState string // active, reloading, inactive, failed, activating, deactivating
	SubState    string
	Result      string // the unit's Result property (success, exit-code, signal, ...)
	MainPID     uint32
	CanReload   bool  // the unit has ExecReload= (or its type can reload)
	ExitStatus  int32 // a service's ExecMainStatus: exit code or signal number
	// Ran is true when the unit has left "inactive" at least once since the
	// manager started (InactiveExitTimestampMonotonic != 0). It lets the agent
	// start a unit after boot without fighting an operator who stopped it.
	Ran bool

	// Type is a service's Type= (simple, exec, forking, oneshot, dbus,
	// notify, notify-reload, idle); "" for other unit types.
	Type string
	// RemainAfterExit is a service's RemainAfterExit=.
	RemainAfterExit bool
	// NRestarts counts the automatic restarts (Restart=) of a service since
	// it was last started by a job; it grows while a service crash-loops.
	NRestarts uint32
	// The unit's state-change timestamps, CLOCK_MONOTONIC µs (0: never).
	ActiveEnterMono, ActiveExitMono, InactiveEnterMono, InactiveExitMono uint64
	// NeedDaemonReload is true when the file on disk differs from what
	// systemd has loaded: a daemon-reload is still owed.
	NeedDaemonReload bool
	// UnitFileState is enabled, disabled, static, indirect, generated, ...
	UnitFileState string
	// TimeoutStartUSec and TimeoutStopUSec are the unit's own job timeouts
	// (services, sockets, mounts); 0 when the type has none, math.MaxUint64
	// for infinity.
	TimeoutStartUSec, TimeoutStopUSec uint64
	// Light marks a state taken from the listing of many units at once
	// (ListUnitsByNames) for a unit systemd had just loaded for the first
	// time: only LoadState ("loaded"), ActiveState ("inactive") and
	// SubState are systemd's; the rest is what such a unit has — it never
	// ran, it has no newer file (NeedDaemonReload=no), no result — and its
	// timeouts and UnitFileState are not known. A job on it reads its
	// timeouts once systemd has queued it (Systemd.Timeouts, Systemd.Queue); the
	// read after the job is a full one.
	Light bool
}

// ErrOutcomeUnknown marks a job whose outcome the agent cannot know: its own
// wait ran out, or the connection to systemd went away. The unit is observed
// again; such an outcome alone never causes a rollback or a halt.
var ErrOutcomeUnknown = errors.New("job outcome unknown")

// Active reports whether the unit is up or on its way up.
func (s UnitState) Active() bool {
	switch s.ActiveState {
	case "active", "reloading", "activating":
		return true
	}
	return false
}

// Status is what an agent publishes per unit at <prefix>/status/<host>/<unit>
// and serves on its debug socket. Field names are the documented contract.
type Status struct {
	Unit        string `json:"unit"`
	Hash        string `json:"hash"`        // SHA-256 of the local file ("" when absent)
	DesiredHash string `json:"desiredHash"` // SHA-256 of the registry value ("" when not in the registry)
	// Revision is the registry revision that wrote the unit file the host
	// has on disk, when that file is the registry's (0 otherwise).
	Revision int64 `json:"revision,omitempty"`
	// DropIns maps each drop-in the agent manages for this unit to the
	// hash of the file on disk.
	DropIns     map[string]string `json:"dropIns,omitempty"`
	LoadState   string            `json:"loadState,omitempty"`
	ActiveState string            `json:"activeState"`
	SubState    string            `json:"subState"`
	UnitResult  string            `json:"unitResult,omitempty"` // systemd's Result property
	MainPID     uint32            `json:"mainPID,omitempty"`
	// NRestarts is systemd's count of automatic restarts (Restart=) since
	// the unit was last started by a job: a rollout's --max-restarts.
	NRestarts uint32 `json:"nRestarts,omitempty"`
	// Verifying is true while a (re)started unit has not yet been active
	// for HealthySec; a failure in that window is rolled back.
	Verifying bool `json:"verifying,omitempty"`
	// Confirming is true while a change of a unit with ConfirmSec= waits
	// for the agent to prove it still reaches the registry; unconfirmed in
	// time, it is rolled back ("lost control plane").
	Confirming bool `json:"confirming,omitempty"`
	// PendingRestart is true when the file changed but OnChange=none kept
	// the running unit on the old content.
	PendingRestart bool `json:"pendingRestart,omitempty"`
	// Health is the agent's verdict on the version the unit runs, judged
	// from systemd's properties (see Health): verifying, healthy,
	// unhealthy or unknown; empty when no verdict applies (State=present,
	// a template). A oneshot that ran to completion is healthy though
	// inactive.
	Health HealthWord `json:"health,omitempty"`
	// Probe is the last result of the unit's health probes ([X-Agentd]
	// HealthCmd=, HealthURL=, HealthTCP=) and the failures in a row, e.g.
	// "HealthURL http://127.0.0.1:8080/: 500 (want 2xx), 3 failures in a
	// row (HealthRetries=3)"; empty without probes or before the first.
	// Failing after HealthySec makes Health "unhealthy" and sets Error.
	Probe string `json:"probe,omitempty"`
	// RunsHash is, for a template instance, the hash of the template file
	// the running instance was last started with: `--wait` on a template
	// waits until every instance runs the new one.
	RunsHash string `json:"runsHash,omitempty"`
	// Job is the systemd job the agent is waiting on for this unit, if any.
	Job    string     `json:"job,omitempty"`
	Action ActionWord `json:"action"` // last action taken on this unit
	// SlotBucket names, while Action is wait-slot, the label bucket of
	// the MaxUnavailable= slot the unit waits for ([X-Agentd]
	// MaxUnavailableBy=): "rack=r1", or "(no rack)" for a host without the
	// label; empty for a slot of the whole group.
	SlotBucket string     `json:"slotBucket,omitempty"`
	Result     ResultWord `json:"result"`           // result of that action: done, failed, timeout, refused, ...
	Error      string     `json:"error,omitempty"`  // why the unit is not converged, if it is not
	Source     string     `json:"source,omitempty"` // registry key scope: "host" or "group:<name>"
	UpdatedAt  time.Time  `json:"updatedAt"`
}

// Member is an agent's membership record at <prefix>/agents/<host>.
type Member struct {
	Host      string    `json:"host"`
	MachineID string    `json:"machineID"`
	Groups    []string  `json:"groups"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"startedAt"`
	// PassRecords says the agent publishes its pass record (Pass): a
	// client judges its answers by revision only then. An agent from
	// before pass records is judged by its statuses alone.
	PassRecords bool `json:"passRecords,omitempty"`
	// Recipient is the agent's age recipient (age1… or ssh-ed25519 …):
	// what `unit put --secret` encrypts to for this host. Empty: an agent
	// from before secrets.
	Recipient string `json:"recipient,omitempty"`
	// Labels are the host's labels (agentd run --label K=V) and the facts
	// its agent read off it (arch, hostname, os.id, os.version_id,
	// systemd.version), valid Kubernetes-style labels: what `agentd hosts
	// --selector` picks hosts by. Empty: an agent from before labels.
	Labels map[string]string `json:"labels,omitempty"`
}

// PassKey is the name, among a host's statuses, of its pass record: no
// unit can be called that (a unit name never starts with "."), so it
// shares the status prefix — the same lease, the same transaction as the
// statuses it vouches for, the same watch.
const PassKey = ".pass"

// Pass is an agent's pass record at <prefix>/status/<host>/.pass: the
// registry revision its last completed pass acted on. It is written in the
// transaction that publishes that pass's statuses, so a reader that sees
// Acted ≥ R also sees the statuses of a pass that planned from R or later.
type Pass struct {
	Acted int64     `json:"acted"`
	At    time.Time `json:"at"`
}

// HostReport is what one host's agent has published: its pass record (zero
// before its first pass, or with no live agent) and its statuses by unit.
type HostReport struct {
	Pass     Pass
	Statuses map[string]Status
}
