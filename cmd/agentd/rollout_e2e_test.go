package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/rollout"
)

// Issue 25: rollouts on real systemd, five hosts, one etcd. What the hosts
// did is read from systemd (MainPID, the units' own start/stop hooks) and
// the unit files on disk; the rollout's state from its record.

// startRollout puts content for app.service to group web as a rollout with
// strategy s, as `unit put --group web --canary …` does.
func (f *fleet) startRollout(content string, s rollout.Strategy) *rollout.Record {
	f.t.Helper()
	hosts := make([]string, len(f.hosts))
	for i, e := range f.hosts {
		hosts[i] = e.host
	}
	slices.Sort(hosts)
	if s.MaxRestarts == 0 {
		s.MaxRestarts = -1
	}
	r := &rollout.Record{ID: registry.NewRolloutID(time.Now()), Strategy: s, Hosts: hosts, WaveEnds: s.WaveEnds(len(hosts)), By: "test"}
	if err := s.Validate(); err != nil {
		f.t.Fatal(err)
	}
	tg := registry.Target{Group: "web"}
	if _, err := f.reg.Put(context.Background(), tg, map[string][]byte{"app.service": []byte(content)}, registry.WithRollout(r, false)); err != nil {
		f.t.Fatalf("put the rollout: %v", err)
	}
	return r
}

