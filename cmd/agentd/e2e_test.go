package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/systemd"
)

// helloV1 and helloV2 differ in ExecStart, so a change must restart.
const (
	helloV1 = "[Unit]\nDescription=hello\n[Service]\nType=exec\nExecStart=/bin/sleep 1001\n" + fast
	helloV2 = "[Unit]\nDescription=hello\n[Service]\nType=exec\nExecStart=/bin/sleep 1002\n" + fast
	// fast skips the HealthySec window (default 5 s) where a test is not about it.
	fast = "[X-Agentd]\nHealthySec=0\n"
)

// env is one host under test: a private systemd, an etcd, and the agent
// running in-process with exactly the code `agentd run` runs.
type env struct {
	t        testing.TB
	quiet    bool // log warnings only (benchmarks)
	h        *systemdtest.Harness
	endpoint string
	reg      *registry.Client
	host     string
	groups   []string // default ["all"]
	agent    *testAgent
}

type testAgent struct {
	opts   *runOptions
	cancel context.CancelFunc
	done   chan error
	agent  *reconcile.Agent
}

func newEnv(t testing.TB) *env {
	t.Helper()
	h := systemdtest.Start(t)
	e := registrytest.StartEtcd(t)
	return &env{t: t, h: h, endpoint: e.Endpoint(), reg: registrytest.NewClient(t, e.Endpoint()), host: "h1"}
}

func (e *env) startAgent() *testAgent {
	e.t.Helper()
	return e.startAgentOn([]string{e.endpoint}, nil)
}

// startAgentOn starts e's agent in-process, with exactly the code `agentd
// run` runs, on every one of endpoints and with edit (if any) applied to
// its options (credentials, lease TTL, log output).
func (e *env) startAgentOn(endpoints []string, edit func(o *runOptions)) *testAgent {
	e.t.Helper()
	groups := e.groups
	if groups == nil {
		groups = []string{"all"}
	}
	o := &runOptions{
		host: e.host, groups: groups,
		unitDir: e.h.UnitDir, stateDir: e.h.StateDir, debugSocket: filepath.Join(e.h.Dir, "agentd.sock"),
		logLevel: "debug", leaseTTL: 5 * time.Second,
		dialSystemd: e.agentDialer(),
		logOut:      e.t.Output(),
	}
	if e.quiet && os.Getenv("AGENTD_BENCH_DEBUG") == "" {
		o.logLevel = "warn"
	}
	o.etcd.endpoints = endpoints
	o.etcd.prefix = registry.DefaultPrefix
	o.etcd.timeout = 5 * time.Second
	if edit != nil {
		edit(o)
	}
	ready := make(chan *reconcile.Agent, 1)
	o.ready = ready
	ctx, cancel := context.WithCancel(context.Background())
	ta := &testAgent{opts: o, cancel: cancel, done: make(chan error, 1)}
	go func() { ta.done <- runAgent(ctx, o) }()
	select {
	case ta.agent = <-ready:
	case err := <-ta.done:
		e.t.Fatalf("agent exited at start: %v", err)
	case <-time.After(20 * time.Second):
		e.t.Fatal("agent did not start in 20s")
	}
	e.agent = ta
	e.t.Cleanup(func() { ta.stop(e.t) })
	return ta
}

func (e *env) agentDialer() systemd.Dialer { return systemd.AddressDialer(e.h.BusAddress) }

func (ta *testAgent) stop(t testing.TB) {
	t.Helper()
	ta.cancel()
	select {
	case err := <-ta.done:
		if err != nil {
			t.Errorf("agent: %v", err)
		}
		ta.done <- nil // a second stop returns at once
	case <-time.After(15 * time.Second):
		t.Error("agent did not stop within 15s")
	}
}

// cli runs an agentd command line in-process and returns its output and exit code.
func (e *env) cli(args ...string) (string, int) {
	e.t.Helper()
	return e.cliCtx(context.Background(), args...)
}

