package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentd/agentd/metrics"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/rollout"
	"github.com/agentd/agentd/unitdir"
)

// BenchmarkScale (performance issue, item e): how far one etcd carries
// agentd. One real etcd server process (built from the module this one
// requires, data on disk, fsync on) and N simulated agents in this process.
// Each agent runs the agent's real registry side — followRegistry (dial,
// Join: lease + membership, Watch of its host and group keys), the
// last-known-good snapshot save, a real reconcile.Agent with real unit and
// state directories (tmpfs), status reports through its Session — with one
// etcd client (gRPC connection) of its own, like a real fleet. Only systemd
// is replaced, by scaleSystemd: every call succeeds at once.
//
// Per size: first the raw etcd floor (N plain clientv3 clients, one watch
// each on one prefix; time from a Put until each saw it), then the fleet
// joins and converges on a unit in groups/all (setup), idles (steady-state
// cost: keep-alives, resync passes), and takes ROUNDS group-wide puts of
// new content. For each put and agent: when its watch delivered the
// snapshot, when its fake systemd got the restart (fan-out), and when one
// observer watching <p>/status/ saw its status with the new hash, healthy,
// no job in flight (what `unit put --wait` waits for; the unit has
// HealthySec=0, else verification adds 5 s by design). etcd's CPU comes
// from /proc/<pid>/stat, its RSS from /proc/<pid>/status; the test
// process's CPU (the simulated agents and the observer) is shown beside it,
// since both share the machine.
//
//	go test ./cmd/agentd -run '^$' -bench Scale -benchtime 1x -timeout 60m
//
// Settings: AGENTD_BENCH_AGENTS (sizes, default 100,500,1000,2000,5000),
// AGENTD_BENCH_ROUNDS (puts per size, default 3), AGENTD_BENCH_IDLE
// (steady-state window, default 10s), AGENTD_BENCH_JOIN_PARALLEL (agents
// joining at once during setup, default 64). It raises RLIMIT_NOFILE
// (about 5 descriptors per agent here, one connection per agent in etcd).
func BenchmarkScale(b *testing.B) {
	sizes := benchInts(b, "AGENTD_BENCH_AGENTS", []int{100, 500, 1000, 2000, 5000})
	cfg := scaleConfig{
		rounds:       benchInt(b, "AGENTD_BENCH_ROUNDS", 3),
		idle:         benchDuration(b, "AGENTD_BENCH_IDLE", 10*time.Second),
		joinParallel: benchInt(b, "AGENTD_BENCH_JOIN_PARALLEL", 64),
		floorRounds:  5,
	}
	scaleRaiseNoFile(b, uint64(8*slices.Max(sizes)+4096))
	bin := etcdServerBinary(b)
	var results []scaleResult
	for _, n := range sizes {
		var r scaleResult
		ok := b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			r = runScale(b, bin, n, cfg)
		})
		if r.n > 0 {
			results = append(results, r)
		}
		if !ok {
			fmt.Printf("agents=%d failed: larger sizes skipped\n", n)
			break
		}
	}
	// A parent benchmark's log is not printed: the table goes to stdout.
	fmt.Println(scaleTable(results))
}

type scaleConfig struct {
	rounds, floorRounds int
	idle                time.Duration
	joinParallel        int
}

// scaleResult is one size's figures. Latencies are pooled over all rounds
// (N × rounds samples); CPU per put is the mean over rounds.
type scaleResult struct {
	n int
	// raw etcd floor: Put → each plain watcher has it
	floor       [3]time.Duration // p50, p99, max
	floorCPU    time.Duration    // etcd CPU per floor put
	snap        [3]time.Duration // put → the agent's watch delivered the snapshot
	fan         [3]time.Duration // put → the fake systemd got the restart
	status      [3]time.Duration // put → etcd holds the healthy status with the new hash
	missing     int              // agent×round samples that never came back
	putRTT      time.Duration    // the Put call itself (mean)
	etcdCPU     time.Duration    // per put: put → all statuses back + 1 s
	testCPU     time.Duration    // same window, this process
	otherCPU    time.Duration    // same window, every other process on the machine
	window      time.Duration    // that window (mean)
	statusPuts  float64          // status key puts per agent per put
	proposals   float64          // raft proposals committed per put
	restarts    float64          // restart/start calls per agent per put (want 1)
	reloads     float64          // daemon-reloads per agent per put (want 1)
	setupJoin   time.Duration    // first agent started → all joined
	setupConv   time.Duration    // first agent started → all healthy on v0
	setupEtcd   time.Duration    // etcd CPU during setup
	setupTest   time.Duration    // this process's CPU during setup
	idleEtcd    float64          // etcd CPU share while idle (1 = one core)
	idleTest    float64          // this process's CPU share while idle
	idleOther   float64          // every other process's CPU share while idle
	wait        time.Duration    // an extra put: put → `unit put --wait`'s waitConverged returned
	waitStatus  time.Duration    // that put: put → the last status back
	waitCPU     time.Duration    // that put: this process's CPU (agents + waitConverged)
	idleProps   float64          // raft proposals/s while idle
	idleRPCs    float64          // gRPC requests/s handled by etcd while idle
	idleRenews  float64          // lease renewals/s while idle
	rpcs        float64          // gRPC requests handled per agent per put
	fsyncs      float64          // WAL fsyncs per put
	etcdRSS     int64            // after the puts, bytes
	etcdHWM     int64            // peak, bytes
	testRSS     int64            // this process, after the puts
	watchers    float64          // etcd's watcher gauge with the fleet up
	stopTime    time.Duration    // all agents stopped (leases revoked)
	lkg         bool             // agents saved the last-known-good snapshot (descriptors allowing)
	warnings    int64            // agent log lines at warning or above
	firstWarn   string
	agentErrors int
}

