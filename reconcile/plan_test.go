package reconcile

import (
	"strings"
	"testing"
)

const svc = "[Unit]\nDescription=hello\n[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"

func entry(unit, value string) Entry {
	return Entry{Scope: ScopeHost, Unit: unit, Value: []byte(value)}
}
func groupEntry(g, unit, value string) Entry {
	return Entry{Scope: ScopeGroup, Group: g, Unit: unit, Value: []byte(value)}
}

var (
	running = UnitState{LoadState: "loaded", ActiveState: "active", SubState: "running", Ran: true}
	stopped = UnitState{LoadState: "loaded", ActiveState: "inactive", SubState: "dead", Ran: true}
	fresh   = UnitState{LoadState: "loaded", ActiveState: "inactive", SubState: "dead"}
	failed  = UnitState{LoadState: "loaded", ActiveState: "failed", SubState: "failed", Ran: true, Result: "exit-code"}
	absent  = UnitState{LoadState: "not-found", ActiveState: "inactive", SubState: "dead"}
)

func onDisk(content string) LocalFile { return LocalFile{Exists: true, Hash: Hash([]byte(content))} }

func TestPlan(t *testing.T) {
	svc2 := svc + "Environment=V=2\n"
	withInstall := svc + "[Install]\nWantedBy=default.target\n"
	tests := []struct {
		name     string
		entries  []Entry
		files    map[string]LocalFile
		managed  map[string]string
		units    map[string]UnitState
		refused  map[string]Refusal
		started  map[string]string
		want     Kind
		wantUnit string // default hello.service
		writes   int
		removes  int
		enable   bool
		disable  bool
		errLike  string
	}{
		{name: "new unit is written and started", entries: []Entry{entry("hello.service", svc)},
			units: map[string]UnitState{"hello.service": absent}, want: KindStart, writes: 1},
		{name: "new unit with [Install] is enabled", entries: []Entry{entry("hello.service", withInstall)},
			units: map[string]UnitState{"hello.service": absent}, want: KindStart, writes: 1, enable: true},
		{name: "same content running is left alone", entries: []Entry{entry("hello.service", svc)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)}, managed: map[string]string{"hello.service": Hash([]byte(svc))},
			units: map[string]UnitState{"hello.service": running}, want: KindNone},
		{name: "changed content of running unit restarts", entries: []Entry{entry("hello.service", svc2)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)}, managed: map[string]string{"hello.service": Hash([]byte(svc))},
			units: map[string]UnitState{"hello.service": running}, want: KindRestart, writes: 1},
		{name: "changed content of stopped unit starts it", entries: []Entry{entry("hello.service", svc2)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)}, managed: map[string]string{"hello.service": Hash([]byte(svc))},
			units: map[string]UnitState{"hello.service": stopped}, want: KindStart, writes: 1},
		{name: "operator-stopped unit with same content stays stopped", entries: []Entry{entry("hello.service", svc)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)}, managed: map[string]string{"hello.service": Hash([]byte(svc))},
			units: map[string]UnitState{"hello.service": stopped}, want: KindNone},
		{name: "failed unit with same content is not retried", entries: []Entry{entry("hello.service", svc)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)}, managed: map[string]string{"hello.service": Hash([]byte(svc))},
			units: map[string]UnitState{"hello.service": failed}, want: KindNone},
		{name: "unit not run since boot is started", entries: []Entry{entry("hello.service", svc)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)}, managed: map[string]string{"hello.service": Hash([]byte(svc))},
			units: map[string]UnitState{"hello.service": fresh}, want: KindStart},
		{name: "unloaded unit this agent already started stays stopped", entries: []Entry{entry("hello.service", svc)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)}, managed: map[string]string{"hello.service": Hash([]byte(svc))},
			started: map[string]string{"hello.service": "hello.service=" + Hash([]byte(svc)) + ";"},
			units:   map[string]UnitState{"hello.service": fresh}, want: KindNone},
		{name: "missing managed file is rewritten", entries: []Entry{entry("hello.service", svc)},
			managed: map[string]string{"hello.service": Hash([]byte(svc))},
			units:   map[string]UnitState{"hello.service": running}, want: KindRestart, writes: 1},
		{name: "unmanaged file is never overwritten", entries: []Entry{entry("hello.service", svc2)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)},
			units: map[string]UnitState{"hello.service": running}, want: KindBlocked, errLike: "unmanaged file"},
		{name: "unmanaged identical file is still not adopted", entries: []Entry{entry("hello.service", svc)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)},
			units: map[string]UnitState{"hello.service": running}, want: KindBlocked, errLike: "unmanaged file"},
		{name: "non-regular file blocks", entries: []Entry{entry("hello.service", svc)},
			files: map[string]LocalFile{"hello.service": {Exists: true, Err: "not a regular file (symlink)"}},
			units: map[string]UnitState{"hello.service": running}, want: KindBlocked, errLike: "not a regular file"},
		{name: "removed from registry: a running unit is stopped and disabled first", files: map[string]LocalFile{"hello.service": onDisk(svc)},
			managed: map[string]string{"hello.service": Hash([]byte(svc))},
			units:   map[string]UnitState{"hello.service": enabled(running)}, want: KindRemove, removes: 0},
		{name: "removed from registry: once stopped it is disabled and its file goes", files: map[string]LocalFile{"hello.service": onDisk(svc)},
			managed: map[string]string{"hello.service": Hash([]byte(svc))},
			units:   map[string]UnitState{"hello.service": enabled(stopped)}, want: KindRemove, removes: 1, disable: true},
		{name: "unmanaged unit absent from registry is not touched", files: map[string]LocalFile{"other.service": onDisk(svc)},
			units: map[string]UnitState{"other.service": running}, want: -1, wantUnit: "other.service"},
		{name: "refused content is not retried", entries: []Entry{entry("hello.service", svc2)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)}, managed: map[string]string{"hello.service": Hash([]byte(svc))},
			refused: map[string]Refusal{"hello.service": {ContentKey: "hello.service=" + Hash([]byte(svc2)) + ";", Reason: "systemd refused"}},
			units:   map[string]UnitState{"hello.service": running}, want: KindBlocked, errLike: "systemd refused"},
		{name: "refusal of older content does not block new content", entries: []Entry{entry("hello.service", svc2)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)}, managed: map[string]string{"hello.service": Hash([]byte(svc))},
			refused: map[string]Refusal{"hello.service": {ContentKey: "old", Reason: "systemd refused"}},
			units:   map[string]UnitState{"hello.service": running}, want: KindRestart, writes: 1},
		{name: "invalid name blocks", entries: []Entry{entry("hel lo.service", svc)}, want: KindBlocked, wantUnit: "hel%20lo.service", errLike: "not allowed"},
		{name: "name with .. blocks", entries: []Entry{entry("..service", svc)}, want: KindBlocked, wantUnit: "%2E%2Eservice", errLike: "must not contain"},
		{name: "name with slash blocks", entries: []Entry{entry("../../etc/passwd", svc)}, want: KindBlocked, wantUnit: "%2E%2E%2F%2E%2E%2Fetc%2Fpasswd", errLike: "must not contain"},
		{name: "unsupported type blocks", entries: []Entry{entry("hello.device", svc)}, want: KindBlocked, wantUnit: "hello.device", errLike: "unsupported unit type"},
		{name: "oversized value blocks", entries: []Entry{entry("hello.service", svc+strings.Repeat("#", MaxValueSize))}, want: KindBlocked, errLike: "over the 256 KiB"},
		{name: "invalid utf8 blocks", entries: []Entry{entry("hello.service", svc+"\xff\xfe")}, want: KindBlocked, errLike: "UTF-8"},
		{name: "NUL byte blocks", entries: []Entry{entry("hello.service", svc+"\x00")}, want: KindBlocked, errLike: "NUL"},
		{name: "unknown policy key blocks", entries: []Entry{entry("hello.service", svc+"[X-Agentd]\nStat=stopped\n")}, want: KindBlocked, errLike: "unknown key Stat="},
		{name: "State=stopped stops a running unit", entries: []Entry{entry("hello.service", svc+"[X-Agentd]\nState=stopped\n")},
			files: map[string]LocalFile{"hello.service": onDisk(svc + "[X-Agentd]\nState=stopped\n")}, managed: map[string]string{"hello.service": "x"},
			units: map[string]UnitState{"hello.service": running}, want: KindStop},
		{name: "State=present only writes", entries: []Entry{entry("hello.service", svc+"[X-Agentd]\nState=present\n")},
			units: map[string]UnitState{"hello.service": absent}, want: KindUpdate, writes: 1},
		{name: "host key overrides group key", entries: []Entry{groupEntry("web", "hello.service", svc2), entry("hello.service", svc)},
			files: map[string]LocalFile{"hello.service": onDisk(svc)}, managed: map[string]string{"hello.service": "x"},
			units: map[string]UnitState{"hello.service": running}, want: KindNone},
		{name: "two groups agreeing is fine", entries: []Entry{groupEntry("a", "hello.service", svc), groupEntry("b", "hello.service", svc)},
			units: map[string]UnitState{"hello.service": absent}, want: KindStart, writes: 1},
		{name: "two groups disagreeing is a conflict", entries: []Entry{groupEntry("a", "hello.service", svc), groupEntry("b", "hello.service", svc2)},
			units: map[string]UnitState{"hello.service": absent}, want: KindBlocked, errLike: "conflict: groups a, b"},
		{name: "drop-in change restarts", entries: []Entry{entry("hello.service", svc), entry("hello.service.d/env.conf", "[Service]\nEnvironment=A=1\n")},
			files:   map[string]LocalFile{"hello.service": onDisk(svc)},
			managed: map[string]string{"hello.service": "x"},
			units:   map[string]UnitState{"hello.service": running}, want: KindRestart, writes: 1},
		{name: "managed drop-in gone from registry is removed", entries: []Entry{entry("hello.service", svc)},
			files:   map[string]LocalFile{"hello.service": onDisk(svc), "hello.service.d/env.conf": onDisk("[Service]\n")},
			managed: map[string]string{"hello.service": "x", "hello.service.d/env.conf": "y"},
			units:   map[string]UnitState{"hello.service": running}, want: KindRestart, removes: 1},
		{name: "template is installed, not started", entries: []Entry{entry("web@.service", svc)}, wantUnit: "web@.service",
			units: map[string]UnitState{"web@.service": absent}, want: KindUpdate, writes: 1},
		{name: "empty instance key starts the instance", entries: []Entry{entry("web@.service", svc), entry("web@1.service", "")}, wantUnit: "web@1.service",
			files: map[string]LocalFile{"web@.service": onDisk(svc)}, managed: map[string]string{"web@.service": "x"},
			units: map[string]UnitState{"web@.service": absent, "web@1.service": fresh}, want: KindStart},
		{name: "empty value for a plain unit blocks", entries: []Entry{entry("hello.service", "")}, want: KindBlocked, errLike: "empty value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur := Current{
				Host:   HostFacts{Files: tt.files, Units: tt.units},
				Memory: Memory{Managed: ownedFiles(tt.managed), Refused: tt.refused, Started: tt.started},
			}
			if cur.Host.Files == nil {
				cur.Host.Files = map[string]LocalFile{}
			}
			plan := Plan(Desire(Snapshot{Entries: tt.entries}), cur)
			unit := tt.wantUnit
			if unit == "" {
				unit = "hello.service"
			}
			var got *Action
			for i := range plan {
				if plan[i].Unit == unit {
					got = &plan[i]
				}
			}
			if tt.want == -1 {
				if got != nil {
					t.Fatalf("plan has %s for an unmanaged unit: %+v", got.Kind, got)
				}
				return
			}
			if got == nil {
				t.Fatalf("no action for %s in %+v", unit, plan)
			}
			if got.Kind != tt.want {
				t.Fatalf("kind = %s (%s %s), want %s", got.Kind, got.Reason, got.Err, tt.want)
			}
			if len(got.Steps.Writes) != tt.writes || len(got.Steps.Removes) != tt.removes {
				t.Errorf("writes/removes = %d/%d, want %d/%d", len(got.Steps.Writes), len(got.Steps.Removes), tt.writes, tt.removes)
			}
			if got.Steps.Enable != tt.enable || got.Steps.Disable != tt.disable {
				t.Errorf("enable/disable = %v/%v, want %v/%v", got.Steps.Enable, got.Steps.Disable, tt.enable, tt.disable)
			}
			if tt.errLike != "" && !strings.Contains(got.Err, tt.errLike) {
				t.Errorf("err = %q, want it to mention %q", got.Err, tt.errLike)
			}
			if tt.want == KindBlocked && (len(got.Steps.Writes) > 0 || len(got.Steps.Removes) > 0) {
				t.Errorf("blocked action touches files: %+v", got)
			}
		})
	}
}

