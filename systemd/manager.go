// Package systemd is the adapter between the agent and a systemd manager
// (the system instance, or a user instance in tests). It is the only package
// that imports go-systemd and godbus.
//
// Manager keeps one long-lived D-Bus connection for calls and redials it
// when it has dropped (daemon-reexec over the private socket, a restart of
// the bus). Every method takes a context and honours it: a job call waits
// until the job's result arrives or ctx is done (the job itself keeps running
// in systemd); the caller bounds the wait with ctx's deadline, computed from
// the unit's own timeouts. Job results other than "done" come back as
// *JobError; a wait that ends without a result because ctx's deadline passed
// or the connection dropped satisfies errors.Is(err,
// reconcile.ErrOutcomeUnknown). Manager is safe for concurrent use.
package systemd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unique"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/agentd/agentd/reconcile"
)

var (
	// ErrClosed is returned by calls on a closed Manager.
	ErrClosed = errors.New("systemd manager closed")
	// ErrJobTimeout means no result arrived for a job before ctx's deadline
	// (or the Manager's JobTimeout, when set). The job may still be
	// running. It wraps reconcile.ErrOutcomeUnknown.
	ErrJobTimeout = fmt.Errorf("timed out waiting for the job (%w)", reconcile.ErrOutcomeUnknown)
	// ErrConnectionLost means the connection dropped while waiting for a
	// job's result. The job may or may not have run: re-read the state. It
	// wraps reconcile.ErrOutcomeUnknown.
	ErrConnectionLost = fmt.Errorf("connection to systemd lost while waiting for the job (%w)", reconcile.ErrOutcomeUnknown)
)

// JobError is a job that finished with a result other than "done".
type JobError struct {
	Op     string // start, stop, restart, reload
	Unit   string
	Result string // systemd's job result: canceled, timeout, failed, dependency, skipped, ...
	// UnitResult is the unit's Result property (exit-code, signal, ...),
	// read right after a job failed; empty otherwise or when unknown.
	UnitResult string
}

func (e *JobError) Error() string {
	s := fmt.Sprintf("%s %s: job %s", e.Op, e.Unit, e.Result)
	if e.UnitResult != "" {
		s += " (unit result: " + e.UnitResult + ")"
	}
	return s
}

// JobResult returns systemd's job result. It lets packages that must not
// import this one test for a job error with errors.As and an interface
// such as interface{ JobResult() string }.
func (e *JobError) JobResult() string { return e.Result }

// Manager is every method of reconcile.Systemd.
var _ reconcile.Systemd = (*Manager)(nil)

// Manager talks to one systemd manager. Create it with Open.
type Manager struct {
	// JobTimeout, when positive, bounds the wait for a job's result on top
	// of ctx. Open leaves it 0: no limit of the Manager's own, the caller's
	// ctx decides. Change it before the Manager is in use.
	JobTimeout time.Duration

	dial Dialer
	log  *slog.Logger
	life context.Context // done when the Manager is closed; parent of every connection
	stop context.CancelFunc

	dialing chan struct{} // held while (re)dialing the call connection

	mu     sync.Mutex
	cur    *conn
	closed bool
}

// Open connects to systemd with dial. A nil log discards logging.
func Open(ctx context.Context, dial Dialer, log *slog.Logger) (*Manager, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	life, stop := context.WithCancel(context.Background())
	m := &Manager{
		dial:    dial,
		log:     log,
		life:    life,
		stop:    stop,
		dialing: make(chan struct{}, 1),
	}
	c, err := dialConn(ctx, life, dial)
	if err != nil {
		stop()
		return nil, fmt.Errorf("open D-Bus connection: %w", err)
	}
	m.cur = c
	return m, nil
}

// Close closes the connection and ends Watch. Calls after Close return
// ErrClosed.
func (m *Manager) Close() error {
	m.stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.cur != nil {
		m.cur.close()
		m.cur = nil
	}
	return nil
}

