package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
)

// BenchmarkRolloutScale (issue 25): a rollout across N simulated agents in
// waves of 10%, on one real etcd server process, with the agents' real
// registry side and rollout part (scaleFleet with rollouts on; only
// systemd is simulated, so a host is healthy the moment it restarts:
// what is measured is agentd's and etcd's own cost). For each size: the
// time of each wave (from the wave before it done, or the put, to its
// last host recorded healthy), beyond the soak; the etcd requests the
// rollout cost per host (gRPC calls started on the server during the
// rollout, over N); and beside it, the same N agents taking the same
// change as a plain put (no rollout) in the same run.
//
//	AGENTD_BENCH_ROLLOUT_AGENTS=100,1000 go test ./cmd/agentd -run '^$' -bench RolloutScale -benchtime 1x -timeout 60m -v
//
// AGENTD_BENCH_SOAK sets --soak (default 0).
func BenchmarkRolloutScale(b *testing.B) {
	sizes := benchInts(b, "AGENTD_BENCH_ROLLOUT_AGENTS", []int{100, 1000})
	soak := benchDuration(b, "AGENTD_BENCH_SOAK", 0)
	scaleRaiseNoFile(b, uint64(8*slices.Max(sizes)+4096))
	bin := etcdServerBinary(b)
	var out strings.Builder
	for _, n := range sizes {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			out.WriteString(runRolloutScale(b, bin, n, soak))
		})
	}
	b.Log("\n" + out.String())
}

