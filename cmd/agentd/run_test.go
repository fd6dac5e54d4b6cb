package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/internal/citest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/systemd"
)

// A burst of 50 units in one put is applied with ONE daemon-reload, counted
// from systemd's own Reloading signal.
func TestBurstOf50UnitsOneReload(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	e := newEnv(t)
	e.startAgent()
	reloads := e.h.CountReloads(t)
	args := []string{"unit", "put"}
	for i := range 50 {
		args = append(args, e.writeUnit(fmt.Sprintf("burst%02d.service", i), fmt.Sprintf("[Service]\nType=exec\nExecStart=/bin/sleep %d\n"+fast, 1000+i)))
	}
	args = append(args, "--host", e.host, "--wait", "--timeout", "60s")
	if out, code := e.cli(args...); code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for i := range 50 {
		if st := e.h.ActiveState(t, fmt.Sprintf("burst%02d.service", i)); st != "active" {
			t.Fatalf("burst%02d: %s", i, st)
		}
	}
	if n := reloads(); n != 1 {
		t.Fatalf("daemon-reloads for a 50-unit burst = %d, want 1", n)
	}
}

// A first sync of many new units of every kind, in one put: the agent
// plans units systemd has just loaded from one listing (reconcile's Light
// states) and reads each unit in full only after its job. Each still ends
// as systemd says — services and a oneshot healthy, a timer and a socket
// waiting — and a start that hangs (TimeoutStartSec=infinity) is still
// waited for, not given up on, while the others converge. systemd loads
// each new unit file at most three times (counted from its UnitNew
// signals: the listing before the files are written, the one after the
// daemon-reload, the job), not once more for every call about it.
func TestFirstSyncOfManyKinds(t *testing.T) {
	t.Parallel() // waits on jobs, not the CPU
	e := newEnv(t)
	e.startAgent()
	loads := e.h.CountLoads(t)
	units := map[string]string{
		"fk-once.service":   "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n" + fast,
		"fk-tick.timer":     "[Timer]\nOnActiveSec=1h\nUnit=fk-ticked.service\n" + fast,
		"fk-ticked.service": "[Service]\nType=oneshot\nExecStart=/bin/true\n[X-Agentd]\nState=present\n",
		"fk-sock.socket":    "[Socket]\nListenStream=%t/fk-sock.sock\n" + fast,
		"fk-sock.service":   "[Service]\nExecStart=/bin/sleep 1000\n[X-Agentd]\nState=present\n",
		"fk-hung.service":   "[Service]\nType=exec\nExecStartPre=/bin/sleep 300\nExecStart=/bin/sleep 1000\nTimeoutStartSec=infinity\n",
	}
	for i := range 10 {
		units[fmt.Sprintf("fk-%02d.service", i)] = fmt.Sprintf("[Service]\nType=exec\nExecStart=/bin/sleep %d\n"+fast, 2000+i)
	}
	args := []string{"unit", "put"}
	for name, content := range units {
		args = append(args, e.writeUnit(name, content))
	}
	if out, code := e.cli(append(args, "--host", e.host)...); code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	want := map[string]string{"fk-once.service": "active", "fk-tick.timer": "active", "fk-sock.socket": "active",
		"fk-ticked.service": "inactive", "fk-sock.service": "inactive", "fk-hung.service": "activating"}
	for i := range 10 {
		want[fmt.Sprintf("fk-%02d.service", i)] = "active"
	}
	// The loads, counted before this test asks systemd anything (its own
	// reads of an inactive unit load it too): once the statuses say the
	// services run.
	loaded := map[string]int{}
	for deadline := time.Now().Add(20 * time.Second); len(loaded) < 10; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the fk-NN services' statuses do not say active: %d of 10 do", len(loaded))
		}
		for i := range 10 {
			u := fmt.Sprintf("fk-%02d.service", i)
			if s, ok := e.status(u); ok && s.ActiveState == "active" {
				loaded[u] = loads(u)
			}
		}
	}
	for u, n := range loaded {
		if n > 3 {
			t.Errorf("systemd loaded %s %d times in the first sync, want at most 3", u, n)
		}
	}
	var differs string
	converged := func() bool {
		for name, active := range want {
			s, ok := e.status(name)
			// A unit's signals are not followed while the agent's job on it
			// runs: the hung one's status shows the job, not its state.
			hung := name == "fk-hung.service"
			if got := e.h.ActiveState(t, name); got != active || !ok || (!hung && s.ActiveState != active) || (active == "active" && s.Health != "healthy") {
				differs = fmt.Sprintf("%s: systemd says %s, want %s; status %+v", name, got, active, s)
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(20 * time.Second); !converged(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not converged: %s", differs)
		}
	}
	s, _ := e.status("fk-hung.service")
	if s.Job != "start" || s.Action != "start" || s.Result != "running" {
		t.Errorf("the hung start: status %+v, want its start job still waited for", s)
	}
	if s, _ := e.status("fk-00.service"); s.MainPID == 0 || s.MainPID != e.h.MainPID(t, "fk-00.service") {
		t.Errorf("fk-00.service: status MainPID %d, systemd's %d: the read after the job is not systemd's", s.MainPID, e.h.MainPID(t, "fk-00.service"))
	}
}

// Units with [Install] sections that arrive together are enabled in one
// call to systemd; one it refuses to enable fails alone, with systemd's
// words in its status, and the others are enabled and run.
func TestEnableManyOneRefused(t *testing.T) {
	t.Parallel() // waits on jobs, not the CPU
	e := newEnv(t)
	e.startAgent()
	install := "[Install]\nWantedBy=default.target\n"
	units := map[string]string{
		"eb-bad.service": "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n" + install + "Alias=eb-bad.socket\n" + fast,
	}
	for i := range 3 {
		units[fmt.Sprintf("eb-%d.service", i)] = fmt.Sprintf("[Service]\nType=exec\nExecStart=/bin/sleep %d\n", 1000+i) + install + fast
	}
	args := []string{"unit", "put"}
	for name, content := range units {
		args = append(args, e.writeUnit(name, content))
	}
	if out, code := e.cli(append(args, "--host", e.host)...); code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	var differs string
	done := func() bool {
		for i := range 3 {
			u := fmt.Sprintf("eb-%d.service", i)
			if st, ufs := e.h.ActiveState(t, u), judgeStr(t, e, u, "UnitFileState"); st != "active" || ufs != "enabled" {
				differs = fmt.Sprintf("%s: %s, %s; want active, enabled", u, st, ufs)
				return false
			}
		}
		if s, ok := e.status("eb-bad.service"); !ok || !strings.Contains(s.Error, "Cannot alias") {
			differs = fmt.Sprintf("eb-bad.service: status %+v, want systemd's refusal", s)
			return false
		}
		return true
	}
	for deadline := time.Now().Add(20 * time.Second); !done(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(differs)
		}
	}
	s, _ := e.status("eb-bad.service")
	t.Logf("eb-bad.service: systemd %s; status %+v", e.h.ActiveState(t, "eb-bad.service"), s)
}