const scaleUnitName = "scale.service"

func scaleUnit(version int) []byte {
	return fmt.Appendf(nil, "[Unit]\nDescription=scale benchmark\n[Service]\nExecStart=/bin/sleep %d\n[X-Agentd]\nHealthySec=0\n", 100000+version)
}

func runScale(b *testing.B, bin string, n int, cfg scaleConfig) scaleResult {
	res := scaleResult{n: n}
	etcd := startScaleEtcd(b, bin)
	ctx := context.Background()

	// 1. The raw floor, before any agent exists.
	res.floor, res.floorCPU = scaleFloor(b, etcd, n, cfg.floorRounds, cfg.joinParallel)

	reg, err := registry.Dial(ctx, registry.Config{Endpoints: []string{etcd.client}, DialTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	target := registry.Target{Group: "all"}
	v0 := scaleUnit(0)
	if _, err := reg.Put(ctx, target, map[string][]byte{scaleUnitName: v0}); err != nil {
		b.Fatal(err)
	}

	// The observer: one plain client watching every status.
	obsCli := scaleClient(b, etcd.client)
	defer obsCli.Close()
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("sim%05d", i)
	}
	obs := newScaleObserver(registry.DefaultPrefix+"/status/", hosts)
	gr, err := obsCli.Get(ctx, registry.DefaultPrefix+"/", clientv3.WithCountOnly())
	if err != nil {
		b.Fatal(err)
	}
	octx, ocancel := context.WithCancel(ctx)
	var owg sync.WaitGroup
	owg.Go(func() { obs.run(octx, obsCli, gr.Header.Revision) })
	defer func() { ocancel(); owg.Wait() }()

	// 2. Setup: every agent joins and converges on v0.
	fleet := newScaleFleet(b, []string{etcd.client}, hosts)
	// Descriptors per agent: its etcd connection and the roots of its unit
	// directory, manifest and last-known-good snapshot. Without room for
	// all four the snapshot save (local disk only) is left out.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < uint64(4*n+2000) {
		fleet.noLKG = true
		b.Logf("agents=%d: RLIMIT_NOFILE %d: agents run without the last-known-good snapshot save", n, lim.Cur)
	}
	res.lkg = !fleet.noLKG
	fleet.want.Store(&v0)
	done := obs.reset(reconcile.Hash(v0))
	e0, s0 := etcd.cpu(), scaleSelfCPU()
	start := time.Now()
	if err := fleet.start(cfg.joinParallel); err != nil {
		b.Fatal(err)
	}
	res.setupJoin = time.Since(start)
	setupTimeout := 2*time.Minute + time.Duration(n)*60*time.Millisecond
	select {
	case <-done:
	case <-time.After(setupTimeout):
		got, _ := obs.progress()
		b.Fatalf("setup: %d of %d agents healthy on v0 after %v (warnings: %d, first: %s)",
			got, n, setupTimeout, fleet.warn.count.Load(), fleet.warn.first())
	}
	res.setupConv = time.Since(start)
	res.setupEtcd, res.setupTest = etcd.cpu()-e0, scaleSelfCPU()-s0
	b.Logf("agents=%d: all joined in %v, all converged in %v", n, res.setupJoin.Round(time.Millisecond), res.setupConv.Round(time.Millisecond))

	// 3. Steady state.
	time.Sleep(2 * time.Second)
	m0, e0, s0, a0 := etcd.metrics(), etcd.cpu(), scaleSelfCPU(), scaleMachineCPU()
	t0 := time.Now()
	time.Sleep(cfg.idle)
	el := time.Since(t0)
	m1 := etcd.metrics()
	e1, s1 := etcd.cpu()-e0, scaleSelfCPU()-s0
	res.idleEtcd = float64(e1) / float64(el)
	res.idleTest = float64(s1) / float64(el)
	res.idleOther = float64(scaleMachineCPU()-a0-e1-s1) / float64(el)
	res.idleProps = (m1["etcd_server_proposals_committed_total"] - m0["etcd_server_proposals_committed_total"]) / el.Seconds()
	res.idleRPCs = (m1["grpc_server_handled_total"] - m0["grpc_server_handled_total"]) / el.Seconds()
	res.idleRenews = (m1["etcd_debugging_lease_renewed_total"] - m0["etcd_debugging_lease_renewed_total"]) / el.Seconds()
	res.watchers = m1["etcd_debugging_mvcc_watcher_total"]

	// 4. Group-wide puts.
	var snaps, fans, stats []time.Duration
	var etcdCPU, testCPU, otherCPU, window, putRTT time.Duration
	var statusPuts, proposals, restarts, reloads, rpcs, fsyncs float64
	roundTimeout := time.Minute + time.Duration(n)*20*time.Millisecond
	rounds := 0
	for b.Loop() {
		for r := range cfg.rounds {
			content := scaleUnit(r + 1 + rounds*cfg.rounds)
			fleet.resetRound(&content)
			done := obs.reset(reconcile.Hash(content))
			m0, e0, s0, a0 := etcd.metrics(), etcd.cpu(), scaleSelfCPU(), scaleMachineCPU()
			start := time.Now()
			if _, err := reg.Put(ctx, target, map[string][]byte{scaleUnitName: content}); err != nil {
				b.Fatal(err)
			}
			putRTT += time.Since(start)
			select {
			case <-done:
			case <-time.After(roundTimeout):
				got, _ := obs.progress()
				b.Errorf("round %d: %d of %d statuses back after %v", r, got, n, roundTimeout)
			}
			time.Sleep(time.Second) // trailing reports land inside the window
			window += time.Since(start)
			e1, s1 := etcd.cpu()-e0, scaleSelfCPU()-s0
			etcdCPU += e1
			testCPU += s1
			otherCPU += scaleMachineCPU() - a0 - e1 - s1
			m1 := etcd.metrics()
			proposals += m1["etcd_server_proposals_committed_total"] - m0["etcd_server_proposals_committed_total"]
			rpcs += (m1["grpc_server_handled_total"] - m0["grpc_server_handled_total"]) / float64(n)
			fsyncs += m1["etcd_disk_wal_fsync_duration_seconds_count"] - m0["etcd_disk_wal_fsync_duration_seconds_count"]
			at, puts := obs.result()
			statusPuts += float64(puts) / float64(n)
			var rmax time.Duration
			for i, a := range fleet.agents {
				st := a.sd.round()
				restarts += float64(st.jobs) / float64(n)
				reloads += float64(st.reloads) / float64(n)
				if sa := a.snapAt.Load(); sa != 0 {
					snaps = append(snaps, time.Unix(0, sa).Sub(start))
				}
				if !st.firstJob.IsZero() {
					fans = append(fans, st.firstJob.Sub(start))
				}
				if at[i].IsZero() {
					res.missing++
					continue
				}
				stats = append(stats, at[i].Sub(start))
				rmax = max(rmax, at[i].Sub(start))
			}
			b.Logf("agents=%d round %d: last status back after %v, etcd CPU %v, test CPU %v, %d status puts",
				n, r, rmax.Round(time.Millisecond), (etcd.cpu() - e0).Round(time.Millisecond), (scaleSelfCPU() - s0).Round(time.Millisecond), puts)
			rounds++
		}
	}
	k := time.Duration(rounds)
	res.etcdCPU, res.testCPU, res.otherCPU, res.window, res.putRTT = etcdCPU/k, testCPU/k, otherCPU/k, window/k, putRTT/k
	res.statusPuts, res.proposals = statusPuts/float64(rounds), proposals/float64(rounds)
	res.restarts, res.reloads = restarts/float64(rounds), reloads/float64(rounds)
	res.rpcs, res.fsyncs = rpcs/float64(rounds), fsyncs/float64(rounds)
	res.snap, res.fan, res.status = scalePcts(snaps), scalePcts(fans), scalePcts(stats)
	// 5. One more put, with what `agentd unit put --group all --wait` runs
	// beside it (waitConverged: Members, then WatchStatuses of every host).
	// Not pooled above: it shares this process's CPU with the agents.
	time.Sleep(time.Second)
	content := scaleUnit(1 << 20)
	fleet.resetRound(&content)
	done = obs.reset(reconcile.Hash(content))
	s0 = scaleSelfCPU()
	start = time.Now()
	putRev, err := reg.Put(ctx, target, map[string][]byte{scaleUnitName: content})
	if err != nil {
		b.Fatal(err)
	}
	werr := waitConverged(ctx, reg, waitSpec{target: target, units: map[string][]byte{scaleUnitName: content}, revision: putRev, waitFlags: waitFlags{timeout: roundTimeout}}, io.Discard)
	res.wait = time.Since(start)
	select {
	case <-done:
	case <-time.After(roundTimeout):
	}
	if at, _ := obs.result(); len(at) > 0 {
		for _, t := range at {
			if !t.IsZero() {
				res.waitStatus = max(res.waitStatus, t.Sub(start))
			}
		}
	}
	res.waitCPU = scaleSelfCPU() - s0
	if werr != nil {
		b.Errorf("waitConverged: %v", werr)
	}

	res.etcdRSS, res.etcdHWM = etcd.rss()
	res.testRSS, _ = scaleProcMem("self")

	t0 = time.Now()
	res.agentErrors = fleet.stop()
	res.stopTime = time.Since(t0)
	res.warnings, res.firstWarn = fleet.warn.count.Load(), fleet.warn.first()

	b.ReportMetric(scaleMS(res.floor[1]), "floor-p99-ms")
	b.ReportMetric(scaleMS(res.fan[0]), "fanout-p50-ms")
	b.ReportMetric(scaleMS(res.fan[1]), "fanout-p99-ms")
	b.ReportMetric(scaleMS(res.status[1]), "status-p99-ms")
	b.ReportMetric(scaleMS(res.status[2]), "status-max-ms")
	b.ReportMetric(res.etcdCPU.Seconds(), "etcd-cpu-s/put")
	b.ReportMetric(float64(res.etcdHWM)/(1<<20), "etcd-peak-MiB")
	b.ReportMetric(res.setupConv.Seconds(), "setup-s")
	b.Log("\n" + scaleTable([]scaleResult{res}))
	if res.missing > 0 {
		b.Errorf("%d agent×round statuses never came back", res.missing)
	}
	if res.agentErrors > 0 {
		b.Errorf("%d agents ended with an error", res.agentErrors)
	}
	return res
}

