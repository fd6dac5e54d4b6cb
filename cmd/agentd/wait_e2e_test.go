package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// The answer of --wait is the host's truth: it counts a host's statuses
// only once that host has acted on the write's revision (its pass record),
// it says at once when another write took the place of its own, and it
// does not forget a group member whose agent is down.

// rm --wait issued while the host's agent restarts (after SIGTERM or
// SIGKILL): the new agent is live but has published nothing yet — it is
// held, by --test-pause-at, in the middle of its first pass, after the
// file's removal and before the daemon-reload. rm --wait must not answer
// then (it said "removed" as soon as the new agent had joined); it answers
// once a pass that acted on the removal is published, and at that moment
// systemd has no such unit running and the file is gone.
func TestRmWaitAcrossAnAgentRestart(t *testing.T) {
	t.Parallel() // waits on agents, not the CPU
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			h := systemdtest.Start(t)
			etcd := registrytest.StartEtcd(t)
			e := &env{t: t, h: h, endpoint: etcd.Endpoint(), reg: registrytest.NewClient(t, etcd.Endpoint()), host: "h1"}
			a1 := startCrashAgent(t, h, e.endpoint, "h1")
			u := e.writeUnit("gone.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"+fast)
			if out, code := e.cli("unit", "put", u, "--host", "h1", "--wait", "--timeout", "30s"); code != 0 {
				t.Fatalf("put: exit %d\n%s", code, out)
			}
			pid := h.MainPID(t, "gone.service")
			a1.cmd.Process.Signal(sig)
			<-a1.done

			type answer struct {
				out  string
				code int
				at   time.Time
			}
			done := make(chan answer, 1)
			go func() {
				out, code := e.cli("unit", "rm", "gone.service", "--host", "h1", "--wait", "--timeout", "60s")
				done <- answer{out, code, time.Now()}
			}()
			// The new agent joins, sees the removal, removes the file and
			// stops there: nothing of this pass is published.
			a2 := startCrashAgent(t, h, e.endpoint, "h1", "--test-pause-at", "files-written")
			paused := filepath.Join(h.StateDir, "paused-at-files-written")
			waitFor(t, a2, 30*time.Second, "the new agent holds its first pass after removing the file", func() bool {
				_, err := os.Stat(paused)
				return err == nil
			})
			select {
			case a := <-done:
				t.Fatalf("rm --wait answered (exit %d) while the new agent had published nothing; gone.service is %s, MainPID %d\n%s",
					a.code, h.ActiveState(t, "gone.service"), h.MainPID(t, "gone.service"), a.out)
			case <-time.After(1500 * time.Millisecond):
			}
			t.Logf("while the pass is held: gone.service %s, MainPID %d (was %d); no answer from rm --wait",
				h.ActiveState(t, "gone.service"), h.MainPID(t, "gone.service"), pid)
			a2.kill()
			os.Remove(paused)
			startCrashAgent(t, h, e.endpoint, "h1")
			var a answer
			select {
			case a = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("rm --wait did not answer after a pass removed the unit")
			}
			// systemd's view at the moment it answered.
			state, mainPID := h.ActiveState(t, "gone.service"), h.MainPID(t, "gone.service")
			_, onDisk := e.readLocal("gone.service")
			if a.code != 0 || !strings.Contains(a.out, "removed") {
				t.Fatalf("rm --wait: exit %d, want 0 saying removed\n%s", a.code, a.out)
			}
			if state == "active" || mainPID != 0 || onDisk {
				t.Fatalf("rm --wait said removed, but gone.service is %s (MainPID %d), file on disk: %v", state, mainPID, onDisk)
			}
		})
	}
}

// Two put --wait race on one unit with different content: the one whose
// write was overwritten says so at once ("superseded", exit 5) instead of
// waiting out its --timeout; the other runs, and history shows both.
func TestRacingPutsOneIsSuperseded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startAgent()
	a := e.writeUnit("a/race.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1001\n"+fast)
	b := e.writeUnit("b/race.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1002\n"+fast)
	type result struct {
		out  string
		code int
		took time.Duration
	}
	res := make([]result, 2)
	var wg sync.WaitGroup
	start := time.Now()
	for i, f := range []string{a, b} {
		wg.Go(func() {
			out, code := e.cli("unit", "put", f, "--host", e.host, "--wait", "--timeout", "60s")
			res[i] = result{out, code, time.Since(start)}
		})
	}
	wg.Wait()
	won, lost := res[0], res[1]
	if won.code != 0 {
		won, lost = lost, won
	}
	if won.code != 0 || lost.code != exitSuperseded {
		t.Fatalf("racing puts: exits %d and %d, want 0 and %d\n%s\n%s", res[0].code, res[1].code, exitSuperseded, res[0].out, res[1].out)
	}
	if !strings.Contains(lost.out, "superseded by revision") || lost.took > 30*time.Second {
		t.Fatalf("the overwritten put: after %s\n%s", lost.took, lost.out)
	}
	// The winner's content is what systemd runs.
	want := "1001"
	if res[1].code == 0 {
		want = "1002"
	}
	if cmd := cmdline(t, e.h, "race.service"); !strings.Contains(cmd, want) {
		t.Errorf("race.service runs %q, want the winner's sleep %s", cmd, want)
	}
	out, code := e.cli("unit", "history", "race.service", "--host", e.host)
	if code != 0 || strings.Count(out, "\n") < 3 {
		t.Errorf("history does not show both writes: exit %d\n%s", code, out)
	}
}

