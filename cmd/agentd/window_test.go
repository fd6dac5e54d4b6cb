package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/rollout"
)

// Issue 38, item 5: maintenance windows.

// `unit put --group web --window '*-*-* HH:MM:SS UTC for 1min'`, a window
// that opens a few seconds into the test: the change is stored and staged
// at once, each host says it waits for the window, and by systemd's own
// clock no host restarts before the window opens and every host does
// after.
func TestRolloutWindowOpensLater(t *testing.T) {
	t.Parallel()
	f := groupsFleet(t, "web", "web", "web")
	policy := "HealthySec=0.3"
	f.putTo("web", f.unit("/bin/sleep 1000", policy), 0, "--wait")
	clearEvents(f)
	opens := time.Now().Add(6 * time.Second).Truncate(time.Second)
	window := fmt.Sprintf("*-*-* %s UTC for 1min", opens.UTC().Format("15:04:05"))
	type result struct {
		out  string
		code int
	}
	waited := make(chan result, 1)
	src := f.hosts[0].writeUnit("app.service", f.unit("/bin/sleep 1001", policy))
	go func() { // --wait follows it through the closed window, to the end
		out, code := f.hosts[0].cli("unit", "put", src, "--group", "web", "--window", window, "--wait", "--timeout", "60s")
		waited <- result{out, code}
	}()
	var id string
	eventually(t, "the rollout was stored", func() bool {
		vs, err := f.reg.Rollouts(context.Background(), "web", false)
		if err == nil && len(vs) > 0 && vs[0].Record.Strategy.Window != nil {
			id = vs[0].Record.ID
		}
		return id != ""
	})
	f.waitPhase(id, rollout.WaitingWindow, "waiting for window ", opens.UTC().Format("15:04:05")+" UTC (in ")
	st, _ := f.hosts[1].cli("status", "--debug-socket", f.hosts[1].agent.opts.debugSocket)
	if !strings.Contains(st, "rollout "+id+" waiting-window, this host pending") || !strings.Contains(st, "waiting for window") {
		t.Errorf("agentd status on h2 before the window: want it waiting for the window:\n%s", st)
	}
	rs, _ := f.hosts[0].cli("rollout", "status", id)
	if !strings.Contains(rs, "window:   *-*-* "+opens.UTC().Format("15:04:05")+" UTC for 1min; opens ") {
		t.Errorf("rollout status: want the window line:\n%s", rs)
	}
	res := <-waited
	if res.code != 0 || !strings.Contains(res.out, "only inside the window *-*-* "+opens.UTC().Format("15:04:05")+" UTC for 1min (opens ") ||
		!strings.Contains(res.out, "waiting-window, wave 1 of 1 — waiting for window ") || !strings.Contains(res.out, "done, wave 1 of 1") {
		t.Errorf("put --window --wait: exit %d, want the window named, the wait for it and the end:\n%s", res.code, res.out)
	}
	// Not a line a second while it counts down: the wait is said once.
	if n := strings.Count(res.out, "waiting-window"); n > 2 {
		t.Errorf("put --wait said waiting-window %d times, want it once (twice if the coordinator had not looked yet):\n%s", n, res.out)
	}
	starts := 0
	for _, ev := range f.readEvents() {
		if ev.at < float64(opens.UnixNano())/1e9 {
			t.Errorf("%s %s at %.3f, before the window opened at %d", ev.host, map[bool]string{true: "stopped", false: "started"}[ev.stop], ev.at, opens.Unix())
		}
		if !ev.stop {
			starts++
		}
	}
	if starts != 3 {
		t.Errorf("%d starts after the window opened, want one per host (3)", starts)
	}
	f.waitRolledOut(f.unit("/bin/sleep 1001", policy), 10*time.Second)
}

