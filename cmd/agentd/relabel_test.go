package main

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// Issue 38: "a host whose labels change joins or leaves the target's units
// as a change of its own" — through its labels file, with no restart of
// its agent. A host relabelled into a selector takes its unit, one
// relabelled out drops it, a bad labels file changes nothing, and the CLI
// (hosts, put --selector --wait) counts the hosts the agents joined.
func TestRelabelWithoutRestart(t *testing.T) {
	t.Parallel() // its own systemds and etcd: waits on them, not the CPU
	endpoint := registrytest.StartEtcd(t).Endpoint()
	reg := registrytest.NewClient(t, endpoint)
	ctx := t.Context()
	agents := map[string]*env{}
	files := map[string]string{}
	for _, a := range []struct{ host, file string }{
		{"h1", "# web-01\nenv=prod\n"},
		{"h2", "env=dev\n"},
	} {
		e := &env{t: t, h: systemdtest.Start(t), endpoint: endpoint, reg: reg, host: a.host, groups: []string{"all"}}
		dir := filepath.Join(e.h.Dir, "etc-agentd")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		files[a.host] = filepath.Join(dir, "labels")
		writeLabels(t, files[a.host], a.file)
		e.startAgentOn([]string{endpoint}, func(o *runOptions) {
			o.labels = []string{"rack=r1"}
			o.labelsFile = files[a.host]
		})
		agents[a.host] = e
	}
	// The agents' own sessions: a restart would join again, at a new
	// StartedAt; the test agents' exits are watched too.
	started := map[string]time.Time{}
	eventually(t, "both agents joined", func() bool {
		ms, err := reg.Members(ctx)
		for _, m := range ms {
			started[m.Host] = m.StartedAt
		}
		return err == nil && len(ms) == 2
	})
	sameAgents := func(step string) {
		t.Helper()
		ms, err := reg.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if !m.StartedAt.Equal(started[m.Host]) {
				t.Fatalf("%s: %s's agent joined again (started %s, was %s)", step, m.Host, m.StartedAt, started[m.Host])
			}
		}
		for h, a := range agents {
			select {
			case err := <-a.agent.done:
				t.Fatalf("%s: %s's agent exited: %v", step, h, err)
			default:
			}
		}
	}

	e := agents["h1"]
	unit := "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n" + fast
	path := e.writeUnit("app.service", unit)
	waited := func(out string) []string {
		hosts := map[string]bool{}
		for line := range strings.Lines(out) {
			var ev struct{ Event, Host string }
			if json.Unmarshal([]byte(line), &ev) == nil && ev.Event == "progress" {
				hosts[ev.Host] = true
			}
		}
		return slices.Sorted(maps.Keys(hosts))
	}
	out, code := e.cli("unit", "put", path, "--selector", "env=prod", "--wait", "--timeout", "60s", "--json")
	if code != 0 || !slices.Equal(waited(out), []string{"h1"}) {
		t.Fatalf("unit put --selector env=prod --wait: exit %d, waited for %v; want h1\n%s", code, waited(out), out)
	}
	group := registry.SelectorGroup(mustParse(t, "env=prod"))
	runs := func(h string) (uint32, bool) {
		_, onDisk := agents[h].readLocal("app.service")
		return agents[h].h.MainPID(t, "app.service"), onDisk
	}
	if pid, on := runs("h2"); pid != 0 || on {
		t.Fatalf("h2 (env=dev) runs app.service: MainPID %d, file %v", pid, on)
	}

	// h2 relabelled into env=prod the way editors save: a new file
	// renamed into place. It takes the unit; hosts and status show it.
	renameLabels(t, files["h2"], "env=prod\n")
	eventually(t, "h2 took app.service", func() bool {
		pid, on := runs("h2")
		return pid != 0 && on
	})
	eventually(t, "h2 reports app.service active", func() bool {
		s, _ := agents["h2"].status("app.service")
		return s.ActiveState == "active" && s.Hash == reconcile.Hash([]byte(unit))
	})
	eventually(t, "the CLI and the agents count h1 h2 in the selector", func() bool {
		c, a := selectorHosts(t, reg, group)
		return slices.Equal(c, []string{"h1", "h2"}) && slices.Equal(a, c)
	})
	if labels := hostLabels(t, e, "h2"); labels["env"] != "prod" || labels["rack"] != "r1" || labels["arch"] == "" {
		t.Errorf("agentd hosts shows h2's labels %v, want env=prod, rack=r1 and the facts", labels)
	}
	if out, code := e.cli("hosts", "--selector", "env=prod"); code != 0 || !strings.Contains(out, "h2") {
		t.Errorf("hosts --selector env=prod: exit %d, want h2 listed\n%s", code, out)
	}
	if out, _ := agents["h2"].cli("status", "--debug-socket", agents["h2"].agent.opts.debugSocket); !strings.Contains(out, "labels env=prod,rack=r1,") ||
		!strings.Contains(out, "(labels file "+files["h2"]+")") {
		t.Errorf("h2's agentd status does not show its new labels:\n%s", out)
	}
	sameAgents("h2 relabelled into env=prod")

	// h1 relabelled out, the file written in place: it drops the unit
	// as for a removed key (stopped, file gone).
	h1pid, _ := runs("h1")
	writeLabels(t, files["h1"], "env=staging\n")
	eventually(t, "h1 dropped app.service", func() bool {
		pid, on := runs("h1")
		return pid == 0 && !on
	})
	if st := agents["h1"].h.Prop(t, "app.service", "ActiveState"); st != "inactive" {
		t.Errorf("h1's app.service is %v after leaving the selector, want inactive", st)
	}
	if _, err := os.Stat("/proc/" + itoa(h1pid)); err == nil {
		t.Errorf("h1's app.service process %d still runs", h1pid)
	}
	eventually(t, "h1's status of app.service is gone", func() bool {
		_, ok := agents["h1"].status("app.service")
		return !ok
	})
	eventually(t, "the CLI and the agents count h2 alone", func() bool {
		c, a := selectorHosts(t, reg, group)
		return slices.Equal(c, []string{"h2"}) && slices.Equal(a, c)
	})
	sameAgents("h1 relabelled out of env=prod")

	// A put to the selector after the relabels waits for h2 alone.
	v2 := strings.Replace(unit, "1000", "1001", 1)
	out, code = e.cli("unit", "put", e.writeUnit("app.service", v2), "--selector", "env=prod", "--wait", "--timeout", "60s", "--json")
	if code != 0 || !slices.Equal(waited(out), []string{"h2"}) {
		t.Fatalf("unit put --selector env=prod --wait after the relabels: exit %d, waited for %v; want h2\n%s", code, waited(out), out)
	}
	h2pid, _ := runs("h2")

	// A bad labels file (line 2) is refused whole: h2 keeps its labels and
	// the unit, and says why in agentd status; so is a key --label gives.
	for _, bad := range []struct{ file, why string }{
		{"env=dev\nthis line is bad\n", files["h2"] + `:2: "this line is bad": want KEY=VALUE`},
		{"env=dev\nrack=r9\n", "label rack is given both with --label (rack=r1) and in " + files["h2"] + " (rack=r9)"},
	} {
		writeLabels(t, files["h2"], bad.file)
		sock := agents["h2"].agent.opts.debugSocket
		eventually(t, "h2's status says the labels file is refused", func() bool {
			out, _ := agents["h2"].cli("status", "--debug-socket", sock)
			return strings.Contains(out, "labels file refused, the labels above are those from before its change: "+bad.why) &&
				strings.Contains(out, "labels env=prod,rack=r1,")
		})
		time.Sleep(time.Second) // a wrong relabel would have acted by now
		if pid, on := runs("h2"); pid != h2pid || !on {
			t.Fatalf("after a refused labels file h2 runs app.service as MainPID %d (file %v), want %d", pid, on, h2pid)
		}
		if labels := hostLabels(t, e, "h2"); labels["env"] != "prod" {
			t.Fatalf("after a refused labels file agentd hosts shows h2's labels %v", labels)
		}
	}
	sameAgents("h2's labels file refused")

	// Fixed: the refusal ends, h2 leaves the selector.
	writeLabels(t, files["h2"], "env=dev\n")
	eventually(t, "h2 dropped app.service", func() bool {
		pid, on := runs("h2")
		return pid == 0 && !on
	})
	if out, _ := agents["h2"].cli("status", "--debug-socket", agents["h2"].agent.opts.debugSocket); strings.Contains(out, "refused") ||
		!strings.Contains(out, "labels env=dev,rack=r1,") {
		t.Errorf("h2's agentd status after the fix:\n%s", out)
	}
	sameAgents("h2 relabelled out")
}

// writeLabels writes a labels file in place (0644).
func writeLabels(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil { // whatever the umask
		t.Fatal(err)
	}
}

// renameLabels replaces a labels file as editors save: a new file renamed
// over it.
func renameLabels(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".labels.new")
	writeLabels(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// hostLabels are host's labels as `agentd hosts --json` shows them.
func hostLabels(t *testing.T, e *env, host string) map[string]string {
	t.Helper()
	out, code := e.cli("hosts", "--json")
	var rows []hostRow
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil {
		t.Fatalf("hosts --json: exit %d\n%s", code, out)
	}
	for _, r := range rows {
		if r.Host == host {
			return r.Labels
		}
	}
	t.Fatalf("hosts --json does not list %s:\n%s", host, out)
	return nil
}