func TestPlanTemplateChangeRollsInstancesOneAtATime(t *testing.T) {
	old, newT := svc, svc+"Environment=V=2\n"
	oldApplied := map[string]string{"web@.service": Hash([]byte(old))}
	entries := []Entry{entry("web@.service", newT), entry("web@1.service", ""), entry("web@2.service", ""), entry("web@3.service", "")}
	cur := Current{
		Host: HostFacts{
			Files: map[string]LocalFile{"web@.service": {Exists: true, Hash: Hash([]byte(old)), Content: []byte(old)}},
			Units: map[string]UnitState{"web@.service": absent, "web@1.service": running, "web@2.service": running, "web@3.service": stopped},
		},
		Memory: Memory{
			Managed: map[string]Owned{"web@.service": {Hash: "x"}, "web@1.service": instance, "web@2.service": instance, "web@3.service": instance},
			Records: map[string]UnitRecord{"web@1.service": {Applied: oldApplied}, "web@2.service": {Applied: oldApplied}, "web@3.service": {Applied: oldApplied}},
		},
	}
	kinds := func() map[string]Kind {
		k := map[string]Kind{}
		for _, a := range Plan(Desire(Snapshot{Entries: entries}), cur) {
			k[a.Unit] = a.Kind
		}
		return k
	}
	// First pass: the template is written, ONE running instance restarts, the other waits.
	want := map[string]Kind{"web@.service": KindUpdate, "web@1.service": KindRestart, "web@2.service": KindWait}
	got := kinds()
	for u, k := range want {
		if got[u] != k {
			t.Errorf("pass 1 %s: %s, want %s", u, got[u], k)
		}
	}
	// web@3 is stopped: started on the new content (not disruptive).
	if got["web@3.service"] != KindStart {
		t.Errorf("pass 1 web@3: %s, want start", got["web@3.service"])
	}
	// While web@1 verifies its health, web@2 still waits.
	cur.Host.Files["web@.service"] = LocalFile{Exists: true, Hash: Hash([]byte(newT)), Content: []byte(newT)}
	cur.Memory.Records["web@1.service"] = UnitRecord{Applied: map[string]string{"web@.service": Hash([]byte(newT))}}
	cur.Memory.Verifying = map[string]bool{"web@1.service": true}
	if k := kinds()["web@2.service"]; k != KindWait {
		t.Errorf("pass 2 web@2 while web@1 verifies: %s, want wait", k)
	}
	// Once web@1 is healthy, web@2 goes.
	cur.Memory.Verifying = nil
	if k := kinds()["web@2.service"]; k != KindRestart {
		t.Errorf("pass 3 web@2: %s, want restart", k)
	}
}

