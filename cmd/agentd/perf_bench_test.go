package main

// Benchmarks of the agent against floors measured in the same run (the
// machines are noisy): each system gets a fresh private systemd per cell,
// all share one etcd, changes are sequential unless a burst is the point.
// A change ends when the restarted unit ITSELF logs the version it runs
// (perfUnit, versionLog), not when the agent reports it. Targets are
// reported, never asserted. The floors are in floor_bench_test.go.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/crypto/ssh"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/sshsig"
)

// perfCell is one cell of a benchmark: an etcd shared by the systems it
// compares, each with a private systemd of its own.
type perfCell struct {
	b        *testing.B
	endpoint string
	reg      *registry.Client // statuses (the agent's settling)
	raw      *clientv3.Client // unit writes, identical for every system
	seq      int              // last version handed out
	managers []int            // PIDs of the systems' systemd managers
}

func newPerfCell(b *testing.B) *perfCell {
	b.Helper()
	b.Setenv(checkFocusEnv, "") // the check plans every unit on every pass
	e := registrytest.StartEtcd(b)
	reg, err := registry.Dial(context.Background(), registry.Config{
		Endpoints: []string{e.Endpoint()}, DialTimeout: 10 * time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { reg.Close() })
	return &perfCell{b: b, endpoint: e.Endpoint(), reg: reg, raw: registrytest.RawClient(b, e.Endpoint())}
}

// perfSys is one system under test: the agent or a floor, following the
// registry keys of host on a private systemd.
type perfSys struct {
	name    string
	host    string
	h       *systemdtest.Harness
	logPath string // where its units log the version they run
	log     *versionLog
	reloads func() int // daemon-reloads systemd completed
	agent   bool       // publishes statuses: settle waits for them
	// signer, when set, signs every unit written for this system (a
	// signature record beside each key, in the same transaction), and its
	// agent runs with --allowed-signers naming it; seq is the last
	// sequence number given.
	signer ssh.Signer
	seq    uint64
}

// signedSys makes s an agent that applies only signed changes: an
// ed25519 key, and an allowed_signers file naming it.
func (s *perfSys) signed(b *testing.B) string {
	b.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		b.Fatal(err)
	}
	if s.signer, err = ssh.NewSignerFromKey(priv); err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(s.h.Dir, "allowed_signers")
	line := `bench namespaces="agentd" ` + string(ssh.MarshalAuthorizedKey(s.signer.PublicKey()))
	if err := os.WriteFile(file, []byte(line), 0o644); err != nil {
		b.Fatal(err)
	}
	return file
}

// unitKVs are the keys and values that give s's units their versions:
// the unit files, and for a signed system their signature records
// (what agentd unit put --sign-key stores), signed before any clock starts.
func (c *perfCell) unitKVs(s *perfSys, versions map[string]string) map[string][]byte {
	c.b.Helper()
	kvs := map[string][]byte{}
	for u, v := range versions {
		content := perfUnit(s.logPath, v)
		kvs[unitKey(s.host, u)] = content
		if s.signer == nil {
			continue
		}
		s.seq++
		ch := reconcile.SignedChange{Key: unitKey(s.host, u), Target: "hosts/" + s.host, Hash: reconcile.Hash(content), Seq: s.seq}
		sig, err := sshsig.Sign(s.signer, reconcile.SignatureNamespace, ch.Message())
		if err != nil {
			c.b.Fatal(err)
		}
		rec, _ := json.Marshal(reconcile.SignatureRecord{Key: ch.Key, Hash: ch.Hash, Seq: ch.Seq, Signature: string(sig)})
		kvs[registry.DefaultPrefix+"/hosts/"+s.host+"/signatures/"+u] = rec
	}
	return kvs
}

func (c *perfCell) newSys(name, host string) *perfSys {
	c.b.Helper()
	h := systemdtest.Start(c.b)
	c.managers = append(c.managers, h.ManagerPID)
	p := filepath.Join(h.Dir, "versions.log")
	return &perfSys{name: name, host: host, h: h, logPath: p, log: newVersionLog(c.b, p), reloads: h.CountReloads(c.b)}
}