func scalePcts(d []time.Duration) [3]time.Duration {
	if len(d) == 0 {
		return [3]time.Duration{}
	}
	return [3]time.Duration{percentile(d, 0.50), percentile(d, 0.99), slices.Max(d)}
}

func scaleMS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func scaleTable(rs []scaleResult) string {
	var w strings.Builder
	f := func(d time.Duration) string { return strconv.FormatFloat(scaleMS(d), 'f', 0, 64) }
	fmt.Fprintf(&w, "%6s | %-11s | %-11s | %-11s | %-15s | %-8s | %-9s | %-9s | %-8s %-8s | %-7s | %-10s %-9s %-7s | %-8s %-8s | %s\n",
		"agents", "floor p50/99", "watch p50/99", "fan p50/99", "status p50/99/max", "etcd cpu", "test cpu", "st puts", "etcd RSS", "peak", "test RSS",
		"setup", "setupCPU", "", "idle etcd", "idle test", "notes")
	fmt.Fprintf(&w, "%6s | %-12s | %-12s | %-11s | %-17s | %-8s | %-9s | %-9s | %-8s %-8s | %-7s | %-10s %-9s %-7s | %-8s %-8s |\n",
		"", "ms", "ms", "ms", "ms", "s/put", "s/put", "/agent", "MiB", "MiB", "MiB", "join/conv s", "etcd s", "test s", "cores", "cores")
	for _, r := range rs {
		notes := fmt.Sprintf("floor etcd CPU %.3fs/put; per put: restarts/agent %.2f, reloads/agent %.2f, etcd RPCs/agent %.1f, proposals %.0f, WAL fsyncs %.0f, "+
			"Put call %sms, window %v, other processes' CPU %.2fs; watchers %.0f; idle: RPCs/s %.0f, lease renewals/s %.0f, proposals/s %.1f, other processes %.2f cores; "+
			"put --wait: returned after %v (last status %v, this process's CPU %.2fs); stop %v",
			r.floorCPU.Seconds(), r.restarts, r.reloads, r.rpcs, r.proposals, r.fsyncs, f(r.putRTT), r.window.Round(time.Millisecond), r.otherCPU.Seconds(),
			r.watchers, r.idleRPCs, r.idleRenews, r.idleProps, r.idleOther,
			r.wait.Round(time.Millisecond), r.waitStatus.Round(time.Millisecond), r.waitCPU.Seconds(), r.stopTime.Round(time.Millisecond))
		if !r.lkg {
			notes += ", without the last-known-good snapshot save (descriptor limit)"
		}
		if r.missing > 0 {
			notes += fmt.Sprintf(", MISSING %d", r.missing)
		}
		if r.warnings > 0 {
			notes += fmt.Sprintf(", %d warnings (first: %s)", r.warnings, r.firstWarn)
		}
		fmt.Fprintf(&w, "%6d | %5s/%-6s | %5s/%-6s | %5s/%-5s | %5s/%5s/%-5s | %8.2f | %9.2f | %9.1f | %8.0f %8.0f | %7.0f | %4.1f/%-5.1f %9.2f %7.2f | %8.3f %8.3f | %s\n",
			r.n, f(r.floor[0]), f(r.floor[1]), f(r.snap[0]), f(r.snap[1]), f(r.fan[0]), f(r.fan[1]),
			f(r.status[0]), f(r.status[1]), f(r.status[2]), r.etcdCPU.Seconds(), r.testCPU.Seconds(), r.statusPuts,
			float64(r.etcdRSS)/(1<<20), float64(r.etcdHWM)/(1<<20), float64(r.testRSS)/(1<<20),
			r.setupJoin.Seconds(), r.setupConv.Seconds(), r.setupEtcd.Seconds(), r.setupTest.Seconds(),
			r.idleEtcd, r.idleTest, notes)
	}
	fmt.Fprintf(&w, "floor: N plain clientv3 clients, one watch each, Put → seen; watch: put → the agent's registry.Watch delivered the snapshot;\n"+
		"fan: put → the fake systemd got the restart; status: put → the observer saw the healthy status with the new hash.\n"+
		"CPU per put: etcd process and this process, from the put until all statuses are back + 1 s.")
	return w.String()
}