// conn returns the call connection, redialing it if it has dropped.
func (m *Manager) conn(ctx context.Context) (*conn, error) {
	m.mu.Lock()
	c, closed := m.cur, m.closed
	m.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if c != nil && c.Connected() {
		return c, nil
	}

	select {
	case m.dialing <- struct{}{}:
		defer func() { <-m.dialing }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	m.mu.Lock()
	c, closed = m.cur, m.closed
	m.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if c != nil && c.Connected() { // redialed while we waited
		return c, nil
	}
	if c != nil {
		c.close()
	}
	m.log.Info("connection to systemd lost; reconnecting")
	nc, err := dialConn(ctx, m.life, m.dial)
	if err != nil {
		return nil, fmt.Errorf("reconnect to systemd: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		nc.close()
		return nil, ErrClosed
	}
	m.cur = nc
	m.log.Info("reconnected to systemd")
	return nc, nil
}

// call runs f on the call connection. When f fails because the connection
// dropped under it, call redials once and runs f again.
func (m *Manager) call(ctx context.Context, f func(*sddbus.Conn) error) (*conn, error) {
	return m.callConn(ctx, func(c *conn) error { return f(c.Conn) })
}

// callConn is call for f that needs the bus connection too.
func (m *Manager) callConn(ctx context.Context, f func(*conn) error) (*conn, error) {
	c, err := m.conn(ctx)
	if err != nil {
		return nil, err
	}
	err = f(c)
	if err == nil || c.Connected() || ctx.Err() != nil {
		return c, err
	}
	c, err2 := m.conn(ctx)
	if err2 != nil {
		return nil, errors.Join(err, err2)
	}
	return c, f(c)
}

// Reload makes systemd re-read all unit files (daemon-reload). It returns
// once the reload has finished.
func (m *Manager) Reload(ctx context.Context) error {
	_, err := m.call(ctx, func(c *sddbus.Conn) error { return c.ReloadContext(ctx) })
	if err != nil {
		return fmt.Errorf("daemon-reload: %w", err)
	}
	return nil
}

// Start starts unit (job mode "replace") and waits for the job.
func (m *Manager) Start(ctx context.Context, unit string) error {
	return m.job(ctx, reconcile.JobStart, unit)
}

// Stop stops unit and waits for the job. Stopping a unit that is not
// loaded (so not running) succeeds.
func (m *Manager) Stop(ctx context.Context, unit string) error {
	return m.job(ctx, reconcile.JobStop, unit)
}

// Restart restarts unit (starting it if it is not running) and waits for
// the job.
func (m *Manager) Restart(ctx context.Context, unit string) error {
	return m.job(ctx, reconcile.JobRestart, unit)
}

// ReloadUnit reloads a running unit's configuration (its ExecReload) and
// waits for the job.
func (m *Manager) ReloadUnit(ctx context.Context, unit string) error {
	return m.job(ctx, reconcile.JobReload, unit)
}

type jobFunc func(c *sddbus.Conn, ctx context.Context, name, mode string, ch chan<- string) (int, error)

// job enqueues a job and waits for its result, until ctx is done (and at
// most m.JobTimeout when that is set). When ctx's deadline passes first the
// error wraps ErrJobTimeout (so reconcile.ErrOutcomeUnknown) and
// context.DeadlineExceeded; a canceled ctx gives a plain context.Canceled.
func (m *Manager) job(ctx context.Context, job reconcile.Job, unit string) error {
	wait, err := m.Queue(ctx, job, unit)
	if err != nil {
		return err
	}
	return wait(ctx)
}

// Queue enqueues a job (job mode "replace") and returns at once; wait
// waits for its result as Start, Stop, Restart and ReloadUnit do, until its
// ctx is done. Between the two the unit is held loaded by its job: systemd
// unloads an inactive unit nothing refers to after every call about it,
// and loads it anew — parsing its files — at the next one
// (reconcile.Systemd.Queue).
func (m *Manager) Queue(ctx context.Context, job reconcile.Job, unit string) (wait func(context.Context) error, err error) {
	switch job {
	case reconcile.JobStart:
		return m.enqueue(ctx, "start", unit, (*sddbus.Conn).StartUnitContext)
	case reconcile.JobStop:
		wait, err := m.enqueue(ctx, "stop", unit, (*sddbus.Conn).StopUnitContext)
		if isDBusError(err, "org.freedesktop.systemd1.NoSuchUnit") {
			return func(context.Context) error { return nil }, nil // not loaded, so not running
		}
		return wait, err
	case reconcile.JobRestart:
		return m.enqueue(ctx, "restart", unit, (*sddbus.Conn).RestartUnitContext)
	case reconcile.JobReload:
		return m.enqueue(ctx, "reload", unit, (*sddbus.Conn).ReloadUnitContext)
	}
	return nil, fmt.Errorf("queue %s: no such job: %s", unit, job)
}

// enqueue is job's first half: the call that queues the job. The second,
// wait, takes the result.
func (m *Manager) enqueue(ctx context.Context, op, unit string, enqueue jobFunc) (wait func(context.Context) error, err error) {
	// Buffered: go-systemd sends the result while holding the lock that
	// every other job call on the connection needs.
	ch := make(chan string, 1)
	c, err := m.call(ctx, func(c *sddbus.Conn) error {
		_, err := enqueue(c, ctx, unit, "replace", ch)
		return err
	})
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// The enqueue call may or may not have reached systemd.
			return nil, fmt.Errorf("%s %s: %w: %w", op, unit, ErrJobTimeout, err)
		}
		return nil, fmt.Errorf("%s %s: %w", op, unit, err)
	}
	return func(ctx context.Context) error { return m.wait(ctx, c, op, unit, ch) }, nil
}