// A file the agent did not write is never overwritten; status says why.
func TestUnmanagedFileIsNeverOverwritten(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	local := "[Service]\nType=exec\nExecStart=/bin/sleep 7\n"
	if err := os.WriteFile(filepath.Join(e.h.UnitDir, "hello.service"), []byte(local), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := e.cli("unit", "put", e.writeUnit("hello.service", helloV1), "--host", e.host, "--wait", "--timeout", "30s")
	if code != exitFailed || !strings.Contains(out, "unmanaged file") {
		t.Fatalf("exit %d, want %d with 'unmanaged file'\n%s", code, exitFailed, out)
	}
	if got, _ := e.readLocal("hello.service"); got != local {
		t.Fatalf("unmanaged file overwritten: %q", got)
	}
	s, _ := e.status("hello.service")
	if !strings.Contains(s.Error, "unmanaged file") || s.Hash != reconcile.Hash([]byte(local)) {
		t.Fatalf("status = %+v", s)
	}
}

// rawPut writes keys the way an operator with etcdctl could, bypassing the
// CLI's own validation.
func rawPut(t *testing.T, endpoint string, kv map[string]string) {
	t.Helper()
	cli := registrytest.RawClient(t, endpoint)
	var ops []clientv3.Op
	for k, v := range kv {
		ops = append(ops, clientv3.OpPut(k, v))
	}
	if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
}

// Bad registry values get a clear per-unit error and change nothing, while
// the good unit beside them converges. Nothing lands outside the unit dir.
func TestBadValuesAreReportedAndChangeNothing(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("keep.service", helloV1) // running before the bad values arrive
	keepPID := e.h.MainPID(t, "keep.service")

	p := "/agentd/hosts/h1/units/"
	bad := map[string]string{ // registry key suffix -> status unit and the error it must mention
		"bad name.service":   "not allowed",
		"../escape.service":  "must not contain",
		"a..b.service":       "must not contain",
		"sda.device":         "unsupported unit type",
		"big.service":        "over the 256 KiB limit",
		"latin1.service":     "not valid UTF-8",
		"nul.service":        "NUL byte",
		"typo.service":       "unknown key Stat=",
		"noexec.service":     "systemd refused to load",
		"keep.service":       "systemd refused to load", // a refused change keeps the old file running
		"other.service.d/..": "must end in .conf",
	}
	values := map[string]string{
		"bad name.service":   helloV1,
		"../escape.service":  helloV1,
		"a..b.service":       helloV1,
		"sda.device":         "[Unit]\nDescription=x\n",
		"big.service":        helloV1 + strings.Repeat("# padding\n", 30000),
		"latin1.service":     "[Unit]\nDescription=caf\xe9\n[Service]\nExecStart=/bin/true\n",
		"nul.service":        helloV1 + "\x00",
		"typo.service":       helloV1 + "[X-Agentd]\nStat=stopped\n",
		"noexec.service":     "[Unit]\nDescription=no ExecStart\n[Service]\nType=exec\n",
		"keep.service":       "[Unit]\nDescription=keep v2 without ExecStart\n[Service]\nType=exec\n",
		"other.service.d/..": "[Service]\n",
	}
	kv := map[string]string{p + "good.service": helloV2}
	for k, v := range values {
		kv[p+k] = v
	}
	rawPut(t, e.endpoint, kv)

	eventually(t, "good.service active and every bad key reported", func() bool {
		if s, ok := e.status("good.service"); !ok || s.ActiveState != "active" || s.Hash != reconcile.Hash([]byte(helloV2)) {
			return false
		}
		st, err := e.reg.Statuses(context.Background(), e.host)
		if err != nil {
			return false
		}
		errs := 0
		for _, s := range st {
			if s.Error != "" {
				errs++
			}
		}
		return errs >= len(bad)
	})
	st, _ := e.reg.Statuses(context.Background(), e.host)
	for _, s := range st {
		t.Logf("status %-28s action=%-8s error=%s", s.Unit, s.Action, s.Error)
	}
	for key, want := range bad {
		name := reconcile.StatusName(key)
		if _, unit, err := reconcile.ParseKey(key); err == nil {
			name = unit
		}
		if s, ok := st[name]; !ok || !strings.Contains(s.Error, want) {
			t.Errorf("%s: status %q error %q, want it to mention %q", key, name, s.Error, want)
		}
	}
	// The refused change left keep.service's old file and process alone.
	if got, _ := e.readLocal("keep.service"); got != helloV1 {
		t.Errorf("keep.service file = %q, want the old content restored", got)
	}
	if pid := e.h.MainPID(t, "keep.service"); pid != keepPID {
		t.Errorf("keep.service MainPID %d → %d: disturbed by a refused change", keepPID, pid)
	}
	// Only the good files exist in the unit dir; nothing above it.
	entries, _ := os.ReadDir(e.h.UnitDir)
	var names []string
	for _, en := range entries {
		names = append(names, en.Name())
	}
	if strings.Join(names, ",") != "good.service,keep.service" {
		t.Errorf("unit dir holds %v, want only good.service and keep.service", names)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(e.h.UnitDir), "escape.service")); err == nil {
		t.Error("escape.service written outside the unit directory")
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// restartableEtcd is an etcd on fixed ports and a fixed data dir, so a test
// can take it away and bring it back.
type restartableEtcd struct {
	t                 *testing.T
	dir, client, peer string
	e                 *registry.Embedded
}

func newRestartableEtcd(t *testing.T) *restartableEtcd {
	r := &restartableEtcd{t: t, dir: t.TempDir(),
		client: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), peer: fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}
	r.start()
	t.Cleanup(func() {
		if r.e != nil {
			r.e.Close()
		}
	})
	return r
}

func (r *restartableEtcd) start() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e, err := registry.StartEmbedded(ctx, registry.EmbedConfig{Dir: r.dir, ClientURL: r.client, PeerURL: r.peer, ForTests: true})
	if err != nil {
		r.t.Fatal(err)
	}
	r.e = e
}

