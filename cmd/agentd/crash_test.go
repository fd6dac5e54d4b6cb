package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// Must-hold "a crash-resumable executor": the agent is SIGKILLed between
// the file write and the daemon-reload, between the daemon-reload and the
// restart, and during the restart. Each time the restarted agent finishes
// the work: the changed unit ends on the new definition by systemd's own
// view (NeedDaemonReload=no, the new Environment= in /proc/<MainPID>/environ)
// and the unchanged unit is not restarted (same MainPID, one start recorded
// by its own ExecStartPost hook).
//
// The agent runs as its own process (buildAgent) so it can really be
// SIGKILLed; the hidden --test-pause-at flag blocks a pass at a named point
// and marks it with <state-dir>/paused-at-<point>.

// crashAgent is one `agentd run` process against a private systemd.
type crashAgent struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
}

// startCrashAgent starts `agentd run --user` for host against h and the
// etcd at endpoint, with extra flags. The process is killed in t.Cleanup
// if it still runs then (registered after the harness, so it runs first).
func startCrashAgent(t *testing.T, h *systemdtest.Harness, endpoint, host string, extra ...string) *crashAgent {
	t.Helper()
	args := append([]string{"run", "--user", "--host", host, "--etcd-endpoints", endpoint,
		"--unit-dir", h.UnitDir, "--state-dir", h.StateDir, "--debug-socket", filepath.Join(h.Dir, "agentd.sock"),
		"--lease-ttl", "2s", "--log-level", "debug"}, extra...)
	cmd := exec.Command(buildAgent(t), args...)
	cmd.Env = append(os.Environ(), "DBUS_SESSION_BUS_ADDRESS="+h.BusAddress)
	cmd.Stdout, cmd.Stderr = t.Output(), t.Output()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &crashAgent{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(a.done) }()
	t.Cleanup(a.kill)
	t.Logf("agent pid %d: agentd %s", cmd.Process.Pid, strings.Join(args, " "))
	return a
}

// kill SIGKILLs the agent and waits until it is reaped. Idempotent.
func (a *crashAgent) kill() {
	select {
	case <-a.done:
		return
	default:
	}
	a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
}

// stop ends the agent the way systemctl stop would (SIGTERM), SIGKILL
// after 15 s.
func (a *crashAgent) stop(t *testing.T) {
	t.Helper()
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(15 * time.Second):
		a.kill()
		t.Error("the agent did not stop within 15s of SIGTERM")
	}
}

