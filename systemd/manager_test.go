package systemd_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/systemd"
)

// These tests run against a real private systemd --user per top-level test
// (internal/systemdtest). Subtests of TestManager share one manager and use
// distinct unit names; they run in order.

func TestManager(t *testing.T) {
	t.Parallel()
	h := systemdtest.Start(t)
	m := open(t, h)
	ctx := testContext(t)

	t.Run("StartRestartStop", func(t *testing.T) {
		writeUnit(t, h, "sleeper.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n")
		reload(t, m)
		if err := m.Start(ctx, "sleeper.service"); err != nil {
			t.Fatalf("Start: %v", err)
		}
		s := state(t, m, "sleeper.service")
		if s.LoadState != "loaded" || s.ActiveState != "active" || s.SubState != "running" || !s.Ran || s.MainPID == 0 {
			t.Fatalf("after Start: %+v, want loaded active running, Ran, MainPID", s)
		}
		if s.Result != "success" {
			t.Errorf("Result = %q, want success", s.Result)
		}
		if err := m.Restart(ctx, "sleeper.service"); err != nil {
			t.Fatalf("Restart: %v", err)
		}
		s2 := state(t, m, "sleeper.service")
		if s2.ActiveState != "active" || s2.MainPID == 0 || s2.MainPID == s.MainPID {
			t.Errorf("after Restart: %+v, want active with a MainPID other than %d", s2, s.MainPID)
		}
		if err := m.Stop(ctx, "sleeper.service"); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		// No Ran here: nothing references sleeper.service, so systemd
		// garbage-collects it once stopped and reloads it fresh (see RanAfterStop).
		s3 := state(t, m, "sleeper.service")
		if s3.ActiveState != "inactive" || s3.MainPID != 0 {
			t.Errorf("after Stop: %+v, want inactive, MainPID 0", s3)
		}
	})

	t.Run("RanAfterStop", func(t *testing.T) {
		// Ran survives a stop only while systemd keeps the unit loaded, e.g.
		// because an enabled [Install] section makes default.target want it.
		writeUnit(t, h, "wanted.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"+
			"[Install]\nWantedBy=default.target\n")
		writeUnit(t, h, "unwanted.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n")
		if err := m.Enable(ctx, "wanted.service"); err != nil {
			t.Fatal(err)
		}
		reload(t, m)
		for _, u := range []string{"wanted.service", "unwanted.service"} {
			if err := m.Start(ctx, u); err != nil {
				t.Fatal(err)
			}
			stop(t, m, u)
		}
		if s := state(t, m, "wanted.service"); !s.Ran || s.ActiveState != "inactive" {
			t.Errorf("enabled unit after Stop: %+v, want inactive and Ran", s)
		}
		// Documents systemd's behaviour rather than asserting it.
		t.Logf("unreferenced unit after Stop: Ran=%v", state(t, m, "unwanted.service").Ran)
	})

	t.Run("ReloadUnit", func(t *testing.T) {
		marker := filepath.Join(h.StateDir, "reloaded")
		writeUnit(t, h, "reloader.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"+
			"ExecReload=/bin/sh -c 'echo x >> "+marker+"'\n")
		reload(t, m)
		if err := m.Start(ctx, "reloader.service"); err != nil {
			t.Fatalf("Start: %v", err)
		}
		pid := state(t, m, "reloader.service").MainPID
		if err := m.ReloadUnit(ctx, "reloader.service"); err != nil {
			t.Fatalf("ReloadUnit: %v", err)
		}
		if b, err := os.ReadFile(marker); err != nil || string(b) != "x\n" {
			t.Errorf("ExecReload output = %q, %v; want \"x\\n\"", b, err)
		}
		if s := state(t, m, "reloader.service"); s.MainPID != pid || s.ActiveState != "active" {
			t.Errorf("after ReloadUnit: %+v, want still active with MainPID %d", s, pid)
		}
		stop(t, m, "reloader.service")
	})

	t.Run("StartFails", func(t *testing.T) {
		cases := []struct{ unit, service, unitResult string }{
			// Type=exec fails the start job when execve fails.
			{"missing-binary.service", "Type=exec\nExecStart=/nonexistent/binary", "exit-code"},
			// With Type=exec /bin/false starts fine and dies later: oneshot waits for it.
			{"false.service", "Type=oneshot\nExecStart=/bin/false", "exit-code"},
		}
		for _, tc := range cases {
			writeUnit(t, h, tc.unit, "[Service]\n"+tc.service+"\n")
		}
		reload(t, m)
		for _, tc := range cases {
			err := m.Start(ctx, tc.unit)
			var je *systemd.JobError
			if !errors.As(err, &je) {
				t.Fatalf("Start(%s) = %v, want a *JobError", tc.unit, err)
			}
			if je.Op != "start" || je.Unit != tc.unit || je.Result != "failed" || je.UnitResult != tc.unitResult {
				t.Errorf("Start(%s): %+v, want start/failed/%s", tc.unit, je, tc.unitResult)
			}
			want := "start " + tc.unit + ": job failed (unit result: " + tc.unitResult + ")"
			if err.Error() != want {
				t.Errorf("Start(%s) error = %q, want %q", tc.unit, err, want)
			}
			var jr interface{ JobResult() string }
			if !errors.As(err, &jr) || jr.JobResult() != "failed" {
				t.Errorf("Start(%s): error does not expose JobResult() failed", tc.unit)
			}
			s := state(t, m, tc.unit)
			if s.ActiveState != "failed" || s.Result != tc.unitResult || !s.Ran {
				t.Errorf("State(%s) = %+v, want failed, %s, Ran", tc.unit, s, tc.unitResult)
			}
		}
	})

	t.Run("BadSetting", func(t *testing.T) {
		writeUnit(t, h, "noexec.service", "[Unit]\nDescription=no ExecStart\n[Service]\nType=exec\n")
		reload(t, m)
		s := state(t, m, "noexec.service")
		if (s.LoadState != "bad-setting" && s.LoadState != "error") || s.LoadError == "" {
			t.Errorf("State = %+v, want LoadState bad-setting or error with a LoadError", s)
		}
		if s.Ran || s.Active() {
			t.Errorf("State = %+v, want never ran, not active", s)
		}
		err := m.Start(ctx, "noexec.service")
		if err == nil || !strings.Contains(err.Error(), "start noexec.service: ") {
			t.Errorf("Start of a bad unit = %v, want an error naming the unit", err)
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		s := state(t, m, "nosuch.service")
		if s.LoadState != "not-found" || s.ActiveState != "inactive" || s.Ran || s.MainPID != 0 {
			t.Errorf("State = %+v, want not-found inactive", s)
		}
		for _, u := range []string{"nosuch.service", "never-looked-at.service"} {
			if err := m.Stop(ctx, u); err != nil {
				t.Errorf("Stop(%s) of a unit that is not loaded: %v, want nil", u, err)
			}
		}
		err := m.Start(ctx, "nosuch.service")
		if err == nil || !strings.HasPrefix(err.Error(), "start nosuch.service: ") {
			t.Errorf("Start of a missing unit = %v, want an error naming the unit", err)
		}
	})

	t.Run("EnableDisable", func(t *testing.T) {
		writeUnit(t, h, "enabled.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"+
			"[Install]\nWantedBy=default.target\n")
		reload(t, m)
		link := filepath.Join(h.UnitDir, "default.target.wants", "enabled.service")
		if err := m.Enable(ctx, "enabled.service"); err != nil {
			t.Fatalf("Enable: %v", err)
		}
		if dst, err := os.Readlink(link); err != nil || filepath.Base(dst) != "enabled.service" {
			t.Errorf("after Enable: link %s -> %q, %v", link, dst, err)
		}
		if err := m.Enable(ctx, "enabled.service"); err != nil {
			t.Errorf("second Enable: %v, want nil", err)
		}
		if err := m.Disable(ctx, "enabled.service"); err != nil {
			t.Fatalf("Disable: %v", err)
		}
		if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after Disable: %s still there (%v)", link, err)
		}
	})

	t.Run("Watch", func(t *testing.T) {
		writeUnit(t, h, "crasher.service", "[Service]\nType=exec\nExecStart=/bin/sh -c 'sleep 0.3; exit 3'\n")
		reload(t, m)
		events := watch(t, m)
		events.waitFor(t, "", 5*time.Second) // subscribed

		started := time.Now()
		if err := m.Start(ctx, "crasher.service"); err != nil {
			t.Fatalf("Start: %v", err)
		}
		// Changes arrive for the start too; wait for the one that shows the crash.
		deadline := started.Add(300*time.Millisecond + time.Second)
		for {
			events.waitFor(t, "crasher.service", time.Until(deadline))
			if s := state(t, m, "crasher.service"); s.ActiveState == "failed" {
				if s.Result != "exit-code" {
					t.Errorf("Result = %q, want exit-code", s.Result)
				}
				break
			}
		}
		t.Logf("crash seen %s after start", time.Since(started).Round(time.Millisecond))
	})

	t.Run("CountReloads", func(t *testing.T) {
		count := h.CountReloads(t)
		const n = 3
		for range n {
			reload(t, m)
		}
		deadline := time.Now().Add(2 * time.Second)
		for count() < n && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // no extra reload trails behind
		if got := count(); got != n {
			t.Errorf("CountReloads = %d after %d Reload calls", got, n)
		}
	})

	t.Run("JobTimeout", func(t *testing.T) {
		// An explicit JobTimeout still bounds the wait on top of ctx.
		writeUnit(t, h, "slow.service", "[Service]\nType=exec\nExecStartPre=/bin/sleep 2\nExecStart=/bin/sleep 1000\n")
		reload(t, m)
		m2 := open(t, h)
		m2.JobTimeout = 100 * time.Millisecond
		err := m2.Start(ctx, "slow.service")
		if !errors.Is(err, systemd.ErrJobTimeout) || !errors.Is(err, reconcile.ErrOutcomeUnknown) ||
			!strings.Contains(err.Error(), "slow.service") {
			t.Errorf("Start = %v, want ErrJobTimeout and ErrOutcomeUnknown naming the unit", err)
		}
		// The job goes on in systemd; replace it with a stop.
		stop(t, m, "slow.service")
	})

	t.Run("JobDeadline", func(t *testing.T) {
		if m.JobTimeout != 0 {
			t.Errorf("JobTimeout after Open = %s, want 0 (no limit of the Manager's own)", m.JobTimeout)
		}
		// systemd would wait for this start forever: only ctx ends the wait.
		writeUnit(t, h, "endless.service", "[Service]\nType=exec\nExecStartPre=/bin/sleep 30\n"+
			"ExecStart=/bin/sleep 1000\nTimeoutStartSec=infinity\n")
		reload(t, m)
		dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		began := time.Now()
		err := m.Start(dctx, "endless.service")
		took := time.Since(began)
		for _, target := range []error{reconcile.ErrOutcomeUnknown, systemd.ErrJobTimeout, context.DeadlineExceeded} {
			if !errors.Is(err, target) {
				t.Errorf("Start past ctx's deadline = %v, want errors.Is %q", err, target)
			}
		}
		if err == nil || !strings.HasPrefix(err.Error(), "start endless.service: ") {
			t.Errorf("Start error = %v, want it to name the unit", err)
		}
		if took > 5*time.Second {
			t.Errorf("Start returned after %s, want soon after the 300ms deadline", took)
		}
		// The job goes on in systemd.
		if s := state(t, m, "endless.service"); s.ActiveState != "activating" || s.SubState != "start-pre" ||
			s.TimeoutStartUSec != math.MaxUint64 {
			t.Errorf("after the deadline: %+v, want activating start-pre, TimeoutStartUSec infinity", s)
		}

		// Shutdown (a canceled ctx) is no unknown outcome: plain context.Canceled.
		cctx, cancel2 := context.WithCancel(ctx)
		timer := time.AfterFunc(200*time.Millisecond, cancel2)
		defer timer.Stop()
		err = m.Start(cctx, "endless.service")
		if !errors.Is(err, context.Canceled) || errors.Is(err, reconcile.ErrOutcomeUnknown) || errors.Is(err, systemd.ErrJobTimeout) {
			t.Errorf("Start with ctx canceled = %v, want context.Canceled and not ErrOutcomeUnknown", err)
		}
		stop(t, m, "endless.service")
		if s := state(t, m, "endless.service"); s.ActiveState != "inactive" && s.ActiveState != "failed" {
			t.Errorf("after Stop: %+v, want inactive", s)
		}
	})

	// Timeouts reads what a full read says of the timeouts, for every kind
	// of unit (the loop plans a unit just loaded from a listing and reads
	// only these when its job starts).
	t.Run("Timeouts", func(t *testing.T) {
		units := map[string]string{
			"to-infinity.service": "[Service]\nExecStart=/bin/sleep 1000\nTimeoutStartSec=infinity\n",
			"to-set.service":      "[Service]\nExecStart=/bin/sleep 1000\nTimeoutStartSec=7\nTimeoutStopSec=9\n",
			"to-default.service":  "[Service]\nExecStart=/bin/sleep 1000\n",
			"to-sock.socket":      "[Socket]\nListenStream=%t/to-sock.sock\nTimeoutSec=5\n",
			"to-sock.service":     "[Service]\nExecStart=/bin/sleep 1000\n",
			"to-timer.timer":      "[Timer]\nOnActiveSec=1h\nUnit=to-default.service\n",
			"to-path.path":        "[Path]\nPathExists=/nonexistent\nUnit=to-default.service\n",
			"to-target.target":    "[Unit]\nDescription=t\n",
		}
		for name, content := range units {
			writeUnit(t, h, name, content)
		}
		reload(t, m)
		want := map[string][2]uint64{"to-infinity.service": {math.MaxUint64, 90_000_000}, "to-set.service": {7_000_000, 9_000_000},
			"to-sock.socket": {5_000_000, 5_000_000}, "to-timer.timer": {}, "to-path.path": {}, "to-target.target": {}}
		for name := range units {
			start, stop, err := m.Timeouts(ctx, name)
			if err != nil {
				t.Fatalf("Timeouts(%s): %v", name, err)
			}
			full := state(t, m, name)
			if start != full.TimeoutStartUSec || stop != full.TimeoutStopUSec {
				t.Errorf("Timeouts(%s) = %d, %d; the full read says %d, %d", name, start, stop, full.TimeoutStartUSec, full.TimeoutStopUSec)
			}
			if w, ok := want[name]; ok && (start != w[0] || stop != w[1]) {
				t.Errorf("Timeouts(%s) = %d, %d, want %d, %d", name, start, stop, w[0], w[1])
			}
		}
	})

	// ManagerID names the manager instance: the same across calls and a
	// daemon-reload, another for another manager.
	t.Run("ManagerID", func(t *testing.T) {
		id, err := m.ManagerID(ctx)
		if err != nil || id == "" {
			t.Fatalf("ManagerID = %q, %v", id, err)
		}
		reload(t, m)
		if again, err := m.ManagerID(ctx); err != nil || again != id {
			t.Errorf("ManagerID after a daemon-reload = %q, %v; want %q", again, err, id)
		}
		other := open(t, systemdtest.Start(t))
		if oid, err := other.ManagerID(ctx); err != nil || oid == id || oid == "" {
			t.Errorf("another manager's ManagerID = %q, %v; this one's %q", oid, err, id)
		}
	})

	// UnitsLoaded moves with every daemon-reload, and a unit started
	// after it says so in its own timestamp (what the agent compares).
	t.Run("UnitsLoaded", func(t *testing.T) {
		before, err := m.UnitsLoaded(ctx)
		if err != nil || before == 0 {
			t.Fatalf("UnitsLoaded = %d, %v", before, err)
		}
		writeUnit(t, h, "loaded.service", "[Service]\nExecStart=/bin/sleep 1000\n")
		reload(t, m)
		after, err := m.UnitsLoaded(ctx)
		if err != nil || after <= before {
			t.Fatalf("UnitsLoaded after a daemon-reload = %d, %v; before %d", after, err, before)
		}
		if err := m.Start(ctx, "loaded.service"); err != nil {
			t.Fatal(err)
		}
		if st := state(t, m, "loaded.service"); st.InactiveExitMono <= after {
			t.Errorf("started after the reload, but InactiveExitTimestampMonotonic %d <= UnitsLoaded %d", st.InactiveExitMono, after)
		}
		stop(t, m, "loaded.service")
	})

	// A job queued first holds its unit loaded: the timeouts read after it
	// do not make systemd load the unit again, as they do before it (an
	// inactive unit nothing refers to is unloaded after every call). The
	// wait ends with the job, and runs out at its own deadline.
	t.Run("Queue", func(t *testing.T) {
		loads := h.CountLoads(t)
		writeUnit(t, h, "queued.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\nTimeoutStartSec=77\n")
		writeUnit(t, h, "unqueued.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\nTimeoutStartSec=77\n")
		writeUnit(t, h, "queued-hung.service", "[Service]\nType=exec\nExecStartPre=/bin/sleep 1000\nExecStart=/bin/true\n")
		reload(t, m)
		wait, err := m.Queue(ctx, reconcile.JobStart, "queued.service")
		if err != nil {
			t.Fatalf("Queue: %v", err)
		}
		if start, _, err := m.Timeouts(ctx, "queued.service"); err != nil || start != 77_000_000 {
			t.Fatalf("Timeouts after Queue = %d, %v; want 77 s", start, err)
		}
		if err := wait(ctx); err != nil {
			t.Fatalf("wait: %v", err)
		}
		if s := state(t, m, "queued.service"); s.ActiveState != "active" || s.MainPID == 0 {
			t.Fatalf("after the queued start: %+v, want active", s)
		}
		// The same, the timeouts read first, as the agent used to.
		if _, _, err := m.Timeouts(ctx, "unqueued.service"); err != nil {
			t.Fatal(err)
		}
		if err := m.Start(ctx, "unqueued.service"); err != nil {
			t.Fatal(err)
		}
		waitLoads := func(unit string, want int) {
			t.Helper()
			for deadline := time.Now().Add(5 * time.Second); loads(unit) < want && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond) // and no more
			if got := loads(unit); got != want {
				t.Errorf("systemd loaded %s %d times, want %d", unit, got, want)
			}
		}
		waitLoads("unqueued.service", 3) // one per property read (two), then the start's: the test can tell
		waitLoads("queued.service", 1)
		stop(t, m, "queued.service")
		stop(t, m, "unqueued.service")

		wait, err = m.Queue(ctx, reconcile.JobStart, "queued-hung.service")
		if err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if err := wait(short); !errors.Is(err, systemd.ErrJobTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("wait past its deadline = %v, want ErrJobTimeout and DeadlineExceeded", err)
		}
		stop(t, m, "queued-hung.service")
		if wait, err := m.Queue(ctx, reconcile.JobStop, "never-loaded.service"); err != nil || wait(ctx) != nil {
			t.Errorf("Queue(stop) of a unit systemd does not have = %v, want nothing to wait for, as Stop", err)
		}
	})

	t.Run("Closed", func(t *testing.T) {
		m := open(t, h)
		done := make(chan error, 1)
		go func() { done <- m.Watch(ctx, func(string) {}) }()
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if err := m.Reload(ctx); !errors.Is(err, systemd.ErrClosed) {
			t.Errorf("Reload after Close = %v, want ErrClosed", err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, systemd.ErrClosed) {
				t.Errorf("Watch after Close = %v, want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Watch did not return after Close")
		}
	})

	t.Run("CanceledContext", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := m.Reload(cctx); !errors.Is(err, context.Canceled) {
			t.Errorf("Reload with a canceled ctx = %v, want context.Canceled", err)
		}
		// The connection survives a canceled call.
		reload(t, m)
	})
}

