package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

const (
	pvBase     = "[Unit]\nDescription=app\n[Service]\nType=exec\nExecStart=/bin/sleep 1001\n"
	pvReload   = "[Unit]\nDescription=app\n[Service]\nType=exec\nExecStart=/bin/sleep 1001\nExecReload=/bin/true\n"
	pvTemplate = "[Service]\nType=exec\nExecStart=/bin/sleep 10%i\n"
)

func running(unit, content string) reconcile.Status {
	h := reconcile.Hash([]byte(content))
	return reconcile.Status{Unit: unit, Hash: h, DesiredHash: h, LoadState: "loaded", ActiveState: "active", SubState: "running", Action: "start", Result: "done"}
}

func hostKey(unit, content string) reconcile.Entry {
	return reconcile.Entry{Scope: reconcile.ScopeHost, Unit: unit, Value: []byte(content)}
}

func groupKey(group, unit, content string) reconcile.Entry {
	return reconcile.Entry{Scope: reconcile.ScopeGroup, Group: group, Unit: unit, Value: []byte(content)}
}

// The prediction is the agent's own planner run on what the registry and
// the host's statuses say: one row per case of "How a change is applied".
func TestPredictTable(t *testing.T) {
	h1 := registry.Target{Host: "h1"}
	web := registry.Target{Group: "web"}
	failed := reconcile.Hash([]byte(pvBase + "[Service]\nEnvironment=A=2\n"))
	cases := []struct {
		name     string
		entries  []reconcile.Entry
		halts    []reconcile.Halt
		statuses []reconcile.Status
		tg       registry.Target
		put      map[string]string
		want     []string // "unit do", in order
		reason   string   // a substring of the first row's reason
	}{
		{name: "ExecStart changed: restart",
			entries: []reconcile.Entry{hostKey("app.service", pvBase)}, statuses: []reconcile.Status{running("app.service", pvBase)},
			tg: h1, put: map[string]string{"app.service": strings.Replace(pvBase, "1001", "1002", 1)},
			want: []string{"app.service restart"}, reason: "[Service] ExecStart changed"},
		{name: "Description changed: daemon-reload only",
			entries: []reconcile.Entry{hostKey("app.service", pvBase)}, statuses: []reconcile.Status{running("app.service", pvBase)},
			tg: h1, put: map[string]string{"app.service": strings.Replace(pvBase, "=app", "=the app", 1)},
			want: []string{"app.service daemon-reload only"}},
		{name: "only [Install]: daemon-reload only, re-enabled",
			entries: []reconcile.Entry{hostKey("app.service", pvBase)}, statuses: []reconcile.Status{running("app.service", pvBase)},
			tg: h1, put: map[string]string{"app.service": pvBase + "[Install]\nWantedBy=multi-user.target\n"},
			want: []string{"app.service daemon-reload only"}, reason: "re-enable"},
		{name: "ExecReload changed: reload",
			entries: []reconcile.Entry{hostKey("app.service", pvReload)}, statuses: []reconcile.Status{running("app.service", pvReload)},
			tg: h1, put: map[string]string{"app.service": strings.Replace(pvReload, "/bin/true", "/bin/kill -HUP $MAINPID", 1)},
			want: []string{"app.service reload"}},
		{name: "ExecReload added: daemon-reload only",
			entries: []reconcile.Entry{hostKey("app.service", pvBase)}, statuses: []reconcile.Status{running("app.service", pvBase)},
			tg: h1, put: map[string]string{"app.service": pvReload},
			want: []string{"app.service daemon-reload only"}},
		{name: "new unit: start",
			tg: h1, put: map[string]string{"app.service": pvBase},
			want: []string{"app.service start"}},
		{name: "stopped unit changed: start",
			entries: []reconcile.Entry{hostKey("app.service", pvBase)},
			statuses: []reconcile.Status{func() reconcile.Status {
				s := running("app.service", pvBase)
				s.ActiveState, s.SubState = "inactive", "dead"
				return s
			}()},
			tg: h1, put: map[string]string{"app.service": strings.Replace(pvBase, "1001", "1002", 1)},
			want: []string{"app.service start"}},
		{name: "same bytes: nothing",
			entries: []reconcile.Entry{hostKey("app.service", pvBase)}, statuses: []reconcile.Status{running("app.service", pvBase)},
			tg: h1, put: map[string]string{"app.service": pvBase},
			want: []string{"app.service nothing"}, reason: "content unchanged"},
		{name: "OnChange=stop-start",
			entries:  []reconcile.Entry{hostKey("app.service", pvBase+"[X-Agentd]\nOnChange=stop-start\n")},
			statuses: []reconcile.Status{running("app.service", pvBase+"[X-Agentd]\nOnChange=stop-start\n")},
			tg:       h1, put: map[string]string{"app.service": strings.Replace(pvBase, "1001", "1002", 1) + "[X-Agentd]\nOnChange=stop-start\n"},
			want: []string{"app.service stop-start"}},
		{name: "OnChange=reload without ExecReload: blocked",
			entries: []reconcile.Entry{hostKey("app.service", pvBase)}, statuses: []reconcile.Status{running("app.service", pvBase)},
			tg: h1, put: map[string]string{"app.service": strings.Replace(pvBase, "1001", "1002", 1) + "[X-Agentd]\nOnChange=reload\n"},
			want: []string{"app.service blocked"}, reason: "cannot reload"},
		{name: "OnChange=none: daemon-reload only, restart pending",
			entries: []reconcile.Entry{hostKey("app.service", pvBase)}, statuses: []reconcile.Status{running("app.service", pvBase)},
			tg: h1, put: map[string]string{"app.service": strings.Replace(pvBase, "1001", "1002", 1) + "[X-Agentd]\nOnChange=none\n"},
			want: []string{"app.service daemon-reload only"}, reason: "restart pending"},
		{name: "a drop-in: restart",
			entries: []reconcile.Entry{hostKey("app.service", pvBase)}, statuses: []reconcile.Status{running("app.service", pvBase)},
			tg: h1, put: map[string]string{"app.service.d/env.conf": "[Service]\nEnvironment=A=1\n"},
			want: []string{"app.service restart"}, reason: "Environment"},
		{name: "group: putting the halted version again is held",
			entries: []reconcile.Entry{groupKey("web", "app.service", pvBase)}, statuses: []reconcile.Status{running("app.service", pvBase)},
			halts: []reconcile.Halt{{Scope: "groups/web", Unit: "app.service", Hash: failed, Host: "h2", Reason: "exit-code"}},
			tg:    web, put: map[string]string{"app.service": pvBase + "[Service]\nEnvironment=A=2\n"},
			want: []string{"app.service held"}, reason: "h2 failed it"},
		{name: "group: new content clears the halt",
			entries: []reconcile.Entry{groupKey("web", "app.service", pvBase)}, statuses: []reconcile.Status{running("app.service", pvBase)},
			halts: []reconcile.Halt{{Scope: "groups/web", Unit: "app.service", Hash: failed, Host: "h2", Reason: "exit-code"}},
			tg:    web, put: map[string]string{"app.service": pvBase + "[Service]\nEnvironment=A=3\n"},
			want: []string{"app.service restart"}},
		{name: "group: a host key overrides",
			entries:  []reconcile.Entry{hostKey("app.service", pvBase), groupKey("web", "app.service", pvBase)},
			statuses: []reconcile.Status{running("app.service", pvBase)},
			tg:       web, put: map[string]string{"app.service": strings.Replace(pvBase, "1001", "1002", 1)},
			want: []string{"app.service nothing"}, reason: "overrides the group's"},
		{name: "group: two groups disagree: blocked",
			entries:  []reconcile.Entry{groupKey("db", "app.service", pvBase), groupKey("web", "app.service", pvBase)},
			statuses: []reconcile.Status{running("app.service", pvBase)},
			tg:       web, put: map[string]string{"app.service": strings.Replace(pvBase, "1001", "1002", 1)},
			want: []string{"app.service blocked"}, reason: "conflict"},
		{name: "MaxUnavailable: restart after a slot",
			entries:  []reconcile.Entry{groupKey("web", "app.service", pvBase+"[X-Agentd]\nMaxUnavailable=1\n")},
			statuses: []reconcile.Status{running("app.service", pvBase+"[X-Agentd]\nMaxUnavailable=1\n")},
			tg:       web, put: map[string]string{"app.service": strings.Replace(pvBase, "1001", "1002", 1) + "[X-Agentd]\nMaxUnavailable=1\n"},
			want: []string{"app.service restart"}, reason: "MaxUnavailable=1 in groups/web"},
		{name: "a socket: restart",
			entries:  []reconcile.Entry{hostKey("app.socket", "[Socket]\nListenStream=/run/a.sock\n")},
			statuses: []reconcile.Status{running("app.socket", "[Socket]\nListenStream=/run/a.sock\n")},
			tg:       h1, put: map[string]string{"app.socket": "[Socket]\nListenStream=/run/b.sock\n"},
			want: []string{"app.socket restart"}, reason: "stop the socket and its service"},
		{name: "template: instances restart one at a time, a stopped one is started",
			entries: []reconcile.Entry{hostKey("w@.service", pvTemplate), hostKey("w@1.service", ""), hostKey("w@2.service", ""), hostKey("w@3.service", "")},
			statuses: []reconcile.Status{running("w@1.service", ""), running("w@2.service", ""), func() reconcile.Status {
				s := running("w@3.service", "")
				s.ActiveState, s.SubState = "inactive", "dead"
				return s
			}()},
			tg: h1, put: map[string]string{"w@.service": strings.Replace(pvTemplate, "10%i", "20%i", 1)},
			want: []string{"w@.service daemon-reload only", "w@1.service restart", "w@2.service restart", "w@3.service start"}},
		{name: "a new instance: start",
			entries: []reconcile.Entry{hostKey("w@.service", pvTemplate)},
			tg:      h1, put: map[string]string{"w@1.service": ""},
			want: []string{"w@1.service start"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := hostView{Host: "h1", Snapshot: reconcile.Snapshot{Revision: 10, Entries: c.entries, Halts: c.halts}, Statuses: map[string]reconcile.Status{}}
			for _, s := range c.statuses {
				v.Statuses[s.Unit] = s
			}
			put := map[string][]byte{}
			for k, s := range c.put {
				put[k] = []byte(s)
			}
			ps := predict(v, c.tg, put)
			var got []string
			for _, p := range ps {
				got = append(got, p.Unit+" "+p.Do)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("predicted %q, want %q\n%+v", got, c.want, ps)
			}
			if c.reason != "" && !strings.Contains(ps[0].Reason, c.reason) {
				t.Fatalf("reason %q does not say %q", ps[0].Reason, c.reason)
			}
		})
	}
}