// wait is job's second half: the result of the job queued on c, which
// go-systemd sends to ch.
func (m *Manager) wait(ctx context.Context, c *conn, op, unit string, ch <-chan string) error {
	var timeoutC <-chan time.Time
	if m.JobTimeout > 0 {
		timer := time.NewTimer(m.JobTimeout)
		defer timer.Stop()
		timeoutC = timer.C
	}
	// The result signal never comes if the connection drops.
	for {
		select {
		case res := <-ch:
			return m.jobResult(ctx, c, op, unit, res)
		case <-ctx.Done():
			select {
			case res := <-ch: // arrived together with ctx's end: it stands
				return m.jobResult(ctx, c, op, unit, res)
			default:
			}
			if err := ctx.Err(); errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("%s %s: %w: %w", op, unit, ErrJobTimeout, err)
			}
			return fmt.Errorf("%s %s: %w", op, unit, ctx.Err())
		case <-m.life.Done():
			return fmt.Errorf("%s %s: %w", op, unit, ErrClosed)
		case <-timeoutC:
			return fmt.Errorf("%s %s: %w after %s", op, unit, ErrJobTimeout, m.JobTimeout)
		case <-c.closed:
			select {
			case res := <-ch:
				return m.jobResult(ctx, c, op, unit, res)
			default:
				return fmt.Errorf("%s %s: %w", op, unit, ErrConnectionLost)
			}
		}
	}
}

func (m *Manager) jobResult(ctx context.Context, c *conn, op, unit, res string) error {
	m.log.Debug("job finished", "op", op, "unit", unit, "result", res)
	if res == "done" {
		return nil
	}
	e := &JobError{Op: op, Unit: unit, Result: res}
	if iface := typeInterface(unit); res == "failed" && iface != "" {
		// Best effort: the message says why, the error stands without it.
		if p, err := c.GetUnitTypePropertyContext(ctx, unit, iface, "Result"); err == nil {
			e.UnitResult, _ = p.Value.Value().(string)
		}
	}
	return e
}

