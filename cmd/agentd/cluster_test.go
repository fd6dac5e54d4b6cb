package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/internal/testport"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// Issue 11, item 7: a real etcd cluster. Three etcd members run as
// processes of their own on loopback — the real etcd server, built from the
// module this one requires — and the agents and the CLI get all three
// endpoints. The tests kill and stop members, the leader among them, during
// a MaxUnavailable=1 rollout, and take the whole cluster away for longer
// than the agents' lease TTL.

// etcdBin is the etcd server binary, built once per test binary (Go's build
// cache makes every build after the first a link only) into a temporary
// directory that goes when the last test using it ends.
var etcdBin struct {
	sync.Mutex
	path  string
	users int
}

func etcdServerBinary(t testing.TB) string {
	t.Helper()
	etcdBin.Lock()
	defer etcdBin.Unlock()
	if etcdBin.path == "" {
		dir, err := os.MkdirTemp("", "agentd-etcd-bin")
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "etcd")
		start := time.Now()
		if out, err := exec.Command("go", "build", "-o", bin, "go.etcd.io/etcd/server/v3").CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			t.Fatalf("go build go.etcd.io/etcd/server/v3: %v\n%s", err, out)
		}
		t.Logf("built the etcd server in %v", time.Since(start).Round(10*time.Millisecond))
		etcdBin.path = bin
	}
	etcdBin.users++
	t.Cleanup(func() {
		etcdBin.Lock()
		defer etcdBin.Unlock()
		if etcdBin.users--; etcdBin.users == 0 {
			os.RemoveAll(filepath.Dir(etcdBin.path))
			etcdBin.path = ""
		}
	})
	return etcdBin.path
}

// etcdMember is one etcd server process of a cluster, on fixed loopback
// ports and a fixed data directory, so that it can be killed and started
// again as the same member.
type etcdMember struct {
	t                 *testing.T
	bin, name, dir    string
	client, peer, log string
	initialCluster    string
	token             string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

type etcdCluster struct {
	t       *testing.T
	members []*etcdMember
}

// startEtcdCluster starts n members and waits until they have a leader.
func startEtcdCluster(t *testing.T, n int) *etcdCluster {
	t.Helper()
	bin := etcdServerBinary(t)
	c := &etcdCluster{t: t}
	dir := t.TempDir()
	var peers []string
	for i := range n {
		m := &etcdMember{
			t: t, bin: bin, name: fmt.Sprintf("m%d", i+1),
			client: fmt.Sprintf("http://127.0.0.1:%d", clusterPort(t)),
			peer:   fmt.Sprintf("http://127.0.0.1:%d", clusterPort(t)),
			token:  fmt.Sprintf("agentd-test-%d-%d", os.Getpid(), time.Now().UnixNano()),
		}
		m.dir = filepath.Join(dir, m.name)
		m.log = filepath.Join(dir, m.name+".log")
		peers = append(peers, m.name+"="+m.peer)
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		m.initialCluster = strings.Join(peers, ",")
		m.token = c.members[0].token
	}
	t.Cleanup(func() {
		for _, m := range c.members {
			m.kill()
		}
		if t.Failed() {
			for _, m := range c.members {
				t.Logf("etcd member %s log (tail):\n%s", m.name, tail(m.log, 25))
			}
		}
	})
	for _, m := range c.members {
		m.start()
	}
	c.waitLeader(c.members...)
	return c
}

// clusterPort returns a loopback port for an etcd member, which keeps its
// ports across restarts (see testport).
func clusterPort(t *testing.T) int {
	t.Helper()
	return testport.Restartable(t)
}

func (m *etcdMember) start() {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		m.t.Fatalf("etcd %s is already running", m.name)
	}
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		m.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(m.bin,
		"--name", m.name, "--data-dir", m.dir,
		"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
		"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
		"--initial-cluster", m.initialCluster, "--initial-cluster-state", "new", "--initial-cluster-token", m.token,
		// Fast failure detection, still tolerant of a busy 2-core machine.
		"--heartbeat-interval", "50", "--election-timeout", "500",
		"--unsafe-no-fsync", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		m.t.Fatalf("start etcd %s: %v", m.name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	m.cmd, m.exited = cmd, exited
}

// signal sends sig and waits until the process is gone (SIGKILL after 10 s).
func (m *etcdMember) signal(sig syscall.Signal) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return
	}
	m.cmd.Process.Signal(sig)
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		m.cmd.Process.Kill()
		<-m.exited
	}
	m.cmd = nil
}