// The instances of a template are told apart: the second restarts after the first.
func TestPredictTemplateOrder(t *testing.T) {
	v := hostView{Host: "h1", Snapshot: reconcile.Snapshot{Entries: []reconcile.Entry{hostKey("w@.service", pvTemplate), hostKey("w@1.service", ""), hostKey("w@2.service", "")}},
		Statuses: map[string]reconcile.Status{"w@1.service": running("w@1.service", ""), "w@2.service": running("w@2.service", "")}}
	ps := predict(v, registry.Target{Host: "h1"}, map[string][]byte{"w@.service": []byte(pvTemplate + "Environment=X=1\n")})
	if len(ps) != 3 || !strings.Contains(ps[1].Reason, "instance 1 of 2") || !strings.Contains(ps[2].Reason, "instance 2 of 2") {
		t.Fatalf("%+v", ps)
	}
}

// registryState is every unit key with its ModRevision and value, and the halts.
func registryState(t *testing.T, reg *registry.Client) string {
	t.Helper()
	ls, err := reg.List(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, l := range ls {
		fmt.Fprintf(&b, "%s %d %q\n", l.Key, l.ModRevision, l.Value)
	}
	return b.String()
}

// put --dry-run against a running agent: restart, daemon-reload only,
// reload and start predicted from its status, nothing stored.
func TestPutDryRunPredicts(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)
	e.put("rl.service", pvReload+fast)
	before := registryState(t, e.reg)

	cases := []struct{ file, content, want string }{
		{"hello.service", helloV2, "restart"},
		{"hello.service", strings.Replace(helloV1, "Description=hello", "Description=hello world", 1), "daemon-reload only"},
		{"rl.service", strings.Replace(pvReload, "/bin/true", "/bin/kill -HUP $MAINPID", 1) + fast, "reload"},
		{"new.service", helloV1, "start"},
		{"hello.service", helloV1, "nothing"},
	}
	for _, c := range cases {
		out, code := e.cli("unit", "put", e.writeUnit(c.file, c.content), "--host", "h1", "--dry-run", "--json")
		if code != 0 {
			t.Fatalf("dry-run %s: exit %d\n%s", c.file, code, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], `"host":"h1"`) || !strings.Contains(lines[0], `"unit":"`+c.file+`"`) || !strings.Contains(lines[0], `"do":"`+c.want+`"`) {
			t.Fatalf("dry-run %s: want %q, got\n%s", c.file, c.want, out)
		}
	}
	out, code := e.cli("unit", "put", e.writeUnit("hello.service", helloV2), "--host", "h1", "--dry-run")
	if code != 0 || !strings.Contains(out, "restart") || !strings.Contains(out, "nothing stored") {
		t.Fatalf("dry-run text: %d\n%s", code, out)
	}
	out, code = e.cli("unit", "put", e.writeUnit("hello.service", helloV2), "--group", "all", "--dry-run", "--json")
	if code != 0 || !strings.Contains(out, `"host":"h1"`) || !strings.Contains(out, `"do":"nothing"`) || !strings.Contains(out, "overrides the group") {
		t.Fatalf("dry-run for the group (h1's own key overrides it): %d\n%s", code, out)
	}
	if out, code := e.cli("unit", "put", e.writeUnit("hello.service", helloV2), "--host", "h1", "--dry-run", "--wait"); code != exitUsage {
		t.Fatalf("--dry-run --wait: exit %d\n%s", code, out)
	}
	if out, _ := e.cli("unit", "put", e.writeUnit("hello.service", helloV2), "--group", "nobody", "--dry-run"); !strings.Contains(out, "no live agent") {
		t.Fatalf("empty group: %s", out)
	}
	if after := registryState(t, e.reg); after != before {
		t.Fatalf("dry-run stored something:\nbefore %s\nafter %s", before, after)
	}
}

