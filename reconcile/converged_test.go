package reconcile

import (
	"testing"
)

// The judgement of --wait (moved here from cmd/agentd's wait_test.go with
// the judgement itself), then what the revisions add to it.

func TestJudgeStates(t *testing.T) {
	h := Hash([]byte("v2"))
	e := Expectation{Key: "a.service", Unit: "a.service", Hash: h, State: StateStarted}
	st := func(s Status) map[string]Status {
		s.Unit = "a.service"
		return map[string]Status{"a.service": s}
	}
	tests := []struct {
		name string
		in   map[string]Status
		want Progress
	}{
		{"no status", nil, ProgressPending},
		{"old desired hash", st(Status{DesiredHash: "old", Hash: "old", ActiveState: "active"}), ProgressPending},
		{"old hash still running", st(Status{DesiredHash: h, Hash: "old", ActiveState: "active"}), ProgressApplying},
		{"waiting for a slot", st(Status{DesiredHash: h, Hash: "old", ActiveState: "active", Action: "wait-slot"}), ProgressSlot},
		{"verifying", st(Status{DesiredHash: h, Hash: h, ActiveState: "active", Verifying: true}), ProgressVerifying},
		{"healthy, awaiting its confirmation (ConfirmSec=)", st(Status{DesiredHash: h, Hash: h, ActiveState: "active", SubState: "running", Health: "healthy", Confirming: true}), ProgressVerifying},
		{"rolled back, lost control plane", st(Status{DesiredHash: h, Hash: "old", ActiveState: "active", Action: "rolled-back", Error: "lost control plane: …; rolled back to 0123456789ab"}), ProgressRolledBack},
		{"active, no verdict yet", st(Status{DesiredHash: h, Hash: h, ActiveState: "active", SubState: "running"}), ProgressApplying},
		{"healthy", st(Status{DesiredHash: h, Hash: h, ActiveState: "active", SubState: "running", Health: "healthy"}), ProgressHealthy},
		{"oneshot ran to completion", st(Status{DesiredHash: h, Hash: h, ActiveState: "inactive", SubState: "dead", Health: "healthy"}), ProgressHealthy},
		{"job running on the old process", st(Status{DesiredHash: h, Hash: h, ActiveState: "active", Health: "healthy", Job: "restart"}), ProgressApplying},
		{"rolling back", st(Status{DesiredHash: h, Hash: h, ActiveState: "failed", Action: "rolling-back", Error: "exit status 3"}), ProgressApplying},
		{"restart pending (OnChange=none)", st(Status{DesiredHash: h, Hash: h, ActiveState: "active", PendingRestart: true}), ProgressHealthy},
		{"failed", st(Status{DesiredHash: h, Hash: h, ActiveState: "failed", Error: "unit failed (result: exit-code)"}), ProgressFailed},
		{"rolled back", st(Status{DesiredHash: h, Hash: "old", ActiveState: "active", Action: "rolled-back", Error: "exit status 3; rolled back"}), ProgressRolledBack},
		{"held", st(Status{DesiredHash: h, Hash: "old", ActiveState: "active", Action: "held", Error: "held: h9 failed it"}), ProgressHeld},
	}
	for _, tt := range tests {
		if got, _ := e.Assess(HostReport{Statuses: tt.in}, alive); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
	rm := Expectation{Key: "a.service", Unit: "a.service", Removing: true}
	if got, _ := rm.Assess(HostReport{}, alive); got != ProgressRemoved {
		t.Errorf("removed: %s", got)
	}
	// No status and no live agent: its statuses went with its lease.
	if got, _ := rm.Assess(HostReport{}, func() bool { return false }); got != ProgressNoAgent {
		t.Errorf("no status, agent down: %s, want %s", got, ProgressNoAgent)
	}
}

// A template's --wait counts its instances: done only when each runs the
// new template (RunsHash) and is healthy.
func TestJudgeTemplateInstances(t *testing.T) {
	h := Hash([]byte("tmpl v2"))
	e := Expectation{Key: "w@.service", Unit: "w@.service", Hash: h, State: StatePresent}
	tmpl := Status{Unit: "w@.service", Hash: h, DesiredHash: h}
	inst := func(runs string, health HealthWord, extra func(*Status)) Status {
		s := Status{RunsHash: runs, Health: health, ActiveState: "active"}
		if extra != nil {
			extra(&s)
		}
		return s
	}
	tests := []struct {
		name string
		in   map[string]Status
		want Progress
	}{
		{"no instances: installed", map[string]Status{"w@.service": tmpl}, ProgressHealthy},
		{"all on the new set", map[string]Status{"w@.service": tmpl, "w@1.service": inst(h, "healthy", nil), "w@2.service": inst(h, "healthy", nil)}, ProgressHealthy},
		{"one still on the old set", map[string]Status{"w@.service": tmpl, "w@1.service": inst(h, "healthy", nil), "w@2.service": inst("old", "healthy", nil)}, ProgressApplying},
		{"one verifying", map[string]Status{"w@.service": tmpl, "w@1.service": inst(h, "verifying", func(s *Status) { s.Verifying = true })}, ProgressApplying},
		{"one rolled back", map[string]Status{"w@.service": tmpl, "w@1.service": inst("old", "", func(s *Status) { s.Action, s.Error = "rolled-back", "exit 1; rolled back" })}, ProgressRolledBack},
		{"rolling back is not final", map[string]Status{"w@.service": tmpl, "w@1.service": inst(h, "", func(s *Status) { s.Action, s.Error = "rolling-back", "exit 1" })}, ProgressApplying},
		{"held", map[string]Status{"w@.service": tmpl, "w@1.service": inst("old", "healthy", func(s *Status) { s.Action, s.Error = "held", "held: h2 failed it" })}, ProgressHeld},
		{"another template's instance is not counted", map[string]Status{"w@.service": tmpl, "x@1.service": inst("old", "", nil)}, ProgressHealthy},
	}
	for _, tt := range tests {
		if got, detail := e.Assess(HostReport{Statuses: tt.in}, alive); got != tt.want {
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
		e    Expectation
		st   Status
		want string
	}{
		{"unit file", Expectation{Key: "a.service", Unit: "a.service", Hash: "aaaaaaaaaaaaaaaa", State: StateStarted},
			Status{Unit: "a.service", Hash: "aaaaaaaaaaaaaaaa", DesiredHash: "aaaaaaaaaaaaaaaa", ActiveState: "active", SubState: "running", Health: "healthy"},
			"active (running), hash aaaaaaaaaaaa"},
		{"drop-in", Expectation{Key: "v.service.d/10.conf", Unit: "v.service", Hash: "dddddddddddddddd", State: StateStarted},
			Status{Unit: "v.service", DropIns: map[string]string{"v.service.d/10.conf": "dddddddddddddddd"}, ActiveState: "active", SubState: "running", Health: "healthy"},
			"active (running), drop-in dddddddddddd"},
		{"instance, verifying", Expectation{Key: "web@1.service", Unit: "web@1.service", State: StateStarted},
			Status{Unit: "web@1.service", RunsHash: "tttttttttttttttt", ActiveState: "active", SubState: "running", Verifying: true},
			"running template tttttttttttt, waiting out HealthySec"},
		{"verifying with a health probe", Expectation{Key: "a.service", Unit: "a.service", Hash: "aaaaaaaaaaaaaaaa", State: StateStarted},
			Status{Unit: "a.service", Hash: "aaaaaaaaaaaaaaaa", DesiredHash: "aaaaaaaaaaaaaaaa", ActiveState: "active", SubState: "running", Verifying: true,
				Probe: "HealthURL http://a/: 500 (want 2xx), 1 failure in a row (HealthRetries=3)"},
			"running hash aaaaaaaaaaaa, waiting out HealthySec and for a passing health probe; last: HealthURL http://a/: 500 (want 2xx), 1 failure in a row (HealthRetries=3)"},
	}
	for _, tt := range tests {
		_, detail := tt.e.Assess(HostReport{Statuses: map[string]Status{tt.e.Unit: tt.st}}, alive)
		if detail != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, detail, tt.want)
		}
	}
}