func TestPlanRemovedInstanceIsStoppedNoFileTouched(t *testing.T) {
	cur := Current{
		Memory: Memory{Managed: map[string]Owned{"web@1.service": instance}},
		Host: HostFacts{
			Units: map[string]UnitState{"web@1.service": running},
			Files: map[string]LocalFile{},
		},
	}
	plan := Plan(Desire(Snapshot{}), cur)
	if len(plan) != 1 || plan[0].Kind != KindRemove || len(plan[0].Steps.Removes) != 0 || plan[0].Steps.Disable {
		t.Fatalf("plan = %+v", plan)
	}
}

func TestPlanIsDeterministic(t *testing.T) {
	var entries []Entry
	for _, n := range []string{"c.service", "a.service", "b.service"} {
		entries = append(entries, entry(n, svc))
	}
	cur := Current{
		Host:   HostFacts{Files: map[string]LocalFile{}, Units: map[string]UnitState{}},
		Memory: Memory{Managed: map[string]Owned{}},
	}
	plan := Plan(Desire(Snapshot{Entries: entries}), cur)
	var names []string
	for _, a := range plan {
		names = append(names, a.Unit)
	}
	if strings.Join(names, ",") != "a.service,b.service,c.service" {
		t.Fatalf("order = %v", names)
	}
}

