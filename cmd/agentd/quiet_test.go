package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// The memory a burst of passes used goes back to the OS once the loop has
// been quiet for quietFor, not while passes keep coming; the process then
// runs on one P with the collector off under a memory limit until the next
// pass starts.
func TestQuietSpell(t *testing.T) {
	orig := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })
	busy := readGC()
	q := &quietSpell{busyProcs: 2, own: true}
	t.Cleanup(q.Stop)
	hushed := func(when string) {
		t.Helper()
		if n := runtime.GOMAXPROCS(0); n != 1 {
			t.Errorf("GOMAXPROCS %d %s, want 1", n, when)
		}
		gc := readGC()
		footprint, _ := memoryNow()
		if gc.percent != -1 || gc.limit <= int64(footprint) || gc.limit >= busy.limit {
			t.Errorf("GC %+v %s (footprint %d), want the collector off under a limit above the footprint", gc, when, footprint)
		}
	}
	awake := func(when string) {
		t.Helper()
		if n := runtime.GOMAXPROCS(0); n != 2 {
			t.Errorf("GOMAXPROCS %d %s, want 2", n, when)
		}
		if gc := readGC(); gc != busy {
			t.Errorf("GC %+v %s, want %+v as before", gc, when, busy)
		}
	}
	released := func() uint64 {
		var s runtime.MemStats
		runtime.ReadMemStats(&s)
		return s.HeapReleased
	}
	garbage := func() {
		for range 64 {
			b := make([]byte, 1<<20) // 64 MiB in all, ≥ returnAfter
			b[0] = 1
			runtime.KeepAlive(b)
		}
	}
	returned := func() uint64 {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.returned
	}
	pass := func() {
		q.PassStart()
		awake("during a pass")
		q.Pass(0, nil)
	}
	garbage()
	start := time.Now()
	pass()
	// Passes every quietFor/4 postpone the quiet spell.
	for time.Since(start) < 2*quietFor {
		time.Sleep(quietFor / 4)
		if r := returned(); r != 0 {
			t.Fatalf("memory returned %v after the first pass while passes kept coming", time.Since(start))
		}
		awake("while passes kept coming")
		pass()
	}
	before := released()
	deadline := time.Now().Add(5 * quietFor)
	for returned() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("memory not returned %v after the last pass", 5*quietFor)
		}
		time.Sleep(quietFor / 10)
	}
	time.Sleep(100 * time.Millisecond) // FreeOSMemory runs after returned is set
	if after := released(); after <= before {
		t.Errorf("HeapReleased %d → %d: nothing given back", before, after)
	}
	hushed("after a quiet spell")

	// A pass gets both Ps back; without new allocation its quiet spell
	// returns no memory, but runs on one P again.
	r := returned()
	pass() // checks GOMAXPROCS 2
	time.Sleep(quietFor + quietFor/2)
	if returned() != r {
		t.Error("a quiet spell with little allocated since the last return gave memory back")
	}
	hushed("after the second quiet spell")
	q.Stop()
	awake("after Stop")
}

// gcSettings are the collector's settings: GOGC (-1: off) and the memory
// limit.
type gcSettings struct {
	percent int64
	limit   int64
}

func readGC() gcSettings {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	return gcSettings{percent: int64(s[0].Value.Uint64()), limit: int64(s[1].Value.Uint64())}
}

// Beside the embedded etcd, which serves other clients whatever the loop
// does, the process keeps every P and its collector's settings.
func TestQuietSpellKeepsProcsForEmbeddedEtcd(t *testing.T) {
	orig := runtime.GOMAXPROCS(2)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })
	busy := readGC()
	q := newQuietSpell(false)
	t.Cleanup(q.Stop)
	q.PassStart()
	q.Pass(0, nil)
	time.Sleep(quietFor + quietFor/2)
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Errorf("GOMAXPROCS %d after a quiet spell beside the embedded etcd, want 2", n)
	}
	if gc := readGC(); gc != busy {
		t.Errorf("GC %+v after a quiet spell beside the embedded etcd, want %+v", gc, busy)
	}
}