// A group's own window (`agentd window set`): a plain put to it is staged
// and waits; `rollout promote` lets it go on outside the window; `--now`
// applies at once and the history says so; `window ls` and `rm`.
func TestGroupWindowNowAndPromote(t *testing.T) {
	t.Parallel()
	f := groupsFleet(t, "web", "web")
	policy := "HealthySec=0.3"
	f.putTo("web", f.unit("/bin/sleep 1000", policy), 0, "--wait")
	c := f.hosts[0]
	later := time.Now().Add(3 * time.Hour).UTC().Format("15:04")
	window := fmt.Sprintf("*-*-* %s UTC for 30min", later)
	if out, code := c.cli("window", "set", window, "--group", "web"); code != 0 || !strings.Contains(out, "groups/web: window *-*-* "+later+":00 UTC for 30min; opens ") {
		t.Fatalf("window set: exit %d\n%s", code, out)
	}
	if out, code := c.cli("window", "ls"); code != 0 || !strings.Contains(out, "groups/web") || !strings.Contains(out, "closed; opens ") || !strings.Contains(out, later+" UTC (in 2 h") {
		t.Errorf("window ls: exit %d, want the group's window closed:\n%s", code, out)
	}

	// A plain put is staged: nothing restarts until the window (or a promote).
	clearEvents(f)
	out := f.putTo("web", f.unit("/bin/sleep 1001", policy), 0)
	id := rolloutID(t, out)
	f.waitPhase(id, rollout.WaitingWindow, "waiting for window ", later+" UTC (in 2 h")
	time.Sleep(500 * time.Millisecond)
	if evs := f.readEvents(); len(evs) > 0 {
		t.Errorf("%d restarts outside the window: %+v", len(evs), evs)
	}
	if out, code := c.cli("rollout", "promote", id); code != 0 || !strings.Contains(out, "promoted outside its window") {
		t.Fatalf("rollout promote: exit %d\n%s", code, out)
	}
	f.waitPhase(id, rollout.Done)
	if rs, _ := c.cli("rollout", "status", id); !strings.Contains(rs, "; promoted outside it by ") {
		t.Errorf("rollout status: want who promoted it outside its window:\n%s", rs)
	}

	// --now: at once, and the history says so.
	out, code := c.cli("unit", "put", c.writeUnit("app.service", f.unit("/bin/sleep 1002", policy)), "--group", "web", "--now", "--wait")
	if code != 0 || !strings.Contains(out, "warning: --now: groups/web has the maintenance window") || strings.Contains(out, "rollout r") {
		t.Fatalf("put --now: exit %d, want it applied at once with a warning, no rollout:\n%s", code, out)
	}
	if h, _ := c.cli("unit", "history", "app.service", "--group", "web"); !strings.Contains(h, "current; --now: outside the window *-*-* "+later+":00 UTC for 30min") {
		t.Errorf("history: want the --now version marked:\n%s", h)
	}

	if out, code := c.cli("window", "rm", "--group", "web"); code != 0 {
		t.Errorf("window rm: exit %d\n%s", code, out)
	}
	if out, _ := c.cli("window", "ls"); !strings.Contains(out, "no target has a window") {
		t.Errorf("window ls after rm:\n%s", out)
	}
	if out, code := c.cli("window", "rm", "--group", "web"); code != 1 || !strings.Contains(out, "groups/web has no window") {
		t.Errorf("window rm again: exit %d, want 1 naming it\n%s", code, out)
	}
}

// Bad windows are refused where they are given (exit 2, naming the text)
// and nothing is stored.
func TestWindowRefused(t *testing.T) {
	t.Parallel()
	endpoint := registrytest.StartEtcd(t).Endpoint()
	e := &env{t: t, endpoint: endpoint, reg: registrytest.NewClient(t, endpoint)}
	unit := filepath.Join(t.TempDir(), "app.service")
	if err := os.WriteFile(unit, []byte("[Service]\nExecStart=/bin/sleep 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"unit", "put", unit, "--group", "web", "--window", "Tue 25:00-04:00"}, `"Tue 25:00-04:00"`},
		{[]string{"unit", "put", unit, "--group", "web", "--window", "Tue 02:00-04:00 Mars/Olympus"}, "Mars/Olympus"},
		{[]string{"unit", "put", unit, "--group", "web", "--window", "daily for 0"}, "more than zero"},
		{[]string{"unit", "put", unit, "--group", "web", "--window", "hourly for 2h"}, "never close"},
		{[]string{"unit", "put", unit, "--group", "web", "--window", "daily for 1h", "--now"}, "--now and --window"},
		{[]string{"unit", "put", unit, "--host", "h1", "--window", "daily for 1h"}, "stage a change across a group's hosts"},
		{[]string{"window", "set", "Tue 02:00-04:00 Europe/Atlantis", "--group", "web"}, "Europe/Atlantis"},
		{[]string{"window", "set", "daily for 1h", "--host", "h1"}, "a window is a group's or a selector's"},
	} {
		out, code := e.cli(tc.args...)
		if code != exitUsage || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, want %d saying %q:\n%s", strings.Join(tc.args, " "), code, exitUsage, tc.want, out)
		}
	}
	resp, err := registrytest.RawClient(t, endpoint).Get(context.Background(), "", clientv3.WithFromKey(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		t.Errorf("%s stored by a refused command", kv.Key)
	}
}
