package main

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// `agentd locks` on a real etcd: slots taken by agents' sessions (the
// agent's own slot code) and by FleetLock reboots, a host queued behind
// another and why, a halt and the host it holds back; --group, --json and
// the table.
func TestLocksShowsSlotsAndHalts(t *testing.T) {
	t.Parallel()
	g := newGarbageEnv(t) // h1's session: g.sess
	ctx := t.Context()
	app := "[Service]\nExecStart=/bin/sleep 1\n[X-Agentd]\nMaxUnavailable=1\n"
	tmpl := "[Service]\nExecStart=/bin/sleep 2\n[X-Agentd]\nMaxUnavailable=2\n"
	if _, err := g.reg.Put(ctx, registry.Target{Group: "web"}, map[string][]byte{"app.service": []byte(app), "w@.service": []byte(tmpl), "w@1.service": nil}); err != nil {
		t.Fatal(err)
	}
	join := func(host string) *registry.Session {
		s, err := g.reg.Join(ctx, reconcile.Member{Host: host, MachineID: "m-" + host, Groups: []string{"web"}}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	h2, h3 := join("h2"), join("h3")

	appHash := reconcile.Hash([]byte(app))
	if _, err := g.sess.Acquire(ctx, "groups/web", reconcile.Bucket{}, "app.service", appHash, 1); err != nil {
		t.Fatal(err)
	}
	queued := make(chan error, 1)
	go func() {
		_, err := h2.Acquire(ctx, "groups/web", reconcile.Bucket{}, "app.service", appHash, 1)
		queued <- err
	}()
	if _, err := h2.Acquire(ctx, "groups/web", reconcile.Bucket{}, "w@.service", reconcile.Hash([]byte(tmpl)), 2); err != nil {
		t.Fatal(err)
	}
	// A reboot in web waits for h1's app.service; one in db (no units:
	// one reboot at a time) is granted.
	var full *registry.SlotsFullError
	if err := g.reg.LockReboot(ctx, "web", "node-1", nil, time.Hour); !errors.As(err, &full) || full.Pool != "app.service" {
		t.Fatalf("LockReboot in web while h1 holds app.service: %v", err)
	}
	if err := g.reg.LockReboot(ctx, "db", "node-9", nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	// h1 failed a version of app.service; h3's status says it holds it back.
	if err := g.sess.Halt(ctx, reconcile.Halt{Scope: "groups/web", Unit: "app.service", Hash: appHash, Reason: "start failed: exit-code"}); err != nil {
		t.Fatal(err)
	}
	if err := h3.Publish(ctx, 1, []reconcile.Status{{Unit: "app.service", Action: reconcile.ActionHeld, Error: "held: h1 failed it"}}); err != nil {
		t.Fatal(err)
	}

	var rep locksReport
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _, code := g.run(t, "locks", "--json")
		rep = locksReport{}
		if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
			t.Fatalf("locks --json: exit %d\n%s", code, out)
		}
		if len(rep.Slots) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("locks --json: %d slots, want 4 (h2 queued for app.service)", len(rep.Slots))
		}
		time.Sleep(50 * time.Millisecond)
	}
	byKey := map[string]slotRow{}
	for _, s := range rep.Slots {
		byKey[s.Group+"/"+s.Unit+"/"+s.Holder] = s
	}
	check := func(key, state, what string, limit int, ttlMin, ttlMax int64, ok func(slotRow) bool) {
		t.Helper()
		s, found := byKey[key]
		if !found || s.State != state || s.For != what || s.Limit != limit || s.TTLSeconds < ttlMin || s.TTLSeconds > ttlMax || s.Since.IsZero() || (ok != nil && !ok(s)) {
			t.Errorf("%s: %+v (found %v), want %s, for %s, limit %d, TTL %d–%d s", key, s, found, state, what, limit, ttlMin, ttlMax)
		}
	}
	check("web/app.service/h1", "held", "unit", 1, 1, 5, func(s slotRow) bool { return s.Hash == appHash && s.Position == 1 && s.Why == "" })
	check("web/app.service/h2", "waiting", "unit", 1, 1, 5, func(s slotRow) bool {
		return s.Position == 2 && strings.Join(s.Ahead, ",") == "h1" && s.Why == "app.service allows 1 at once (MaxUnavailable=1), taken by h1"
	})
	check("web/w@.service/h2", "held", "unit", 2, 1, 5, nil)
	check("db/reboot/fleetlock:node-9", "held", "reboot", 1, 3590, 3600, func(s slotRow) bool { return s.FleetLockID == "node-9" && s.Lease != "" })
	if len(rep.Halts) != 1 || rep.Halts[0].Group != "web" || rep.Halts[0].Unit != "app.service" || rep.Halts[0].Host != "h1" ||
		strings.Join(rep.Halts[0].Held, ",") != "h3" || rep.Halts[0].Reason != "start failed: exit-code" {
		t.Errorf("halts: %+v, want app.service failed on h1, holding h3 back", rep.Halts)
	}

	// The table says the same.
	out, _, code := g.run(t, "locks")
	for _, want := range []string{
		`^GROUP +UNIT +HOLDER +STATE +SINCE +TTL +FOR$`,
		`^web +app\.service +h1 +held +\S+ \(\d s ago\) +\d s +applying app\.service \(hash ` + short(appHash) + `\)$`,
		`^web +app\.service +h2 +waiting .* — app\.service allows 1 at once \(MaxUnavailable=1\), taken by h1$`,
		`^db +reboot +fleetlock:node-9 +held +\S+ \(\d s ago\) +59 min +reboot via FleetLock$`,
		`^web +app\.service +` + short(appHash) + ` +h1 +.* +h3 +start failed: exit-code$`,
	} {
		if code != 0 || !regexp.MustCompile("(?m)"+want).MatchString(out) {
			t.Errorf("locks: exit %d, no line matching %s in\n%s", code, want, out)
		}
	}
	// --group: one group's slots and halts only.
	out, _, code = g.run(t, "locks", "--group", "db", "--json")
	rep = locksReport{}
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Slots) != 1 || rep.Slots[0].Holder != "fleetlock:node-9" || len(rep.Halts) != 0 {
		t.Errorf("locks --group db --json: exit %d\n%s", code, out)
	}
	if _, stderr, code := g.run(t, "locks", "--group", "a/b"); code != exitUsage {
		t.Errorf("locks --group a/b: exit %d, want %d\n%s", code, exitUsage, stderr)
	}
	// Once the reboot says steady-state, db has nothing.
	if n, err := g.reg.UnlockReboot(ctx, "db", "node-9"); err != nil || n != 1 {
		t.Fatalf("UnlockReboot: %d, %v", n, err)
	}
	if out, _, code := g.run(t, "locks", "--group", "db"); code != 0 || !strings.Contains(out, "no MaxUnavailable= slot held or waited for") {
		t.Errorf("locks --group db after steady-state: exit %d\n%s", code, out)
	}
	select {
	case err := <-queued:
		t.Fatalf("h2 got app.service's slot while h1 holds it: %v", err)
	default:
	}
}