// Enable enables unit files as their [Install] sections say (symlinks in
// the manager's persistent config dir; runtime=false, force=false). It does
// not daemon-reload: UnitFileState changes only after the next Reload.
func (m *Manager) Enable(ctx context.Context, units ...string) error {
	var changes []sddbus.EnableUnitFileChange
	var install bool
	_, err := m.call(ctx, func(c *sddbus.Conn) (err error) {
		install, changes, err = c.EnableUnitFilesContext(ctx, units, false, false)
		return err
	})
	if err != nil {
		return fmt.Errorf("enable %s: %w", strings.Join(units, " "), err)
	}
	m.log.Debug("enabled", "units", units, "installInfo", install, "changes", len(changes))
	return nil
}

// ResetFailed forgets a unit's failed state (systemctl reset-failed), so a
// removed unit does not linger in the failed list. A unit that is not
// loaded is not an error.
func (m *Manager) ResetFailed(ctx context.Context, unit string) error {
	_, err := m.call(ctx, func(c *sddbus.Conn) error { return c.ResetFailedUnitContext(ctx, unit) })
	if err != nil && !isDBusError(err, "org.freedesktop.systemd1.NoSuchUnit") {
		return fmt.Errorf("reset-failed %s: %w", unit, err)
	}
	return nil
}

// Disable removes the symlinks that enabled the unit files (runtime=false).
// It does not daemon-reload.
func (m *Manager) Disable(ctx context.Context, units ...string) error {
	var changes []sddbus.DisableUnitFileChange
	_, err := m.call(ctx, func(c *sddbus.Conn) (err error) {
		changes, err = c.DisableUnitFilesContext(ctx, units, false)
		return err
	})
	if err != nil {
		return fmt.Errorf("disable %s: %w", strings.Join(units, " "), err)
	}
	m.log.Debug("disabled", "units", units, "changes", len(changes))
	return nil
}

// State reads what systemd says about unit now. A unit that does not exist
// has LoadState "not-found"; that is not an error.
func (m *Manager) State(ctx context.Context, unit string) (reconcile.UnitState, error) {
	return m.state(ctx, unit, true)
}

// StateSkippingFileState is State without UnitFileState (left empty).
// systemd works UnitFileState out from the unit file and the symlinks to it
// on the first read after every daemon-reload: measured with 1,000 unit
// files, a GetAll of the Unit interface then cost 3.4–5.0 ms per unit and
// the properties read one by one (pipelined) 1.0–1.9 ms; after that first
// read both cost ~1 ms.
func (m *Manager) StateSkippingFileState(ctx context.Context, unit string) (reconcile.UnitState, error) {
	return m.state(ctx, unit, false)
}

func (m *Manager) state(ctx context.Context, unit string, fileState bool) (reconcile.UnitState, error) {
	var s reconcile.UnitState
	_, err := m.callConn(ctx, func(c *conn) error {
		var err error
		s, err = readState(ctx, c, unit, fileState)
		return err
	})
	if err != nil {
		return reconcile.UnitState{}, fmt.Errorf("state of %s: %w", unit, err)
	}
	return s, nil
}

// ManagerID names this instance of the service manager: the kernel's boot
// ID and the moment the manager began (UserspaceTimestampMonotonic). It
// changes with a reboot and when a user's manager is started anew, not
// with daemon-reload or daemon-reexec (the manager keeps its timestamps).
// systemd forgets that a unit ran once it unloads it (an inactive unit
// nothing refers to); the agent remembers under which manager it last
// started the unit, so that an operator's stop outlives an agent restart
// (reconcile.Systemd.ManagerID).
func (m *Manager) ManagerID(ctx context.Context) (string, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("manager id: %w", err)
	}
	props, err := m.managerProperties(ctx, "UserspaceTimestampMonotonic")
	if err != nil {
		return "", fmt.Errorf("manager id: %w", err)
	}
	began := prop[uint64](props, "UserspaceTimestampMonotonic")
	return strings.TrimSpace(string(boot)) + "/" + strconv.FormatUint(began, 10), nil
}

