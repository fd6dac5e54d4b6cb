package systemd_test

import (
	"context"
	"errors"
	"log/slog"
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
		writeUnit(t, h, "slow.service", "[Service]\nType=exec\nExecStartPre=/bin/sleep 2\nExecStart=/bin/sleep 1000\n")
		reload(t, m)
		m2 := open(t, h)
		m2.JobTimeout = 100 * time.Millisecond
		err := m2.Start(ctx, "slow.service")
		if !errors.Is(err, systemd.ErrJobTimeout) || !strings.Contains(err.Error(), "slow.service") {
			t.Errorf("Start = %v, want ErrJobTimeout naming the unit", err)
		}
		// The job goes on in systemd; replace it with a stop.
		stop(t, m, "slow.service")
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

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, h *systemdtest.Harness) *systemd.Manager {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := systemd.Open(testContext(t), systemd.AddressDialer(h.BusAddress), log)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func writeUnit(t *testing.T, h *systemdtest.Harness, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(h.UnitDir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func reload(t *testing.T, m *systemd.Manager) {
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
