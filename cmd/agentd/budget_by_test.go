package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Issue 38, item 4: budgets by label. Four hosts, racks r1 r1 r2 r2, each
// its own systemd; a unit with MaxUnavailable=1 and MaxUnavailableBy=rack,
// changed by a plain put to the group. By the units' own start and stop
// hooks (systemd's clock), a host is down from its stop until its start
// plus HealthySec (its slot is held from before the stop until after
// HealthySec): no two hosts of one rack are ever down at once, and the two
// racks are (in parallel, not one after the other). While a host waits,
// --wait, its status and `agentd locks` name its rack's bucket.
func TestMaxUnavailableByRack(t *testing.T) {
	t.Parallel()                                                      // its own systemds and etcd: waits on them, not the CPU
	f := labelledFleet(t, "rack=r1", "rack=r1", "rack=r2", "rack=r2") // r1: h1 h2; r2: h3 h4
	rack := map[string]string{"h1": "r1", "h2": "r1", "h3": "r2", "h4": "r2"}
	// HealthySec=3: each host holds its rack's slot for at least 3 s after
	// its start, so the first host of each rack — both take their slot as
	// soon as the put lands — overlap for seconds, not milliseconds.
	const healthy = 3.0
	policy := func(h float64) string {
		return fmt.Sprintf("MaxUnavailable=1\nMaxUnavailableBy=rack\nHealthySec=%g", h)
	}
	f.put(f.unit("/bin/sleep 1000", policy(0)), 0) // first starts: nothing to disrupt, no slot
	clearEvents(f)

	v2 := f.unit("/bin/sleep 1001", policy(healthy))
	src := f.hosts[0].writeUnit("app.service", v2)
	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		out, code := f.hosts[0].cli("unit", "put", src, "--group", "web", "--wait", "--timeout", "60s")
		done <- result{out, code}
	}()

	// While the second host of each rack waits: `agentd locks` shows
	// each rack's queue, and the waiting host's status names its bucket.
	var locksText string
	waiting := map[string]string{} // rack → the host seen waiting in it
	deadline := time.Now().Add(20 * time.Second)
	for len(waiting) < 2 && time.Now().Before(deadline) {
		out, code := f.hosts[0].cli("locks", "--group", "web", "--json")
		var rep locksReport
		if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
			t.Fatalf("locks --json: exit %d\n%s", code, out)
		}
		for _, s := range rep.Slots {
			want := "rack=" + rack[s.Holder]
			if s.Bucket != want || s.BucketKey != "rack" || s.Unit != "app.service" {
				t.Errorf("locks: %s's slot in bucket %q (%s/%s), want %q", s.Holder, s.Bucket, s.BucketKey, s.BucketValue, want)
			}
			if s.State != "waiting" || waiting[rack[s.Holder]] != "" {
				continue
			}
			if !strings.HasPrefix(s.Why, "app.service allows 1 at once in "+want+" (MaxUnavailable=1 per rack), taken by h") {
				t.Errorf("locks: %s waits because %q", s.Holder, s.Why)
			}
			for _, e := range f.hosts {
				if e.host != s.Holder {
					continue
				}
				if st, _ := e.status("app.service"); st.Action == "wait-slot" && st.SlotBucket != want {
					t.Errorf("%s's status waits for a slot of %q, want %q", e.host, st.SlotBucket, want)
				}
			}
			waiting[rack[s.Holder]] = s.Holder
			locksText, _ = f.hosts[0].cli("locks", "--group", "web")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(waiting) < 2 {
		t.Errorf("saw hosts waiting in %v, want one in each rack", waiting)
	}
	if !strings.Contains(locksText, "GROUP  BUCKET   UNIT") || !strings.Contains(locksText, "web    rack=r") {
		t.Errorf("locks: want a BUCKET column:\n%s", locksText)
	}

	var r result
	select {
	case r = <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("unit put --wait did not return")
	}
	took := time.Since(start)
	if r.code != 0 {
		t.Fatalf("unit put --wait: exit %d\n%s", r.code, r.out)
	}
	for rk, h := range waiting {
		if want := h + " app.service: waiting for a slot — MaxUnavailable, rack=" + rk; !strings.Contains(r.out, want) {
			t.Errorf("put --wait: want %q:\n%s", want, r.out)
		}
	}

	// Each host down once, from its stop to its start + HealthySec.
	type window struct {
		host         string
		down, upSafe float64 // stop; start + HealthySec
	}
	var ws []window
	stops, starts := map[string]float64{}, map[string]float64{}
	for _, ev := range f.readEvents() {
		if ev.stop {
			if _, dup := stops[ev.host]; dup {
				t.Errorf("%s stopped app.service twice", ev.host)
			}
			stops[ev.host] = ev.at
		} else {
			if _, dup := starts[ev.host]; dup {
				t.Errorf("%s started app.service twice", ev.host)
			}
			starts[ev.host] = ev.at
		}
	}
	for _, h := range []string{"h1", "h2", "h3", "h4"} {
		if stops[h] == 0 || starts[h] < stops[h] {
			t.Fatalf("%s: stop %.3f, start %.3f: want one restart each", h, stops[h], starts[h])
		}
		ws = append(ws, window{h, stops[h], starts[h] + healthy})
	}
	overlap := func(a, b window) float64 { return min(a.upSafe, b.upSafe) - max(a.down, b.down) }
	var across []string
	most := 0.0
	for i, a := range ws {
		for _, b := range ws[i+1:] {
			o := overlap(a, b)
			switch {
			case rack[a.host] == rack[b.host] && o > 0:
				t.Errorf("%s and %s of rack %s were down at once for %.3fs: [%.3f, %.3f] and [%.3f, %.3f]",
					a.host, b.host, rack[a.host], o, a.down, a.upSafe, b.down, b.upSafe)
			case rack[a.host] != rack[b.host] && o > 0:
				across = append(across, fmt.Sprintf("%s+%s %.2fs", a.host, b.host, o))
				most = max(most, o)
			}
		}
	}
	// Both racks' first hosts take their slot at once: they overlap for
	// about HealthySec; a second's slack for a loaded machine.
	if most < healthy-1 {
		t.Errorf("the racks overlapped at most %.3fs (%v), want about HealthySec=%gs: racks in parallel", most, across, healthy)
	}
	slices.Sort(across)
	for _, w := range ws {
		t.Logf("%s (rack %s): down %.3f, start+HealthySec %.3f", w.host, rack[w.host], w.down-ws[0].down, w.upSafe-ws[0].down)
	}
	t.Logf("within a rack: never two at once; across racks: %v; put --wait took %s (a rack after the other would take over %gs)",
		across, took.Round(100*time.Millisecond), 4*healthy)
}

