package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
)

// Edges of rollouts, as an operator meets them: gates that fail, hang or
// are run by the coordinator, previews and edits staged as rollouts, and a
// host that never finishes taking the change on a real systemd. Each test
// asserts what the operator sees (exit codes, output, the registry's keys,
// /proc, systemd's own view).

// cliKeys is the registry but the keys the stand-in agents write on their
// own (their membership records): what the CLI's writes change.
func (e *rolloutEnv) cliKeys(t *testing.T) map[string]string {
	t.Helper()
	d := e.dump(t)
	maps.DeleteFunc(d, func(k, _ string) bool {
		return strings.HasPrefix(k, "/agentd/members/") || strings.HasPrefix(k, "/agentd/agents/")
	})
	return d
}

// gateRunKey is where a command that runs a rollout's gate says so.
func gateRunKey(id string) string { return "/agentd/rollouts/gaterun/web/" + id }

// keyExists says the registry has key.
func (e *rolloutEnv) keyExists(t *testing.T, key string) bool {
	t.Helper()
	resp, err := e.raw.Get(t.Context(), key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}

// notAdmitted fails the test when any of hosts was admitted to rollout id.
func (e *rolloutEnv) notAdmitted(t *testing.T, id string, hosts ...string) {
	t.Helper()
	for _, h := range hosts {
		if a := e.admission(t, id, h); a != nil {
			t.Errorf("%s admitted to rollout %s: %+v", h, id, a)
		}
	}
}

// admittedAfter checks that each of hosts was admitted to wave (from 0)
// of rollout id, not before after.
func (e *rolloutEnv) admittedAfter(t *testing.T, id string, wave int, after time.Time, hosts ...string) {
	t.Helper()
	for _, h := range hosts {
		a := e.admission(t, id, h)
		switch {
		case a == nil:
			t.Errorf("%s not admitted to rollout %s", h, id)
		case a.Wave != wave:
			t.Errorf("%s admitted to wave %d, want %d", h, a.Wave+1, wave+1)
		case a.At.Before(after):
			t.Errorf("%s admitted at %v, before %v", h, a.At, after)
		}
	}
}

// A --gate-cmd that fails pauses the rollout (put --wait exits 3 naming the
// gate); promote opens that wave without it. Before the next wave nothing
// runs the recorded gate any more (the put --wait is gone): `rollout
// status` says so, and `rollout resume` runs the gate here (the gate's own
// marker file proves it ran, once per wave) and follows the rollout to
// done.
func TestRolloutEdgeGateCmdFailsPromoteThenResumeRunsIt(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h1", "h2", "h3", "h4")
	marker, pass := filepath.Join(e.dir, "gate.ran"), filepath.Join(e.dir, "gate.pass")
	gate := fmt.Sprintf(`echo "$AGENTD_ROLLOUT $AGENTD_GROUP $AGENTD_WAVE" >> %s; [ -e %s ] || { echo "error rate 7%%"; exit 7; }`, marker, pass)
	ctx, cancel := context.WithCancel(t.Context())
	sim := e.simAgents(ctx, nil)
	defer func() {
		cancel()
		if err := <-sim; err != nil {
			t.Error(err)
		}
	}()
	// 4 hosts: the canary h1, then 50% (h2), then 100% (h3, h4): a gate
	// before wave 2 and one before wave 3.
	out, stderr, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web",
		"--canary", "1", "--waves", "50%,100%", "--gate-cmd", gate, "--wait", "--timeout", "30s")
	id := rolloutID(t, out)
	if !strings.Contains(out, "rollout "+id+": 4 hosts in waves 1, 2, 4;") {
		t.Errorf("put --wait does not say the 3 waves:\n%s", out)
	}
	if code != exitFailed || !strings.Contains(stderr, "rollout "+id+" paused: the gate before wave 2 failed (exit status 7): error rate 7%") {
		t.Fatalf("put --wait with a failing gate: exit %d, want %d naming the gate:\n%s", code, exitFailed, stderr)
	}
	if !strings.Contains(out, "rollout "+id+": running the gate before wave 2: "+gate) {
		t.Errorf("put --wait does not say it ran the gate:\n%s", out)
	}
	if b, _ := os.ReadFile(marker); string(b) != id+" web 2\n" {
		t.Errorf("the gate ran with %q, want once, before wave 2", b)
	}
	// The rollout waits: paused by the gate; wave 2 not admitted.
	status := func() string {
		t.Helper()
		out, _, code := e.run(t, "rollout", "status", id)
		if code != 0 {
			t.Fatalf("rollout status: exit %d", code)
		}
		return out
	}
	if s := status(); !strings.Contains(s, "phase:    paused, wave 2 of 3 — the gate before wave 2 failed (exit status 7): error rate 7%\n") {
		t.Errorf("rollout status after the failed gate does not say the rollout waits on it:\n%s", s)
	}
	e.notAdmitted(t, id, "h2", "h3", "h4")
	if e.keyExists(t, gateRunKey(id)) {
		t.Errorf("%s still exists after put --wait returned", gateRunKey(id))
	}

	// promote: wave 2 opens without the gate.
	promoted := time.Now()
	if out, _, code := e.run(t, "rollout", "promote", id); code != 0 || !strings.Contains(out, "rollout "+id+" promoted: wave 2 of 3 goes on") {
		t.Fatalf("promote: exit %d\n%s", code, out)
	}
	v := e.summarized(t, id, func(v rollout.View) bool {
		ph := v.Phase()
		return ph.State == rollout.WaitingGate && ph.Wave == 2
	})
	if v.Record.Gated != 1 || v.Progress["h2"].StateOf() != rollout.HostHealthy {
		t.Errorf("after promote: gated %d, h2 %+v", v.Record.Gated, v.Progress["h2"])
	}
	e.admittedAfter(t, id, 1, promoted, "h2")
	// Before wave 3: nothing runs the gate; status says so and how.
	want := "phase:    waiting-gate, wave 3 of 3 — waiting for the gate command before wave 3; no command is running it: `agentd rollout resume " +
		id + "` runs it here, `agentd rollout promote " + id + "` skips it\n"
	if s := status(); !strings.Contains(s, want) {
		t.Errorf("rollout status before wave 3 lacks %q:\n%s", want, s)
	}
	if b, _ := os.ReadFile(marker); string(b) != id+" web 2\n" {
		t.Errorf("a gate ran with no command to run it: %q", b)
	}
	e.notAdmitted(t, id, "h3", "h4")

	// resume runs the recorded gate here, and follows the rollout to done.
	if err := os.WriteFile(pass, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, stderr, code = e.run(t, "rollout", "resume", id, "--timeout", "30s")
	if code != 0 {
		t.Fatalf("rollout resume: exit %d\n%s%s", code, out, stderr)
	}
	for _, want := range []string{
		"rollout " + id + " waits for its gate before wave 3: running it here\n",
		"rollout " + id + ": running the gate before wave 3: " + gate + "\n",
		"rollout " + id + ": the gate passed: wave 3 opens\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rollout resume output lacks %q:\n%s", want, out)
		}
	}
	if !strings.HasSuffix(out, "rollout "+id+": done, wave 3 of 3 · 4 healthy\n") {
		t.Errorf("rollout resume did not follow the rollout to done:\n%s", out)
	}
	if b, _ := os.ReadFile(marker); string(b) != id+" web 2\n"+id+" web 3\n" {
		t.Errorf("the gate ran with %q, want before wave 2 (put --wait) and before wave 3 (resume)", b)
	}
	v = e.view(t, id)
	if v.Record.Gated != 2 || v.Record.End == nil || v.Record.End.State != rollout.Done {
		t.Errorf("after resume: gated %d, end %+v", v.Record.Gated, v.Record.End)
	}
	e.admittedAfter(t, id, 2, start, "h3", "h4")
	if e.keyExists(t, gateRunKey(id)) {
		t.Errorf("%s still exists after resume returned", gateRunKey(id))
	}
}