// ---- the simulated fleet ----

type scaleFleet struct {
	tb        testing.TB
	root      string
	endpoints []string
	hosts     []string
	met       *metrics.Metrics
	log       *slog.Logger
	warn      *scaleWarnCounter
	want      atomic.Pointer[[]byte] // the content whose snapshot arrival is timed
	agents    []*scaleAgent
	stopped   bool
	noLKG     bool // no last-known-good snapshot save (saves a descriptor per agent)
	rollouts  bool // each agent takes its part in rollouts (rolloutHand), as agentd run does
	// proxy, when set, stands between the first agent and etcd (started
	// first, it is elected the group's coordinator): cutting it is that
	// agent killed, as far as etcd and the other agents can tell.
	proxy     *cutProxy
	proxyHost string
	// events counts the snapshots the agents received (each a batch of
	// watch events): per agent per rollout, the O(1) claim.
	events atomic.Int64
}

type scaleAgent struct {
	host   string
	sd     *scaleSystemd
	snapAt atomic.Int64 // unix ns: first snapshot holding the wanted content since the reset
	// lastRev and lastKnown are the last snapshot's revision and how far
	// its rollouts were known (a stuck agent says which held it).
	lastRev, lastKnown atomic.Int64
	cancel             context.CancelFunc
	wg                 sync.WaitGroup
	closers            []io.Closer
	mu                 sync.Mutex
	err                error
}

