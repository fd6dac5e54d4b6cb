package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry/registrytest"
)

// Issue 9: a template is the unit of rollout across a fleet. Several agents
// on one machine, each with its own systemd user instance, one real etcd.
// Every instance of w@.service logs "<start|stop> <%t> <%i> <$V> <time>"
// from its own ExecStartPre/ExecStopPost: %t tells the hosts apart, %i the
// instances, $V the template version the instance runs.

const tfTemplate = "w@.service"

// tfUnit is version v of the template, with policy in [X-Agentd].
func tfUnit(f *fleet, v, policy string) string {
	return fmt.Sprintf("[Unit]\nDescription=w %%i\n[Service]\nType=exec\nEnvironment=V=%s\n"+
		"ExecStartPre=/bin/sh -c 'echo \"start %%t %%i $${V} $(date +%%%%s.%%%%N)\" >> %s'\n"+
		"ExecStart=/bin/sleep 1000\n"+
		"ExecStopPost=/bin/sh -c 'echo \"stop %%t %%i $${V} $(date +%%%%s.%%%%N)\" >> %s'\n"+
		"[X-Agentd]\n%s\n", v, f.events, f.events, policy)
}

func tfInstance(i int) string { return fmt.Sprintf("w@%d.service", i) }

type tfEvent struct {
	at         float64
	stop       bool
	host, inst string // inst: "1", "2", ...
	v          string
}

func (e tfEvent) String() string {
	kind := "start"
	if e.stop {
		kind = "stop"
	}
	return fmt.Sprintf("%.3f %s %s/w@%s V=%s", e.at, kind, e.host, e.inst, e.v)
}

func tfReadEvents(f *fleet) []tfEvent {
	b, _ := os.ReadFile(f.events)
	var evs []tfEvent
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		fs := strings.Fields(line)
		if len(fs) != 5 {
			continue
		}
		at, _ := strconv.ParseFloat(fs[4], 64)
		evs = append(evs, tfEvent{at: at, stop: fs[0] == "stop", host: f.byRun[fs[1]], inst: fs[2], v: fs[3]})
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	return evs
}

func tfDump(evs []tfEvent) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "\n  %v", e)
	}
	return b.String()
}

// tfDown returns the most hosts with at least one instance down at the same
// moment, and the most instances down at once on one host. An instance is
// down from its stop to its next start.
func tfDown(evs []tfEvent) (hosts, perHost int) {
	down := map[string]map[string]bool{}
	for _, e := range evs {
		if down[e.host] == nil {
			down[e.host] = map[string]bool{}
		}
		down[e.host][e.inst] = e.stop
		nh := 0
		for _, insts := range down {
			n := 0
			for _, d := range insts {
				if d {
					n++
				}
			}
			if n > 0 {
				nh++
			}
			perHost = max(perHost, n)
		}
		hosts = max(hosts, nh)
	}
	return hosts, perHost
}

// tfEnvV is the V= of the running instance's main process (its environ).
func tfEnvV(e *env, unit string) (string, uint32) {
	pid := e.h.MainPID(e.t, unit)
	if pid == 0 {
		return "", 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return "", pid
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if v, ok := strings.CutPrefix(kv, "V="); ok {
			return v, pid
		}
	}
	return "", pid
}

