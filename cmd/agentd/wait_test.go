package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentd/agentd/reconcile"
)

func TestJudgeStates(t *testing.T) {
	h := reconcile.Hash([]byte("v2"))
	e := expectation{key: "a.service", unit: "a.service", hash: h, state: reconcile.StateStarted}
	st := func(s reconcile.Status) map[string]reconcile.Status {
		s.Unit = "a.service"
		return map[string]reconcile.Status{"a.service": s}
	}
	tests := []struct {
		name string
		in   map[string]reconcile.Status
		want string
	}{
		{"no status", nil, statePending},
		{"old desired hash", st(reconcile.Status{DesiredHash: "old", Hash: "old", ActiveState: "active"}), statePending},
		{"old hash still running", st(reconcile.Status{DesiredHash: h, Hash: "old", ActiveState: "active"}), stateApplying},
		{"waiting for a slot", st(reconcile.Status{DesiredHash: h, Hash: "old", ActiveState: "active", Action: "wait-slot"}), stateSlot},
		{"verifying", st(reconcile.Status{DesiredHash: h, Hash: h, ActiveState: "active", Verifying: true}), stateVerifying},
		{"active, no verdict yet", st(reconcile.Status{DesiredHash: h, Hash: h, ActiveState: "active", SubState: "running"}), stateApplying},
		{"healthy", st(reconcile.Status{DesiredHash: h, Hash: h, ActiveState: "active", SubState: "running", Health: "healthy"}), stateHealthy},
		{"oneshot ran to completion", st(reconcile.Status{DesiredHash: h, Hash: h, ActiveState: "inactive", SubState: "dead", Health: "healthy"}), stateHealthy},
		{"job running on the old process", st(reconcile.Status{DesiredHash: h, Hash: h, ActiveState: "active", Health: "healthy", Job: "restart"}), stateApplying},
		{"rolling back", st(reconcile.Status{DesiredHash: h, Hash: h, ActiveState: "failed", Action: "rolling-back", Error: "exit status 3"}), stateApplying},
		{"restart pending (OnChange=none)", st(reconcile.Status{DesiredHash: h, Hash: h, ActiveState: "active", PendingRestart: true}), stateHealthy},
		{"failed", st(reconcile.Status{DesiredHash: h, Hash: h, ActiveState: "failed", Error: "unit failed (result: exit-code)"}), stateFailed},
		{"rolled back", st(reconcile.Status{DesiredHash: h, Hash: "old", ActiveState: "active", Action: "rolled-back", Error: "exit status 3; rolled back"}), stateRolled},
		{"held", st(reconcile.Status{DesiredHash: h, Hash: "old", ActiveState: "active", Action: "held", Error: "held: h9 failed it"}), stateHeld},
	}
	for _, tt := range tests {
		if got, _ := e.judge(tt.in, alive); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
	rm := expectation{key: "a.service", unit: "a.service", removing: true}
	if got, _ := rm.judge(nil, alive); got != stateRemoved {
		t.Errorf("removed: %s", got)
	}
	// No status and no live agent: its statuses went with its lease.
	if got, _ := rm.judge(nil, func() bool { return false }); got != statePending {
		t.Errorf("no status, agent down: %s, want %s", got, statePending)
	}
}

func TestProgressViews(t *testing.T) {
	want := []expectation{{key: "a.service", unit: "a.service"}}
	rows := func(state string) map[string]row {
		return map[string]row{"h1\x00a.service": {"h1", "a.service", state, "x"}}
	}
	var plain bytes.Buffer
	v := newProgressView(&plain, false, []string{"h1"}, want)
	v.update(rows(statePending))
	v.update(rows(statePending)) // unchanged: no new line
	v.update(rows(stateHealthy))
	if got := plain.String(); got != "h1 a.service: pending — x\nh1 a.service: healthy — x\n" {
		t.Fatalf("plain: %q", got)
	}
	var js bytes.Buffer
	v = newProgressView(&js, true, []string{"h1"}, want)
	v.update(rows(stateHeld))
	var ev map[string]any
	if err := json.Unmarshal(js.Bytes(), &ev); err != nil || ev["state"] != stateHeld || ev["host"] != "h1" {
		t.Fatalf("json: %s", js.String())
	}
	var tty bytes.Buffer
	v = newProgressView(&tty, false, []string{"h1"}, want)
	v.tty = true
	v.update(rows(statePending))
	v.update(rows(stateHealthy))
	out := tty.String()
	if !strings.Contains(out, "\x1b[3A") || !strings.Contains(out, "1/1 done") || !strings.Contains(out, "HOST") {
		t.Fatalf("tty redraw: %q", out)
	}
}

// Every flag can come from AGENTD_<FLAG>; a flag on the command line wins.
func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("AGENTD_ETCD_ENDPOINTS", "http://127.0.0.1:1")
	t.Setenv("AGENTD_ETCD_DIAL_TIMEOUT", "200ms")
	var out bytes.Buffer
	root := newRoot()
	root.SetArgs([]string{"unit", "ls"})
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("AGENTD_ETCD_ENDPOINTS not used: %v", err)
	}
	root = newRoot()
	root.SetArgs([]string{"unit", "ls", "--etcd-endpoints", "http://127.0.0.1:2"})
	root.SetOut(&out)
	root.SetErr(&out)
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "127.0.0.1:2") {
		t.Fatalf("the flag did not win over the environment: %v", err)
	}
}