func newScaleFleet(tb testing.TB, endpoints, hosts []string) *scaleFleet {
	base := "/dev/shm"
	if st, err := os.Stat(base); err != nil || !st.IsDir() {
		base = os.TempDir()
	}
	root, err := os.MkdirTemp(base, "agentd-scale-")
	if err != nil {
		tb.Fatal(err)
	}
	w := &scaleWarnCounter{}
	f := &scaleFleet{
		tb: tb, root: root, endpoints: endpoints, hosts: hosts,
		met:  metrics.New(version),
		warn: w,
		log:  slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	tb.Cleanup(func() {
		f.stop()
		os.RemoveAll(root)
	})
	return f
}

// start starts every agent, at most parallel of them joining at once, and
// returns once all have joined (or one failed to).
func (f *scaleFleet) start(parallel int) error {
	if f.proxy != nil {
		// The first agent alone first: the oldest candidate coordinates.
		first := make(chan struct{})
		var once sync.Once
		f.proxyHost = f.hosts[0]
		a, err := f.startAgent(f.hosts[0], func() { once.Do(func() { close(first) }) })
		if err != nil {
			return err
		}
		f.agents = append(f.agents, a)
		<-first
		time.Sleep(time.Second) // its campaign
		hosts := f.hosts
		f.hosts = f.hosts[1:]
		defer func() { f.hosts = hosts }()
	}
	sem := make(chan struct{}, parallel)
	for _, h := range f.hosts {
		sem <- struct{}{}
		var once sync.Once
		joined := func() { once.Do(func() { <-sem }) }
		a, err := f.startAgent(h, joined)
		if err != nil {
			return err
		}
		f.agents = append(f.agents, a)
	}
	for range parallel {
		sem <- struct{}{}
	}
	for _, a := range f.agents {
		a.mu.Lock()
		err := a.err
		a.mu.Unlock()
		if err != nil {
			return fmt.Errorf("agent %s: %w", a.host, err)
		}
	}
	return nil
}

// startAgent wires one agent as runAgent does, with scaleSystemd for
// systemd and without the debug socket, metrics listener, fsnotify watch of
// the unit directory and the notify protocol (none of them touch etcd).
func (f *scaleFleet) startAgent(host string, joined func()) (*scaleAgent, error) {
	a := &scaleAgent{host: host, sd: newScaleSystemd()}
	dir := filepath.Join(f.root, host)
	stateDir := filepath.Join(dir, "state")
	files, err := unitdir.Open(filepath.Join(dir, "units"))
	if err != nil {
		return nil, err
	}
	a.closers = append(a.closers, files)
	manifest, err := unitdir.OpenManifest(stateDir)
	if err != nil {
		return nil, errors.Join(err, a.close())
	}
	a.closers = append(a.closers, manifest)
	o := &runOptions{
		etcd:   etcdFlags{prefix: registry.DefaultPrefix, timeout: 5 * time.Second},
		host:   host,
		groups: []string{"all"},
		// the flag's default
		leaseTTL: 15 * time.Second,
	}
	log := f.log.With("host", host)
	var lkg *lastKnownGood
	if !f.noLKG {
		if lkg, err = openLastKnownGood(stateDir, host, o.etcd.prefix, o.groups, log); err != nil {
			return nil, errors.Join(err, a.close())
		}
		a.closers = append(a.closers, lkg)
	}
	svc := newService(log)
	svc.notify = func(string) {} // never talk to a service manager from a benchmark
	reporter := &sessionReporter{svc: svc, met: f.met}
	observer := multiObserver{svc, f.met}
	var hand *rollout.Participant
	var coord *rollout.Coordinator
	if f.rollouts {
		hand = rollout.NewParticipant(host, log, sessionHostPort(reporter), nil)
		observer = append(observer, hand)
		// Every agent stands for coordinator, as `agentd run` does.
		coord = rollout.NewCoordinator("all", log, sessionElector{reporter.current}.elector)
	}
	agent := reconcile.New(reconcile.Config{
		Systemd:           loopSystemd{Systemd: reconcile.PlainSystemd(a.sd), met: f.met},
		Files:             files,
		Manifest:          manifest,
		Reporter:          reporter,
		Coordinator:       sessionCoordinator{reporter},
		Log:               log,
		Observer:          observer,
		HeartbeatInterval: svc.heartbeatInterval(),
	})
	onSnapshot := func(rs registry.Snapshot) {
		f.events.Add(1)
		a.lastRev.Store(rs.Revision)
		a.lastKnown.Store(rs.Rollouts.KnownUpTo)
		s := rs.Snapshot
		if hand != nil {
			var handOn bool
			if s, handOn = hand.Overlay(rs.Snapshot, rs.Rollouts); !handOn {
				return
			}
		}
		if a.snapAt.Load() == 0 {
			if want := f.want.Load(); want != nil && slices.ContainsFunc(s.Entries, func(e reconcile.Entry) bool {
				return e.Unit == scaleUnitName && bytes.Equal(e.Value, *want)
			}) {
				a.snapAt.CompareAndSwap(0, time.Now().UnixNano())
			}
		}
		f.met.SnapshotReceived(s.Revision)
		svc.setOffline("")
		if lkg == nil {
			agent.SetSnapshot(s)
			return
		}
		lkg.received(s, agent.SetSnapshot)
	}
	poke := func(u string) {
		joined()
		agent.UnitChanged(u)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	fail := func(err error) {
		if err != nil && ctx.Err() == nil {
			a.mu.Lock()
			a.err = err
			a.mu.Unlock()
		}
	}
	a.wg.Go(func() { fail(agent.Run(ctx)) })
	if hand != nil {
		a.wg.Go(func() { hand.Run(ctx) })
		a.wg.Go(func() { coord.Run(ctx) })
	}
	a.wg.Go(func() {
		defer joined() // a failed join frees its slot too
		endpoints := f.endpoints
		if f.proxy != nil && host == f.proxyHost {
			endpoints = []string{f.proxy.addr()}
		}
		fail(followRegistry(ctx, o, endpoints, log, reporter, f.met, onSnapshot, poke))
	})
	return a, nil
}

// cutProxy forwards TCP connections to one address until cut: then it
// closes every connection and refuses new ones (a host gone, with no
// goodbye: no lease revoked, no election resigned).
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut_   bool
}

func newCutProxy(tb testing.TB, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: strings.TrimPrefix(target, "http://")}
	go p.serve()
	tb.Cleanup(p.cut)
	return p
}