// A host's answer counts only once it has acted on the write's revision:
// before that, a missing status is not a removal and an old status is not
// the old content. Once it has, a different desired hash means the write
// was superseded (it will never run), not that the host is late.
func TestJudgeByRevision(t *testing.T) {
	h := Hash([]byte("v2"))
	put := Expectation{Key: "a.service", Unit: "a.service", Hash: h, State: StateStarted, Revision: 10}
	rm := Expectation{Key: "a.service", Unit: "a.service", Removing: true, Revision: 10}
	running := func(desired string) map[string]Status {
		return map[string]Status{"a.service": {Unit: "a.service", Hash: desired, DesiredHash: desired, ActiveState: "active", SubState: "running", Health: "healthy"}}
	}
	down := func() bool { return false }
	tests := []struct {
		name string
		e    Expectation
		r    HostReport
		live func() bool
		want Progress
	}{
		{"rm: just restarted, nothing published", rm, HostReport{}, alive, ProgressPending},
		{"rm: agent down", rm, HostReport{}, down, ProgressNoAgent},
		{"rm: acted on an older revision, status gone", rm, HostReport{Pass: Pass{Acted: 9}}, alive, ProgressPending},
		{"rm: acted, status gone", rm, HostReport{Pass: Pass{Acted: 10}}, alive, ProgressRemoved},
		{"rm: acted on a later put of the unit", rm, HostReport{Pass: Pass{Acted: 12}, Statuses: running("v3")}, alive, ProgressSuperseded},
		{"rm: acted, file gone, another target's drop-in keeps a status", rm, HostReport{Pass: Pass{Acted: 10}, Statuses: map[string]Status{"a.service": {Unit: "a.service", ActiveState: "inactive", LoadState: "not-found", DropIns: map[string]string{"a.service.d/x.conf": "d"}}}}, alive, ProgressRemoved},
		{"rm: acted, file still on disk", rm, HostReport{Pass: Pass{Acted: 10}, Statuses: map[string]Status{"a.service": {Unit: "a.service", Hash: "old", ActiveState: "active"}}}, alive, ProgressApplying},
		{"rm: acted, still stopping", rm, HostReport{Pass: Pass{Acted: 10}, Statuses: map[string]Status{"a.service": {Unit: "a.service", Hash: "old", Job: "stop"}}}, alive, ProgressApplying},
		{"put: healthy on the old hash, not acted yet", put, HostReport{Pass: Pass{Acted: 9}, Statuses: running("old")}, alive, ProgressPending},
		{"put: acted, healthy", put, HostReport{Pass: Pass{Acted: 10}, Statuses: running(h)}, alive, ProgressHealthy},
		{"put: acted on a later write of other content", put, HostReport{Pass: Pass{Acted: 11}, Statuses: running("v3")}, alive, ProgressSuperseded},
		{"put: agent down", put, HostReport{}, down, ProgressNoAgent},
		{"put: no revision known: statuses as they are", Expectation{Key: "a.service", Unit: "a.service", Hash: h, State: StateStarted}, HostReport{Statuses: running(h)}, alive, ProgressHealthy},
	}
	for _, tt := range tests {
		if got, detail := tt.e.Assess(tt.r, tt.live); got != tt.want {
			t.Errorf("%s: %s (%s), want %s", tt.name, got, detail, tt.want)
		}
	}
}

// One rule for a status on its own: hosts, status and the metrics count
// with it.
func TestStandingOf(t *testing.T) {
	tests := []struct {
		st   Status
		want Standing
	}{
		{Status{Hash: "a", DesiredHash: "a", ActiveState: "active"}, Converged},
		{Status{Hash: "a", DesiredHash: "b", ActiveState: "active"}, Pending},
		{Status{Hash: "a", DesiredHash: "a", ActiveState: "active", Verifying: true}, Pending},
		{Status{Hash: "a", DesiredHash: "a", ActiveState: "active", Confirming: true}, Pending},
		{Status{Hash: "a", DesiredHash: "a", ActiveState: "active", Job: "restart"}, Pending},
		{Status{Hash: "a", DesiredHash: "a", ActiveState: "activating"}, Pending},
		{Status{Hash: "a", DesiredHash: "a", Action: ActionWaitSlot}, Pending},
		{Status{Hash: "a", DesiredHash: "a", Error: "boom"}, Failed},
	}
	for _, tt := range tests {
		if got := StandingOf(tt.st); got != tt.want {
			t.Errorf("%+v: %s, want %s", tt.st, got, tt.want)
		}
	}
}
