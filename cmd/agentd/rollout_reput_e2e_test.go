package main

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/rollout"
)

// Writes after an aborted rollout, and a host that joins mid-wave, on
// real systemd (one `systemd --user` per host, one etcd, the agents
// in-process with the code `agentd run` runs). What the hosts did is read
// from systemd (MainPID), the unit files on disk and the units' own start
// and stop hooks; the rollouts from their etcd keys; the commands by their
// exit codes.

// cliResult is a command run in the background.
type cliResult struct {
	out  string
	code int
}

// putBackground runs `unit put app.service --group web --wait` with extra
// flags from the first host in the background.
func (f *joinFleet) putBackground(content string, extra ...string) <-chan cliResult {
	f.t.Helper()
	e := f.hosts[0]
	args := append([]string{"unit", "put", e.writeUnit("app.service", content), "--group", "web", "--wait"}, extra...)
	done := make(chan cliResult, 1)
	go func() {
		out, code := e.cli(args...)
		done <- cliResult{out, code}
	}()
	return done
}

// dryRunPrediction is one line of `unit put --dry-run --json`.
type dryRunPrediction struct {
	Host  string     `json:"host"`
	Unit  string     `json:"unit"`
	Do    string     `json:"do"`
	Event string     `json:"event"`
	Waves [][]string `json:"waves"`
}

// dryRun runs `unit put app.service --group web --dry-run --json` of
// content with extra flags and returns what it predicts per host, and the
// waves of its rollout preview (nil: none).
func (f *joinFleet) dryRun(content string, extra ...string) (map[string]string, [][]string) {
	f.t.Helper()
	e := f.hosts[0]
	out, code := e.cli(append([]string{"unit", "put", e.writeUnit("app.service", content), "--group", "web", "--dry-run", "--json"}, extra...)...)
	if code != 0 {
		f.t.Fatalf("unit put --dry-run %s: exit %d\n%s", strings.Join(extra, " "), code, out)
	}
	do := map[string]string{}
	var waves [][]string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var p dryRunPrediction
		if err := json.Unmarshal([]byte(line), &p); err != nil {
			f.t.Fatalf("unit put --dry-run --json: not a JSON line: %q", line)
		}
		switch {
		case p.Event == "rollout-preview":
			waves = p.Waves
		case p.Unit == "app.service":
			do[p.Host] = p.Do
		}
	}
	return do, waves
}

// abortCanary starts a rollout of next (--canary 1 --pause-after-canary,
// put --wait in the background), waits for the canary h1 healthy on it
// while the others keep prev, aborts it with --revert and waits until h1
// runs prev again by systemd's view (the file on disk, a new MainPID, and
// its status healthy on it). It returns the rollout's ID and the
// background put.
func (f *joinFleet) abortCanary(next, prev string) (string, <-chan cliResult) {
	f.t.Helper()
	t := f.t
	before := f.pids()
	var known []string
	if vs, err := f.reg.Rollouts(context.Background(), "web", false); err == nil {
		for _, v := range vs {
			known = append(known, v.Record.ID)
		}
	}
	putDone := f.putBackground(next, "--canary", "1", "--pause-after-canary", "--timeout", "20s")
	id := f.newestRollout(known...)
	f.waitRollout(id, 20*time.Second, "waiting for promote, h1 healthy", func(v rollout.View, ph rollout.Phase) bool {
		return ph.State == rollout.WaitingPromote
	})
	canary := runsHealthy(t, f.hosts[0], next, "the canary of "+id)
	if canary == before["h1"] {
		t.Fatalf("rollout %s: h1 (the canary) healthy on the change without a restart: MainPID %d", id, canary)
	}
	for _, e := range f.hosts[1:] {
		runsHealthy(t, e, prev, "waiting for promote")
	}
	if out, code := f.hosts[1].cli("rollout", "abort", id, "--revert"); code != 0 || !strings.Contains(out, "go back to the previous version (h1)") {
		t.Fatalf("rollout abort %s --revert: exit %d\n%s", id, code, out)
	}
	h1 := f.hosts[0]
	waitFor(t, nil, 20*time.Second, "h1 runs the previous version again (systemd's view)", func() bool {
		got, _ := h1.readLocal("app.service")
		pid := h1.h.MainPID(t, "app.service")
		return got == prev && pid != 0 && pid != canary && h1.h.ActiveState(t, "app.service") == "active"
	})
	return id, putDone
}

