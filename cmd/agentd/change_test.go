package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Issue 3: each change reaches the running unit with the least disruption
// that is correct. Every test here is against a real systemd.

// A change with no effect (comment, Description, [X-Agentd]) is only a
// daemon-reload: same main PID.
func TestCosmeticChangeKeepsMainPID(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)
	pid := e.h.MainPID(t, "hello.service")
	reloads := e.h.CountReloads(t)
	v := "# edited\n" + strings.Replace(helloV1, "Description=hello", "Description=hello, documented", 1)
	e.put("hello.service", v)
	if got, _ := e.readLocal("hello.service"); got != v {
		t.Fatal("file not replaced")
	}
	if p := e.h.MainPID(t, "hello.service"); p != pid {
		t.Fatalf("MainPID %d → %d: restarted for a cosmetic change", pid, p)
	}
	if n := reloads(); n != 1 {
		t.Fatalf("reloads = %d, want 1", n)
	}
	if s, _ := e.status("hello.service"); s.Action != "update" {
		t.Fatalf("action = %s, want update", s.Action)
	}
}

// Only ExecReload= changed: ExecReload runs, the main PID stays.
func TestExecReloadChangeReloads(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	marker := filepath.Join(e.h.Dir, "reloaded")
	unit := func(tag string) string {
		return fmt.Sprintf("[Service]\nType=exec\nExecStart=/bin/sleep 1000\nExecReload=/bin/sh -c 'echo %s >> %s'\n%s", tag, marker, fast)
	}
	e.put("web.service", unit("v1"))
	pid := e.h.MainPID(t, "web.service")
	e.put("web.service", unit("v2"))
	b, _ := os.ReadFile(marker)
	if strings.TrimSpace(string(b)) != "v2" {
		t.Fatalf("ExecReload output %q, want the new ExecReload (v2) to have run once", b)
	}
	if p := e.h.MainPID(t, "web.service"); p != pid {
		t.Fatalf("MainPID %d → %d: restarted instead of reloaded", pid, p)
	}
	if s, _ := e.status("web.service"); s.Action != "reload" {
		t.Fatalf("action = %s", s.Action)
	}
}

// OnChange=stop-start stops the unit with its OLD definition (the old
// ExecStop runs) before the new file is written.
func TestStopStartRunsOldExecStop(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	marker := filepath.Join(e.h.Dir, "stopped")
	unit := func(tag string) string {
		return fmt.Sprintf("[Service]\nType=exec\nExecStart=/bin/sleep 1000\nExecStop=/bin/sh -c 'echo %s >> %s'\n[X-Agentd]\nOnChange=stop-start\nHealthySec=0\n", tag, marker)
	}
	e.put("db.service", unit("old"))
	pid := e.h.MainPID(t, "db.service")
	e.put("db.service", unit("new"))
	b, _ := os.ReadFile(marker)
	if strings.TrimSpace(string(b)) != "old" {
		t.Fatalf("ExecStop output %q, want the OLD ExecStop to have run", b)
	}
	if p := e.h.MainPID(t, "db.service"); p == pid || p == 0 {
		t.Fatalf("MainPID %d → %d", pid, p)
	}
	if s, _ := e.status("db.service"); s.Action != "stop-start" || s.ActiveState != "active" {
		t.Fatalf("status = %+v", s)
	}
}

// OnChange=reload on a unit that cannot reload is an error in status, not
// a silent restart; OnChange=none leaves the unit running and reports the
// pending restart.
func TestOnChangeReloadWithoutExecReloadAndNone(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	r1 := "[Service]\nType=exec\nExecStart=/bin/sleep 1001\n[X-Agentd]\nOnChange=reload\nHealthySec=0\n"
	e.put("r.service", r1)
	pid := e.h.MainPID(t, "r.service")
	out, code := e.cli("unit", "put", e.writeUnit("r.service", strings.Replace(r1, "1001", "1002", 1)), "--host", e.host, "--wait", "--timeout", "30s")
	if code != exitFailed || !strings.Contains(out, "cannot reload") {
		t.Fatalf("exit %d, want %d with 'cannot reload'\n%s", code, exitFailed, out)
	}
	if p := e.h.MainPID(t, "r.service"); p != pid {
		t.Fatal("restarted silently")
	}

	n1 := "[Service]\nType=exec\nExecStart=/bin/sleep 1001\n[X-Agentd]\nOnChange=none\nHealthySec=0\n"
	e.put("n.service", n1)
	pid = e.h.MainPID(t, "n.service")
	if _, code := e.cli("unit", "put", e.writeUnit("n.service", strings.Replace(n1, "1001", "1002", 1)), "--host", e.host); code != 0 {
		t.Fatal("put failed")
	}
	eventually(t, "pendingRestart in status", func() bool {
		s, _ := e.status("n.service")
		return s.PendingRestart && s.Hash == s.DesiredHash
	})
	if p := e.h.MainPID(t, "n.service"); p != pid {
		t.Fatal("OnChange=none restarted the unit")
	}
}

