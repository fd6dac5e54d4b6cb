package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/rollout"
)

// Rollouts on real systemd (one `systemd --user` per host, one etcd, the
// agents in-process with exactly the code `agentd run` runs): signed
// rollouts going back (auto-revert, abort --revert) under
// --allowed-signers, `unit revert` skipping the versions that failed, and
// hosts that join the group while a rollout runs. What the hosts did is
// read from systemd (MainPID), the unit files on disk and the units' own
// start and stop hooks (fleet.unit); the commands by their exit codes and
// what they say.

// joinFleet is a fleet whose hosts can be made ahead (their systemd
// started) and whose agents start later, optionally with --allowed-signers.
type joinFleet struct {
	*fleet
	// key signs the changes (--sign-key), allowed lists it
	// (--allowed-signers); "" when the fleet is not signed.
	key     sshKey
	allowed string
}

// newJoinFleet starts etcd and, for each of hosts, its systemd and its
// agent (group web). signed: every agent runs with --allowed-signers
// naming alice, whose key signs the test's writes.
func newJoinFleet(t *testing.T, signed bool, hosts ...string) *joinFleet {
	t.Helper()
	endpoint := registrytest.StartEtcd(t).Endpoint()
	f := &joinFleet{fleet: &fleet{t: t, endpoint: endpoint, reg: registrytest.NewClient(t, endpoint), byRun: map[string]string{},
		events: filepath.Join(t.TempDir(), "events")}}
	if signed {
		dir := t.TempDir()
		f.key = newSSHKey(t, dir, "alice@example.com")
		f.allowed = filepath.Join(dir, "allowed_signers")
		if err := os.WriteFile(f.allowed, []byte(f.key.line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range hosts {
		f.join(f.prepare(h))
	}
	return f
}

// prepare starts host's systemd; its agent is not started (join).
func (f *joinFleet) prepare(host string) *env {
	f.t.Helper()
	h := systemdtest.Start(f.t)
	f.byRun[filepath.Join(h.Dir, "run")] = host
	return &env{t: f.t, h: h, endpoint: f.endpoint, reg: f.reg, host: host, groups: []string{"web"}}
}

// join starts e's agent: the host joins group web.
func (f *joinFleet) join(e *env) {
	f.t.Helper()
	e.startAgentOn([]string{f.endpoint}, func(o *runOptions) {
		o.logLevel = "info"
		if f.allowed != "" {
			o.allowedSigners = f.allowed
		}
	})
	f.hosts = append(f.hosts, e)
}

// sign is the --sign-key flag of a signed fleet.
func (f *joinFleet) sign() []string {
	if f.allowed == "" {
		return nil
	}
	return []string{"--sign-key", f.key.file}
}

// putApp runs `unit put app.service --group web --wait` (signed in a
// signed fleet) with extra flags from the first host and wants exit
// code want; it returns the output and how long the command took.
func (f *joinFleet) putApp(ctx context.Context, content string, want int, extra ...string) (string, time.Duration) {
	f.t.Helper()
	e := f.hosts[0]
	args := append([]string{"unit", "put", e.writeUnit("app.service", content), "--group", "web", "--wait", "--timeout", "60s"}, f.sign()...)
	start := time.Now()
	out, code := e.cliCtx(ctx, append(args, extra...)...)
	took := time.Since(start)
	if code != want {
		f.t.Errorf("unit put %s: exit %d after %v, want %d\n%s", strings.Join(extra, " "), code, took.Round(time.Millisecond), want, out)
	}
	return out, took
}

// newestRollout waits for the newest rollout of group web other than
// those in not, and returns its ID.
func (f *joinFleet) newestRollout(not ...string) string {
	f.t.Helper()
	var id string
	eventually(f.t, "the rollout is recorded", func() bool {
		vs, err := f.reg.Rollouts(context.Background(), "web", false)
		if err == nil && len(vs) > 0 && !slices.Contains(not, vs[0].Record.ID) {
			id = vs[0].Record.ID
		}
		return id != ""
	})
	return id
}

// eventsOf counts host's start and stop events (the unit's own hooks).
func eventsOf(evs []event, host string) (starts, stops int) {
	for _, ev := range evs {
		if ev.host != host {
			continue
		}
		if ev.stop {
			stops++
		} else {
			starts++
		}
	}
	return starts, stops
}

// runsHealthy checks by systemd's view that e runs content: the file on
// disk, a MainPID, and a status without a refusal or error (for a signed
// fleet: the agent accepted the content's signature). It returns the
// MainPID.
func runsHealthy(t *testing.T, e *env, content, what string) uint32 {
	t.Helper()
	if got, _ := e.readLocal("app.service"); got != content {
		t.Errorf("%s: %s: app.service on disk is not the version expected:\n%s", what, e.host, got)
	}
	pid := e.h.MainPID(t, "app.service")
	if pid == 0 {
		t.Errorf("%s: %s: app.service does not run", what, e.host)
	}
	if s, _ := e.status("app.service"); s.Error != "" || s.Hash != reconcile.Hash([]byte(content)) {
		t.Errorf("%s: %s: status %+v: want the version expected, no error", what, e.host, s)
	}
	return pid
}

// Signed rollouts go back. Agents with --allowed-signers; a signed
// `unit put --group web --canary 1 --auto-revert --wait` whose canary
// fails its health probe exits 3 promptly (not at --timeout), and every
// host ends on the previous version by systemd's view: the canary back on
// the previous file with a new MainPID (the agent accepted the signed way
// back), the others never restarted. A second failed change after the
// first goes back the same way (to the last good version, past the
// failed one). Then `unit revert --sign-key` without --to puts back the
// last healthy version, not the one that failed just before the current
// one, and says nothing of a supersede; a second revert finds the key
// already holds it.
func TestRolloutSignedFailedCanaryGoesBackAndRevertSkipsFailed(t *testing.T) {
	t.Parallel()
	f := newJoinFleet(t, true, "h1", "h2", "h3")
	ctx := context.Background()
	policy := "HealthySec=1"
	good := f.unit("/bin/sleep 1000", policy)
	f.putApp(ctx, good, 0)
	f.waitRolledOut(good, 30*time.Second)
	before := f.pids()
	clearEvents(f.fleet)
	badPolicy := policy + "\nHealthCmd=/bin/false\nHealthIntervalSec=200ms\nHealthRetries=2"
	var ids []string
	h1pid := before["h1"]
	for i, bad := range []string{f.unit("/bin/sleep 1001", badPolicy), f.unit("/bin/sleep 1002", badPolicy)} {
		n := strconv.Itoa(i + 1)
		out, took := f.putApp(ctx, bad, exitFailed, "--canary", "1", "--auto-revert")
		id := rolloutID(t, out)
		ids = append(ids, id)
		t.Logf("failed change %s: put --wait exited after %v", n, took.Round(time.Millisecond))
		if took > 30*time.Second {
			t.Errorf("failed change %s: put --wait took %v: want it to exit once the canary went back, long before --timeout 60s", n, took.Round(time.Millisecond))
		}
		if !strings.Contains(out, "rollout "+id+" failed — h1 failed the change") || !strings.Contains(out, "reverted to the previous version: h1") ||
			strings.Contains(out, "could not go back") {
			t.Errorf("failed change %s: put --wait does not say h1 failed and went back:\n%s", n, out)
		}
		v, err := f.reg.Rollout(ctx, id, true)
		if err != nil {
			t.Fatal(err)
		}
		if p := v.Progress["h1"]; v.Record.End == nil || v.Record.End.State != rollout.Failed || p == nil || p.State != rollout.HostReverted {
			t.Fatalf("failed change %s: rollout ended %+v, h1 %+v: want failed and h1 reverted", n, v.Record.End, p)
		}
		if u := v.Record.Units["app.service"]; u.BackSig == "" {
			t.Errorf("failed change %s: the signed rollout has no signed way back", n)
		}
		// By systemd's view: every host on the previous (good) version;
		// the canary restarted onto it, the others never restarted.
		after := f.pids()
		for _, e := range f.hosts {
			runsHealthy(t, e, good, "failed change "+n)
			switch {
			case e.host == "h1" && (after["h1"] == h1pid || after["h1"] == 0):
				t.Errorf("failed change %s: h1 (the canary) did not run the change and come back: MainPID %d → %d", n, h1pid, after["h1"])
			case e.host != "h1" && after[e.host] != before[e.host]:
				t.Errorf("failed change %s: %s restarted: MainPID %d → %d", n, e.host, before[e.host], after[e.host])
			}
		}
		h1pid = after["h1"]
	}
	evs := f.readEvents()
	for _, e := range f.hosts {
		starts, stops := eventsOf(evs, e.host)
		want := 0
		if e.host == "h1" {
			want = 4 // twice: the change, and back
		}
		if starts != want || stops != want {
			t.Errorf("%s: %d starts and %d stops of app.service by its own hooks, want %d each", e.host, starts, stops, want)
		}
	}

	// The key holds the second failed version, the one before it failed
	// too: a revert without --to puts back the last healthy one.
	hist, err := f.reg.History(ctx, registry.Target{Group: "web"}, "app.service")
	if err != nil {
		t.Fatal(err)
	}
	goodRev := int64(0)
	for _, v := range hist.Versions {
		if v.Hash == reconcile.Hash([]byte(good)) {
			goodRev = v.Revision
		}
	}
	if len(hist.Versions) != 3 || goodRev != hist.Versions[0].Revision {
		t.Fatalf("history: %d versions, good at revision %d: want good, then the two failed ones", len(hist.Versions), goodRev)
	}
	clearEvents(f.fleet)
	e := f.hosts[0]
	revert := append([]string{"unit", "revert", "app.service", "--group", "web", "--wait", "--timeout", "30s"}, f.sign()...)
	out, code := e.cli(revert...)
	if code != 0 || !strings.Contains(out, "reverted groups/web/units/app.service to revision "+strconv.FormatInt(goodRev, 10)+" ") {
		t.Errorf("unit revert: exit %d, want 0 and the good version (revision %d) put back, not the failed one before the current:\n%s", code, goodRev, out)
	}
	if strings.Contains(strings.ToLower(out), "supersede") {
		t.Errorf("unit revert says superseded, with no write after it:\n%s", out)
	}
	// Every host runs it already: nothing restarts, and each agent
	// accepts the revert's signature.
	after := f.pids()
	for _, e := range f.hosts {
		runsHealthy(t, e, good, "after the revert")
		want := before[e.host]
		if e.host == "h1" {
			want = h1pid
		}
		if after[e.host] != want {
			t.Errorf("after the revert: %s restarted: MainPID %d → %d", e.host, want, after[e.host])
		}
	}
	if evs := f.readEvents(); len(evs) > 0 {
		t.Errorf("the revert to the version every host runs restarted units: %+v", evs)
	}
	// Again: the version before the current one is a failed one; the
	// last healthy one is the current content.
	out, code = e.cli(revert...)
	if code != 0 || !strings.Contains(out, "already holds the content of revision "+strconv.FormatInt(goodRev, 10)) || strings.Contains(strings.ToLower(out), "supersede") {
		t.Errorf("a second unit revert: exit %d, want 0 and the key said to hold the good version already:\n%s", code, out)
	}
	for _, id := range ids {
		if out, code := e.cli("rollout", "status", id); code != 0 || !strings.Contains(out, "phase:    failed") {
			t.Errorf("rollout status %s after the revert: exit %d, want it still failed:\n%s", id, code, out)
		}
	}
}

// A signed rollout aborted with --revert after its canary (h1,
// --pause-after-canary) took the change healthy: h1 goes back to the
// previous version by systemd's view (the file, a new MainPID; its agent
// accepts the signed way back), the other host never restarted, and both
// `rollout status --watch` and the put --wait that started it exit 3
// saying the rollout was aborted and h1 reverted.
func TestRolloutSignedAbortRevertGoesBack(t *testing.T) {
	t.Parallel()
	f := newJoinFleet(t, true, "h1", "h2")
	ctx := context.Background()
	good := f.unit("/bin/sleep 1000", "HealthySec=0.5")
	f.putApp(ctx, good, 0)
	f.waitRolledOut(good, 30*time.Second)
	before := f.pids()
	clearEvents(f.fleet)
	next := f.unit("/bin/sleep 1001", "HealthySec=0.5")
	type result struct {
		out  string
		code int
	}
	putDone := make(chan result, 1)
	go func() {
		e := f.hosts[0]
		args := append([]string{"unit", "put", e.writeUnit("app.service", next), "--group", "web", "--canary", "1", "--pause-after-canary",
			"--wait", "--timeout", "60s"}, f.sign()...)
		out, code := e.cli(args...)
		putDone <- result{out, code}
	}()
	id := f.newestRollout()
	f.waitRollout(id, 30*time.Second, "waiting for promote, h1 healthy", func(v rollout.View, ph rollout.Phase) bool {
		return ph.State == rollout.WaitingPromote
	})
	canary := runsHealthy(t, f.hosts[0], next, "the canary")
	if canary == before["h1"] {
		t.Fatalf("h1 (the canary) healthy on the change without a restart: MainPID %d", canary)
	}
	runsHealthy(t, f.hosts[1], good, "waiting for promote")
	e := f.hosts[1] // not the canary: any host's CLI will do
	if out, code := e.cli("rollout", "abort", id, "--revert"); code != 0 || !strings.Contains(out, "go back to the previous version (h1)") {
		t.Fatalf("rollout abort --revert: exit %d\n%s", code, out)
	}
	want := regexp.MustCompile(`rollout ` + id + ` aborted — aborted by .*, with --revert; reverted to the previous version: h1\n`)
	out, code := e.cli("rollout", "status", id, "--watch")
	if code != exitFailed || !want.MatchString(out) {
		t.Errorf("rollout status --watch: exit %d, want %d saying it aborted and h1 reverted:\n%s", code, exitFailed, out)
	}
	select {
	case r := <-putDone:
		if r.code != exitFailed || !want.MatchString(r.out) {
			t.Errorf("put --wait: exit %d, want %d saying it aborted and h1 reverted:\n%s", r.code, exitFailed, r.out)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("put --wait did not end within 15s of the abort's revert")
	}
	// By systemd's view: h1 back on the previous version, restarted onto
	// it; h2 never restarted.
	after := f.pids()
	runsHealthy(t, f.hosts[0], good, "after abort --revert")
	runsHealthy(t, f.hosts[1], good, "after abort --revert")
	if after["h1"] == canary || after["h1"] == before["h1"] {
		t.Errorf("h1 did not restart onto the previous version: MainPID %d (before %d, on the change %d)", after["h1"], before["h1"], canary)
	}
	if after["h2"] != before["h2"] {
		t.Errorf("h2 restarted: MainPID %d → %d", before["h2"], after["h2"])
	}
	evs := f.readEvents()
	if starts, stops := eventsOf(evs, "h1"); starts != 2 || stops != 2 {
		t.Errorf("h1: %d starts and %d stops by the unit's hooks, want 2 each (the change, and back)", starts, stops)
	}
	if starts, stops := eventsOf(evs, "h2"); starts != 0 || stops != 0 {
		t.Errorf("h2: %d starts and %d stops by the unit's hooks, want none", starts, stops)
	}
}

// Hosts that join group web while a rollout runs. h3's agent starts while
// the canary (h1) waits for promote: it runs the previous version (its
// unit never starts on the new one: the file on disk, its MainPID, the
// unit's own hooks), and the coordinator adds it to the last wave, as
// `rollout status --hosts all` shows; after `rollout promote` it takes
// the change in the last wave. h4's agent starts after a later rollout
// was aborted with --revert: it runs the previous version (the last good
// one), not the aborted change, and is not added to the ended rollout.
func TestRolloutJoinersKeepPreviousUntilLastWave(t *testing.T) {
	t.Parallel()
	f := newJoinFleet(t, false, "h1", "h2")
	h3, h4 := f.prepare("h3"), f.prepare("h4")
	ctx := context.Background()
	e := f.hosts[0]
	policy := "HealthySec=0.5"
	v1 := f.unit("/bin/sleep 1000", policy)
	f.putApp(ctx, v1, 0)
	f.waitRolledOut(v1, 30*time.Second)
	before := f.pids()
	clearEvents(f.fleet)

	v2 := f.unit("/bin/sleep 1001", policy)
	out, code := e.cli("unit", "put", e.writeUnit("app.service", v2), "--group", "web", "--canary", "1", "--pause-after-canary")
	if code != 0 {
		t.Fatalf("unit put --canary 1 --pause-after-canary: exit %d", code)
	}
	id := rolloutID(t, out)
	f.waitRollout(id, 30*time.Second, "waiting for promote", func(v rollout.View, ph rollout.Phase) bool {
		return ph.State == rollout.WaitingPromote
	})
	runsHealthy(t, f.hosts[0], v2, "the canary")

	// h3 joins while the canary waits for promote.
	f.join(h3)
	v := f.waitRollout(id, 20*time.Second, "h3 added to the last wave", func(v rollout.View, ph rollout.Phase) bool {
		return slices.Contains(v.Record.Joined, "h3")
	})
	if !slices.Equal(v.Record.Hosts, []string{"h1", "h2", "h3"}) || !slices.Equal(v.Record.WaveEnds, []int{1, 3}) || v.Record.Wave("h3") != 1 {
		t.Errorf("after h3 joined: hosts %v, waves %v, h3 in wave %d: want h3 in the last wave", v.Record.Hosts, v.Record.WaveEnds, v.Record.Wave("h3")+1)
	}
	var s reconcile.Status
	eventually(t, "h3 runs app.service", func() bool {
		s, _ = h3.status("app.service")
		return s.ActiveState == "active" && !s.Verifying && s.Hash == s.DesiredHash
	})
	joinedPID := runsHealthy(t, h3, v1, "h3 joined while the canary waits")
	time.Sleep(time.Second) // a moment for a wrong restart to show
	if pid := h3.h.MainPID(t, "app.service"); pid != joinedPID {
		t.Errorf("h3 restarted while the canary waits for promote: MainPID %d → %d", joinedPID, pid)
	}
	if got, _ := h3.readLocal("app.service"); got != v1 {
		t.Errorf("h3 has the new version on disk before its wave:\n%s", got)
	}
	if starts, stops := eventsOf(f.readEvents(), "h3"); starts != 1 || stops != 0 {
		t.Errorf("h3: %d starts and %d stops by the unit's hooks before promote, want 1 start (the previous version) and no stop", starts, stops)
	}
	if pid := f.hosts[1].h.MainPID(t, "app.service"); pid != before["h2"] {
		t.Errorf("h2 restarted before promote: MainPID %d → %d", before["h2"], pid)
	}
	out, code = e.cli("rollout", "status", id, "--hosts", "all")
	if code != 0 || !strings.Contains(out, "waves:    1, 3 of 3 hosts") ||
		!regexp.MustCompile(`(?m)^h1\s+1\s+healthy\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^h2\s+2\s+pending\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^h3\s+2\s+pending\s`).MatchString(out) {
		t.Errorf("rollout status --hosts all: exit %d, want h3 pending in the last wave (2) with h2:\n%s", code, out)
	}

	// Promote: h2 and h3 take the change in the last wave.
	if out, code := e.cli("rollout", "promote", id); code != 0 {
		t.Fatalf("rollout promote: exit %d\n%s", code, out)
	}
	if out, code := e.cli("rollout", "status", id, "--watch"); code != 0 || !strings.Contains(out, "phase:    done") {
		t.Fatalf("rollout status --watch after promote: exit %d, want 0 and done:\n%s", code, out)
	}
	f.waitRolledOut(v2, 30*time.Second)
	v, err := f.reg.Rollout(ctx, id, true)
	if err != nil {
		t.Fatal(err)
	}
	if p := v.Progress["h3"]; p == nil || p.State != rollout.HostHealthy {
		t.Errorf("h3's progress %+v: want healthy", p)
	}
	promoted := runsHealthy(t, h3, v2, "after promote")
	if promoted == joinedPID {
		t.Errorf("h3 did not restart onto the change after promote: MainPID %d", promoted)
	}
	if starts, stops := eventsOf(f.readEvents(), "h3"); starts != 2 || stops != 1 {
		t.Errorf("h3: %d starts and %d stops by the unit's hooks, want 2 and 1 (the previous version, then the change in its wave)", starts, stops)
	}
	good := f.pids()

	// A later rollout aborted with --revert after its canary took it;
	// then h4 joins.
	v3 := f.unit("/bin/sleep 1002", policy)
	out, code = e.cli("unit", "put", e.writeUnit("app.service", v3), "--group", "web", "--canary", "1", "--pause-after-canary")
	if code != 0 {
		t.Fatalf("unit put v3: exit %d", code)
	}
	id3 := rolloutID(t, out)
	f.waitRollout(id3, 30*time.Second, "waiting for promote", func(v rollout.View, ph rollout.Phase) bool {
		return ph.State == rollout.WaitingPromote
	})
	if out, code := e.cli("rollout", "abort", id3, "--revert"); code != 0 {
		t.Fatalf("rollout abort --revert: exit %d\n%s", code, out)
	}
	if out, code := e.cli("rollout", "status", id3, "--watch"); code != exitFailed || !strings.Contains(out, "reverted to the previous version: h1") {
		t.Errorf("rollout status --watch after abort --revert: exit %d, want %d and h1 reverted:\n%s", code, exitFailed, out)
	}
	runsHealthy(t, f.hosts[0], v2, "h1 after abort --revert")
	clearEvents(f.fleet)
	f.join(h4)
	eventually(t, "h4 runs app.service", func() bool {
		s, _ = h4.status("app.service")
		return s.ActiveState == "active" && !s.Verifying && s.Hash == s.DesiredHash
	})
	h4pid := runsHealthy(t, h4, v2, "h4 joined after abort --revert")
	time.Sleep(time.Second)
	if pid := h4.h.MainPID(t, "app.service"); pid != h4pid {
		t.Errorf("h4 restarted after it joined: MainPID %d → %d", h4pid, pid)
	}
	if starts, stops := eventsOf(f.readEvents(), "h4"); starts != 1 || stops != 0 {
		t.Errorf("h4: %d starts and %d stops by the unit's hooks, want 1 start (the last good version) and no stop", starts, stops)
	}
	v, err = f.reg.Rollout(ctx, id3, false)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(v.Record.Hosts, "h4") {
		t.Errorf("h4 was added to the aborted rollout: hosts %v", v.Record.Hosts)
	}
	for _, h := range []*env{f.hosts[1], h3} {
		if pid := h.h.MainPID(t, "app.service"); pid != good[h.host] {
			t.Errorf("%s restarted during the aborted rollout: MainPID %d → %d", h.host, good[h.host], pid)
		}
	}
}

// Joiners in a signed fleet (--allowed-signers): a host that never ran
// the unit (h3) joins while the canary waits for promote, and another
// (h4) after the next rollout was aborted with --revert. Each runs the
// previous version by systemd's view with its signature accepted (the
// record in the registry signs the new version, which the joiner must not
// run), and h3 takes the change, signed, in the last wave after promote.
func TestRolloutJoinSignedFleetRunsPrevious(t *testing.T) {
	t.Parallel()
	f := newJoinFleet(t, true, "h1", "h2")
	h3, h4 := f.prepare("h3"), f.prepare("h4")
	ctx := context.Background()
	e := f.hosts[0]
	policy := "HealthySec=0.5"
	v1 := f.unit("/bin/sleep 1000", policy)
	f.putApp(ctx, v1, 0)
	f.waitRolledOut(v1, 30*time.Second)
	clearEvents(f.fleet)
	put := func(content string) string {
		t.Helper()
		out, code := e.cli(append([]string{"unit", "put", e.writeUnit("app.service", content), "--group", "web", "--canary", "1", "--pause-after-canary"}, f.sign()...)...)
		if code != 0 {
			t.Fatalf("unit put --canary 1 --pause-after-canary: exit %d", code)
		}
		id := rolloutID(t, out)
		f.waitRollout(id, 30*time.Second, "waiting for promote", func(v rollout.View, ph rollout.Phase) bool {
			return ph.State == rollout.WaitingPromote
		})
		return id
	}
	joined := func(j *env, content, what string) uint32 {
		t.Helper()
		f.join(j)
		var s reconcile.Status
		waitFor(t, nil, 20*time.Second, j.host+" runs app.service", func() bool {
			s, _ = j.status("app.service")
			return (s.ActiveState == "active" && !s.Verifying && s.Hash == s.DesiredHash) || s.Error != "" // refused: said below
		})
		pid := runsHealthy(t, j, content, what)
		time.Sleep(time.Second)
		if now := j.h.MainPID(t, "app.service"); now != pid {
			t.Errorf("%s: %s restarted after it joined: MainPID %d → %d", what, j.host, pid, now)
		}
		if starts, stops := eventsOf(f.readEvents(), j.host); starts != 1 || stops != 0 {
			t.Errorf("%s: %s: %d starts and %d stops by the unit's hooks, want 1 start and no stop", what, j.host, starts, stops)
		}
		return pid
	}

	v2 := f.unit("/bin/sleep 1001", policy)
	id := put(v2)
	pid := joined(h3, v1, "h3 joined while the canary waits")
	f.waitRollout(id, 20*time.Second, "h3 added to the last wave", func(v rollout.View, ph rollout.Phase) bool {
		return slices.Contains(v.Record.Joined, "h3")
	})
	if out, code := e.cli("rollout", "promote", id); code != 0 {
		t.Fatalf("rollout promote: exit %d\n%s", code, out)
	}
	if out, code := e.cli("rollout", "status", id, "--watch"); code != 0 {
		t.Fatalf("rollout status --watch after promote: exit %d, want 0:\n%s", code, out)
	}
	if now := runsHealthy(t, h3, v2, "h3 after promote"); now == pid {
		t.Errorf("h3 did not restart onto the change after promote: MainPID %d", now)
	}

	v3 := f.unit("/bin/sleep 1002", policy)
	id3 := put(v3)
	if out, code := e.cli("rollout", "abort", id3, "--revert"); code != 0 {
		t.Fatalf("rollout abort --revert: exit %d\n%s", code, out)
	}
	if out, code := e.cli("rollout", "status", id3, "--watch"); code != exitFailed || !strings.Contains(out, "reverted to the previous version: h1") {
		t.Errorf("rollout status --watch after abort --revert: exit %d, want %d and h1 reverted:\n%s", code, exitFailed, out)
	}
	clearEvents(f.fleet)
	joined(h4, v2, "h4 joined after abort --revert")
	runsHealthy(t, f.hosts[0], v2, "h1 after abort --revert")
}