// editorScript writes an executable shell script and returns it as $EDITOR.
func editorScript(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, fmt.Sprintf("editor-%d.sh", time.Now().UnixNano()))
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// unit edit, end to end: the editor's change is stored with --yes and the
// agent applies it; a failed editor, no change and an invalid result store
// nothing.
func TestUnitEdit(t *testing.T) {
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)
	pid1 := e.h.MainPID(t, "hello.service")

	t.Setenv("TMPDIR", t.TempDir()) // where refused edits are kept
	t.Setenv("VISUAL", "")
	t.Setenv("EDITOR", editorScript(t, e.h.Dir, `sed -i 's/sleep 1001/sleep 1002/' "$1"`))
	out, code := e.cli("unit", "edit", "hello.service", "--host", "h1", "--yes", "--timeout", "30s")
	if code != 0 {
		t.Fatalf("edit: exit %d\n%s\n%s", code, out, e.h.Log())
	}
	for _, want := range []string{"-ExecStart=/bin/sleep 1001", "+ExecStart=/bin/sleep 1002", "restart", "stored hosts/h1/units/hello.service", "healthy"} {
		if !strings.Contains(out, want) {
			t.Fatalf("edit output lacks %q:\n%s", want, out)
		}
	}
	if got, _ := e.reg.Get(context.Background(), registry.Target{Host: "h1"}, "hello.service"); string(got) != helloV2 {
		t.Fatalf("registry holds %q", got)
	}
	if got, _ := e.readLocal("hello.service"); got != helloV2 {
		t.Fatalf("disk holds %q", got)
	}
	if h, err := e.reg.History(context.Background(), registry.Target{Host: "h1"}, "hello.service"); err != nil || len(h.Versions) != 2 ||
		h.Versions[1].Hash != reconcile.Hash([]byte(helloV2)) || h.Versions[1].User == "" {
		t.Fatalf("the edit is not in the history: %+v %v", h.Versions, err)
	}
	if pid2 := e.h.MainPID(t, "hello.service"); pid2 == 0 || pid2 == pid1 {
		t.Fatalf("not restarted: %d → %d", pid1, pid2)
	}

	before := registryState(t, e.reg)
	// An editor that fails: exit 1, nothing stored.
	t.Setenv("EDITOR", editorScript(t, e.h.Dir, `sed -i 's/sleep 1002/sleep 1003/' "$1"; exit 3`))
	if out, code := e.cli("unit", "edit", "hello.service", "--host", "h1", "--yes"); code != exitError || !strings.Contains(out, "nothing stored") {
		t.Fatalf("failed editor: exit %d\n%s", code, out)
	}
	// No change: exit 0, nothing stored.
	t.Setenv("EDITOR", "true")
	if out, code := e.cli("unit", "edit", "hello.service", "--host", "h1", "--yes"); code != 0 || !strings.Contains(out, "no change; nothing stored") {
		t.Fatalf("unchanged: exit %d\n%s", code, out)
	}
	// A broken section header: refused (exit 2), nothing stored.
	t.Setenv("EDITOR", editorScript(t, e.h.Dir, `sed -i 's/^\[Service\]$/[Service/' "$1"`))
	if out, code := e.cli("unit", "edit", "hello.service", "--host", "h1", "--yes"); code != exitUsage || !strings.Contains(out, "invalid section header") || !strings.Contains(out, "nothing stored") {
		t.Fatalf("invalid: exit %d\n%s", code, out)
	}
	// An unknown policy key: refused.
	t.Setenv("EDITOR", editorScript(t, e.h.Dir, `printf '[X-Agentd]\nOnChnage=reload\n' >> "$1"`))
	if out, code := e.cli("unit", "edit", "hello.service", "--host", "h1", "--yes"); code != exitUsage || !strings.Contains(out, "unknown key OnChnage=") {
		t.Fatalf("bad policy: exit %d\n%s", code, out)
	}
	// Not confirmed (stdin is not a "y"): nothing stored.
	t.Setenv("EDITOR", editorScript(t, e.h.Dir, `sed -i 's/sleep 1002/sleep 1004/' "$1"`))
	if out, code := e.cli("unit", "edit", "hello.service", "--host", "h1"); code != exitError || !strings.Contains(out, "not confirmed") {
		t.Fatalf("unconfirmed: exit %d\n%s", code, out)
	}
	// A missing key.
	if out, code := e.cli("unit", "edit", "nope.service", "--host", "h1", "--yes"); code != exitError || !strings.Contains(out, "not in the registry") {
		t.Fatalf("missing: exit %d\n%s", code, out)
	}
	if after := registryState(t, e.reg); after != before {
		t.Fatalf("something was stored:\nbefore %s\nafter %s", before, after)
	}
}