// A template change restarts its instances ONE AT A TIME, each active for
// HealthySec before the next: never two down at once. Start and stop times
// come from the units themselves (ExecStartPre/ExecStopPost), not the agent.
func TestTemplateInstancesRollOneAtATime(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	e := newEnv(t)
	e.startAgent()
	events := filepath.Join(e.h.Dir, "events")
	tmpl := func(v string) string {
		return fmt.Sprintf("[Service]\nType=exec\nEnvironment=V=%s\n"+
			"ExecStartPre=/bin/sh -c 'echo \"start %%i $(date +%%%%s.%%%%N)\" >> %s'\n"+
			"ExecStart=/bin/sleep 1000\n"+
			"ExecStopPost=/bin/sh -c 'echo \"stop %%i $(date +%%%%s.%%%%N)\" >> %s'\n"+
			"[X-Agentd]\nHealthySec=1\n", v, events, events)
	}
	args := []string{"unit", "put", e.writeUnit("app@.service", tmpl("1")), "--instance", "app@1.service", "--instance", "app@2.service", "--instance", "app@3.service",
		"--host", e.host, "--wait", "--timeout", "60s"}
	if out, code := e.cli(args...); code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	pids := map[int]uint32{}
	for i := 1; i <= 3; i++ {
		pids[i] = e.h.MainPID(t, fmt.Sprintf("app@%d.service", i))
	}
	os.Remove(events)
	start := time.Now()
	if out, code := e.cli("unit", "put", e.writeUnit("app@.service", tmpl("2")), "--host", e.host, "--wait", "--timeout", "60s"); code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	// --wait on the template returns once the file is in place; the roll goes on.
	eventually(t, "all three instances restarted", func() bool {
		for i := 1; i <= 3; i++ {
			p := e.h.MainPID(t, fmt.Sprintf("app@%d.service", i))
			if p == pids[i] || p == 0 {
				return false
			}
		}
		return true
	})
	t.Logf("rolling update of 3 instances with HealthySec=1 took %v", time.Since(start).Round(10*time.Millisecond))
	b, _ := os.ReadFile(events)
	type ev struct {
		at   float64
		stop bool
		inst string
	}
	var evs []ev
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		at, _ := strconv.ParseFloat(f[2], 64)
		evs = append(evs, ev{at, f[0] == "stop", f[1]})
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	down, maxDown := 0, 0
	var order []string
	for _, x := range evs {
		if x.stop {
			down++
			order = append(order, x.inst)
		} else {
			down--
		}
		maxDown = max(maxDown, down)
	}
	t.Logf("events: %s", strings.ReplaceAll(string(b), "\n", "; "))
	if len(order) != 3 {
		t.Fatalf("saw %d stops, want 3: %s", len(order), b)
	}
	if maxDown != 1 {
		t.Fatalf("%d instances were down at once, want at most 1", maxDown)
	}
	// Each restart waited for the previous instance's HealthySec.
	var startsAt []float64
	for _, x := range evs {
		if !x.stop {
			startsAt = append(startsAt, x.at)
		}
	}
	for i := 1; i < len(startsAt); i++ {
		if gap := startsAt[i] - startsAt[i-1]; gap < 0.9 {
			t.Fatalf("instance restarted %.2fs after the previous one, before HealthySec=1 passed", gap)
		}
	}
}

// A change that dies within HealthySec is rolled back: the previous file is
// restored, the unit runs again, status says rolled-back with the reason,
// --wait exits non-zero, and the failed content is not retried.
func TestUnhealthyChangeIsRolledBack(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	e := newEnv(t)
	e.startAgent()
	good := "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n[X-Agentd]\nHealthySec=1\n"
	e.put("app.service", good)
	bad := "[Service]\nType=exec\nExecStart=/bin/sh -c 'sleep 0.2; exit 7'\n[X-Agentd]\nHealthySec=2\n"
	out, code := e.cli("unit", "put", e.writeUnit("app.service", bad), "--host", e.host, "--wait", "--timeout", "30s")
	if code != exitFailed {
		t.Fatalf("exit %d, want %d\n%s", code, exitFailed, out)
	}
	if !strings.Contains(out, "rolled back") || !strings.Contains(out, "exit status 7") {
		t.Fatalf("--wait does not print the host's reason:\n%s", out)
	}
	if got, _ := e.readLocal("app.service"); got != good {
		t.Fatalf("file not restored: %q", got)
	}
	eventually(t, "the old version runs again", func() bool { return e.h.ActiveState(t, "app.service") == "active" })
	s, _ := e.status("app.service")
	if s.Action != "rolled-back" || !strings.Contains(s.Error, "exit status 7") {
		t.Fatalf("status = %+v", s)
	}
	pid := e.h.MainPID(t, "app.service")
	if _, err := e.agent.agent.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p := e.h.MainPID(t, "app.service"); p != pid {
		t.Fatal("the failed content was retried")
	}
	// New content resumes.
	e.put("app.service", strings.Replace(good, "1000", "1001", 1))
}

