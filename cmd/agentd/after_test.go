package main

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/rollout"
)

// Issue 38, item 6: one rollout after another. groupsFleet is a fleet
// whose hosts h1.. are each in the group given (in order), each its own
// systemd.
func groupsFleet(t *testing.T, groups ...string) *fleet {
	t.Helper()
	specs := make([]hostSpec, len(groups))
	for i, g := range groups {
		specs[i] = hostSpec{group: g}
	}
	return specFleet(t, specs...)
}

// putTo writes app.service to group with args, and returns what it said.
func (f *fleet) putTo(group, content string, wantCode int, args ...string) string {
	f.t.Helper()
	e := f.hosts[0]
	out, code := e.cli(append([]string{"unit", "put", e.writeUnit("app.service", content), "--group", group}, args...)...)
	if code != wantCode {
		f.t.Fatalf("unit put --group %s %s: exit %d, want %d\n%s", group, strings.Join(args, " "), code, wantCode, out)
	}
	return out
}

// waitPhase waits until rollout id's phase is state and its reason says
// each of says, and returns the phase.
func (f *fleet) waitPhase(id string, state rollout.State, says ...string) rollout.Phase {
	f.t.Helper()
	var ph rollout.Phase
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		v, err := f.reg.Rollout(context.Background(), id, false)
		if err == nil {
			ph = v.Phase()
			if ph.State == state && containsAll(ph.Reason, says...) {
				return ph
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.t.Fatalf("rollout %s: %s (%s), want %s saying %q", id, ph.State, ph.Reason, state, says)
	return ph
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// `unit put --group web --after db`: web's rollout admits no host while
// db's runs, says what it waits for, goes on waiting (and says so) when
// db's is aborted, and begins once the db rollout it names ends done: by
// systemd's own clocks every web host restarted after the last db host
// had started the change.
func TestRolloutAfterAnother(t *testing.T) {
	t.Parallel()
	f := groupsFleet(t, "db", "db", "web", "web")
	policy := "HealthySec=0.3"
	f.putTo("db", f.unit("/bin/sleep 1000", policy), 0, "--wait")
	f.putTo("web", f.unit("/bin/sleep 1000", policy), 0, "--wait")

	// A db rollout that holds after its canary; web's waits for it.
	a := rolloutID(t, f.putTo("db", f.unit("/bin/sleep 1001", policy), 0, "--canary", "1", "--pause-after-canary"))
	f.waitPhase(a, rollout.WaitingPromote)
	clearEvents(f)
	b := rolloutID(t, f.putTo("web", f.unit("/bin/sleep 1001", policy), 0, "--after", "db", "--max-unavailable", "1"))
	f.waitPhase(b, rollout.WaitingAfter, "waiting for rollout db/"+a+" to end done (--after): it is waiting-promote")
	st, _ := f.hosts[0].cli("rollout", "status", b)
	if !strings.Contains(st, "waiting-after") || !strings.Contains(st, "--after db/"+a) {
		t.Errorf("rollout status %s: want it waiting after db's:\n%s", b, st)
	}

	// Aborted: web's goes on waiting, and says so.
	if out, code := f.hosts[0].cli("rollout", "abort", a); code != 0 {
		t.Fatalf("rollout abort %s: exit %d\n%s", a, code, out)
	}
	f.waitPhase(b, rollout.WaitingAfter, "rollout db/"+a+" (--after) ended aborted", "this one waits for it to end done", "agentd rollout abort "+b)
	time.Sleep(time.Second) // a coordinator that wrongly let web begin would have by now
	for _, ev := range f.readEvents() {
		t.Errorf("%s restarted (stop %v) while the rollout it waits for did not end done", ev.host, ev.stop)
	}
	if out, code := f.hosts[0].cli("rollout", "abort", b); code != 0 {
		t.Fatalf("rollout abort %s: exit %d\n%s", b, code, out)
	}

	// Failed: a db version that exits at once fails its canary; a web
	// rollout after it is told so at put time and waits, saying so.
	failing := rolloutID(t, f.putTo("db", f.unit("/bin/false", policy), 0, "--canary", "1", "--supersede"))
	f.waitPhase(failing, rollout.Failed)
	clearEvents(f)
	out := f.putTo("web", f.unit("/bin/sleep 1003", policy), 0, "--after", "db", "--supersede")
	if !strings.Contains(out, "warning: rollout "+failing+" of group db, which --after names, ended failed") {
		t.Errorf("put --after a failed rollout: want a warning naming it:\n%s", out)
	}
	e := rolloutID(t, out)
	f.waitPhase(e, rollout.WaitingAfter, "rollout db/"+failing+" (--after) ended failed: h1 failed the change")
	time.Sleep(time.Second)
	for _, ev := range f.readEvents() {
		if ev.host == "h3" || ev.host == "h4" {
			t.Errorf("%s restarted (stop %v) after a rollout that failed", ev.host, ev.stop)
		}
	}
	if out, code := f.hosts[0].cli("rollout", "abort", e); code != 0 {
		t.Fatalf("rollout abort %s: exit %d\n%s", e, code, out)
	}

	// Done: web's begins.
	c := rolloutID(t, f.putTo("db", f.unit("/bin/sleep 1002", policy), 0, "--canary", "1", "--pause-after-canary", "--supersede"))
	f.waitPhase(c, rollout.WaitingPromote)
	clearEvents(f)
	d := rolloutID(t, f.putTo("web", f.unit("/bin/sleep 1002", policy), 0, "--after", c, "--max-unavailable", "1", "--supersede"))
	f.waitPhase(d, rollout.WaitingAfter, "waiting for rollout db/"+c)
	if out, code := f.hosts[0].cli("rollout", "promote", c); code != 0 {
		t.Fatalf("rollout promote %s: exit %d\n%s", c, code, out)
	}
	f.waitPhase(d, rollout.Done)
	var lastDB, firstWeb float64
	for _, ev := range f.readEvents() {
		switch {
		case ev.stop:
		case ev.host == "h1" || ev.host == "h2":
			lastDB = max(lastDB, ev.at)
		case firstWeb == 0:
			firstWeb = ev.at
		}
	}
	if lastDB == 0 || firstWeb == 0 || firstWeb < lastDB {
		t.Errorf("last db start %.3f, first web start %.3f: want every web host to start after db's rollout", lastDB, firstWeb)
	}
	t.Logf("web's first start %.3fs after db's last", firstWeb-lastDB)
}

// --after names something with no rollout: a usage error, nothing stored.
func TestRolloutAfterNothing(t *testing.T) {
	t.Parallel()
	f := groupsFleet(t, "web")
	for _, tc := range []struct{ after, want string }{
		{"db", "group db has no rollout to wait for"},
		{"role=db", "selector role=db (group sel-"},
		{"env in (", "--after env in ("},
		{"r20260101-000000-00000000", "has no rollout"},
	} {
		out, code := f.hosts[0].cli("unit", "put", f.hosts[0].writeUnit("app.service", f.unit("/bin/sleep 1000", "")), "--group", "web", "--after", tc.after)
		if code != exitUsage || !strings.Contains(out, tc.want) || !strings.Contains(out, "nothing stored") {
			t.Errorf("--after %q: exit %d, want %d saying %q and nothing stored:\n%s", tc.after, code, exitUsage, tc.want, out)
		}
	}
	resp, err := registrytest.RawClient(t, f.endpoint).Get(context.Background(), "", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Key), "groups/web/units/") || strings.Contains(string(kv.Key), "/rollouts/groups/") {
			t.Errorf("%s stored by a refused put", kv.Key)
		}
	}
}