// A plain `unit put --wait` after a rollout aborted with --revert (its
// canary h1 back on the previous version by systemd's view) is not
// superseded by the ended rollout: it exits 0, every host runs the new
// content (the file, a new MainPID), and `unit put --dry-run` said so
// before (restart on every host). The same with a re-put as a rollout
// (--canary 1 --wait) after another abort: exit 0, every host on the new
// content.
func TestRolloutRePutAfterAbortRuns(t *testing.T) {
	t.Parallel()
	f := newJoinFleet(t, false, "h1", "h2", "h3")
	ctx := context.Background()
	policy := "HealthySec=0.5"
	v1 := f.unit("/bin/sleep 1000", policy)
	f.putApp(ctx, v1, 0)
	f.waitRolledOut(v1, 20*time.Second)

	// rePut checks a put of content that follows an aborted rollout
	// (extra: its rollout flags): what the dry run predicts, the put's
	// exit, and what every host did by systemd's view.
	rePut := func(what, content string, extra ...string) (string, [][]string) {
		t.Helper()
		before := f.pids()
		clearEvents(f.fleet)
		predicted, waves := f.dryRun(content, extra...)
		t.Logf("%s: the dry run predicts %v, waves %v", what, predicted, waves)
		out, took := f.putApp(ctx, content, 0, extra...)
		t.Logf("%s: put --wait took %v", what, took.Round(time.Millisecond))
		if strings.Contains(out, "superseded") {
			t.Errorf("%s: put --wait says superseded:\n%s", what, out)
		}
		if got, err := f.reg.Get(ctx, registry.Target{Group: "web"}, "app.service"); err != nil || string(got) != content {
			t.Errorf("%s: groups/web/units/app.service holds %q (%v), want the new content", what, got, err)
		}
		after := f.pids()
		evs := f.readEvents()
		for _, e := range f.hosts {
			runsHealthy(t, e, content, what)
			restarted := after[e.host] != 0 && after[e.host] != before[e.host]
			starts, stops := eventsOf(evs, e.host)
			if !restarted || starts != 1 || stops != 1 {
				t.Errorf("%s: %s: MainPID %d → %d, %d starts and %d stops by the unit's hooks: want it restarted once onto the new content",
					what, e.host, before[e.host], after[e.host], starts, stops)
			}
			if p := predicted[e.host]; p != reconcile.DoRestart {
				t.Errorf("%s: the dry run predicted %q for %s, which restarted onto the new content", what, p, e.host)
			}
		}
		if len(predicted) != len(f.hosts) {
			t.Errorf("%s: the dry run predicted for %v, want every host of the group", what, predicted)
		}
		return out, waves
	}
	// aborted checks the aborted rollout's background put --wait and its
	// record: it ended aborted (not superseded by the write after it).
	aborted := func(id string, putDone <-chan cliResult) {
		t.Helper()
		select {
		case r := <-putDone:
			if r.code != exitFailed || !strings.Contains(r.out, "rollout "+id+" aborted") {
				t.Errorf("the put --wait of rollout %s: exit %d, want %d saying it was aborted:\n%s", id, r.code, exitFailed, r.out)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("the put --wait of rollout %s did not end within 20s of the write after its abort", id)
		}
		v, err := f.reg.Rollout(ctx, id, true)
		if err != nil {
			t.Fatal(err)
		}
		if v.Record.End == nil || v.Record.End.State != rollout.Aborted {
			t.Errorf("rollout %s ended %+v, want aborted", id, v.Record.End)
		}
		if p := v.Progress["h1"]; p == nil || p.State != rollout.HostReverted {
			t.Errorf("rollout %s: h1's progress %+v, want reverted", id, p)
		}
		if out, code := f.hosts[0].cli("rollout", "status", id); code != 0 || !strings.Contains(out, "phase:    aborted") {
			t.Errorf("rollout status %s: exit %d, want 0 and aborted:\n%s", id, code, out)
		}
	}

	// A plain put after abort --revert.
	v2 := f.unit("/bin/sleep 1001", policy)
	id2, put2 := f.abortCanary(v2, v1)
	v3 := f.unit("/bin/sleep 1002", policy)
	if _, waves := rePut("the plain put after abort --revert", v3); waves != nil {
		t.Errorf("the dry run of a put without rollout options previews waves %v", waves)
	}
	aborted(id2, put2)

	// A rollout after abort --revert.
	v4 := f.unit("/bin/sleep 1003", policy)
	id4, put4 := f.abortCanary(v4, v3)
	v5 := f.unit("/bin/sleep 1004", policy)
	out, waves := rePut("the rollout after abort --revert", v5, "--canary", "1")
	id5 := rolloutID(t, out)
	aborted(id4, put4)
	v, err := f.reg.Rollout(ctx, id5, true)
	if err != nil {
		t.Fatal(err)
	}
	if v.Record.End == nil || v.Record.End.State != rollout.Done || v.Record.After != id4 {
		t.Errorf("rollout %s: ended %+v, after %q: want done, after the aborted %s", id5, v.Record.End, v.Record.After, id4)
	}
	for _, e := range f.hosts {
		if p := v.Progress[e.host]; p == nil || p.State != rollout.HostHealthy {
			t.Errorf("rollout %s: %s's progress %+v, want healthy", id5, e.host, p)
		}
	}
	var ran [][]string
	for w := range v.Record.WaveEnds {
		ran = append(ran, v.Record.WaveHosts(w))
	}
	if !slices.EqualFunc(waves, ran, slices.Equal) || len(ran) != 2 {
		t.Errorf("the dry run's waves %v, the rollout's hosts %v in waves %v: want the same", waves, v.Record.Hosts, v.Record.WaveEnds)
	}
}

// A host whose agent joins group web while wave 2 of a rollout (--waves
// 1,2,100% --soak 3s) soaks keeps the previous content until the last
// wave, which the coordinator adds it to (`rollout status --hosts all`
// lists it there); it takes the change exactly once, with that wave, and
// the rollout ends done: the put --wait that started it exits 0.
func TestRolloutJoinerMidWave(t *testing.T) {
	t.Parallel()
	f := newJoinFleet(t, false, "h1", "h2", "h3")
	h4 := f.prepare("h4")
	ctx := context.Background()
	raw := registrytest.RawClient(t, f.endpoint)
	admission := func(id, host string) (*rollout.Admission, int64) {
		t.Helper()
		resp, err := raw.Get(ctx, registry.DefaultPrefix+"/rollouts/admit/web/"+host+"/"+id)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return nil, 0
		}
		var a rollout.Admission
		if err := json.Unmarshal(resp.Kvs[0].Value, &a); err != nil {
			t.Fatal(err)
		}
		return &a, resp.Kvs[0].CreateRevision
	}

	const healthySec = 0.5
	policy := "HealthySec=0.5"
	v1 := f.unit("/bin/sleep 1000", policy)
	f.putApp(ctx, v1, 0)
	f.waitRolledOut(v1, 20*time.Second)
	before := f.pids()
	clearEvents(f.fleet)

	v2 := f.unit("/bin/sleep 1001", policy)
	soak := 3 * time.Second
	putDone := f.putBackground(v2, "--waves", "1,2,100%", "--soak", soak.String(), "--timeout", "60s")
	id := f.newestRollout()
	f.waitRollout(id, 20*time.Second, "wave 2 (h2) soaking", func(v rollout.View, ph rollout.Phase) bool {
		p := v.Progress["h2"]
		return p != nil && p.State == rollout.HostSoaking
	})

	// h4 joins while h2 soaks.
	f.join(h4)
	v := f.waitRollout(id, 10*time.Second, "h4 added to the last wave", func(v rollout.View, ph rollout.Phase) bool {
		return slices.Contains(v.Record.Joined, "h4")
	})
	joinRev := v.Record.ModRevision
	if !slices.Equal(v.Record.Hosts, []string{"h1", "h2", "h3", "h4"}) || !slices.Equal(v.Record.WaveEnds, []int{1, 2, 4}) || v.Record.Wave("h4") != 2 {
		t.Errorf("after h4 joined: hosts %v, waves %v, h4 in wave %d: want h4 in the last wave (3)", v.Record.Hosts, v.Record.WaveEnds, v.Record.Wave("h4")+1)
	}
	if p := v.Progress["h3"]; p != nil {
		t.Errorf("h4 was added after wave 3 opened (h3 %+v): the test wants it to join while wave 2 soaks", p)
	}
	out, code := f.hosts[0].cli("rollout", "status", id, "--hosts", "all")
	if code != 0 || !strings.Contains(out, "waves:    1, 2, 4 of 4 hosts") ||
		!regexp.MustCompile(`(?m)^h1\s+1\s+healthy\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^h3\s+3\s+pending\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^h4\s+3\s+pending\s`).MatchString(out) {
		t.Errorf("rollout status --hosts all: exit %d, want h4 pending in the last wave (3) with h3:\n%s", code, out)
	}

	// By systemd's view h4 runs the previous version, and keeps it until
	// its wave opens.
	var s reconcile.Status
	waitFor(t, nil, 20*time.Second, "h4 runs app.service", func() bool {
		s, _ = h4.status("app.service")
		return s.ActiveState == "active" && !s.Verifying && s.Hash == s.DesiredHash
	})
	joinedPID := runsHealthy(t, h4, v1, "h4 joined while wave 2 soaks")
	for {
		a, _ := admission(id, "h4")
		got, _ := h4.readLocal("app.service")
		pid := h4.h.MainPID(t, "app.service")
		if a != nil {
			break
		}
		if got != v1 || pid != joinedPID {
			t.Fatalf("h4 left the previous version before its wave: MainPID %d → %d, on disk:\n%s", joinedPID, pid, got)
		}
		time.Sleep(50 * time.Millisecond)
	}

	select {
	case r := <-putDone:
		if r.code != 0 || strings.Contains(r.out, "superseded") {
			t.Errorf("put --waves 1,2,100%% --wait: exit %d, want 0:\n%s", r.code, r.out)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("put --wait did not end within 40s")
	}
	v, err := f.reg.Rollout(ctx, id, true)
	if err != nil {
		t.Fatal(err)
	}
	if v.Record.End == nil || v.Record.End.State != rollout.Done || v.Summary == nil || v.Summary.Counts[rollout.HostHealthy] != 4 || v.Summary.Total != 4 {
		t.Fatalf("rollout ended %+v, summary %+v: want done, 4 of 4 healthy", v.Record.End, v.Summary)
	}
	for _, h := range v.Record.Hosts {
		if p := v.Progress[h]; p == nil || p.State != rollout.HostHealthy {
			t.Errorf("%s's progress %+v, want healthy", h, p)
		}
	}
	// The etcd keys: h4 admitted once, to wave 3, with h3, after it was
	// added.
	a3, rev3 := admission(id, "h3")
	a4, rev4 := admission(id, "h4")
	if a3 == nil || a4 == nil || a3.Wave != 2 || a4.Wave != 2 || rev4 <= joinRev {
		t.Errorf("admissions: h3 %+v (revision %d), h4 %+v (revision %d), h4 added at revision %d: want both in wave 3, after h4 was added",
			a3, rev3, a4, rev4, joinRev)
	}
	if out, code := f.hosts[0].cli("rollout", "status", id, "--hosts", "all"); code != 0 || !strings.Contains(out, "phase:    done") ||
		!regexp.MustCompile(`(?m)^h4\s+3\s+healthy\s`).MatchString(out) {
		t.Errorf("rollout status --hosts all after the rollout: exit %d, want done with h4 healthy in wave 3:\n%s", code, out)
	}

	// By systemd's view: every host on the new version, each restarted
	// once onto it (h4 started on the previous one first), no wave before
	// the one before it soaked.
	f.waitRolledOut(v2, 20*time.Second)
	after := f.pids()
	for _, e := range f.hosts {
		runsHealthy(t, e, v2, "after the rollout")
		was := before[e.host]
		if e.host == "h4" {
			was = joinedPID
		}
		if after[e.host] == 0 || after[e.host] == was {
			t.Errorf("%s: MainPID %d → %d: not restarted onto the new version", e.host, was, after[e.host])
		}
	}
	evs := f.readEvents()
	starts, stops := map[string]float64{}, map[string]float64{}
	for _, ev := range evs {
		if ev.stop {
			stops[ev.host] = ev.at
		} else {
			starts[ev.host] = ev.at
		}
	}
	for _, h := range []string{"h1", "h2", "h3", "h4"} {
		n, m := eventsOf(evs, h)
		wantStarts := 1
		if h == "h4" {
			wantStarts = 2 // the previous version when it joined, then the change
		}
		if n != wantStarts || m != 1 {
			t.Errorf("%s: %d starts and %d stops by the unit's hooks, want %d and 1 (the change taken once)", h, n, m, wantStarts)
		}
	}
	for _, w := range []struct {
		hosts []string
		after string
	}{{[]string{"h2"}, "h1"}, {[]string{"h3", "h4"}, "h2"}} {
		soaked := starts[w.after] + healthySec + soak.Seconds()
		for _, h := range w.hosts {
			if stops[h] < soaked-0.05 {
				t.Errorf("%s stopped %.3fs before %s (the wave before) had soaked", h, soaked-stops[h], w.after)
			} else {
				t.Logf("%s stopped %.3fs after %s soaked", h, stops[h]-soaked, w.after)
			}
		}
	}
}