// agentInProcess starts the agent in this process (exactly the code of
// `agentd run`, as newBenchEnv does) on s, and waits until it has joined.
func (c *perfCell) agentInProcess(s *perfSys) {
	c.b.Helper()
	s.agent = true
	e := &env{t: c.b, quiet: true, h: s.h, endpoint: c.endpoint, reg: c.reg, host: s.host}
	var edit func(o *runOptions)
	if s.signer != nil {
		file := filepath.Join(s.h.Dir, "allowed_signers")
		edit = func(o *runOptions) { o.allowedSigners = file }
	}
	e.startAgentOn([]string{c.endpoint}, edit)
	c.waitMember(s.host)
}

// floorInProcess starts a floor in this process on s.
func (c *perfCell) floorInProcess(s *perfSys, batch bool) {
	c.b.Helper()
	startFloor(c.b, c.floorConfig(s, batch))
}

func (c *perfCell) floorConfig(s *perfSys, batch bool) floorConfig {
	return floorConfig{Endpoint: c.endpoint, Prefix: unitKey(s.host, ""), UnitDir: s.h.UnitDir, Bus: s.h.BusAddress,
		Batch: batch, NoFsync: os.Getenv("AGENTD_BENCH_FLOOR_FSYNC") == "0"}
}

// waitMember waits until host's agent has joined the registry.
func (c *perfCell) waitMember(host string) {
	c.b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ms, err := c.reg.Members(context.Background())
		if err == nil && slices.ContainsFunc(ms, func(m reconcile.Member) bool { return m.Host == host }) {
			return
		}
		if time.Now().After(deadline) {
			c.b.Fatalf("agent %s did not join the registry in 30s (%v)", host, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// versions gives each of units a new version.
func (c *perfCell) versions(units []string) map[string]string {
	c.seq++
	v := map[string]string{}
	for _, u := range units {
		v[u] = fmt.Sprintf("v%d", c.seq)
	}
	return v
}

// put waits until the cell's managers are quiet, writes s's units (unit →
// version), in one transaction or with one put each, all at once
// (concurrent), and returns the time from the start of the write until
// every unit logged its new version.
func (c *perfCell) put(s *perfSys, versions map[string]string, concurrent bool) time.Duration {
	c.b.Helper()
	kvs := c.unitKVs(s, versions)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second+100*time.Millisecond*time.Duration(len(kvs)))
	defer cancel()
	quiesce(c.managers...)
	start := time.Now()
	var err error
	if concurrent {
		err = putConcurrent(ctx, c.raw, kvs)
	} else {
		err = putTxn(ctx, c.raw, kvs)
	}
	if err != nil {
		c.b.Fatalf("%s: put: %v", s.name, err)
	}
	at, err := s.log.wait(ctx, versions)
	if err != nil {
		c.b.Fatalf("%s: %v\n%s", s.name, err, s.h.Log())
	}
	return at.Sub(start)
}

// settle waits until the agent has reported versions as running (its
// pass is over), so that the next measurement does not share the CPU with
// it. A floor has nothing to report.
func (c *perfCell) settle(s *perfSys, versions map[string]string) {
	c.b.Helper()
	if !s.agent {
		return
	}
	want := map[string]string{}
	for u, v := range versions {
		want[u] = reconcile.Hash(perfUnit(s.logPath, v))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := waitHash(ctx, c.reg, s.host, want); err != nil {
		c.b.Fatalf("%s: statuses: %v", s.name, err)
	}
}

func perfUnits(n int) []string {
	units := make([]string, n)
	for i := range units {
		units[i] = perfUnitName(i)
	}
	return units
}

// BenchmarkPerfPutToRunning (a): latency from the etcd put of a unit's new
// content to the restarted unit itself logging the new version, over
// AGENTD_BENCH_CHANGES (200) sequential changes (round-robin over the
// units) with AGENTD_BENCH_UNITS (1,100,1000) units installed. Beside the
// agent, in the same cell and interleaved change by change:
//
//   - floor: the per-event floor (watches etcd; per event: write the file,
//     Reload, RestartUnit), on a systemd of its own;
//   - direct: the benchmark itself writes the file and calls Reload and
//     RestartUnit on the floor's systemd (no etcd).
//
// Target (reported): agentd p50 within 10 ms of the floor's
// (p50-delta-ms). Before the changes the units are installed: put to
// etcd, then each system started (startup sync, logged).
//
//	go test ./cmd/agentd -run '^$' -bench '^BenchmarkPerfPutToRunning$' -benchtime 1x -timeout 60m
//	AGENTD_BENCH_UNITS=1 AGENTD_BENCH_CHANGES=20 go test ./cmd/agentd -run '^$' -bench '^BenchmarkPerfPutToRunning$' -benchtime 1x
//
// AGENTD_BENCH_SIGNED=1 adds, in the same cell and interleaved with the
// others, a second agent run with --allowed-signers whose changes are
// signed (ed25519; the signing is done before the clock starts): what
// checking the signatures adds to a change (signed-delta-ms: its p50
// against the unsigned agent's; signed-floor-delta-ms: against the floor).
func BenchmarkPerfPutToRunning(b *testing.B) {
	for _, n := range benchInts(b, "AGENTD_BENCH_UNITS", []int{1, 100, 1000}) {
		b.Run(fmt.Sprintf("units=%d", n), func(b *testing.B) { benchPutToRunning(b, n) })
	}
}

func benchPutToRunning(b *testing.B, n int) {
	changes := benchInt(b, "AGENTD_BENCH_CHANGES", 200)
	c := newPerfCell(b)
	units := perfUnits(n)
	ag, fl := c.newSys("agentd", "h1"), c.newSys("floor", "floor")
	systems := []*perfSys{ag, fl}
	var sg *perfSys // the agent with --allowed-signers (AGENTD_BENCH_SIGNED=1)
	if os.Getenv("AGENTD_BENCH_SIGNED") == "1" {
		sg = c.newSys("agentd-signed", "h2")
		sg.signed(b)
		systems = append(systems, sg)
	}
	install := c.versions(units)
	for _, s := range systems {
		if err := putTxn(context.Background(), c.raw, c.unitKVs(s, install)); err != nil {
			b.Fatal(err)
		}
	}
	startup := func(s *perfSys, start func()) time.Duration {
		t0 := time.Now()
		start()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		at, err := s.log.wait(ctx, install)
		if err != nil {
			b.Fatalf("%s: install: %v", s.name, err)
		}
		c.settle(s, install)
		return at.Sub(t0)
	}
	agStart := startup(ag, func() { c.agentInProcess(ag) })
	flStart := startup(fl, func() { c.floorInProcess(fl, false) })
	b.Logf("units=%d installed: startup sync (start → all %d running) agentd %.0f ms, floor %.0f ms",
		n, n, ms(agStart), ms(flStart))
	if sg != nil {
		b.Logf("units=%d installed: startup sync agentd --allowed-signers %.0f ms", n, ms(startup(sg, func() { c.agentInProcess(sg) })))
	}

	// direct is the floor driven by the benchmark itself (write, Reload,
	// RestartUnit, no etcd), on each system's own systemd: two systemd
	// instances of one run differ by up to 2× at 1,000 units, so the
	// agent is also read against a baseline on its own. On the agent's
	// systemd it changes a unit the agent does not manage.
	durable := os.Getenv("AGENTD_BENCH_FLOOR_FSYNC") != "0"
	directOn := func(s *perfSys) func(unit, v string) time.Duration {
		sd, err := s.h.Dial(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(sd.Close)
		return func(unit, v string) time.Duration {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			quiesce(c.managers...)
			start := time.Now()
			err := floorWrite(s.h.UnitDir, unit, perfUnit(s.logPath, v), durable)
			if err == nil && durable {
				err = syncDir(s.h.UnitDir)
			}
			if err == nil {
				err = reloadRestart(ctx, sd, []string{unit})
			}
			if err != nil {
				b.Fatalf("direct on %s: %v", s.name, err)
			}
			at, err := s.log.wait(ctx, map[string]string{unit: v})
			if err != nil {
				b.Fatalf("direct on %s: %v", s.name, err)
			}
			return at.Sub(start)
		}
	}
	direct, directAg := directOn(fl), directOn(ag)
	const unmanaged = "direct.service" // on the agent's systemd: not in the registry

	for b.Loop() {
		var agLat, flLat, dLat, daLat, sgLat []time.Duration
		agReloads, flReloads := ag.reloads(), fl.reloads()
		sgReloads := 0
		if sg != nil {
			sgReloads = sg.reloads()
		}
		for i := range changes {
			unit := units[i%n]
			v := c.versions([]string{unit})
			agent := func() {
				agLat = append(agLat, c.put(ag, v, false))
				c.settle(ag, v)
				if sg != nil { // the signed agent right after the unsigned one, on its own systemd
					sgLat = append(sgLat, c.put(sg, v, false))
					c.settle(sg, v)
				}
			}
			floor := func() { flLat = append(flLat, c.put(fl, v, false)) }
			dFl := func() { dLat = append(dLat, direct(unit, c.versions([]string{unit})[unit])) }
			dAg := func() {
				daLat = append(daLat, directAg(unmanaged, c.versions([]string{unmanaged})[unmanaged]))
			}
			// On each systemd the system and its direct change take turns
			// at going first: a change right after another on the same
			// systemd measured tens of ms slower at 1,000 units.
			if i%2 == 0 {
				agent()
				dAg()
				floor()
				dFl()
			} else {
				dAg()
				agent()
				dFl()
				floor()
			}
		}
		time.Sleep(200 * time.Millisecond) // the last Reloading signal
		// direct does exactly one Reload per change on each systemd.
		agReloads, flReloads = ag.reloads()-agReloads-changes, fl.reloads()-flReloads-changes
		if sg != nil {
			sgReloads = sg.reloads() - sgReloads // no direct change on its systemd
		}
		report := func(name string, lat []time.Duration) {
			b.ReportMetric(ms(percentile(lat, 0.50)), name+"-p50-ms")
			b.ReportMetric(ms(percentile(lat, 0.90)), name+"-p90-ms")
			b.ReportMetric(ms(percentile(lat, 0.99)), name+"-p99-ms")
		}
		report("agentd", agLat)
		report("floor", flLat)
		report("direct", dLat)
		report("direct-agentd", daLat)
		p50 := func(lat []time.Duration) time.Duration { return percentile(lat, 0.50) }
		delta := p50(agLat) - p50(flLat)
		// What each adds to its own systemd's direct change.
		own := (p50(agLat) - p50(daLat)) - (p50(flLat) - p50(dLat))
		b.ReportMetric(ms(delta), "p50-delta-ms")
		b.ReportMetric(ms(own), "p50-delta-own-ms")
		if sg != nil {
			report("agentd-signed", sgLat)
			b.ReportMetric(ms(p50(sgLat)-p50(agLat)), "signed-delta-ms")
			b.ReportMetric(ms(p50(sgLat)-p50(flLat)), "signed-floor-delta-ms")
		}
		b.Logf("units=%d, %d changes, ms         p50     p90     p99     max   reloads", n, changes)
		for _, r := range []struct {
			name    string
			lat     []time.Duration
			reloads int
		}{{"agentd", agLat, agReloads}, {"floor", flLat, flReloads}, {"direct", dLat, changes}, {"direct, agentd's systemd", daLat, changes},
			{"agentd --allowed-signers", sgLat, sgReloads}} {
			if len(r.lat) == 0 {
				continue
			}
			b.Logf("  %-24s %7.1f %7.1f %7.1f %7.1f   %d", r.name, ms(p50(r.lat)), ms(percentile(r.lat, 0.9)),
				ms(percentile(r.lat, 0.99)), ms(slices.Max(r.lat)), r.reloads)
		}
		b.Logf("  target p50 within 10 ms of the floor: agentd − floor = %+.1f ms (%s); each against a direct change on its own systemd: (agentd − direct there) − (floor − direct there) = %+.1f ms (%s)",
			ms(delta), verdict(delta <= 10*time.Millisecond), ms(own), verdict(own <= 10*time.Millisecond))
		if sg != nil {
			sd := p50(sgLat) - p50(flLat)
			b.Logf("  --allowed-signers: agentd signed − unsigned = %+.1f ms; signed − floor = %+.1f ms (%s)",
				ms(p50(sgLat)-p50(agLat)), ms(sd), verdict(sd <= 10*time.Millisecond))
		}
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// BenchmarkPerfBurst (b): bursts of AGENTD_BENCH_BURST (100,1000) changed
// units, put in one etcd transaction and as separate concurrent puts: the
// time until the last unit itself logs its new version, and the
// daemon-reloads systemd counted. Beside the agent, on a systemd of its
// own in the same cell, the batch floor (one reload per watch response).
// Each cell first measures the first sync: all units new, one transaction.
// Each -benchtime round does one burst of each kind per system.
//
// Targets (reported): 100-unit burst within 1.5× the batch floor with 1
// daemon-reload; 1,000-unit burst under 5 s; first sync of 1,000 units
// within 1.5× the batch floor.
//
//	go test ./cmd/agentd -run '^$' -bench '^BenchmarkPerfBurst$' -benchtime 1x -timeout 60m
//	AGENTD_BENCH_BURST=100 go test ./cmd/agentd -run '^$' -bench '^BenchmarkPerfBurst$' -benchtime 3x
func BenchmarkPerfBurst(b *testing.B) {
	for _, n := range benchInts(b, "AGENTD_BENCH_BURST", []int{100, 1000}) {
		b.Run(fmt.Sprintf("units=%d", n), func(b *testing.B) { benchBurst(b, n) })
	}
}

func benchBurst(b *testing.B, n int) {
	c := newPerfCell(b)
	units := perfUnits(n)
	ag, fl := c.newSys("agentd", "h1"), c.newSys("floor", "floor")
	c.agentInProcess(ag)
	c.floorInProcess(fl, true)
	systems := []*perfSys{ag, fl}

	// burst puts a new version of every unit to s and returns the time
	// until all run it and the reloads systemd did meanwhile.
	burst := func(s *perfSys, v map[string]string, concurrent bool) (time.Duration, int) {
		r0 := s.reloads()
		d := c.put(s, v, concurrent)
		c.settle(s, v)
		time.Sleep(200 * time.Millisecond) // the last Reloading signal
		return d, s.reloads() - r0
	}
	first := map[string]time.Duration{}
	firstReloads := map[string]int{}
	v := c.versions(units)
	for _, s := range systems {
		first[s.name], firstReloads[s.name] = burst(s, v, false)
	}
	ratio := func(a, f time.Duration) float64 { return float64(a) / float64(f) }
	b.ReportMetric(ms(first["agentd"]), "first-agentd-ms")
	b.ReportMetric(ms(first["floor"]), "first-floor-ms")
	b.ReportMetric(ratio(first["agentd"], first["floor"]), "first-ratio")
	b.Logf("units=%d first sync (all new, one txn): agentd %.0f ms (%d reloads), batch floor %.0f ms (%d reloads), ratio %.2f (target ≤ 1.5: %s)",
		n, ms(first["agentd"]), firstReloads["agentd"], ms(first["floor"]), firstReloads["floor"],
		ratio(first["agentd"], first["floor"]), verdict(ratio(first["agentd"], first["floor"]) <= 1.5))
	if os.Getenv("AGENTD_BENCH_FIRST_ONLY") == "1" {
		return // the first sync alone (A/B runs of it)
	}

	type acc struct {
		d       time.Duration
		reloads int
		n       int
	}
	res := map[string]*acc{}
	for b.Loop() {
		for _, mode := range []string{"txn", "conc"} {
			v := c.versions(units)
			for _, s := range systems {
				d, r := burst(s, v, mode == "conc")
				k := mode + "-" + s.name
				if res[k] == nil {
					res[k] = &acc{}
				}
				res[k].d += d
				res[k].reloads += r
				res[k].n++
				b.Logf("units=%d %-4s %-6s %7.0f ms  %d reloads", n, mode, s.name, ms(d), r)
			}
		}
	}
	for _, mode := range []string{"txn", "conc"} {
		a, f := res[mode+"-agentd"], res[mode+"-floor"]
		if a == nil || f == nil {
			continue
		}
		am, fm := a.d/time.Duration(a.n), f.d/time.Duration(f.n)
		ar, fr := float64(a.reloads)/float64(a.n), float64(f.reloads)/float64(f.n)
		b.ReportMetric(ms(am), mode+"-agentd-ms")
		b.ReportMetric(ms(fm), mode+"-floor-ms")
		b.ReportMetric(ratio(am, fm), mode+"-ratio")
		b.ReportMetric(ar, mode+"-agentd-reloads")
		b.ReportMetric(fr, mode+"-floor-reloads")
		target := fmt.Sprintf("target ≤ 1.5× floor, 1 reload: %s", verdict(ratio(am, fm) <= 1.5 && ar == 1))
		if n >= 1000 {
			target = fmt.Sprintf("target < 5 s: %s", verdict(am < 5*time.Second))
		}
		b.Logf("units=%d %s burst, mean of %d: agentd %.0f ms (%.1f reloads), batch floor %.0f ms (%.1f reloads), ratio %.2f (%s)",
			n, mode, a.n, ms(am), ar, ms(fm), fr, ratio(am, fm), target)
	}
}

// BenchmarkPerfIdle (c): the agent as a process of its own (`agentd run
// --user`, built from this tree) with AGENTD_BENCH_IDLE_UNITS (1,1000)
// units, idle for AGENTD_BENCH_IDLE (60s) after a settling pause
// (AGENTD_BENCH_SETTLE, 5s): its CPU, wake-ups (thread schedulings from
// schedstat, context switches from status, summed over threads), RSS, and
// the D-Bus messages it sends and receives as a bus monitor
// (BecomeMonitor) sees them. Beside it, in the same window, the batch
// floor as a process of its own (this test binary re-executed). Before
// idling, the first sync: all units put new in one transaction to both.
//
// Targets (reported): idle CPU ≤ 0.1 ms per second at 1 and 1,000 units;
// RSS ≤ 40 MiB at 1,000 units; first sync of 1,000 units within 1.5× the
// batch floor. AGENTD_BENCH_LEASE_TTL (e.g. 30s) runs the agent with that
// --lease-ttl (the renewal is the idle agent's one network call, every half
// of it). AGENTD_BENCH_STRACE=1 adds `strace -f -c` of the idle agent
// for 10 s after the window; AGENTD_BENCH_DUMP=1 ends the agent with
// SIGQUIT (goroutine dump in the output).
//
//	go test ./cmd/agentd -run '^$' -bench '^BenchmarkPerfIdle$' -benchtime 1x -timeout 60m
//	AGENTD_BENCH_IDLE_UNITS=1 AGENTD_BENCH_IDLE=10s go test ./cmd/agentd -run '^$' -bench '^BenchmarkPerfIdle$' -benchtime 1x
func BenchmarkPerfIdle(b *testing.B) {
	bin := buildAgentBinary(b)
	for _, n := range benchInts(b, "AGENTD_BENCH_IDLE_UNITS", []int{1, 1000}) {
		b.Run(fmt.Sprintf("units=%d", n), func(b *testing.B) { benchIdle(b, bin, n) })
	}
}

func benchIdle(b *testing.B, bin string, n int) {
	idle := benchDuration(b, "AGENTD_BENCH_IDLE", 60*time.Second)
	settle := benchDuration(b, "AGENTD_BENCH_SETTLE", 5*time.Second)
	c := newPerfCell(b)
	units := perfUnits(n)
	ag, fl := c.newSys("agentd", "h1"), c.newSys("floor", "floor")
	var extra []string
	if ttl := os.Getenv("AGENTD_BENCH_LEASE_TTL"); ttl != "" {
		extra = append(extra, "--lease-ttl", ttl)
	}
	agent := startAgentProcess(b, bin, ag.h, c.endpoint, ag.host, extra...)
	ag.agent = true
	c.waitMember(ag.host)
	floor := startFloorProcess(b, c.floorConfig(fl, true))

	v := c.versions(units)
	first := map[string]time.Duration{}
	profiled := profileAgent(b, filepath.Join(ag.h.Dir, "agentd.sock"), os.Getenv("AGENTD_BENCH_CPUPROFILE"))
	sdCPU := map[string]time.Duration{} // systemd's own, for the first sync
	for _, s := range []*perfSys{ag, fl} {
		before, err := readProcStats(s.h.ManagerPID)
		if err != nil {
			b.Fatal(err)
		}
		first[s.name] = c.put(s, v, false)
		c.settle(s, v)
		after, err := readProcStats(s.h.ManagerPID)
		if err != nil {
			b.Fatal(err)
		}
		sdCPU[s.name] = after.cpu - before.cpu
		if s == ag {
			profiled()
		}
	}
	firstRatio := float64(first["agentd"]) / float64(first["floor"])
	b.Logf("units=%d first sync (all new, one txn): agentd %.0f ms, batch floor %.0f ms, ratio %.2f (target ≤ 1.5: %s); systemd's CPU in it: %.0f ms beside agentd, %.0f beside the floor",
		n, ms(first["agentd"]), ms(first["floor"]), firstRatio, verdict(firstRatio <= 1.5), ms(sdCPU["agentd"]), ms(sdCPU["floor"]))
	b.ReportMetric(ms(first["agentd"]), "first-agentd-ms")
	b.ReportMetric(ms(first["floor"]), "first-floor-ms")
	b.ReportMetric(firstRatio, "first-ratio")

	for b.Loop() {
		time.Sleep(settle)
		gcs, allocs := agentMem(b, ag.h) // outside the window's figures: the read is a heap profile
		procs := map[string]*proc{"agentd": agent, "floor": floor}
		buses := map[string]string{"agentd": ag.h.BusAddress, "floor": fl.h.BusAddress}
		mons := map[string]*busMonitor{}
		before := map[string]procStats{}
		for name, p := range procs {
			if p.exited() {
				b.Fatalf("%s exited on its own: %v", name, p.cmd.ProcessState)
			}
			m, err := startBusMonitor(context.Background(), buses[name], map[string]int{name: p.pid()})
			if err != nil {
				b.Fatalf("%s: bus monitor: %v", name, err)
			}
			mons[name] = m
			if before[name], err = readProcStats(p.pid()); err != nil {
				b.Fatal(err)
			}
		}
		b.Logf("units=%d CPU used before the idle window (start, first sync, settling): agentd %.0f ms, floor %.0f ms",
			n, ms(before["agentd"].cpu), ms(before["floor"].cpu))
		start := time.Now()
		time.Sleep(idle)
		secs := time.Since(start).Seconds()

		b.Logf("units=%d idle %.0f s     cpu ms/s  wakeups/s  ctxsw/s (vol+invol)  RSS MiB (peak) [anon+files]  threads  D-Bus calls  D-Bus msgs in", n, secs)
		for _, name := range []string{"agentd", "floor"} {
			after, err := readProcStats(procs[name].pid())
			if err != nil {
				b.Fatal(err)
			}
			sent, recv, bcast := mons[name].stop()
			s0 := before[name]
			cpu := ms(after.cpu-s0.cpu) / secs
			runs := float64(after.runs-s0.runs) / secs
			ctxsw := float64(after.voluntary+after.nonvoluntary-s0.voluntary-s0.nonvoluntary) / secs
			rss := float64(after.rssKiB) / 1024
			calls, in := total(sent[name], "method_call"), total(recv[name], "")
			b.ReportMetric(cpu, name+"-cpu-ms/s")
			b.ReportMetric(runs, name+"-wakeups/s")
			b.ReportMetric(rss, name+"-rss-MiB")
			b.ReportMetric(float64(calls), name+"-dbus-calls")
			b.Logf("  %-8s %18.3f %10.1f %10.1f (%d+%d) %10.1f (%.1f) [%.1f+%.1f] %8d %12d %14d", name, cpu, runs, ctxsw,
				after.voluntary-s0.voluntary, after.nonvoluntary-s0.nonvoluntary, rss, float64(after.hwKiB)/1024,
				float64(after.anonKiB)/1024, float64(after.rssKiB-after.anonKiB)/1024, after.threads, calls, in)
			b.Logf("    %s sent: %s", name, summary(sent[name]))
			b.Logf("    %s received: %s; broadcast signals on its bus: %s", name, summary(recv[name]), summary(bcast))
			if name == "agentd" {
				b.Logf("  targets: idle CPU ≤ 0.1 ms/s: %s; RSS ≤ 40 MiB at 1,000 units: %s",
					verdict(cpu <= 0.1), verdict(rss <= 40))
			}
		}
		gcs1, allocs1 := agentMem(b, ag.h)
		b.Logf("  agentd in the window: %d GCs, %.0f KiB allocated (runtime.MemStats NumGC, TotalAlloc)", gcs1-gcs, float64(allocs1-allocs)/1024)
	}
	// The monitor at work, and a figure of its own: the D-Bus messages of
	// one changed unit, agent and floor.
	ch := c.versions(units[:1])
	for _, s := range []*perfSys{ag, fl} {
		p := map[string]*proc{"agentd": agent, "floor": floor}[s.name]
		m, err := startBusMonitor(context.Background(), s.h.BusAddress, map[string]int{s.name: p.pid()})
		if err != nil {
			b.Fatalf("%s: bus monitor: %v", s.name, err)
		}
		d := c.put(s, ch, false)
		c.settle(s, ch)
		time.Sleep(200 * time.Millisecond)
		sent, recv, bcast := m.stop()
		b.Logf("units=%d one change of %s: %.0f ms; %d D-Bus calls sent (%s); received: %s; broadcast signals on its bus: %d",
			n, s.name, ms(d), total(sent[s.name], "method_call"), summary(sent[s.name]), summary(recv[s.name]), total(bcast, ""))
	}
	if os.Getenv("AGENTD_BENCH_STRACE") == "1" {
		straceIdle(b, agent.pid(), 10*time.Second)
	}
	if os.Getenv("AGENTD_BENCH_DUMP") == "1" {
		agent.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-agent.done:
		case <-time.After(10 * time.Second):
		}
	}
}

// straceIdle logs the syscall summary of pid's threads over d.
func straceIdle(b *testing.B, pid int, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, "strace", "-f", "-c", "-p", fmt.Sprint(pid))
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) } // strace prints its summary on SIGINT
	out, err := cmd.CombinedOutput()
	b.Logf("strace -f -c -p %d for %s (%v):\n%s", pid, d, err, out)
}

// profileAgent starts a CPU profile of the agent process through its debug
// socket, written to path when the returned func is called (nothing when
// path is empty): AGENTD_BENCH_CPUPROFILE=cpu.out profiles its first sync.
// agentMem is how many GCs the agent process has run and how many bytes
// its heap has allocated: NumGC and TotalAlloc from the heap profile its
// debug socket serves.
func agentMem(b *testing.B, h *systemdtest.Harness) (gcs, allocated int) {
	var buf bytes.Buffer
	err := control.NewClient(filepath.Join(h.Dir, "agentd.sock")).Fetch(context.Background(), "/debug/pprof/heap?debug=1", &buf)
	if err != nil {
		b.Fatalf("agent heap profile: %v", err)
	}
	field := func(name string) int {
		_, after, ok := strings.Cut(buf.String(), "# "+name+" = ")
		n, err := strconv.Atoi(strings.Fields(after + " x")[0])
		if !ok || err != nil {
			b.Fatalf("no %s in the agent's heap profile", name)
		}
		return n
	}
	return field("NumGC"), field("TotalAlloc")
}

func profileAgent(b *testing.B, sock, path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	// The profile runs for a fixed time; the first sync must end within it.
	got := make(chan error, 1)
	go func() { got <- control.NewClient(sock).Profile(context.Background(), 30*time.Second, f) }()
	time.Sleep(100 * time.Millisecond) // the profile has started
	return func() {
		err := <-got
		f.Close()
		if err != nil {
			b.Fatalf("cpu profile: %v", err)
		}
		b.Logf("agent CPU profile (30 s from the first put) in %s", path)
	}
}