// As an operator sees it (go_sched_gomaxprocs_threads, go_gc_gogc_percent
// and go_gc_gomemlimit_bytes in /metrics): the agent process runs on one
// CPU with the collector off under a memory limit once its loop is quiet,
// gets both CPUs and GOGC back for a pass, and keeps both beside the
// embedded etcd.
func TestQuietAgentProcessRunsOnOneCPU(t *testing.T) {
	t.Parallel() // waits on a quiet spell, not the CPU
	bin := buildAgent(t)
	e := registrytest.StartEtcd(t)
	reg := registrytest.NewClient(t, e.Endpoint())
	h := systemdtest.Start(t)
	wedge := filepath.Join(h.Dir, "wedge")
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(bin, "run", "--user", "--host", "h1", "--etcd-endpoints", e.Endpoint(),
		"--unit-dir", h.UnitDir, "--state-dir", h.StateDir, "--debug-socket", filepath.Join(h.Dir, "agentd.sock"),
		"--metrics-addr", addr, "--test-wedge-file", wedge, "--log-level", "warn")
	cmd.Env = childEnv("DBUS_SESSION_BUS_ADDRESS="+h.BusAddress, "GOMAXPROCS=2")
	cmd.Stdout, cmd.Stderr = t.Output(), t.Output()
	startProc(t, cmd)

	put := func(v string) {
		unit := "[Service]\nExecStart=/bin/sleep 1000\nEnvironment=V=" + v + "\n"
		if _, err := reg.Put(context.Background(), registry.Target{Host: "h1"}, map[string][]byte{"app.service": []byte(unit)}); err != nil {
			t.Fatal(err)
		}
	}
	put("1")
	waitProcs(t, addr, 1, "after the first sync, quiet")
	if gogc, limit := gcMetrics(t, addr); gogc != -1 || limit > 1<<40 {
		t.Errorf("quiet: GOGC %d, memory limit %.0f; want off (-1) under a limit", gogc, limit)
	}
	if err := os.WriteFile(wedge, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	put("2") // its pass reads the unit's state and wedges there
	waitProcs(t, addr, 2, "in a pass")
	time.Sleep(quietFor + quietFor/2)
	if n := gomaxprocs(t, addr); n != 2 {
		t.Fatalf("GOMAXPROCS %d while a pass runs (wedged), want 2", n)
	}
	if gogc, limit := gcMetrics(t, addr); gogc != 100 || limit < math.MaxInt64 {
		t.Errorf("in a pass: GOGC %d, memory limit %.0f; want 100 and none", gogc, limit)
	}

	// The same agent with the embedded etcd keeps both.
	h2 := systemdtest.Start(t)
	addr2 := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd2 := exec.Command(bin, "run", "--user", "--host", "h2",
		"--embedded-listen", "unix://"+filepath.Join(registrytest.SocketDir(t), "etcd.sock"),
		"--unit-dir", h2.UnitDir, "--state-dir", h2.StateDir, "--debug-socket", filepath.Join(h2.Dir, "agentd.sock"),
		"--metrics-addr", addr2, "--log-level", "warn")
	cmd2.Env = childEnv("DBUS_SESSION_BUS_ADDRESS="+h2.BusAddress, "GOMAXPROCS=2")
	cmd2.Stdout, cmd2.Stderr = t.Output(), t.Output()
	startProc(t, cmd2)
	waitMetric(t, addr2, "agentd_last_successful_pass_timestamp_seconds")
	time.Sleep(2 * quietFor)
	if n := gomaxprocs(t, addr2); n != 2 {
		t.Errorf("GOMAXPROCS %d beside the embedded etcd, quiet, want 2", n)
	}
	if gogc, _ := gcMetrics(t, addr2); gogc != 100 {
		t.Errorf("GOGC %d beside the embedded etcd, quiet, want 100", gogc)
	}
}

// gcMetrics reads the agent's GOGC (-1: off; the runtime reports it as an
// unsigned number) and memory limit from its /metrics.
func gcMetrics(t *testing.T, addr string) (gogc int64, limit float64) {
	t.Helper()
	m := scrapeMetrics("http://" + addr)
	p, ok1 := m["go_gc_gogc_percent"]
	l, ok2 := m["go_gc_gomemlimit_bytes"]
	if !ok1 || !ok2 {
		t.Fatalf("no go_gc_gogc_percent or go_gc_gomemlimit_bytes at %s/metrics", addr)
	}
	if p >= math.MaxInt64 {
		p = -1
	}
	return int64(p), l
}

// metric is the value of the unlabelled metric name at addr's /metrics
// (ok false while the agent does not serve it, or it is not there).
func metric(addr, name string) (v float64, ok bool) {
	v, ok = scrapeMetrics("http://" + addr)[name]
	return v, ok
}

func gomaxprocs(t *testing.T, addr string) int {
	t.Helper()
	v, ok := metric(addr, "go_sched_gomaxprocs_threads")
	if !ok {
		t.Fatalf("no go_sched_gomaxprocs_threads at %s/metrics", addr)
	}
	return int(v)
}

// waitProcs waits until the agent at addr runs on n Ps.
func waitProcs(t *testing.T, addr string, n int, when string) {
	t.Helper()
	eventually(t, fmt.Sprintf("GOMAXPROCS %d %s", n, when), func() bool {
		v, ok := metric(addr, "go_sched_gomaxprocs_threads")
		return ok && int(v) == n
	})
}

// waitMetric waits until name is above zero at addr.
func waitMetric(t *testing.T, addr, name string) {
	t.Helper()
	eventually(t, name+" > 0", func() bool {
		v, ok := metric(addr, name)
		return ok && v > 0
	})
}
