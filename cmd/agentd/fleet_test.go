package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// Issue 5: several agents, each with its own systemd and unit directory,
// one etcd. Start and stop times come from systemd itself: every test unit
// logs "<start|stop> <runtime dir> <time>" from ExecStartPre/ExecStopPost,
// and %t (the manager's runtime directory) tells the hosts apart.

type fleet struct {
	t        *testing.T
	endpoint string
	reg      *registry.Client
	hosts    []*env
	events   string
	byRun    map[string]string // %t -> host
}

func newFleet(t *testing.T, n int, endpoint string) *fleet {
	t.Helper()
	if endpoint == "" {
		endpoint = registrytest.StartEtcd(t).Endpoint()
	}
	f := &fleet{t: t, endpoint: endpoint, reg: registrytest.NewClient(t, endpoint), byRun: map[string]string{}}
	f.events = filepath.Join(t.TempDir(), "events")
	for i := range n {
		f.add(fmt.Sprintf("h%d", i+1))
	}
	f.waitJoined()
	return f
}

// waitJoined waits until every host's agent is a live member: an agent
// is ready before its membership is written, and a put --wait counts the
// members it finds (a host that joins after it is not waited for).
func (f *fleet) waitJoined() {
	f.t.Helper()
	t := f.t
	eventually(t, "every agent of the fleet joined", func() bool {
		known, err := f.reg.KnownHosts(t.Context())
		live := map[string]bool{}
		for _, k := range known {
			live[k.Host] = k.Live
		}
		for _, e := range f.hosts {
			if !live[e.host] {
				return false
			}
		}
		return err == nil
	})
}

func (f *fleet) add(host string) *env {
	h := systemdtest.Start(f.t)
	e := &env{t: f.t, h: h, endpoint: f.endpoint, reg: f.reg, host: host, groups: []string{"web", "all"}, quiet: true}
	e.startAgent()
	f.hosts = append(f.hosts, e)
	f.byRun[filepath.Join(h.Dir, "run")] = host
	return e
}

// unit is a service that records its own start and stop times.
func (f *fleet) unit(execStart, policy string) string {
	return fmt.Sprintf("[Service]\nType=exec\n"+
		"ExecStartPre=/bin/sh -c 'echo \"start %%t $(date +%%%%s.%%%%N)\" >> %s'\n"+
		"ExecStart=%s\n"+
		"ExecStopPost=/bin/sh -c 'echo \"stop %%t $(date +%%%%s.%%%%N)\" >> %s'\n"+
		"[X-Agentd]\n%s\n", f.events, execStart, f.events, policy)
}

type event struct {
	at   float64
	stop bool
	host string
}

func (f *fleet) readEvents() []event {
	b, _ := os.ReadFile(f.events)
	var evs []event
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		fs := strings.Fields(line)
		if len(fs) != 3 {
			continue
		}
		at, _ := strconv.ParseFloat(fs[2], 64)
		evs = append(evs, event{at, fs[0] == "stop", f.byRun[fs[1]]})
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	return evs
}

