package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/rollout"
)

// Issue 38, item 3: waves by label. labelledFleet is a fleet whose hosts
// h1.. carry the labels given (in order), each its own systemd, all in
// group web.
func labelledFleet(t *testing.T, labels ...string) *fleet {
	t.Helper()
	specs := make([]hostSpec, len(labels))
	for i, l := range labels {
		specs[i] = hostSpec{group: "web", labels: []string{l}}
	}
	return specFleet(t, specs...)
}

// hostSpec is one host of specFleet: its group and its labels.
type hostSpec struct {
	group  string
	labels []string
}

// specFleet is a fleet of hosts h1.. as specs say, each its own systemd
// and agent, on one etcd.
func specFleet(t *testing.T, specs ...hostSpec) *fleet {
	t.Helper()
	endpoint := registrytest.StartEtcd(t).Endpoint()
	f := &fleet{t: t, endpoint: endpoint, reg: registrytest.NewClient(t, endpoint), byRun: map[string]string{}}
	f.events = filepath.Join(t.TempDir(), "events")
	for i, sp := range specs {
		h := systemdtest.Start(t)
		e := &env{t: t, h: h, endpoint: endpoint, reg: f.reg, host: fmt.Sprintf("h%d", i+1), groups: []string{sp.group}, quiet: true}
		e.startAgentOn([]string{endpoint}, func(o *runOptions) { o.labels = sp.labels })
		f.hosts = append(f.hosts, e)
		f.byRun[filepath.Join(h.Dir, "run")] = e.host
	}
	f.waitJoined()
	return f
}

// `unit put --group web --waves-by rack --wait`: by systemd's own start
// times, every r1 host started the change before any r2 host did, and
// `rollout status` names the waves by their label.
func TestRolloutWavesByRack(t *testing.T) {
	t.Parallel()                                                      // its own systemds and etcd: waits on them, not the CPU
	f := labelledFleet(t, "rack=r2", "rack=r1", "rack=r2", "rack=r1") // r1: h2 h4; r2: h1 h3
	policy := "HealthySec=0.5"
	f.put(f.unit("/bin/sleep 1000", policy), 0)
	clearEvents(f)
	out := f.put(f.unit("/bin/sleep 1001", policy), 0, "--waves-by", "rack")
	id := rolloutID(t, out)
	if !strings.Contains(out, "4 hosts in waves 2, 4 by label: rack=r1, rack=r2") {
		t.Errorf("put --wait: want the waves named by label:\n%s", out)
	}
	rack := map[string]string{"h1": "r2", "h2": "r1", "h3": "r2", "h4": "r1"}
	var lastR1, firstR2 float64
	starts := map[string]int{}
	for _, ev := range f.readEvents() {
		if ev.stop {
			continue
		}
		starts[ev.host]++
		switch rack[ev.host] {
		case "r1":
			lastR1 = max(lastR1, ev.at)
		case "r2":
			if firstR2 == 0 {
				firstR2 = ev.at
			}
		}
	}
	if len(starts) != 4 || lastR1 == 0 || firstR2 == 0 || lastR1 >= firstR2 {
		t.Errorf("starts by host %v; last r1 start %.3f, first r2 start %.3f: want every r1 host started before any r2 host", starts, lastR1, firstR2)
	}
	t.Logf("last r1 start %.3f, first r2 start %.3f (%.3fs later)", lastR1, firstR2, firstR2-lastR1)

	st, code := f.hosts[0].cli("rollout", "status", id)
	if code != 0 || !strings.Contains(st, "done, wave 2 of 2 (rack=r2)") || !strings.Contains(st, "by label: rack=r1, rack=r2") ||
		!strings.Contains(st, "--waves-by rack") {
		t.Errorf("rollout status: exit %d, want the phase and the waves named by label:\n%s", code, st)
	}
	v, err := f.reg.Rollout(context.Background(), id, false)
	if err != nil {
		t.Fatal(err)
	}
	if r := v.Record; strings.Join(r.Hosts, " ") != "h2 h4 h1 h3" || fmt.Sprint(r.WaveEnds) != "[2 4]" {
		t.Errorf("record hosts %v, waves %v: want h2 h4 | h1 h3", r.Hosts, r.WaveEnds)
	}
}

