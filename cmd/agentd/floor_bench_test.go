package main

// Baselines and instruments for the benchmarks in perf_bench_test.go:
//
//   - runFloor, the floor: a minimal program that watches etcd, writes the
//     unit files and calls Reload and RestartUnit over D-Bus (go-systemd),
//     one reload per event or one per watch response;
//   - versionLog, which sees a restarted unit ITSELF report the version it
//     runs (its ExecStart appends "<unit> <version>" to a file);
//   - raw etcd writes, identical for the agent and the floor;
//   - per-process CPU, context switches, RSS (/proc) and a D-Bus monitor.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/fsnotify/fsnotify"
	godbus "github.com/godbus/dbus/v5"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/systemd"
)

// --- sizes from the environment ---

// benchInts reads a comma-separated list of sizes from env (default def).
func benchInts(tb testing.TB, env string, def []int) []int {
	tb.Helper()
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			tb.Fatalf("%s=%q: want positive integers separated by commas", env, v)
		}
		out = append(out, n)
	}
	return out
}

func benchInt(tb testing.TB, env string, def int) int {
	tb.Helper()
	return benchInts(tb, env, []int{def})[0]
}

func benchDuration(tb testing.TB, env string, def time.Duration) time.Duration {
	tb.Helper()
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		tb.Fatalf("%s=%q: want a duration such as 60s", env, v)
	}
	return d
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// --- the units ---

// perfUnitName is the i-th unit of a benchmark.
func perfUnitName(i int) string { return fmt.Sprintf("p%04d.service", i) }

// perfUnit is a long-running service that, once started, appends
// "<unit> <version>" to logPath: the unit itself says which version runs.
// The [X-Agentd] section (HealthySec=0) is ignored by systemd, so the
// agent and the floor run byte-identical files. AGENTD_BENCH_INSTALL=1
// gives it an [Install] section (WantedBy=default.target), as most units
// have: the agent then enables it, the floor does not.
func perfUnit(logPath, version string) []byte {
	install := ""
	if os.Getenv("AGENTD_BENCH_INSTALL") == "1" {
		install = "[Install]\nWantedBy=default.target\n"
	}
	return fmt.Appendf(nil, "[Service]\nType=exec\nExecStart=/bin/sh -c 'echo %%n %s >> %s; exec sleep infinity'\n%s%s",
		version, logPath, install, fast)
}

// --- versionLog: what the units say they run ---

// versionLog follows the file the perfUnits append to (inotify, plus a
// slow poll as a safety net) and records, per unit, the newest version
// it logged and when that line was read.
type versionLog struct {
	path    string
	f       *os.File
	w       *fsnotify.Watcher
	rest    []byte // an incomplete last line
	mu      sync.Mutex
	seen    map[string]seenVersion
	changed chan struct{} // closed and replaced when seen changes
	done    chan struct{}
}

type seenVersion struct {
	version string
	at      time.Time
}

// newVersionLog creates path (empty, writable by the units) and follows it
// until the test ends.
func newVersionLog(tb testing.TB, path string) *versionLog {
	tb.Helper()
	if err := os.WriteFile(path, nil, 0o666); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		f.Close()
		tb.Fatal(err)
	}
	if err := w.Add(path); err != nil {
		w.Close()
		f.Close()
		tb.Fatal(err)
	}
	vl := &versionLog{path: path, f: f, w: w, seen: map[string]seenVersion{},
		changed: make(chan struct{}), done: make(chan struct{})}
	go vl.follow()
	tb.Cleanup(func() {
		w.Close() // ends follow
		<-vl.done
		f.Close()
	})
	return vl
}

func (vl *versionLog) follow() {
	defer close(vl.done)
	poll := time.NewTicker(200 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case _, ok := <-vl.w.Events:
			if !ok {
				return
			}
		case _, ok := <-vl.w.Errors: // e.g. queue overflow: read anyway
			if !ok {
				return
			}
		case <-poll.C:
		}
		vl.read()
	}
}

// read consumes what was appended since the last read.
func (vl *versionLog) read() {
	var buf [64 << 10]byte
	now := time.Now()
	for {
		n, err := vl.f.Read(buf[:])
		vl.rest = append(vl.rest, buf[:n]...)
		if n == 0 || err != nil {
			break
		}
	}
	end := bytes.LastIndexByte(vl.rest, '\n')
	if end < 0 {
		return
	}
	lines := string(vl.rest[:end])
	vl.rest = append(vl.rest[:0], vl.rest[end+1:]...)
	vl.mu.Lock()
	defer vl.mu.Unlock()
	for line := range strings.SplitSeq(lines, "\n") {
		if unit, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			vl.seen[unit] = seenVersion{version: v, at: now}
		}
	}
	close(vl.changed)
	vl.changed = make(chan struct{})
}