func (r *restartableEtcd) stop() { r.e.Close(); r.e = nil }

// With etcd away, running units stay untouched; when it returns the agent
// resyncs without restarting units whose content did not change.
func TestEtcdAwayKeepsUnitsAndResyncs(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	h := newEnv(t).h
	et := newRestartableEtcd(t)
	e := &env{t: t, h: h, endpoint: et.client, host: "h1", reg: registrytest.NewClient(t, et.client)}
	e.startAgent()
	e.put("hello.service", helloV1)
	e.put("other.service", helloV2)
	pid := e.h.MainPID(t, "hello.service")

	et.stop()
	time.Sleep(1500 * time.Millisecond) // the agent's watch and session now fail and retry
	if p := e.h.MainPID(t, "hello.service"); p != pid {
		t.Fatalf("MainPID changed while etcd was away: %d → %d", pid, p)
	}
	if got, _ := e.readLocal("hello.service"); got != helloV1 {
		t.Fatalf("file changed while etcd was away")
	}
	et.start()
	// A change to another unit proves the agent is back in sync.
	e.put("other.service", helloV1)
	if p := e.h.MainPID(t, "hello.service"); p != pid {
		t.Fatalf("unchanged unit restarted after etcd returned: %d → %d", pid, p)
	}
	if s, ok := e.status("hello.service"); !ok || s.Hash != reconcile.Hash([]byte(helloV1)) {
		t.Fatalf("status of the unchanged unit not republished: %+v", s)
	}
}

