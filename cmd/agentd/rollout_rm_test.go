package main

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
)

// `unit rm` and `unit revert` with the rollout options, against a real
// etcd with stand-in agents (simAgents), as the put's rollout tests.

// rm --group with a strategy stages the removal: the keys go from the
// registry at once, and the rollout's record holds what each held (From)
// and that the change removes it (ToHash ""); --wait follows it to done.
// A second rollout of a removed key — a put, or a revert putting it back —
// is refused while it runs, and nothing is stored.
func TestRolloutRm(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h1", "h2", "h3")
	hello := e.unit(t, "hello.service", "/bin/true")
	drop := e.unit(t, "x.conf", "/bin/true") // its content; stored as a drop-in
	if _, _, code := e.run(t, "unit", "put", hello, "--group", "web"); code != 0 {
		t.Fatalf("put: exit %d", code)
	}
	dropIn, err := os.ReadFile(drop)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.reg.Put(t.Context(), registry.Target{Group: "web"}, map[string][]byte{"hello.service.d/x.conf": dropIn}); err != nil {
		t.Fatal(err)
	}
	helloContent, _ := os.ReadFile(hello)

	ctx, cancel := context.WithCancel(t.Context())
	sim := e.simAgents(ctx, nil)
	out, _, code := e.run(t, "unit", "rm", "hello.service", "--group", "web", "--recursive", "--canary", "1", "--reason", "retire hello",
		"--wait", "--timeout", "30s")
	cancel()
	if err := <-sim; err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("rm --wait as a rollout: exit %d", code)
	}
	id := rolloutID(t, out)
	for _, want := range []string{
		"removed groups/web/units/hello.service (revision ", "removed groups/web/units/hello.service.d/x.conf (revision ",
		"rollout " + id + ": 3 hosts in waves 1, 3; follow it with agentd rollout status " + id + " --watch\n",
		"rollout " + id + ": running, wave 1 of 2 · 0 healthy · ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rm --wait output lacks %q", want)
		}
	}
	if !strings.HasSuffix(out, "rollout "+id+": done, wave 2 of 2 · 3 healthy\n") {
		t.Error("rm --wait output does not end with the rollout done")
	}
	for i, l := range counterLines(t, out, id) {
		if (l.holding > 1 || l.wave > 1) && l.counts["healthy"] == 0 {
			t.Errorf("line %d of counters: %+v: wave 2 started before the canary was healthy", i, l)
		}
	}
	v := e.view(t, id)
	r := v.Record
	for _, h := range []string{"h2", "h3"} {
		if a := e.admission(t, id, h); a == nil || a.Wave != 1 || a.At.Before(v.Progress["h1"].HealthyAt) {
			t.Errorf("%s admitted %+v, the canary healthy at %v", h, a, v.Progress["h1"].HealthyAt)
		}
	}
	if r.End == nil || r.End.State != rollout.Done || r.Reason != "retire hello" || r.By != storedBy() {
		t.Errorf("end %+v, reason %q, by %q", r.End, r.Reason, r.By)
	}
	if len(r.Units) != 2 {
		t.Errorf("rollout units: %v, want the unit and its drop-in", slices.Sorted(maps.Keys(r.Units)))
	}
	for key, want := range map[string][]byte{"hello.service": helloContent, "hello.service.d/x.conf": dropIn} {
		u := r.Units[key]
		if u.From == nil || *u.From != string(want) || u.FromRevision == 0 || u.ToHash != "" {
			t.Errorf("%s in the rollout: %+v, want From %q and ToHash \"\"", key, u, want)
		}
	}
	if _, err := e.reg.Get(t.Context(), registry.Target{Group: "web"}, "hello.service"); err == nil {
		t.Error("hello.service is still in the registry")
	}

	// Another removal as a rollout, with no agent to take it: it runs.
	other := e.unit(t, "other.service", "/bin/true")
	if _, _, code := e.run(t, "unit", "put", other, "--group", "web"); code != 0 {
		t.Fatalf("put other.service: exit %d", code)
	}
	out, _, code = e.run(t, "unit", "rm", "other.service", "--group", "web", "--canary", "1")
	if code != 0 {
		t.Fatalf("rm as a rollout: exit %d", code)
	}
	id2 := rolloutID(t, out)
	if ph := e.summarized(t, id2, nil).Phase(); ph.State != rollout.Running {
		t.Fatalf("the rm rollout is %s", ph.State)
	}
	// Putting the key back, or reverting the removal, as a rollout:
	// refused while it runs, nothing stored.
	before := e.dump(t)
	for _, args := range [][]string{
		{"unit", "put", other, "--group", "web", "--canary", "1"},
		{"unit", "revert", "other.service", "--group", "web", "--waves", "50%,100%"},
	} {
		if _, stderr, code := e.run(t, args...); code != exitError || !strings.Contains(stderr, "a rollout of these keys is running: "+id2+" (other.service)") ||
			!strings.Contains(stderr, "--supersede") {
			t.Errorf("%s: exit %d\n%s", strings.Join(args[:2], " "), code, stderr)
		}
	}
	if after := e.dump(t); !maps.Equal(before, after) {
		t.Error("a refused rollout changed the registry")
	}
	// rm of a host's key with the rollout options: a usage error (see
	// TestRolloutRefusesBadStrategy); rm --wait without them: as before.
	if _, _, code := e.run(t, "unit", "put", other, "--host", "h1"); code != 0 {
		t.Fatal("put to h1")
	}
	if _, _, code := e.run(t, "unit", "rm", "other.service", "--host", "h1"); code != 0 {
		t.Fatal("plain rm to h1")
	}
}