// --success-threshold 50%: one host of the last rack fails the change;
// the rollout goes on and ends done, naming it.
func TestRolloutSuccessThreshold(t *testing.T) {
	t.Parallel()
	f := labelledFleet(t, "rack=r2", "rack=r1", "rack=r2", "rack=r1", "zone=x")
	policy := "HealthySec=0.5"
	f.put(f.unit("/bin/sleep 1000", policy), 0)
	bad := filepath.Join(f.hosts[2].h.Dir, "run") // h3 (rack r2) fails the change
	next := f.unit(fmt.Sprintf("/bin/sh -c 'test %%t = %s && exit 1; exec /bin/sleep 1001'", bad), policy)
	out := f.put(next, 0, "--waves-by", "rack=r1,r2", "--success-threshold", "50%")
	id := rolloutID(t, out)
	if !strings.Contains(out, "warning: h5 of group web has no rack label with one of the values r1,r2: it goes in the last wave, (no rack)") {
		t.Errorf("put: want h5 named as going in the last wave:\n%s", out)
	}
	v, err := f.reg.Rollout(context.Background(), id, true)
	if err != nil {
		t.Fatal(err)
	}
	if e := v.Record.End; e == nil || e.State != rollout.Done || !strings.Contains(e.Reason, "1 host failed: h3 (within --success-threshold 50%)") {
		t.Fatalf("rollout ended %+v: want done naming h3", e)
	}
	if p := v.Progress["h3"]; p == nil || p.State != rollout.HostFailed {
		t.Errorf("h3: %+v, want failed", p)
	}
	st, _ := f.hosts[0].cli("rollout", "status", id)
	if !strings.Contains(st, "h3 (wave 2): failed") || !strings.Contains(st, "wave 3 of 3 ((no rack))") {
		t.Errorf("rollout status: want h3 named an offender:\n%s", st)
	}
	t.Logf("put said:\n%s\nstatus:\n%s", out, st)
}