// TestPlanChangeOnRunningUnit covers how a content change reaches an active
// unit: classification × OnChange × unit type.
func TestPlanChangeOnRunningUnit(t *testing.T) {
	const svcReload = "[Service]\nType=exec\nExecStart=/bin/sleep 1000\nExecReload=/bin/true\n"
	tests := []struct {
		name        string
		unit        string
		old, new    string
		canReload   bool
		want        Kind
		enable      bool
		alsoStop    string
		noEffRecord bool // OnChange=none keeps the old Applied record
		writes      int  // 0: the new file is written; -1: nothing is written yet
	}{
		{name: "comment only: update, no restart", old: svc, new: "# hi\n" + svc, want: KindUpdate},
		{name: "Description only: update", old: svc, new: strings.Replace(svc, "hello", "hello world", 1), want: KindUpdate},
		{name: "X-Agentd only: update", old: svc, new: svc + "[X-Agentd]\nHealthySec=1\n", want: KindUpdate},
		{name: "[Install] only: update and re-enable", old: svc + "[Install]\nWantedBy=a.target\n", new: svc + "[Install]\nWantedBy=b.target\n", want: KindUpdate, enable: true},
		{name: "ExecReload only: reload", old: svcReload, new: strings.Replace(svcReload, "/bin/true", "/bin/echo", 1), canReload: true, want: KindReload},
		{name: "ExecStart: restart", old: svc, new: strings.Replace(svc, "1000", "1001", 1), want: KindRestart},
		{name: "OnChange=restart forces restart of a cosmetic change", old: svc + "[X-Agentd]\nOnChange=restart\n", new: "#x\n" + svc + "[X-Agentd]\nOnChange=restart\n", want: KindRestart},
		{name: "OnChange=reload", old: svcReload + "[X-Agentd]\nOnChange=reload\n", new: strings.Replace(svcReload, "1000", "1001", 1) + "[X-Agentd]\nOnChange=reload\n", canReload: true, want: KindReload},
		{name: "OnChange=reload-or-restart that can reload", old: svcReload + "[X-Agentd]\nOnChange=reload-or-restart\n", new: strings.Replace(svcReload, "1000", "1001", 1) + "[X-Agentd]\nOnChange=reload-or-restart\n", canReload: true, want: KindReload},
		{name: "OnChange=reload-or-restart that cannot reload", old: svc + "[X-Agentd]\nOnChange=reload-or-restart\n", new: strings.Replace(svc, "1000", "1001", 1) + "[X-Agentd]\nOnChange=reload-or-restart\n", want: KindRestart},
		{name: "OnChange=stop-start: stop with the old file first", old: svc + "[X-Agentd]\nOnChange=stop-start\n", new: strings.Replace(svc, "1000", "1001", 1) + "[X-Agentd]\nOnChange=stop-start\n", want: KindStopStart, writes: -1, noEffRecord: true},
		{name: "OnChange=none: files only, restart pending", old: svc + "[X-Agentd]\nOnChange=none\n", new: strings.Replace(svc, "1000", "1001", 1) + "[X-Agentd]\nOnChange=none\n", want: KindUpdate, noEffRecord: true},
		{name: "socket: restart, stopping its service", unit: "web.socket", old: "[Socket]\nListenStream=8080\n", new: "[Socket]\nListenStream=8081\n", want: KindRestart, alsoStop: "web.service"},
		{name: "socket with Service=", unit: "web.socket", old: "[Socket]\nListenStream=8080\nService=api.service\n", new: "[Socket]\nListenStream=8081\nService=api.service\n", want: KindRestart, alsoStop: "api.service"},
		{name: "timer: restart", unit: "t.timer", old: "[Timer]\nOnCalendar=daily\n", new: "[Timer]\nOnCalendar=hourly\n", want: KindRestart},
		{name: "path: restart", unit: "p.path", old: "[Path]\nPathExists=/a\n", new: "[Path]\nPathExists=/b\n", want: KindRestart},
		{name: "target: start, never restart", unit: "app.target", old: "[Unit]\nWants=a.service\n", new: "[Unit]\nWants=b.service\n", want: KindStart},
		{name: "slice: daemon-reload only", unit: "app.slice", old: "[Slice]\nCPUWeight=100\n", new: "[Slice]\nCPUWeight=200\n", want: KindUpdate},
		{name: "mount Options: reload", unit: "data.mount", old: "[Mount]\nWhat=/dev/a\nWhere=/data\nOptions=rw\n", new: "[Mount]\nWhat=/dev/a\nWhere=/data\nOptions=ro\n", want: KindReload},
		{name: "mount What: restart", unit: "data.mount", old: "[Mount]\nWhat=/dev/a\nWhere=/data\n", new: "[Mount]\nWhat=/dev/b\nWhere=/data\n", want: KindRestart},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			unit := tt.unit
			if unit == "" {
				unit = "hello.service"
			}
			oldH := Hash([]byte(tt.old))
			st := running
			st.CanReload = tt.canReload
			cur := Current{
				Host: HostFacts{
					Files: map[string]LocalFile{unit: {Exists: true, Hash: oldH, Content: []byte(tt.old)}},
					Units: map[string]UnitState{unit: st},
				},
				Memory: Memory{
					Managed: map[string]Owned{unit: {Hash: oldH}},
					Records: map[string]UnitRecord{unit: {Applied: map[string]string{unit: oldH}}},
				},
			}
			plan := Plan(Desire(Snapshot{Entries: []Entry{entry(unit, tt.new)}}), cur)
			a := plan[0]
			if a.Kind != tt.want {
				t.Fatalf("kind = %s (%s), want %s", a.Kind, a.Reason, tt.want)
			}
			want := 1
			if tt.writes < 0 {
				want = 0
			}
			if len(a.Steps.Writes) != want {
				t.Errorf("writes = %d, want %d", len(a.Steps.Writes), want)
			}
			if a.Steps.Enable != tt.enable {
				t.Errorf("enable = %v, want %v", a.Steps.Enable, tt.enable)
			}
			if tt.alsoStop != "" && (len(a.Steps.AlsoStop) != 1 || a.Steps.AlsoStop[0] != tt.alsoStop) {
				t.Errorf("alsoStop = %v, want %s", a.Steps.AlsoStop, tt.alsoStop)
			}
			if tt.noEffRecord != (a.Record.Effective == nil) {
				t.Errorf("effective record = %v", a.Record.Effective)
			}
		})
	}
}

