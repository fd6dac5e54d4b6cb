package reconcile_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/unitdir"
)

// passTimes is an Observer that hands each pass's duration to the
// benchmark.
type passTimes struct {
	reconcile.NopObserver
	ch chan time.Duration
	n  atomic.Int64 // passes seen
}

func (p *passTimes) Pass(d time.Duration, _ error) {
	select {
	case p.ch <- d:
	default:
	}
}

// benchSizes reads AGENTD_BENCH_PASS_UNITS (default 10,100,1000,5000).
func benchSizes(b *testing.B) []int {
	spec := os.Getenv("AGENTD_BENCH_PASS_UNITS")
	if spec == "" {
		spec = "10,100,1000,5000"
	}
	var out []int
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("AGENTD_BENCH_PASS_UNITS: bad size %q", f)
		}
		out = append(out, n)
	}
	return out
}

// BenchmarkPass: what one pass of the loop costs the agent itself, with
// 10 … 5,000 managed units, when nothing, one unit or ten units changed,
// beside a full pass that reads every unit's state and every file again
// (the periodic resync's worst case, and what every pass cost before the
// cache). systemd is a fake that answers at once and counts the state reads,
// so the figures are the agent's own work: D-Bus and systemd's side are in
// cmd/agentd's benchmarks. The unit directory and the state directory are
// real (temp dirs). Memory per unit is the live heap after a GC, less the
// heap before the agent was made, over the number of units.
//
//	go test ./reconcile -run '^$' -bench Pass -benchtime 1x
func BenchmarkPass(b *testing.B) {
	for _, n := range benchSizes(b) {
		b.Run(fmt.Sprintf("units=%d", n), func(b *testing.B) {
			for b.Loop() {
				benchPass(b, n)
			}
		})
	}
}

func benchPass(b *testing.B, n int) {
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)

	dir, err := unitdir.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	man, err := unitdir.OpenManifest(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	sd := &counting{fakeSystemd: &fakeSystemd{active: map[string]bool{}}}
	obs := &passTimes{ch: make(chan time.Duration, 1024)}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: dir, Manifest: man, Observer: obs})
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("u%05d.service", i)
	}
	snap := snapshot(names...)
	start := time.Now()
	a.SetSnapshot(snap)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	deadline := time.Now().Add(5 * time.Minute)
	for len(sd.Calls()) < n+1 {
		if time.Now().After(deadline) {
			b.Fatalf("%d units did not converge: %d calls", n, len(sd.Calls()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Every job's result taken (the last of them can come after a quiet
	// spell, and would be counted in the first scenario).
	for !allDone(a, n) {
		if time.Now().After(deadline) {
			b.Fatalf("%d units: not every start's result was taken", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	quiet(obs)
	converge := time.Since(start)

	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	perUnit := (float64(m1.HeapAlloc) - float64(m0.HeapAlloc)) / float64(n)

	// One scenario: trigger, then the passes it caused until quiet.
	const rounds = 20
	type cost struct {
		wall, cpu time.Duration // per trigger: the passes' time, and the process's CPU
		states    float64       // state reads per trigger
	}
	measure := func(trigger func(i int) time.Duration) cost {
		var c cost
		s0, p0, cpu0 := sd.states.Load(), obs.n.Load(), cpuTime(b)
		for i := range rounds {
			c.wall += trigger(i)
		}
		c.cpu = cpuTime(b) - cpu0
		b.Logf("%.1f passes per trigger", float64(obs.n.Load()-p0)/rounds)
		c.wall, c.cpu, c.states = c.wall/rounds, c.cpu/rounds, float64(sd.states.Load()-s0)/rounds
		return c
	}
	signal := measure(func(i int) time.Duration { a.UnitChanged(names[i%n]); return quiet(obs) })
	change := func(k int) func(int) time.Duration {
		return func(i int) time.Duration {
			snap.Revision++
			snap.Entries = slices.Clone(snap.Entries) // the agent keeps the one it was given
			for j := range k {
				e := &snap.Entries[(i*k+j)%n]
				e.Value = fmt.Appendf(nil, "[Service]\nExecStart=/bin/sleep %d\n[X-Agentd]\nHealthySec=0\n", snap.Revision)
			}
			a.SetSnapshot(snap)
			return quiet(obs)
		}
	}
	one := measure(change(1))
	ten := measure(change(min(10, n)))
	// Sync runs its pass as a request, outside the Observer's view: timed
	// here.
	full := measure(func(int) time.Duration {
		t := time.Now()
		if _, err := a.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t)
		quiet(obs)
		return d
	})
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(signal.wall), "signal-ms")
	b.ReportMetric(ms(one.wall), "change1-ms")
	b.ReportMetric(ms(ten.wall), "change10-ms")
	b.ReportMetric(ms(full.wall), "full-ms")
	b.ReportMetric(perUnit/1024, "KiB/unit")
	b.Logf("%d units: converge %s; per trigger, the passes' time / the process's CPU (fake systemd): signal for 1 unit %.2f / %.2f ms (%.1f state reads), "+
		"1 unit changed %.2f / %.2f ms (%.1f), 10 changed %.2f / %.2f ms (%.1f); full re-read (baseline) %.2f / %.2f ms (%.1f); heap %.1f KiB/unit",
		n, converge.Round(time.Millisecond), ms(signal.wall), ms(signal.cpu), signal.states, ms(one.wall), ms(one.cpu), one.states,
		ms(ten.wall), ms(ten.cpu), ten.states, ms(full.wall), ms(full.cpu), full.states, perUnit/1024)
}

// cpuTime is the CPU time this process used so far (user and system).
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// allDone says every unit's status shows its start done.
func allDone(a *reconcile.Agent, n int) bool {
	_, st := a.Statuses()
	if len(st) < n {
		return false
	}
	for _, s := range st {
		if s.Job != "" || s.Result != "done" {
			return false
		}
	}
	return true
}

// quiet sums the durations of the passes that come until none came for
// 100 ms.
func quiet(obs *passTimes) time.Duration {
	var total time.Duration
	for {
		select {
		case d := <-obs.ch:
			total += d
			obs.n.Add(1)
		case <-time.After(100 * time.Millisecond):
			return total
		}
	}
}
