package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/rollout"
)

// The rollout CLI against a real etcd, with no agent: the hosts are
// member records, the group's coordinator is the real one
// (rollout.Coordinator, joined as the first host), and each host's part
// (its progress, once admitted) is written by the test (simAgents).

// rolloutEnv is an etcd whose group "web" has the given members (member
// records: known, not live, but the first, whose session coordinates the
// group), and a directory for unit files.
type rolloutEnv struct {
	*garbageEnv
	dir string
}

func newRolloutEnv(t *testing.T, hosts ...string) *rolloutEnv {
	t.Helper()
	e := registrytest.StartEtcd(t)
	reg := registrytest.NewClient(t, e.Endpoint())
	raw := registrytest.RawClient(t, e.Endpoint())
	env := &rolloutEnv{garbageEnv: &garbageEnv{endpoint: e.Endpoint(), reg: reg, raw: raw}, dir: t.TempDir()}
	for _, h := range hosts {
		env.member(t, h, "web")
	}
	env.member(t, "other1", "db") // not in the group: never in its rollouts
	if len(hosts) > 0 {
		env.coordinate(t, hosts[0])
		env.stand(t, hosts[1:]...)
	}
	return env
}

// stand makes hosts up for the coordinator (rollout.GroupView.Live): a
// candidacy in the group's election each, as their agents' would be,
// younger than the coordinator's, so that it stays elected.
func (e *rolloutEnv) stand(t *testing.T, hosts ...string) {
	t.Helper()
	const election = "/agentd/rollouts/coordinator/web/"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := e.raw.Get(t.Context(), election, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the coordinator did not stand in 10s")
		}
	}
	for i, h := range hosts {
		e.put(t, fmt.Sprintf("%sffff%04x", election, i), h)
	}
}