// A change whose start job fails is rolled back at once.
func TestFailedJobIsRolledBack(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	good := "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n[X-Agentd]\nHealthySec=0\n"
	e.put("app.service", good)
	out, code := e.cli("unit", "put", e.writeUnit("app.service", "[Service]\nType=exec\nExecStart=/nonexistent\n"), "--host", e.host, "--wait", "--timeout", "30s")
	if code != exitFailed || !strings.Contains(out, "rolled back") {
		t.Fatalf("exit %d\n%s", code, out)
	}
	if got, _ := e.readLocal("app.service"); got != good {
		t.Fatalf("file not restored: %q", got)
	}
	if st := e.h.ActiveState(t, "app.service"); st != "active" {
		t.Fatalf("old version not running: %s", st)
	}
}

// `agentd sync --dry-run --json` prints the plan from the same planning code
// and changes nothing.
func TestSyncDryRun(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)
	// An unmanaged file blocks a unit: the plan shows it, and nothing changes.
	if err := os.WriteFile(filepath.Join(e.h.UnitDir, "other.service"), []byte("[Service]\nExecStart=/bin/true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, code := e.cli("unit", "put", e.writeUnit("other.service", helloV2), "--host", e.host); code != 0 {
		t.Fatal("put")
	}
	sock := e.agent.opts.debugSocket
	var plan struct {
		DryRun bool
		Plan   []struct{ Unit, Action, Reason, Error string }
	}
	eventually(t, "the dry-run plan shows the blocked unit", func() bool {
		out, code := e.cli("sync", "--dry-run", "--json", "--debug-socket", sock)
		return code == 0 && json.Unmarshal([]byte(out), &plan) == nil && len(plan.Plan) == 1
	})
	if !plan.DryRun || plan.Plan[0].Unit != "other.service" || plan.Plan[0].Action != "blocked" || !strings.Contains(plan.Plan[0].Error, "unmanaged") {
		t.Fatalf("plan = %+v", plan)
	}
	if out, code := e.cli("sync", "--dry-run", "--debug-socket", sock); code != 0 || !strings.Contains(out, "other.service") {
		t.Fatalf("text plan: %s", out)
	}
	if got, _ := e.readLocal("other.service"); got != "[Service]\nExecStart=/bin/true\n" {
		t.Fatal("dry-run changed a file")
	}
}

// Drop-ins are written, replaced and removed like unit files, take part in
// the classification, and `agentd diff` shows registry vs disk.
func TestDropInsAndDiff(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)
	pid := e.h.MainPID(t, "hello.service")
	dropIn := e.writeUnit("hello.service.d/env.conf", "[Service]\nEnvironment=GREETING=hi\n")
	if out, code := e.cli("unit", "put", dropIn, "--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("put drop-in: exit %d\n%s", code, out)
	}
	if got, _ := e.readLocal("hello.service.d/env.conf"); got != "[Service]\nEnvironment=GREETING=hi\n" {
		t.Fatalf("drop-in on disk: %q", got)
	}
	pid2 := e.h.MainPID(t, "hello.service")
	if pid2 == pid {
		t.Fatal("an Environment= drop-in did not restart the unit")
	}
	// A comment-only edit of the drop-in is a daemon-reload only.
	if out, code := e.cli("unit", "put", e.writeUnit("hello.service.d/env.conf", "# why\n[Service]\nEnvironment=GREETING=hi\n"), "--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	if p := e.h.MainPID(t, "hello.service"); p != pid2 {
		t.Fatal("comment-only drop-in change restarted the unit")
	}
	out, code := e.cli("diff", "hello.service", "--debug-socket", e.agent.opts.debugSocket)
	if code != 0 || out != "" {
		t.Fatalf("diff of a converged unit: exit %d, %q", code, out)
	}
	// Removing the drop-in removes the file (and its directory) and restarts.
	if out, code := e.cli("unit", "rm", "hello.service.d/env.conf", "--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("rm drop-in: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(e.h.UnitDir, "hello.service.d")); !os.IsNotExist(err) {
		t.Fatalf("drop-in directory left: %v", err)
	}
	eventually(t, "restart after the drop-in went", func() bool { return e.h.MainPID(t, "hello.service") != pid2 })
}