// The FleetLock server of an agent with --label rack=r1 takes a reboot's
// slots in rack r1's queues (the agent's own labels, read through
// labelsNow), and a refusal names the rack.
func TestFleetLockRebootInOwnRack(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.groups = []string{"web"}
	flAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) {
		o.fleetLockAddr, o.fleetLockTTL, o.labels = flAddr, time.Hour, []string{"rack=r1"}
	})
	waitJoined(t, e)
	app := "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=rack\nState=stopped\n"
	if out, code := e.cli("unit", "put", e.writeUnit("app.service", app), "--group", "web"); code != 0 {
		t.Fatalf("unit put: exit %d\n%s", code, out)
	}
	const a, b = "c988d2509fdf4cdcbed39037c56406fb", "e0f3745b108f471cbd4883c6fbed8cdd"
	if status, kind, _ := fleetLockCall(t, flAddr, "pre-reboot", a, "web"); status != http.StatusOK {
		t.Fatalf("pre-reboot: %d %s", status, kind)
	}
	slots, err := e.reg.Slots(t.Context(), "groups/web")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range slots {
		got = append(got, s.Pool+" "+s.Bucket.String()+" "+s.Holder)
	}
	if want := []string{"app.service rack=r1 fleetlock:" + a, "reboot rack=r1 fleetlock:" + a}; !slices.Equal(got, want) {
		t.Errorf("slots: %q, want %q", got, want)
	}
	status, kind, value := fleetLockCall(t, flAddr, "pre-reboot", b, "web")
	if status != http.StatusConflict || kind != "failed_lock_semaphore_full" || !strings.Contains(value, "group web, rack=r1: ") {
		t.Errorf("a second reboot in rack r1: %d %s %s", status, kind, value)
	}
	if status, kind, _ := fleetLockCall(t, flAddr, "steady-state", a, "web"); status != http.StatusOK {
		t.Fatalf("steady-state: %d %s", status, kind)
	}
}