func TestPlanFailedContentIsHeld(t *testing.T) {
	v2 := strings.Replace(svc, "1000", "1001", 1)
	h1, h2 := Hash([]byte(svc)), Hash([]byte(v2))
	cur := Current{
		Host: HostFacts{
			Files: map[string]LocalFile{"hello.service": {Exists: true, Hash: h1, Content: []byte(svc)}},
			Units: map[string]UnitState{"hello.service": running},
		},
		Memory: Memory{
			Managed: map[string]Owned{"hello.service": {Hash: h1}},
			Records: map[string]UnitRecord{"hello.service": {Applied: map[string]string{"hello.service": h1}, Failed: "hello.service=" + h2 + ";", FailReason: "start failed"}},
		},
	}
	a := Plan(Desire(Snapshot{Entries: []Entry{entry("hello.service", v2)}}), cur)[0]
	if a.Kind != KindBlocked || !strings.Contains(a.Err, "start failed; not retried") {
		t.Fatalf("got %s %q", a.Kind, a.Err)
	}
	v3 := strings.Replace(svc, "1000", "1002", 1)
	if a := Plan(Desire(Snapshot{Entries: []Entry{entry("hello.service", v3)}}), cur)[0]; a.Kind != KindRestart {
		t.Fatalf("new content after a rollback: %s, want restart", a.Kind)
	}
}

