package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
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

// A gate that hangs, and leaves a child in the background, is stopped by
// --gate-timeout: put --wait fails (exit 3) saying the gate timed out, the
// rollout is paused, and no process of the gate is left.
func TestRolloutEdgeGateTimeoutKillsEveryProcess(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h1", "h2", "h3")
	// Durations no other process has on its command line.
	tok := fmt.Sprintf("%09d", time.Now().UnixNano()%1e9)
	bg, fg := "1001."+tok, "1002."+tok
	gate := "sleep " + bg + " & sleep " + fg
	ctx, cancel := context.WithCancel(t.Context())
	sim := e.simAgents(ctx, nil)
	defer func() {
		cancel()
		if err := <-sim; err != nil {
			t.Error(err)
		}
	}()
	type result struct {
		out, stderr string
		code        int
		at          time.Time
	}
	done := make(chan result, 1)
	go func() {
		out, stderr, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web", "--canary", "1",
			"--gate-cmd", gate, "--gate-timeout", "1s", "--wait", "--timeout", "30s")
		done <- result{out, stderr, code, time.Now()}
	}()
	// The gate's processes exist while it runs (so the scan below can see
	// them): the shell, its background sleep and the one it waits for.
	var seen map[int]string
	var res result
	var running time.Time
wait:
	for {
		select {
		case res = <-done:
			break wait
		case <-time.After(20 * time.Millisecond):
		}
		if p := procsWith("sleep "+bg, "sleep "+fg); running.IsZero() && len(p) >= 2 {
			seen, running = p, time.Now()
			t.Logf("the gate's processes: %v", p)
		}
	}
	if res.code != exitFailed {
		t.Fatalf("put --wait with a hanging gate: exit %d, want %d\n%s", res.code, exitFailed, res.stderr)
	}
	id := rolloutID(t, res.out)
	want := "rollout " + id + " paused: the gate before wave 2 failed (timed out after 1s (--gate-timeout), its processes killed)"
	if !strings.Contains(res.stderr, want) {
		t.Errorf("put --wait does not say the gate timed out: want %q in\n%s", want, res.stderr)
	}
	if running.IsZero() {
		t.Fatalf("the gate's processes were never seen in /proc while it ran (seen %v)", seen)
	}
	if took := res.at.Sub(running); took > 5*time.Second {
		t.Errorf("put --wait returned %v after the gate started, with --gate-timeout 1s", took.Round(time.Millisecond))
	}
	// No process of the gate is left: killed as a group, they are gone
	// (reaped) at once; allow the kernel a moment to finish the kills.
	var left map[int]string
	deadline := time.Now().Add(time.Second)
	for {
		left = procsWith(bg, fg)
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(left) > 0 {
		for pid := range left {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			t.Errorf("a process of the gate outlived put --wait by %v: pid %d: %s", time.Since(res.at).Round(time.Millisecond), pid, b)
		}
	} else {
		t.Logf("the gate's processes gone %v after put --wait returned", time.Since(res.at).Round(time.Millisecond))
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

// gateServer is an HTTP gate the test answers: each request is counted and
// answered with status and body (both may change meanwhile).
type gateServer struct {
	*httptest.Server
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
	start := func(t *testing.T, g *gateServer) (*rolloutEnv, string) {
		e := newRolloutEnv(t, "h1", "h2", "h3")
		ctx, cancel := context.WithCancel(t.Context())
		sim := e.simAgents(ctx, nil)
		t.Cleanup(func() {
			cancel()
			if err := <-sim; err != nil {
				t.Error(err)
			}
		})
		out, _, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web", "--canary", "1", "--gate-url", g.URL+"/ready")
		if code != 0 {
			t.Fatalf("put with --gate-url: exit %d", code)
		}
		return e, rolloutID(t, out)
	}
	t.Run("200", func(t *testing.T) {
		t.Parallel()
		g := newGateServer(t, http.StatusOK, "ok")
		e, id := start(t, g)
		v := e.summarized(t, id, func(v rollout.View) bool { return v.Phase().State == rollout.Done })
		hits, uris := g.seen()
		if len(hits) != 1 || uris[0] != "/ready" {
			t.Fatalf("the gate URL was asked %d times (%v), want once, before wave 2", len(hits), uris)
		}
		if canary := v.Progress["h1"]; canary == nil || hits[0].Before(canary.HealthyAt) {
			t.Errorf("the gate was asked at %v, before the canary was healthy (%+v)", hits[0], canary)
		}
		e.admittedAfter(t, id, 1, hits[0], "h2", "h3")
		if v.Record.Gated != 1 || v.Count(rollout.HostHealthy) != 3 {
			t.Errorf("gated %d, %d healthy", v.Record.Gated, v.Count(rollout.HostHealthy))
		}
		if out, _, _ := e.run(t, "rollout", "status", id); !strings.Contains(out, "strategy: --canary 1 --gate-url "+g.URL+"/ready\n") {
			t.Errorf("rollout status does not show the gate URL:\n%s", out)
		}
	})
	t.Run("503", func(t *testing.T) {
		t.Parallel()
		g := newGateServer(t, http.StatusServiceUnavailable, "not yet")
		e, id := start(t, g)
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
		v = e.summarized(t, id, func(v rollout.View) bool { return v.Phase().State == rollout.Done })
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
	v = e.summarized(t, id, func(v rollout.View) bool { return v.Phase().State == rollout.Done })
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