func (e *env) cliCtx(ctx context.Context, args ...string) (string, int) {
	e.t.Helper()
	var out bytes.Buffer
	root := newRoot()
	full := args
	if args[0] == "unit" || args[0] == "hosts" || args[0] == "locks" || args[0] == "rollout" || args[0] == "window" {
		full = append(full, "--etcd-endpoints", e.endpoint)
	}
	root.SetArgs(full)
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.ExecuteContext(ctx)
	if err != nil {
		fmt.Fprintln(&out, "error:", err)
	}
	e.t.Logf("$ agentd %s\n%s", strings.Join(args, " "), out.String())
	var ce *codeError
	code := 0
	if err != nil {
		code = exitError
		if asCode(err, &ce) {
			code = ce.code
		}
	}
	return out.String(), code
}

func asCode(err error, target **codeError) bool {
	for err != nil {
		if c, ok := err.(*codeError); ok {
			*target = c
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}

// writeUnit writes a unit file to put into the registry, in a scratch dir.
func (e *env) writeUnit(name, content string) string {
	e.t.Helper()
	dir := filepath.Join(e.h.Dir, "src")
	if strings.Contains(name, "/") {
		dir = filepath.Join(dir, filepath.Dir(name))
		name = filepath.Base(name)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) put(name, content string, extra ...string) {
	e.t.Helper()
	args := append([]string{"unit", "put", e.writeUnit(name, content), "--host", e.host, "--wait", "--timeout", "30s"}, extra...)
	if out, code := e.cli(args...); code != 0 {
		e.t.Fatalf("unit put %s: exit %d\n%s\n%s", name, code, out, e.h.Log())
	}
}

func (e *env) status(unit string) (reconcile.Status, bool) {
	e.t.Helper()
	st, err := e.reg.Statuses(context.Background(), e.host)
	if err != nil {
		e.t.Fatal(err)
	}
	s, ok := st[unit]
	return s, ok
}

// eventually polls cond every 20ms until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) readLocal(name string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(e.h.UnitDir, name))
	if err != nil {
		return "", false
	}
	return string(b), true
}

// Item 2: put --wait installs, starts and reports the new hash.
func TestPutWaitInstallsAndStarts(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)

	if got, _ := e.readLocal("hello.service"); got != helloV1 {
		t.Fatalf("file on disk = %q, want the registry bytes", got)
	}
	if st := e.h.ActiveState(t, "hello.service"); st != "active" {
		t.Fatalf("ActiveState = %s", st)
	}
	s, ok := e.status("hello.service")
	if !ok || s.Hash != reconcile.Hash([]byte(helloV1)) || s.DesiredHash != s.Hash || s.ActiveState != "active" || s.Action != "start" || s.Result != "done" {
		t.Fatalf("status = %+v", s)
	}
	if pid := e.h.MainPID(t, "hello.service"); pid == 0 || s.MainPID != pid {
		t.Fatalf("MainPID systemd %d, status %d", pid, s.MainPID)
	}
}

// Item 3: a changed file is replaced atomically, ONE daemon-reload, restart in place.
func TestChangeRestartsInPlaceWithOneReload(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)
	pid1 := e.h.MainPID(t, "hello.service")
	reloads := e.h.CountReloads(t)

	e.put("hello.service", helloV2)
	if got, _ := e.readLocal("hello.service"); got != helloV2 {
		t.Fatalf("file not replaced: %q", got)
	}
	pid2 := e.h.MainPID(t, "hello.service")
	if pid2 == 0 || pid2 == pid1 {
		t.Fatalf("MainPID %d → %d: not restarted", pid1, pid2)
	}
	if n := reloads(); n != 1 {
		t.Fatalf("daemon-reloads for one change = %d, want 1", n)
	}
	s, _ := e.status("hello.service")
	if s.Hash != reconcile.Hash([]byte(helloV2)) || s.Action != "restart" || s.MainPID != pid2 {
		t.Fatalf("status = %+v", s)
	}
}

// --wait must never return while the host runs the old hash: the put of
// new content must report progress lines with the new hash only when done.
func TestWaitNeverReturnsOnOldHash(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)
	// Stop the agent: the new content cannot be applied, so --wait must time out.
	e.agent.stop(t)
	out, code := e.cli("unit", "put", e.writeUnit("hello.service", helloV2), "--host", e.host, "--wait", "--timeout", "1s")
	if code != exitTimeout {
		t.Fatalf("exit %d with no agent to apply the change, want %d (timeout)\n%s", code, exitTimeout, out)
	}
}

