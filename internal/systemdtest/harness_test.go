package systemdtest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestHarness(t *testing.T) {
	h := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if len(strings.TrimPrefix(h.BusAddress, "unix:path=")) > 107 {
		t.Errorf("bus socket path too long for a unix socket: %s", h.BusAddress)
	}
	for _, d := range []string{h.UnitDir, h.StateDir} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			t.Errorf("%s: want a directory, got %v", d, err)
		}
	}
	if got := h.ActiveState(t, "harness.target"); got != "active" {
		t.Errorf("harness.target ActiveState = %q, want active", got)
	}
	if got := h.MainPID(t, "dbus.service"); got == 0 {
		t.Errorf("dbus.service MainPID = 0, want the bus daemon")
	}

	conn, err := h.Dial(ctx)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer conn.Close()
	reloads := h.CountReloads(t)
	const n = 2
	for range n {
		if err := conn.ReloadContext(ctx); err != nil {
			t.Fatalf("daemon-reload: %v", err)
		}
	}
	waitFor(t, 2*time.Second, func() bool { return reloads() == n })
	time.Sleep(100 * time.Millisecond)
	if got := reloads(); got != n {
		t.Errorf("CountReloads = %d after %d reloads", got, n)
	}

	// Units write to units.log, also after a daemon-reload (which resets the
	// manager's defaults to its config files).
	unit := "[Service]\nType=oneshot\nExecStart=/bin/echo unit-output-marker\n"
	if err := os.WriteFile(filepath.Join(h.UnitDir, "echo.service"), []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := conn.ReloadContext(ctx); err != nil {
		t.Fatal(err)
	}
	ch := make(chan string, 1)
	if _, err := conn.StartUnitContext(ctx, "echo.service", "replace", ch); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-ch:
		if res != "done" {
			t.Fatalf("start echo.service: job %s", res)
		}
	case <-ctx.Done():
		t.Fatal("start echo.service: no job result")
	}
	waitFor(t, 2*time.Second, func() bool { return strings.Contains(h.Log(), "unit-output-marker") })

	// Teardown leaves no process and no cgroup behind.
	pid := h.ManagerPID
	if err := h.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
		if comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm")); strings.TrimSpace(string(comm)) == "systemd" {
			t.Errorf("manager PID %d still running after Close", pid)
		}
	}
	for _, root := range cgroupRoots {
		if _, err := os.Stat(filepath.Join(root, h.cgroup)); err == nil {
			t.Errorf("cgroup %s/%s left behind", root, h.cgroup)
		}
	}
	if err := h.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCgroupName(t *testing.T) {
	for in, want := range map[string]string{
		"TestX":                  "TestX",
		"TestManager/Start_fail": "TestManager_Start_fail",
		strings.Repeat("a", 60):  strings.Repeat("a", 48),
	} {
		if got := cgroupName(in); got != want {
			t.Errorf("cgroupName(%q) = %q, want %q", in, got, want)
		}
	}
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