// exited reports whether the process is gone (it must not die on its own).
func (a *crashAgent) exited() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// waitFor polls cond every 20 ms until it holds, failing the test after
// within; it fails at once when the agent died on its own.
func waitFor(t *testing.T, a *crashAgent, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if a != nil && a.exited() {
			t.Fatalf("waiting until %s: the agent exited on its own (%v)", what, a.cmd.ProcessState)
		}
		if time.Since(start) > within {
			t.Fatalf("timed out after %v waiting until %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// crashUnit is a long-running service whose version shows in its
// environment (V=<v>) and whose every start is recorded by its own
// ExecStartPost hook as "<unit> <MainPID> <V>" in events. slow adds a 2 s
// ExecStartPre, so a (re)start stays "activating" long enough to kill the
// agent in the middle of it.
func crashUnit(events, v string, slow bool) string {
	pre := ""
	if slow {
		pre = "ExecStartPre=/bin/sleep 2\n"
	}
	return "[Service]\nType=exec\nEnvironment=V=" + v + "\n" + pre +
		"ExecStart=/bin/sleep 1000\n" +
		"ExecStartPost=/bin/sh -c 'echo \"%n $$MAINPID $$V\" >> " + events + "'\n" + fast
}

// starts returns the starts the units' hooks recorded for unit, in order,
// as "<MainPID> <V>".
func starts(events, unit string) []string {
	b, _ := os.ReadFile(events)
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if rest, ok := strings.CutPrefix(line, unit+" "); ok {
			out = append(out, rest)
		}
	}
	return out
}

func needDaemonReload(t *testing.T, h *systemdtest.Harness, unit string) bool {
	t.Helper()
	v, ok := h.Prop(t, unit, "NeedDaemonReload").(bool)
	if !ok {
		t.Fatalf("NeedDaemonReload of %s is not a boolean", unit)
	}
	return v
}

// environHas reports whether /proc/<pid>/environ holds the entry kv.
func environHas(pid uint32, kv string) bool {
	if pid == 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	for _, e := range bytes.Split(b, []byte{0}) {
		if string(e) == kv {
			return true
		}
	}
	return false
}

// crashScene is one host: a private systemd, an etcd, two units at v1 —
// "changed.service" (about to change) and "same.service" (never changes).
type crashScene struct {
	t        *testing.T
	h        *systemdtest.Harness
	endpoint string
	reg      *registry.Client
	host     string
	events   string
	// v1 MainPIDs, read from systemd once the agent converged.
	changedPID, samePID uint32
}

const (
	changedUnit = "changed.service"
	sameUnit    = "same.service"
)

func newCrashScene(t *testing.T, host string) *crashScene {
	t.Helper()
	h := systemdtest.Start(t)
	et := registrytest.StartEtcd(t)
	return &crashScene{t: t, h: h, endpoint: et.Endpoint(), reg: registrytest.NewClient(t, et.Endpoint()), host: host,
		events: filepath.Join(h.Dir, "starts")}
}

func (s *crashScene) agent(extra ...string) *crashAgent {
	s.t.Helper()
	return startCrashAgent(s.t, s.h, s.endpoint, s.host, extra...)
}

func (s *crashScene) put(units map[string]string) {
	s.t.Helper()
	kv := map[string][]byte{}
	for n, c := range units {
		kv[n] = []byte(c)
	}
	if _, err := s.reg.Put(context.Background(), registry.Target{Host: s.host}, kv); err != nil {
		s.t.Fatal(err)
	}
}

// converged says the agent reports unit on content, active, done and out
// of its HealthySec window.
func (s *crashScene) converged(unit, content string) bool {
	st, err := s.reg.Statuses(context.Background(), s.host)
	if err != nil {
		return false
	}
	u, ok := st[unit]
	return ok && u.Hash == reconcile.Hash([]byte(content)) && u.DesiredHash == u.Hash &&
		u.ActiveState == "active" && u.Result == "done" && !u.Verifying && u.Error == ""
}

// installV1 puts v1 of both units through a running agent, waits until
// both run, and records their MainPIDs.
func (s *crashScene) installV1(a *crashAgent, changedV1 string) {
	s.t.Helper()
	sameV1 := crashUnit(s.events, "1", false)
	s.put(map[string]string{changedUnit: changedV1, sameUnit: sameV1})
	d := waitFor(s.t, a, 30*time.Second, "v1 of both units runs", func() bool {
		return s.converged(changedUnit, changedV1) && s.converged(sameUnit, sameV1)
	})
	s.changedPID, s.samePID = s.h.MainPID(s.t, changedUnit), s.h.MainPID(s.t, sameUnit)
	if s.changedPID == 0 || s.samePID == 0 || !environHas(s.changedPID, "V=1") {
		s.t.Fatalf("v1 not running: MainPID %s=%d %s=%d", changedUnit, s.changedPID, sameUnit, s.samePID)
	}
	s.t.Logf("v1 installed and running in %v (MainPID %s=%d, %s=%d)", d.Round(time.Millisecond), changedUnit, s.changedPID, sameUnit, s.samePID)
}

// assertResumed waits until the agent started after the kill has put
// changed.service on v2 by systemd's own view, then checks same.service
// was never restarted.
func (s *crashScene) assertResumed(a *crashAgent, changedV2 string, killedAt time.Time) {
	s.t.Helper()
	t, h := s.t, s.h
	var pid uint32
	waitFor(t, a, 30*time.Second, changedUnit+" runs v2 by systemd's view (NeedDaemonReload=no, active, V=2 in its environ)", func() bool {
		if needDaemonReload(t, h, changedUnit) || h.ActiveState(t, changedUnit) != "active" {
			return false
		}
		pid = h.MainPID(t, changedUnit)
		return environHas(pid, "V=2")
	})
	t.Logf("%s on v2 (MainPID %d) %v after the SIGKILL", changedUnit, pid, time.Since(killedAt).Round(time.Millisecond))
	if pid == s.changedPID {
		t.Errorf("%s MainPID still %d: not restarted", changedUnit, pid)
	}
	if got, _ := os.ReadFile(filepath.Join(h.UnitDir, changedUnit)); string(got) != changedV2 {
		t.Errorf("%s on disk is not v2: %q", changedUnit, got)
	}
	// The agent itself sees the work as done (its report, not its logs).
	waitFor(t, a, 30*time.Second, "the agent reports "+changedUnit+" converged on v2", func() bool {
		return s.converged(changedUnit, changedV2)
	})
	// Unchanged: not restarted by the crash, the resume or the reloads.
	if p := h.MainPID(t, sameUnit); p != s.samePID {
		t.Errorf("%s (unchanged) was restarted: MainPID %d → %d", sameUnit, s.samePID, p)
	}
	if st := starts(s.events, sameUnit); len(st) != 1 {
		t.Errorf("%s (unchanged) started %d times by its own hook, want 1: %q", sameUnit, len(st), st)
	}
	if needDaemonReload(t, h, sameUnit) {
		t.Errorf("%s: NeedDaemonReload=yes", sameUnit)
	}
	if h.ActiveState(t, sameUnit) != "active" {
		t.Errorf("%s: %s", sameUnit, h.ActiveState(t, sameUnit))
	}
	// Still V=2 a moment later: no late restart back onto something else.
	time.Sleep(500 * time.Millisecond)
	if p := h.MainPID(t, changedUnit); !environHas(p, "V=2") {
		t.Errorf("%s MainPID %d no longer runs V=2", changedUnit, p)
	}
	t.Logf("%s starts recorded by its hook (MainPID V): %q", changedUnit, starts(s.events, changedUnit))
}

// A pass blocked at point by --test-pause-at is SIGKILLed there; a new
// agent finishes the work. check asserts what the kill left behind.
func crashAtPausePoint(t *testing.T, point, host string, check func(s *crashScene, v2 string)) {
	s := newCrashScene(t, host)
	v1, v2 := crashUnit(s.events, "1", false), crashUnit(s.events, "2", false)

	a1 := s.agent()
	s.installV1(a1, v1)
	a1.stop(t)
	killedAt := s.killAtPause(point, v2)

	// What the kill left: v2 on disk, the old process still running.
	if got, _ := os.ReadFile(filepath.Join(s.h.UnitDir, changedUnit)); string(got) != v2 {
		t.Fatalf("killed at %s: %s on disk is not v2: %q", point, changedUnit, got)
	}
	if p := s.h.MainPID(t, changedUnit); p != s.changedPID || !environHas(p, "V=1") {
		t.Fatalf("killed at %s: %s already restarted (MainPID %d → %d)", point, changedUnit, s.changedPID, p)
	}
	check(s, v2)

	a3 := s.agent()
	s.assertResumed(a3, v2, killedAt)
}

// killAtPause starts an agent that blocks at point (--test-pause-at), puts
// v2 of changed.service, waits until the agent is blocked there, SIGKILLs
// it and returns when.
func (s *crashScene) killAtPause(point, v2 string) time.Time {
	return s.killAtPauseOnce(point, v2, "", nil)
}

// killAtPauseOnce is killAtPause that, with the agent blocked, also waits
// until cond (what) holds before the kill.
func (s *crashScene) killAtPauseOnce(point, v2, what string, cond func() bool) time.Time {
	t := s.t
	t.Helper()
	a := s.agent("--test-pause-at", point)
	paused := filepath.Join(s.h.StateDir, "paused-at-"+point)
	if _, err := os.Stat(paused); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s exists before the change: %v", paused, err)
	}
	s.put(map[string]string{changedUnit: v2})
	d := waitFor(t, a, 30*time.Second, "the agent pauses at "+point, func() bool {
		_, err := os.Stat(paused)
		return err == nil
	})
	t.Logf("paused at %s %v after the put", point, d.Round(time.Millisecond))
	if cond != nil {
		waitFor(t, a, 30*time.Second, what, cond)
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.done
	t.Logf("agent SIGKILLed at %s", point)
	return time.Now()
}

// Killed between the file write and the daemon-reload: systemd still runs
// and has loaded v1 (NeedDaemonReload=yes); the next agent reloads and
// restarts.
func TestCrashBetweenWriteAndReload(t *testing.T) {
	buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()  // waits on timers, not the CPU
	crashAtPausePoint(t, "files-written", "crash-written", func(s *crashScene, v2 string) {
		if !needDaemonReload(t, s.h, changedUnit) {
			t.Fatalf("killed before the daemon-reload, but systemd says %s NeedDaemonReload=no", changedUnit)
		}
		if needDaemonReload(t, s.h, sameUnit) {
			t.Fatalf("%s (unchanged): NeedDaemonReload=yes", sameUnit)
		}
	})
}

// Killed between the daemon-reload and the restart: systemd has loaded v2
// (NeedDaemonReload=no) but the process runs v1; the next agent restarts.
func TestCrashBetweenReloadAndRestart(t *testing.T) {
	buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()  // waits on timers, not the CPU
	crashAtPausePoint(t, "reloaded", "crash-reloaded", func(s *crashScene, v2 string) {
		if needDaemonReload(t, s.h, changedUnit) {
			t.Fatalf("killed after the daemon-reload, but systemd says %s NeedDaemonReload=yes", changedUnit)
		}
	})
}

// Killed during the restart: v2 takes 2 s to start (ExecStartPre), the
// agent is SIGKILLed while systemd shows the unit activating.
func TestCrashDuringRestart(t *testing.T) {
	buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()  // waits on timers, not the CPU
	s := newCrashScene(t, "crash-restarting")
	v1, v2 := crashUnit(s.events, "1", false), crashUnit(s.events, "2", true)

	a1 := s.agent()
	s.installV1(a1, v1)
	s.put(map[string]string{changedUnit: v2})
	var sub string
	d := waitFor(t, a1, 30*time.Second, changedUnit+" activating (the restart job in progress)", func() bool {
		if s.h.ActiveState(t, changedUnit) != "activating" {
			return false
		}
		sub, _ = s.h.Prop(t, changedUnit, "SubState").(string)
		return true
	})
	if err := a1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a1.done
	killedAt := time.Now()
	t.Logf("agent SIGKILLed %v after the put, %s activating (%s), state now %s", d.Round(time.Millisecond), changedUnit, sub, s.h.ActiveState(t, changedUnit))
	if s.h.MainPID(t, changedUnit) == s.changedPID {
		t.Fatalf("%s activating but its v1 MainPID %d still runs", changedUnit, s.changedPID)
	}

	a2 := s.agent()
	s.assertResumed(a2, v2, killedAt)
}

// Killed after the restart job ended, before the pass recorded its
// outcome (the intent still says the job is owed): v2 already runs. The
// next agent sees that the unit started after systemd loaded v2 and does
// not restart it a second time — its own hook shows one v1 and one v2
// start — and the version is still verified (HealthySec) and reported.
func TestCrashAfterRestartBeforeItsRecord(t *testing.T) {
	buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()  // waits on timers, not the CPU
	crashAfterRestart(t, "crash-job-done", "job-done", false)
}

// Killed after its restart job ran but before the pass that started it
// recorded anything more than its intent (the loop blocked right after
// starting the jobs): the daemon-reload was recorded before the job
// started, so the next agent sees the unit started after systemd loaded
// its files and does not restart it again.
func TestCrashAfterJobRanBeforeThePassRecords(t *testing.T) {
	buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()  // waits on timers, not the CPU
	crashAfterRestart(t, "crash-jobs-started", "jobs-started", true)
}

// crashAfterRestart kills the agent blocked at point once changed.service
// runs v2 (waiting for it there if waitV2, else it must run already) and
// checks that the next agent finishes without restarting it again.
func crashAfterRestart(t *testing.T, host, point string, waitV2 bool) {
	s := newCrashScene(t, host)
	v1, v2 := crashUnit(s.events, "1", false), crashUnit(s.events, "2", false)
	a1 := s.agent()
	s.installV1(a1, v1)
	a1.stop(t)
	runsV2 := func() bool {
		p := s.h.MainPID(t, changedUnit)
		return p != s.changedPID && environHas(p, "V=2") && !needDaemonReload(t, s.h, changedUnit)
	}
	var killedAt time.Time
	if waitV2 {
		killedAt = s.killAtPauseOnce(point, v2, changedUnit+" runs v2", runsV2)
	} else {
		killedAt = s.killAtPause(point, v2)
	}
	pid := s.h.MainPID(t, changedUnit)
	if !runsV2() {
		t.Fatalf("killed after the job: %s should run v2 already (MainPID %d → %d)", changedUnit, s.changedPID, pid)
	}

	a3 := s.agent()
	s.assertResumed(a3, v2, killedAt)
	if p := s.h.MainPID(t, changedUnit); p != pid {
		t.Errorf("%s restarted again after the agent's restart: MainPID %d → %d", changedUnit, pid, p)
	}
	if st := starts(s.events, changedUnit); len(st) != 2 {
		t.Errorf("%s started %d times by its own hook, want 2 (v1, v2): %q", changedUnit, len(st), st)
	}
}

// Temp files that writes killed midway left behind (".<name>.agentd-<12
// hex>", at the top of the unit directory and in drop-in directories) are
// removed when the agent starts; look-alikes are not touched.
func TestTempFilesOfKilledWritesRemovedAtStart(t *testing.T) {
	buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()  // waits on timers, not the CPU
	h := systemdtest.Start(t)
	et := registrytest.StartEtcd(t)
	reg := registrytest.NewClient(t, et.Endpoint())
	dropins := filepath.Join(h.UnitDir, "y.service.d")
	if err := os.MkdirAll(dropins, 0o755); err != nil {
		t.Fatal(err)
	}
	stale := []string{
		filepath.Join(h.UnitDir, ".x.service.agentd-0123456789ab"),
		filepath.Join(dropins, ".override.conf.agentd-0123456789ab"),
		filepath.Join(dropins, ".y.service.agentd-abcdef012345"),
	}
	keep := []string{
		filepath.Join(h.UnitDir, ".x.service.agentd-zz"),
		filepath.Join(h.UnitDir, ".x.service.agentd-0123456789abc"), // 13 digits
		filepath.Join(dropins, ".override.conf.agentd-zz"),
		filepath.Join(dropins, "override.conf"),
	}
	for _, p := range append(append([]string{}, stale...), keep...) {
		if err := os.WriteFile(p, []byte("[Service]\nExecStart=/bin/true\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A directory named like a temp file is not a temp file.
	dirLike := filepath.Join(h.UnitDir, ".z.service.agentd-0123456789ab")
	if err := os.Mkdir(dirLike, 0o755); err != nil {
		t.Fatal(err)
	}
	keep = append(keep, dirLike)

	a := startCrashAgent(t, h, et.Endpoint(), "temp-sweep")
	// A unit put and running proves the agent is past its start.
	probe := "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n" + fast
	if _, err := reg.Put(context.Background(), registry.Target{Host: "temp-sweep"}, map[string][]byte{"probe.service": []byte(probe)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, a, 30*time.Second, "probe.service runs", func() bool { return h.ActiveState(t, "probe.service") == "active" })
	for _, p := range stale {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale temp file %s not removed at start (%v)", p, err)
		}
	}
	for _, p := range keep {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("look-alike %s removed: %v", p, err)
		}
	}
	// The write of probe.service left no temp file of its own.
	entries, _ := os.ReadDir(h.UnitDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".probe.service.agentd-") {
			t.Errorf("temp file %s left by a finished write", e.Name())
		}
	}
}