// member writes host's member record, as its agent would.
func (e *rolloutEnv) member(t *testing.T, host string, groups ...string) {
	t.Helper()
	b, err := json.Marshal(registry.KnownHost{Member: reconcile.Member{Host: host, MachineID: "m-" + host, Groups: groups}, LastSeen: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	e.put(t, "/agentd/members/"+host, string(b))
}

// unit writes a unit file named name (in a directory of its own) and
// returns its path.
func (e *rolloutEnv) unit(t *testing.T, name, execStart string) string {
	t.Helper()
	sub, err := os.MkdirTemp(e.dir, "u")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(sub, name)
	if err := os.WriteFile(p, []byte("[Service]\nExecStart="+execStart+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// dump is every key of the registry with its value and revision, but
// those the group's coordinator writes on its own, whenever it looks
// (summaries, admissions, its election): what the CLI's writes change.
func (e *rolloutEnv) dump(t *testing.T) map[string]string {
	t.Helper()
	resp, err := e.raw.Get(t.Context(), "/agentd/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if strings.HasPrefix(k, "/agentd/rollouts/summary/") || strings.HasPrefix(k, "/agentd/rollouts/admit/") || strings.HasPrefix(k, "/agentd/rollouts/coordinator/") {
			continue
		}
		out[k] = fmt.Sprintf("%d %s", kv.ModRevision, kv.Value)
	}
	return out
}

func (e *rolloutEnv) view(t *testing.T, id string) rollout.View {
	t.Helper()
	v, err := e.reg.Rollout(t.Context(), id, true)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// progress writes host's progress in rollout id, as its agent would.
func (e *rolloutEnv) progress(ctx context.Context, id, host string, st rollout.HostState, reason string) error {
	p := rollout.Progress{State: st, Since: time.Now().UTC(), Reason: reason}
	if st == rollout.HostHealthy {
		p.HealthyAt = p.Since
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	_, err = e.raw.Put(ctx, "/agentd/rollouts/hosts/"+host+"/"+id, string(b))
	return err
}

// admitted says the coordinator admitted host to rollout id.
func (e *rolloutEnv) admitted(ctx context.Context, id, host string) (bool, error) {
	resp, err := e.raw.Get(ctx, "/agentd/rollouts/admit/web/"+host+"/"+id, clientv3.WithCountOnly())
	if err != nil {
		return false, err
	}
	return resp.Count > 0, nil
}

// coordinate runs the group's real coordinator (rollout.Coordinator) on
// a session joined as host coord, until the test ends.
func (e *rolloutEnv) coordinate(t *testing.T, coord string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := e.reg.Join(ctx, reconcile.Member{Host: coord, MachineID: "m-" + coord, Groups: []string{"web"}}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := rollout.NewCoordinator("web", slog.New(slog.NewTextHandler(t.Output(), nil)), sessionElector{func() *registry.Session { return s }}.elector)
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; _ = s.Close() })
}

// summarized waits until the group's coordinator has summarized rollout
// id so that ok holds (ok nil: any summary), and returns the view (read
// with every host's progress).
func (e *rolloutEnv) summarized(t *testing.T, id string, ok func(v rollout.View) bool) rollout.View {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := e.view(t, id)
		if v.Summary != nil && (ok == nil || ok(v)) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollout %s: the coordinator did not summarize it as expected in time; phase %+v, summary %+v", id, v.Phase(), v.Summary)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// admission is the coordinator's admission of host to rollout id (nil:
// none).
func (e *rolloutEnv) admission(t *testing.T, id, host string) *rollout.Admission {
	t.Helper()
	resp, err := e.raw.Get(t.Context(), "/agentd/rollouts/admit/web/"+host+"/"+id)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	var a rollout.Admission
	if err := json.Unmarshal(resp.Kvs[0].Value, &a); err != nil {
		t.Fatal(err)
	}
	return &a
}

var rolloutIDRe = regexp.MustCompile(`rollout (r[0-9]{8}-[0-9]{6}-[0-9a-f]{8}): `)

// rolloutID is the ID a put printed.
func rolloutID(t *testing.T, out string) string {
	t.Helper()
	m := rolloutIDRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no rollout ID in:\n%s", out)
	}
	return m[1]
}

// simStep is how often the stand-in agents move: longer than put
// --wait's poll and the coordinator's summary interval
// (rollout.SummaryEvery), so that it sees most states.
const simStep = 300 * time.Millisecond

// simAgents stands in for the group's agents (their participants) until
// ctx ends: each step (simStep) a host the coordinator admitted starts
// applying, an applying one ends healthy (or failed, when fail says so),
// and when the rollout reverts, the hosts that took it go back. The
// coordinator admits the hosts and ends the rollout.
func (e *rolloutEnv) simAgents(ctx context.Context, fail func(host string) bool) <-chan error {
	errc := make(chan error, 1)
	go func() {
		errc <- e.sim(ctx, fail)
	}()
	return errc
}

func (e *rolloutEnv) sim(ctx context.Context, fail func(host string) bool) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(simStep):
		}
		all, err := e.reg.Rollouts(ctx, "web", true)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, v := range all {
			r := v.Record
			if r.Overwritten(v.Entries) {
				continue
			}
			for _, h := range r.Hosts {
				st, _, _ := v.HostState(h)
				admitted, err := e.admitted(ctx, r.ID, h)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				var next rollout.HostState
				reason := ""
				switch {
				case r.Reverts() && (&rollout.Progress{State: st}).Took():
					next, reason = rollout.HostReverting, "the rollout "+string(r.End.State)
				case st == rollout.HostReverting:
					next = rollout.HostReverted
				case r.End != nil:
				case st == rollout.HostPending && admitted:
					next, reason = rollout.HostApplying, fmt.Sprintf("wave %d of %d", r.Wave(h)+1, len(r.WaveEnds))
				case st == rollout.HostApplying && fail != nil && fail(h):
					next, reason = rollout.HostFailed, "hello.service: exited 1"
				case st == rollout.HostApplying:
					next = rollout.HostHealthy
				}
				if next != "" {
					if err := e.progress(ctx, r.ID, h, next, reason); err != nil && ctx.Err() == nil {
						return err
					}
				}
			}
		}
	}
}

// Every bad strategy value is a usage error with a clear message, and
// nothing is stored: the same for put, rm and revert (one set of flags,
// one check).
func TestRolloutRefusesBadStrategy(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h1", "h2", "h3")
	v1, v2 := e.unit(t, "hello.service", "/bin/true"), e.unit(t, "hello.service", "/bin/sleep 1")
	for _, tg := range []string{"web", "empty"} { // group empty: a history, no host
		for _, file := range []string{v1, v2} {
			if _, _, code := e.run(t, "unit", "put", file, "--group", tg); code != 0 {
				t.Fatalf("put to %s: exit %d", tg, code)
			}
		}
	}
	before := e.dump(t)
	v3 := e.unit(t, "hello.service", "/bin/false")
	commands := map[string][]string{
		"unit put":    {"unit", "put", v3},
		"unit rm":     {"unit", "rm", "hello.service"},
		"unit revert": {"unit", "revert", "hello.service"},
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--canary", "0"}, exitUsage, `--canary "0": want at least 1 host`},
		{[]string{"--canary", "150%"}, exitUsage, "a percentage is at most 100%"},
		{[]string{"--canary", "one"}, exitUsage, `--canary "one": want a number of hosts`},
		{[]string{"--waves", "50%,10%"}, exitUsage, "each must be larger than the one before"},
		{[]string{"--waves", "1,,100%"}, exitUsage, `--waves ""`},
		{[]string{"--max-unavailable", "0"}, exitUsage, `--max-unavailable "0"`},
		{[]string{"--max-unavailable", "150%"}, exitUsage, "at most 100%"},
		{[]string{"--soak", "-1s"}, exitUsage, "--soak -1s: want a duration of 0 or more"},
		{[]string{"--soak", "abc"}, exitUsage, `invalid argument "abc" for "--soak"`},
		{[]string{"--progress-deadline", "-5s"}, exitUsage, "--progress-deadline -5s"},
		{[]string{"--progress-deadline", "10s", "--soak", "30s"}, exitUsage, "is not longer than --soak"},
		{[]string{"--pause-after-canary"}, exitUsage, "--pause-after-canary needs --canary"},
		{[]string{"--max-restarts", "-2"}, exitUsage, "--max-restarts -2: want 0 or more"},
		{[]string{"--gate-cmd", "true"}, exitUsage, "--gate-cmd is run by this command while it follows the rollout: add --wait"},
		{[]string{"--gate-cmd", " ", "--wait"}, exitUsage, "--gate-cmd: an empty command"},
		{[]string{"--supersede"}, exitUsage, "--supersede goes with a rollout"},
		{[]string{"--canary", "1", "--reason", "two\nlines"}, exitUsage, "--reason: invalid: reason has a control character (U+000A)"},
		{[]string{"--canary", "1", "--wait", "--skip-unreachable"}, exitUsage, "--skip-unreachable does not apply to a rollout"},
		// To one host, or to a group no host has joined.
		{[]string{"--host", "h1", "--canary", "1"}, exitUsage, "hosts/h1 is one host"},
		{[]string{"--group", "empty", "--canary", "1"}, exitError, "no host has joined group empty"},
	} {
		for name, cmd := range commands {
			args := append(slices.Clone(cmd), c.args...)
			if !slices.Contains(c.args, "--host") && !slices.Contains(c.args, "--group") {
				args = append(args, "--group", "web")
			}
			_, stderr, code := e.run(t, args...)
			if code != c.code || !strings.Contains(stderr, c.want) {
				t.Errorf("%s %s: exit %d, want %d with %q; stderr:\n%s", name, strings.Join(c.args, " "), code, c.code, c.want, stderr)
			}
			// Said by the command, and what it did not write (but for
			// the flag parser's own words).
			nothing := "nothing stored"
			if name == "unit rm" && !strings.Contains(c.want, "--reason") {
				nothing = "nothing removed"
			}
			if !strings.Contains(c.want, "invalid argument") && (!strings.Contains(stderr, "error: "+name+": ") || !strings.Contains(stderr, nothing)) {
				t.Errorf("%s %s: stderr does not start with %q or lacks %q:\n%s", name, strings.Join(c.args, " "), name+": ", nothing, stderr)
			}
		}
	}
	if after := e.dump(t); !maps.Equal(before, after) {
		t.Errorf("refused writes changed the registry:\nbefore %v\nafter  %v", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
	}
}

// A rollout records the group's members by name, its waves, what each
// key held before, who started it and why; a second rollout of the same
// key is refused while it runs, and --supersede ends it.
func TestRolloutPutRecordsAndSupersedes(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h3", "h1", "h5", "h2", "h4")
	v1 := e.unit(t, "hello.service", "/bin/true")
	if _, _, code := e.run(t, "unit", "put", v1, "--group", "web"); code != 0 {
		t.Fatalf("first put: exit %d", code)
	}
	v2 := e.unit(t, "hello.service", "/bin/sleep 1")
	fresh := e.unit(t, "fresh.service", "/bin/sleep 2")
	out, stderr, code := e.run(t, "unit", "put", v2, fresh, "--group", "web", "--canary", "1", "--waves", "50%,100%", "--soak", "30s",
		"--auto-revert", "--reason", "new TLS config")
	if code != 0 {
		t.Fatalf("rollout put: exit %d", code)
	}
	id := rolloutID(t, out)
	if want := "rollout " + id + ": 5 hosts in waves 1, 3, 5; follow it with agentd rollout status " + id + " --watch"; !strings.Contains(out, want) {
		t.Errorf("put output lacks %q:\n%s", want, out)
	}
	// h3's agent is live (it coordinates the group): the others are
	// member records only.
	if !strings.Contains(stderr, "warning: h1, h2, h4, h5 of group web have no live agent: the rollout waits for them in their wave\n") {
		t.Errorf("no warning about the members without a live agent:\n%s", stderr)
	}
	v := e.view(t, id)
	r := v.Record
	if !slices.Equal(r.Hosts, []string{"h1", "h2", "h3", "h4", "h5"}) || !slices.Equal(r.WaveEnds, []int{1, 3, 5}) || r.Group != "web" {
		t.Errorf("hosts %v, waves %v, group %s", r.Hosts, r.WaveEnds, r.Group)
	}
	content := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
	if u := r.Units["hello.service"]; u.From == nil || *u.From != content(v1) || u.ToHash != reconcile.Hash([]byte(content(v2))) || u.FromRevision == 0 {
		t.Errorf("hello.service in the rollout: %+v", u)
	}
	if u, ok := r.Units["fresh.service"]; !ok || u.From != nil || u.ToHash != reconcile.Hash([]byte(content(fresh))) {
		t.Errorf("fresh.service in the rollout: %+v", u)
	}
	s := r.Strategy
	if s.Canary != (rollout.Count{N: 1}) || len(s.Waves) != 2 || s.Waves[0] != (rollout.Count{N: 50, Percent: true}) || s.Soak != 30*time.Second ||
		!s.AutoRevert || s.MaxRestarts != -1 || s.PauseAfterCanary || s.GateCmd != "" {
		t.Errorf("strategy %+v", s)
	}
	if r.By != storedBy() || r.Reason != "new TLS config" || r.CreatedAt.IsZero() || r.End != nil {
		t.Errorf("by %q, reason %q, created %v, end %v", r.By, r.Reason, r.CreatedAt, r.End)
	}
	if b, err := e.reg.Get(t.Context(), registry.Target{Group: "web"}, "hello.service"); err != nil || string(b) != content(v2) {
		t.Errorf("the key holds %q (%v), want the new content", b, err)
	}

	// The same key again, while it runs: refused, nothing stored.
	before := e.dump(t)
	v3 := e.unit(t, "hello.service", "/bin/sleep 3")
	if _, stderr, code := e.run(t, "unit", "put", v3, "--group", "web", "--canary", "1"); code != exitError ||
		!strings.Contains(stderr, "a rollout of these keys is running: "+id+" (hello.service)") || !strings.Contains(stderr, "--supersede") {
		t.Errorf("second rollout of the key: exit %d\n%s", code, stderr)
	}
	if after := e.dump(t); !maps.Equal(before, after) {
		t.Error("the refused rollout changed the registry")
	}
	// Superseded, and said so.
	e.member(t, "h6", "web") // joined since: in the new rollout only
	out, _, code = e.run(t, "unit", "put", v3, "--group", "web", "--waves", "2,100%", "--supersede")
	if code != 0 || !strings.Contains(out, "rollout "+id+": superseded by ") {
		t.Fatalf("--supersede: exit %d\n%s", code, out)
	}
	var id2 string
	for _, m := range rolloutIDRe.FindAllStringSubmatch(out, -1) {
		if m[1] != id {
			id2 = m[1]
		}
	}
	if old := e.view(t, id).Record; old.End == nil || old.End.State != rollout.Superseded || old.End.Reason != "superseded by "+id2 {
		t.Errorf("the first rollout's end: %+v", old.End)
	}
	if nr := e.view(t, id2).Record; len(nr.Hosts) != 6 || !slices.Equal(nr.WaveEnds, []int{2, 6}) || *nr.Units["hello.service"].From != content(v2) {
		t.Errorf("the second rollout: hosts %v waves %v", nr.Hosts, nr.WaveEnds)
	}

	// ls: both, newest first; status: the header, the counters, and the
	// hosts one by one when asked.
	e.summarized(t, id2, func(v rollout.View) bool { return v.Phase().State == rollout.Running })
	out, _, code = e.run(t, "rollout", "ls")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") ||
		!regexp.MustCompile(`^`+id2+`\s+web\s+hello.service\s+running\s+1/2\s+0/6\s+\d+ s\s+\S+@`).MatchString(lines[1]) ||
		!regexp.MustCompile(`^`+id+`\s+web\s+fresh.service,hello.service\s+superseded\s+1/3\s+0/5\s`).MatchString(lines[2]) {
		t.Errorf("rollout ls: exit %d\n%s", code, out)
	}
	if out, _, code := e.run(t, "rollout", "ls", "--group", "db"); code != 0 || strings.Contains(out, id) {
		t.Errorf("rollout ls --group db: exit %d\n%s", code, out)
	}
	if err := e.progress(t.Context(), id2, "h1", rollout.HostHealthy, ""); err != nil {
		t.Fatal(err)
	}
	if err := e.progress(t.Context(), id2, "h2", rollout.HostSoaking, ""); err != nil {
		t.Fatal(err)
	}
	e.summarized(t, id2, func(v rollout.View) bool {
		return v.Count(rollout.HostHealthy) == 1 && v.Count(rollout.HostSoaking) == 1
	})
	out, _, code = e.run(t, "rollout", "status", id2)
	for _, want := range []string{
		"rollout " + id2 + " of group web: hello.service\n",
		"phase:    running, wave 1 of 2\n",
		"strategy: --waves 2,100%\n",
		"waves:    2, 6 of 6 hosts\n",
		"coordinator: h3\n",
		"[###-----------------] 16% 1 healthy · 1 soaking · 4 waiting\n",
		"(each host: agentd rollout status " + id2 + " --hosts all|failed|pending)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rollout status lacks %q", want)
		}
	}
	if code != 0 || strings.Contains(out, "HOST") || strings.Contains(out, "first offenders") {
		t.Errorf("rollout status: exit %d, or hosts listed one by one (or offenders) unasked", code)
	}
	hostRows := func(out string) []string {
		var hosts []string
		for _, m := range regexp.MustCompile(`(?m)^(h\d)\s+\d+\s+\S+`).FindAllStringSubmatch(out, -1) {
			hosts = append(hosts, m[1])
		}
		return hosts
	}
	out, _, code = e.run(t, "rollout", "status", id2, "--hosts", "all")
	for _, re := range []string{`(?m)^HOST\s+WAVE\s+STATE\s+FOR\s+REASON$`, `(?m)^h1\s+1\s+healthy\s+\d+ s\s+-$`, `(?m)^h2\s+1\s+soaking\s+\d+ s`, `(?m)^h6\s+2\s+pending\s+-\s+-$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("rollout status --hosts all does not match %s", re)
		}
	}
	if got := hostRows(out); code != 0 || !slices.Equal(got, []string{"h1", "h2", "h3", "h4", "h5", "h6"}) || strings.Contains(out, "(each host:") {
		t.Errorf("rollout status --hosts all: exit %d, hosts %v", code, got)
	}
	out, _, code = e.run(t, "rollout", "status", id2, "--hosts", "pending")
	if got := hostRows(out); code != 0 || !slices.Equal(got, []string{"h2", "h3", "h4", "h5", "h6"}) {
		t.Errorf("rollout status --hosts pending: exit %d, hosts %v", code, got)
	}
	out, _, code = e.run(t, "rollout", "status", id2, "--hosts", "failed")
	if got := hostRows(out); code != 0 || len(got) != 0 || !strings.Contains(out, "--hosts failed: no host\n") {
		t.Errorf("rollout status --hosts failed: exit %d, hosts %v", code, got)
	}
	if _, stderr, code := e.run(t, "rollout", "status", id2, "--hosts", "some"); code != exitUsage || !strings.Contains(stderr, `--hosts "some": want all, failed or pending`) {
		t.Errorf("rollout status --hosts some: exit %d\n%s", code, stderr)
	}
	// A put without a rollout over a running one: that one no longer
	// runs (superseded), and a new rollout of the key is not refused.
	if _, _, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/sleep 4"), "--group", "web"); code != 0 {
		t.Fatalf("plain put: exit %d", code)
	}
	if out, _, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/sleep 5"), "--group", "web", "--canary", "1"); code != 0 ||
		strings.Contains(out, "superseded by") {
		t.Errorf("rollout after a plain put over a running one: exit %d\n%s", code, out)
	}
	if out, _, _ := e.run(t, "rollout", "ls"); !regexp.MustCompile(id2 + `\s+web\s+hello.service\s+superseded\s`).MatchString(out) {
		t.Errorf("the rollout a plain put overwrote is not shown superseded:\n%s", out)
	}
	out, _, _ = e.run(t, "rollout", "status", id, "--json")
	var sum rolloutSummary
	if err := json.Unmarshal([]byte(out), &sum); err != nil || sum.Phase.State != rollout.Superseded || sum.Total != 5 || sum.Rollout.Reason != "new TLS config" ||
		sum.Counts[rollout.HostPending] != 5 || len(sum.Hosts) != 0 {
		t.Errorf("status --json: %v\n%s", err, out)
	}
	// Watching a superseded rollout: exit 5, as JSON lines too.
	if _, stderr, code := e.run(t, "rollout", "status", id, "--watch"); code != exitSuperseded || !strings.Contains(stderr, "rollout "+id+" superseded — superseded by "+id2+"\n") {
		t.Errorf("status --watch of a superseded rollout: exit %d\n%s", code, stderr)
	}
	out, _, code = e.run(t, "rollout", "status", id2, "--watch", "--json")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); code != exitSuperseded || err != nil || sum.Phase.State != rollout.Superseded ||
		sum.Phase.Reason != "its keys were written again since, without a rollout" {
		t.Errorf("status --watch --json of a superseded rollout: exit %d, %v\n%s", code, err, out)
	}
}

// pause, resume, promote and abort write the control fields, and refuse
// what does not apply with exit 1.
func TestRolloutControl(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h1", "h2", "h3")
	out, _, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web", "--canary", "1", "--pause-after-canary")
	if code != 0 {
		t.Fatalf("put: exit %d", code)
	}
	id := rolloutID(t, out)
	expect := func(args string, code int, want string) string {
		t.Helper()
		out, stderr, c := e.run(t, append(strings.Fields(args), id)...)
		if c != code || !strings.Contains(out+stderr, want) {
			t.Errorf("%s: exit %d, want %d with %q", args, c, code, want)
		}
		return out
	}
	e.summarized(t, id, func(v rollout.View) bool { return v.Phase().State == rollout.Running })
	expect("rollout promote", exitError, "is not paused (running, wave 1 of 2): nothing to promote")
	expect("rollout resume", exitError, "is not paused")
	expect("rollout pause --reason dashboards-red", 0, "rollout "+id+" paused at wave 1 of 2 (0 healthy · 3 waiting): no host starts taking it; `agentd rollout resume "+id+"` goes on")
	r := e.view(t, id).Record
	if !r.Paused || r.PauseReason != "paused by "+storedBy()+": dashboards-red" || r.PausedAt.IsZero() {
		t.Errorf("after pause: paused %v, reason %q, at %v", r.Paused, r.PauseReason, r.PausedAt)
	}
	expect("rollout pause", 0, "is already paused")
	expect("rollout status", 0, "phase:    paused, wave 1 of 2 — paused by ")
	expect("rollout resume", 0, "resumed")
	if r := e.view(t, id).Record; r.Paused || r.ResumedAt.IsZero() {
		t.Errorf("after resume: paused %v, resumed %v", r.Paused, r.ResumedAt)
	}
	// The canary is healthy: waiting for promote.
	if err := e.progress(t.Context(), id, "h1", rollout.HostHealthy, ""); err != nil {
		t.Fatal(err)
	}
	e.summarized(t, id, func(v rollout.View) bool { return v.Phase().State == rollout.WaitingPromote })
	expect("rollout status", 0, "phase:    waiting-promote, wave 2 of 2 — the canary is healthy: `agentd rollout promote "+id+"` sends the change on\n")
	if a := e.admission(t, id, "h1"); a == nil || a.Wave != 0 || a.By != "h1" {
		t.Errorf("the canary's admission: %+v", a)
	}
	for _, h := range []string{"h2", "h3"} {
		if a := e.admission(t, id, h); a != nil {
			t.Errorf("%s admitted before the promote: %+v", h, a)
		}
	}
	expect("rollout promote", 0, "promoted: wave 2 of 2 goes on")
	if r := e.view(t, id).Record; !r.Promoted || r.Paused {
		t.Errorf("after promote: promoted %v, paused %v", r.Promoted, r.Paused)
	}
	// The coordinator's own word (the summary), not View.Phase, which
	// reads the promote from the record at once, before any admission.
	e.summarized(t, id, func(v rollout.View) bool {
		return v.Summary.Phase.State == rollout.Running && v.Summary.Phase.Wave == 1 && v.Summary.Admitted == 3
	})
	for _, h := range []string{"h2", "h3"} {
		if a := e.admission(t, id, h); a == nil || a.Wave != 1 {
			t.Errorf("%s's admission after the promote: %+v", h, a)
		}
	}
	// Paused, promote goes on too.
	expect("rollout pause", 0, "paused")
	expect("rollout promote", 0, "promoted")
	expect("rollout abort --revert", 0, "aborted at wave 2 of 2: no host takes it any more; the hosts that took it go back to the previous version (h1)")
	r = e.view(t, id).Record
	if r.Abort == nil || !r.Abort.Revert || r.Abort.By != storedBy() || r.End == nil || r.End.State != rollout.Aborted || !strings.Contains(r.End.Reason, "aborted by ") {
		t.Errorf("after abort: abort %+v end %+v", r.Abort, r.End)
	}
	for _, verb := range []string{"abort", "pause", "resume", "promote"} {
		expect("rollout "+verb, exitError, "has ended (aborted — aborted by ")
	}
	// Watching it: h1 still holds the change, going back; then back.
	if err := e.progress(t.Context(), id, "h1", rollout.HostReverted, ""); err != nil {
		t.Fatal(err)
	}
	expect("rollout status --watch", exitFailed, "reverted to the previous version: h1")
	// An unknown rollout.
	for _, args := range [][]string{{"rollout", "status", "r-nope"}, {"rollout", "pause", "r-nope"}, {"rollout", "abort", "r-nope"}} {
		if _, stderr, code := e.run(t, args...); code != exitError || !strings.Contains(stderr, `no such rollout: "r-nope"`) {
			t.Errorf("%v: exit %d\n%s", args, code, stderr)
		}
	}
}

// counterLine is one line of counters put --wait printed.
type counterLine struct {
	state          string
	wave, waves    int
	counts         map[string]int // by word: healthy, applying, …, waiting
	holding, total int            // hosts that have or take the change; all
}

var counterLineRe = regexp.MustCompile(`(?m)^rollout (\S+): ([a-z-]+), wave (\d+) of (\d+)(?: — [^·\n]*)? · (.*)$`)

// counterLines are the lines of counters of rollout id in out, in order.
func counterLines(t *testing.T, out, id string) []counterLine {
	t.Helper()
	var lines []counterLine
	for _, m := range counterLineRe.FindAllStringSubmatch(out, -1) {
		if m[1] != id || strings.Contains(m[5], "no count yet") {
			continue
		}
		l := counterLine{state: m[2], counts: map[string]int{}}
		fmt.Sscan(m[3], &l.wave)
		fmt.Sscan(m[4], &l.waves)
		for part := range strings.SplitSeq(m[5], " · ") {
			var n int
			var word string
			if _, err := fmt.Sscanf(part, "%d %s", &n, &word); err != nil {
				t.Fatalf("counters %q: %v", m[5], err)
			}
			l.counts[word] = n
			l.total += n
			if word != "waiting" && word != "reverted" {
				l.holding += n
			}
		}
		lines = append(lines, l)
	}
	return lines
}

// put --wait follows a rollout to its end: 0 when every host is healthy,
// and only once they are; a line of counters whenever they move. The
// waves open in order, each once the one before is healthy (the
// coordinator's admissions say when).
func TestRolloutPutWaitDone(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h1", "h2", "h3", "h4")
	ctx, cancel := context.WithCancel(t.Context())
	sim := e.simAgents(ctx, nil)
	out, _, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web",
		"--canary", "1", "--waves", "50%,100%", "--wait", "--timeout", "30s")
	cancel()
	if err := <-sim; err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("put --wait: exit %d", code)
	}
	id := rolloutID(t, out)
	// 4 hosts: the canary (h1), 50% (h2), 100% (h3, h4). The lines in
	// between are what the polls saw of the coordinator's summary (at
	// most 4 a second): which ones varies.
	if !strings.Contains(out, "rollout "+id+": 4 hosts in waves 1, 2, 4;") || !strings.Contains(out, "rollout "+id+": running, wave 1 of 3 · 0 healthy · ") {
		t.Error("put --wait output lacks the rollout's waves, or its first wave running")
	}
	if !strings.HasSuffix(out, "rollout "+id+": done, wave 3 of 3 · 4 healthy\n") {
		t.Errorf("put --wait output does not end with the rollout done, every host healthy")
	}
	if strings.Contains(out, "(wave ") {
		t.Error("put --wait printed an offender, with none")
	}
	// Line by line: the counts add up, the waves go up one by one, and
	// no host but the canary took the change before it was healthy.
	lines := counterLines(t, out, id)
	if len(lines) < 3 {
		t.Errorf("%d lines of counters, want one at least per state seen", len(lines))
	}
	for i, l := range lines {
		if l.total != 4 || l.waves != 3 || (i > 0 && (l.wave < lines[i-1].wave || l.wave > lines[i-1].wave+1)) {
			t.Errorf("line %d of counters: %+v (after %+v)", i, l, lines[max(i-1, 0)])
		}
		if (l.holding > 1 || l.wave > 1) && l.counts["healthy"] == 0 {
			t.Errorf("line %d of counters: %+v: past the canary before it was healthy", i, l)
		}
		if l.wave == 3 && l.counts["healthy"] < 2 {
			t.Errorf("line %d of counters: %+v: wave 3 before wave 2 was healthy", i, l)
		}
	}
	// The admissions: each wave's hosts admitted in their wave, once the
	// hosts before them were healthy.
	v := e.view(t, id)
	if v.Count(rollout.HostHealthy) != 4 || v.Record.End == nil || v.Record.End.State != rollout.Done || v.Summary.Phase.State != rollout.Done {
		t.Errorf("healthy hosts: %v, end %+v, summary %+v", v.Count(rollout.HostHealthy), v.Record.End, v.Summary)
	}
	wave := map[string]int{"h1": 0, "h2": 1, "h3": 2, "h4": 2}
	for h, w := range wave {
		a := e.admission(t, id, h)
		if a == nil || a.Wave != w || a.By != "h1" {
			t.Errorf("%s's admission: %+v, want wave %d", h, a, w)
			continue
		}
		for before, bw := range wave {
			if bw < w && v.Progress[before].HealthyAt.After(a.At) {
				t.Errorf("%s admitted to wave %d at %v, before %s (wave %d) was healthy at %v", h, w+1, a.At, before, bw+1, v.Progress[before].HealthyAt)
			}
		}
	}
	if out, _, code := e.run(t, "rollout", "status", id, "--watch"); code != 0 || !strings.Contains(out, "phase:    done, wave 3 of 3\n") ||
		!strings.Contains(out, "[####################] 100% 4 healthy\n") {
		t.Errorf("status --watch of a rollout done: exit %d", code)
	}
	// The same as JSON lines, and a rollout with no agent times out.
	out, stderr, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/sleep 1"), "--group", "web",
		"--canary", "1", "--wait", "--timeout", "600ms", "--json")
	if code != exitTimeout || !strings.Contains(stderr, "is running, wave 1 of 2 (0 healthy · 4 waiting); it goes on without this command") {
		t.Errorf("put --wait with no agent: exit %d\n%s", code, stderr)
	}
	var last map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("--json line %q: %v", l, err)
		}
		if m["event"] == "rollout-phase" {
			last = m
		}
	}
	if last == nil || last["state"] != "running" || last["wave"] != 1.0 || last["waves"] != 2.0 || last["hosts"] != 4.0 ||
		!reflect.DeepEqual(last["counts"], map[string]any{"pending": 4.0}) {
		t.Errorf("the last rollout-phase event: %v", last)
	}
}

// put --wait on a rollout whose canary fails with --auto-revert: exit 3
// with the reason once the canary is back; the other hosts never took it.
func TestRolloutPutWaitFailedReverts(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h1", "h2", "h3")
	ctx, cancel := context.WithCancel(t.Context())
	sim := e.simAgents(ctx, func(h string) bool { return h == "h1" })
	out, stderr, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/false"), "--group", "web",
		"--canary", "1", "--auto-revert", "--wait", "--timeout", "30s")
	cancel()
	if err := <-sim; err != nil {
		t.Fatal(err)
	}
	id := rolloutID(t, out)
	if code != exitFailed || !strings.Contains(stderr, "rollout "+id+" failed — h1 failed the change: hello.service: exited 1; reverted to the previous version: h1") {
		t.Fatalf("put --wait on a failing canary: exit %d\n%s", code, stderr)
	}
	// The offender (while the summary names it: until it goes back) at
	// most once, by name; the last line the canary back.
	if n := strings.Count(out, "h1 (wave 1):"); n > 1 || (n == 1 && !strings.Contains(out, "h1 (wave 1): failed — hello.service: exited 1\n")) {
		t.Errorf("the offender said %d times, or not as it failed", n)
	}
	if !strings.HasSuffix(out, "rollout "+id+": failed, wave 1 of 2 — h1 failed the change: hello.service: exited 1 · 0 healthy · 1 reverted · 2 waiting\n") {
		t.Error("put --wait does not end with the canary reverted")
	}
	for i, l := range counterLines(t, out, id) {
		if l.holding > 1 || l.wave > 1 {
			t.Errorf("line %d of counters: %+v: past the canary", i, l)
		}
	}
	v := e.view(t, id)
	if v.Progress["h2"] != nil || v.Progress["h3"] != nil || e.admission(t, id, "h2") != nil || e.admission(t, id, "h3") != nil {
		t.Errorf("hosts outside the canary took the change: %v", v.Progress)
	}
	if p := v.Progress["h1"]; p == nil || p.State != rollout.HostReverted {
		t.Errorf("the canary: %+v, want reverted", p)
	}
	if v.Record.End == nil || v.Record.End.State != rollout.Failed {
		t.Errorf("end %+v", v.Record.End)
	}
}

// --gate-cmd runs between waves with the rollout and the wave in its
// environment: exit 0 opens the wave; else the rollout pauses, exit 3.
func TestRolloutGate(t *testing.T) {
	t.Parallel()
	t.Run("pass", func(t *testing.T) {
		t.Parallel()
		e := newRolloutEnv(t, "h1", "h2", "h3")
		log := filepath.Join(e.dir, "gate.log")
		ctx, cancel := context.WithCancel(t.Context())
		sim := e.simAgents(ctx, nil)
		out, _, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web", "--canary", "1",
			"--gate-cmd", `echo "$AGENTD_ROLLOUT $AGENTD_GROUP $AGENTD_WAVE" >> `+log, "--wait", "--timeout", "30s")
		cancel()
		if err := <-sim; err != nil {
			t.Fatal(err)
		}
		id := rolloutID(t, out)
		if code != 0 || !strings.Contains(out, "rollout "+id+": the gate passed: wave 2 opens") {
			t.Fatalf("gate passing: exit %d", code)
		}
		if b, _ := os.ReadFile(log); string(b) != id+" web 2\n" {
			t.Errorf("the gate ran with %q", b)
		}
		if r := e.view(t, id).Record; r.Gated != 1 {
			t.Errorf("gated %d, want 1", r.Gated)
		}
		// Wave 2 opened after the gate ran (once: the log's one line).
		fi, err := os.Stat(log)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range []string{"h2", "h3"} {
			if a := e.admission(t, id, h); a == nil || a.Wave != 1 || a.At.Before(fi.ModTime()) {
				t.Errorf("%s's admission %+v, the gate ran at %v", h, a, fi.ModTime())
			}
		}
		if !strings.HasSuffix(out, "rollout "+id+": done, wave 2 of 2 · 3 healthy\n") {
			t.Error("put --wait did not end with the rollout done")
		}
	})
	t.Run("fail", func(t *testing.T) {
		t.Parallel()
		e := newRolloutEnv(t, "h1", "h2", "h3")
		ctx, cancel := context.WithCancel(t.Context())
		sim := e.simAgents(ctx, nil)
		out, stderr, code := e.run(t, "unit", "put", e.unit(t, "hello.service", "/bin/true"), "--group", "web", "--canary", "1",
			"--gate-cmd", "echo error rate 7%; exit 7", "--wait", "--timeout", "30s")
		time.Sleep(150 * time.Millisecond) // the agents would go on now if they could
		cancel()
		if err := <-sim; err != nil {
			t.Fatal(err)
		}
		id := rolloutID(t, out)
		if code != exitFailed || !strings.Contains(stderr, "rollout "+id+" paused: the gate before wave 2 failed (exit status 7): error rate 7%") ||
			!strings.Contains(stderr, "agentd rollout promote "+id+"` opens wave 2 anyway") {
			t.Fatalf("gate failing: exit %d\n%s", code, stderr)
		}
		v := e.view(t, id)
		if !v.Record.Paused || !strings.Contains(v.Record.PauseReason, "error rate 7%") || v.Record.Gated != 0 {
			t.Errorf("paused %v (%q), gated %d", v.Record.Paused, v.Record.PauseReason, v.Record.Gated)
		}
		if v.Progress["h2"] != nil || v.Progress["h3"] != nil || e.admission(t, id, "h2") != nil || e.admission(t, id, "h3") != nil {
			t.Errorf("wave 2 started past a failed gate: %v", v.Progress)
		}
		if out, _, _ := e.run(t, "rollout", "status", id); !strings.Contains(out, "phase:    paused, wave 2 of 2 — the gate before wave 2 failed (exit status 7): error rate 7%\n") {
			t.Error("rollout status does not say the failed gate paused it")
		}
		// promote opens the wave without the gate.
		if _, _, code := e.run(t, "rollout", "promote", id); code != 0 {
			t.Fatalf("promote: exit %d", code)
		}
		if r := e.view(t, id).Record; r.Paused || r.Gated != 1 {
			t.Errorf("after promote: paused %v, gated %d", r.Paused, r.Gated)
		}
		// The coordinator's own word (the summary), not View.Phase, which
		// reads the promote from the record at once, before any admission.
		e.summarized(t, id, func(v rollout.View) bool {
			return v.Summary.Phase.State == rollout.Running && v.Summary.Phase.Wave == 1 && v.Summary.Admitted == 3
		})
		for _, h := range []string{"h2", "h3"} {
			if a := e.admission(t, id, h); a == nil || a.Wave != 1 {
				t.Errorf("%s's admission after the promote: %+v", h, a)
			}
		}
	})
}