// Restarting the agent never stops or restarts a unit whose content did not
// change; a change made while it was down is applied when it returns.
func TestAgentRestartLeavesUnchangedUnitsRunning(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	a := e.startAgent()
	e.put("same.service", helloV1)
	e.put("changed.service", helloV1)
	samePID := e.h.MainPID(t, "same.service")
	changedPID := e.h.MainPID(t, "changed.service")
	reloads := e.h.CountReloads(t)

	a.stop(t)
	if _, err := e.reg.Put(context.Background(), registry.Target{Host: "h1"}, map[string][]byte{"changed.service": []byte(helloV2)}); err != nil {
		t.Fatal(err)
	}
	e.startAgent()
	eventually(t, "changed.service runs the new hash", func() bool {
		s, ok := e.status("changed.service")
		return ok && s.Hash == reconcile.Hash([]byte(helloV2)) && s.ActiveState == "active"
	})
	if p := e.h.MainPID(t, "same.service"); p != samePID {
		t.Fatalf("agent restart restarted an unchanged unit: %d → %d", samePID, p)
	}
	if p := e.h.MainPID(t, "changed.service"); p == changedPID {
		t.Fatal("changed unit not restarted")
	}
	if n := reloads(); n != 1 {
		t.Fatalf("reloads = %d, want 1", n)
	}
}

// A unit that crashes on its own shows in status from D-Bus signals (the
// periodic resync is a minute away, so only a signal can explain it).
func TestCrashShowsInStatusFromSignals(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("crash.service", "[Service]\nType=exec\nExecStart=/bin/sh -c 'sleep 1; exit 3'\n"+fast)
	var failedAt time.Time
	eventually(t, "systemd reports crash.service failed", func() bool {
		if e.h.ActiveState(t, "crash.service") == "failed" {
			failedAt = time.Now()
			return true
		}
		return false
	})
	eventually(t, "status shows the crash", func() bool {
		s, _ := e.status("crash.service")
		return s.ActiveState == "failed" && s.UnitResult == "exit-code" && strings.Contains(s.Error, "exit-code")
	})
	t.Logf("crash visible in etcd status %v after systemd reported it", time.Since(failedAt).Round(time.Millisecond))
}

