package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testlog"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/systemd"
)

// Operator's-eye tests of the reworked agent: background jobs, health judged
// from systemd's properties, rollback to the version that ran before,
// removal by ownership. Everything is observed as an operator would:
// systemd's properties, /proc of the unit's main process, the units' own
// hooks, etcd status keys and CLI exit codes.

// judgeStartAgent is startAgent with the agent's log also copied into the
// returned buffer.
func judgeStartAgent(e *env) *testlog.Buffer {
	e.t.Helper()
	logs := &testlog.Buffer{}
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) { o.logOut = io.MultiWriter(e.t.Output(), logs) })
	return logs
}

// judgeWithin polls cond every 20ms until it holds or d passes.
func judgeWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// judgePut runs `agentd unit put FILES --host H [--wait --timeout T]` for
// name→content pairs given as alternating strings.
func judgePut(e *env, wait bool, pairs ...string) (string, int) {
	e.t.Helper()
	args := []string{"unit", "put"}
	for i := 0; i+1 < len(pairs); i += 2 {
		args = append(args, e.writeUnit(pairs[i], pairs[i+1]))
	}
	args = append(args, "--host", e.host)
	if wait {
		args = append(args, "--wait", "--timeout", "30s")
	}
	return e.cli(args...)
}

// judgeProc reads /proc/<pid>/<file> split on NUL (environ, cmdline).
func judgeProc(t *testing.T, pid uint32, file string) []string {
	t.Helper()
	if pid == 0 {
		return nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		return nil // the process is gone: nothing it holds
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

func judgeEnv(t *testing.T, pid uint32) []string { t.Helper(); return judgeProc(t, pid, "environ") }

func judgeStr(t *testing.T, e *env, unit, prop string) string {
	t.Helper()
	s, _ := e.h.Prop(t, unit, prop).(string)
	return s
}

// judgeHooks returns the hook lines ("start <ts>", "stop <ts>") of a file
// written by the units' own ExecStartPre/ExecStopPost.
func judgeHooks(path string) []string {
	b, _ := os.ReadFile(path)
	var kinds []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			kinds = append(kinds, f[0])
		}
	}
	return kinds
}

// judgeHookLines is unit file text for ExecStartPre/ExecStopPost hooks that
// append "start <time>" / "stop <time>" to path.
func judgeHookLines(path string) string {
	return "ExecStartPre=/bin/sh -c 'echo \"start $(date +%%s.%%N)\" >> " + path + "'\n" +
		"ExecStopPost=/bin/sh -c 'echo \"stop $(date +%%s.%%N)\" >> " + path + "'\n"
}

// judgeStatusRecorder polls the etcd status of one unit in the background and
// keeps every distinct (action, result, error, health) it saw.
type judgeStatusRecorder struct {
	mu     sync.Mutex
	seen   []reconcile.Status
	cancel context.CancelFunc
	done   chan struct{}
}