// maxDown is the most hosts that were between a stop and the next start
// at the same moment, by systemd's own clock.
func maxDown(evs []event) int {
	down := map[string]bool{}
	most := 0
	for _, e := range evs {
		down[e.host] = e.stop
		n := 0
		for _, d := range down {
			if d {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

func (f *fleet) put(content string, wantCode int, extra ...string) string {
	f.t.Helper()
	e := f.hosts[0]
	args := append([]string{"unit", "put", e.writeUnit("app.service", content), "--group", "web", "--wait", "--timeout", "90s"}, extra...)
	out, code := e.cli(args...)
	if code != wantCode {
		f.t.Fatalf("unit put: exit %d, want %d\n%s", code, wantCode, out)
	}
	return out
}

// waitRolledOut waits until every host runs content, healthy.
func (f *fleet) waitRolledOut(content string, within time.Duration) {
	f.t.Helper()
	want := reconcile.Hash([]byte(content))
	deadline := time.Now().Add(within)
	for _, e := range f.hosts {
		for {
			s, _ := e.status("app.service")
			if s.Hash == want && s.ActiveState == "active" && !s.Verifying {
				break
			}
			if time.Now().After(deadline) {
				f.t.Fatalf("%s did not finish the rollout: %+v", e.host, s)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func (f *fleet) pids() map[string]uint32 {
	m := map[string]uint32{}
	for _, e := range f.hosts {
		m[e.host] = e.h.MainPID(f.t, "app.service")
	}
	return m
}

// MaxUnavailable=N holds across hosts: at most N of them are between the
// stop and the start of the unit at any moment, over repeated rollouts.
func TestMaxUnavailableBound(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	for _, limit := range []int{1, 2} {
		t.Run(fmt.Sprintf("MaxUnavailable=%d", limit), func(t *testing.T) {
			f := newFleet(t, 5, "")
			policy := fmt.Sprintf("MaxUnavailable=%d\nHealthySec=1", limit)
			f.put(f.unit("/bin/sleep 1000", policy), 0)
			for round := 1; round <= 2; round++ {
				os.Remove(f.events)
				start := time.Now()
				f.put(f.unit(fmt.Sprintf("/bin/sleep %d", 1000+round), policy), 0)
				evs := f.readEvents()
				stops := 0
				for _, e := range evs {
					if e.stop {
						stops++
					}
				}
				if stops != 5 {
					t.Fatalf("round %d: %d hosts restarted, want 5", round, stops)
				}
				if got := maxDown(evs); got > limit {
					t.Fatalf("round %d: %d hosts down at once, MaxUnavailable=%d", round, got, limit)
				} else {
					t.Logf("round %d: 5 hosts rolled in %v, at most %d down at once", round, time.Since(start).Round(10*time.Millisecond), got)
				}
			}
		})
	}
}

// A host that fails the new version rolls back and halts the rollout: the
// others keep the old version running and report held; new content resumes.
func TestHaltOnFailure(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	f := newFleet(t, 4, "")
	policy := "MaxUnavailable=1\nHealthySec=1"
	f.put(f.unit("/bin/sleep 1000", policy), 0)
	before := f.pids()
	out := f.put(f.unit("/bin/sh -c 'sleep 0.2; exit 3'", policy), exitFailed)
	if !strings.Contains(out, "rolled back") || !strings.Contains(out, "held") {
		t.Fatalf("--wait output lacks the rollback and the held hosts:\n%s", out)
	}
	after := f.pids()
	failedHost, held := "", 0
	for _, e := range f.hosts {
		s, _ := e.status("app.service")
		switch s.Action {
		case "rolled-back":
			failedHost = e.host
		case "held":
			held++
			if after[e.host] != before[e.host] {
				t.Errorf("%s was held but restarted", e.host)
			}
		}
	}
	if failedHost == "" || held != len(f.hosts)-1 {
		t.Fatalf("want one host rolled back and %d held; failed=%q held=%d", len(f.hosts)-1, failedHost, held)
	}
	// Putting new content resumes the rollout everywhere.
	f.put(f.unit("/bin/sleep 1001", policy), 0)
}

// A group key reaches every member; a host key overrides it; two groups
// disagreeing is a conflict in that host's status; a late agent converges.
func TestGroupsOverridesConflictsAndLateJoin(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	f := newFleet(t, 2, "")
	f.put(f.unit("/bin/sleep 1000", "HealthySec=0"), 0)
	h2 := f.hosts[1]
	if _, err := f.reg.Put(context.Background(), registry.Target{Host: "h2"}, map[string][]byte{"app.service": []byte(f.unit("/bin/sleep 2000", "HealthySec=0"))}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "h2 runs its host key", func() bool {
		s, _ := h2.status("app.service")
		return s.Source == "host" && s.ActiveState == "active" && s.Hash == s.DesiredHash
	})
	// Conflict: group "all" says something else than group "web" for h1.
	if _, err := f.reg.Put(context.Background(), registry.Target{Group: "all"}, map[string][]byte{"app.service": []byte(f.unit("/bin/sleep 3000", "HealthySec=0"))}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "h1 reports the conflict", func() bool {
		s, _ := f.hosts[0].status("app.service")
		return strings.Contains(s.Error, "conflict: groups all, web")
	})
	if p := f.hosts[0].h.MainPID(t, "app.service"); p == 0 {
		t.Fatal("a conflict must leave the running unit alone")
	}
	if _, err := f.reg.Remove(context.Background(), registry.Target{Group: "all"}, []string{"app.service"}); err != nil {
		t.Fatal(err)
	}
	// A new machine joins after the rollout and converges on its own.
	late := f.add("h3")
	eventually(t, "the late agent converged", func() bool {
		s, ok := late.status("app.service")
		return ok && s.ActiveState == "active" && s.Hash == s.DesiredHash && s.Error == ""
	})
}

// buildAgent builds the agentd binary once per test binary (removed by TestMain).
// builtAgent is the agent binary, built once for every test that runs it
// as a process of its own.
var (
	builtAgent    string
	builtAgentErr error
	buildOnce     sync.Once
)

func TestMain(m *testing.M) {
	if os.Getenv(serveHelperEnv) != "" {
		os.Exit(serveHelper()) // a unit's process (probe_test.go), not the tests
	}
	if os.Getenv(proxyHelperEnv) != "" {
		os.Exit(proxyHelper()) // a unit's process (confirm_e2e_test.go), not the tests
	}
	// Every agent the tests start, in this process or as a child, checks
	// each focused pass against a plan of every unit (benchmarks unset it).
	if _, set := os.LookupEnv(checkFocusEnv); !set {
		os.Setenv(checkFocusEnv, "1")
	}
	// The parallel tests here mostly wait — on HealthySec windows, leases,
	// systemd's jobs — not on the CPU: at go test's default (-parallel =
	// GOMAXPROCS, 2 here) the package used 31% of two cores for 166 s.
	// Unless -parallel is given, run 6 at a time.
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		flag.Set("test.parallel", strconv.Itoa(max(6, runtime.GOMAXPROCS(0))))
	}
	code := m.Run()
	if builtAgent != "" {
		os.RemoveAll(filepath.Dir(builtAgent))
	}
	os.Exit(code)
}

func buildAgent(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "agentd-bin")
		if err != nil {
			builtAgentErr = err
			return
		}
		bin := filepath.Join(dir, "agentd")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			builtAgentErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		builtAgent = bin
	})
	if builtAgentErr != nil {
		t.Fatal(builtAgentErr)
	}
	return builtAgent
}

// An agent killed with SIGKILL while it holds a slot frees it when its lease
// expires, and the rollout completes on the others.
func TestKilledSlotHolderFreesSlot(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	bin := buildAgent(t)
	f := newFleet(t, 2, "")
	// The victim runs as its own process so it can really be SIGKILLed.
	vh := systemdtest.Start(t)
	f.byRun[filepath.Join(vh.Dir, "run")] = "victim"
	cmd := exec.Command(bin, "run", "--user", "--host", "victim", "--group", "web", "--etcd-endpoints", f.endpoint,
		"--unit-dir", vh.UnitDir, "--state-dir", vh.StateDir, "--debug-socket", filepath.Join(vh.Dir, "agentd.sock"), "--lease-ttl", "2s")
	cmd.Env = append(os.Environ(), "DBUS_SESSION_BUS_ADDRESS="+vh.BusAddress)
	cmd.Stdout, cmd.Stderr = t.Output(), t.Output()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	eventually(t, "the victim joined", func() bool {
		ms, _ := f.reg.Members(context.Background())
		return slices.ContainsFunc(ms, func(m reconcile.Member) bool { return m.Host == "victim" })
	})
	f.put(f.unit("/bin/sleep 1000", "MaxUnavailable=1\nHealthySec=0"), 0)

	// With the other agents away, the victim is first in the queue for v2.
	for _, e := range f.hosts {
		e.agent.stop(t)
	}
	v2 := f.unit("/bin/sleep 1001", "MaxUnavailable=1\nHealthySec=3")
	if _, err := f.reg.Put(context.Background(), registry.Target{Group: "web"}, map[string][]byte{"app.service": []byte(v2)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the victim holds the slot", func() bool {
		hs, _ := f.reg.Holders(context.Background(), "groups/web", reconcile.Bucket{}, "app.service")
		return len(hs) > 0 && hs[0].Host == "victim" && !hs[0].Waiting()
	})
	for _, e := range f.hosts {
		e.startAgent()
	}
	eventually(t, "the others queue behind the victim", func() bool {
		hs, _ := f.reg.Holders(context.Background(), "groups/web", reconcile.Bucket{}, "app.service")
		return len(hs) == 3
	})
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "another host took the slot", func() bool {
		hs, _ := f.reg.Holders(context.Background(), "groups/web", reconcile.Bucket{}, "app.service")
		return len(hs) > 0 && hs[0].Host != "victim" && !hs[0].Waiting()
	})
	t.Logf("slot freed %v after SIGKILL (lease TTL 2s)", time.Since(killed).Round(10*time.Millisecond))
	f.waitRolledOut(v2, 30*time.Second)
	t.Logf("rollout completed on the survivors %v after the kill", time.Since(killed).Round(10*time.Millisecond))
}

// With etcd unreachable mid-rollout no host starts a disruptive step it
// cannot account for in the semaphore; when etcd returns the rollout goes on.
func TestEtcdAwayMidRollout(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	et := newRestartableEtcd(t)
	f := newFleet(t, 3, et.client)
	f.put(f.unit("/bin/sleep 1000", "MaxUnavailable=1\nHealthySec=0"), 0)
	v2 := f.unit("/bin/sleep 1001", "MaxUnavailable=1\nHealthySec=2")
	os.Remove(f.events)
	if _, err := f.reg.Put(context.Background(), registry.Target{Group: "web"}, map[string][]byte{"app.service": []byte(v2)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first host restarted", func() bool { return len(f.readEvents()) >= 2 })
	et.stop()
	stoppedAt := float64(time.Now().UnixNano()) / 1e9
	time.Sleep(4 * time.Second) // past the first host's HealthySec: it would hand the slot on
	et.start()
	startedAt := float64(time.Now().UnixNano()) / 1e9
	for _, ev := range f.readEvents() {
		if ev.stop && ev.at > stoppedAt && ev.at < startedAt {
			t.Fatalf("%s stopped the unit at %.2f while etcd was away (%.2f–%.2f)", ev.host, ev.at, stoppedAt, startedAt)
		}
	}
	f.waitRolledOut(v2, 40*time.Second)
	if got := maxDown(f.readEvents()); got > 1 {
		t.Fatalf("%d hosts down at once", got)
	}
}