func TestPlanMaxUnavailableAndHalts(t *testing.T) {
	v1 := svc + "[X-Agentd]\nMaxUnavailable=1\n"
	v2 := strings.Replace(v1, "1000", "1001", 1)
	h1 := Hash([]byte(v1))
	base := func() Current {
		return Current{
			Host: HostFacts{
				Files: map[string]LocalFile{"hello.service": {Exists: true, Hash: h1, Content: []byte(v1)}},
				Units: map[string]UnitState{"hello.service": running},
			},
			Memory: Memory{
				Managed: map[string]Owned{"hello.service": {Hash: h1}},
				Records: map[string]UnitRecord{"hello.service": {Applied: map[string]string{"hello.service": h1}}},
			},
		}
	}
	group := []Entry{groupEntry("web", "hello.service", v2)}
	// A group's restart waits for a slot, writing nothing before it.
	a := Plan(Desire(Snapshot{Entries: group}), base())[0]
	if a.Kind != KindWait || a.Gate.On != WaitSlot || len(a.Steps.Writes) != 0 || a.Scope != "groups/web" {
		t.Fatalf("without a slot: %+v", a)
	}
	// With the slot: restart.
	cur := base()
	cur.Fleet.Slots = map[string]string{"hello.service": Hash([]byte(v2))}
	if a := Plan(Desire(Snapshot{Entries: group}), cur)[0]; a.Kind != KindRestart || len(a.Steps.Writes) != 1 {
		t.Fatalf("with a slot: %s", a.Kind)
	}
	// A host's own key needs no slot: one host, nothing to coordinate.
	if a := Plan(Desire(Snapshot{Entries: []Entry{entry("hello.service", v2)}}), base())[0]; a.Kind != KindRestart {
		t.Fatalf("host key: %s", a.Kind)
	}
	// A start of a stopped unit is not disruptive: no slot.
	cur = base()
	cur.Host.Units["hello.service"] = stopped
	if a := Plan(Desire(Snapshot{Entries: group}), cur)[0]; a.Kind != KindStart {
		t.Fatalf("start: %s", a.Kind)
	}
	// A halt for this version holds the host on the old one.
	cur = base()
	halt := Halt{Scope: "groups/web", Unit: "hello.service", Hash: Hash([]byte(v2)), Host: "h9", Reason: "exit status 3"}
	cur.Fleet.Halts = map[string]Halt{"hello.service": halt}
	a = Plan(Desire(Snapshot{Entries: group}), cur)[0]
	if a.Kind != KindWait || !strings.HasPrefix(a.Err, "held:") || !strings.Contains(a.Err, "h9") || len(a.Steps.Writes) != 0 {
		t.Fatalf("halted: %+v", a)
	}
	// New content resumes the rollout.
	v3 := strings.Replace(v1, "1000", "1002", 1)
	if a := Plan(Desire(Snapshot{Entries: []Entry{groupEntry("web", "hello.service", v3)}}), cur)[0]; a.Kind != KindWait || a.Gate.On != WaitSlot {
		t.Fatalf("new content after a halt: %+v", a)
	}
	// A host already on the halted version is not disturbed.
	cur.Memory.Records["hello.service"] = UnitRecord{Applied: map[string]string{"hello.service": Hash([]byte(v2))}}
	cur.Host.Files["hello.service"] = LocalFile{Exists: true, Hash: Hash([]byte(v2)), Content: []byte(v2)}
	if a := Plan(Desire(Snapshot{Entries: group}), cur)[0]; a.Kind != KindNone {
		t.Fatalf("host already on the version: %s", a.Kind)
	}
}