// TestOutcomeUnknown checks the error chains the reconcile loop relies on.
func TestOutcomeUnknown(t *testing.T) {
	for _, err := range []error{systemd.ErrJobTimeout, systemd.ErrConnectionLost} {
		if !errors.Is(err, reconcile.ErrOutcomeUnknown) {
			t.Errorf("errors.Is(%q, reconcile.ErrOutcomeUnknown) = false", err)
		}
	}
	for _, err := range []error{systemd.ErrClosed, &systemd.JobError{Op: "start", Unit: "a.service", Result: "failed"}} {
		if errors.Is(err, reconcile.ErrOutcomeUnknown) {
			t.Errorf("errors.Is(%q, reconcile.ErrOutcomeUnknown) = true", err)
		}
	}
}

// TestState checks that State reports what systemd itself says, for each
// kind of unit the agent manages. It runs on a manager of its own.
func TestState(t *testing.T) {
	t.Parallel()
	h := systemdtest.Start(t)
	m := open(t, h)
	ctx := testContext(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}

	const sec = 1_000_000 // µs
	// The user manager's DefaultTimeoutStartSec= and DefaultTimeoutStopSec=.
	const dflt = 90 * sec
	const infinity = math.MaxUint64

	t.Run("Kinds", func(t *testing.T) {
		pidFile := filepath.Join(h.StateDir, "forking.pid")
		cases := []struct {
			unit    string
			content string
			extra   map[string]string // more unit files: the units a timer, socket or path triggers
			start   bool
			mainPID bool // a MainPID is expected (its value is systemd's)
			want    reconcile.UnitState
		}{{
			// Done once ExecStart has exited: back to inactive, and
			// systemd may even garbage-collect it (so no Ran asserted).
			unit:    "oneshot.service",
			content: "[Service]\nType=oneshot\nExecStart=/bin/true\n",
			start:   true,
			want: reconcile.UnitState{LoadState: "loaded", ActiveState: "inactive", SubState: "dead",
				Result: "success", Type: "oneshot", UnitFileState: "static",
				TimeoutStartUSec: infinity, TimeoutStopUSec: dflt}, // oneshot: no start timeout by default
		}, {
			unit:    "remain.service",
			content: "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n",
			start:   true,
			want: reconcile.UnitState{LoadState: "loaded", ActiveState: "active", SubState: "exited",
				Result: "success", Type: "oneshot", RemainAfterExit: true, UnitFileState: "static",
				TimeoutStartUSec: infinity, TimeoutStopUSec: dflt},
		}, {
			// The test binary itself sends READY=1 (see TestMain).
			unit: "notify.service",
			content: "[Service]\nType=notify\nEnvironment=" + helperEnv + "=notify\n" +
				"ExecStart=\"" + exe + "\"\n",
			start:   true,
			mainPID: true,
			want: reconcile.UnitState{LoadState: "loaded", ActiveState: "active", SubState: "running",
				Result: "success", Type: "notify", UnitFileState: "static",
				TimeoutStartUSec: dflt, TimeoutStopUSec: dflt},
		}, {
			unit: "forking.service",
			content: "[Service]\nType=forking\nPIDFile=" + pidFile + "\n" +
				"ExecStart=/bin/sh -c 'sleep 1000 & echo $$! > " + pidFile + "'\n",
			start:   true,
			mainPID: true,
			want: reconcile.UnitState{LoadState: "loaded", ActiveState: "active", SubState: "running",
				Result: "success", Type: "forking", UnitFileState: "static",
				TimeoutStartUSec: dflt, TimeoutStopUSec: dflt},
		}, {
			unit:    "tick.timer",
			content: "[Timer]\nOnActiveSec=1h\n",
			extra:   map[string]string{"tick.service": "[Service]\nType=oneshot\nExecStart=/bin/true\n"},
			start:   true,
			want: reconcile.UnitState{LoadState: "loaded", ActiveState: "active", SubState: "waiting",
				Result: "success", UnitFileState: "static"}, // timers have no job timeout: 0
		}, {
			unit:    "listen.socket",
			content: "[Socket]\nListenStream=" + filepath.Join(h.Dir, "listen.sock") + "\nTimeoutSec=5\n",
			extra:   map[string]string{"listen.service": "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"},
			start:   true,
			want: reconcile.UnitState{LoadState: "loaded", ActiveState: "active", SubState: "listening",
				Result: "success", UnitFileState: "static",
				TimeoutStartUSec: 5 * sec, TimeoutStopUSec: 5 * sec}, // TimeoutUSec, for both
		}, {
			unit:    "look.path",
			content: "[Path]\nPathExists=" + filepath.Join(h.Dir, "never") + "\n",
			extra:   map[string]string{"look.service": "[Service]\nType=oneshot\nExecStart=/bin/true\n"},
			start:   true,
			want: reconcile.UnitState{LoadState: "loaded", ActiveState: "active", SubState: "waiting",
				Result: "success", UnitFileState: "static"},
		}, {
			unit:    "infinite.service",
			content: "[Service]\nType=exec\nExecStart=/bin/sleep 1000\nTimeoutStartSec=infinity\n",
			want: reconcile.UnitState{LoadState: "loaded", ActiveState: "inactive", SubState: "dead",
				Result: "success", Type: "exec", UnitFileState: "static",
				TimeoutStartUSec: infinity, TimeoutStopUSec: dflt},
		}, {
			unit:    "seven.service",
			content: "[Service]\nType=exec\nExecStart=/bin/sleep 1000\nTimeoutStartSec=7\nTimeoutStopSec=11\n",
			want: reconcile.UnitState{LoadState: "loaded", ActiveState: "inactive", SubState: "dead",
				Result: "success", Type: "exec", UnitFileState: "static",
				TimeoutStartUSec: 7 * sec, TimeoutStopUSec: 11 * sec},
		}}
		for _, tc := range cases {
			writeUnit(t, h, tc.unit, tc.content)
			for name, content := range tc.extra {
				writeUnit(t, h, name, content)
			}
		}
		reload(t, m)
		for _, tc := range cases {
			t.Run(tc.unit, func(t *testing.T) {
				if tc.start {
					if err := m.Start(ctx, tc.unit); err != nil {
						t.Fatalf("Start: %v", err)
					}
					defer stop(t, m, tc.unit)
				}
				got := state(t, m, tc.unit)
				sameWithoutFileState(t, m, tc.unit, got)
				if tc.mainPID != (got.MainPID != 0) {
					t.Errorf("MainPID = %d, want a MainPID: %v", got.MainPID, tc.mainPID)
				}
				if tc.start && tc.want.ActiveState == "active" && (!got.Ran || got.InactiveExitMono == 0 || got.ActiveEnterMono == 0) {
					t.Errorf("active unit: Ran %v, InactiveExitMono %d, ActiveEnterMono %d; want Ran and both set",
						got.Ran, got.InactiveExitMono, got.ActiveEnterMono)
				}
				// Checked above or systemd's own values: compare the rest exactly.
				got.MainPID, got.Ran = 0, false
				got.ActiveEnterMono, got.ActiveExitMono, got.InactiveEnterMono, got.InactiveExitMono = 0, 0, 0, 0
				if got != tc.want {
					t.Errorf("State =\n %+v\nwant\n %+v", got, tc.want)
				}
			})
		}
	})

	t.Run("SkippingFileStateNotLoaded", func(t *testing.T) {
		writeUnit(t, h, "bad.service", "[Service]\nType=bogus\n")
		reload(t, m)
		for _, u := range []string{"nosuch.service", "bad.service"} {
			full := state(t, m, u)
			if full.LoadState == "loaded" || full.LoadError == "" {
				t.Fatalf("%s: %+v, want not loaded, with a LoadError", u, full)
			}
			sameWithoutFileState(t, m, u, full)
		}
	})

	t.Run("CrashLoop", func(t *testing.T) {
		// No start limit: it keeps restarting until stopped.
		writeUnit(t, h, "crashloop.service", "[Unit]\nStartLimitIntervalSec=0\n"+
			"[Service]\nType=simple\nExecStart=/bin/false\nRestart=always\nRestartSec=100ms\n")
		reload(t, m)
		if err := m.Start(ctx, "crashloop.service"); err != nil {
			t.Fatalf("Start: %v", err)
		}
		defer stop(t, m, "crashloop.service")
		// Each crash shows as auto-restart (activating) with the exit's
		// Result for RestartSec; NRestarts counts the restarts.
		var crashed, s reconcile.UnitState
		deadline := time.Now().Add(10 * time.Second)
		for {
			s = state(t, m, "crashloop.service")
			// In auto-restart there is no main process. A read that mixed
			// two moments (the Unit interface before the next start, the
			// Service interface after it: seen in CI as ExitStatus 0 with
			// the new run's MainPID) is read again (TestReadStateIsNotTorn).
			if s.SubState == "auto-restart" && s.Result == "exit-code" {
				crashed = s
			}
			if crashed.SubState != "" && s.NRestarts > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no auto-restart after exit-code with NRestarts > 0 within 10s: last %+v", s)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if crashed.ActiveState != "activating" || crashed.ExitStatus != 1 || crashed.Type != "simple" || crashed.MainPID != 0 {
			t.Errorf("in auto-restart: %+v, want activating, ExitStatus 1, Type simple, no MainPID", crashed)
		}
		t.Logf("NRestarts %d, then %+v", s.NRestarts, s)
		// It keeps counting.
		n := s.NRestarts
		for s.NRestarts <= n && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			s = state(t, m, "crashloop.service")
		}
		if s.NRestarts <= n {
			t.Errorf("NRestarts stayed at %d", s.NRestarts)
		}
	})

	t.Run("NeedDaemonReload", func(t *testing.T) {
		writeUnit(t, h, "edited.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n")
		reload(t, m)
		if err := m.Start(ctx, "edited.service"); err != nil { // loaded while we look
			t.Fatal(err)
		}
		defer stop(t, m, "edited.service")
		if s := state(t, m, "edited.service"); s.NeedDaemonReload {
			t.Errorf("before the edit: NeedDaemonReload true")
		}
		writeUnit(t, h, "edited.service", "[Unit]\nDescription=edited\n[Service]\nType=exec\nExecStart=/bin/sleep 1000\n")
		if s := state(t, m, "edited.service"); !s.NeedDaemonReload {
			t.Errorf("after editing the file: NeedDaemonReload false")
		}
		reload(t, m)
		if s := state(t, m, "edited.service"); s.NeedDaemonReload || s.ActiveState != "active" {
			t.Errorf("after Reload: %+v, want NeedDaemonReload false, still active", s)
		}
	})

	t.Run("UnitFileState", func(t *testing.T) {
		writeUnit(t, h, "installable.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"+
			"[Install]\nWantedBy=default.target\n")
		reload(t, m)
		if s := state(t, m, "installable.service"); s.UnitFileState != "disabled" {
			t.Errorf("before Enable: UnitFileState %q, want disabled", s.UnitFileState)
		}
		if err := m.Enable(ctx, "installable.service"); err != nil {
			t.Fatal(err)
		}
		reload(t, m) // UnitFileState changes only with the reload
		if s := state(t, m, "installable.service"); s.UnitFileState != "enabled" {
			t.Errorf("after Enable and Reload: UnitFileState %q, want enabled", s.UnitFileState)
		}
		if err := m.Disable(ctx, "installable.service"); err != nil {
			t.Fatal(err)
		}
		reload(t, m)
		if s := state(t, m, "installable.service"); s.UnitFileState != "disabled" {
			t.Errorf("after Disable and Reload: UnitFileState %q, want disabled", s.UnitFileState)
		}
	})

	t.Run("Timestamps", func(t *testing.T) {
		// Enabled, so systemd keeps it loaded (and its timestamps) once stopped.
		writeUnit(t, h, "stamped.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"+
			"[Install]\nWantedBy=default.target\n")
		if err := m.Enable(ctx, "stamped.service"); err != nil {
			t.Fatal(err)
		}
		reload(t, m)
		if s := state(t, m, "stamped.service"); s.InactiveExitMono != 0 || s.ActiveEnterMono != 0 || s.Ran {
			t.Errorf("never started: %+v, want InactiveExitMono and ActiveEnterMono 0, not Ran", s)
		}
		if err := m.Start(ctx, "stamped.service"); err != nil {
			t.Fatal(err)
		}
		up := state(t, m, "stamped.service")
		if up.InactiveExitMono == 0 || up.ActiveEnterMono < up.InactiveExitMono {
			t.Errorf("after Start: InactiveExit %d, ActiveEnter %d; want non-zero and ordered",
				up.InactiveExitMono, up.ActiveEnterMono)
		}
		stop(t, m, "stamped.service")
		s := state(t, m, "stamped.service")
		ts := []uint64{s.InactiveExitMono, s.ActiveEnterMono, s.ActiveExitMono, s.InactiveEnterMono}
		for i, v := range ts {
			if v == 0 || i > 0 && v < ts[i-1] {
				t.Errorf("after Start and Stop: InactiveExit, ActiveEnter, ActiveExit, InactiveEnter = %v; want non-zero, ordered", ts)
				break
			}
		}
		if s.InactiveExitMono != up.InactiveExitMono || s.ActiveEnterMono != up.ActiveEnterMono || !s.Ran {
			t.Errorf("after Stop: %+v, want the start's timestamps kept and Ran", s)
		}
	})
}