// A put by someone else while the editor is open: the edit fails with a
// clear error and the other put's content stays.
func TestUnitEditConcurrentPut(t *testing.T) {
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)
	_, rev0, err := e.reg.GetRevision(context.Background(), registry.Target{Host: "h1"}, "hello.service")
	if err != nil {
		t.Fatal(err)
	}
	opened, proceed := filepath.Join(e.h.Dir, "opened"), filepath.Join(e.h.Dir, "proceed")
	t.Setenv("TMPDIR", t.TempDir())
	t.Setenv("VISUAL", "")
	t.Setenv("EDITOR", editorScript(t, e.h.Dir, fmt.Sprintf(`touch %s; while [ ! -e %s ]; do sleep 0.05; done; sed -i 's/sleep 1001/sleep 1009/' "$1"`, opened, proceed)))
	theirs := strings.Replace(helloV1, "1001", "1005", 1)
	errc := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, err := os.Stat(opened); err == nil {
				break
			}
			if time.Now().After(deadline) {
				errc <- errors.New("the editor never opened")
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		_, err := e.reg.Put(context.Background(), registry.Target{Host: "h1"}, map[string][]byte{"hello.service": []byte(theirs)})
		os.WriteFile(proceed, nil, 0o644)
		errc <- err
	}()
	out, code := e.cli("unit", "edit", "hello.service", "--host", "h1", "--yes", "--no-wait")
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if code != exitError || !strings.Contains(out, "changed by someone else since you opened it (revision "+fmt.Sprint(rev0)+" → ") || !strings.Contains(out, "nothing stored") {
		t.Fatalf("concurrent put: exit %d\n%s", code, out)
	}
	if got, _ := e.reg.Get(context.Background(), registry.Target{Host: "h1"}, "hello.service"); string(got) != theirs {
		t.Fatalf("registry holds %q, want the other put's content", got)
	}
}