// waitRollout waits until the rollout's phase satisfies ok.
func (f *fleet) waitRollout(id string, within time.Duration, what string, ok func(rollout.View, rollout.Phase) bool) rollout.View {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for {
		v, err := f.reg.Rollout(context.Background(), id, true)
		if err == nil {
			if ph := v.Phase(); ok(v, ph) {
				return v
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("rollout %s: not %s within %v: %+v (err %v)", id, what, within, describeRollout(v), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func describeRollout(v rollout.View) string {
	if v.Record == nil {
		return "<none>"
	}
	s := fmt.Sprintf("end=%+v paused=%v", v.Record.End, v.Record.Paused)
	for _, h := range v.Record.Hosts {
		if p := v.Progress[h]; p != nil {
			s += fmt.Sprintf(" %s=%s(%s)", h, p.State, p.Reason)
		} else {
			s += " " + h + "=pending"
		}
	}
	return s
}

// A canary that runs (systemd says active) but fails its health probe is
// reverted, the rollout fails, and the other four hosts never write the
// change: their unit file and MainPID are what they were. `unit put
// --wait --canary 1 --auto-revert` follows it to the revert and exits 3,
// naming the failed canary once (an offender) among its lines of
// counters.
func TestRolloutFailedCanaryIsRevertedAndOthersNeverTakeIt(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 5, "")
	policy := "HealthySec=1"
	good := f.unit("/bin/sleep 1000", policy)
	f.put(good, 0)
	before := f.pids()
	clearEvents(f)
	bad := f.unit("/bin/sleep 1001", policy+"\nHealthCmd=/bin/false\nHealthIntervalSec=200ms\nHealthRetries=2")
	out := f.put(bad, exitFailed, "--canary", "1", "--auto-revert")
	id := rolloutID(t, out)
	// The offender line shows while the summary lists h1 failed (the
	// summary that ends the rollout: at least rollout.SummaryEvery, about
	// one poll of put --wait); the phase names it anyway.
	if n := len(regexp.MustCompile(`(?m)^h1 \(wave 1\): failed — app\.service: health probe failed`).FindAllString(out, -1)); n > 1 ||
		regexp.MustCompile(`(?m)^h[2-5] \(wave`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^rollout `+id+`: failed, wave 1 of 2 — h1 failed the change: .* · 0 healthy · 1 reverted · 4 waiting$`).MatchString(out) ||
		!strings.Contains(out, "reverted to the previous version: h1") {
		t.Errorf("put --wait: want the failed canary named at most once as an offender (%d), no line for the other hosts, "+
			"a last line of counters with h1 reverted, and the revert said:\n%s", n, out)
	} else if n == 0 {
		t.Logf("put --wait polled past the summary that listed h1 failed")
	}
	// put --wait returned once every host that took the change went back.
	v, err := f.reg.Rollout(context.Background(), id, true)
	if err != nil {
		t.Fatal(err)
	}
	if p := v.Progress["h1"]; v.Record.End == nil || v.Record.End.State != rollout.Failed || p == nil || p.State != rollout.HostReverted {
		t.Fatalf("rollout ended %+v, h1 %+v: want failed and h1 reverted", v.Record.End, p)
	}
	t.Logf("rollout %s: %s", id, v.Record.End.Reason)
	after := f.pids()
	// By the units' own hooks: h1 stopped and started twice (the change,
	// then back), no other host once.
	n := map[string]int{}
	for _, ev := range f.readEvents() {
		n[ev.host]++
	}
	if n["h1"] != 4 || len(n) != 1 {
		t.Errorf("start and stop events by host %v: want 4 on h1 (the change and back) and none elsewhere", n)
	}
	for _, e := range f.hosts {
		if got, _ := e.readLocal("app.service"); got != good {
			t.Errorf("%s: app.service on disk is not the previous version:\n%s", e.host, got)
		}
		if e.host == "h1" {
			if after["h1"] == before["h1"] || after["h1"] == 0 {
				t.Errorf("h1 (the canary) did not run the change and come back: MainPID %d → %d", before["h1"], after["h1"])
			}
			continue
		}
		if after[e.host] != before[e.host] {
			t.Errorf("%s took part in a rollout it was never let into: MainPID %d → %d", e.host, before[e.host], after[e.host])
		}
		if p := v.Progress[e.host]; p != nil {
			t.Errorf("%s has progress %+v", e.host, p)
		}
	}
}

// Waves 1, 50%, 100% with a soak, started by `unit put --wait` that is
// killed once the first host took the change: by systemd's own clock, no
// host of a wave restarts before every host of the wave before it ran the
// change for the soak; a pause stops new hosts, resume goes on, and a new
// `rollout status --watch` follows it to done, every host on the new
// version.
func TestRolloutWavesSoakAndPause(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 5, "")
	policy := "HealthySec=0.5"
	f.put(f.unit("/bin/sleep 1000", policy), 0)
	clearEvents(f)
	next := f.unit("/bin/sleep 1001", policy)
	soak := time.Second
	e := f.hosts[0]
	ctx, kill := context.WithCancel(context.Background())
	cliDone := make(chan string, 1)
	go func() {
		out, _ := e.cliCtx(ctx, "unit", "put", e.writeUnit("app.service", next), "--group", "web",
			"--waves", "1,50%", "--soak", soak.String(), "--wait", "--timeout", "90s")
		cliDone <- out
	}()
	var id string
	eventually(t, "the rollout is recorded", func() bool {
		vs, err := f.reg.Rollouts(context.Background(), "web", false)
		if err == nil && len(vs) > 0 {
			id = vs[0].Record.ID
		}
		return id != ""
	})
	f.waitRollout(id, 30*time.Second, "taken by h1", func(v rollout.View, ph rollout.Phase) bool { return v.Progress["h1"].Took() })
	kill()
	said := <-cliDone
	t.Logf("the CLI, killed once h1 took the change, said:\n%s", said)
	// put --wait says the rollout in lines of counters, never a line per
	// host (only per offender: none here).
	if !regexp.MustCompile(`(?m)^rollout `+id+`: (starting|running), wave 1 of 3.* · (\d+ healthy( · \d+ [a-z]+)*|5 hosts, no count yet)$`).MatchString(said) ||
		regexp.MustCompile(`(?m)^h\d \(wave`).MatchString(said) {
		t.Errorf("put --wait: want lines of counters and no line per host:\n%s", said)
	}
	v0, err := f.reg.Rollout(context.Background(), id, true)
	if err != nil {
		t.Fatal(err)
	}
	r := v0.Record
	if !slices.Equal(r.WaveEnds, []int{1, 3, 5}) {
		t.Fatalf("waves %v", r.WaveEnds)
	}
	// Pause once the second wave's hosts took the change: they finish,
	// the third wave does not start.
	f.waitRollout(r.ID, 60*time.Second, "taken by wave 2", func(v rollout.View, ph rollout.Phase) bool {
		return v.Progress["h2"].Took() && v.Progress["h3"].Took()
	})
	if _, err := f.reg.UpdateRollout(context.Background(), r.ID, func(v rollout.View) error {
		v.Record.Paused, v.Record.PausedAt = true, time.Now()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	f.waitRollout(r.ID, 30*time.Second, "wave 2 done", func(v rollout.View, ph rollout.Phase) bool {
		return v.Progress["h2"] != nil && v.Progress["h2"].State == rollout.HostHealthy && v.Progress["h3"] != nil && v.Progress["h3"].State == rollout.HostHealthy
	})
	time.Sleep(1500 * time.Millisecond)
	for _, ev := range f.readEvents() {
		if (ev.host == "h4" || ev.host == "h5") && ev.stop {
			t.Fatalf("%s restarted while the rollout was paused (paused %v ago)", ev.host, time.Since(pausedAt).Round(time.Millisecond))
		}
	}
	if _, err := f.reg.UpdateRollout(context.Background(), r.ID, func(v rollout.View) error {
		v.Record.Paused, v.Record.ResumedAt = false, time.Now()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if out, code := e.cli("rollout", "status", r.ID, "--watch"); code != 0 || !strings.Contains(out, "phase:    done, wave 3 of 3") ||
		!strings.Contains(out, "[####################] 100% 5 healthy\n") {
		t.Fatalf("rollout status --watch: exit %d, want 0, done and 5 healthy\n%s", code, out)
	}
	v := f.waitRollout(r.ID, 10*time.Second, "done", func(v rollout.View, ph rollout.Phase) bool { return v.Record.End != nil })
	if v.Record.End.State != rollout.Done {
		t.Fatalf("rollout ended %+v", v.Record.End)
	}
	f.waitRolledOut(next, 30*time.Second)

	_, stops := checkWaveOrder(t, r, f.readEvents(), 0.5, soak)
	// Waves 2→3 include the pause; only 1→2 is shown.
	t.Logf("wave gap: wave 1's last host healthy → wave 2's first stop: %v", waveGap(v, stops, 1).Round(time.Millisecond))
}

func clearEvents(f *fleet) { os.Remove(f.events) }

// checkWaveOrder checks by systemd's clock (the units' own start and stop
// hooks, events) that each wave's first stop comes after the soak of
// every host of the wave before (its start + healthySec + soak), and that
// each host restarted exactly once: one stop and one start each, so no
// host ran the change twice or before its wave. It returns each host's
// start and stop.
func checkWaveOrder(t *testing.T, r *rollout.Record, evs []event, healthySec float64, soak time.Duration) (starts, stops map[string]float64) {
	t.Helper()
	starts, stops = map[string]float64{}, map[string]float64{}
	nStarts, nStops := map[string]int{}, map[string]int{}
	for _, ev := range evs {
		if ev.stop {
			stops[ev.host] = ev.at
			nStops[ev.host]++
		} else {
			starts[ev.host] = ev.at
			nStarts[ev.host]++
		}
	}
	for _, h := range r.Hosts {
		if nStarts[h] != 1 || nStops[h] != 1 {
			t.Errorf("%s: %d stops and %d starts of app.service during the rollout, want 1 each", h, nStops[h], nStarts[h])
		}
	}
	for w := 1; w < len(r.WaveEnds); w++ {
		var prevDone float64
		for _, h := range r.WaveHosts(w - 1) {
			prevDone = max(prevDone, starts[h]+healthySec+soak.Seconds())
		}
		for _, h := range r.WaveHosts(w) {
			if stops[h] == 0 {
				t.Fatalf("%s never restarted", h)
			}
			if stops[h] < prevDone-0.05 {
				t.Errorf("wave %d: %s stopped %.3fs before wave %d had soaked", w+1, h, prevDone-stops[h], w)
			}
			t.Logf("wave %d: %s stopped %.3fs after wave %d soaked", w+1, h, stops[h]-prevDone, w)
		}
	}
	return starts, stops
}

// waveGap is the gap the agents add between waves w-1 and w: from the
// last host of wave w-1 recorded healthy (its soak over) to the first
// stop of wave w (systemd's clock).
func waveGap(v rollout.View, stops map[string]float64, w int) time.Duration {
	var lastHealthy time.Time
	for _, h := range v.Record.WaveHosts(w - 1) {
		if p := v.Progress[h]; p != nil && p.HealthyAt.After(lastHealthy) {
			lastHealthy = p.HealthyAt
		}
	}
	first := 0.0
	for _, h := range v.Record.WaveHosts(w) {
		if first == 0 || stops[h] < first {
			first = stops[h]
		}
	}
	return time.Duration(first*1e9) - time.Duration(lastHealthy.UnixNano())
}

// An agent SIGKILLed while its host soaks a rollout's change resumes the
// soak when it starts again: the unit is not restarted (same MainPID),
// and the host counts as healthy once the soak that began before the kill
// is over, not a whole soak after the restart.
func TestRolloutSoakSurvivesAgentSIGKILL(t *testing.T) {
	t.Parallel()
	h := systemdtest.Start(t)
	etcd := registrytest.StartEtcd(t)
	reg := registrytest.NewClient(t, etcd.Endpoint())
	a := startCrashAgent(t, h, etcd.Endpoint(), "h1", "--group", "web")
	f := &fleet{t: t, reg: reg, events: filepath.Join(t.TempDir(), "events")}
	ctx := context.Background()
	v1 := f.unit("/bin/sleep 1000", "HealthySec=0.2")
	tg := registry.Target{Group: "web"}
	if _, err := reg.Put(ctx, tg, map[string][]byte{"app.service": []byte(v1)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "v1 runs", func() bool { return h.ActiveState(t, "app.service") == "active" })
	v2 := f.unit("/bin/sleep 1001", "HealthySec=0.2")
	soak := 4 * time.Second
	s := rollout.Strategy{Soak: soak, MaxRestarts: -1}
	r := &rollout.Record{ID: registry.NewRolloutID(time.Now()), Strategy: s, Hosts: []string{"h1"}, WaveEnds: s.WaveEnds(1)}
	if _, err := reg.Put(ctx, tg, map[string][]byte{"app.service": []byte(v2)}, registry.WithRollout(r, false)); err != nil {
		t.Fatal(err)
	}
	f.hosts = nil
	v := f.waitRollout(r.ID, 30*time.Second, "soaking on h1", func(v rollout.View, ph rollout.Phase) bool {
		return v.Progress["h1"] != nil && v.Progress["h1"].State == rollout.HostSoaking
	})
	soakingSince := v.Progress["h1"].Since
	pid := h.MainPID(t, "app.service")
	a.kill()
	time.Sleep(500 * time.Millisecond)
	startCrashAgent(t, h, etcd.Endpoint(), "h1", "--group", "web")
	restartedAt := time.Now()
	v = f.waitRollout(r.ID, 30*time.Second, "done", func(v rollout.View, ph rollout.Phase) bool { return v.Record.End != nil })
	p := v.Progress["h1"]
	if v.Record.End.State != rollout.Done || p.State != rollout.HostHealthy {
		t.Fatalf("rollout %+v, h1 %+v", v.Record.End, p)
	}
	// Resumed: healthy when the first soak ends; started over, it would be
	// a whole soak after the restart at the earliest.
	if got := p.HealthyAt.Sub(soakingSince); got < soak || !p.HealthyAt.Before(restartedAt.Add(soak-300*time.Millisecond)) {
		t.Errorf("h1 healthy %v after its soak began and %v after the agent's restart: want the %v soak resumed, not started over",
			got.Round(time.Millisecond), p.HealthyAt.Sub(restartedAt).Round(time.Millisecond), soak)
	} else {
		t.Logf("h1 healthy %v after its soak began, %v after the agent's restart (soak %v)", got.Round(time.Millisecond), p.HealthyAt.Sub(restartedAt).Round(time.Millisecond), soak)
	}
	if now := h.MainPID(t, "app.service"); now != pid {
		t.Errorf("app.service restarted by the agent's restart: MainPID %d → %d", pid, now)
	}
}

// The group's coordinator SIGKILLed mid-rollout (no resign: its election
// key goes only with its lease): another agent takes over within the
// lease TTL and a second, reads every host's progress and goes on from
// there. No host is admitted twice or before its wave: by the units' own
// start and stop hooks each host restarts exactly once, every wave after
// the one before soaked, and the rollout ends done with every host
// running the new version, the dead coordinator's host included (it had
// taken the change before it died).
func TestRolloutCoordinatorSIGKILLedMidRollout(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second // startCrashAgent's --lease-ttl
	etcd := registrytest.StartEtcd(t)
	f := &fleet{t: t, endpoint: etcd.Endpoint(), reg: registrytest.NewClient(t, etcd.Endpoint()), byRun: map[string]string{},
		events: filepath.Join(t.TempDir(), "events")}
	ctx := context.Background()
	// Each agent its own process, so that it can really be SIGKILLed; h1
	// starts first and waits to coordinate the group (the oldest candidate
	// wins), so that the coordinator is the canary, done before it dies.
	agents := map[string]*crashAgent{}
	for i := range 5 {
		host := fmt.Sprintf("h%d", i+1)
		h := systemdtest.Start(t)
		agents[host] = startCrashAgent(t, h, f.endpoint, host, "--group", "web", "--log-level", "info")
		f.hosts = append(f.hosts, &env{t: t, h: h, endpoint: f.endpoint, reg: f.reg, host: host, groups: []string{"web"}})
		f.byRun[filepath.Join(h.Dir, "run")] = host
		if host == "h1" {
			waitFor(t, agents[host], 20*time.Second, "h1 coordinates group web", func() bool {
				c, _ := f.reg.Coordinator(ctx, "web")
				return c == "h1"
			})
		}
	}
	eventually(t, "the five agents joined", func() bool {
		ms, _ := f.reg.Members(ctx)
		return len(ms) == 5
	})
	policy := "HealthySec=0.5"
	f.put(f.unit("/bin/sleep 1000", policy), 0)
	f.waitRolledOut(f.unit("/bin/sleep 1000", policy), 30*time.Second)
	before := f.pids()
	clearEvents(f)
	next := f.unit("/bin/sleep 1001", policy)
	soak := 2 * time.Second
	r := f.startRollout(next, rollout.Strategy{Waves: []rollout.Count{{N: 1}, {N: 50, Percent: true}}, Soak: soak})
	if !slices.Equal(r.WaveEnds, []int{1, 3, 5}) {
		t.Fatalf("waves %v", r.WaveEnds)
	}
	// Mid-rollout: wave 2 admitted and taking the change, not done.
	f.waitRollout(r.ID, 30*time.Second, "taken by wave 2", func(v rollout.View, ph rollout.Phase) bool {
		return v.Progress["h2"].Took() && v.Progress["h3"].Took()
	})
	if c, err := f.reg.Coordinator(ctx, "web"); err != nil || c != "h1" {
		t.Fatalf("coordinator %q (%v), want h1", c, err)
	}
	agents["h1"].kill()
	killed := time.Now()
	var elected, summarized time.Duration
	var next1 string
	waitFor(t, nil, ttl+5*time.Second, "another agent coordinates and summarizes the rollout", func() bool {
		c, _ := f.reg.Coordinator(ctx, "web")
		if c != "" && c != "h1" && elected == 0 {
			elected, next1 = time.Since(killed), c
		}
		v, err := f.reg.Rollout(ctx, r.ID, false)
		if err == nil && elected > 0 && v.Summary != nil && v.Summary.Coordinator == next1 {
			summarized = time.Since(killed)
			return true
		}
		return false
	})
	t.Logf("h1 (the coordinator) SIGKILLed: %s elected after %v, its first summary after %v (lease TTL %v)",
		next1, elected.Round(time.Millisecond), summarized.Round(time.Millisecond), ttl)
	if summarized > ttl+time.Second {
		t.Errorf("the new coordinator took over %v after the kill: want within the lease TTL %v and about a second", summarized.Round(time.Millisecond), ttl)
	}
	v := f.waitRollout(r.ID, 60*time.Second, "ended and summarized", func(v rollout.View, ph rollout.Phase) bool {
		return v.Record.End != nil && v.Summary != nil && v.Summary.Phase.State.Ended()
	})
	if v.Record.End.State != rollout.Done || v.Summary.Counts[rollout.HostHealthy] != 5 || v.Summary.Coordinator != next1 {
		t.Fatalf("rollout ended %+v, summary %+v", v.Record.End, v.Summary)
	}
	// Every host runs the new version (h1 too, without its agent): the
	// file on disk, and a new MainPID.
	after := f.pids()
	for _, e := range f.hosts {
		if got, _ := e.readLocal("app.service"); got != next {
			t.Errorf("%s: app.service on disk is not the new version", e.host)
		}
		if after[e.host] == 0 || after[e.host] == before[e.host] {
			t.Errorf("%s: MainPID %d → %d: not restarted on the new version", e.host, before[e.host], after[e.host])
		}
	}
	_, stops := checkWaveOrder(t, r, f.readEvents(), 0.5, soak)
	t.Logf("wave gaps: 1→2 %v, 2→3 %v (the takeover fell in wave 2's soak)",
		waveGap(v, stops, 1).Round(time.Millisecond), waveGap(v, stops, 2).Round(time.Millisecond))
}
