package main

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/selector"
)

// Issue 38 item 2: a put to --selector reaches exactly the hosts whose
// labels match; the CLI's --wait counts the hosts the agents joined the
// selector's group with; a host relabelled (its agent restarted) takes or
// drops the unit; a bad selector stores nothing.
func TestSelectorTarget(t *testing.T) {
	t.Parallel() // its own systemds and etcd: waits on them, not the CPU
	endpoint := registrytest.StartEtcd(t).Endpoint()
	reg := registrytest.NewClient(t, endpoint)
	ctx := t.Context()
	agents := map[string]*env{}
	start := func(host string, labels ...string) {
		e := agents[host]
		if e == nil {
			e = &env{t: t, h: systemdtest.Start(t), endpoint: endpoint, reg: reg, host: host, groups: []string{"all"}, quiet: true}
			agents[host] = e
		} else {
			e.agent.stop(t)
		}
		e.startAgentOn([]string{endpoint}, func(o *runOptions) { o.labels = labels })
	}
	start("h1", "env=prod", "rack=r1")
	start("h2", "env=prod", "rack=r2")
	start("h3", "env=dev", "rack=r1")
	start("h4", "env=dev", "rack=r2")
	eventually(t, "the four agents joined", func() bool {
		known, err := reg.KnownHosts(ctx)
		return err == nil && len(known) == 4
	})
	e := agents["h1"]
	unit := "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"
	path := e.writeUnit("app.service", unit)

	// A bad selector: exit 2 naming the text and where, nothing stored.
	for _, bad := range []struct{ sel, want string }{
		{"env in prod", `at 8, "prod": want "(" after in`},
		{"env=prod,", "at 10 (the end)"},
		{"", "neither host nor group"},
	} {
		out, code := e.cli("unit", "put", path, "--selector", bad.sel)
		if code != exitUsage || !strings.Contains(out, bad.want) {
			t.Errorf("unit put --selector %q: exit %d, want %d and %q\n%s", bad.sel, code, exitUsage, bad.want, out)
		}
	}
	if out, code := e.cli("unit", "put", path, "--selector", "env=prod", "--group", "web"); code != exitUsage || !strings.Contains(out, "exactly one") {
		t.Errorf("unit put --selector --group: exit %d\n%s", code, out)
	}
	if ls, err := reg.List(ctx, nil); err != nil || len(ls) != 0 {
		t.Fatalf("after the refused puts the registry holds %v (%v)", ls, err)
	}
	if sels, _, err := reg.Selectors(ctx); err != nil || len(sels) != 0 {
		t.Fatalf("after the refused puts the registry holds selectors %v (%v)", sels, err)
	}

	// The put reaches exactly the prod hosts, and --wait waits for them.
	out, code := e.cli("unit", "put", path, "--selector", "env = prod", "--wait", "--timeout", "60s", "--json")
	if code != 0 {
		t.Fatalf("unit put --selector env=prod --wait: exit %d\n%s", code, out)
	}
	waited := map[string]bool{}
	for line := range strings.Lines(out) {
		var ev struct{ Event, Host string }
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Event == "progress" {
			waited[ev.Host] = true
		}
	}
	sel, _ := selector.Parse("env=prod")
	group := registry.SelectorGroup(sel)
	if !strings.Contains(out, "groups/"+group+"/units/app.service") {
		t.Errorf("the put does not name the group %s:\n%s", group, out)
	}
	checkRuns := func(want ...string) {
		t.Helper()
		for _, h := range []string{"h1", "h2", "h3", "h4"} {
			a := agents[h]
			_, onDisk := a.readLocal("app.service")
			pid := a.h.MainPID(t, "app.service")
			if runs := slices.Contains(want, h); runs != (pid != 0) || runs != onDisk {
				t.Errorf("%s: MainPID %d, file there %v; want it running: %v", h, pid, onDisk, runs)
			}
		}
	}
	checkRuns("h1", "h2")
	// The CLI's count (KnownHosts, by the hosts' labels) is the agents'
	// own (their membership records), and what --wait showed.
	cliHosts, agentHosts := selectorHosts(t, reg, group)
	if !slices.Equal(cliHosts, []string{"h1", "h2"}) || !slices.Equal(agentHosts, cliHosts) ||
		!slices.Equal(slices.Sorted(maps.Keys(waited)), cliHosts) {
		t.Fatalf("the CLI counts %v, the agents joined %v, --wait waited for %v; want h1 h2", cliHosts, agentHosts, waited)
	}

	// unit ls names the selector; history takes --selector.
	if out, code := e.cli("unit", "ls", "--selector", "env=prod"); code != 0 || !strings.Contains(out, "(selector 'env=prod')") {
		t.Errorf("unit ls --selector: exit %d\n%s", code, out)
	}
	if out, code := e.cli("unit", "history", "app.service", "--selector", "env=prod"); code != 0 || !strings.Contains(out, short(reconcile.Hash([]byte(unit)))) {
		t.Errorf("unit history --selector: exit %d\n%s", code, out)
	}

	// Relabelled: h2 out of prod drops the unit, h3 into it takes it.
	start("h2", "env=dev", "rack=r2")
	start("h3", "env=prod", "rack=r1")
	eventually(t, "h2 dropped and h3 took the unit", func() bool {
		_, on2 := agents["h2"].readLocal("app.service")
		return !on2 && agents["h2"].h.MainPID(t, "app.service") == 0 && agents["h3"].h.MainPID(t, "app.service") != 0
	})
	checkRuns("h1", "h3")
	eventually(t, "the agents' groups follow the labels", func() bool {
		c, a := selectorHosts(t, reg, group)
		return slices.Equal(c, []string{"h1", "h3"}) && slices.Equal(a, c)
	})

	// A dry run to a new selector previews its hosts and records nothing.
	out, code = e.cli("unit", "put", path, "--selector", "rack=r1", "--dry-run", "--json")
	if code != 0 || !strings.Contains(out, `"host":"h1"`) || !strings.Contains(out, `"host":"h3"`) ||
		strings.Contains(out, `"host":"h2"`) || strings.Contains(out, `"host":"h4"`) {
		t.Errorf("unit put --selector rack=r1 --dry-run: exit %d\n%s", code, out)
	}
	if sels, _, err := reg.Selectors(ctx); err != nil || len(sels) != 1 {
		t.Errorf("after the dry run the registry holds selectors %v (%v), want env=prod's only", sels, err)
	}

	// A selector put after the agents started is followed at once.
	rackPath := e.writeUnit("rack.service", unit)
	if out, code := e.cli("unit", "put", rackPath, "--selector", "rack=r2", "--wait", "--timeout", "60s"); code != 0 {
		t.Fatalf("unit put --selector rack=r2: exit %d\n%s", code, out)
	}
	for _, h := range []string{"h1", "h2", "h3", "h4"} {
		if runs := agents[h].h.MainPID(t, "rack.service") != 0; runs != (h == "h2" || h == "h4") {
			t.Errorf("%s runs rack.service: %v", h, runs)
		}
	}

	// A rollout to a selector: its hosts are the matching ones, in waves,
	// coordinated by one of them (the selector group's coordinator).
	rolled := "[Service]\nType=exec\nExecStart=/bin/sleep 2000\n"
	out, code = e.cli("unit", "put", e.writeUnit("rack.service", rolled), "--selector", "rack=r2", "--waves", "1,100%", "--soak", "1s", "--wait", "--timeout", "60s")
	if code != 0 || !strings.Contains(out, "2 hosts in waves 1, 2") {
		t.Fatalf("rollout to --selector rack=r2: exit %d\n%s", code, out)
	}
	rs, err := reg.Rollouts(ctx, registry.SelectorGroup(mustParse(t, "rack=r2")), false)
	if err != nil || len(rs) != 1 || !slices.Equal(rs[0].Record.Hosts, []string{"h2", "h4"}) {
		t.Fatalf("the selector's rollouts: %+v, %v; want one of h2 h4", rs, err)
	}
	for _, h := range []string{"h2", "h4"} {
		if s, _ := agents[h].status("rack.service"); s.Hash != reconcile.Hash([]byte(rolled)) || s.ActiveState != "active" {
			t.Errorf("%s after the rollout: %+v", h, s)
		}
	}
	if out, code := e.cli("rollout", "ls", "--selector", "rack=r2"); code != 0 || !strings.Contains(out, registry.SelectorGroup(mustParse(t, "rack=r2"))) {
		t.Errorf("rollout ls --selector: exit %d\n%s", code, out)
	}

	// unit rm --selector removes it from exactly those hosts.
	if out, code := e.cli("unit", "rm", "app.service", "--selector", "env=prod", "--wait", "--timeout", "60s"); code != 0 {
		t.Fatalf("unit rm --selector: exit %d\n%s", code, out)
	}
	checkRuns()
}

// selectorHosts are group's hosts as the CLI counts them (KnownHosts) and
// as the agents' own membership records name it.
func selectorHosts(t *testing.T, reg *registry.Client, group string) (cli, agents []string) {
	t.Helper()
	known, err := reg.KnownHosts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ms, err := reg.Members(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range known {
		if slices.Contains(k.Groups, group) {
			cli = append(cli, k.Host)
		}
	}
	for _, m := range ms {
		if slices.Contains(m.Groups, group) {
			agents = append(agents, m.Host)
		}
	}
	return cli, agents
}

func mustParse(t *testing.T, s string) selector.Selector {
	t.Helper()
	sel, err := selector.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}