func enabled(st UnitState) UnitState {
	st.UnitFileState = "enabled"
	return st
}

// A service whose socket starts or restarts in the same plan runs its job
// after the socket's; a service without a job, or beside a socket without
// one, waits for nothing.
func TestOrderSocketServices(t *testing.T) {
	plan := []Action{
		{Unit: "a.service", Steps: Steps{Job: JobRestart}},
		{Unit: "a.socket", Steps: Steps{Job: JobRestart, AlsoStop: []string{"a.service"}}},
		{Unit: "b.service", Steps: Steps{Job: JobNone}},
		{Unit: "b.socket", Steps: Steps{Job: JobRestart, AlsoStop: []string{"b.service"}}},
		{Unit: "c.service", Steps: Steps{Job: JobStart}},
		{Unit: "c.socket", Steps: Steps{Job: JobNone}},
		{Unit: "d.service", Steps: Steps{Job: JobRestart}},
		{Unit: "e.socket", Steps: Steps{Job: JobRestart, AlsoStop: []string{"d.service"}}},
		{Unit: "f.service", Steps: Steps{Job: JobStart}},
		{Unit: "f.socket", Steps: Steps{Job: JobStart}},
		{Unit: "g.timer", Steps: Steps{Job: JobStart}},
		{Unit: "g.service", Steps: Steps{Job: JobStart}},
	}
	desired := map[string]*DesiredUnit{"e.socket": {File: &DesiredFile{Content: []byte("[Socket]\nService=d.service\n")}}}
	orderSocketServices(plan, desired)
	want := map[string]string{"a.service": "a.socket", "d.service": "e.socket", "f.service": "f.socket"}
	for _, a := range plan {
		if a.Steps.After != want[a.Unit] {
			t.Errorf("%s: After %q, want %q", a.Unit, a.Steps.After, want[a.Unit])
		}
		if a.Steps.After != "" && !strings.Contains(a.Reason, "after "+a.Steps.After+"'s") {
			t.Errorf("%s: reason %q does not say it waits for %s (sync --dry-run shows it)", a.Unit, a.Reason, a.Steps.After)
		}
	}
}