func (p *cutProxy) addr() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		p.mu.Lock()
		if err != nil || p.cut_ {
			p.mu.Unlock()
			c.Close()
			if u != nil {
				u.Close()
			}
			continue
		}
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(u, c); u.Close() }()
		go func() { _, _ = io.Copy(c, u); c.Close() }()
	}
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut_ = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

func (a *scaleAgent) close() error {
	var errs []error
	for _, c := range slices.Backward(a.closers) {
		errs = append(errs, c.Close())
	}
	a.closers = nil
	return errors.Join(errs...)
}

func (f *scaleFleet) resetRound(content *[]byte) {
	for _, a := range f.agents {
		a.sd.reset()
		a.snapAt.Store(0)
	}
	f.want.Store(content)
}

// stop stops every agent by its own handle (each revokes its lease on the
// way out) and returns how many had ended with an error.
func (f *scaleFleet) stop() int {
	if f.stopped {
		return 0
	}
	f.stopped = true
	for _, a := range f.agents {
		a.cancel()
	}
	failed := 0
	for _, a := range f.agents {
		a.wg.Wait()
		if err := a.close(); err != nil {
			f.tb.Logf("agent %s: close: %v", a.host, err)
		}
		if a.err != nil {
			failed++
			if failed <= 5 {
				f.tb.Logf("agent %s: %v", a.host, a.err)
			}
		}
	}
	return failed
}

// scaleWarnCounter counts the agents' log lines (warnings and worse) and keeps
// the first.
type scaleWarnCounter struct {
	count atomic.Int64
	mu    sync.Mutex
	line  string
}

func (w *scaleWarnCounter) Write(p []byte) (int, error) {
	if w.count.Add(1) == 1 {
		w.mu.Lock()
		w.line = strings.TrimSpace(string(p))
		w.mu.Unlock()
	}
	return len(p), nil
}

func (w *scaleWarnCounter) first() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.line
}

// scaleSystemd is reconcile.Systemd for a simulated host: every call
// succeeds at once, a started unit is active (running); it counts reloads
// and jobs and records when the first start/restart of a round came.
type scaleSystemd struct {
	mu      sync.Mutex
	active  map[string]bool
	ran     map[string]bool
	entered map[string]uint64 // ActiveEnterMono
	cur     scaleSDRound
}

type scaleSDRound struct {
	reloads, jobs int
	firstJob      time.Time
}

func newScaleSystemd() *scaleSystemd {
	return &scaleSystemd{active: map[string]bool{}, ran: map[string]bool{}, entered: map[string]uint64{}}
}