// TestReconnect restarts the bus under a Manager and its Watch: both must
// come back by themselves.
func TestReconnect(t *testing.T) {
	t.Parallel()
	h := systemdtest.Start(t)
	m := open(t, h)
	ctx := testContext(t)
	writeUnit(t, h, "sleeper.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n")
	reload(t, m)

	events := watch(t, m)
	events.waitFor(t, "", 5*time.Second) // subscribed

	// Kill the bus daemon through the manager (it is the manager's child);
	// dbus.socket starts a new one on the next connection.
	busPID := h.MainPID(t, "dbus.service")
	conn, err := h.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn.KillUnitWithTarget(ctx, "dbus.service", sddbus.All, 9)
	conn.Close()

	// A call notices the dead connection and redials once.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := m.Start(ctx, "sleeper.service")
		if err == nil {
			break
		}
		// Until systemd itself is back on the new bus, calls may fail.
		if time.Now().After(deadline) {
			t.Fatalf("Start after the bus restarted: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s := state(t, m, "sleeper.service"); s.ActiveState != "active" {
		t.Errorf("State = %+v, want active", s)
	}
	if pid := h.MainPID(t, "dbus.service"); pid == busPID || pid == 0 {
		t.Errorf("dbus.service MainPID = %d, want a new bus daemon (was %d)", pid, busPID)
	}

	// Watch resubscribed and asks for a resync, then reports changes again.
	events.waitFor(t, "", 10*time.Second)
	if err := m.Stop(ctx, "sleeper.service"); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	events.waitFor(t, "sleeper.service", 2*time.Second)
}

// helperEnv makes the test binary a unit's main process instead of running
// tests: "notify" sends READY=1 itself (so NotifyAccess=main accepts it),
// then sleeps until stopped.
const helperEnv = "AGENTD_SYSTEMD_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "notify" {
		notifyHelper()
		return
	}
	os.Exit(m.Run())
}

