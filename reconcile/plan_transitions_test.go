package reconcile

import (
	"slices"
	"strings"
	"testing"
)

// Transition tables for Plan: ownership and removal, foreign drop-ins,
// enablement, ExecReload, jobs in flight, interrupted passes, refused loads
// and rollbacks. Every case names the transition it covers.

// Contents shared by the tables below (svc is plan_test.go's v1).
var (
	p2V2          = strings.Replace(svc, "1000", "1001", 1)
	p2Install     = svc + "[Install]\nWantedBy=default.target\n"
	p2NoEnable    = p2Install + "[X-Agentd]\nEnable=no\n"
	p2Reload      = svc + "ExecReload=/bin/kill -HUP $MAINPID\n"
	p2DropEnv     = "[Service]\nEnvironment=A=1\n"
	p2DropDesc    = "[Unit]\nDescription=patched by ops\n"
	p2DropStopSt  = p2DropEnv + "[X-Agentd]\nOnChange=stop-start\n"
	p2ReloadDrop  = "[Service]\nExecReload=/bin/true\n"
	p2ResetDrop   = "[Service]\nExecReload=\n"
	p2FailReason  = "restart failed: exit-code (status 3)"
	p2RefusedLoad = UnitState{LoadState: "bad-setting", LoadError: "Unit hello.service has a bad unit file setting.", ActiveState: "active", SubState: "running", Ran: true}
)

const (
	p2Own   = "own.service"
	p2OwnD  = "own.service.d/x.conf"
	p2Hello = "hello.service"
	p2Env   = "hello.service.d/env.conf"
)