// Issue 29, case 4: the registry holds a drop-in of a unit but no longer
// the unit file the agent installed (an rm raced by a put of the drop-in,
// etcdctl). The unit is removed as any removed unit — stopped, then
// disabled and its file deleted — and the drop-in is only written or kept:
// never a start, restart or reload of a unit without its file, which
// systemd answers with "Unit dd.service not found". A unit systemd has
// from elsewhere (a vendor unit in /usr/lib: loaded) still gets the job its
// drop-in needs; one it does not have (not-found) gets none.
func TestPlanDropInsWithoutTheirUnit(t *testing.T) {
	const (
		dd   = "dd.service"
		ddX  = "dd.service.d/x.conf"
		envB = "[Service]\nEnvironment=A=2\n"
	)
	notFound := func(st UnitState) UnitState {
		st.LoadState, st.LoadError = "not-found", "Unit dd.service not found."
		return st
	}
	installed := func(st UnitState) Current {
		c := p2Host(map[string]UnitState{dd: st}, dd, svc, ddX, p2DropEnv)
		c.Memory.Records[dd] = UnitRecord{Own: OwnFile, Applied: p2Files(dd, svc, ddX, p2DropEnv), Good: p2Files(dd, svc, ddX, p2DropEnv)}
		c.Memory.Blobs = p2Blobs(svc, p2DropEnv)
		return c
	}
	cases := []p2Case{
		{name: "unit file gone, drop-in stays, unit running: stop only, no file touched",
			entries: []Entry{entry(ddX, p2DropEnv)}, cur: func() Current { return installed(enabled(running)) },
			want: p2Want{kind: KindRemove, job: JobStop, own: OwnFile, reasonLike: "stopping"}},
		{name: "unit file gone, drop-in stays, unit deactivating: still a stop",
			entries: []Entry{entry(ddX, p2DropEnv)},
			cur: func() Current {
				return installed(p2St(running, func(s *UnitState) { s.ActiveState, s.SubState = "deactivating", "stop-sigterm" }))
			},
			want: p2Want{kind: KindRemove, job: JobStop, own: OwnFile}},
		{name: "unit file gone, drop-in stays, unit stopped and enabled: disable, delete the unit file, keep the drop-in, drop the record",
			entries: []Entry{entry(ddX, p2DropEnv)}, cur: func() Current { return installed(enabled(stopped)) },
			want: p2Want{kind: KindRemove, removes: []string{dd}, disable: true, drop: true, own: OwnFile, reasonLike: "no job"}},
		{name: "unit file gone, drop-in changed, unit stopped: the drop-in written, the unit file deleted, no job",
			entries: []Entry{entry(ddX, envB)}, cur: func() Current { return installed(p2FileState(failed, "disabled")) },
			want: p2Want{kind: KindRemove, writes: p2Files(ddX, envB), removes: []string{dd}, drop: true, own: OwnFile}},
		{name: "unit file gone, drop-in changed, unit running: stop first, nothing written yet",
			entries: []Entry{entry(ddX, envB)}, cur: func() Current { return installed(running) },
			want: p2Want{kind: KindRemove, job: JobStop, own: OwnFile}},
		{name: "unit file gone, a stop job in flight: wait",
			entries: []Entry{entry(ddX, p2DropEnv)},
			cur: func() Current {
				c := installed(running)
				c.Memory.Jobs = map[string]InFlight{dd: {Job: JobStop}}
				return c
			},
			want: p2Want{kind: KindWait, own: OwnFile, reasonLike: "stop job in progress"}},
		{name: "unit file gone and the unit not-found but still running: stop, never a restart",
			entries: []Entry{entry(ddX, envB)}, cur: func() Current { return installed(notFound(running)) },
			want: p2Want{kind: KindRemove, job: JobStop, own: OwnFile}},
		{name: "drop-in kept after its unit went, unit not-found: nothing to do",
			entries: []Entry{entry(ddX, p2DropEnv)},
			cur:     func() Current { return p2Host(map[string]UnitState{dd: notFound(absent)}, ddX, p2DropEnv) },
			want:    p2Want{kind: KindNone, own: OwnDropIns}},
		{name: "drop-in changed on a not-found unit: written, no job",
			entries: []Entry{entry(ddX, envB)},
			cur:     func() Current { return p2Host(map[string]UnitState{dd: notFound(absent)}, ddX, p2DropEnv) },
			want:    p2Want{kind: KindUpdate, writes: p2Files(ddX, envB), own: OwnDropIns, reasonLike: "not-found", eff: nil, checkEff: true}},
		{name: "drop-in new on a not-found unit that runs (its file deleted by hand): written, no restart",
			entries: []Entry{entry(ddX, envB)},
			cur:     func() Current { return p2Host(map[string]UnitState{dd: notFound(running)}) },
			want:    p2Want{kind: KindUpdate, writes: p2Files(ddX, envB), own: OwnDropIns, reasonLike: "no job", eff: nil, checkEff: true}},
		{name: "drop-in gone from a not-found unit that runs: nothing, drop the record",
			cur: func() Current {
				c := p2Host(map[string]UnitState{dd: notFound(running)})
				c.Memory.Records[dd] = UnitRecord{Own: OwnDropIns, Applied: p2Files(ddX, p2DropEnv)}
				c.Memory.Blobs = p2Blobs(p2DropEnv)
				return c
			},
			want: p2Want{kind: KindNone, drop: true, own: OwnDropIns}},
		{name: "drop-in new on a vendor unit systemd has (loaded, running): still restarted",
			entries: []Entry{entry(ddX, envB)},
			cur:     func() Current { return p2Host(map[string]UnitState{dd: running}) },
			want:    p2Want{kind: KindRestart, job: JobRestart, writes: p2Files(ddX, envB), own: OwnDropIns}},
		{name: "drop-in new on a vendor unit systemd has, stopped: written, not started",
			entries: []Entry{entry(ddX, envB)},
			cur:     func() Current { return p2Host(map[string]UnitState{dd: stopped}) },
			want:    p2Want{kind: KindUpdate, writes: p2Files(ddX, envB), own: OwnDropIns, reasonLike: "not started"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan := Plan(Desire(Snapshot{Entries: tc.entries}), tc.cur())
			var got []Action
			for _, a := range plan {
				if a.Unit == dd {
					got = append(got, a)
				}
			}
			if len(got) != 1 {
				t.Fatalf("%d actions for %s in %+v", len(got), dd, plan)
			}
			p2Check(t, got[0], tc.want)
			if got[0].Steps.Job == JobStart || got[0].Steps.Job == JobRestart || got[0].Steps.Job == JobReload {
				if st := tc.cur().Host.Units[dd]; st.LoadState == "not-found" || tc.cur().Memory.Managed[dd] != (Owned{}) {
					t.Errorf("%s job for a unit whose file is gone", got[0].Steps.Job)
				}
			}
		})
	}
}

// instance is the manifest's entry of a template instance the agent runs.
var instance = Owned{Instance: true}

// ownedFiles is the manifest of files (path -> hash written); nil is empty.
func ownedFiles(files map[string]string) map[string]Owned {
	m := map[string]Owned{}
	for p, h := range files {
		m[p] = Owned{Hash: h}
	}
	return m
}