// Trial case 3, on a real systemd and etcd: a hand-written hw.service is
// on the host. --dry-run predicts the refusal (from the facts the agent
// publishes); the put without --wait warns of it and the host refuses it;
// --dry-run of the same put afterwards still predicts the refusal, and the
// hand-written file is left as it was.
func TestDryRunPredictsTheRefusalOfAnUnmanagedFile(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	e.put("hello.service", helloV1)
	const hand = "[Service]\nType=exec\nExecStart=/bin/sleep 999\n"
	if err := os.WriteFile(filepath.Join(e.h.UnitDir, "hw.service"), []byte(hand), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	eventually(t, "h1 publishes hw.service among the files it did not write", func() bool {
		f, err := e.reg.Facts(ctx, "h1")
		return err == nil && f != nil && f.Unowned["hw.service"].Hash == reconcile.Hash([]byte(hand))
	})
	dryRun := func(when string) {
		t.Helper()
		out, code := e.cli("unit", "put", e.writeUnit("hw.service", helloV1), "--host", "h1", "--dry-run", "--json")
		if code != 0 || !strings.Contains(out, `"unit":"hw.service"`) || !strings.Contains(out, `"do":"blocked"`) ||
			!strings.Contains(out, "agentd did not write it") {
			t.Fatalf("%s: dry-run: exit %d, want a refusal\n%s", when, code, out)
		}
		out, code = e.cli("unit", "put", e.writeUnit("hw.service", helloV1), "--host", "h1", "--dry-run")
		if code != 0 || !strings.Contains(out, "blocked: unmanaged file: hw.service exists and agentd did not write it") {
			t.Fatalf("%s: dry-run text: exit %d\n%s", when, code, out)
		}
	}
	dryRun("before the put")

	out, code := e.cli("unit", "put", e.writeUnit("hw.service", helloV1), "--host", "h1")
	if code != 0 || !strings.Contains(out, "stored hosts/h1/units/hw.service") || !strings.Contains(out, "warning: h1 would refuse hw.service: unmanaged file") {
		t.Fatalf("put: exit %d, want it stored with a warning\n%s", code, out)
	}
	eventually(t, "h1 refuses hw.service", func() bool {
		s, ok := e.status("hw.service")
		return ok && s.Action == "blocked" && strings.Contains(s.Error, "unmanaged file")
	})
	dryRun("after the host refused it")
	if got, _ := e.readLocal("hw.service"); got != hand {
		t.Fatalf("hw.service on disk = %q, want the hand-written file", got)
	}
	// Moved away, the file is no longer a fact of the host, and the
	// preview says the put would start the unit.
	if err := os.Remove(filepath.Join(e.h.UnitDir, "hw.service")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "h1 installs hw.service once the file is gone", func() bool {
		s, ok := e.status("hw.service")
		return ok && s.Hash == reconcile.Hash([]byte(helloV1)) && s.ActiveState == "active"
	})
	eventually(t, "h1's facts no longer name hw.service", func() bool {
		f, err := e.reg.Facts(ctx, "h1")
		if err != nil || f == nil {
			return false
		}
		_, there := f.Unowned["hw.service"]
		return !there
	})
}