// wait blocks until every unit of want (unit → version) has logged that
// version, and returns when the last of those lines was read.
func (vl *versionLog) wait(ctx context.Context, want map[string]string) (time.Time, error) {
	for {
		vl.mu.Lock()
		var last time.Time
		missing := 0
		for u, v := range want {
			s, ok := vl.seen[u]
			if !ok || s.version != v {
				missing++
				continue
			}
			if s.at.After(last) {
				last = s.at
			}
		}
		ch := vl.changed
		vl.mu.Unlock()
		if missing == 0 {
			return last, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%d of %d units did not log their new version: %w", missing, len(want), ctx.Err())
		}
	}
}

// --- etcd writes, the same for every system ---

// unitKey is the registry key of a host's unit.
func unitKey(host, unit string) string {
	return registry.DefaultPrefix + "/hosts/" + host + "/units/" + unit
}

// putTxn writes kvs (key → value) in one etcd transaction. It writes the
// unit keys only, no history records: registry.Put adds two operations
// per unit, so 1,000 units would not fit etcd's 1,024 operations per
// transaction, and its read of the prefix would be measured too.
func putTxn(ctx context.Context, cli *clientv3.Client, kvs map[string][]byte) error {
	ops := make([]clientv3.Op, 0, len(kvs))
	for _, k := range slices.Sorted(maps.Keys(kvs)) {
		ops = append(ops, clientv3.OpPut(k, string(kvs[k])))
	}
	_, err := cli.Txn(ctx).Then(ops...).Commit()
	return err
}