// A template's --wait counts its instances: done only when each runs the
// new template (RunsHash) and is healthy.
func TestJudgeTemplateInstances(t *testing.T) {
	h := reconcile.Hash([]byte("tmpl v2"))
	e := expectation{key: "w@.service", unit: "w@.service", hash: h, state: reconcile.StatePresent}
	tmpl := reconcile.Status{Unit: "w@.service", Hash: h, DesiredHash: h}
	inst := func(runs, health string, extra func(*reconcile.Status)) reconcile.Status {
		s := reconcile.Status{RunsHash: runs, Health: health, ActiveState: "active"}
		if extra != nil {
			extra(&s)
		}
		return s
	}
	tests := []struct {
		name string
		in   map[string]reconcile.Status
		want string
	}{
		{"no instances: installed", map[string]reconcile.Status{"w@.service": tmpl}, stateHealthy},
		{"all on the new set", map[string]reconcile.Status{"w@.service": tmpl, "w@1.service": inst(h, "healthy", nil), "w@2.service": inst(h, "healthy", nil)}, stateHealthy},
		{"one still on the old set", map[string]reconcile.Status{"w@.service": tmpl, "w@1.service": inst(h, "healthy", nil), "w@2.service": inst("old", "healthy", nil)}, stateApplying},
		{"one verifying", map[string]reconcile.Status{"w@.service": tmpl, "w@1.service": inst(h, "verifying", func(s *reconcile.Status) { s.Verifying = true })}, stateApplying},
		{"one rolled back", map[string]reconcile.Status{"w@.service": tmpl, "w@1.service": inst("old", "", func(s *reconcile.Status) { s.Action, s.Error = "rolled-back", "exit 1; rolled back" })}, stateRolled},
		{"rolling back is not final", map[string]reconcile.Status{"w@.service": tmpl, "w@1.service": inst(h, "", func(s *reconcile.Status) { s.Action, s.Error = "rolling-back", "exit 1" })}, stateApplying},
		{"held", map[string]reconcile.Status{"w@.service": tmpl, "w@1.service": inst("old", "healthy", func(s *reconcile.Status) { s.Action, s.Error = "held", "held: h2 failed it" })}, stateHeld},
		{"another template's instance is not counted", map[string]reconcile.Status{"w@.service": tmpl, "x@1.service": inst("old", "", nil)}, stateHealthy},
	}
	for _, tt := range tests {
		if got, detail := e.judge(tt.in, alive); got != tt.want {
			t.Errorf("%s: %s (%s), want %s", tt.name, got, detail, tt.want)
		}
	}
}

// alive is a host whose agent is up.
func alive() bool { return true }

// What a host runs is named by the hash of the key waited on: a unit
// file's, a drop-in's own, an instance's template's — never an empty one.
func TestJudgeNamesTheVersion(t *testing.T) {
	tests := []struct {
		name string
		e    expectation
		st   reconcile.Status
		want string
	}{
		{"unit file", expectation{key: "a.service", unit: "a.service", hash: "aaaaaaaaaaaaaaaa", state: reconcile.StateStarted},
			reconcile.Status{Unit: "a.service", Hash: "aaaaaaaaaaaaaaaa", DesiredHash: "aaaaaaaaaaaaaaaa", ActiveState: "active", SubState: "running", Health: "healthy"},
			"active (running), hash aaaaaaaaaaaa"},
		{"drop-in", expectation{key: "v.service.d/10.conf", unit: "v.service", hash: "dddddddddddddddd", state: reconcile.StateStarted},
			reconcile.Status{Unit: "v.service", DropIns: map[string]string{"v.service.d/10.conf": "dddddddddddddddd"}, ActiveState: "active", SubState: "running", Health: "healthy"},
			"active (running), drop-in dddddddddddd"},
		{"instance, verifying", expectation{key: "web@1.service", unit: "web@1.service", state: reconcile.StateStarted},
			reconcile.Status{Unit: "web@1.service", RunsHash: "tttttttttttttttt", ActiveState: "active", SubState: "running", Verifying: true},
			"running template tttttttttttt, waiting out HealthySec"},
	}
	for _, tt := range tests {
		_, detail := tt.e.judge(map[string]reconcile.Status{tt.e.unit: tt.st}, alive)
		if detail != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, detail, tt.want)
		}
	}
}