// revert --group with a strategy stages the previous version: the record
// holds what the key held (the current version, From) and the hash of
// the version put back (To); a second rollout of the key is refused while
// it runs, --supersede ends the first, and --wait follows to done.
func TestRolloutRevert(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h1", "h2", "h3", "h4")
	v1, v2 := e.unit(t, "hello.service", "/bin/sleep 1"), e.unit(t, "hello.service", "/bin/sleep 2")
	c1, _ := os.ReadFile(v1)
	c2, _ := os.ReadFile(v2)
	for _, f := range []string{v1, v2} {
		if _, _, code := e.run(t, "unit", "put", f, "--group", "web"); code != 0 {
			t.Fatal("put")
		}
	}
	out, _, code := e.run(t, "unit", "revert", "hello.service", "--group", "web", "--canary", "1", "--soak", "1s", "--reason", "v2 leaks")
	if code != 0 {
		t.Fatalf("revert as a rollout: exit %d", code)
	}
	id := rolloutID(t, out)
	if !strings.Contains(out, "reverted groups/web/units/hello.service to revision ") || !strings.Contains(out, "rollout "+id+": 4 hosts in waves 1, 4") {
		t.Errorf("revert output:\n%s", out)
	}
	r := e.view(t, id).Record
	if u := r.Units["hello.service"]; len(r.Units) != 1 || u.From == nil || *u.From != string(c2) || u.ToHash != reconcile.Hash(c1) || u.FromRevision == 0 {
		t.Errorf("hello.service in the revert's rollout: %+v, want From v2 and To v1's hash", u)
	}
	if r.Strategy.Soak != time.Second || r.Reason != "v2 leaks" {
		t.Errorf("strategy %+v, reason %q", r.Strategy, r.Reason)
	}
	if b, err := e.reg.Get(t.Context(), registry.Target{Group: "web"}, "hello.service"); err != nil || string(b) != string(c1) {
		t.Errorf("the key holds %q (%v), want v1", b, err)
	}

	// A second rollout of the key — a revert, a put, a removal — is
	// refused while it runs; nothing stored.
	before := e.dump(t)
	for _, args := range [][]string{
		{"unit", "revert", "hello.service", "--group", "web", "--canary", "1"},
		{"unit", "put", v2, "--group", "web", "--canary", "1"},
		{"unit", "rm", "hello.service", "--group", "web", "--canary", "1"},
	} {
		if _, stderr, code := e.run(t, args...); code != exitError || !strings.Contains(stderr, "a rollout of these keys is running: "+id+" (hello.service)") {
			t.Errorf("%s: exit %d\n%s", strings.Join(args[:2], " "), code, stderr)
		}
	}
	if after := e.dump(t); !maps.Equal(before, after) {
		t.Error("a refused rollout changed the registry")
	}

	// --supersede ends it; --wait follows the new one to done.
	ctx, cancel := context.WithCancel(t.Context())
	sim := e.simAgents(ctx, nil)
	out, _, code = e.run(t, "unit", "revert", "hello.service", "--group", "web", "--waves", "2,100%", "--supersede", "--wait", "--timeout", "30s")
	cancel()
	if err := <-sim; err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("revert --supersede --wait: exit %d", code)
	}
	var id2 string
	for _, m := range rolloutIDRe.FindAllStringSubmatch(out, -1) {
		if m[1] != id {
			id2 = m[1]
		}
	}
	if !strings.Contains(out, "rollout "+id+": superseded by "+id2) || !strings.HasSuffix(out, "rollout "+id2+": done, wave 2 of 2 · 4 healthy\n") {
		t.Errorf("revert --wait output lacks the first superseded, or does not end with the second done")
	}
	if a := e.admission(t, id2, "h4"); a == nil || a.Wave != 1 {
		t.Errorf("h4's admission: %+v", a)
	}
	if old := e.view(t, id).Record; old.End == nil || old.End.State != rollout.Superseded {
		t.Errorf("the first revert's end: %+v", old.End)
	}
	// The version before v1 (current) was v2: it went back to it.
	r2 := e.view(t, id2).Record
	if u := r2.Units["hello.service"]; u.From == nil || *u.From != string(c1) || u.ToHash != reconcile.Hash(c2) || r2.End == nil || r2.End.State != rollout.Done {
		t.Errorf("the second revert's rollout: %+v, end %+v", u, r2.End)
	}
}