var scaleMonoBase = time.Now()

func (f *scaleSystemd) up(u string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active[u], f.ran[u] = true, true
	f.entered[u] = uint64(time.Since(scaleMonoBase).Microseconds()) + 1
	f.cur.jobs++
	if f.cur.firstJob.IsZero() {
		f.cur.firstJob = time.Now()
	}
}

func (f *scaleSystemd) reset() {
	f.mu.Lock()
	f.cur = scaleSDRound{}
	f.mu.Unlock()
}

func (f *scaleSystemd) round() scaleSDRound {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cur
}

func (f *scaleSystemd) Reload(context.Context) error {
	f.mu.Lock()
	f.cur.reloads++
	f.mu.Unlock()
	return nil
}
func (f *scaleSystemd) Start(_ context.Context, u string) error   { f.up(u); return nil }
func (f *scaleSystemd) Restart(_ context.Context, u string) error { f.up(u); return nil }
func (f *scaleSystemd) Stop(_ context.Context, u string) error {
	f.mu.Lock()
	f.active[u] = false
	f.mu.Unlock()
	return nil
}
func (f *scaleSystemd) ReloadUnit(context.Context, string) error  { return nil }
func (f *scaleSystemd) Enable(context.Context, ...string) error   { return nil }
func (f *scaleSystemd) Disable(context.Context, ...string) error  { return nil }
func (f *scaleSystemd) ResetFailed(context.Context, string) error { return nil }
func (f *scaleSystemd) State(_ context.Context, u string) (reconcile.UnitState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := reconcile.UnitState{LoadState: "loaded", Type: "simple", UnitFileState: "static", Ran: f.ran[u],
		ActiveState: "inactive", SubState: "dead", TimeoutStartUSec: 90e6, TimeoutStopUSec: 90e6}
	if f.active[u] {
		st.ActiveState, st.SubState, st.MainPID = "active", "running", 4242
		st.ActiveEnterMono, st.InactiveExitMono = f.entered[u], f.entered[u]
	}
	return st, nil
}

// ---- the status observer ----

// scaleObserver watches <p>/status/ and records, per host, when a status
// with the wanted hash, healthy and without a job, first arrived.
type scaleObserver struct {
	root  string
	index map[string]int

	mu   sync.Mutex
	want string
	at   []time.Time
	got  int
	puts int
	done chan struct{}
}

func newScaleObserver(root string, hosts []string) *scaleObserver {
	o := &scaleObserver{root: root, index: map[string]int{}}
	for i, h := range hosts {
		o.index[h] = i
	}
	return o
}

func (o *scaleObserver) reset(hash string) <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.want, o.at, o.got, o.puts = hash, make([]time.Time, len(o.index)), 0, 0
	o.done = make(chan struct{})
	return o.done
}

func (o *scaleObserver) progress() (got, puts int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.got, o.puts
}

func (o *scaleObserver) result() ([]time.Time, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.at), o.puts
}

func (o *scaleObserver) run(ctx context.Context, cli *clientv3.Client, rev int64) {
	for resp := range cli.Watch(ctx, o.root, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if resp.Err() != nil {
			return
		}
		now := time.Now()
		o.mu.Lock()
		for _, ev := range resp.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			o.puts++
			host, _, _ := strings.Cut(strings.TrimPrefix(string(ev.Kv.Key), o.root), "/")
			i, ok := o.index[host]
			if !ok || o.at == nil || !o.at[i].IsZero() {
				continue
			}
			var st reconcile.Status
			if json.Unmarshal(ev.Kv.Value, &st) != nil {
				continue
			}
			if st.Hash == o.want && st.DesiredHash == o.want && st.Job == "" && st.Error == "" &&
				st.Health == "healthy" && st.ActiveState == "active" {
				o.at[i] = now
				if o.got++; o.got == len(o.at) {
					close(o.done)
				}
			}
		}
		o.mu.Unlock()
	}
}

// ---- the raw floor ----

// scaleFloor: n plain clients, one watch each on one prefix; for each of
// rounds Puts, the time until each watcher had it. Returns p50/p99/max
// and etcd's CPU per put.
func scaleFloor(b *testing.B, etcd *scaleEtcd, n, rounds, parallel int) ([3]time.Duration, time.Duration) {
	const prefix = "/bench-floor/"
	ctx, cancel := context.WithCancel(context.Background())
	clients := make([]*clientv3.Client, n)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		var cw sync.WaitGroup
		for _, c := range clients {
			if c != nil {
				cw.Go(func() { c.Close() })
			}
		}
		cw.Wait()
	}()
	got := make([][]time.Time, rounds)
	seen := make([]sync.WaitGroup, rounds)
	for r := range rounds {
		got[r] = make([]time.Time, n)
		seen[r].Add(n)
	}
	sem := make(chan struct{}, parallel)
	errs := make(chan error, n)
	var dial sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		dial.Go(func() {
			defer func() { <-sem }()
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.client}, DialTimeout: 30 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				errs <- err
				return
			}
			clients[i] = cli
			ch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
			if resp, ok := <-ch; !ok || !resp.Created {
				errs <- fmt.Errorf("floor watcher %d: not created: %v", i, resp.Err())
				return
			}
			wg.Go(func() {
				for resp := range ch {
					now := time.Now()
					for _, ev := range resp.Events {
						r, err := strconv.Atoi(string(ev.Kv.Value))
						if err == nil && r >= 0 && r < rounds && got[r][i].IsZero() {
							got[r][i] = now
							seen[r].Done()
						}
					}
				}
			})
		})
	}
	dial.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	var lat []time.Duration
	var cpu time.Duration
	for r := range rounds {
		e0 := etcd.cpu()
		start := time.Now()
		if _, err := clients[0].Put(ctx, prefix+"k", strconv.Itoa(r)); err != nil {
			b.Fatal(err)
		}
		all := make(chan struct{})
		go func() { seen[r].Wait(); close(all) }()
		select {
		case <-all:
		case <-time.After(time.Minute):
			b.Fatalf("floor round %d: not every watcher saw the put within a minute", r)
		}
		time.Sleep(200 * time.Millisecond)
		cpu += etcd.cpu() - e0
		for i := range n {
			lat = append(lat, got[r][i].Sub(start))
		}
	}
	return scalePcts(lat), cpu / time.Duration(rounds)
}