// UnitsLoaded is when the manager last loaded the unit files, CLOCK_MONOTONIC
// µs: its last daemon-reload (UnitsLoadTimestampMonotonic), else its start
// (UnitsLoadFinishTimestampMonotonic). A unit that (re)started after it
// runs the unit files on disk unless NeedDaemonReload says otherwise: the
// agent uses that to know a job owed by a pass it did not finish has run.
func (m *Manager) UnitsLoaded(ctx context.Context) (uint64, error) {
	props, err := m.managerProperties(ctx, "UnitsLoadTimestampMonotonic", "UnitsLoadFinishTimestampMonotonic")
	if err != nil {
		return 0, fmt.Errorf("units loaded: %w", err)
	}
	if at := prop[uint64](props, "UnitsLoadTimestampMonotonic"); at != 0 {
		return at, nil
	}
	return prop[uint64](props, "UnitsLoadFinishTimestampMonotonic"), nil
}

// Version is the service manager's version number (systemd 252 says
// "252.38-1~deb12u1": 252); 0 when it says none.
func (m *Manager) Version(ctx context.Context) (int, error) {
	props, err := m.managerProperties(ctx, "Version")
	if err != nil {
		return 0, fmt.Errorf("manager version: %w", err)
	}
	v := word(props, "Version")
	n := 0
	for _, r := range strings.TrimPrefix(v, "systemd ") {
		if r < '0' || r > '9' {
			break
		}
		n = n*10 + int(r-'0')
	}
	return n, nil
}

// managerProperties gets the named properties of the Manager object.
func (m *Manager) managerProperties(ctx context.Context, names ...string) (map[string]any, error) {
	var props map[string]any
	_, err := m.callConn(ctx, func(c *conn) error {
		var err error
		props, err = properties(ctx, c.bus, managerPath, "Manager", names)
		return err
	})
	return props, err
}