// procsWith are the processes whose command line holds any of words: pid
// → command line (NULs as spaces).
func procsWith(words ...string) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, en := range ents {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", en.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue // gone, or a zombie
		}
		cl := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
		for _, w := range words {
			if strings.Contains(cl, w) {
				out[pid] = cl
				break
			}
		}
	}
	return out
}

// gateRun is one command that runs a hanging gate, watched from /proc.
type gateRun struct {
	out, stderr string
	code        int
	running     time.Time // when the gate's processes were first seen
	returned    time.Time
}

// runHangingGate runs args (a command that runs the gate
// "sleep BG & sleep FG": a shell, a child in the background and one it
// waits for) under ctx, calls seen once the gate's processes are in /proc,
// and returns once the command did and no process of the gate is left
// (failing the test if one is, a second later).
func runHangingGate(t *testing.T, e *rolloutEnv, ctx context.Context, bg, fg string, seen func(), args ...string) gateRun {
	t.Helper()
	done := make(chan gateRun, 1)
	go func() {
		var out, errb bytes.Buffer
		root := newRoot()
		root.SetArgs(append(args, "--etcd-endpoints", e.endpoint))
		root.SetOut(&out)
		root.SetErr(&errb)
		err := root.ExecuteContext(ctx)
		r := gateRun{returned: time.Now()}
		if err != nil {
			r.code = exitError
			var ce *codeError
			if asCode(err, &ce) {
				r.code = ce.code
			}
			errb.WriteString("error: " + err.Error() + "\n")
		}
		r.out, r.stderr = out.String(), errb.String()
		done <- r
	}()
	var running time.Time
	var r gateRun
wait:
	for {
		select {
		case r = <-done:
			break wait
		case <-time.After(20 * time.Millisecond):
		}
		if p := procsWith("sleep "+bg, "sleep "+fg); running.IsZero() && slices.Contains(slices.Collect(maps.Values(p)), "sleep "+bg) &&
			slices.Contains(slices.Collect(maps.Values(p)), "sleep "+fg) {
			running = time.Now()
			t.Logf("the gate's processes: %v", p)
			if seen != nil {
				seen()
			}
		}
	}
	t.Logf("$ agentd %s → %d after %v\n%s%s", strings.Join(args, " "), r.code, r.returned.Sub(running).Round(time.Millisecond), r.out, r.stderr)
	if running.IsZero() {
		t.Fatal("the gate's processes (both sleeps) were never seen in /proc while it ran")
	}
	r.running = running
	// Killed as a group, they are gone (reaped) at once; allow the kernel
	// a moment to finish the kills.
	var left map[int]string
	deadline := time.Now().Add(time.Second)
	for {
		left = procsWith(bg, fg)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for pid := range left {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		t.Errorf("a process of the gate outlived the command by %v: pid %d: %s", time.Since(r.returned).Round(time.Millisecond), pid, b)
	}
	if len(left) == 0 {
		t.Logf("the gate's processes gone %v after the command returned", time.Since(r.returned).Round(time.Millisecond))
	}
	return r
}

// hangingGate is a gate that never ends and leaves a child in the
// background, with durations no other process has on its command line.
func hangingGate() (gate, bg, fg string) {
	tok := fmt.Sprintf("%09d", time.Now().UnixNano()%1e9)
	bg, fg = "1001."+tok, "1002."+tok
	return "sleep " + bg + " & sleep " + fg, bg, fg
}

// A gate that hangs, and leaves a child in the background, is stopped by
// --gate-timeout: put --wait fails (exit 3) saying the gate timed out, the
// rollout is paused, and no process of the gate is left.
func TestRolloutEdgeGateTimeoutKillsEveryProcess(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h1", "h2", "h3")
	gate, bg, fg := hangingGate()
	ctx, cancel := context.WithCancel(t.Context())
	sim := e.simAgents(ctx, nil)
	defer func() {
		cancel()
		if err := <-sim; err != nil {
			t.Error(err)
		}
	}()
	res := runHangingGate(t, e, t.Context(), bg, fg, nil, "unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web", "--canary", "1",
		"--gate-cmd", gate, "--gate-timeout", "1s", "--wait", "--timeout", "30s")
	if res.code != exitFailed {
		t.Fatalf("put --wait with a hanging gate: exit %d, want %d\n%s", res.code, exitFailed, res.stderr)
	}
	id := rolloutID(t, res.out)
	want := "rollout " + id + " paused: the gate before wave 2 failed (timed out after 1s (--gate-timeout), its processes killed)"
	if !strings.Contains(res.stderr, want) {
		t.Errorf("put --wait does not say the gate timed out: want %q in\n%s", want, res.stderr)
	}
	if took := res.returned.Sub(res.running); took > 5*time.Second {
		t.Errorf("put --wait returned %v after the gate started, with --gate-timeout 1s", took.Round(time.Millisecond))
	}
	v := e.view(t, id)
	if !v.Record.Paused || v.Phase().State != rollout.Paused || !strings.Contains(v.Record.PauseReason, "timed out after 1s") || v.Record.Strategy.GateTimeout != time.Second {
		t.Errorf("the rollout: paused %v (%q), phase %+v, gate timeout %v", v.Record.Paused, v.Record.PauseReason, v.Phase(), v.Record.Strategy.GateTimeout)
	}
	e.notAdmitted(t, id, "h2", "h3")
	if out, _, _ := e.run(t, "rollout", "status", id); !strings.Contains(out, "phase:    paused, wave 2 of 2 — the gate before wave 2 failed (timed out after 1s") ||
		!strings.Contains(out, "--gate-timeout 1s") {
		t.Errorf("rollout status does not say the gate timed out, or its --gate-timeout:\n%s", out)
	}
}

// put --wait interrupted while its gate runs (Ctrl-C: its context ends)
// kills the gate with it, background child included, and leaves the
// rollout waiting for the gate, not paused: `rollout status` then says no
// command runs it.
func TestRolloutEdgeGateInterruptedKillsEveryProcess(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h1", "h2", "h3")
	gate, bg, fg := hangingGate()
	ctx, cancel := context.WithCancel(t.Context())
	sim := e.simAgents(ctx, nil)
	defer func() {
		cancel()
		if err := <-sim; err != nil {
			t.Error(err)
		}
	}()
	var id string
	cctx, interrupt := context.WithCancel(t.Context())
	defer interrupt()
	res := runHangingGate(t, e, cctx, bg, fg, func() {
		// While the gate runs, the command says it runs it.
		vs, err := e.reg.Rollouts(t.Context(), "web", false)
		if err != nil || len(vs) != 1 {
			t.Fatalf("rollouts: %d (%v)", len(vs), err)
		}
		id = vs[0].Record.ID
		if vs[0].GateRunner != storedBy() || !e.keyExists(t, gateRunKey(id)) {
			t.Errorf("while put --wait runs the gate, its runner is %q, want %q", vs[0].GateRunner, storedBy())
		}
		interrupt()
	}, "unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web", "--canary", "1",
		"--gate-cmd", gate, "--wait", "--timeout", "30s")
	if res.code != exitError || !strings.Contains(res.stderr, "error: interrupted: rollout "+id+" is waiting-gate, wave 2 of 2") ||
		!strings.Contains(res.stderr, "it goes on without this command") {
		t.Errorf("put --wait interrupted while its gate runs: exit %d, want %d saying the rollout waits for its gate\n%s", res.code, exitError, res.stderr)
	}
	if took := res.returned.Sub(res.running); took > 5*time.Second {
		t.Errorf("put --wait returned %v after it was interrupted", took.Round(time.Millisecond))
	}
	v := e.view(t, id)
	if v.Record.Paused || v.Record.Gated != 0 || v.GateRunner != "" || e.keyExists(t, gateRunKey(id)) {
		t.Errorf("after the interrupt: paused %v (%q), gated %d, gate runner %q", v.Record.Paused, v.Record.PauseReason, v.Record.Gated, v.GateRunner)
	}
	e.notAdmitted(t, id, "h2", "h3")
	want := "phase:    waiting-gate, wave 2 of 2 — waiting for the gate command before wave 2; no command is running it: `agentd rollout resume " + id + "` runs it here"
	if out, _, _ := e.run(t, "rollout", "status", id); !strings.Contains(out, want) {
		t.Errorf("rollout status lacks %q:\n%s", want, out)
	}
}

// gateServer is an HTTP gate the test answers: each request is counted and
// answered with status and body (both may change meanwhile).
type gateServer struct {
	*httptest.Server
	hang    bool // answer nothing until the request is given up
	mu      sync.Mutex
	status  int
	body    string
	hits    []time.Time
	queries []string // the URL's query string of each request (path?query)
}

func newGateServer(t *testing.T, status int, body string) *gateServer {
	g := &gateServer{status: status, body: body}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.hits = append(g.hits, time.Now())
		g.queries = append(g.queries, r.URL.RequestURI())
		status, body := g.status, g.body
		g.mu.Unlock()
		if g.hang {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(g.Close)
	return g
}

func (g *gateServer) answer(status int, body string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.status, g.body = status, body
}

func (g *gateServer) seen() ([]time.Time, []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.hits), slices.Clone(g.queries)
}

// --gate-url is run by the group's coordinator: with no command following
// the rollout, 200 opens the next wave (after the canary is healthy) and
// 503 pauses the rollout naming the answer; once the URL answers 200,
// resume goes on.
func TestRolloutEdgeGateURL(t *testing.T) {
	t.Parallel()
	start := func(t *testing.T, g *gateServer, hosts []string, extra ...string) (*rolloutEnv, string) {
		e := newRolloutEnv(t, hosts...)
		ctx, cancel := context.WithCancel(t.Context())
		sim := e.simAgents(ctx, nil)
		t.Cleanup(func() {
			cancel()
			if err := <-sim; err != nil {
				t.Error(err)
			}
		})
		args := append([]string{"unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web", "--canary", "1", "--gate-url", g.URL + "/ready"}, extra...)
		out, _, code := e.run(t, args...)
		if code != 0 {
			t.Fatalf("put with --gate-url: exit %d", code)
		}
		return e, rolloutID(t, out)
	}
	three := []string{"h1", "h2", "h3"}
	t.Run("200", func(t *testing.T) {
		t.Parallel()
		g := newGateServer(t, http.StatusOK, "ok")
		// 4 hosts: the canary h1, 50% (h2), 100% (h3, h4): a gate before
		// wave 2 and one before wave 3.
		e, id := start(t, g, []string{"h1", "h2", "h3", "h4"}, "--waves", "50%,100%")
		v := e.summarized(t, id, func(v rollout.View) bool {
			return v.Phase().State == rollout.Done && v.Summary.Phase.State == rollout.Done
		})
		hits, uris := g.seen()
		if len(hits) != 2 || uris[0] != "/ready" || uris[1] != "/ready" {
			t.Fatalf("the gate URL was asked %d times (%v), want twice: before wave 2 and before wave 3", len(hits), uris)
		}
		for i, before := range []string{"h1", "h2"} {
			if p := v.Progress[before]; p == nil || hits[i].Before(p.HealthyAt) {
				t.Errorf("the gate before wave %d was asked at %v, before %s (wave %d) was healthy (%+v)", i+2, hits[i], before, i+1, p)
			}
		}
		e.admittedAfter(t, id, 1, hits[0], "h2")
		e.admittedAfter(t, id, 2, hits[1], "h3", "h4")
		if v.Record.Gated != 2 || v.Count(rollout.HostHealthy) != 4 {
			t.Errorf("gated %d, %d healthy", v.Record.Gated, v.Count(rollout.HostHealthy))
		}
		if out, _, _ := e.run(t, "rollout", "status", id); !strings.Contains(out, "strategy: --canary 1 --waves 50%,100% --gate-url "+g.URL+"/ready\n") {
			t.Errorf("rollout status does not show the gate URL:\n%s", out)
		}
	})
	t.Run("503, promote", func(t *testing.T) {
		t.Parallel()
		g := newGateServer(t, http.StatusServiceUnavailable, "not yet")
		e, id := start(t, g, three)
		e.summarized(t, id, func(v rollout.View) bool { return v.Record.Paused })
		// The operator knows better than the gate: promote opens the wave
		// without asking it again (the pause says so).
		promoted := time.Now()
		if out, _, code := e.run(t, "rollout", "promote", id); code != 0 || !strings.Contains(out, "rollout "+id+" promoted: wave 2 of 2 goes on") {
			t.Fatalf("promote: exit %d\n%s", code, out)
		}
		v := e.summarized(t, id, func(v rollout.View) bool {
			return v.Record.End != nil || v.Record.Paused || (e.admission(t, id, "h2") != nil && e.admission(t, id, "h3") != nil)
		})
		if v.Record.Paused {
			t.Fatalf("promote did not open wave 2 past the failed gate: paused again: %s", v.Record.PauseReason)
		}
		e.admittedAfter(t, id, 1, promoted, "h2", "h3")
		if hits, _ := g.seen(); len(hits) != 1 {
			t.Errorf("the gate URL was asked %d times, want once: promote skips it", len(hits))
		}
	})
	t.Run("hangs", func(t *testing.T) {
		t.Parallel()
		g := newGateServer(t, http.StatusOK, "ok")
		g.hang = true
		e, id := start(t, g, three, "--gate-timeout", "1s")
		v := e.summarized(t, id, func(v rollout.View) bool { return v.Record.Paused })
		hits, _ := g.seen()
		if len(hits) != 1 {
			t.Fatalf("the gate URL was asked %d times, want once", len(hits))
		}
		if took := v.Record.PausedAt.Sub(hits[0]); took < 900*time.Millisecond || took > 5*time.Second {
			t.Errorf("paused %v after the gate was asked, with --gate-timeout 1s", took)
		}
		if r, want := v.Record.PauseReason, "the gate before wave 2 failed: --gate-url "+g.URL+"/ready: no answer within 1s (the --gate-timeout deadline)"; r != want {
			t.Errorf("pause reason %q, want %q", r, want)
		}
		e.notAdmitted(t, id, "h2", "h3")
	})
	t.Run("503", func(t *testing.T) {
		t.Parallel()
		g := newGateServer(t, http.StatusServiceUnavailable, "not yet")
		e, id := start(t, g, three)
		v := e.summarized(t, id, func(v rollout.View) bool { return v.Record.Paused })
		reason := "the gate before wave 2 failed: --gate-url " + g.URL + "/ready answered 503 Service Unavailable"
		if v.Record.PauseReason != reason {
			t.Errorf("pause reason %q, want %q", v.Record.PauseReason, reason)
		}
		if out, _, _ := e.run(t, "rollout", "status", id); !strings.Contains(out, "phase:    paused, wave 2 of 2 — "+reason+"\n") {
			t.Errorf("rollout status does not say the gate paused it:\n%s", out)
		}
		time.Sleep(2 * simStep) // the agents would take wave 2 now if they could
		e.notAdmitted(t, id, "h2", "h3")
		if hits, _ := g.seen(); len(hits) != 1 {
			t.Errorf("the gate URL was asked %d times while the rollout is paused, want once", len(hits))
		}
		// The URL answers 200 now: resume, and the coordinator asks again.
		g.answer(http.StatusOK, "ok")
		resumed := time.Now()
		if out, _, code := e.run(t, "rollout", "resume", id); code != 0 || !strings.Contains(out, "rollout "+id+" resumed at wave 2 of 2\n") {
			t.Fatalf("resume: exit %d\n%s", code, out)
		}
		v = e.summarized(t, id, func(v rollout.View) bool {
			return v.Phase().State == rollout.Done && v.Summary.Phase.State == rollout.Done
		})
		hits, _ := g.seen()
		if len(hits) != 2 || hits[1].Before(resumed) {
			t.Errorf("the gate URL was asked at %v, want once more after the resume (%v)", hits, resumed)
		}
		e.admittedAfter(t, id, 1, resumed, "h2", "h3")
		if v.Record.Gated != 1 || v.Record.Paused {
			t.Errorf("after resume: gated %d, paused %v", v.Record.Gated, v.Record.Paused)
		}
	})
}

// --gate-prom asks --prom-url's query API for the expression: an empty
// result pauses the rollout saying the expression does not hold; a sample
// opens the wave.
func TestRolloutEdgeGateProm(t *testing.T) {
	t.Parallel()
	const expr = `sum(rate(http_requests_total{code=~"5.."}[5m])) < 0.01`
	empty := `{"status":"success","data":{"resultType":"vector","result":[]}}`
	holds := `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"0.002"]}]}}`
	g := newGateServer(t, http.StatusOK, empty)
	e := newRolloutEnv(t, "h1", "h2", "h3")
	// One without the other is a usage error; nothing stored.
	before := e.cliKeys(t)
	for _, args := range [][]string{{"--gate-prom", expr}, {"--prom-url", g.URL}} {
		_, stderr, code := e.run(t, append([]string{"unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web", "--canary", "1"}, args...)...)
		if code != exitUsage || !strings.Contains(stderr, "--gate-prom needs --prom-url") || !strings.Contains(stderr, "nothing stored") {
			t.Errorf("put %v: exit %d\n%s", args, code, stderr)
		}
	}
	if after := e.cliKeys(t); !maps.Equal(before, after) {
		t.Errorf("refused puts changed the registry")
	}

	ctx, cancel := context.WithCancel(t.Context())
	sim := e.simAgents(ctx, nil)
	defer func() {
		cancel()
		if err := <-sim; err != nil {
			t.Error(err)
		}
	}()
	out, _, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web", "--canary", "1",
		"--gate-prom", expr, "--prom-url", g.URL+"/")
	if code != 0 {
		t.Fatalf("put with --gate-prom: exit %d", code)
	}
	id := rolloutID(t, out)
	v := e.summarized(t, id, func(v rollout.View) bool { return v.Record.Paused })
	reason := fmt.Sprintf("the gate before wave 2 failed: %q does not hold (no sample)", expr)
	if v.Record.PauseReason != reason {
		t.Errorf("pause reason %q, want %q", v.Record.PauseReason, reason)
	}
	_, queries := g.seen()
	if len(queries) != 1 {
		t.Fatalf("Prometheus was asked %d times (%v), want once", len(queries), queries)
	}
	if !strings.HasPrefix(queries[0], "/api/v1/query?") {
		t.Errorf("Prometheus was asked %q, want its /api/v1/query", queries[0])
	}
	if i := strings.IndexByte(queries[0], '?'); i >= 0 {
		q, err := urlQuery(queries[0][i+1:])
		if err != nil || q != expr {
			t.Errorf("the query asked was %q (%v), want %q", q, err, expr)
		}
	}
	if out, _, _ := e.run(t, "rollout", "status", id); !strings.Contains(out, "phase:    paused, wave 2 of 2 — "+reason+"\n") {
		t.Errorf("rollout status does not say the expression paused it:\n%s", out)
	}
	e.notAdmitted(t, id, "h2", "h3")

	g.answer(http.StatusOK, holds)
	resumed := time.Now()
	if _, _, code := e.run(t, "rollout", "resume", id); code != 0 {
		t.Fatalf("resume: exit %d", code)
	}
	v = e.summarized(t, id, func(v rollout.View) bool {
		return v.Phase().State == rollout.Done && v.Summary.Phase.State == rollout.Done
	})
	e.admittedAfter(t, id, 1, resumed, "h2", "h3")
	if v.Record.Gated != 1 || v.Count(rollout.HostHealthy) != 3 {
		t.Errorf("gated %d, %d healthy", v.Record.Gated, v.Count(rollout.HostHealthy))
	}
}

