// The ports: what the agent needs of the service manager (Systemd), the
// unit directory (Files), its state directory (Manifest), the fleet
// (Coordinator), the registry (Reporter) and its watchers (Observer).

package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Systemd is what the agent needs from the service manager (systemd.Manager
// in production): the basic calls, and the cheaper reads and two-step jobs
// that keep a pass's cost to what changed (see cache.go). A service manager
// that has only the basic calls (a test's fake) gets the rest from
// PlainSystemd. An error names what failed ("daemon-reload: …", "start
// x.service: …", "state of x.service: …"); the agent does not name it again.
type Systemd interface {
	BasicSystemd
	// StateSkippingFileState is State without UnitFileState, which costs
	// systemd a look at the unit file and the symlinks to it on the first
	// read after every daemon-reload (measured with 1,000 unit files:
	// 3.4–5.0 ms per unit, against 1.0–1.9 ms for the rest of the state).
	// See needsFileState for when the loop does without.
	StateSkippingFileState(ctx context.Context, unit string) (UnitState, error)
	// Timeouts reads a unit's own job timeouts, alone
	// (UnitState.TimeoutStartUSec, TimeoutStopUSec). With it, the units a
	// daemon-reload has just loaded for the first time are planned from one
	// listing (Light) and only their timeouts are read, as their jobs
	// start: a full read of such a unit cost systemd 7.5–8.8 ms (measured
	// with 1,200 unit files, 300 units per figure), the listing
	// 0.1–0.14 ms, and the first sync of 1,000 units read them all.
	Timeouts(ctx context.Context, unit string) (start, stop uint64, err error)
	// Queue runs a job in two steps, queued and then waited for, so that a
	// Light unit's timeouts are read once its job holds it loaded. systemd
	// unloads an inactive unit nothing refers to after every call about it
	// and parses its files again at the next one: the first sync of 1,000
	// new units, reading the timeouts before the start, made systemd load
	// each unit file five times (counted from its UnitNew signals), the
	// batch floor once.
	Queue(ctx context.Context, job Job, unit string) (wait func(context.Context) error, err error)
	// Summaries lists the load, active and sub state of many units in one
	// call (ListUnitsByNames), for the resync and for planning from a
	// listing. An error (errors.ErrUnsupported among others) makes the
	// loop read the units one by one instead.
	Summaries(ctx context.Context, units []string) (map[string]UnitSummary, error)
	// ManagerID names the running service manager instance
	// (Current.Manager), read at every pass over all units (start,
	// reconnect, resync). An error leaves it unknown.
	ManagerID(ctx context.Context) (string, error)
	// UnitsLoaded is when the service manager last loaded the unit files
	// (Current.Loaded). An error leaves it unknown.
	UnitsLoaded(ctx context.Context) (uint64, error)
}

// BasicSystemd is the part of Systemd every service manager has: the jobs
// and a unit's state. Job methods wait for the job's result and return an
// error for anything but "done".
type BasicSystemd interface {
	Reload(ctx context.Context) error
	Start(ctx context.Context, unit string) error
	Stop(ctx context.Context, unit string) error
	Restart(ctx context.Context, unit string) error
	ReloadUnit(ctx context.Context, unit string) error
	Enable(ctx context.Context, units ...string) error
	Disable(ctx context.Context, units ...string) error
	ResetFailed(ctx context.Context, unit string) error
	State(ctx context.Context, unit string) (UnitState, error)
}

// PlainSystemd makes a Systemd of sd, the plain way: every read is a full
// State, a job is queued by running it whole, and the listing and the
// manager's identity and load time are unsupported (errors.ErrUnsupported),
// so the loop reads unit by unit and plans without them. For fakes, and
// for a fault injected in front of the real one.
func PlainSystemd(sd BasicSystemd) Systemd { return plainSystemd{sd} }

type plainSystemd struct{ BasicSystemd }

func (p plainSystemd) StateSkippingFileState(ctx context.Context, unit string) (UnitState, error) {
	return p.State(ctx, unit)
}

func (p plainSystemd) Timeouts(ctx context.Context, unit string) (start, stop uint64, err error) {
	st, err := p.State(ctx, unit)
	return st.TimeoutStartUSec, st.TimeoutStopUSec, err
}

func (p plainSystemd) Queue(_ context.Context, job Job, unit string) (func(context.Context) error, error) {
	return func(ctx context.Context) error { return DoJob(ctx, p, job, unit) }, nil
}

func (plainSystemd) Summaries(context.Context, []string) (map[string]UnitSummary, error) {
	return nil, fmt.Errorf("unit summaries: %w", errors.ErrUnsupported)
}

func (plainSystemd) ManagerID(context.Context) (string, error) {
	return "", fmt.Errorf("manager id: %w", errors.ErrUnsupported)
}

func (plainSystemd) UnitsLoaded(context.Context) (uint64, error) {
	return 0, fmt.Errorf("units loaded: %w", errors.ErrUnsupported)
}

// Files is where the agent writes: the unit directory, and for config
// files ("<unit>.files/<path>", configfile.go) the roots the host allows
// (unitdir.Roots). Paths are the key suffixes.
type Files interface {
	Read(path string) (content []byte, exists bool, err error)
	Write(path string, content []byte) error
	Remove(path string) error
}

// rootedFiles is an optional capability of Files: the directories config
// files may be written under (agentd run --file-root, unitdir.Roots). The
// planner refuses any other (RootOf), and the facts publish them for
// previews; Files without it take no config file.
type rootedFiles interface{ Paths() []string }

// fileRoots are files' roots: never nil (none is known to be none).
func fileRoots(files Files) []string {
	if r, ok := files.(rootedFiles); ok {
		return append([]string{}, r.Paths()...)
	}
	return []string{}
}

// Decrypter opens the config files put with --secret: the host's own age
// identity (secret.Identity), so that only this host reads what was
// encrypted to it.
type Decrypter interface {
	// Decrypt returns the plaintext of an age-encrypted value, or an
	// error that says why not (this host is not a recipient, the value
	// is damaged).
	Decrypt(armored []byte) ([]byte, error)
}

// Credentials makes systemd credentials of secrets (systemd-creds): the
// encrypted form of plaintext under name, for the file at path — what is
// there already when it holds this plaintext (a credential encrypts anew
// each time, so a new one for the same secret would be a change).
type Credentials interface {
	Seal(ctx context.Context, name, path string, plaintext []byte) ([]byte, error)
}

// Manifest is the agent's persistent memory (see unitdir.Manifest): the
// paths it owns, per-unit records, and content blobs by hash.
type Manifest interface {
	Managed() map[string]Owned
	Set(path string, e Owned) error
	// Claim records owned paths and the pass's intent in one write.
	Claim(files map[string]string, in Intent) error
	Forget(path string) error
	Units() map[string]UnitRecord
	// SetUnits stores records and the intent in one write; an empty record
	// deletes.
	SetUnits(recs map[string]UnitRecord, in Intent) error
	Intent() Intent
	SetIntent(in Intent) error
	PutBlob(hash string, content []byte) error
	Blob(hash string) ([]byte, bool)
	GC() error
}

// Coordinator is the fleet-wide side of a rollout (etcd in production):
// lease-bound MaxUnavailable slots and rollout halts.
type Coordinator interface {
	// Acquire blocks until this host holds one of limit slots of
	// (scope, bucket, unit), FIFO; release gives it back. The zero
	// bucket is the semaphore of the whole scope; a MaxUnavailableBy=
	// bucket one per label value (Bucket).
	Acquire(ctx context.Context, scope string, bucket Bucket, unit, hash string, limit int) (release func(context.Context) error, err error)
	// Holding reports whether the slot is still held (the lease may have
	// been lost): checked by every pass that could act on it.
	Holding(ctx context.Context, scope string, bucket Bucket, unit string) (bool, error)
	// Halt records that this host failed a version, stopping the rollout.
	Halt(ctx context.Context, h Halt) error
}

// Reporter publishes the full set of this host's unit statuses, with the
// registry revision the pass that computed them acted on (see Pass).
type Reporter interface {
	Report(ctx context.Context, acted int64, statuses []Status) error
}

// Observer hears what the loop does, for metrics and the service manager.
// Methods are called from the loop goroutine and must not block.
type Observer interface {
	// Action is called once per executed action with its kind and result.
	Action(unit string, kind Kind, result string)
	// PassStart is called before every pass.
	PassStart()
	// Pass is called after every pass with its duration and error.
	Pass(d time.Duration, err error)
	// Reported is called after every pass with the statuses it computed.
	Reported(revision int64, st []Status)
	// Heartbeat is called every HeartbeatInterval from the loop itself, so
	// a wedged loop stops calling it (the watchdog's evidence).
	Heartbeat()
	// Drift is called when a managed file was changed behind the agent's back.
	Drift(path string)
	// Rollback is called when a change is rolled back on this host;
	// ControlPlaneRollback too when it was rolled back because the control
	// plane did not confirm it in time (ConfirmSec=).
	Rollback(unit string)
	ControlPlaneRollback(unit string)
	// Probe is called with each health check's result (kind: cmd, url,
	// tcp); ProbesGone when a unit no longer has probes.
	Probe(unit, kind string, ok bool)
	ProbesGone(unit string)
}

// NopObserver ignores everything; embed it to implement only some methods.
type NopObserver struct{}

func (NopObserver) Action(string, Kind, string) {}

func (NopObserver) PassStart() {}

func (NopObserver) Pass(time.Duration, error) {}

func (NopObserver) Reported(int64, []Status) {}

func (NopObserver) Heartbeat() {}

func (NopObserver) Drift(string) {}

func (NopObserver) Rollback(string) {}

func (NopObserver) ControlPlaneRollback(string) {}

func (NopObserver) Probe(string, string, bool) {}

func (NopObserver) ProbesGone(string) {}

// DoJob runs job on unit and waits for its end: the whole of a job, for a
// Systemd that has no two-step Queue (a queue whose wait does it all).
func DoJob(ctx context.Context, sd Systemd, job Job, unit string) error {
	switch job {
	case JobStart:
		return sd.Start(ctx, unit)
	case JobStop:
		return sd.Stop(ctx, unit)
	case JobReload:
		return sd.ReloadUnit(ctx, unit)
	case JobRestart:
		return sd.Restart(ctx, unit)
	}
	return nil
}

// UnitSummary is the part of a unit's state systemd lists for many units at
// once (Systemd.Summaries). A change in any other property of interest
// comes with a change in one of these (and a signal).
type UnitSummary struct {
	LoadState, ActiveState, SubState string
}