// `agentd diff` prints a unified diff between the registry and the disk for
// a unit the agent cannot converge (here: a file it does not own).
func TestDiffShowsRegistryAgainstDisk(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	if err := os.WriteFile(filepath.Join(e.h.UnitDir, "x.service"), []byte(helloV1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, code := e.cli("unit", "put", e.writeUnit("x.service", helloV2), "--host", e.host); code != 0 {
		t.Fatal("put")
	}
	var out string
	eventually(t, "diff shows the change", func() bool {
		var code int
		out, code = e.cli("diff", "x.service", "--debug-socket", e.agent.opts.debugSocket)
		return code == 0 && strings.Contains(out, "-ExecStart=/bin/sleep 1002") && strings.Contains(out, "+ExecStart=/bin/sleep 1001")
	})
	if !strings.HasPrefix(out, "--- registry/x.service\n+++ local/x.service\n@@") {
		t.Fatalf("not a unified diff:\n%s", out)
	}
}

// A managed file edited or deleted by hand is put back within a second
// (fsnotify), with the drift logged, and without restarting the unit when
// the content is the same as what runs.
func TestDriftIsRestored(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)
	pid := e.h.MainPID(t, "hello.service")
	path := filepath.Join(e.h.UnitDir, "hello.service")
	edited := time.Now()
	if err := os.WriteFile(path, []byte("[Service]\nExecStart=/bin/false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the edit is undone", func() bool {
		got, _ := e.readLocal("hello.service")
		return got == helloV1
	})
	t.Logf("hand edit undone after %v", time.Since(edited).Round(time.Millisecond))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted file is back", func() bool {
		got, _ := e.readLocal("hello.service")
		return got == helloV1
	})
	if p := e.h.MainPID(t, "hello.service"); p != pid {
		t.Fatalf("MainPID %d → %d: restoring the same content restarted the unit", pid, p)
	}
}

// A socket and its service changed in one put: the socket's restart stops
// the service first and then listens on the new address, and only then is
// the service restarted into its new version. Run side by side, the two
// jobs raced: the socket's start was refused ("service already active")
// or its stop killed the service's new version, and one was rolled back.
func TestSocketAndServiceChangedTogether(t *testing.T) {
	t.Parallel() // waits on jobs, not the CPU
	e := newEnv(t)
	e.startAgent()
	put := func(v string) {
		t.Helper()
		sock := e.writeUnit("pair.socket", "[Socket]\nListenStream=%t/pair-"+v+".sock\n"+fast)
		svc := e.writeUnit("pair.service", "[Service]\nExecStart=/bin/sleep 1000\nEnvironment=V="+v+"\n"+fast)
		if out, code := e.cli("unit", "put", sock, svc, "--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
			t.Fatalf("put v%s: exit %d\n%s", v, code, out)
		}
	}
	put("1")
	put("2")
	if s := e.h.ActiveState(t, "pair.socket"); s != "active" {
		t.Errorf("pair.socket is %s, want active", s)
	}
	if _, err := os.Stat(filepath.Join(e.h.Dir, "run", "pair-2.sock")); err != nil {
		t.Errorf("the socket does not listen at its new address: %v", err)
	}
	if pid := e.h.MainPID(t, "pair.service"); !environHas(pid, "V=2") {
		t.Errorf("pair.service (MainPID %d) does not run version 2", pid)
	}
}

// `unit rm --wait` with the host's agent down: its statuses went with its
// lease, and a missing status is no proof of removal. The wait says so and
// times out (exit 4) while the unit still runs (before: exit 0,
// "removed"); once the agent is back it removes the unit.
func TestRmWaitWithTheAgentDown(t *testing.T) {
	t.Parallel() // waits on the agent, not the CPU
	e := newEnv(t)
	a := e.startAgent()
	u := e.writeUnit("gone.service", "[Service]\nExecStart=/bin/sleep 1000\n"+fast)
	if out, code := e.cli("unit", "put", u, "--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("put: exit %d\n%s", code, out)
	}
	a.stop(t)
	out, code := e.cli("unit", "rm", "gone.service", "--host", e.host, "--wait", "--timeout", "2s")
	if code != exitTimeout || !strings.Contains(out, "no live agent") {
		t.Errorf("rm --wait with the agent down: exit %d, want %d saying no live agent\n%s", code, exitTimeout, out)
	}
	if s := e.h.ActiveState(t, "gone.service"); s != "active" {
		t.Errorf("gone.service is %s with no agent to stop it", s)
	}
	e.startAgent()
	eventually(t, "gone.service stopped by the agent once it is back", func() bool {
		return e.h.ActiveState(t, "gone.service") != "active"
	})
}