// urlQuery is the "query" parameter of a raw query string.
func urlQuery(raw string) (string, error) {
	req, err := http.NewRequest(http.MethodGet, "http://x/?"+raw, nil)
	if err != nil {
		return "", err
	}
	return req.URL.Query().Get("query"), nil
}

// `unit put --dry-run` with the rollout options shows the waves it would
// make (which hosts in which wave, the canary, the soak) and stores
// nothing; --json gives them as one rollout-preview line.
func TestRolloutEdgeDryRunPreviewsWaves(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h3", "h1", "h4", "h2")
	file := e.unit(t, "hello.service", "/bin/true")
	before := e.cliKeys(t)
	out, _, code := e.run(t, "unit", "put", file, "--dry-run", "--group", "web", "--canary", "1", "--waves", "50%,100%", "--soak", "30s")
	if code != 0 {
		t.Fatalf("put --dry-run: exit %d", code)
	}
	want := "rollout: 4 hosts of group web in 3 waves (--canary 1 --waves 50%,100% --soak 30s)\n" +
		"  wave 1 (canary): h1\n" +
		"  wave 2: h2\n" +
		"  wave 3: h3, h4\n" +
		"  each host healthy for 30s before it counts\n" +
		"dry run: nothing stored\n"
	if !strings.HasSuffix(out, want) {
		t.Errorf("put --dry-run does not end with the waves:\nwant\n%s\ngot\n%s", want, out)
	}
	if strings.Contains(out, "stored groups/") {
		t.Errorf("put --dry-run says it stored something:\n%s", out)
	}
	out, _, code = e.run(t, "unit", "put", file, "--dry-run", "--group", "web", "--canary", "1", "--waves", "50%,100%", "--soak", "30s", "--json")
	if code != 0 {
		t.Fatalf("put --dry-run --json: exit %d", code)
	}
	var preview map[string]any
	for _, m := range jsonLines(t, out) {
		if m["event"] == "rollout-preview" {
			if preview != nil {
				t.Errorf("two rollout-preview lines")
			}
			preview = m
		}
	}
	wantWaves := []any{[]any{"h1"}, []any{"h2"}, []any{"h3", "h4"}}
	if preview == nil || preview["group"] != "web" || preview["hosts"] != 4.0 || !reflect.DeepEqual(preview["waves"], wantWaves) {
		t.Fatalf("rollout-preview line: %v", preview)
	}
	s, _ := preview["strategy"].(map[string]any)
	if s == nil || s["soak"] != float64(30*time.Second) || !reflect.DeepEqual(s["canary"], map[string]any{"n": 1.0}) {
		t.Errorf("rollout-preview strategy: %v", s)
	}
	if after := e.cliKeys(t); !maps.Equal(before, after) {
		t.Errorf("put --dry-run changed the registry:\nbefore %v\nafter  %v", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
	}
	// What holds each wave: the promote after the canary, then the gate.
	out, _, code = e.run(t, "unit", "put", file, "--dry-run", "--group", "web", "--canary", "1", "--waves", "50%", "--pause-after-canary", "--gate-cmd", "true")
	want = "rollout: 4 hosts of group web in 3 waves (--canary 1 --waves 50% --pause-after-canary --gate-cmd \"true\")\n" +
		"  wave 1 (canary): h1\n" +
		"  wave 2 (after `agentd rollout promote`): h2\n" +
		"  wave 3 (after the gate): h3, h4\n" +
		"dry run: nothing stored\n"
	if code != 0 || !strings.HasSuffix(out, want) {
		t.Errorf("put --dry-run --pause-after-canary --gate-cmd: exit %d, want it to end with\n%s", code, want)
	}
	if after := e.cliKeys(t); !maps.Equal(before, after) {
		t.Errorf("put --dry-run changed the registry")
	}
	if all, err := e.reg.Rollouts(t.Context(), "web", false); err != nil || len(all) != 0 {
		t.Errorf("rollouts after --dry-run: %d (%v)", len(all), err)
	}
}

// `unit edit --group web --canary 1 --yes` stages the edit as a rollout:
// its preview shows the waves, a rollout record holds what the key held
// before, and only the canary is admitted until it is healthy.
func TestRolloutEdgeEditStagesRollout(t *testing.T) { // not parallel: $EDITOR
	e := newRolloutEnv(t, "h1", "h2", "h3")
	v1 := e.unit(t, "hello.service", "/bin/sleep 1001")
	if _, _, code := e.run(t, "unit", "put", v1, "--group", "web"); code != 0 {
		t.Fatalf("put: exit %d", code)
	}
	old, _ := os.ReadFile(v1)
	edited := strings.Replace(string(old), "sleep 1001", "sleep 1002", 1)
	t.Setenv("TMPDIR", t.TempDir())
	t.Setenv("VISUAL", "")
	t.Setenv("EDITOR", editorScript(t, e.dir, `sed -i 's/sleep 1001/sleep 1002/' "$1"`))

	// --gate-cmd needs the edit to follow the rollout.
	before := e.cliKeys(t)
	if _, stderr, code := e.run(t, "unit", "edit", "hello.service", "--group", "web", "--canary", "1", "--gate-cmd", "true", "--no-wait", "--yes"); code != exitUsage ||
		!strings.Contains(stderr, "--gate-cmd is run by this command while it follows the rollout: drop --no-wait; nothing stored") {
		t.Errorf("edit --gate-cmd --no-wait: exit %d, want %d saying --no-wait is the matter (edit has no --wait):\n%s", code, exitUsage, stderr)
	}
	if after := e.cliKeys(t); !maps.Equal(before, after) {
		t.Errorf("a refused edit changed the registry")
	}

	ctx, cancel := context.WithCancel(t.Context())
	sim := e.simAgents(ctx, nil)
	out, stderr, code := e.run(t, "unit", "edit", "hello.service", "--group", "web", "--canary", "1", "--yes", "--timeout", "30s")
	cancel()
	if err := <-sim; err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("edit: exit %d\n%s", code, stderr)
	}
	id := rolloutID(t, out)
	for _, want := range []string{
		"-ExecStart=/bin/sleep 1001\n", "+ExecStart=/bin/sleep 1002\n",
		"rollout: 3 hosts of group web in 2 waves (--canary 1)\n  wave 1 (canary): h1\n  wave 2: h2, h3\n",
		"stored groups/web/units/hello.service",
		"rollout " + id + ": 3 hosts in waves 1, 3;",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("edit output lacks %q:\n%s", want, out)
		}
	}
	if i, j := strings.Index(out, "wave 1 (canary): h1"), strings.Index(out, "stored groups/web"); i < 0 || j < i {
		t.Errorf("the waves are not shown before the edit is stored:\n%s", out)
	}
	if !strings.HasSuffix(out, "rollout "+id+": done, wave 2 of 2 · 3 healthy\n") {
		t.Errorf("edit did not follow the rollout to done:\n%s", out)
	}
	// The rollout's record: the key, what it held before, the waves.
	v := e.view(t, id)
	r := v.Record
	u, ok := r.Units["hello.service"]
	if !ok || u.From == nil || *u.From != string(old) || u.ToHash != reconcile.Hash([]byte(edited)) || len(r.Units) != 1 {
		t.Errorf("the rollout's units: %+v", r.Units)
	}
	if !slices.Equal(r.Hosts, []string{"h1", "h2", "h3"}) || !slices.Equal(r.WaveEnds, []int{1, 3}) || r.Strategy.Canary != (rollout.Count{N: 1}) {
		t.Errorf("hosts %v, waves %v, strategy %+v", r.Hosts, r.WaveEnds, r.Strategy)
	}
	if b, err := e.reg.Get(t.Context(), registry.Target{Group: "web"}, "hello.service"); err != nil || string(b) != edited {
		t.Errorf("the key holds %q (%v), want the edit", b, err)
	}
	// The canary alone first: the others admitted once it was healthy.
	if a := e.admission(t, id, "h1"); a == nil || a.Wave != 0 {
		t.Errorf("the canary's admission: %+v", a)
	}
	canary := v.Progress["h1"]
	if canary == nil || canary.HealthyAt.IsZero() {
		t.Fatalf("the canary's progress: %+v", canary)
	}
	e.admittedAfter(t, id, 1, canary.HealthyAt, "h2", "h3")

	// While another rollout of the key runs (no agent moves it here), a
	// staged edit is refused and kept; --supersede ends that rollout.
	out, _, code = e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/sleep 1003"), "--group", "web", "--canary", "1")
	if code != 0 {
		t.Fatalf("put: exit %d", code)
	}
	running := rolloutID(t, out)
	t.Setenv("EDITOR", editorScript(t, e.dir, `sed -i 's/sleep 1003/sleep 1004/' "$1"`))
	before = e.cliKeys(t)
	_, stderr, code = e.run(t, "unit", "edit", "hello.service", "--group", "web", "--canary", "1", "--yes", "--no-wait")
	kept := regexp.MustCompile(`your edit is kept in (\S+)\)`).FindStringSubmatch(stderr)
	if code != exitError || !strings.Contains(stderr, "a rollout of these keys is running: "+running+" (hello.service)") ||
		!strings.Contains(stderr, "--supersede") || kept == nil {
		t.Fatalf("edit while a rollout of the key runs: exit %d, want %d naming it, --supersede, and where the edit is kept:\n%s", code, exitError, stderr)
	}
	if b, err := os.ReadFile(kept[1]); err != nil || !strings.Contains(string(b), "ExecStart=/bin/sleep 1004") {
		t.Errorf("the refused edit is not kept in %s: %q (%v)", kept[1], b, err)
	}
	if after := e.cliKeys(t); !maps.Equal(before, after) {
		t.Errorf("the refused edit changed the registry")
	}
	out, _, code = e.run(t, "unit", "edit", "hello.service", "--group", "web", "--canary", "1", "--supersede", "--yes", "--no-wait")
	if code != 0 || !strings.Contains(out, "rollout "+running+": superseded by ") {
		t.Fatalf("edit --supersede: exit %d\n%s", code, out)
	}
	var next string
	for _, m := range rolloutIDRe.FindAllStringSubmatch(out, -1) {
		if m[1] != running {
			next = m[1]
		}
	}
	if old := e.view(t, running).Record; old.End == nil || old.End.State != rollout.Superseded || old.End.Reason != "superseded by "+next {
		t.Errorf("the superseded rollout's end: %+v", old.End)
	}
	if nr := e.view(t, next).Record; nr.End != nil || !strings.Contains(*nr.Units["hello.service"].From, "sleep 1003") ||
		nr.Units["hello.service"].ToHash != reconcile.Hash([]byte(strings.Replace(string(old), "sleep 1001", "sleep 1004", 1))) {
		t.Errorf("the edit's rollout: end %+v, units %+v", nr.End, nr.Units)
	}
}