func TestPlanTransitions(t *testing.T) {
	h1, h2 := p2H(svc), p2H(p2V2)
	k1, k2 := p2Key(p2Hello, svc), p2Key(p2Hello, p2V2)
	cases := []p2Case{
		// Ownership and removal.
		{name: "removed owned unit running: stop first, nothing removed or disabled",
			cur:  func() Current { return p2Host(map[string]UnitState{p2Hello: enabled(running)}, p2Hello, svc) },
			want: p2Want{kind: KindRemove, job: JobStop, own: OwnFile}},
		{name: "removed owned unit deactivating: still a stop",
			cur: func() Current {
				return p2Host(map[string]UnitState{p2Hello: p2St(running, func(s *UnitState) { s.ActiveState, s.SubState = "deactivating", "stop-sigterm" })}, p2Hello, svc)
			},
			want: p2Want{kind: KindRemove, job: JobStop, own: OwnFile}},
		{name: "removed owned unit stopped and enabled: disable, remove file, drop record",
			cur:  func() Current { return p2Host(map[string]UnitState{p2Hello: enabled(stopped)}, p2Hello, svc) },
			want: p2Want{kind: KindRemove, removes: []string{p2Hello}, disable: true, drop: true, own: OwnFile}},
		{name: "removed owned unit stopped and disabled: remove file, no disable",
			cur: func() Current {
				return p2Host(map[string]UnitState{p2Hello: p2FileState(stopped, "disabled")}, p2Hello, svc)
			},
			want: p2Want{kind: KindRemove, removes: []string{p2Hello}, drop: true, own: OwnFile}},
		{name: "removed owned unit failed and static: unit file and drop-in removed, no disable",
			cur: func() Current {
				return p2Host(map[string]UnitState{p2Hello: p2FileState(failed, "static")}, p2Hello, svc, p2Env, p2DropEnv)
			},
			want: p2Want{kind: KindRemove, removes: []string{p2Hello, p2Env}, drop: true, own: OwnFile}},
		{name: "removed owned instance running: stop, no file touched", unit: "web@1.service",
			cur: func() Current {
				c := p2Host(map[string]UnitState{"web@1.service": enabled(running)})
				c.Memory.Managed["web@1.service"] = instance
				return c
			},
			want: p2Want{kind: KindRemove, job: JobStop, own: OwnInstance}},
		{name: "removed owned instance stopped: forget the marker, no file removed, never disabled", unit: "web@1.service",
			cur: func() Current {
				c := p2Host(map[string]UnitState{"web@1.service": enabled(stopped)})
				c.Memory.Managed["web@1.service"] = instance
				return c
			},
			want: p2Want{kind: KindRemove, forget: []string{"web@1.service"}, drop: true, own: OwnInstance}},
		{name: "removed drop-in on a foreign running unit: drop-in removed, unit never stopped or disabled", unit: p2Own,
			cur:  func() Current { return p2Host(map[string]UnitState{p2Own: enabled(running)}, p2OwnD, p2DropEnv) },
			want: p2Want{kind: KindRemove, removes: []string{p2OwnD}, own: OwnDropIns}},
		{name: "foreign drop-in gone with an effect on the active unit: restart", unit: p2Own,
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Own: enabled(running)})
				c.Memory.Records[p2Own] = UnitRecord{Own: OwnDropIns, Applied: p2Files(p2OwnD, p2DropEnv)}
				c.Memory.Blobs = p2Blobs(p2DropEnv)
				return c
			},
			want: p2Want{kind: KindRestart, job: JobRestart, own: OwnDropIns, eff: map[string]string{}, checkEff: true, reasonLike: "Environment"}},
		{name: "foreign drop-in gone, content not kept, unit active: restart to be safe", unit: p2Own,
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Own: running})
				c.Memory.Records[p2Own] = UnitRecord{Own: OwnDropIns, Applied: p2Files(p2OwnD, p2DropEnv)}
				return c
			},
			want: p2Want{kind: KindRestart, job: JobRestart, own: OwnDropIns, reasonLike: "not kept"}},
		{name: "foreign drop-in gone, cosmetic ([Unit] Description): nothing to do, drop record", unit: p2Own,
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Own: running})
				c.Memory.Records[p2Own] = UnitRecord{Own: OwnDropIns, Applied: p2Files(p2OwnD, p2DropDesc)}
				c.Memory.Blobs = p2Blobs(p2DropDesc)
				return c
			},
			want: p2Want{kind: KindNone, drop: true, own: OwnDropIns}},
		{name: "foreign drop-in gone, unit inactive: nothing to do, drop record", unit: p2Own,
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Own: stopped})
				c.Memory.Records[p2Own] = UnitRecord{Own: OwnDropIns, Applied: p2Files(p2OwnD, p2DropEnv)}
				c.Memory.Blobs = p2Blobs(p2DropEnv)
				return c
			},
			want: p2Want{kind: KindNone, drop: true, own: OwnDropIns}},
		{name: "removal with a stop job in flight: wait",
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: enabled(running)}, p2Hello, svc)
				c.Memory.Jobs = map[string]InFlight{p2Hello: {Job: JobStop}}
				return c
			},
			want: p2Want{kind: KindWait, own: OwnFile, reasonLike: "stop job in progress"}},

		// A oneshot that ran to completion and was unloaded by systemd
		// (Ran false again) is not run a second time when the agent restarts.
		{name: "oneshot without RemainAfterExit, seen run to completion, forgotten by systemd: left alone",
			entries: []Entry{entry(p2Hello, svc)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2St(fresh, func(s *UnitState) { s.Type = "oneshot" })}, p2Hello, svc)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc), Good: p2Files(p2Hello, svc), Own: OwnFile}
				return c
			},
			want: p2Want{kind: KindNone, own: OwnFile}},
		{name: "oneshot with RemainAfterExit not run since the manager started: started",
			entries: []Entry{entry(p2Hello, svc)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2St(fresh, func(s *UnitState) { s.Type, s.RemainAfterExit = "oneshot", true })}, p2Hello, svc)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc), Good: p2Files(p2Hello, svc), Own: OwnFile}
				return c
			},
			want: p2Want{kind: KindStart, job: JobStart, own: OwnFile, reasonLike: "not started since the manager started"}},
		// systemd unloads a stopped unit nothing refers to, and forgets it
		// ran; the record says under which manager the agent started it.
		{name: "started by the agent under this manager, stopped and unloaded (an operator's stop): left alone",
			entries: []Entry{entry(p2Hello, svc)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: fresh}, p2Hello, svc)
				c.Host.Manager = "boot-a/123"
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc), Good: p2Files(p2Hello, svc), Own: OwnFile, StartedIn: "boot-a/123"}
				return c
			},
			want: p2Want{kind: KindNone, own: OwnFile}},
		{name: "started by the agent under another manager (a reboot), not run since: started",
			entries: []Entry{entry(p2Hello, svc)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: fresh}, p2Hello, svc)
				c.Host.Manager = "boot-b/456"
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc), Good: p2Files(p2Hello, svc), Own: OwnFile, StartedIn: "boot-a/123"}
				return c
			},
			want: p2Want{kind: KindStart, job: JobStart, own: OwnFile, reasonLike: "not started since the manager started"}},
		{name: "oneshot never seen to complete, not run since the manager started: started",
			entries: []Entry{entry(p2Hello, svc)},
			cur: func() Current {
				return p2Host(map[string]UnitState{p2Hello: p2St(fresh, func(s *UnitState) { s.Type = "oneshot" })}, p2Hello, svc)
			},
			want: p2Want{kind: KindStart, job: JobStart, own: OwnFile, reasonLike: "not started since the manager started"}},

		// Drop-ins on a unit agentd did not install.
		{name: "foreign drop-in new, unit inactive and never run: written, not started", unit: p2Own,
			entries: []Entry{entry(p2OwnD, p2DropEnv)},
			cur:     func() Current { return p2Host(map[string]UnitState{p2Own: fresh}) },
			want:    p2Want{kind: KindUpdate, writes: p2Files(p2OwnD, p2DropEnv), own: OwnDropIns, reasonLike: "not started"}},
		{name: "foreign drop-in new with an effect, unit active: restart", unit: p2Own,
			entries: []Entry{entry(p2OwnD, p2DropEnv)},
			cur:     func() Current { return p2Host(map[string]UnitState{p2Own: enabled(running)}) },
			want:    p2Want{kind: KindRestart, job: JobRestart, writes: p2Files(p2OwnD, p2DropEnv), own: OwnDropIns}},
		{name: "foreign drop-in new, cosmetic, unit active: update and adopt", unit: p2Own,
			entries: []Entry{entry(p2OwnD, p2DropDesc)},
			cur:     func() Current { return p2Host(map[string]UnitState{p2Own: running}) },
			want:    p2Want{kind: KindUpdate, writes: p2Files(p2OwnD, p2DropDesc), own: OwnDropIns, adopt: true}},
		{name: "foreign drop-in OnChange=stop-start, unit active: restart, never a stop", unit: p2Own,
			entries: []Entry{entry(p2OwnD, p2DropStopSt)},
			cur:     func() Current { return p2Host(map[string]UnitState{p2Own: running}) },
			want:    p2Want{kind: KindRestart, job: JobRestart, writes: p2Files(p2OwnD, p2DropStopSt), own: OwnDropIns}},

		// Enablement follows the unit file both ways, only for OwnFile.
		{name: "want enabled, disabled: enable, none becomes update",
			entries: []Entry{entry(p2Hello, p2Install)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2FileState(running, "disabled")}, p2Hello, p2Install)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, p2Install)}
				return c
			},
			want: p2Want{kind: KindUpdate, enable: true, own: OwnFile, reasonLike: "enable"}},
		{name: "want enabled, operator-stopped and disabled: enable, not started",
			entries: []Entry{entry(p2Hello, p2Install)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2FileState(stopped, "disabled")}, p2Hello, p2Install)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, p2Install)}
				return c
			},
			want: p2Want{kind: KindUpdate, enable: true, own: OwnFile, reasonLike: "enable"}},
		{name: "Enable=no and enabled: disable",
			entries: []Entry{entry(p2Hello, p2NoEnable)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: enabled(running)}, p2Hello, p2NoEnable)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, p2NoEnable)}
				return c
			},
			want: p2Want{kind: KindUpdate, disable: true, own: OwnFile, reasonLike: "disable"}},
		{name: "no [Install] and enabled: disable",
			entries: []Entry{entry(p2Hello, svc)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: enabled(running)}, p2Hello, svc)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				return c
			},
			want: p2Want{kind: KindUpdate, disable: true, own: OwnFile, reasonLike: "disable"}},
		{name: "want enabled, static: untouched",
			entries: []Entry{entry(p2Hello, p2Install)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2FileState(running, "static")}, p2Hello, p2Install)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, p2Install)}
				return c
			},
			want: p2Want{kind: KindNone, own: OwnFile}},
		{name: "no [Install], indirect: untouched",
			entries: []Entry{entry(p2Hello, svc)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2FileState(running, "indirect")}, p2Hello, svc)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				return c
			},
			want: p2Want{kind: KindNone, own: OwnFile}},
		{name: "want enabled, masked: untouched",
			entries: []Entry{entry(p2Hello, p2Install)},
			cur: func() Current {
				st := p2FileState(running, "masked")
				st.LoadState = "masked"
				c := p2Host(map[string]UnitState{p2Hello: st}, p2Hello, p2Install)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, p2Install)}
				return c
			},
			want: p2Want{kind: KindNone, own: OwnFile}},
		{name: "template with [Install], disabled: never enabled", unit: "web@.service",
			entries: []Entry{entry("web@.service", p2Install)},
			cur: func() Current {
				return p2Host(map[string]UnitState{"web@.service": p2FileState(fresh, "disabled")}, "web@.service", p2Install)
			},
			want: p2Want{kind: KindNone, own: OwnFile}},
		{name: "template without [Install], enabled: never disabled", unit: "web@.service",
			entries: []Entry{entry("web@.service", svc)},
			cur: func() Current {
				return p2Host(map[string]UnitState{"web@.service": p2FileState(fresh, "enabled")}, "web@.service", svc)
			},
			want: p2Want{kind: KindNone, own: OwnFile}},
		{name: "instance with its own file and [Install], disabled: never enabled", unit: "web@1.service",
			entries: []Entry{entry("web@1.service", p2Install)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{"web@1.service": p2FileState(running, "disabled")}, "web@1.service", p2Install)
				c.Memory.Records["web@1.service"] = UnitRecord{Applied: p2Files("web@1.service", p2Install)}
				return c
			},
			want: p2Want{kind: KindNone, own: OwnFile}},
		{name: "instance from an empty key, template has [Install]: never enabled", unit: "web@2.service",
			entries: []Entry{entry("web@.service", p2Install), entry("web@2.service", "")},
			cur: func() Current {
				c := p2Host(map[string]UnitState{"web@2.service": p2FileState(running, "disabled")}, "web@.service", p2Install)
				c.Memory.Managed["web@2.service"] = instance
				c.Memory.Records["web@2.service"] = UnitRecord{Applied: p2Files("web@.service", p2Install)}
				return c
			},
			want: p2Want{kind: KindNone, own: OwnInstance}},

		// ExecReload.
		{name: "ExecReload added on a running unit: update, not restart",
			entries: []Entry{entry(p2Hello, p2Reload)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, svc)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				return c
			},
			want: p2Want{kind: KindUpdate, writes: p2Files(p2Hello, p2Reload), adopt: true, own: OwnFile}},
		{name: "ExecReload removed on a running unit: update, not restart",
			entries: []Entry{entry(p2Hello, svc)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2St(running, func(s *UnitState) { s.CanReload = true })}, p2Hello, p2Reload)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, p2Reload)}
				return c
			},
			want: p2Want{kind: KindUpdate, writes: p2Files(p2Hello, svc), adopt: true, own: OwnFile}},
		{name: "ExecReload added, file already on disk: none, adopted",
			entries: []Entry{entry(p2Hello, p2Reload)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, p2Reload)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				c.Memory.Blobs = p2Blobs(svc)
				return c
			},
			want: p2Want{kind: KindNone, adopt: true, own: OwnFile}},
		{name: "ExecReload added by a drop-in on a running unit: update",
			entries: []Entry{entry(p2Hello, svc), entry("hello.service.d/reload.conf", p2ReloadDrop)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, svc)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				return c
			},
			want: p2Want{kind: KindUpdate, writes: p2Files("hello.service.d/reload.conf", p2ReloadDrop), adopt: true, own: OwnFile}},
		{name: "ExecReload reset by an empty drop-in on a running unit: update",
			entries: []Entry{entry(p2Hello, p2Reload), entry("hello.service.d/reset.conf", p2ResetDrop)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, p2Reload)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, p2Reload)}
				return c
			},
			want: p2Want{kind: KindUpdate, writes: p2Files("hello.service.d/reset.conf", p2ResetDrop), adopt: true, own: OwnFile}},
		{name: "OnChange=reload, new version lacks ExecReload: update, cannot reload, not recorded",
			entries: []Entry{entry(p2Hello, p2V2+"[X-Agentd]\nOnChange=reload\n")},
			cur: func() Current {
				old := p2Reload + "[X-Agentd]\nOnChange=reload\n"
				c := p2Host(map[string]UnitState{p2Hello: p2St(running, func(s *UnitState) { s.CanReload = true })}, p2Hello, old)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, old)}
				return c
			},
			want: p2Want{kind: KindUpdate, writes: p2Files(p2Hello, p2V2+"[X-Agentd]\nOnChange=reload\n"), own: OwnFile,
				errLike: "cannot reload", eff: nil, checkEff: true}},
		{name: "OnChange=reload, new version adds ExecReload: reload",
			entries: []Entry{entry(p2Hello, strings.Replace(p2Reload, "1000", "1001", 1)+"[X-Agentd]\nOnChange=reload\n")},
			cur: func() Current {
				old := svc + "[X-Agentd]\nOnChange=reload\n"
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, old)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, old)}
				return c
			},
			want: p2Want{kind: KindReload, job: JobReload, writes: p2Files(p2Hello, strings.Replace(p2Reload, "1000", "1001", 1)+"[X-Agentd]\nOnChange=reload\n"), own: OwnFile}},
		{name: "OnChange=reload-or-restart, new version can reload though systemd says no: reload",
			entries: []Entry{entry(p2Hello, strings.Replace(p2Reload, "1000", "1001", 1)+"[X-Agentd]\nOnChange=reload-or-restart\n")},
			cur: func() Current {
				old := svc + "[X-Agentd]\nOnChange=reload-or-restart\n"
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, old)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, old)}
				return c
			},
			want: p2Want{kind: KindReload, job: JobReload, writes: p2Files(p2Hello, strings.Replace(p2Reload, "1000", "1001", 1)+"[X-Agentd]\nOnChange=reload-or-restart\n"), own: OwnFile}},
		{name: "OnChange=reload-or-restart, new version cannot reload though systemd says yes: restart",
			entries: []Entry{entry(p2Hello, p2V2+"[X-Agentd]\nOnChange=reload-or-restart\n")},
			cur: func() Current {
				old := p2Reload + "[X-Agentd]\nOnChange=reload-or-restart\n"
				c := p2Host(map[string]UnitState{p2Hello: p2St(running, func(s *UnitState) { s.CanReload = true })}, p2Hello, old)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, old)}
				return c
			},
			want: p2Want{kind: KindRestart, job: JobRestart, writes: p2Files(p2Hello, p2V2+"[X-Agentd]\nOnChange=reload-or-restart\n"), own: OwnFile}},

		// Jobs in flight.
		{name: "job in flight for the same content: wait, nothing written",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, p2V2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				c.Memory.Blobs = p2Blobs(svc)
				c.Memory.Jobs = map[string]InFlight{p2Hello: {Job: JobRestart, ContentKey: k2}}
				return c
			},
			want: p2Want{kind: KindWait, own: OwnFile, reasonLike: "restart job in progress"}},
		{name: "job in flight for other content: a restart replaces it",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, svc)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				c.Memory.Jobs = map[string]InFlight{p2Hello: {Job: JobRestart, ContentKey: k1}}
				return c
			},
			want: p2Want{kind: KindRestart, job: JobRestart, writes: map[string]string{p2Hello: h2}, own: OwnFile}},

		// An interrupted pass is finished.
		{name: "interrupted start, files on disk, no Applied, unit stopped: start",
			entries: []Entry{entry(p2Hello, svc)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: stopped}, p2Hello, svc)
				c.Memory.Intent = Intent{Jobs: map[string]string{p2Hello: k1}}
				return c
			},
			want: p2Want{kind: KindStart, job: JobStart, own: OwnFile}},
		{name: "interrupted restart, Applied is the older version: restart",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, p2V2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				c.Memory.Blobs = p2Blobs(svc)
				c.Memory.Intent = Intent{Jobs: map[string]string{p2Hello: k2}}
				return c
			},
			want: p2Want{kind: KindRestart, job: JobRestart, own: OwnFile}},
		// ... unless the job ran before the agent died: the unit started
		// after systemd last loaded the (desired) files.
		{name: "interrupted restart that ran (started after the files were loaded): adopted, not restarted again",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2St(running, func(s *UnitState) { s.InactiveExitMono = 2000 })}, p2Hello, p2V2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				c.Memory.Blobs = p2Blobs(svc)
				c.Memory.Intent = Intent{Jobs: map[string]string{p2Hello: k2}}
				c.Host.Loaded = 1000
				return c
			},
			want: p2Want{kind: KindNone, own: OwnFile, adopt: true, reasonLike: "did not finish ran"}},
		{name: "interrupted restart, the unit started before the files were loaded: restart",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2St(running, func(s *UnitState) { s.InactiveExitMono = 900 })}, p2Hello, p2V2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				c.Memory.Blobs = p2Blobs(svc)
				c.Memory.Intent = Intent{Jobs: map[string]string{p2Hello: k2}}
				c.Host.Loaded = 1000
				return c
			},
			want: p2Want{kind: KindRestart, job: JobRestart, own: OwnFile}},
		{name: "interrupted restart, started after a load but a newer file is on disk (NeedDaemonReload): restart",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2St(running, func(s *UnitState) { s.InactiveExitMono, s.NeedDaemonReload = 2000, true })}, p2Hello, p2V2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				c.Memory.Blobs = p2Blobs(svc)
				c.Memory.Intent = Intent{Jobs: map[string]string{p2Hello: k2}}
				c.Host.Loaded = 1000
				return c
			},
			want: p2Want{kind: KindRestart, job: JobRestart, own: OwnFile}},
		{name: "interrupted restart, no Applied record, unit running: restart (what it runs is unknown)",
			entries: []Entry{entry(p2Hello, svc)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, svc)
				c.Memory.Intent = Intent{Jobs: map[string]string{p2Hello: k1}}
				return c
			},
			want: p2Want{kind: KindRestart, job: JobRestart, own: OwnFile}},
		{name: "interrupted start of a new instance, marker recorded, unit failed: start again", unit: "web@1.service",
			entries: []Entry{entry("web@.service", svc), entry("web@1.service", "")},
			cur: func() Current {
				c := p2Host(map[string]UnitState{"web@1.service": failed}, "web@.service", svc)
				c.Memory.Managed["web@1.service"] = instance
				c.Memory.Intent = Intent{Jobs: map[string]string{"web@1.service": p2Key("web@.service", svc)}}
				return c
			},
			want: p2Want{kind: KindStart, job: JobStart, own: OwnInstance}},
		{name: "no intent, files on disk, no Applied, unit stopped by the operator: left alone",
			entries: []Entry{entry(p2Hello, svc)},
			cur:     func() Current { return p2Host(map[string]UnitState{p2Hello: stopped}, p2Hello, svc) },
			want:    p2Want{kind: KindNone, own: OwnFile}},

		// Refused loads.
		{name: "refused load of a new version: blocked, old content written back",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2RefusedLoad}, p2Hello, p2V2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				c.Memory.Blobs = p2Blobs(svc)
				return c
			},
			want: p2Want{kind: KindBlocked, writes: map[string]string{p2Hello: h1}, refuse: k2, own: OwnFile, errLike: "refused to load"}},
		{name: "refused load of a new unit: blocked, the new file removed",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				st := p2RefusedLoad
				st.ActiveState, st.SubState, st.Ran = "inactive", "dead", false
				return p2Host(map[string]UnitState{p2Hello: st}, p2Hello, p2V2)
			},
			want: p2Want{kind: KindBlocked, removes: []string{p2Hello}, refuse: k2, own: OwnFile, errLike: "bad-setting"}},
		{name: "refused load of a new drop-in: blocked, the drop-in removed, unit file kept",
			entries: []Entry{entry(p2Hello, svc), entry(p2Env, p2DropEnv)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: p2RefusedLoad}, p2Hello, svc, p2Env, p2DropEnv)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				c.Memory.Blobs = p2Blobs(svc)
				return c
			},
			want: p2Want{kind: KindBlocked, removes: []string{p2Env}, refuse: p2Key(p2Hello, svc, p2Env, p2DropEnv), own: OwnFile}},
		{name: "refused content already remembered: blocked without writes",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, svc)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				c.Memory.Refused = map[string]Refusal{p2Hello: {ContentKey: k2, Reason: "systemd refused to load hello.service (bad-setting): bad"}}
				return c
			},
			want: p2Want{kind: KindBlocked, own: OwnFile, errLike: "refused"}},
		{name: "bad-setting with NeedDaemonReload: not a refusal, the change goes on",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				st := p2RefusedLoad
				st.NeedDaemonReload = true
				c := p2Host(map[string]UnitState{p2Hello: st}, p2Hello, p2V2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc)}
				c.Memory.Blobs = p2Blobs(svc)
				return c
			},
			want: p2Want{kind: KindRestart, job: JobRestart, own: OwnFile}},

		// Rollback of a failed change.
		{name: "failed version: roll back to the previous one, restart onto it",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: failed}, p2Hello, p2V2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, p2V2), Previous: p2Files(p2Hello, svc), Failed: k2, FailReason: p2FailReason, FailedOp: "restart"}
				c.Memory.Blobs = p2Blobs(svc, p2V2)
				return c
			},
			want: p2Want{kind: KindRollback, job: JobRestart, writes: map[string]string{p2Hello: h1}, own: OwnFile,
				eff: map[string]string{p2Hello: h1}, checkEff: true, reasonLike: "rolling back"}},
		{name: "failed version added a drop-in: rollback removes it",
			entries: []Entry{entry(p2Hello, p2V2), entry(p2Env, p2DropEnv)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: failed}, p2Hello, p2V2, p2Env, p2DropEnv)
				applied := p2Files(p2Hello, p2V2, p2Env, p2DropEnv)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: applied, Previous: p2Files(p2Hello, svc), Failed: KeyOf(applied), FailReason: p2FailReason, FailedOp: "restart"}
				c.Memory.Blobs = p2Blobs(svc, p2V2, p2DropEnv)
				return c
			},
			want: p2Want{kind: KindRollback, job: JobRestart, writes: map[string]string{p2Hello: h1}, removes: []string{p2Env}, own: OwnFile,
				eff: map[string]string{p2Hello: h1}, checkEff: true}},
		{name: "rollback job in flight: the files are back, it is not started again",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: failed}, p2Hello, svc)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, p2V2), Previous: p2Files(p2Hello, svc), Failed: k2, FailReason: p2FailReason, FailedOp: "restart"}
				c.Memory.Blobs = p2Blobs(svc, p2V2)
				c.Memory.Jobs = map[string]InFlight{p2Hello: {Job: JobRestart, ContentKey: k2, Rollback: true}}
				return c
			},
			want: p2Want{kind: KindWait, own: OwnFile, reasonLike: "rollback restart job in progress"}},
		{name: "failed version already rolled back: blocked, no writes",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, svc)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, svc), Previous: p2Files(p2Hello, svc), Failed: k2, FailReason: p2FailReason, FailedOp: "restart"}
				c.Memory.Blobs = p2Blobs(svc)
				return c
			},
			want: p2Want{kind: KindBlocked, own: OwnFile, errLike: "not retried"}},
		{name: "failed version, Rollback=no: blocked, no writes",
			entries: []Entry{entry(p2Hello, p2V2+"[X-Agentd]\nRollback=no\n")},
			cur: func() Current {
				v2 := p2V2 + "[X-Agentd]\nRollback=no\n"
				c := p2Host(map[string]UnitState{p2Hello: failed}, p2Hello, v2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, v2), Previous: p2Files(p2Hello, svc), Failed: p2Key(p2Hello, v2), FailReason: p2FailReason, FailedOp: "restart"}
				c.Memory.Blobs = p2Blobs(svc, v2)
				return c
			},
			want: p2Want{kind: KindBlocked, own: OwnFile, errLike: p2FailReason}},
		{name: "failed version, previous content not kept: blocked, no writes",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: failed}, p2Hello, p2V2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, p2V2), Previous: p2Files(p2Hello, svc), Failed: k2, FailReason: p2FailReason, FailedOp: "restart"}
				return c
			},
			want: p2Want{kind: KindBlocked, own: OwnFile, errLike: "not kept"}},
		{name: "failed reload: files put back only, no job, adopted",
			entries: []Entry{entry(p2Hello, p2V2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, p2V2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, p2V2), Previous: p2Files(p2Hello, svc), Failed: k2, FailReason: "reload failed: exit-code", FailedOp: "reload"}
				c.Memory.Blobs = p2Blobs(svc, p2V2)
				return c
			},
			want: p2Want{kind: KindRollback, writes: map[string]string{p2Hello: h1}, adopt: true, own: OwnFile,
				eff: map[string]string{p2Hello: h1}, checkEff: true}},
	}
	if len(cases) < 35 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			unit := tc.unit
			if unit == "" {
				unit = p2Hello
			}
			plan := Plan(Desire(Snapshot{Entries: tc.entries}), tc.cur())
			i := slices.IndexFunc(plan, func(a Action) bool { return a.Unit == unit })
			if i < 0 {
				t.Fatalf("no action for %s in %+v", unit, plan)
			}
			p2Check(t, plan[i], tc.want)
		})
	}
}