// Item 6: --user picks the user instance's directories; the system instance
// keeps the system ones.
func TestUserModeDefaults(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", "/x/config")
	t.Setenv("XDG_STATE_HOME", "/x/state")
	t.Setenv("XDG_RUNTIME_DIR", "/x/run")
	u := &runOptions{user: true, host: "h1"}
	if err := u.defaults(); err != nil {
		t.Fatal(err)
	}
	if u.unitDir != "/x/config/systemd/user" || u.stateDir != "/x/state/agentd" || u.debugSocket != "/x/run/agentd.sock" {
		t.Fatalf("user defaults: %+v", u)
	}
	s := &runOptions{host: "h1"}
	if err := s.defaults(); err != nil {
		t.Fatal(err)
	}
	if s.unitDir != "/etc/systemd/system" || s.stateDir != "/var/lib/agentd" || s.debugSocket != "/run/agentd/agentd.sock" {
		t.Fatalf("system defaults: %+v", s)
	}
}

// Item 1: with no --etcd-endpoints the agent runs an embedded etcd in its
// state directory, and the client commands reach it.
func TestEmbeddedEtcdByDefault(t *testing.T) {
	e := newEnv(t)
	rt := filepath.Join(registrytest.SocketDir(t), "agentd")
	e.endpoint = "unix://" + filepath.Join(rt, etcdSocket)
	o := &runOptions{
		host: "h1", groups: []string{"all"}, unitDir: e.h.UnitDir, stateDir: e.h.StateDir,
		debugSocket: filepath.Join(e.h.Dir, "agentd.sock"), logLevel: "info", leaseTTL: 5 * time.Second,
		embedPeer:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		dialSystemd: e.agentDialer(), logOut: t.Output(),
	}
	o.etcd.prefix, o.etcd.runtimeDir = registry.DefaultPrefix, rt
	o.etcd.timeout = 5 * time.Second
	ready := make(chan *reconcile.Agent, 1)
	o.ready = ready
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runAgent(ctx, o) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("agent exited at start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not start in 30s")
	}
	e.put("hello.service", helloV1)
	if _, err := os.Stat(filepath.Join(e.h.StateDir, "etcd", "member")); err != nil {
		t.Fatalf("no etcd data in the state directory: %v", err)
	}
}

// Item 1: the README's first command, run as a user would (with free ports).
func TestDemo(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	citest.NeedRoot(t, "the demo, like the harness")
	cmd := exec.Command("bash", "../../contrib/demo.sh")
	out, err := cmd.CombinedOutput()
	t.Logf("make demo:\n%s", out)
	if err != nil {
		t.Fatalf("demo failed: %v", err)
	}
	if !strings.Contains(string(out), "restarted in place") {
		t.Fatal("demo did not show the restart in place")
	}
}

// An operator's `systemctl stop` of a managed unit is respected: the agent
// reports it but does not start it again while its content is unchanged.
func TestOperatorStopIsRespected(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)
	m, err := systemd.Open(context.Background(), e.agentDialer(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Stop(context.Background(), "hello.service"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "status shows the stop", func() bool {
		s, _ := e.status("hello.service")
		return s.ActiveState == "inactive"
	})
	if _, err := e.agent.agent.Sync(context.Background()); err != nil { // a full pass, as the periodic resync would run
		t.Fatal(err)
	}
	if st := e.h.ActiveState(t, "hello.service"); st != "inactive" {
		t.Fatalf("agent undid the operator's stop: %s", st)
	}
	// systemd unloads the stopped unit (nothing refers to it) and forgets
	// it ran; a restarted agent still knows it started it under this
	// manager, and leaves it stopped.
	e.agent.stop(t)
	a := e.startAgent()
	if _, err := a.agent.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := e.h.ActiveState(t, "hello.service"); st != "inactive" {
		t.Fatalf("a restarted agent undid the operator's stop: %s", st)
	}
	eventually(t, "status shows the unit stopped after the agent's restart", func() bool {
		s, ok := e.status("hello.service")
		return ok && s.ActiveState == "inactive"
	})
	if st := e.h.ActiveState(t, "hello.service"); st != "inactive" {
		t.Fatalf("a restarted agent undid the operator's stop: %s", st)
	}
}