// died reports whether the process exited without being told to.
func (m *etcdMember) died() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return false
	}
	select {
	case <-m.exited:
		return true
	default:
		return false
	}
}

func (m *etcdMember) kill() { m.signal(syscall.SIGKILL) }
func (m *etcdMember) stop() { m.signal(syscall.SIGTERM) }

func (c *etcdCluster) endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.client)
	}
	return eps
}

// status asks one member for its view: its own ID and the leader's.
func (c *etcdCluster) status(m *etcdMember) (id, leader uint64, err error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.client}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, 0, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := cli.Status(ctx, m.client)
	if err != nil {
		return 0, 0, err
	}
	return s.Header.MemberId, s.Leader, nil
}

// waitLeader waits until every member of ms sees the same leader, one of
// ms, and returns it.
func (c *etcdCluster) waitLeader(ms ...*etcdMember) *etcdMember {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ids := map[uint64]*etcdMember{}
		leaders := map[uint64]bool{}
		for _, m := range ms {
			if m.died() {
				c.t.Fatalf("etcd member %s exited on its own:\n%s", m.name, tail(m.log, 10))
			}
			id, leader, err := c.status(m)
			if err != nil || leader == 0 {
				leaders[0] = true
				continue
			}
			ids[id] = m
			leaders[leader] = true
		}
		if len(leaders) == 1 {
			for l := range leaders {
				if ids[l] != nil {
					return ids[l]
				}
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("etcd members %v: no common leader within 20s", names(ms))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func names(ms []*etcdMember) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.name)
	}
	return out
}