// tfConverged: every host has content as its template file and runs each
// of insts on version v, active, past HealthySec (not verifying), and no
// other instance of insts' template from absent runs.
func tfConverged(t *testing.T, f *fleet, content, v string, insts, absent []int, within time.Duration) {
	t.Helper()
	want := reconcile.Hash([]byte(content))
	deadline := time.Now().Add(within)
	for _, e := range f.hosts {
		for {
			why := ""
			if got, _ := e.readLocal(tfTemplate); got != content {
				why = "template file is not the wanted content"
			} else if s, _ := e.status(tfTemplate); s.Hash != want || s.DesiredHash != want {
				why = fmt.Sprintf("template status %+v", s)
			}
			for _, i := range insts {
				if why != "" {
					break
				}
				u := tfInstance(i)
				if got, pid := tfEnvV(e, u); got != v {
					why = fmt.Sprintf("%s runs V=%q (pid %d), want %s", u, got, pid, v)
				} else if s, _ := e.status(u); s.ActiveState != "active" || s.Verifying || s.Job != "" {
					why = fmt.Sprintf("%s status %+v", u, s)
				}
			}
			for _, i := range absent {
				if why != "" {
					break
				}
				if st := e.h.ActiveState(t, tfInstance(i)); st != "inactive" && st != "" {
					why = fmt.Sprintf("%s is %s, want it stopped", tfInstance(i), st)
				}
			}
			if why == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s has not converged on V=%s after %v: %s\nevents:%s", e.host, v, within, why, tfDump(tfReadEvents(f)))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// tfLocks lists the keys under <prefix>/locks/<under>.
func tfLocks(t *testing.T, f *fleet, under string) []string {
	t.Helper()
	cli := registrytest.RawClient(t, f.endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, f.reg.Prefix()+"/locks/"+under, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

// tfNoLocks: once converged, no host holds or waits for any slot.
func tfNoLocks(t *testing.T, f *fleet, under string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		keys := tfLocks(t, f, under)
		if len(keys) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock keys left under locks/%s 5s after convergence: %v", under, keys)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tfPut(t *testing.T, f *fleet, content string, wantCode int, extra ...string) (string, time.Time) {
	t.Helper()
	e := f.hosts[0]
	args := append([]string{"unit", "put", e.writeUnit(tfTemplate, content), "--group", "web"}, extra...)
	out, code := e.cli(args...)
	if code != wantCode {
		t.Fatalf("unit put %s: exit %d, want %d\n%s", tfTemplate, code, wantCode, out)
	}
	return out, time.Now()
}

func tfPIDs(t *testing.T, f *fleet, insts []int) map[string]uint32 {
	m := map[string]uint32{}
	for _, e := range f.hosts {
		for _, i := range insts {
			m[e.host+"/"+tfInstance(i)] = e.h.MainPID(t, tfInstance(i))
		}
	}
	return m
}

func tfStart(t *testing.T, policy string) (*fleet, string) {
	f := newFleet(t, 3, "")
	v1 := tfUnit(f, "1", policy)
	tfPut(t, f, v1, 0, "--instance", tfInstance(1), "--instance", tfInstance(2), "--instance", tfInstance(3), "--wait", "--timeout", "60s")
	tfConverged(t, f, v1, "1", []int{1, 2, 3}, nil, 20*time.Second)
	tfNoLocks(t, f, "")
	return f, v1
}

// 3 hosts × 3 instances, MaxUnavailable=1 in the template: over two
// rollouts, never more than one host with an instance down, never two
// instances down at once on a host, every instance restarted exactly once
// onto the new version, each healthy before the next.
func TestTemplateFleetOneHostOneInstanceAtATime(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	const healthy = 1.0
	policy := "MaxUnavailable=1\nHealthySec=1"
	f, _ := tfStart(t, policy)
	for _, v := range []string{"2", "3"} {
		os.Remove(f.events)
		content := tfUnit(f, v, policy)
		start := time.Now()
		_, returned := tfPut(t, f, content, 0, "--wait", "--timeout", "60s")
		tfConverged(t, f, content, v, []int{1, 2, 3}, nil, 40*time.Second)
		converged := time.Now()
		evs := tfReadEvents(f)
		t.Logf("V=%s: rolled out in %v (--wait returned after %v); events:%s", v,
			converged.Sub(start).Round(10*time.Millisecond), returned.Sub(start).Round(10*time.Millisecond), tfDump(evs))

		stops, starts := map[string]int{}, map[string]int{}
		for _, e := range evs {
			k := e.host + "/w@" + e.inst
			if e.stop {
				stops[k]++
			} else {
				starts[k]++
				if e.v != v {
					t.Errorf("V=%s: %s started on V=%s", v, k, e.v)
				}
			}
		}
		for _, h := range f.hosts {
			for i := 1; i <= 3; i++ {
				k := fmt.Sprintf("%s/w@%d", h.host, i)
				if stops[k] != 1 || starts[k] != 1 {
					t.Errorf("V=%s: %s stopped %d and started %d times, want once each", v, k, stops[k], starts[k])
				}
			}
		}
		hosts, perHost := tfDown(evs)
		if hosts > 1 {
			t.Errorf("V=%s: %d hosts had an instance down at once, MaxUnavailable=1", v, hosts)
		}
		if perHost > 1 {
			t.Errorf("V=%s: %d instances down at once on one host", v, perHost)
		}
		// Each restart waits for the previous one's HealthySec: on a host
		// (the next instance) and across hosts (the slot is held until the
		// host's last instance is healthy).
		var lastStart *tfEvent
		for i := range evs {
			e := &evs[i]
			if e.stop && lastStart != nil && e.at-lastStart.at < healthy-0.1 {
				t.Errorf("V=%s: %s/w@%s stopped %.2fs after %s/w@%s started, before HealthySec=1 passed",
					v, e.host, e.inst, e.at-lastStart.at, lastStart.host, lastStart.inst)
			}
			if !e.stop {
				lastStart = e
			}
		}
		if n := len(evs); n > 0 && returned.Before(time.Unix(0, int64(evs[n-1].at*1e9)).Add(time.Duration(healthy*float64(time.Second)))) {
			// --wait on a template waits for every instance, healthy.
			t.Errorf("V=%s: --wait returned 0 at %.3f, before the last instance's start (%.3f) + HealthySec", v,
				float64(returned.UnixNano())/1e9, evs[n-1].at)
		}
		if t.Failed() {
			t.FailNow()
		}
		tfNoLocks(t, f, "")
	}
}

// A revert while hosts are queued for the template's slot: the host that
// began goes back to the old content, the queued ones leave the queue
// without touching their instances, nobody is left waiting, and the next
// rollout completes.
func TestTemplateFleetRevertWhileQueued(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	policy := "MaxUnavailable=1\nHealthySec=3"
	f, v1 := tfStart(t, policy)
	before := tfPIDs(t, f, []int{1, 2, 3})
	os.Remove(f.events)

	v2 := tfUnit(f, "2", policy)
	tfPut(t, f, v2, 0)
	var first tfEvent
	deadline := time.Now().Add(15 * time.Second)
	for {
		if evs := tfReadEvents(f); len(evs) > 0 {
			first = evs[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no host restarted an instance within 15s of putting v2")
		}
		time.Sleep(10 * time.Millisecond)
	}
	holders, err := f.reg.Holders(context.Background(), "groups/web", reconcile.Bucket{}, tfTemplate)
	if err != nil {
		t.Fatal(err)
	}
	tfPut(t, f, v1, 0)
	reverted := time.Now()
	t.Logf("first restart: %v; queue at the revert: %+v", first, holders)
	waiting := 0
	for _, h := range holders {
		if h.Waiting() {
			waiting++
		}
	}
	if waiting == 0 {
		t.Fatalf("no host was queued for %s when v1 was put back (queue %+v): the test did not reach its case", tfTemplate, holders)
	}

	tfConverged(t, f, v1, "1", []int{1, 2, 3}, nil, 30*time.Second)
	t.Logf("converged on v1 %v after the revert; events:%s", time.Since(reverted).Round(10*time.Millisecond), tfDump(tfReadEvents(f)))
	after := tfPIDs(t, f, []int{1, 2, 3})
	for _, e := range f.hosts {
		if e.host == first.host {
			continue
		}
		for i := 1; i <= 3; i++ {
			k := e.host + "/" + tfInstance(i)
			if after[k] != before[k] {
				t.Errorf("%s was only queued for v2, but %s was restarted (pid %d → %d)", e.host, tfInstance(i), before[k], after[k])
			}
		}
	}
	for _, ev := range tfReadEvents(f) {
		if ev.host != first.host {
			t.Errorf("a host that was only queued restarted an instance: %v", ev)
		}
	}
	tfNoLocks(t, f, "groups/web/"+tfTemplate+"/")
	tfNoLocks(t, f, "")

	// The next rollout is not stuck behind a slot nobody releases.
	os.Remove(f.events)
	v3 := tfUnit(f, "3", "MaxUnavailable=1\nHealthySec=1")
	start := time.Now()
	tfPut(t, f, v3, 0, "--wait", "--timeout", "60s")
	tfConverged(t, f, v3, "3", []int{1, 2, 3}, nil, 40*time.Second)
	evs := tfReadEvents(f)
	t.Logf("v3 rolled out in %v; events:%s", time.Since(start).Round(10*time.Millisecond), tfDump(evs))
	if hosts, perHost := tfDown(evs); hosts > 1 || perHost > 1 {
		t.Errorf("v3: %d hosts down at once, %d instances on one host, want at most 1 and 1", hosts, perHost)
	}
	tfNoLocks(t, f, "")
}

// Adding an instance key starts it on every host; removing one stops only
// that instance, the others keep their main PID.
func TestTemplateFleetAddRemoveInstance(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	policy := "MaxUnavailable=1\nHealthySec=1"
	f, v1 := tfStart(t, policy)
	e := f.hosts[0]
	before := tfPIDs(t, f, []int{1, 2, 3})

	if out, code := e.cli("unit", "put", "--instance", tfInstance(4), "--group", "web", "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("put --instance %s: exit %d\n%s", tfInstance(4), code, out)
	}
	tfConverged(t, f, v1, "1", []int{1, 2, 3, 4}, nil, 15*time.Second)
	after := tfPIDs(t, f, []int{1, 2, 3})
	for k, p := range before {
		if after[k] != p {
			t.Errorf("adding %s restarted %s (pid %d → %d)", tfInstance(4), k, p, after[k])
		}
	}
	tfNoLocks(t, f, "")

	before = tfPIDs(t, f, []int{1, 3, 4})
	os.Remove(f.events)
	if out, code := e.cli("unit", "rm", tfInstance(2), "--group", "web", "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("rm %s: exit %d\n%s", tfInstance(2), code, out)
	}
	tfConverged(t, f, v1, "1", []int{1, 3, 4}, []int{2}, 15*time.Second)
	after = tfPIDs(t, f, []int{1, 3, 4})
	for k, p := range before {
		if after[k] != p {
			t.Errorf("removing %s restarted %s (pid %d → %d)", tfInstance(2), k, p, after[k])
		}
	}
	evs := tfReadEvents(f)
	for _, ev := range evs {
		if ev.inst != "2" || !ev.stop {
			t.Errorf("removing %s: unexpected event %v", tfInstance(2), ev)
		}
	}
	if len(evs) != len(f.hosts) {
		t.Errorf("removing %s: %d stop events, want one per host:%s", tfInstance(2), len(evs), tfDump(evs))
	}
	for _, h := range f.hosts {
		if _, ok := h.readLocal(tfInstance(2)); ok {
			t.Errorf("%s: %s left in the unit directory", h.host, tfInstance(2))
		}
	}
	tfNoLocks(t, f, "")
}
