package fleetlock

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// serveAs adds a FleetLock server on e's etcd as the agent of a machine
// with labels would run it, and returns its base URL.
func (e *lockEnv) serveAs(t *testing.T, labels map[string]string, groups ...string) string {
	t.Helper()
	srv := httptest.NewServer(Handler(Config{
		Slots: e.reg, TTL: time.Hour, Groups: groups, Labels: func() map[string]string { return labels },
		Log: slog.New(slog.NewTextHandler(t.Output(), nil)).With("labels", labels),
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/"
}

// Budgets by rack: the group's units set MaxUnavailableBy=rack, so a
// reboot takes its slots — of each unit and of the reboot pool — in the
// rack of the machine whose agent serves the request. Reboots of two racks
// run at once; a second reboot in a rack is refused naming the rack and
// who holds it; a machine without the label is in the bucket of those
// without it; and an agent's restart in a rack waits for that rack's
// reboot only.
func TestPreRebootByRack(t *testing.T) {
	t.Parallel()
	e := newLockEnv(t, time.Hour, "web")
	e.put(t, "web", map[string]string{
		"app.service": unitWith("MaxUnavailable=1\nMaxUnavailableBy=rack"),
		"db.service":  unitWith("MaxUnavailable=2\nMaxUnavailableBy=rack"),
	})
	onR1 := e.serveAs(t, map[string]string{"rack": "r1", "os.id": "fedora"}, "web")
	onR2 := e.serveAs(t, map[string]string{"rack": "r2"}, "web")
	onNone := e.serveAs(t, map[string]string{"os.id": "fedora"}, "web")
	a := zincati{base: onR1, id: "c988d2509fdf4cdcbed39037c56406fb", group: "web"}
	b := zincati{base: onR2, id: "e0f3745b108f471cbd4883c6fbed8cdd", group: "web"}
	c := zincati{base: onR1, id: "0a4b6c1e9f2d4e0f8a7b6c5d4e3f2a1b", group: "web"} // a second machine of rack r1
	d := zincati{base: onNone, id: "5f4e3d2c1b0a49f8e7d6c5b4a3928170", group: "web"}

	mustOK(t, "pre-reboot a (rack r1)", a.preReboot(t))
	mustOK(t, "pre-reboot b (rack r2) while a reboots in r1", b.preReboot(t))
	mustOK(t, "pre-reboot d (no rack label)", d.preReboot(t))
	want := []string{
		"web/app.service,rack=/fleetlock:" + d.id, "web/app.service,rack=r1/fleetlock:" + a.id, "web/app.service,rack=r2/fleetlock:" + b.id,
		"web/db.service,rack=/fleetlock:" + d.id, "web/db.service,rack=r1/fleetlock:" + a.id, "web/db.service,rack=r2/fleetlock:" + b.id,
		"web/reboot,rack=/fleetlock:" + d.id, "web/reboot,rack=r1/fleetlock:" + a.id, "web/reboot,rack=r2/fleetlock:" + b.id,
	}
	if got := e.slots(t); !slices.Equal(got, want) {
		t.Fatalf("slots:\n got %q\nwant %q", got, want)
	}
	mustOK(t, "pre-reboot a again", a.preReboot(t))
	if got := e.slots(t); !slices.Equal(got, want) {
		t.Fatalf("slots after a second pre-reboot a: %q", got)
	}

	r := c.preReboot(t)
	if r == nil || r.Status != http.StatusConflict || r.Kind != KindSemaphoreFull ||
		!strings.Contains(r.Value, "group web, rack=r1: its reboots take at most 1 slot(s) at once per rack, taken by fleetlock:"+a.id) {
		t.Fatalf("pre-reboot c in rack r1 while a reboots there: %+v, want 409 naming rack=r1 and a", r)
	}
	if got := e.slots(t); !slices.Equal(got, want) {
		t.Fatalf("slots after c's refused pre-reboot: %q", got)
	}

	// An agent of rack r2 waits for b's reboot, not for a's.
	reg2 := registrytest.NewClient(t, e.endpoint)
	h2, err := reg2.Join(t.Context(), reconcile.Member{Host: "h2", MachineID: "m2", Groups: []string{"web"}, Labels: map[string]string{"rack": "r2"}}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h2.Close() })
	r2 := reconcile.Bucket{Key: "rack", Value: "r2"}
	got := make(chan error, 1)
	var release func(context.Context) error
	go func() {
		var err error
		release, err = h2.Acquire(t.Context(), "groups/web", r2, "app.service", "hash-2", 1)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("h2 got rack=r2's app.service slot while b's reboot holds it (err %v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	mustOK(t, "steady-state a (rack r1)", a.steadyState(t))
	select {
	case err := <-got:
		t.Fatalf("h2 got rack=r2's slot when rack r1's reboot ended (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	mustOK(t, "pre-reboot c once a is back", c.preReboot(t)) // r1 is free again
	mustOK(t, "steady-state b (rack r2)", b.steadyState(t))
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("h2 did not get rack=r2's app.service slot after b's steady-state")
	}
	// h2 restarting app.service in r2 holds back a reboot in r2 only.
	r = b.preReboot(t)
	if r == nil || r.Kind != KindSemaphoreFull || !strings.Contains(r.Value, "group web, rack=r2: app.service has MaxUnavailable=1 per rack, taken by h2") {
		t.Fatalf("pre-reboot b while h2 restarts app.service in r2: %+v", r)
	}
	slots, err := e.reg.Slots(t.Context(), "groups/web")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, s := range slots {
		if s.Held() {
			rows = append(rows, s.Pool+" "+s.Bucket.String()+" "+s.Holder)
		}
	}
	if !slices.Contains(rows, "app.service rack=r2 h2") || !slices.Contains(rows, "reboot rack=r1 fleetlock:"+c.id) ||
		!slices.Contains(rows, "reboot (no rack) fleetlock:"+d.id) {
		t.Errorf("Slots (held): %q", rows)
	}
	if err := release(t.Context()); err != nil {
		t.Fatal(err)
	}
	mustOK(t, "steady-state c", c.steadyState(t))
	mustOK(t, "steady-state d", d.steadyState(t))
	if got := e.slots(t); len(got) != 0 {
		t.Errorf("slots after everyone is back: %q", got)
	}
}

// The reboot pool is by label only when every unit that sets
// MaxUnavailable= sets the same MaxUnavailableBy=: with a unit budgeted for
// the whole group beside one by rack, reboots of two racks take turns in
// the group's reboot pool (its limit the smallest MaxUnavailable=), while
// the unit by rack is still taken in each machine's rack.
func TestPreRebootMixedBudgets(t *testing.T) {
	t.Parallel()
	e := newLockEnv(t, time.Hour, "web")
	e.put(t, "web", map[string]string{
		"app.service": unitWith("MaxUnavailable=1\nMaxUnavailableBy=rack"),
		"db.service":  unitWith("MaxUnavailable=3"),
	})
	pools, err := e.reg.RebootPools(t.Context(), "web")
	if err != nil {
		t.Fatal(err)
	}
	if p := pools[registry.RebootPool]; p.By != "" || p.Limit != 1 {
		t.Errorf("reboot pool with mixed budgets: %+v, want the group's, limit 1", p)
	}
	if p := pools["app.service"]; p.By != "rack" || p.Limit != 1 {
		t.Errorf("app.service pool: %+v", p)
	}
	a := zincati{base: e.serveAs(t, map[string]string{"rack": "r1"}, "web"), id: "c988d2509fdf4cdcbed39037c56406fb", group: "web"}
	b := zincati{base: e.serveAs(t, map[string]string{"rack": "r2"}, "web"), id: "e0f3745b108f471cbd4883c6fbed8cdd", group: "web"}
	mustOK(t, "pre-reboot a", a.preReboot(t))
	want := []string{"web/app.service,rack=r1/fleetlock:" + a.id, "web/db.service/fleetlock:" + a.id, "web/reboot/fleetlock:" + a.id}
	if got := e.slots(t); !slices.Equal(got, want) {
		t.Fatalf("slots:\n got %q\nwant %q", got, want)
	}
	r := b.preReboot(t)
	if r == nil || r.Kind != KindSemaphoreFull || !strings.Contains(r.Value, "group web: its reboots take at most 1 slot(s) at once, taken by fleetlock:"+a.id) {
		t.Fatalf("pre-reboot b in another rack while a reboots, with a unit budgeted for the whole group: %+v", r)
	}
}