// Timeouts reads a unit's own job timeouts (see reconcile.UnitState): the
// properties a job's deadline needs, and nothing else. Right after a
// daemon-reload a full read of a unit systemd just loaded costs it several
// milliseconds (it works out UnitFileState and serializes hundreds of
// properties); the loop plans such a unit from ListUnitsByNames and reads
// only these when it starts the unit's job (reconcile.Systemd.Timeouts).
func (m *Manager) Timeouts(ctx context.Context, unit string) (start, stop uint64, err error) {
	iface := typeInterface(unit)
	names := timeoutProps[iface]
	if len(names) == 0 {
		return 0, 0, nil // Timer, Path, Automount, Target, ...: no timeout of their own
	}
	var props map[string]any
	_, err = m.callConn(ctx, func(c *conn) error {
		var err error
		props, err = properties(ctx, c.bus, unitPath(unit), iface, names)
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("timeouts of %s: %w", unit, err)
	}
	start, stop = jobTimeouts(iface, props)
	return start, stop, nil
}

// timeoutProps are the properties of a type interface that hold the unit's
// own job timeouts (jobTimeouts); timers, paths and automounts have none.
var timeoutProps = map[string][]string{
	"Service": {"TimeoutStartUSec", "TimeoutStopUSec"},
	"Socket":  {"TimeoutUSec"},
	"Mount":   {"TimeoutUSec"},
	"Swap":    {"TimeoutUSec"},
	"Scope":   {"TimeoutStopUSec"},
}

// jobTimeouts reads a unit's start and stop job timeouts from the
// properties of its type interface iface.
func jobTimeouts(iface string, props map[string]any) (start, stop uint64) {
	switch iface {
	case "Service":
		return prop[uint64](props, "TimeoutStartUSec"), prop[uint64](props, "TimeoutStopUSec")
	case "Socket", "Mount", "Swap":
		// One timeout for every job of these types.
		t := prop[uint64](props, "TimeoutUSec")
		return t, t
	case "Scope":
		// A scope is never started by a job of ours; stopping it is bounded.
		return 0, prop[uint64](props, "TimeoutStopUSec")
	}
	return 0, 0
}

// Summaries lists the load, active and sub state of many units in one call
// (ListUnitsByNames): the reconcile loop's periodic resync compares them with
// what it holds instead of reading every unit in full.
func (m *Manager) Summaries(ctx context.Context, units []string) (map[string]reconcile.UnitSummary, error) {
	out := make(map[string]reconcile.UnitSummary, len(units))
	for chunk := range slices.Chunk(units, summaryChunk) {
		var list []sddbus.UnitStatus
		_, err := m.call(ctx, func(c *sddbus.Conn) error {
			var err error
			list, err = c.ListUnitsByNamesContext(ctx, chunk)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("list units: %w", err)
		}
		for _, u := range list {
			out[u.Name] = reconcile.UnitSummary{LoadState: u.LoadState, ActiveState: u.ActiveState, SubState: u.SubState}
		}
	}
	return out, nil
}

// summaryChunk bounds one ListUnitsByNames call's message (D-Bus messages
// are limited to 128 MiB; a few hundred bytes per unit).
const summaryChunk = 4096

// unitProps are the Unit interface's properties readState uses, but
// UnitFileState.
var unitProps = []string{"StateChangeTimestampMonotonic", "LoadState", "LoadError", "ActiveState", "SubState", "CanReload", "NeedDaemonReload",
	"ActiveEnterTimestampMonotonic", "ActiveExitTimestampMonotonic",
	"InactiveEnterTimestampMonotonic", "InactiveExitTimestampMonotonic"}

// typeProps are the properties readState uses of each type interface
// (typeInterface): Result, a service's own, and the job timeouts.
var typeProps = func() map[string][]string {
	m := map[string][]string{
		"Service": {"Result", "MainPID", "ExecMainStatus", "Type", "RemainAfterExit", "NRestarts"},
		"Socket":  {"Result"}, "Mount": {"Result"}, "Swap": {"Result"}, "Scope": {"Result"},
		"Timer": {"Result"}, "Path": {"Result"}, "Automount": {"Result"},
	}
	for iface, names := range timeoutProps {
		m[iface] = append(m[iface], names...)
	}
	return m
}()

// readState reads a unit's state. The unit type's properties (a service's
// Result, MainPID, NRestarts, ...) are always the ones it uses, one Get
// each, all in flight at once: systemd works out and sends only those, where
// GetAll of the Service interface serialised some 200. Measured against a
// real systemd with 1,000 running units, 333 units per figure, 8 reads in
// flight: a read after a restart cost systemd 0.42–0.45 ms of CPU with
// GetAll, 0.21–0.24 ms with the named properties; and in the first sync of
// 1,000 new units (three alternating pairs, BENCHMARKS.md c) the agent's
// CPU fell from 5.5–6.5 to 4.6–5.5 s and systemd's extra work beside it
// from 4.2–4.8 to 3.7–4.3 s. The Unit interface is read the same way
// without UnitFileState (units systemd had loaded before: bursts of changed
// units, verdicts, signals); with it (a unit never read: the first sync),
// in one GetAll — for units systemd has just loaded the named properties
// measured slower there (first syncs of 100 new units 1.50–1.86× the batch
// floor with GetAll, 1.95–2.20× without).
//
// The Unit interface and the type's are read one after the other, so the
// unit may change state in between: a sample of a crash loop read as
// auto-restart with the next run's MainPID (4% of the reads of a crash
// loop, TestReadStateIsNotTorn). So the read ends by reading SubState and
// StateChangeTimestampMonotonic again, and is taken only when they did not
// move; else it is read again (at most readTries times, the last taken as
// it is).
func readState(ctx context.Context, c *conn, unit string, fileState bool) (reconcile.UnitState, error) {
	for try := 1; ; try++ {
		s, moved, err := readStateOnce(ctx, c, unit, fileState, true)
		if err != nil || !moved || try == readTries {
			return s, err
		}
	}
}

// readTries bounds the reads of a unit that changes state under them.
const readTries = 3

// stateMarks are the properties that move when a unit changes state: read
// again after the type's interface (in the same batch: systemd answers in
// order), they say whether the unit changed under the read.
var stateMarks = []string{"SubState", "StateChangeTimestampMonotonic"}

// readStateOnce is one read of readState; with check, moved says the unit
// changed state under it. Without (the read before the check, kept for
// BenchmarkReadState), the Unit's properties are read first, then the
// type's.
func readStateOnce(ctx context.Context, c *conn, unit string, fileState, check bool) (s reconcile.UnitState, moved bool, err error) {
	iface := typeInterface(unit)
	var props map[string]any
	var all map[string]map[string]any // the type's and the marks, when read with the Unit's
	switch {
	case fileState:
		props, err = c.GetUnitPropertiesContext(ctx, unit)
	case iface == "" || !check:
		props, err = properties(ctx, c.bus, unitPath(unit), "Unit", unitProps)
	default:
		// All in one batch: the Unit's, the type's, then the marks again.
		// A not-found unit's type properties are read for nothing.
		all, err = propertiesOf(ctx, c.bus, unitPath(unit), map[string][]string{"Unit": unitProps, iface: typeProps[iface], "": stateMarks}, "Unit", iface, "")
		props = all["Unit"]
	}
	if err != nil {
		return s, false, err
	}
	s.LoadState = word(props, "LoadState")
	s.ActiveState = word(props, "ActiveState")
	s.SubState = word(props, "SubState")
	s.CanReload = prop[bool](props, "CanReload")
	s.NeedDaemonReload = prop[bool](props, "NeedDaemonReload")
	s.UnitFileState = word(props, "UnitFileState")
	s.ActiveEnterMono = prop[uint64](props, "ActiveEnterTimestampMonotonic")
	s.ActiveExitMono = prop[uint64](props, "ActiveExitTimestampMonotonic")
	s.InactiveEnterMono = prop[uint64](props, "InactiveEnterTimestampMonotonic")
	s.InactiveExitMono = prop[uint64](props, "InactiveExitTimestampMonotonic")
	s.Ran = s.InactiveExitMono != 0
	if s.LoadState != "loaded" {
		// LoadError is (ss): the D-Bus error name and its message.
		if le, ok := props["LoadError"].([]any); ok && len(le) == 2 {
			msg, _ := le[1].(string)
			s.LoadError = strings.Clone(msg)
		}
	}
	if s.LoadState == "not-found" {
		return s, false, nil
	}
	if iface == "" {
		return s, false, nil
	}
	if all == nil {
		names := map[string][]string{iface: typeProps[iface]}
		ifaces := []string{iface}
		if check {
			names[""], ifaces = stateMarks, append(ifaces, "")
		}
		if all, err = propertiesOf(ctx, c.bus, unitPath(unit), names, ifaces...); err != nil {
			return s, false, err
		}
	}
	tp := all[iface]
	s.Result = word(tp, "Result")
	if iface == "Service" {
		s.MainPID = prop[uint32](tp, "MainPID")
		s.ExitStatus = prop[int32](tp, "ExecMainStatus")
		s.Type = word(tp, "Type")
		s.RemainAfterExit = prop[bool](tp, "RemainAfterExit")
		s.NRestarts = prop[uint32](tp, "NRestarts")
	}
	s.TimeoutStartUSec, s.TimeoutStopUSec = jobTimeouts(iface, tp)
	if check {
		after := all[""]
		moved = word(after, "SubState") != s.SubState ||
			prop[uint64](after, "StateChangeTimestampMonotonic") != prop[uint64](props, "StateChangeTimestampMonotonic")
	}
	return s, moved, nil
}

// managerPath is the object of systemd's Manager interface.
const managerPath godbus.ObjectPath = "/org/freedesktop/systemd1"

// unitPath is the object path of unit.
func unitPath(unit string) godbus.ObjectPath {
	return godbus.ObjectPath(unitPathPrefix + sddbus.PathBusEscape(unit))
}

// properties gets the named properties of one of path's interfaces
// (org.freedesktop.systemd1.<iface>), each with a call of its own, all of
// them in flight at once (asynchronous calls: a goroutine per call made
// 10,000 of them when 1,000 jobs ended together, and 157 MiB of peak RSS).
func properties(ctx context.Context, bus *godbus.Conn, path godbus.ObjectPath, iface string, names []string) (map[string]any, error) {
	ps, err := propertiesOf(ctx, bus, path, map[string][]string{iface: names}, iface)
	return ps[iface], err
}

// propertiesOf is properties of several interfaces, all in flight at once,
// sent (and so answered by systemd) in the order of ifaces. The interface
// "" is the Unit interface read a second time, kept apart in the result.
func propertiesOf(ctx context.Context, bus *godbus.Conn, path godbus.ObjectPath, names map[string][]string, ifaces ...string) (map[string]map[string]any, error) {
	obj := bus.Object("org.freedesktop.systemd1", path)
	type ref struct{ iface, name string }
	var refs []ref
	for _, iface := range ifaces {
		for _, n := range names[iface] {
			refs = append(refs, ref{iface, n})
		}
	}
	done := make(chan *godbus.Call, len(refs))
	calls := make([]*godbus.Call, len(refs))
	for i, r := range refs {
		iface := r.iface
		if iface == "" {
			iface = "Unit" // a second read of Unit properties, kept apart
		}
		calls[i] = obj.GoWithContext(ctx, "org.freedesktop.DBus.Properties.Get", 0, done, "org.freedesktop.systemd1."+iface, r.name)
	}
	for range calls {
		<-done // each call ends, with its reply, an error, or ctx's
	}
	props := make(map[string]map[string]any, len(ifaces))
	for _, iface := range ifaces {
		props[iface] = make(map[string]any, len(names[iface]))
	}
	for i, c := range calls {
		var v godbus.Variant
		if err := c.Store(&v); err != nil {
			if isDBusError(err, "org.freedesktop.DBus.Error.UnknownProperty") {
				continue // an older systemd: absent, as GetAll would leave it
			}
			return nil, err // the first: they share a cause
		}
		props[refs[i].iface][refs[i].name] = v.Value()
	}
	return props, nil
}

// prop returns props[name] when it holds a T, else T's zero value.
func prop[T any](props map[string]any, name string) T {
	v, _ := props[name].(T)
	return v
}

// word returns props[name] when it is a string, as a canonical copy.
func word(props map[string]any, name string) string {
	return canonical(prop[string](props, name))
}

// canonical is the one shared copy of a string decoded from D-Bus that is
// kept. godbus decodes a message's strings into shared 4 KiB buffers: a
// state kept in the loop's cache pinned two of them per unit (8 MiB of an
// idle agent's 16 MiB heap at 1,000 units). The values are a few dozen
// words ("active", "running", "exit-code"), so one copy of each serves all
// units.
func canonical(s string) string { return unique.Make(s).Value() }

// typeInterface names the D-Bus interface, below org.freedesktop.systemd1,
// of the unit's type when that type has a Result property; "" otherwise.
func typeInterface(unit string) string {
	_, ext, ok := cutLast(unit, ".")
	if !ok {
		return ""
	}
	switch ext {
	case "service":
		return "Service"
	case "socket":
		return "Socket"
	case "mount":
		return "Mount"
	case "automount":
		return "Automount"
	case "swap":
		return "Swap"
	case "timer":
		return "Timer"
	case "path":
		return "Path"
	case "scope":
		return "Scope"
	}
	return ""
}

func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// isDBusError reports whether err is, or wraps, the D-Bus error name.
func isDBusError(err error, name string) bool {
	var de godbus.Error
	if errors.As(err, &de) {
		return de.Name == name
	}
	var dep *godbus.Error
	return errors.As(err, &dep) && dep.Name == name
}