// Item 2 (failure): --wait exits non-zero with the reason when the start fails.
func TestPutWaitReportsFailedStart(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	bad := "[Service]\nType=exec\nExecStart=/nonexistent/binary\n"
	out, code := e.cli("unit", "put", e.writeUnit("broken.service", bad), "--host", e.host, "--wait", "--timeout", "30s")
	if code != exitFailed {
		t.Fatalf("exit %d, want %d\n%s", code, exitFailed, out)
	}
	if !strings.Contains(out, "broken.service") || !strings.Contains(out, "failed") {
		t.Fatalf("output does not say why:\n%s", out)
	}
}

// Item 4: rm --wait stops, disables, removes the file and reloads.
func TestRmWaitStopsDisablesRemoves(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1+"[Install]\nWantedBy=default.target\n")
	link := filepath.Join(e.h.UnitDir, "default.target.wants", "hello.service")
	if _, err := os.Lstat(link); err != nil {
		t.Fatalf("not enabled: %v", err)
	}
	reloads := e.h.CountReloads(t)
	if out, code := e.cli("unit", "rm", "hello.service", "--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("rm: exit %d\n%s", code, out)
	}
	if _, ok := e.readLocal("hello.service"); ok {
		t.Fatal("file still on disk")
	}
	if _, err := os.Lstat(link); err == nil {
		t.Fatal("still enabled")
	}
	if st := e.h.ActiveState(t, "hello.service"); st != "inactive" {
		t.Fatalf("ActiveState = %s", st)
	}
	if n := reloads(); n != 1 {
		t.Fatalf("reloads = %d, want 1", n)
	}
	if _, ok := e.status("hello.service"); ok {
		t.Fatal("status key still present")
	}
}

// Item 5: ls, cat, hosts and status, each with --json.
func TestListCatHostsStatus(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)

	out, code := e.cli("unit", "ls", "--json")
	var ls []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &ls) != nil || len(ls) != 1 || ls[0]["unit"] != "hello.service" || ls[0]["host"] != "h1" {
		t.Fatalf("unit ls --json: %d %s", code, out)
	}
	if out, code := e.cli("unit", "ls"); code != 0 || !strings.Contains(out, "hosts/h1") {
		t.Fatalf("unit ls: %s", out)
	}
	if out, code := e.cli("unit", "cat", "hello.service", "--host", "h1"); code != 0 || out != helloV1 {
		t.Fatalf("unit cat: %d %q", code, out)
	}
	if out, code := e.cli("unit", "cat", "nope.service", "--host", "h1"); code == 0 {
		t.Fatalf("unit cat of a missing unit succeeded: %s", out)
	}
	out, code = e.cli("hosts", "--json")
	var hosts []struct {
		reconcile.Member
		Converged, Pending, Failed int
	}
	if code != 0 || json.Unmarshal([]byte(out), &hosts) != nil || len(hosts) != 1 || hosts[0].Host != "h1" || hosts[0].Converged != 1 || hosts[0].Groups[0] != "all" {
		t.Fatalf("hosts --json: %s", out)
	}
	if out, code := e.cli("hosts"); code != 0 || !strings.Contains(out, "1/0/0") {
		t.Fatalf("hosts: %s", out)
	}
	sock := e.agent.opts.debugSocket
	out, code = e.cli("status", "--json", "--debug-socket", sock)
	var st struct {
		Host  string
		Units []reconcile.Status
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Host != "h1" || len(st.Units) != 1 {
		t.Fatalf("status --json: %s", out)
	}
	u := st.Units[0]
	if u.Unit != "hello.service" || u.Hash != reconcile.Hash([]byte(helloV1)) || u.DesiredHash != u.Hash || u.ActiveState != "active" || u.SubState != "running" || u.Action == "" || u.Result != "done" {
		t.Fatalf("status unit = %+v", u)
	}
	if out, code := e.cli("status", "--debug-socket", sock); code != 0 || !strings.Contains(out, "hello.service") {
		t.Fatalf("status: %s", out)
	}
}