func judgeRecordStatus(e *env, unit string) *judgeStatusRecorder {
	ctx, cancel := context.WithCancel(context.Background())
	r := &judgeStatusRecorder{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		var last reconcile.Status
		for ctx.Err() == nil {
			st, err := e.reg.Statuses(ctx, e.host)
			if err == nil {
				if s, ok := st[unit]; ok {
					if s.Action != last.Action || s.Result != last.Result || s.Error != last.Error || s.Health != last.Health || s.Hash != last.Hash {
						r.mu.Lock()
						r.seen = append(r.seen, s)
						r.mu.Unlock()
						last = s
					}
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	e.t.Cleanup(r.stop)
	return r
}

func (r *judgeStatusRecorder) stop() {
	r.cancel()
	<-r.done
}

func (r *judgeStatusRecorder) all() []reconcile.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

// 1. A oneshot (with or without RemainAfterExit) is healthy once it ran;
// a timer put together with its oneshot service is healthy while waiting.
func TestJudgeOneshotAndTimerAreHealthy(t *testing.T) {
	t.Parallel() // the timers wait out HealthySec
	e := newEnv(t)
	e.startAgent()
	sock := e.agent.opts.debugSocket
	runs := filepath.Join(e.h.Dir, "runs")
	type tc struct{ unit, extra, active string }
	for _, c := range []tc{
		{"once.service", "", "inactive"},
		{"remain.service", "RemainAfterExit=yes\n", "active"},
	} {
		unit := "[Service]\nType=oneshot\nExecStartPre=/bin/sh -c 'echo " + c.unit + " >> " + runs + "'\nExecStart=/bin/true\n" + c.extra
		start := time.Now()
		out, code := judgePut(e, true, c.unit, unit)
		t.Logf("%s: put --wait exit %d after %v", c.unit, code, time.Since(start).Round(10*time.Millisecond))
		if code != 0 {
			t.Errorf("%s: put --wait exit %d, want 0\n%s", c.unit, code, out)
		}
		s, _ := e.status(c.unit)
		if s.Health != "healthy" || s.Action == "rolled-back" || s.Action == "rolling-back" || s.Action == "blocked" || s.Error != "" || s.Hash != reconcile.Hash([]byte(unit)) {
			t.Errorf("%s: status = %+v, want healthy, no rollback, no error", c.unit, s)
		}
		if st := e.h.ActiveState(t, c.unit); st != c.active {
			t.Errorf("%s: ActiveState = %s, want %s", c.unit, st, c.active)
		}
		if r := judgeStr(t, e, c.unit, "Result"); r != "success" {
			t.Errorf("%s: Result = %s", c.unit, r)
		}
	}
	// A completed oneshot is not started again by later passes.
	if out, code := e.cli("sync", "--debug-socket", sock); code != 0 {
		t.Errorf("agentd sync: exit %d\n%s", code, out)
	}
	time.Sleep(500 * time.Millisecond)
	b, _ := os.ReadFile(runs)
	if got := string(b); got != "once.service\nremain.service\n" {
		t.Errorf("oneshot runs = %q, want each exactly once", got)
	}

	// Timer + its oneshot service, in one put.
	timers := []struct{ timer, tcontent, svc, scontent string }{
		{"tick.timer", "[Timer]\nOnActiveSec=1h\n", "tick.service", "[Service]\nType=oneshot\nExecStart=/bin/true\n"},
		{"tock.timer", "[Timer]\nOnCalendar=2099-01-01 00:00:00\n", "tock.service", "[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Agentd]\nState=present\n"},
	}
	for _, x := range timers {
		start := time.Now()
		out, code := judgePut(e, true, x.timer, x.tcontent, x.svc, x.scontent)
		t.Logf("%s + %s: put --wait exit %d after %v", x.timer, x.svc, code, time.Since(start).Round(10*time.Millisecond))
		if code != 0 {
			t.Errorf("%s + %s: put --wait exit %d, want 0\n%s", x.timer, x.svc, code, out)
		}
		if st, sub := e.h.ActiveState(t, x.timer), judgeStr(t, e, x.timer, "SubState"); st != "active" || sub != "waiting" {
			t.Errorf("%s: %s (%s), want active (waiting)", x.timer, st, sub)
		}
		for _, u := range []string{x.timer, x.svc} {
			s, _ := e.status(u)
			if s.Action == "rolled-back" || s.Action == "rolling-back" || s.Action == "blocked" || s.Error != "" {
				t.Errorf("%s: status = %+v", u, s)
			}
		}
		if s, _ := e.status(x.timer); s.Health != "healthy" {
			t.Errorf("%s: Health = %q, want healthy", x.timer, s.Health)
		}
	}
}

// 2. Drop-ins on a unit the agent did not install: put restarts it with the
// drop-in in effect; rm restarts it without, and never stops, disables or
// deletes it. A cosmetic drop-in never restarts it.
func TestJudgeDropInsOnForeignUnit(t *testing.T) {
	t.Parallel() // waits out the default HealthySec
	e := newEnv(t)
	e.startAgent()
	events := filepath.Join(e.h.Dir, "events")
	own := "[Unit]\nDescription=own\n[Service]\nType=exec\n" + judgeHookLines(events) + "ExecStart=/bin/sleep 1000\n[Install]\nWantedBy=default.target\n"
	ownPath := filepath.Join(e.h.UnitDir, "own.service")
	if err := os.WriteFile(ownPath, []byte(own), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := systemd.Open(ctx, e.agentDialer(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Enable(ctx, "own.service"); err != nil {
		t.Fatal(err)
	}
	if err := m.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, "own.service"); err != nil {
		t.Fatal(err)
	}
	ufs := judgeStr(t, e, "own.service", "UnitFileState")
	if ufs != "enabled" {
		t.Fatalf("hand-enabled own.service: UnitFileState %s", ufs)
	}
	pid0 := e.h.MainPID(t, "own.service")

	// put the drop-in: restarted, L=1 in the new process.
	start := time.Now()
	out, code := judgePut(e, true, "own.service.d/limits.conf", "[Service]\nEnvironment=L=1\n")
	t.Logf("put drop-in --wait: exit %d after %v", code, time.Since(start).Round(10*time.Millisecond))
	if code != 0 {
		t.Fatalf("put drop-in: exit %d\n%s", code, out)
	}
	pid1 := e.h.MainPID(t, "own.service")
	if pid1 == 0 || pid1 == pid0 || !slices.Contains(judgeEnv(t, pid1), "L=1") {
		t.Errorf("after the drop-in: MainPID %d → %d, environ %q: want a restart with L=1", pid0, pid1, judgeEnv(t, pid1))
	}

	// rm the drop-in: restarted without L=1, never stopped for good.
	start = time.Now()
	out, code = e.cli("unit", "rm", "own.service.d/limits.conf", "--host", e.host, "--wait", "--timeout", "30s")
	t.Logf("rm drop-in --wait: exit %d after %v", code, time.Since(start).Round(10*time.Millisecond))
	if code != 0 {
		t.Fatalf("rm drop-in: exit %d\n%s", code, out)
	}
	var pid2 uint32
	judgeWithin(t, 10*time.Second, "own.service restarted without L=1", func() bool {
		pid2 = e.h.MainPID(t, "own.service")
		env := judgeEnv(t, pid2)
		return pid2 != 0 && pid2 != pid1 && env != nil && !slices.Contains(env, "L=1")
	})
	time.Sleep(time.Second) // anything that would stop it for good has had time to
	if out, code := e.cli("sync", "--debug-socket", e.agent.opts.debugSocket); code != 0 {
		t.Errorf("agentd sync: exit %d\n%s", code, out)
	}
	if st, sub := e.h.ActiveState(t, "own.service"), judgeStr(t, e, "own.service", "SubState"); st != "active" || sub != "running" {
		t.Errorf("own.service %s (%s) after the drop-in's removal, want active (running)", st, sub)
	}
	if p := e.h.MainPID(t, "own.service"); p != pid2 {
		t.Errorf("own.service MainPID %d → %d after the restart", pid2, p)
	}
	if b, err := os.ReadFile(ownPath); err != nil || string(b) != own {
		t.Errorf("own.service file changed or deleted: %q %v", b, err)
	}
	if got := judgeStr(t, e, "own.service", "UnitFileState"); got != ufs {
		t.Errorf("UnitFileState %s → %s", ufs, got)
	}
	if _, err := os.Stat(filepath.Join(e.h.UnitDir, "own.service.d", "limits.conf")); !os.IsNotExist(err) {
		t.Errorf("drop-in still on disk: %v", err)
	}
	// Hooks: start (by hand), then exactly two stop→start restarts.
	if got, want := strings.Join(judgeHooks(events), ","), "start,stop,start,stop,start"; got != want {
		t.Errorf("own.service hooks %s, want %s (two restarts, never a plain stop)", got, want)
	}

	// A cosmetic drop-in, put then removed: never a restart.
	hooks := len(judgeHooks(events))
	out, code = judgePut(e, true, "own.service.d/cosmetic.conf", "[Unit]\nDescription=x\n")
	if code != 0 {
		t.Errorf("put cosmetic drop-in: exit %d\n%s", code, out)
	}
	judgeWithin(t, 10*time.Second, "Description=x in effect", func() bool { return judgeStr(t, e, "own.service", "Description") == "x" })
	if p := e.h.MainPID(t, "own.service"); p != pid2 {
		t.Errorf("cosmetic drop-in: MainPID %d → %d", pid2, p)
	}
	out, code = e.cli("unit", "rm", "own.service.d/cosmetic.conf", "--host", e.host, "--wait", "--timeout", "30s")
	if code != 0 {
		t.Errorf("rm cosmetic drop-in: exit %d\n%s", code, out)
	}
	judgeWithin(t, 10*time.Second, "Description back to own", func() bool { return judgeStr(t, e, "own.service", "Description") == "own" })
	time.Sleep(time.Second)
	if p := e.h.MainPID(t, "own.service"); p != pid2 {
		t.Errorf("cosmetic drop-in removed: MainPID %d → %d", pid2, p)
	}
	if h := judgeHooks(events); len(h) != hooks {
		t.Errorf("cosmetic drop-in put/rm ran hooks %v", h[hooks:])
	}
	if st := e.h.ActiveState(t, "own.service"); st != "active" {
		t.Errorf("own.service %s at the end", st)
	}
}

// 3. Enablement follows the current version both ways, from a unit the
// agent created without [Install] (a link to its name made beforehand is
// undone) on.
func TestJudgeEnablementFollowsVersion(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	base := "[Unit]\nDescription=en\n[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"
	install := "[Install]\nWantedBy=default.target\n"
	link := filepath.Join(e.h.UnitDir, "default.target.wants", "en.service")
	steps := []struct {
		what, content string
		enabled       bool
	}{
		{"a new unit without [Install], its name linked before", base + fast, false},
		{"[Install]", base + install + fast, true},
		{"[Install] with Enable=no", base + install + "[X-Agentd]\nHealthySec=0\nEnable=no\n", false},
		{"[Install] again", base + install + fast, true},
		{"no [Install]", base + fast, false},
	}
	// A link made before the file existed (by hand, or left over): the
	// version has no [Install], so the agent disables it.
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../en.service", link); err != nil {
		t.Fatal(err)
	}
	var pid uint32
	for i, s := range steps {
		out, code := judgePut(e, true, "en.service", s.content)
		if code != 0 {
			t.Fatalf("step %d (%s): put exit %d\n%s", i, s.what, code, out)
		}
		ufs := judgeStr(t, e, "en.service", "UnitFileState")
		_, lerr := os.Lstat(link)
		t.Logf("step %d (%s): UnitFileState %s, symlink present %v", i, s.what, ufs, lerr == nil)
		switch {
		case s.enabled && (ufs != "enabled" || lerr != nil):
			t.Errorf("step %d (%s): UnitFileState %s, symlink err %v; want enabled", i, s.what, ufs, lerr)
		case !s.enabled && (ufs == "enabled" || lerr == nil):
			t.Errorf("step %d (%s): UnitFileState %s, symlink err %v; want not enabled (disabled/static)", i, s.what, ufs, lerr)
		}
		if st, _ := e.status("en.service"); st.Error != "" || st.Health != "healthy" {
			t.Errorf("step %d (%s): status %+v", i, s.what, st)
		}
		p := e.h.MainPID(t, "en.service")
		if i > 0 && p != pid {
			t.Errorf("step %d (%s): MainPID %d → %d: an enablement-only change restarted the unit", i, s.what, pid, p)
		}
		pid = p
	}
	if ufs := judgeStr(t, e, "en.service", "UnitFileState"); ufs != "static" && ufs != "disabled" {
		t.Errorf("without [Install]: UnitFileState %s", ufs)
	}
}

// 4. Adding or removing ExecReload= on a running service neither restarts
// nor blocks it.
func TestJudgeExecReloadAddedAndRemoved(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	marker := filepath.Join(e.h.Dir, "reloaded")
	v1 := "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n" + fast
	v2 := "[Service]\nType=exec\nExecStart=/bin/sleep 1000\nExecReload=/bin/sh -c 'echo reload >> " + marker + "'\n" + fast
	e.put("rl.service", v1)
	pid := e.h.MainPID(t, "rl.service")
	for i, v := range []struct{ what, content string }{{"add ExecReload", v2}, {"remove ExecReload", v1}} {
		start := time.Now()
		out, code := judgePut(e, true, "rl.service", v.content)
		t.Logf("%s: exit %d after %v", v.what, code, time.Since(start).Round(10*time.Millisecond))
		if code != 0 {
			t.Errorf("%s: put --wait exit %d, want 0\n%s", v.what, code, out)
		}
		s, _ := e.status("rl.service")
		if s.Error != "" || s.Action == "blocked" || s.Hash != reconcile.Hash([]byte(v.content)) {
			t.Errorf("%s: status %+v", v.what, s)
		}
		if p := e.h.MainPID(t, "rl.service"); p != pid {
			t.Errorf("%s: MainPID %d → %d", v.what, pid, p)
		}
		if st := e.h.ActiveState(t, "rl.service"); st != "active" {
			t.Errorf("%s: ActiveState %s", v.what, st)
		}
		b, _ := os.ReadFile(marker)
		t.Logf("after step %d ExecReload ran %d time(s)", i, strings.Count(string(b), "reload"))
	}
}

// 5. A failed push during the verification of the previous one is rolled
// back to the version that ran before it, unverified as it was.
func TestJudgeFailedPushRollsBackToUnverifiedPrevious(t *testing.T) {
	t.Parallel() // waits on HealthySec
	e := newEnv(t)
	e.startAgent()
	v1 := "[Service]\nType=exec\nEnvironment=V=1\nExecStart=/bin/sleep 1000\n[X-Agentd]\nHealthySec=0\n"
	v2 := "[Service]\nType=exec\nEnvironment=V=2\nExecStart=/bin/sleep 1000\n[X-Agentd]\nHealthySec=6\n"
	v3 := "[Service]\nType=exec\nEnvironment=V=3\nExecStart=/bin/false\n"
	e.put("q.service", v1)
	if out, code := judgePut(e, false, "q.service", v2); code != 0 {
		t.Fatalf("put v2: exit %d\n%s", code, out)
	}
	judgeWithin(t, 10*time.Second, "v2 running and verifying", func() bool {
		s, _ := e.status("q.service")
		pid := e.h.MainPID(t, "q.service")
		return s.Hash == reconcile.Hash([]byte(v2)) && s.Verifying && slices.Contains(judgeEnv(t, pid), "V=2")
	})
	start := time.Now()
	out, code := judgePut(e, true, "q.service", v3)
	t.Logf("put v3 --wait: exit %d after %v", code, time.Since(start).Round(10*time.Millisecond))
	if code != exitFailed {
		t.Errorf("put v3 --wait: exit %d, want %d\n%s", code, exitFailed, out)
	}
	var s reconcile.Status
	judgeWithin(t, 15*time.Second, "q.service runs v2 again, rolled back", func() bool {
		s, _ = e.status("q.service")
		pid := e.h.MainPID(t, "q.service")
		return e.h.ActiveState(t, "q.service") == "active" && slices.Contains(judgeEnv(t, pid), "V=2") && s.Action == "rolled-back"
	})
	if got, _ := e.readLocal("q.service"); got != v2 {
		t.Errorf("file on disk = %q, want v2", got)
	}
	if s.Hash != reconcile.Hash([]byte(v2)) {
		t.Errorf("status hash %s, want v2's", short(s.Hash))
	}
	t.Logf("status after the rollback: action=%s result=%s health=%s verifying=%v error=%s", s.Action, s.Result, s.Health, s.Verifying, s.Error)
	// v2 keeps running: no further restart once its HealthySec is over.
	pid := e.h.MainPID(t, "q.service")
	time.Sleep(7 * time.Second)
	if p := e.h.MainPID(t, "q.service"); p != pid || e.h.ActiveState(t, "q.service") != "active" {
		t.Errorf("q.service MainPID %d → %d, %s: v2 did not stay up after the rollback", pid, p, e.h.ActiveState(t, "q.service"))
	}
	s, _ = e.status("q.service")
	t.Logf("status 7s later: action=%s result=%s health=%s verifying=%v error=%s", s.Action, s.Result, s.Health, s.Verifying, s.Error)
}

// 6. A start that hangs blocks neither another unit's change, nor the
// debug API, nor its own removal.
func TestJudgeHungStartBlocksNothing(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	sock := e.agent.opts.debugSocket
	b1 := "[Service]\nType=exec\nExecStart=/bin/sleep 1001\n" + fast
	b2 := "[Service]\nType=exec\nExecStart=/bin/sleep 1002\n" + fast
	e.put("b.service", b1)
	bpid := e.h.MainPID(t, "b.service")
	a := "[Service]\nType=exec\nExecStartPre=/bin/sleep 300\nExecStart=/bin/sleep 1000\nTimeoutStartSec=infinity\n"
	if out, code := judgePut(e, false, "a.service", a); code != 0 {
		t.Fatalf("put a: exit %d\n%s", code, out)
	}
	judgeWithin(t, 10*time.Second, "a.service activating", func() bool { return e.h.ActiveState(t, "a.service") == "activating" })

	start := time.Now()
	out, code := judgePut(e, true, "b.service", b2)
	took := time.Since(start)
	t.Logf("put b.service --wait while a.service hangs: exit %d after %v", code, took.Round(10*time.Millisecond))
	if code != 0 {
		t.Errorf("put b: exit %d\n%s", code, out)
	}
	if took > 10*time.Second {
		t.Errorf("b.service's change took %v while a.service's start hung: blocked", took)
	}
	if p := e.h.MainPID(t, "b.service"); p == bpid || p == 0 {
		t.Errorf("b.service MainPID %d → %d: not restarted", bpid, p)
	}
	if st := e.h.ActiveState(t, "a.service"); st != "activating" {
		t.Errorf("a.service %s, want still activating", st)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	start = time.Now()
	out, code = e.cliCtx(ctx, "status", "--debug-socket", sock)
	cancel()
	took = time.Since(start)
	t.Logf("agentd status while a.service hangs: exit %d after %v", code, took.Round(time.Millisecond))
	if code != 0 || !strings.Contains(out, "a.service") || took > 5*time.Second {
		t.Errorf("agentd status: exit %d after %v\n%s", code, took, out)
	}

	start = time.Now()
	out, code = e.cli("unit", "rm", "a.service", "--host", e.host, "--wait", "--timeout", "30s")
	took = time.Since(start)
	t.Logf("rm a.service --wait: exit %d after %v", code, took.Round(10*time.Millisecond))
	if code != 0 {
		t.Errorf("rm a: exit %d\n%s", code, out)
	}
	if took > 10*time.Second {
		t.Errorf("removing the hung a.service took %v", took)
	}
	var there bool
	var ast string
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, there = e.readLocal("a.service")
		ast = e.h.ActiveState(t, "a.service")
		if !there && ast == "inactive" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if there || ast != "inactive" {
		t.Errorf("5s after the removal: a.service file present %v, ActiveState %s (SubState %s, Result %s, LoadState %s); want inactive and gone",
			there, ast, judgeStr(t, e, "a.service", "SubState"), judgeStr(t, e, "a.service", "Result"), judgeStr(t, e, "a.service", "LoadState"))
	}
	if st := e.h.ActiveState(t, "b.service"); st != "active" {
		t.Errorf("b.service %s at the end", st)
	}
}

// 7. A bad drop-in put and removed while a unit verifies: no rollback, no
// restart, and no garbled message.
func TestJudgeBadDropInDuringVerify(t *testing.T) {
	t.Parallel() // waits on HealthySec
	e := newEnv(t)
	logs := judgeStartAgent(e)
	events := filepath.Join(e.h.Dir, "events")
	v := "[Service]\nType=exec\n" + judgeHookLines(events) + "ExecStart=/bin/sleep 1000\n[X-Agentd]\nHealthySec=4\n"
	rec := judgeRecordStatus(e, "v.service")
	if out, code := judgePut(e, false, "v.service", v); code != 0 {
		t.Fatalf("put: exit %d\n%s", code, out)
	}
	judgeWithin(t, 10*time.Second, "v.service verifying", func() bool {
		s, _ := e.status("v.service")
		return s.Hash == reconcile.Hash([]byte(v)) && s.Verifying && e.h.ActiveState(t, "v.service") == "active"
	})
	pid := e.h.MainPID(t, "v.service")
	rawPut(t, e.endpoint, map[string]string{"/agentd/hosts/h1/units/v.service.d/bad.conf": "[Service]\nEnvironment=B=\x00\n"})
	judgeWithin(t, 10*time.Second, "the NUL byte reported in status", func() bool {
		s, _ := e.status("v.service")
		return strings.Contains(s.Error, "NUL")
	})
	if _, err := e.reg.Remove(context.Background(), registry.Target{Host: e.host}, []string{"v.service.d/bad.conf"}); err != nil {
		t.Fatal(err)
	}
	var s reconcile.Status
	judgeWithin(t, 20*time.Second, "v.service healthy with no error", func() bool {
		s, _ = e.status("v.service")
		return s.Health == "healthy" && s.Error == "" && !s.Verifying
	})
	time.Sleep(500 * time.Millisecond)
	rec.stop()
	sawDuringVerify := false
	for _, x := range rec.all() {
		sawDuringVerify = sawDuringVerify || x.Verifying && strings.Contains(x.Error, "NUL")
	}
	if !sawDuringVerify {
		t.Errorf("the bad drop-in was never reported while v.service was verifying: the test did not test what it means to")
	}
	for _, x := range rec.all() {
		t.Logf("seen: action=%s result=%s health=%s verifying=%v error=%q", x.Action, x.Result, x.Health, x.Verifying, x.Error)
		if x.Action == "rolled-back" || x.Action == "rolling-back" {
			t.Errorf("rollback seen: %+v", x)
		}
	}
	if p := e.h.MainPID(t, "v.service"); p != pid {
		t.Errorf("MainPID %d → %d", pid, p)
	}
	if h := strings.Join(judgeHooks(events), ","); h != "start" {
		t.Errorf("hooks %s, want one start and no stop", h)
	}
	if st := e.h.ActiveState(t, "v.service"); st != "active" {
		t.Errorf("ActiveState %s", st)
	}
	if _, err := os.Stat(filepath.Join(e.h.UnitDir, "v.service.d")); !os.IsNotExist(err) {
		t.Errorf("drop-in dir on disk: %v", err)
	}
	garbled := regexp.MustCompile(`became  |failed failed|\(\)`)
	for _, x := range rec.all() {
		if garbled.MatchString(x.Error) {
			t.Errorf("garbled status error %q", x.Error)
		}
	}
	for _, l := range strings.Split(logs.String(), "\n") {
		if garbled.MatchString(l) {
			t.Errorf("garbled log line: %s", l)
		}
	}
}

// 8. A crash loop under Restart=always is rolled back to the version before.
func TestJudgeCrashLoopIsRolledBack(t *testing.T) {
	t.Parallel() // waits on HealthySec
	e := newEnv(t)
	e.startAgent()
	v1 := "[Service]\nType=exec\nEnvironment=V=1\nExecStart=/bin/sleep 1000\n[X-Agentd]\nHealthySec=1\n"
	v2 := "[Service]\nType=exec\nEnvironment=V=2\nExecStart=/bin/sh -c 'sleep 0.3; exit 1'\nRestart=always\nRestartSec=200ms\n[X-Agentd]\nHealthySec=3\n"
	e.put("loop.service", v1)
	start := time.Now()
	out, code := judgePut(e, true, "loop.service", v2)
	t.Logf("put v2 --wait: exit %d after %v", code, time.Since(start).Round(10*time.Millisecond))
	if code != exitFailed {
		t.Errorf("exit %d, want %d\n%s", code, exitFailed, out)
	}
	if !regexp.MustCompile(`restarted itself|auto-restart|NRestarts`).MatchString(out) {
		t.Errorf("--wait output does not name the restarts:\n%s", out)
	}
	var pid uint32
	judgeWithin(t, 10*time.Second, "v1 runs again", func() bool {
		pid = e.h.MainPID(t, "loop.service")
		return e.h.ActiveState(t, "loop.service") == "active" && slices.Contains(judgeEnv(t, pid), "V=1")
	})
	if cmd := strings.Join(judgeProc(t, pid, "cmdline"), " "); cmd != "/bin/sleep 1000" {
		t.Errorf("main process runs %q, want v1's /bin/sleep 1000", cmd)
	}
	if got, _ := e.readLocal("loop.service"); got != v1 {
		t.Errorf("file on disk %q, want v1", got)
	}
	time.Sleep(1500 * time.Millisecond) // v1 stays up, no further restarts
	if p := e.h.MainPID(t, "loop.service"); p != pid {
		t.Errorf("MainPID %d → %d after the rollback", pid, p)
	}
	if s, _ := e.status("loop.service"); s.Action != "rolled-back" || s.Hash != reconcile.Hash([]byte(v1)) {
		t.Errorf("status %+v", s)
	}
}

// 9. The deny-list: the CLI refuses reserved names; the same keys written
// raw are errors in status, while a good unit beside them converges.
func TestJudgeDenyList(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	denied := []string{"dbus.service", "systemd-foo.service", "agentd.service.d/x.conf"}
	for _, name := range denied {
		content := "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"
		if strings.HasSuffix(name, ".conf") {
			content = "[Service]\nEnvironment=X=1\n"
		}
		out, code := judgePut(e, false, name, content)
		unit, _, _ := strings.Cut(name, ".d/")
		if code == 0 || !strings.Contains(out, "reserved") || !strings.Contains(out, unit) {
			t.Errorf("unit put %s: exit %d, want non-zero saying it is reserved\n%s", name, code, out)
		}
		if strings.Count(strings.TrimSpace(out), "\n") > 1 {
			t.Errorf("unit put %s: error is not one line:\n%s", name, out)
		}
	}
	if out, _ := e.cli("unit", "ls"); strings.Contains(out, "dbus") || strings.Contains(out, "systemd-foo") || strings.Contains(out, "agentd.service") {
		t.Errorf("a refused put reached the registry:\n%s", out)
	}

	dbusPID := e.h.MainPID(t, "dbus.service")
	p := "/agentd/hosts/h1/units/"
	good := "[Service]\nType=exec\nExecStart=/bin/sleep 1003\n" + fast
	rawPut(t, e.endpoint, map[string]string{
		p + "dbus.service":            "[Service]\nType=exec\nExecStart=/bin/false\n",
		p + "systemd-foo.service":     "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n",
		p + "agentd.service.d/x.conf": "[Service]\nEnvironment=X=1\n",
		p + "good.service":            good,
	})
	judgeWithin(t, 10*time.Second, "good.service converged and every reserved key reported", func() bool {
		st, err := e.reg.Statuses(context.Background(), e.host)
		if err != nil {
			return false
		}
		if s, ok := st["good.service"]; !ok || s.Hash != reconcile.Hash([]byte(good)) || s.Health != "healthy" {
			return false
		}
		for _, k := range denied {
			if s, ok := st[reconcile.StatusName(k)]; !ok || s.Error == "" {
				return false
			}
		}
		return true
	})
	st, _ := e.reg.Statuses(context.Background(), e.host)
	for _, k := range denied {
		s := st[reconcile.StatusName(k)]
		t.Logf("status %s: action=%s error=%s", reconcile.StatusName(k), s.Action, s.Error)
		if !strings.Contains(s.Error, "reserved") {
			t.Errorf("%s: status error %q does not say reserved", k, s.Error)
		}
	}
	if ast := e.h.ActiveState(t, "good.service"); ast != "active" {
		t.Errorf("good.service %s", ast)
	}
	entries, _ := os.ReadDir(e.h.UnitDir)
	var names []string
	for _, en := range entries {
		names = append(names, en.Name())
	}
	if strings.Join(names, ",") != "good.service" {
		t.Errorf("unit dir holds %v, want only good.service", names)
	}
	if p := e.h.MainPID(t, "dbus.service"); p != dbusPID {
		t.Errorf("the bus's MainPID %d → %d", dbusPID, p)
	}
	out, code := e.cli("status", "--debug-socket", e.agent.opts.debugSocket)
	if code != 0 || !strings.Contains(out, "dbus.service") || !strings.Contains(out, "reserved") {
		t.Errorf("agentd status does not show the reserved key as an error: exit %d\n%s", code, out)
	}
}