// A group member whose agent is down is not forgotten: a group --wait
// names it and does not exit 0 (exit 4 at --timeout); with
// --skip-unreachable it names it and exits 6 once the others converged;
// `hosts` shows it down; once forgotten, it is no longer waited for.
func TestGroupWaitCountsAMemberWhoseAgentIsDown(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2, "")
	f.put(f.unit("/bin/sleep 1001", "HealthySec=0"), 0)
	h2 := f.hosts[1]
	h2.agent.stop(t)
	pid2 := h2.h.MainPID(t, "app.service")

	out := f.put(f.unit("/bin/sleep 1002", "HealthySec=0"), exitTimeout, "--timeout", "4s")
	if !strings.Contains(out, "h2 app.service (no live agent") || !strings.Contains(out, "last seen") {
		t.Errorf("the group wait does not name h2 as without a live agent:\n%s", out)
	}
	if cmd := cmdline(t, f.hosts[0].h, "app.service"); !strings.Contains(cmd, "1002") {
		t.Errorf("h1 runs %q, want the new version", cmd)
	}
	if p := h2.h.MainPID(t, "app.service"); p != pid2 {
		t.Errorf("h2's app.service changed (MainPID %d → %d) with no agent", pid2, p)
	}

	out = f.put(f.unit("/bin/sleep 1003", "HealthySec=0"), exitSkipped, "--skip-unreachable")
	if !strings.Contains(out, "skipped") || !strings.Contains(out, "h2 app.service (no live agent") {
		t.Errorf("--skip-unreachable does not name h2:\n%s", out)
	}
	e := f.hosts[0]
	if out, code := e.cli("hosts"); code != 0 || !regexpLine(out, `h2\s+down, last seen`) || !regexpLine(out, `h1\s+live`) {
		t.Errorf("hosts does not show h2 down and h1 live: exit %d\n%s", code, out)
	}
	if out, code := e.cli("hosts", "forget", "h1"); code == 0 || !strings.Contains(out, "live agent") {
		t.Errorf("forget of a live host: exit %d\n%s", code, out)
	}
	if out, code := e.cli("hosts", "forget", "h2"); code != 0 {
		t.Fatalf("forget h2: exit %d\n%s", code, out)
	}
	f.put(f.unit("/bin/sleep 1004", "HealthySec=0"), 0, "--timeout", "30s")

	// Members are recorded apart from leases.
	known, err := f.reg.KnownHosts(context.Background())
	if err != nil || len(known) != 1 || known[0].Host != "h1" || !known[0].Live {
		t.Errorf("known hosts after forgetting h2: %+v, %v", known, err)
	}
}

func regexpLine(out, pattern string) bool {
	return regexp.MustCompile(`(?m)^` + pattern).MatchString(out)
}

// cmdline is the command line of unit's main process, by systemd's MainPID.
func cmdline(t *testing.T, h *systemdtest.Harness, unit string) string {
	t.Helper()
	return strings.Join(judgeProc(t, h.MainPID(t, unit), "cmdline"), " ")
}

// An agent from before pass records (its membership says nothing of
// them) never publishes one: its answers are judged by its statuses
// alone, as before, so a new CLI still waits for old agents.
func TestWaitJudgesAnAgentWithoutPassRecordsByItsStatuses(t *testing.T) {
	t.Parallel()
	g := newGarbageEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	lease, err := g.raw.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.raw.Put(ctx, "/agentd/agents/old", `{"host":"old","machineID":"m-old","groups":["all"],"version":"v0"}`, clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	content := "[Service]\nExecStart=/bin/true\n"
	file := filepath.Join(t.TempDir(), "hello.service")
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	agent := make(chan error, 1)
	go func() { // the old agent: a status once the unit is stored, no pass record
		for {
			if _, err := g.reg.Get(ctx, registry.Target{Host: "old"}, "hello.service"); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				agent <- ctx.Err()
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		h := reconcile.Hash([]byte(content))
		st, _ := json.Marshal(reconcile.Status{Unit: "hello.service", Hash: h, DesiredHash: h, ActiveState: "active", SubState: "running", Health: "healthy"})
		_, err := g.raw.Put(ctx, "/agentd/status/old/hello.service", string(st), clientv3.WithLease(lease.ID))
		agent <- err
	}()
	out, _, code := g.run(t, "unit", "put", file, "--host", "old", "--wait", "--timeout", "20s")
	if err := <-agent; err != nil {
		t.Fatalf("stand-in agent: %v", err)
	}
	if code != 0 || !strings.Contains(out, "healthy") {
		t.Fatalf("put --wait on an agent without pass records: exit %d, want 0\n%s", code, out)
	}
}

// rm --wait of a unit whose drop-in stays under another target (the
// group's): the host removes the file and makes no job, and the wait says
// removed once it has (it kept waiting on the status the drop-in keeps,
// and exited 4 — seen in the operator trial).
func TestRmWaitWithAnotherTargetsDropInLeft(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startAgent()
	e.put("dd2.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"+fast)
	if out, code := e.cli("unit", "put", e.writeUnit("dd2.service.d/y.conf", "[Service]\nEnvironment=Y=1\n"), "--group", "all", "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("put the group's drop-in: exit %d\n%s", code, out)
	}
	out, code := e.cli("unit", "rm", "dd2.service", "--host", e.host, "--wait", "--timeout", "30s")
	state := e.h.ActiveState(t, "dd2.service")
	_, onDisk := e.readLocal("dd2.service")
	if code != 0 || !strings.Contains(out, "removed") {
		t.Fatalf("rm --wait: exit %d, want 0 saying removed\n%s", code, out)
	}
	if state == "active" || onDisk {
		t.Fatalf("rm --wait said removed, but dd2.service is %s, file on disk: %v", state, onDisk)
	}
}