func runRolloutScale(b *testing.B, bin string, n int, soak time.Duration) string {
	etcd := startScaleEtcd(b, bin)
	ctx := context.Background()
	reg, err := registry.Dial(ctx, registry.Config{Endpoints: []string{etcd.client}, DialTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer reg.Close()
	target := registry.Target{Group: "all"}
	if _, err := reg.Put(ctx, target, map[string][]byte{scaleUnitName: scaleUnit(0)}); err != nil {
		b.Fatal(err)
	}
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("sim%05d", i)
	}
	fleet := newScaleFleet(b, []string{etcd.client}, hosts)
	fleet.rollouts = true
	kill := os.Getenv("AGENTD_BENCH_KILL_COORDINATOR") == "1"
	if kill {
		fleet.proxy = newCutProxy(b, etcd.client)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < uint64(4*n+2000) {
		fleet.noLKG = true
	}
	if err := fleet.start(64); err != nil {
		b.Fatal(err)
	}
	// Settle: every agent runs v0 (its fake systemd started it).
	deadline := time.Now().Add(2*time.Minute + time.Duration(n)*60*time.Millisecond)
	for !fleetRuns(fleet, 1) {
		if time.Now().After(deadline) {
			b.Fatal("setup: not every agent started v0")
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Baseline: a plain put of v1 to every host at once (counted from a
	// reset: the first start of v0 may count more than one job).
	for _, a := range fleet.agents {
		a.sd.reset()
	}
	req0 := etcdRequests(etcd)
	t0 := time.Now()
	if _, err := reg.Put(ctx, target, map[string][]byte{scaleUnitName: scaleUnit(1)}); err != nil {
		b.Fatal(err)
	}
	for !fleetRuns(fleet, 1) {
		if time.Since(t0) > 3*time.Minute {
			stuck := 0
			for _, a := range fleet.agents {
				if a.sd.round().jobs < 1 {
					if stuck++; stuck <= 5 {
						b.Logf("%s: last snapshot at revision %d, rollouts known up to %d", a.host, a.lastRev.Load(), a.lastKnown.Load())
					}
				}
			}
			b.Fatalf("plain put: %d agents did not restart", stuck)
		}
		time.Sleep(20 * time.Millisecond)
	}
	plain := time.Since(t0)
	time.Sleep(time.Second) // statuses published
	plainReq := etcdRequests(etcd) - req0

	// The rollout of v2 in waves of 10%.
	var waves []rollout.Count
	for p := 10; p <= 100; p += 10 {
		waves = append(waves, rollout.Count{N: p, Percent: true})
	}
	s := rollout.Strategy{Waves: waves, Soak: soak, MaxRestarts: -1}
	r := &rollout.Record{ID: registry.NewRolloutID(time.Now()), Strategy: s, Hosts: hosts, WaveEnds: s.WaveEnds(n), By: "bench"}
	for _, a := range fleet.agents {
		a.sd.reset()
	}
	stopProfile := func() {}
	if path := os.Getenv("AGENTD_BENCH_CPUPROFILE"); path != "" {
		// The rollout's CPU profile: `go tool pprof -tagfocus
		// agentd=rollout-coordinator -top PATH` is the coordinator's share.
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
		stopProfile = func() { pprof.StopCPUProfile(); f.Close() }
		defer stopProfile()
	}
	req1 := etcdRequests(etcd)
	ev1 := fleet.events.Load()
	cpu1 := scaleSelfCPU()
	t1 := time.Now()
	if _, err := reg.Put(ctx, target, map[string][]byte{scaleUnitName: scaleUnit(2)}, registry.WithRollout(r, false)); err != nil {
		b.Fatal(err)
	}
	var v rollout.View
	var killedAt, tookOverAt time.Time
	var after string
	for {
		if kill && killedAt.IsZero() {
			// Mid-rollout (wave 3 open), the coordinator goes away.
			if v, err := reg.Rollout(ctx, r.ID, false); err == nil && v.Summary != nil && v.Summary.Phase.Wave >= 2 {
				if v.Coordinator != hosts[0] {
					b.Fatalf("the coordinator is %q, not %s (started first)", v.Coordinator, hosts[0])
				}
				fleet.proxy.cut()
				killedAt = time.Now()
			}
		}
		if !killedAt.IsZero() && tookOverAt.IsZero() {
			if c, err := reg.Coordinator(ctx, "all"); err == nil && c != "" && c != hosts[0] {
				tookOverAt, after = time.Now(), c
			}
		}
		v, err = reg.Rollout(ctx, r.ID, false)
		if err == nil && v.Record.End != nil {
			break
		}
		if time.Since(t1) > 5*time.Minute {
			if v, err := reg.Rollout(ctx, r.ID, true); err == nil {
				b.Logf("coordinator %q; summary %+v", v.Coordinator, v.Summary)
				n := 0
				for _, a := range fleet.agents {
					if p := v.Progress[a.host]; p == nil || p.State != rollout.HostHealthy {
						if n++; n <= 5 {
							b.Logf("%s: progress %+v, wave %d; last snapshot at revision %d, rollouts known up to %d", a.host, p, v.Record.Wave(a.host)+1, a.lastRev.Load(), a.lastKnown.Load())
						}
					}
				}
			}
			if f, err := os.Create(filepath.Join(os.TempDir(), "agentd-rollout-bench-goroutines.txt")); err == nil {
				_ = pprof.Lookup("goroutine").WriteTo(f, 2)
				f.Close()
				b.Logf("goroutines: %s", f.Name())
			}
			b.Fatalf("rollout not done after 5 min: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	total := time.Since(t1)
	stopProfile()
	cpu := scaleSelfCPU() - cpu1
	if v.Record.End.State != rollout.Done {
		b.Fatalf("rollout ended %+v", v.Record.End)
	}
	time.Sleep(time.Second)
	rollReq := etcdRequests(etcd) - req1
	events := fleet.events.Load() - ev1
	if v, err = reg.Rollout(ctx, r.ID, true); err != nil {
		b.Fatal(err)
	}

	var per []string
	prev := v.Record.CreatedAt
	var worst time.Duration
	var toJob, toHealthy []time.Duration
	byHost := map[string]*scaleAgent{}
	for _, a := range fleet.agents {
		byHost[a.host] = a
	}
	var firstOfWave []time.Duration
	for w := range v.Record.WaveEnds {
		var last, first time.Time
		for _, h := range v.Record.WaveHosts(w) {
			p := v.Progress[h]
			if p != nil && p.HealthyAt.After(last) {
				last = p.HealthyAt
			}
			if job := byHost[h].sd.round().firstJob; p != nil && !job.IsZero() {
				toJob, toHealthy = append(toJob, job.Sub(prev)), append(toHealthy, p.HealthyAt.Sub(job))
				if first.IsZero() || job.Before(first) {
					first = job
				}
			}
		}
		if w > 0 {
			firstOfWave = append(firstOfWave, first.Sub(prev))
		}
		d := last.Sub(prev) - soak
		worst = max(worst, d)
		per = append(per, fmt.Sprintf("%d", d.Milliseconds()))
		prev = last
	}
	// Each host restarted once, in its wave: a host outside the first wave
	// that ran the change early (before its record came) would show more.
	for _, a := range fleet.agents {
		if j := a.sd.round().jobs; j != 1 {
			b.Errorf("%s ran %d jobs during the rollout, want 1", a.host, j)
		}
	}
	// The per-put fan-out: what a change that is not for them (another
	// group's key, another host's key) costs the agents: snapshots
	// received and CPU, over 20 such puts.
	ev2, cpu2 := fleet.events.Load(), scaleSelfCPU()
	for i := range 20 {
		t := registry.Target{Group: "other"}
		if i%2 == 1 {
			t = registry.Target{Host: "not-in-the-fleet"}
		}
		if _, err := reg.Put(ctx, t, map[string][]byte{scaleUnitName: scaleUnit(100 + i)}); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	foreignEvents, foreignCPU := fleet.events.Load()-ev2, scaleSelfCPU()-cpu2
	warn := fleet.warn.count.Load()
	fleet.stop()
	slices.Sort(toJob)
	slices.Sort(toHealthy)
	pct := func(d []time.Duration, q float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		return d[int(q*float64(len(d)-1))].Round(time.Millisecond)
	}
	slices.Sort(firstOfWave)
	breakdown := fmt.Sprintf("wave gap (last host of a wave healthy → first host of the next restarted) p50 %v p99 %v", pct(firstOfWave, .5), pct(firstOfWave, .99)) +
		fmt.Sprintf("; wave before done → host restarted p50 %v p99 %v; restarted → recorded healthy p50 %v p99 %v",
			pct(toJob, .5), pct(toJob, .99), pct(toHealthy, .5), pct(toHealthy, .99))
	if kill {
		breakdown += fmt.Sprintf("\ncoordinator %s cut off from etcd at wave 3; %s coordinated %v later (lease TTL 15 s); the rollout completed, one job per host",
			hosts[0], after, tookOverAt.Sub(killedAt).Round(time.Millisecond))
	}
	breakdown += fmt.Sprintf("\nforeign puts (20, to another group or host): %d snapshots reached the %d agents; test process CPU %v over 1 s (%.3f ms per agent per put)",
		foreignEvents, n, foreignCPU.Round(time.Millisecond), float64(foreignCPU.Microseconds())/1000/float64(n)/20)
	return breakdown + "\n" + fmt.Sprintf("agents=%d soak=%v: plain put to all %v, %.1f etcd requests per host; rollout in %d waves %v (%.2f× the plain put; %.1f etcd requests per host; "+
		"%.1f snapshots (watch event batches) per agent over the rollout; test process CPU %v, %.2f ms per agent); per wave beyond the soak, ms: %s (worst %v); agent warnings %d\n",
		n, soak, plain.Round(time.Millisecond), float64(plainReq)/float64(n), len(v.Record.WaveEnds), total.Round(time.Millisecond),
		float64(total)/float64(plain), float64(rollReq)/float64(n), float64(events)/float64(n), cpu.Round(time.Millisecond),
		float64(cpu.Microseconds())/1000/float64(n), strings.Join(per, " "), worst.Round(time.Millisecond), warn)
}

// fleetRuns says every agent's fake systemd started the unit at least
// starts times.
func fleetRuns(f *scaleFleet, starts int) bool {
	for _, a := range f.agents {
		if a.sd.round().jobs < starts {
			return false
		}
	}
	return true
}

// etcdRequests counts the gRPC calls the etcd server started so far.
func etcdRequests(e *scaleEtcd) int64 {
	return int64(e.metrics()["grpc_server_started_total"])
}