// putConcurrent writes each of kvs with a put of its own, all at once.
func putConcurrent(ctx context.Context, cli *clientv3.Client, kvs map[string][]byte) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(kvs))
	for k, v := range kvs {
		wg.Go(func() {
			if _, err := cli.Put(ctx, k, string(v)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// --- the floor ---

// floorConfig says what a floor watches and manages. It is passed as JSON
// to a floor running as a process of its own (TestPerfFloorHelperProcess).
type floorConfig struct {
	Endpoint string // etcd
	Prefix   string // watched prefix: <Prefix><unit name> holds the unit file
	UnitDir  string
	Bus      string // D-Bus address of the user manager's bus
	Batch    bool   // one daemon-reload per watch response (and those queued behind it); else one per event
	NoFsync  bool   // plain writes: no fsync of the files and the directory
}

// runFloor is the floor: it reads Prefix, applies everything in it as one
// batch (write, Reload, RestartUnit each, wait for the jobs), calls ready,
// then watches Prefix and applies each watch response together with those
// already queued behind it (Batch), or each event on its own. (Without the
// queued ones, 1,000 concurrent puts cost the batch floor 1,000 reloads of
// 0.5 s each.) Deletes are ignored. It returns ctx.Err() when ctx ends, or
// the first error.
func runFloor(ctx context.Context, c floorConfig, ready func()) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), Context: ctx})
	if err != nil {
		return err
	}
	defer cli.Close()
	sd, err := systemd.Connect(ctx, systemd.AddressDialer(c.Bus))
	if err != nil {
		return err
	}
	defer sd.Close()
	resp, err := cli.Get(ctx, c.Prefix, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	if err := floorApply(ctx, sd, c, resp.Kvs); err != nil {
		return err
	}
	ready()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch := cli.Watch(wctx, c.Prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range watch {
		if ctx.Err() != nil {
			break
		}
		if err := wr.Err(); err != nil {
			return err
		}
		var kvs []*mvccpb.KeyValue
		add := func(wr clientv3.WatchResponse) {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					kvs = append(kvs, ev.Kv)
				}
			}
		}
		add(wr)
		if c.Batch {
			// Also the responses already queued (separate puts that came
			// in while the last batch was applied), without waiting for
			// more: one reload for all of them.
		drain:
			for {
				select {
				case more, ok := <-watch:
					if !ok {
						break drain // the next receive ends the loop
					}
					if err := more.Err(); err != nil {
						return err
					}
					add(more)
				default:
					break drain
				}
			}
			kvs = latestPerKey(kvs)
		}
		if c.Batch {
			err = floorApply(ctx, sd, c, kvs)
		} else {
			for _, kv := range kvs {
				if err = floorApply(ctx, sd, c, []*mvccpb.KeyValue{kv}); err != nil {
					break
				}
			}
		}
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}

// latestPerKey keeps the newest of kvs for each key, in first-seen order.
func latestPerKey(kvs []*mvccpb.KeyValue) []*mvccpb.KeyValue {
	idx := map[string]int{}
	var out []*mvccpb.KeyValue
	for _, kv := range kvs {
		if i, ok := idx[string(kv.Key)]; ok {
			out[i] = kv
			continue
		}
		idx[string(kv.Key)] = len(out)
		out = append(out, kv)
	}
	return out
}

// floorApply writes kvs' files, does one daemon-reload and restarts each
// unit, waiting for every job.
func floorApply(ctx context.Context, sd *sddbus.Conn, c floorConfig, kvs []*mvccpb.KeyValue) error {
	if len(kvs) == 0 {
		return nil
	}
	names := make([]string, len(kvs))
	for i, kv := range kvs {
		names[i] = strings.TrimPrefix(string(kv.Key), c.Prefix)
		if err := floorWrite(c.UnitDir, names[i], kv.Value, !c.NoFsync); err != nil {
			return err
		}
	}
	if !c.NoFsync {
		if err := syncDir(c.UnitDir); err != nil {
			return err
		}
	}
	return reloadRestart(ctx, sd, names)
}

// reloadRestart does one daemon-reload, then restarts names concurrently
// and waits for every job.
func reloadRestart(ctx context.Context, sd *sddbus.Conn, names []string) error {
	if err := sd.ReloadContext(ctx); err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	chans := make([]chan string, len(names))
	for i, n := range names {
		chans[i] = make(chan string, 1)
		if _, err := sd.RestartUnitContext(ctx, n, "replace", chans[i]); err != nil {
			return fmt.Errorf("restart %s: %w", n, err)
		}
	}
	for i, ch := range chans {
		select {
		case r := <-ch:
			if r != "done" {
				return fmt.Errorf("restart %s: job %s", names[i], r)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// floorWrite replaces dir/name: a temp file in dir, fsynced (durable), then
// renamed over it. The caller fsyncs dir once per batch.
func floorWrite(dir, name string, content []byte, durable bool) error {
	tmp := filepath.Join(dir, "."+name+".floor-tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(content)
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// startFloor runs a floor in this process until the benchmark ends, and
// returns once its initial sync is done.
func startFloor(tb testing.TB, c floorConfig) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- runFloor(ctx, c, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		tb.Fatalf("floor: %v", err)
	case <-time.After(5 * time.Minute):
		cancel()
		<-done
		tb.Fatal("floor: no initial sync in 5 minutes")
	}
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			tb.Errorf("floor: %v", err)
		}
	})
}

// TestPerfFloorHelperProcess is not a test: startFloorProcess runs it as a
// floor in a process of its own (for idle measurements), configured by
// AGENTD_PERF_FLOOR (JSON floorConfig). It prints "ready" after the
// initial sync and runs until SIGTERM.
func TestPerfFloorHelperProcess(t *testing.T) {
	cfg := os.Getenv("AGENTD_PERF_FLOOR")
	if cfg == "" {
		return // run only as startFloorProcess's helper
	}
	var c floorConfig
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		t.Fatal(err)
	}
	// The test framework set GOMAXPROCS, which stops the runtime from
	// re-reading the CPU limit every second; run as a plain binary would,
	// as the agent does.
	runtime.SetDefaultGOMAXPROCS()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err := runFloor(ctx, c, func() { fmt.Println("ready") })
	if err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
}

// --- processes of their own ---

// proc is a child process (the agent or a floor) stopped with SIGTERM (then
// SIGKILL) when the benchmark ends.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startProc(tb testing.TB, cmd *exec.Cmd) *proc {
	tb.Helper()
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	tb.Cleanup(func() { p.stop(tb) })
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits 15 s, then SIGKILLs. Idempotent.
func (p *proc) stop(tb testing.TB) {
	if p.exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		tb.Errorf("pid %d did not stop within 15s of SIGTERM; killed", p.pid())
	}
}

// childEnv is this process's environment without what would change how a
// child agent runs: AGENTD_* (settings of every flag), systemd's
// notification and socket-activation variables, the session bus.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "AGENTD_") || strings.HasPrefix(k, "LISTEN_") || strings.HasPrefix(k, "WATCHDOG_") ||
			k == "NOTIFY_SOCKET" || k == "DBUS_SESSION_BUS_ADDRESS" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// startFloorProcess runs a floor as a process of its own (this test binary
// re-executed) and returns once its initial sync is done.
func startFloorProcess(tb testing.TB, c floorConfig) *proc {
	tb.Helper()
	cfg, err := json.Marshal(c)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPerfFloorHelperProcess$")
	cmd.Env = childEnv("AGENTD_PERF_FLOOR=" + string(cfg))
	cmd.Stderr = tb.Output()
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	p := startProc(tb, cmd)
	line := make(chan string, 1)
	go func() {
		r := bufio.NewReader(out)
		s, _ := r.ReadString('\n')
		line <- s
		r.WriteTo(io.Discard) // drain until the process ends
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "ready" {
			tb.Fatalf("floor process: said %q", s)
		}
	case <-time.After(5 * time.Minute):
		tb.Fatal("floor process: not ready in 5 minutes")
	}
	return p
}

// buildAgentBinary builds cmd/agentd into a directory removed when the
// benchmark ends.
func buildAgentBinary(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), "agentd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		tb.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startAgentProcess runs `agentd run --user` against h's bus and the etcd
// at endpoint, with production timings (lease TTL, resync) and warnings
// logged only.
func startAgentProcess(tb testing.TB, bin string, h *systemdtest.Harness, endpoint, host string, extra ...string) *proc {
	tb.Helper()
	args := append([]string{"run", "--user", "--host", host, "--etcd-endpoints", endpoint,
		"--unit-dir", h.UnitDir, "--state-dir", h.StateDir, "--debug-socket", filepath.Join(h.Dir, "agentd.sock"),
		"--log-level", "warn"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = childEnv("DBUS_SESSION_BUS_ADDRESS="+h.BusAddress, "GOTRACEBACK=all")
	cmd.Stdout, cmd.Stderr = tb.Output(), tb.Output()
	p := startProc(tb, cmd)
	tb.Logf("agent pid %d: agentd %s", p.pid(), strings.Join(args, " "))
	return p
}

// --- what a process costs ---

// procStats sums a process's threads: CPU time and run count from
// schedstat (ns precision; /proc/<pid>/stat has 10 ms ticks), context
// switches from status; RSS from the process's status.
type procStats struct {
	cpu           time.Duration
	runs          int64 // times a thread was scheduled onto a CPU (wake-ups)
	voluntary     int64
	nonvoluntary  int64
	rssKiB, hwKiB int64
	anonKiB       int64 // of rssKiB: the process's own memory; the rest is mapped files (the binary's pages)
	threads       int
}

func readProcStats(pid int) (procStats, error) {
	var s procStats
	dir := fmt.Sprintf("/proc/%d", pid)
	tasks, err := os.ReadDir(dir + "/task")
	if err != nil {
		return s, err
	}
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, "task", t.Name(), "schedstat"))
		if err != nil {
			continue // the thread ended
		}
		if f := strings.Fields(string(b)); len(f) == 3 {
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			runs, _ := strconv.ParseInt(f[2], 10, 64)
			s.cpu += time.Duration(ns)
			s.runs += runs
		}
		st, err := os.ReadFile(filepath.Join(dir, "task", t.Name(), "status"))
		if err != nil {
			continue
		}
		s.voluntary += statusField(st, "voluntary_ctxt_switches")
		s.nonvoluntary += statusField(st, "nonvoluntary_ctxt_switches")
		s.threads++
	}
	st, err := os.ReadFile(dir + "/status")
	if err != nil {
		return s, err
	}
	s.rssKiB, s.hwKiB, s.anonKiB = statusField(st, "VmRSS"), statusField(st, "VmHWM"), statusField(st, "RssAnon")
	return s, nil
}

