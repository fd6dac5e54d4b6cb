package main

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/rollout"
)

// `unit rm --group web --canary 1 --soak` on real agents: the canary
// stops and removes the unit, the other host keeps running it; `agentd
// status` on each host shows the rollout and where that host stands in
// it; `rollout abort --revert` gives the canary its unit back, and the
// line goes.
func TestRolloutRmOnAgentsAndStatus(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2, "")
	h1, h2 := f.hosts[0], f.hosts[1]
	app := f.unit("/bin/sleep 1000", "HealthySec=0")
	f.put(app, 0)
	before := f.pids()
	out, code := h1.cli("unit", "rm", "app.service", "--group", "web", "--canary", "1", "--soak", "30s")
	if code != 0 {
		t.Fatalf("unit rm as a rollout: exit %d", code)
	}
	id := rolloutID(t, out)
	f.waitRollout(id, 30*time.Second, "soaking on h1", func(v rollout.View, ph rollout.Phase) bool {
		p := v.Progress["h1"]
		return p != nil && p.State == rollout.HostSoaking
	})
	if _, ok := h1.readLocal("app.service"); ok {
		t.Error("h1 (the canary) still has app.service on disk")
	}
	if got, ok := h2.readLocal("app.service"); !ok || got != app {
		t.Error("h2 (wave 2) lost app.service before its wave")
	}
	if pid := h2.h.MainPID(t, "app.service"); pid == 0 || pid != before["h2"] {
		t.Errorf("h2's app.service MainPID %d → %d: it was touched before its wave", before["h2"], pid)
	}
	status := func(e *env, args ...string) string {
		t.Helper()
		out, code := e.cli(append([]string{"status", "--debug-socket", e.agent.opts.debugSocket}, args...)...)
		if code != 0 {
			t.Fatalf("status on %s: exit %d", e.host, code)
		}
		return out
	}
	// An agent sees its own progress only: its line says where this host
	// stands and in which wave, not how many hosts are healthy.
	lineRe := func(host string) *regexp.Regexp {
		if host == "h1" {
			return regexp.MustCompile(`(?m)^app\.service: rollout ` + id + ` running, this host soaking \(\d+ s of 30 s\) in wave 1 of 2 \(2 hosts\)$`)
		}
		return regexp.MustCompile(`(?m)^app\.service: rollout ` + id + ` running, this host pending in wave 2 of 2 \(2 hosts\)$`)
	}
	for _, e := range f.hosts {
		re := lineRe(e.host)
		eventually(t, e.host+"'s status showing the rollout", func() bool { return re.MatchString(status(e)) })
	}
	var st control.StatusReply
	if err := json.Unmarshal([]byte(status(h2, "--json")), &st); err != nil || len(st.Rollouts) != 1 || st.Rollouts[0].ID != id ||
		st.Rollouts[0].HostState != rollout.HostPending || st.Rollouts[0].HostWave != 2 || !slices.Equal(st.Rollouts[0].Units, []string{"app.service"}) {
		t.Errorf("status --json rollouts: %+v (%v)", st.Rollouts, err)
	}
	// `rollout status` counts the hosts from the coordinator's summary in
	// one line, and lists them one by one only with --hosts.
	rolloutStatus := func(args ...string) string {
		t.Helper()
		out, code := h1.cli(append([]string{"rollout", "status", id}, args...)...)
		if code != 0 {
			t.Fatalf("rollout status %s: exit %d", strings.Join(args, " "), code)
		}
		return out
	}
	var rs string
	eventually(t, "rollout status counting h1 soaking and h2 waiting", func() bool {
		rs = rolloutStatus()
		return strings.Contains(rs, "0 healthy · 1 soaking · 1 waiting")
	})
	if strings.Contains(rs, "HOST") || !strings.Contains(rs, "--hosts all|failed|pending") {
		t.Errorf("rollout status without --hosts lists the hosts, or does not say how to:\n%s", rs)
	}
	rs = rolloutStatus("--hosts", "all")
	if !regexp.MustCompile(`(?m)^h1\s+1\s+soaking\s`).MatchString(rs) || !regexp.MustCompile(`(?m)^h2\s+2\s+pending\s`).MatchString(rs) {
		t.Errorf("rollout status --hosts all: want h1 soaking in wave 1 and h2 pending in wave 2:\n%s", rs)
	}
	if out, code := h1.cli("rollout", "abort", id, "--revert", "--etcd-endpoints", h1.endpoint); code != 0 {
		t.Fatalf("rollout abort --revert: exit %d\n%s", code, out)
	}
	f.waitRollout(id, 30*time.Second, "h1 reverted", func(v rollout.View, ph rollout.Phase) bool {
		p := v.Progress["h1"]
		return p != nil && p.State == rollout.HostReverted
	})
	if got, ok := h1.readLocal("app.service"); !ok || got != app {
		t.Error("h1 did not get app.service back after abort --revert")
	}
	if pid := h1.h.MainPID(t, "app.service"); pid == 0 {
		t.Error("h1's app.service does not run after abort --revert")
	}
	if pid := h2.h.MainPID(t, "app.service"); pid != before["h2"] {
		t.Errorf("h2's app.service MainPID %d → %d: the aborted rollout touched it", before["h2"], pid)
	}
	eventually(t, "rollout status counting h1 reverted", func() bool {
		rs = rolloutStatus()
		return strings.Contains(rs, "phase:    aborted") && strings.Contains(rs, "0 healthy · 1 reverted · 1 waiting")
	})
	for _, e := range f.hosts {
		eventually(t, e.host+"'s status without the ended rollout", func() bool { return !strings.Contains(status(e), "rollout "+id) })
	}
}
