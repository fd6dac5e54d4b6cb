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
// change: their unit file and MainPID are what they were.
func TestRolloutFailedCanaryIsRevertedAndOthersNeverTakeIt(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 5, "")
	policy := "HealthySec=1"
	good := f.unit("/bin/sleep 1000", policy)
	f.put(good, 0)
	before := f.pids()
	bad := f.unit("/bin/sleep 1001", policy+"\nHealthCmd=/bin/false\nHealthIntervalSec=200ms\nHealthRetries=2")
	r := f.startRollout(bad, rollout.Strategy{Canary: rollout.Count{N: 1}, AutoRevert: true})
	v := f.waitRollout(r.ID, 60*time.Second, "failed with h1 reverted", func(v rollout.View, ph rollout.Phase) bool {
		p := v.Progress["h1"]
		return v.Record.End != nil && p != nil && p.State == rollout.HostReverted
	})
	if v.Record.End.State != rollout.Failed {
		t.Fatalf("rollout ended %+v, want failed", v.Record.End)
	}
	t.Logf("rollout %s: %s", r.ID, v.Record.End.Reason)
	after := f.pids()
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