// statusField is the number after "name:" in a /proc status file.
func statusField(status []byte, name string) int64 {
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// --- D-Bus monitor ---

// busMonitor counts the messages that some processes send and receive on a
// bus, as a monitor (org.freedesktop.DBus.Monitoring.BecomeMonitor) sees
// them. It matches their unique names at start: a process that reconnects
// later is not followed.
type busMonitor struct {
	conn   *godbus.Conn
	labels map[string]string // unique name → label
	mu     sync.Mutex
	sent   map[string]map[string]int // label → "type member" → count
	recv   map[string]map[string]int
	bcast  map[string]int // signals without destination (broadcasts), by "signal member"
	done   chan struct{}
}

// startBusMonitor monitors the bus at addr for the processes pids (label →
// pid) until stop.
func startBusMonitor(ctx context.Context, addr string, pids map[string]int) (*busMonitor, error) {
	conn, err := systemd.AddressDialer(addr)(ctx)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*busMonitor, error) { conn.Close(); return nil, err }
	var names []string
	bus := conn.BusObject()
	if err := bus.CallWithContext(ctx, "org.freedesktop.DBus.ListNames", 0).Store(&names); err != nil {
		return fail(err)
	}
	m := &busMonitor{conn: conn, labels: map[string]string{},
		sent: map[string]map[string]int{}, recv: map[string]map[string]int{}, bcast: map[string]int{}, done: make(chan struct{})}
	var rules []string
	for _, n := range names {
		if !strings.HasPrefix(n, ":") {
			continue
		}
		var pid uint32
		if bus.CallWithContext(ctx, "org.freedesktop.DBus.GetConnectionUnixProcessID", 0, n).Store(&pid) != nil {
			continue
		}
		for label, p := range pids {
			if int(pid) == p {
				m.labels[n] = label
				rules = append(rules, "sender='"+n+"'", "destination='"+n+"'")
			}
		}
	}
	for label, p := range pids {
		if !slices.Contains(slices.Collect(maps.Values(m.labels)), label) {
			return fail(fmt.Errorf("no connection of %s (pid %d) on the bus", label, p))
		}
	}
	// Broadcast signals have no destination: a subscribed process gets
	// those its own match rules select, which a monitor cannot see.
	rules = append(rules, "type='signal'")
	if err := bus.CallWithContext(ctx, "org.freedesktop.DBus.Monitoring.BecomeMonitor", 0, rules, uint32(0)).Err; err != nil {
		return fail(fmt.Errorf("BecomeMonitor: %w", err))
	}
	// From here on the connection must send nothing: every message goes to
	// ch, none is answered.
	ch := make(chan *godbus.Message, 4096)
	conn.Eavesdrop(ch)
	go func() {
		defer close(m.done)
		for msg := range ch { // closed when conn closes
			m.count(msg)
		}
	}()
	return m, nil
}