// jsonLines decodes each line of out (test helper for --json output).
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var ms []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("%q is not JSON: %v", l, err)
			continue
		}
		ms = append(ms, m)
	}
	return ms
}

// A host whose unit hangs in ExecStartPre (only there: the hang depends on
// a file in that host's runtime directory) holds the rollout up until its
// --progress-deadline: put --wait fails naming that host with the state
// its agent reported and for how long, its "keep the change" list names
// only the hosts that ran the change healthy, and `agentd status` on the
// hung host shows systemd's state now: activating, in start-pre.
func TestRolloutEdgeHungHostIsNamed(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 5, "")
	v1 := "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n" + fast
	f.put(v1, 0)
	f.waitRolledOut(v1, 20*time.Second)
	hung := f.hosts[2] // h3, in the second wave
	if err := os.WriteFile(filepath.Join(hung.h.Dir, "run", "hang"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	v2 := "[Service]\nType=exec\nExecStartPre=/bin/sh -c 'if [ -e %t/hang ]; then exec /bin/sleep 600; fi'\nExecStart=/bin/sleep 1001\n" + fast
	start := time.Now()
	out := f.put(v2, exitFailed, "--canary", "1", "--progress-deadline", "5s")
	t.Logf("put --wait failed after %v", time.Since(start).Round(time.Millisecond))
	id := rolloutID(t, out)
	fail := regexp.MustCompile(`(?m)^error: rollout ` + id + ` failed — (.*)$`).FindStringSubmatch(out)
	if fail == nil {
		t.Fatalf("put --wait does not say the rollout failed:\n%s", out)
	}
	msg := fail[1]
	if !regexp.MustCompile(`no host became healthy for 5s \(--progress-deadline\), since [^;]*; holding it up: h3: applying for [0-9]+s \(wave 2 of 2\);`).MatchString(msg) {
		t.Errorf("put --wait does not name h3 holding the rollout up, with its state and for how long:\n%s", msg)
	}
	if regexp.MustCompile(`h[1245]: applying`).MatchString(msg) {
		t.Errorf("put --wait names a host that did not hold the rollout up:\n%s", msg)
	}
	keep := regexp.MustCompile(`these hosts keep the change: ([^;]*)`).FindStringSubmatch(msg)
	if keep == nil || keep[1] != "h1, h2, h4, h5" {
		t.Errorf("the hosts that keep the change: %q, want h1, h2, h4, h5 (not the hung h3):\n%s", keep, msg)
	}
	if !strings.HasSuffix(msg, "; these were still taking it (never healthy on it): h3") {
		t.Errorf("put --wait does not name h3 as still taking the change:\n%s", msg)
	}
	if !regexp.MustCompile(`(?m)^h3 \(wave 2\): applying — applying for [0-9]+s \(wave 2 of 2\)$`).MatchString(out) {
		t.Errorf("put --wait did not name h3 as an offender:\n%s", out)
	}

	// The record and systemd agree: h3 hangs, the others run the change.
	v, err := f.reg.Rollout(t.Context(), id, true)
	if err != nil {
		t.Fatal(err)
	}
	if v.Record.End == nil || v.Record.End.State != rollout.Failed {
		t.Errorf("the rollout: %s", describeRollout(v))
	}
	for _, e := range f.hosts {
		want := rollout.HostHealthy
		if e == hung {
			want = rollout.HostApplying
		}
		if st := v.Progress[e.host].StateOf(); st != want {
			t.Errorf("%s: %s in the rollout, want %s", e.host, st, want)
		}
	}
	for _, e := range f.hosts {
		st, sub := e.h.ActiveState(t, "app.service"), e.h.Prop(t, "app.service", "SubState")
		want, wantSub := "active", "running"
		if e == hung {
			want, wantSub = "activating", "start-pre"
		}
		if st != want || sub != wantSub {
			t.Errorf("%s: systemd says app.service is %s/%v, want %s/%s", e.host, st, sub, want, wantSub)
		}
	}
	// agentd status on the hung host: systemd's state now, not the state
	// it had before the change.
	sout, code := hung.cli("status", "--debug-socket", hung.agent.opts.debugSocket)
	line := regexp.MustCompile(`(?m)^app\.service .*$`).FindString(sout)
	if code != 0 || !strings.Contains(line, " activating/start-pre ") {
		t.Errorf("agentd status on h3: exit %d, app.service line %q: want activating/start-pre\n%s", code, line, sout)
	}
	if strings.Contains(line, "active/running") {
		t.Errorf("agentd status on h3 shows app.service active/running while systemd says it hangs in start-pre: %q", line)
	}
	if strings.Contains(sout, "rollout "+id+" running") {
		t.Errorf("agentd status on h3 says the failed rollout runs:\n%s", sout)
	}
}