// Bad --waves-by and --success-threshold are usage errors (exit 2) naming
// the offending text, before anything is read or written.
func TestWavesByRefusedAtPut(t *testing.T) {
	t.Parallel() // refused before anything is opened
	e := &env{t: t}
	unit := filepath.Join(t.TempDir(), "app.service")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--waves-by", "ra ck"}, `label key "ra ck"`},
		{[]string{"--waves-by", "zone="}, "an empty value"},
		{[]string{"--waves-by", "zone=a,,b"}, "an empty value"},
		{[]string{"--waves-by", "rack", "--waves", "50%"}, "go without --waves and --canary"},
		{[]string{"--waves-by", "rack", "--canary", "1"}, "go without --waves and --canary"},
		{[]string{"--success-threshold", "0%"}, `--success-threshold "0%"`},
		{[]string{"--success-threshold", "101%"}, `--success-threshold "101%"`},
		{[]string{"--budget-by", "rack"}, "--budget-by rack needs --max-unavailable"},
		{[]string{"--budget-by", "ra ck", "--max-unavailable", "1"}, `--budget-by "ra ck"`},
	} {
		out, code := e.cli(append([]string{"unit", "put", unit, "--group", "web", "--wait"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(out, tc.want) || !strings.Contains(out, "nothing stored") {
			t.Errorf("unit put %s: exit %d, want %d saying %q and nothing stored:\n%s", strings.Join(tc.args, " "), code, exitUsage, tc.want, out)
		}
	}
}

// --max-unavailable 1 --budget-by rack: by systemd's own stop and start
// times, the two hosts of one rack never take the change at once (the
// second stops only after the first has started and been healthy for its
// HealthySec), and the two racks take it in parallel.
func TestRolloutBudgetByRack(t *testing.T) {
	t.Parallel()
	f := labelledFleet(t, "rack=r1", "rack=r2", "rack=r1", "rack=r2") // r1: h1 h3; r2: h2 h4
	const healthySec = 1.0
	policy := "HealthySec=1"
	f.put(f.unit("/bin/sleep 1000", policy), 0)
	clearEvents(f)
	out := f.put(f.unit("/bin/sleep 1001", policy), 0, "--max-unavailable", "1", "--budget-by", "rack")
	id := rolloutID(t, out)
	if !strings.Contains(out, "4 hosts in wave 4; at most 1 at once per rack (rack=r1, rack=r2)") {
		t.Errorf("put --wait: want the budget named:\n%s", out)
	}
	stops, starts := map[string]float64{}, map[string]float64{}
	for _, ev := range f.readEvents() {
		if ev.stop {
			stops[ev.host] = ev.at
		} else {
			starts[ev.host] = ev.at
		}
	}
	if len(stops) != 4 || len(starts) != 4 {
		t.Fatalf("stops %v, starts %v: want each of the 4 hosts to restart once", stops, starts)
	}
	// down: from a host's stop until it counted healthy (start + HealthySec).
	down := func(h string) (float64, float64) { return stops[h], starts[h] + healthySec }
	overlap := func(a, b string) bool {
		a0, a1 := down(a)
		b0, b1 := down(b)
		return a0 < b1 && b0 < a1
	}
	for _, pair := range [][2]string{{"h1", "h3"}, {"h2", "h4"}} {
		if overlap(pair[0], pair[1]) {
			t.Errorf("%s and %s (one rack) were down at once: %s stop %.3f start %.3f, %s stop %.3f start %.3f",
				pair[0], pair[1], pair[0], stops[pair[0]], starts[pair[0]], pair[1], stops[pair[1]], starts[pair[1]])
		}
	}
	parallel := 0
	for _, a := range []string{"h1", "h3"} {
		for _, b := range []string{"h2", "h4"} {
			if overlap(a, b) {
				parallel++
			}
		}
	}
	if parallel == 0 {
		t.Errorf("no r1 host was down while an r2 host was: want the racks in parallel (stops %v, starts %v)", stops, starts)
	}
	st, code := f.hosts[0].cli("rollout", "status", id)
	if code != 0 || !strings.Contains(st, "--max-unavailable 1 --budget-by rack") || !strings.Contains(st, "done") {
		t.Errorf("rollout status: exit %d, want it done with the budget named:\n%s", code, st)
	}
	v, err := f.reg.Rollout(context.Background(), id, false)
	if err != nil {
		t.Fatal(err)
	}
	if r := v.Record; fmt.Sprint(r.Buckets) != "[0 1 0 1]" || fmt.Sprint(r.BucketNames) != "[rack=r1 rack=r2]" {
		t.Errorf("record buckets %v %v: want h1 h3 in rack=r1, h2 h4 in rack=r2", r.Buckets, r.BucketNames)
	}
	t.Logf("stops %v\nstarts %v\n%d cross-rack overlaps", stops, starts, parallel)
}

// --success-threshold with a host whose agent is down: the rollout does
// not wait for it, counts it as not healthy, and ends done naming it; the
// host takes the change when its agent returns.
func TestRolloutSuccessThresholdCountsADownHost(t *testing.T) {
	t.Parallel()
	f := labelledFleet(t, "rack=r1", "rack=r1", "rack=r1")
	policy := "HealthySec=0.3"
	f.put(f.unit("/bin/sleep 1000", policy), 0)
	down := f.hosts[2] // h3
	down.agent.stop(t)
	next := f.unit("/bin/sleep 1001", policy)
	out := f.put(next, 0, "--success-threshold", "60%", "--timeout", "30s")
	id := rolloutID(t, out)
	if !strings.Contains(out, "warning: h3 of group web has no live agent: until it is back, it counts as not healthy (--success-threshold 60%)") {
		t.Errorf("put: want h3 named down:\n%s", out)
	}
	v, err := f.reg.Rollout(context.Background(), id, false)
	if err != nil {
		t.Fatal(err)
	}
	if e := v.Record.End; e == nil || e.State != rollout.Done || !strings.Contains(e.Reason, "1 host had no live agent and did not take it: h3 (within --success-threshold 60%)") {
		t.Fatalf("rollout ended %+v: want done naming h3", e)
	}
	st, code := f.hosts[0].cli("rollout", "status", id)
	if !strings.Contains(st, "h3 (wave 1): pending — no live agent") {
		t.Errorf("rollout status: exit %d, want h3 named:\n%s", code, st)
	}
	// Back: h3's agent runs the new version (the rollout ended done, so
	// the group's keys are what every host runs).
	down.startAgentOn([]string{f.endpoint}, func(o *runOptions) { o.labels = []string{"rack=r1"} })
	f.waitRolledOut(next, 30*time.Second)
	t.Logf("put said:\n%s\nstatus:\n%s", out, st)
}