func (c *etcdCluster) others(not ...*etcdMember) []*etcdMember {
	var out []*etcdMember
	for _, m := range c.members {
		if !slices.Contains(not, m) {
			out = append(out, m)
		}
	}
	return out
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// dialRegistry is a registry client on every endpoint, closed at cleanup.
func dialRegistry(t *testing.T, endpoints []string, user, password string) *registry.Client {
	t.Helper()
	c, err := registry.Dial(context.Background(), registry.Config{
		Endpoints: endpoints, Username: user, Password: password,
		DialTimeout: 10 * time.Second,
		Logger:      slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatalf("dial etcd %v: %v", endpoints, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newClusterFleet is newFleet on a cluster: n hosts in groups web and all,
// their agents (lease TTL ttl) and the CLI on every endpoint.
func newClusterFleet(t *testing.T, c *etcdCluster, n int, ttl time.Duration) *fleet {
	t.Helper()
	eps := c.endpoints()
	f := &fleet{t: t, endpoint: strings.Join(eps, ","), reg: dialRegistry(t, eps, "", ""), byRun: map[string]string{}}
	f.events = filepath.Join(t.TempDir(), "events")
	for i := range n {
		host := fmt.Sprintf("h%d", i+1)
		h := systemdtest.Start(t)
		e := &env{t: t, h: h, endpoint: f.endpoint, reg: f.reg, host: host, groups: []string{"web", "all"}, quiet: true}
		e.startAgentOn(eps, func(o *runOptions) { o.leaseTTL = ttl })
		f.hosts = append(f.hosts, e)
		f.byRun[filepath.Join(h.Dir, "run")] = host
	}
	return f
}

// perHost counts stop and start events per host.
func perHost(evs []event) (stops, starts map[string]int) {
	stops, starts = map[string]int{}, map[string]int{}
	for _, e := range evs {
		if e.stop {
			stops[e.host]++
		} else {
			starts[e.host]++
		}
	}
	return stops, starts
}

// During a MaxUnavailable=1 rollout to three hosts the etcd leader is
// killed (SIGKILL), then the new leader is stopped too — the cluster has no
// quorum — and started again. The rollout completes, at most one host is
// ever down, every host restarts exactly once, and `unit put --wait` on all
// three endpoints exits 0.
func TestClusterLeaderLossDuringRollout(t *testing.T) {
	t.Parallel() // waits on etcd elections, timers and HealthySec, not the CPU
	c := startEtcdCluster(t, 3)
	f := newClusterFleet(t, c, 3, 5*time.Second)
	f.put(f.unit("/bin/sleep 1000", "MaxUnavailable=1\nHealthySec=0"), 0)
	before := f.pids()

	os.Remove(f.events)
	// HealthySec=4 keeps the rollout going through both faults: a SIGTERM
	// drains clients for etcd's request timeout (~6 s) before the member
	// leaves raft.
	const healthy = 4
	v2 := f.unit("/bin/sleep 1001", fmt.Sprintf("MaxUnavailable=1\nHealthySec=%d", healthy))
	src := f.hosts[0].writeUnit("app.service", v2)
	type result struct {
		out  string
		code int
	}
	waited := make(chan result, 1)
	start := time.Now()
	go func() {
		out, code := f.hosts[0].cli("unit", "put", src, "--group", "web", "--wait", "--timeout", "60s")
		waited <- result{out, code}
	}()

	eventually(t, "the first host restarted", func() bool { return len(f.readEvents()) >= 2 })
	leader := c.waitLeader(c.members...)
	leader.kill()
	t.Logf("%v: killed the leader %s (SIGKILL)", time.Since(start).Round(10*time.Millisecond), leader.name)
	next := c.waitLeader(c.others(leader)...)
	t.Logf("%v: %s is the new leader", time.Since(start).Round(10*time.Millisecond), next.name)
	next.stop()
	lost := time.Now()
	t.Logf("%v: stopped %s (SIGTERM): no quorum", time.Since(start).Round(10*time.Millisecond), next.name)
	time.Sleep(2 * time.Second)
	next.start()
	l := c.waitLeader(c.others(leader)...)
	t.Logf("%v: restarted %s; quorum back, leader %s", time.Since(start).Round(10*time.Millisecond), next.name, l.name)

	var r result
	select {
	case r = <-waited:
	case <-time.After(70 * time.Second):
		t.Fatal("unit put --wait did not return")
	}
	t.Logf("%v: unit put --wait exited %d", time.Since(start).Round(10*time.Millisecond), r.code)
	if r.code != 0 { // go on: what the agents did is checked below all the same
		t.Errorf("unit put --wait: exit %d, want 0\n%s", r.code, r.out)
	}
	f.waitRolledOut(v2, 20*time.Second)

	evs := f.readEvents()
	t0 := float64(start.UnixNano()) / 1e9
	for _, ev := range evs {
		what := "start"
		if ev.stop {
			what = "stop"
		}
		t.Logf("%6.2fs: %s %s", ev.at-t0, ev.host, what)
	}
	if last := evs[len(evs)-1]; last.at+healthy < float64(lost.UnixNano())/1e9 {
		t.Fatalf("the rollout was over (last start %.2fs, HealthySec=%d) before the quorum was lost (%.2fs): the test proved nothing",
			last.at-t0, healthy, float64(lost.UnixNano())/1e9-t0)
	}
	stops, starts := perHost(evs)
	want := map[string]int{"h1": 1, "h2": 1, "h3": 1}
	if !reflect.DeepEqual(stops, want) || !reflect.DeepEqual(starts, want) {
		t.Fatalf("want every host stopped and started exactly once for v2; stops %v, starts %v", stops, starts)
	}
	if got := maxDown(evs); got > 1 {
		t.Fatalf("%d hosts down at once, MaxUnavailable=1", got)
	}
	after := f.pids()
	for h, p := range after {
		if p == 0 || p == before[h] {
			t.Fatalf("%s: MainPID %d → %d", h, before[h], p)
		}
	}

	// The killed leader comes back as a follower and catches up.
	leader.start()
	c.waitLeader(c.members...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli := registrytest.RawClient(t, leader.client)
	resp, err := cli.Get(ctx, registry.DefaultPrefix+"/groups/web/units/app.service", clientv3.WithSerializable())
	for err == nil && (len(resp.Kvs) == 0 || string(resp.Kvs[0].Value) != v2) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		resp, err = cli.Get(ctx, registry.DefaultPrefix+"/groups/web/units/app.service", clientv3.WithSerializable())
	}
	if err != nil || len(resp.Kvs) == 0 || string(resp.Kvs[0].Value) != v2 {
		t.Fatalf("the restarted member %s did not catch up: %v", leader.name, err)
	}
	t.Logf("rollout of 3 hosts through a leader kill and a quorum loss: %v", time.Since(start).Round(10*time.Millisecond))
}

// The whole cluster goes away for longer than the agents' lease TTL (3 s)
// and comes back: nothing restarts while it is away or when it returns,
// the agents rejoin under new leases and publish their statuses again, and
// a change made right after it returns is applied (`unit put --wait` exits 0).
func TestClusterAwayLongerThanLeaseTTL(t *testing.T) {
	t.Parallel() // waits on etcd, lease expiry and retries, not the CPU
	const ttl = 3 * time.Second
	c := startEtcdCluster(t, 3)
	f := newClusterFleet(t, c, 2, ttl)
	e := f.hosts[0]
	for _, name := range []string{"same.service", "app.service"} {
		content := helloV1
		if name == "app.service" {
			content = f.unit("/bin/sleep 1000", "HealthySec=0")
		}
		if out, code := e.cli("unit", "put", e.writeUnit(name, content), "--group", "web", "--wait", "--timeout", "30s"); code != 0 {
			t.Fatalf("unit put %s: exit %d\n%s", name, code, out)
		}
	}
	pid := func(h *env, unit string) uint32 { return h.h.MainPID(t, unit) }
	same, app := map[string]uint32{}, map[string]uint32{}
	for _, h := range f.hosts {
		same[h.host], app[h.host] = pid(h, "same.service"), pid(h, "app.service")
	}
	os.Remove(f.events)

	for _, m := range c.members {
		m.kill()
	}
	away := time.Now()
	for time.Since(away) < ttl+2*time.Second {
		for _, h := range f.hosts {
			if p := pid(h, "same.service"); p != same[h.host] {
				t.Fatalf("%s: same.service MainPID %d → %d while etcd was away", h.host, same[h.host], p)
			}
			if p := pid(h, "app.service"); p != app[h.host] {
				t.Fatalf("%s: app.service MainPID %d → %d while etcd was away", h.host, app[h.host], p)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	for _, m := range c.members {
		m.start()
	}
	c.waitLeader(c.members...)
	back := time.Now()
	t.Logf("cluster away %v (lease TTL %v)", back.Sub(away).Round(10*time.Millisecond), ttl)

	v2 := f.unit("/bin/sleep 1001", "HealthySec=0")
	if out, code := e.cli("unit", "put", e.writeUnit("app.service", v2), "--group", "web", "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("unit put right after the cluster returned: exit %d\n%s", code, out)
	}
	t.Logf("change applied on every host %v after the cluster returned", time.Since(back).Round(10*time.Millisecond))

	// Both agents rejoined (their old leases expired with etcd away) and
	// report every unit again; the unchanged one still runs as before.
	eventually(t, "both agents are members again and report both units", func() bool {
		ms, err := f.reg.Members(context.Background())
		if err != nil || len(ms) != 2 {
			return false
		}
		for _, h := range f.hosts {
			st, err := f.reg.Statuses(context.Background(), h.host)
			if err != nil {
				return false
			}
			s := st["same.service"]
			if s.Hash != reconcile.Hash([]byte(helloV1)) || s.ActiveState != "active" || st["app.service"].Hash != reconcile.Hash([]byte(v2)) {
				return false
			}
		}
		return true
	})
	for _, h := range f.hosts {
		if p := pid(h, "same.service"); p != same[h.host] {
			t.Errorf("%s: unchanged same.service restarted: MainPID %d → %d", h.host, same[h.host], p)
		}
		if p := pid(h, "app.service"); p == 0 || p == app[h.host] {
			t.Errorf("%s: app.service not restarted for the change: MainPID %d → %d", h.host, app[h.host], p)
		}
	}
	stops, starts := perHost(f.readEvents())
	want := map[string]int{"h1": 1, "h2": 1}
	if !reflect.DeepEqual(stops, want) || !reflect.DeepEqual(starts, want) {
		t.Errorf("want app.service stopped and started exactly once per host; stops %v, starts %v", stops, starts)
	}
}
