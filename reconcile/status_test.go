package reconcile

import (
	"testing"
	"time"
)

// unitStatus turns the plan's action, the results, the ledger and what was
// observed into a unit's status: one case per rule.
func TestUnitStatus(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	file := &DesiredFile{Path: "web.service", Hash: "h1", Source: "group:web", Revision: 7}
	started := &DesiredUnit{Name: "web.service", File: file, Policy: Policy{State: StateStarted}}
	key := ContentKey(started)
	running := &UnitState{LoadState: "loaded", ActiveState: "active", SubState: "running", MainPID: 42}
	failed := &UnitState{LoadState: "loaded", ActiveState: "failed", SubState: "failed", Result: "exit-code", ExitStatus: 3}
	applied := map[string]string{"web.service": "h1"}
	urlProbe := Probes{URL: "http://a/"}
	cases := []struct {
		name string
		in   statusInput
		want Status
	}{{
		name: "converged and healthy",
		in: statusInput{Desired: started, Action: Action{ContentKey: key}, Hash: "h1", State: running,
			Record: UnitRecord{Applied: applied, Good: applied}},
		want: Status{Hash: "h1", DesiredHash: "h1", Source: "group:web", Revision: 7, LoadState: "loaded",
			ActiveState: "active", SubState: "running", MainPID: 42, Health: "healthy"},
	}, {
		name: "new content not on disk yet: no revision",
		in:   statusInput{Desired: started, Hash: "h0", DropIns: map[string]string{"web.service.d/a.conf": "d1"}},
		want: Status{Hash: "h0", DesiredHash: "h1", Source: "group:web", DropIns: map[string]string{"web.service.d/a.conf": "d1"}},
	}, {
		name: "failed unit that should run",
		in:   statusInput{Desired: started, Hash: "h1", State: failed},
		want: Status{Hash: "h1", DesiredHash: "h1", Source: "group:web", Revision: 7, LoadState: "loaded",
			ActiveState: "failed", SubState: "failed", UnitResult: "exit-code", Error: "unit failed (result: exit-code, exit status 3)"},
	}, {
		name: "failed but verifying: no verdict yet",
		in:   statusInput{Desired: started, Hash: "h1", State: failed, Verifying: true},
		want: Status{Hash: "h1", DesiredHash: "h1", Source: "group:web", Revision: 7, LoadState: "loaded",
			ActiveState: "failed", SubState: "failed", UnitResult: "exit-code", Verifying: true, Health: "verifying"},
	}, {
		name: "job in flight",
		in: statusInput{Desired: started, Hash: "h1", State: running, Job: &Action{Kind: KindRestart, Steps: Steps{Job: JobRestart}},
			Last: &outcome{action: "start", result: "done"}},
		want: Status{Hash: "h1", DesiredHash: "h1", Source: "group:web", Revision: 7, LoadState: "loaded",
			ActiveState: "active", SubState: "running", MainPID: 42, Job: JobRestart.String(), Action: "restart", Result: "running"},
	}, {
		name: "rollback in flight",
		in:   statusInput{Desired: started, Job: &Action{Kind: KindRollback, Steps: Steps{Job: JobRestart}}},
		want: Status{DesiredHash: "h1", Source: "group:web", Job: JobRestart.String(), Action: ActionRollingBack, Result: "running"},
	}, {
		name: "waiting for a slot",
		in:   statusInput{Desired: started, Action: Action{Kind: KindWait, Gate: Gate{On: WaitSlot}}},
		want: Status{DesiredHash: "h1", Source: "group:web", Action: ActionWaitSlot, Result: "waiting"},
	}, {
		name: "held by a halted rollout",
		in:   statusInput{Desired: started, Action: Action{Kind: KindWait, Gate: Gate{On: WaitHeld}, Err: heldText("x failed it")}},
		want: Status{DesiredHash: "h1", Source: "group:web", Action: ActionHeld, Result: "waiting", Error: "held: x failed it"},
	}, {
		name: "blocked",
		in:   statusInput{Desired: started, Action: Action{Kind: KindBlocked, Err: "bad value"}},
		want: Status{DesiredHash: "h1", Source: "group:web", Action: ActionBlocked, Result: "blocked", Error: "bad value"},
	}, {
		name: "blocked after a rollback keeps the rollback's word",
		in: statusInput{Desired: started, Action: Action{Kind: KindBlocked, Err: "failed here"},
			Last: &outcome{action: ActionRolledBack, result: "done", err: "rolled back"}},
		want: Status{DesiredHash: "h1", Source: "group:web", Action: ActionRolledBack, Result: "done", Error: "failed here"},
	}, {
		name: "last outcome's error for the content wanted",
		in:   statusInput{Desired: started, Action: Action{ContentKey: key}, Last: &outcome{action: "start", result: "failed", err: "boom", contentKey: key}},
		want: Status{DesiredHash: "h1", Source: "group:web", Action: "start", Result: "failed", Error: "boom"},
	}, {
		name: "last outcome's error for older content is not shown",
		in:   statusInput{Desired: started, Action: Action{ContentKey: key}, Last: &outcome{action: "start", result: "failed", err: "boom", contentKey: "old"}},
		want: Status{DesiredHash: "h1", Source: "group:web", Action: "start", Result: "failed"},
	}, {
		name: "failed enable",
		in:   statusInput{Desired: started, EnableErr: "enable: no"},
		want: Status{DesiredHash: "h1", Source: "group:web", Error: "enable: no"},
	}, {
		name: "OnChange=none keeps the old content running",
		in: statusInput{Desired: started, Action: Action{ContentKey: key, Policy: Policy{OnChange: "none"}}, Hash: "h1", State: running,
			Record: UnitRecord{Applied: map[string]string{"web.service": "h0"}}},
		want: Status{Hash: "h1", DesiredHash: "h1", Source: "group:web", Revision: 7, LoadState: "loaded",
			ActiveState: "active", SubState: "running", MainPID: 42, PendingRestart: true},
	}, {
		name: "probe passing",
		in: statusInput{Desired: started, Action: Action{ContentKey: key}, Hash: "h1", State: running,
			Record: UnitRecord{Applied: applied, Good: applied}, Probes: urlProbe, Probe: ProbeState{Rounds: 4, Last: "HealthURL http://a/: 200"}},
		want: Status{Hash: "h1", DesiredHash: "h1", Source: "group:web", Revision: 7, LoadState: "loaded",
			ActiveState: "active", SubState: "running", MainPID: 42, Health: "healthy", Probe: "HealthURL http://a/: 200"},
	}, {
		name: "probe failing below HealthRetries: still healthy",
		in: statusInput{Desired: started, Action: Action{ContentKey: key}, Hash: "h1", State: running,
			Record: UnitRecord{Applied: applied, Good: applied}, Probes: urlProbe, Probe: ProbeState{Rounds: 4, Failures: 2, Last: "HealthURL http://a/: 500 (want 2xx)"}},
		want: Status{Hash: "h1", DesiredHash: "h1", Source: "group:web", Revision: 7, LoadState: "loaded",
			ActiveState: "active", SubState: "running", MainPID: 42, Health: "healthy", Probe: "HealthURL http://a/: 500 (want 2xx), 2 failures in a row (HealthRetries=3)"},
	}, {
		name: "probe failing after the window: unhealthy, not rolled back",
		in: statusInput{Desired: started, Action: Action{ContentKey: key}, Hash: "h1", State: running,
			Record: UnitRecord{Applied: applied, Good: applied}, Probes: urlProbe, Probe: ProbeState{Rounds: 9, Failures: 5, Last: "HealthURL http://a/: 500 (want 2xx)"}},
		want: Status{Hash: "h1", DesiredHash: "h1", Source: "group:web", Revision: 7, LoadState: "loaded",
			ActiveState: "active", SubState: "running", MainPID: 42, Health: "unhealthy",
			Probe: "HealthURL http://a/: 500 (want 2xx), 3 failures in a row (HealthRetries=3)",
			Error: "health probe failing: HealthURL http://a/: 500 (want 2xx), 3 failures in a row (HealthRetries=3) (after the version passed its HealthySec window: not rolled back)"},
	}, {
		name: "probe failing inside the window: verifying, the verdict says",
		in: statusInput{Desired: started, Action: Action{ContentKey: key}, Hash: "h1", State: running, Verifying: true,
			Record: UnitRecord{Applied: applied}, Probes: urlProbe, Probe: ProbeState{Rounds: 1, Failures: 1, Last: "HealthURL http://a/: 500 (want 2xx)"}},
		want: Status{Hash: "h1", DesiredHash: "h1", Source: "group:web", Revision: 7, LoadState: "loaded",
			ActiveState: "active", SubState: "running", MainPID: 42, Health: "verifying", Verifying: true,
			Probe: "HealthURL http://a/: 500 (want 2xx), 1 failure in a row (HealthRetries=3)"},
	}, {
		name: "instance runs its template's hash",
		in:   statusInput{Unit: "w@1.service", Record: UnitRecord{Applied: map[string]string{"w@.service": "t1"}}},
		want: Status{Unit: "w@1.service", RunsHash: "t1"},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.in.Unit == "" {
				c.in.Unit = "web.service"
			}
			if c.want.Unit == "" {
				c.want.Unit = "web.service"
			}
			c.in.Now, c.want.UpdatedAt = now, now
			if got := unitStatus(c.in); !sameStatus(got, c.want) || !got.UpdatedAt.Equal(now) {
				t.Errorf("unitStatus:\n got %+v\nwant %+v", got, c.want)
			}
		})
	}
}