// ---- the etcd server process ----

type scaleEtcd struct {
	tb     testing.TB
	cmd    *exec.Cmd
	exited chan struct{}
	client string
	dir    string
}

// startScaleEtcd starts a single-member etcd with its defaults (fsync on,
// data on disk under $TMPDIR) on two free loopback ports, and kills it by
// its PID at cleanup.
func startScaleEtcd(tb testing.TB, bin string) *scaleEtcd {
	tb.Helper()
	dir, err := os.MkdirTemp("", "agentd-scale-etcd-")
	if err != nil {
		tb.Fatal(err)
	}
	port := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	e := &scaleEtcd{tb: tb, dir: dir, client: fmt.Sprintf("http://127.0.0.1:%d", port()), exited: make(chan struct{})}
	peer := fmt.Sprintf("http://127.0.0.1:%d", port())
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	e.cmd = exec.Command(bin, "--name", "s1", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", e.client, "--advertise-client-urls", e.client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "s1="+peer, "--log-level", "warn")
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	if err := e.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		tb.Fatal(err)
	}
	go func() { e.cmd.Wait(); close(e.exited) }()
	tb.Cleanup(e.stop)
	cli := scaleClient(tb, e.client)
	defer cli.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "health")
		cancel()
		if err == nil {
			return e
		}
		select {
		case <-e.exited:
			tb.Fatalf("etcd exited:\n%s", tail(filepath.Join(dir, "etcd.log"), 20))
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("etcd not ready within 30s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *scaleEtcd) stop() {
	select {
	case <-e.exited:
	default:
		e.cmd.Process.Kill()
		<-e.exited
	}
	os.RemoveAll(e.dir)
}

// scaleClient dials a bare client to a scale test's etcd, which may take
// longer to answer than a test's.
func scaleClient(tb testing.TB, endpoint string) *clientv3.Client {
	tb.Helper()
	return registrytest.RawClientConfig(tb, clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second})
}

// cpu is the CPU time etcd used so far (user + system, from
// /proc/<pid>/stat, in clock ticks of 10 ms).
func (e *scaleEtcd) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", e.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64) // field 14
	st, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// rss: etcd's resident set now and its peak, in bytes.
func (e *scaleEtcd) rss() (now, peak int64) { return scaleProcMem(strconv.Itoa(e.cmd.Process.Pid)) }

func scaleProcMem(pid string) (rss, hwm int64) {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			hwm = kb << 10
		}
	}
	return rss, hwm
}

// metrics scrapes etcd's /metrics: every sample summed by metric name.
func (e *scaleEtcd) metrics() map[string]float64 { return scrapeMetrics(e.client) }

// scrapeMetrics reads base+"/metrics" (Prometheus' text format): every
// sample summed by metric name; empty when nothing answers there.
func scrapeMetrics(base string) map[string]float64 {
	out := map[string]float64{}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(base + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name := line[:i]
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name = name[:j]
		}
		out[name] += v
	}
	return out
}

// scaleMachineCPU is the CPU time every process on the machine used so far
// (the first line of /proc/stat, less idle and iowait; ticks of 10 ms).
func scaleMachineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is already in user
			continue
		}
		busy += n
	}
	return time.Duration(busy) * 10 * time.Millisecond
}

// scaleSelfCPU is this process's CPU time so far (user + system).
func scaleSelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// scaleRaiseNoFile raises RLIMIT_NOFILE to at least want (as root, the hard
// limit too; else up to the hard limit). etcd, started later, inherits it.
func scaleRaiseNoFile(tb testing.TB, want uint64) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		tb.Fatal(err)
	}
	if lim.Cur >= want {
		return
	}
	nl := syscall.Rlimit{Cur: want, Max: max(lim.Max, want)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &nl); err != nil {
		nl = syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &nl); err != nil {
			tb.Fatal(err)
		}
		tb.Logf("RLIMIT_NOFILE %d (wanted %d): larger sizes may run out of descriptors", lim.Max, want)
	}
}