func notifyHelper() {
	// Go maps a leading "@" to an abstract socket address.
	c, err := net.Dial("unixgram", os.Getenv("NOTIFY_SOCKET"))
	if err == nil {
		_, err = c.Write([]byte("READY=1"))
		c.Close()
	}
	if err != nil {
		os.Stderr.WriteString("notify helper: " + err.Error() + "\n")
		os.Exit(1)
	}
	time.Sleep(time.Hour)
}

// sameWithoutFileState checks that StateSkippingFileState reads what State
// read (full, just before) but UnitFileState.
func sameWithoutFileState(t *testing.T, m *systemd.Manager, unit string, full reconcile.UnitState) {
	t.Helper()
	skip, err := m.StateSkippingFileState(testContext(t), unit)
	if err != nil {
		t.Fatalf("StateSkippingFileState(%s): %v", unit, err)
	}
	full.UnitFileState = ""
	if skip != full {
		t.Errorf("StateSkippingFileState(%s) =\n %+v\nState without UnitFileState\n %+v", unit, skip, full)
	}
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func open(t testing.TB, h *systemdtest.Harness) *systemd.Manager {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := systemd.Open(testContext(t), systemd.AddressDialer(h.BusAddress), log)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func writeUnit(t testing.TB, h *systemdtest.Harness, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(h.UnitDir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func reload(t testing.TB, m *systemd.Manager) {
	t.Helper()
	if err := m.Reload(testContext(t)); err != nil {
		t.Fatal(err)
	}
}

func stop(t *testing.T, m *systemd.Manager, unit string) {
	t.Helper()
	if err := m.Stop(testContext(t), unit); err != nil {
		t.Fatal(err)
	}
}

func state(t *testing.T, m *systemd.Manager, unit string) reconcile.UnitState {
	t.Helper()
	s, err := m.State(testContext(t), unit)
	if err != nil {
		t.Fatalf("State(%s): %v", unit, err)
	}
	return s
}

// events records what Watch reports.
type events struct {
	mu     sync.Mutex
	cond   chan struct{} // closed and replaced on every event
	queued []string
}

// watch runs m.Watch until the test ends and records its calls.
func watch(t *testing.T, m *systemd.Manager) *events {
	e := &events{cond: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- m.Watch(ctx, func(unit string) {
			e.mu.Lock()
			e.queued = append(e.queued, unit)
			close(e.cond)
			e.cond = make(chan struct{})
			e.mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	return e
}

// waitFor consumes events until unit is reported, failing the test after d.
func (e *events) waitFor(t *testing.T, unit string, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		e.mu.Lock()
		for len(e.queued) > 0 {
			u := e.queued[0]
			e.queued = e.queued[1:]
			if u == unit {
				e.mu.Unlock()
				return
			}
		}
		cond := e.cond
		e.mu.Unlock()
		select {
		case <-cond:
		case <-timer.C:
			t.Fatalf("Watch did not report %q within %s", unit, d)
		}
	}
}
