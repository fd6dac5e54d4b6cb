package reconcile

import (
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
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

func p2H(content string) string { return Hash([]byte(content)) }

// p2File is a file on disk with its content (so the planner can classify
// against it).
func p2File(content string) LocalFile {
	return LocalFile{Exists: true, Hash: p2H(content), Content: []byte(content)}
}

// p2Files maps path -> hash for path, content pairs.
func p2Files(pairs ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i < len(pairs); i += 2 {
		m[pairs[i]] = p2H(pairs[i+1])
	}
	return m
}

func p2Key(pairs ...string) string { return KeyOf(p2Files(pairs...)) }

func p2Blobs(contents ...string) map[string][]byte {
	m := map[string][]byte{}
	for _, c := range contents {
		m[p2H(c)] = []byte(c)
	}
	return m
}

// p2Host is a host whose unit directory holds the given path, content
// pairs, all written by agentd (on disk and in the manifest).
func p2Host(units map[string]UnitState, pairs ...string) Current {
	c := Current{
		Host: HostFacts{Files: map[string]LocalFile{}, Units: units},
		Memory: Memory{
			Managed: map[string]Owned{},
			Records: map[string]UnitRecord{},
			Blobs:   map[string][]byte{},
		},
	}
	for i := 0; i < len(pairs); i += 2 {
		c.Host.Files[pairs[i]] = p2File(pairs[i+1])
		c.Memory.Managed[pairs[i]] = Owned{Hash: p2H(pairs[i+1])}
	}
	return c
}

func p2St(st UnitState, f func(*UnitState)) UnitState {
	f(&st)
	return st
}

func p2FileState(st UnitState, state string) UnitState {
	st.UnitFileState = state
	return st
}

type p2Want struct {
	kind    Kind
	job     Job
	writes  map[string]string // path -> hash of every write; nil: nothing written
	removes []string
	forget  []string
	enable  bool
	disable bool
	drop    bool // DropRecord
	adopt   bool
	refuse  string // Refuse.ContentKey; "" for no refusal
	own     Ownership
	// errLike must be in Err; with it empty, Err must be empty (but for KindBlocked).
	errLike    string
	reasonLike string
	// eff is checked when checkEff: Effective (nil included).
	eff      map[string]string
	checkEff bool
}

type p2Case struct {
	name    string
	entries []Entry
	cur     func() Current
	unit    string // default hello.service
	want    p2Want
}

func TestPlan2Transitions(t *testing.T) {
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

// p2Check compares an action with what a case wants, and holds every
// action to the message rules.
func p2Check(t *testing.T, a Action, w p2Want) {
	t.Helper()
	if a.Kind != w.kind {
		t.Fatalf("kind = %s (reason %q, err %q), want %s", a.Kind, a.Reason, a.Err, w.kind)
	}
	if a.Steps.Job != w.job {
		t.Errorf("job = %s, want %s", a.Steps.Job, w.job)
	}
	got := map[string]string{}
	for _, f := range a.Steps.Writes {
		got[f.Path] = f.Hash
		if Hash(f.Content) != f.Hash {
			t.Errorf("write %s: content hashes to %s, not %s", f.Path, short(Hash(f.Content)), short(f.Hash))
		}
	}
	if w.writes == nil {
		w.writes = map[string]string{}
	}
	if !maps.Equal(got, w.writes) {
		t.Errorf("writes = %v, want %v", got, w.writes)
	}
	if !slices.Equal(a.Steps.Removes, w.removes) {
		t.Errorf("removes = %v, want %v", a.Steps.Removes, w.removes)
	}
	if !slices.Equal(a.Steps.Forget, w.forget) {
		t.Errorf("forget = %v, want %v", a.Steps.Forget, w.forget)
	}
	if a.Steps.Enable != w.enable || a.Steps.Disable != w.disable {
		t.Errorf("enable/disable = %v/%v, want %v/%v", a.Steps.Enable, a.Steps.Disable, w.enable, w.disable)
	}
	if a.Record.DropRecord != w.drop {
		t.Errorf("drop record = %v, want %v", a.Record.DropRecord, w.drop)
	}
	if a.Record.Adopt != w.adopt {
		t.Errorf("adopt = %v, want %v", a.Record.Adopt, w.adopt)
	}
	switch {
	case w.refuse == "" && a.Record.Refuse != nil:
		t.Errorf("refuse = %+v, want none", *a.Record.Refuse)
	case w.refuse != "" && a.Record.Refuse == nil:
		t.Errorf("no refusal, want one for %s", w.refuse)
	case w.refuse != "" && a.Record.Refuse.ContentKey != w.refuse:
		t.Errorf("refusal of %s, want %s", a.Record.Refuse.ContentKey, w.refuse)
	}
	if w.own != OwnNone && a.Own != w.own {
		t.Errorf("own = %q, want %q", a.Own, w.own)
	}
	if w.errLike != "" && !strings.Contains(a.Err, w.errLike) {
		t.Errorf("err = %q, want it to mention %q", a.Err, w.errLike)
	}
	if w.errLike == "" && a.Kind != KindBlocked && a.Err != "" {
		t.Errorf("err = %q, want none", a.Err)
	}
	if w.reasonLike != "" && !strings.Contains(a.Reason, w.reasonLike) {
		t.Errorf("reason = %q, want it to mention %q", a.Reason, w.reasonLike)
	}
	if w.checkEff && (w.eff == nil) != (a.Record.Effective == nil) || w.checkEff && !maps.Equal(a.Record.Effective, w.eff) {
		t.Errorf("effective = %v, want %v", a.Record.Effective, w.eff)
	}
	p2Messages(t, a)
}

// p2Messages: an action that does something says why, and says it cleanly.
func p2Messages(t *testing.T, a Action) {
	t.Helper()
	why := a.Reason
	if a.Kind == KindBlocked {
		why = a.Err
	}
	if a.Kind != KindNone && strings.TrimSpace(why) == "" {
		t.Errorf("%s with no reason (reason %q, err %q)", a.Kind, a.Reason, a.Err)
	}
	for _, m := range []string{a.Reason, a.Err} {
		if strings.Contains(m, "  ") || strings.Contains(m, "failed failed") {
			t.Errorf("message %q has a doubled word or space", m)
		}
	}
}

func TestPlan2CanReload(t *testing.T) {
	unitF := func(c string) File { return File{Path: "web.service", Content: []byte(c)} }
	drop := func(name, c string) File { return File{Path: "web.service.d/" + name, Content: []byte(c)} }
	for _, tc := range []struct {
		name  string
		unit  string
		files []File
		want  bool
	}{
		{name: "service with ExecReload in the unit file", files: []File{unitF(p2Reload)}, want: true},
		{name: "service without ExecReload", files: []File{unitF(svc)}},
		{name: "service with ExecReload in a drop-in", files: []File{unitF(svc), drop("r.conf", p2ReloadDrop)}, want: true},
		{name: "ExecReload reset by an empty assignment in a later drop-in", files: []File{unitF(p2Reload), drop("z.conf", p2ResetDrop)}},
		{name: "reset then set again in a later drop-in", files: []File{unitF(p2Reload), drop("z.conf", p2ResetDrop+"ExecReload=/bin/true\n")}, want: true},
		{name: "reset, then set in a still later drop-in", files: []File{unitF(p2Reload), drop("a.conf", p2ResetDrop), drop("b.conf", p2ReloadDrop)}, want: true},
		{name: "ExecReload outside [Service] does not count", files: []File{unitF(svc + "[X-Other]\nExecReload=/bin/true\n")}},
		{name: "no files", files: nil},
		{name: "mount: always (remount)", unit: "data.mount", files: []File{{Path: "data.mount", Content: []byte("[Mount]\nWhat=/dev/a\nWhere=/data\n")}}, want: true},
		{name: "mount without files", unit: "data.mount", want: true},
		{name: "timer: never", unit: "t.timer", files: []File{{Path: "t.timer", Content: []byte("[Timer]\nOnCalendar=daily\n[Service]\nExecReload=/bin/true\n")}}},
		{name: "socket: never", unit: "web.socket", files: []File{{Path: "web.socket", Content: []byte("[Socket]\nListenStream=80\n")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unit := tc.unit
			if unit == "" {
				unit = "web.service"
			}
			if got := CanReload(unit, tc.files); got != tc.want {
				t.Fatalf("CanReload = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPlan2ReloadNeeded(t *testing.T) {
	owed := UnitState{LoadState: "loaded", ActiveState: "active", NeedDaemonReload: true}
	for _, tc := range []struct {
		name string
		plan []Action
		cur  Current
		want bool
		why  string
	}{
		{name: "interrupted pass owes a reload", cur: Current{
			Memory: Memory{Intent: Intent{Reload: true}},
		}, want: true, why: "interrupted"},
		{name: "a job on a unit with NeedDaemonReload", plan: []Action{{Unit: p2Hello, Kind: KindRestart, Steps: Steps{Job: JobRestart}}},
			cur: Current{Host: HostFacts{Units: map[string]UnitState{p2Hello: owed}}}, want: true, why: "NeedDaemonReload"},
		{name: "NeedDaemonReload without a job", plan: []Action{{Unit: p2Hello, Kind: KindNone}},
			cur: Current{Host: HostFacts{Units: map[string]UnitState{p2Hello: owed}}}},
		{name: "a job, nothing owed", plan: []Action{{Unit: p2Hello, Kind: KindStart, Steps: Steps{Job: JobStart}}},
			cur: Current{Host: HostFacts{Units: map[string]UnitState{p2Hello: running}}}},
		{name: "files written", plan: []Action{{Unit: p2Hello, Kind: KindUpdate, Steps: Steps{Writes: []DesiredFile{{Path: p2Hello}}}}}, want: true, why: "changed"},
		{name: "files removed", plan: []Action{{Unit: p2Hello, Kind: KindRemove, Steps: Steps{Removes: []string{p2Hello}}}}, want: true, why: "changed"},
		{name: "enable only", plan: []Action{{Unit: p2Hello, Kind: KindUpdate, Steps: Steps{Enable: true}}}, want: true},
		{name: "disable only", plan: []Action{{Unit: p2Hello, Kind: KindUpdate, Steps: Steps{Disable: true}}}, want: true},
		{name: "instance marker forgotten only", plan: []Action{{Unit: "web@1.service", Kind: KindRemove, Steps: Steps{Forget: []string{"web@1.service"}}}}},
		{name: "nothing", plan: []Action{{Unit: p2Hello}}, cur: Current{
			Memory: Memory{Intent: Intent{Jobs: map[string]string{p2Hello: "k"}}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := ReloadNeeded(tc.plan, tc.cur)
			if got != tc.want {
				t.Fatalf("ReloadNeeded = %v (%q), want %v", got, why, tc.want)
			}
			if got && (why == "" || !strings.Contains(why, tc.why)) {
				t.Errorf("why = %q, want it to mention %q", why, tc.why)
			}
			if !got && why != "" {
				t.Errorf("why = %q with no reload", why)
			}
		})
	}
}

func TestPlan2JobDeadline(t *testing.T) {
	const s = uint64(time.Second / time.Microsecond)
	inf := uint64(math.MaxUint64)
	for _, tc := range []struct {
		name        string
		job         Job
		start, stop uint64
		want        time.Duration
	}{
		{name: "start 7s", job: JobStart, start: 7 * s, stop: 90 * s, want: 7*time.Second + 15*time.Second},
		{name: "start infinity", job: JobStart, start: inf, stop: 90 * s, want: 0},
		{name: "start ignores an infinite stop timeout", job: JobStart, start: 7 * s, stop: inf, want: 22 * time.Second},
		{name: "restart sums stop and start", job: JobRestart, start: 7 * s, stop: 10 * s, want: 32 * time.Second},
		{name: "restart with infinite stop", job: JobRestart, start: 7 * s, stop: inf, want: 0},
		{name: "restart with infinite start", job: JobRestart, start: inf, stop: 10 * s, want: 0},
		{name: "stop uses the stop timeout", job: JobStop, start: 7 * s, stop: 10 * s, want: 25 * time.Second},
		{name: "stop ignores an infinite start timeout", job: JobStop, start: inf, stop: 10 * s, want: 25 * time.Second},
		{name: "stop infinity", job: JobStop, start: 7 * s, stop: inf, want: 0},
		{name: "reload uses the start timeout", job: JobReload, start: 7 * s, stop: 10 * s, want: 22 * time.Second},
		{name: "timer start (no timeouts): default", job: JobStart, want: 90*time.Second + 15*time.Second},
		{name: "timer stop (no timeouts): default", job: JobStop, want: 105 * time.Second},
		{name: "timer restart (no timeouts): both defaults", job: JobRestart, want: 195 * time.Second},
		{name: "sub-second timeout", job: JobStart, start: 500_000, want: 15*time.Second + 500*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := JobDeadline(tc.job, UnitState{TimeoutStartUSec: tc.start, TimeoutStopUSec: tc.stop})
			if got != tc.want {
				t.Fatalf("JobDeadline(%s, start=%d, stop=%d) = %s, want %s", tc.job, tc.start, tc.stop, got, tc.want)
			}
		})
	}
}