func (m *busMonitor) count(msg *godbus.Message) {
	str := func(f godbus.HeaderField) string {
		v, ok := msg.Headers[f]
		if !ok {
			return ""
		}
		s, _ := v.Value().(string)
		return s
	}
	kind := map[godbus.Type]string{godbus.TypeMethodCall: "method_call", godbus.TypeMethodReply: "reply",
		godbus.TypeError: "error", godbus.TypeSignal: "signal"}[msg.Type]
	what := kind + " " + str(godbus.FieldMember)
	m.mu.Lock()
	defer m.mu.Unlock()
	add := func(to map[string]map[string]int, label string) {
		if to[label] == nil {
			to[label] = map[string]int{}
		}
		to[label][what]++
	}
	if l, ok := m.labels[str(godbus.FieldSender)]; ok {
		add(m.sent, l)
	}
	if l, ok := m.labels[str(godbus.FieldDestination)]; ok {
		add(m.recv, l)
	}
	if msg.Type == godbus.TypeSignal && str(godbus.FieldDestination) == "" {
		m.bcast[what]++
	}
}

// stop ends the monitor and returns, per label, the messages sent and
// received by type and member, and the broadcast signals on the bus.
func (m *busMonitor) stop() (sent, recv map[string]map[string]int, bcast map[string]int) {
	m.conn.Close()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sent, m.recv, m.bcast
}

// total counts the messages of a kind ("method_call", "signal", ...).
func total(byWhat map[string]int, kind string) int {
	n := 0
	for w, c := range byWhat {
		if kind == "" || strings.HasPrefix(w, kind+" ") {
			n += c
		}
	}
	return n
}

// summary lists byWhat as "type member×count", most frequent first.
func summary(byWhat map[string]int) string {
	keys := slices.SortedFunc(maps.Keys(byWhat), func(a, b string) int {
		if byWhat[a] != byWhat[b] {
			return byWhat[b] - byWhat[a]
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s×%d", k, byWhat[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// quiesce waits (at most 10 s) until none of pids (the systemd managers
// of a cell) used more than 2 ms of CPU in the last 50 ms, so that one
// system's measurement does not pay for the work another's systemd still
// does after the previous one (on 1,000 units a daemon-reload keeps a
// manager busy for a good part of a second).
func quiesce(pids ...int) {
	cpu := func() []time.Duration {
		out := make([]time.Duration, len(pids))
		for i, p := range pids {
			s, _ := readProcStats(p)
			out[i] = s.cpu
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	prev := cpu()
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		cur := cpu()
		busy := false
		for i := range cur {
			busy = busy || cur[i]-prev[i] > 2*time.Millisecond
		}
		if !busy {
			return
		}
		prev = cur
	}
}
