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
		{name: "removed from registry is stopped disabled removed", files: map[string]LocalFile{"hello.service": onDisk(svc)},
			managed: map[string]string{"hello.service": Hash([]byte(svc))},
			units:   map[string]UnitState{"hello.service": running}, want: KindRemove, removes: 1, disable: true},
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
			cur := Current{Files: tt.files, Managed: tt.managed, Units: tt.units, Refused: tt.refused, Started: tt.started}
			if cur.Files == nil {
				cur.Files = map[string]LocalFile{}
			}
			if cur.Managed == nil {
				cur.Managed = map[string]string{}
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
			if len(got.Writes) != tt.writes || len(got.Removes) != tt.removes {
				t.Errorf("writes/removes = %d/%d, want %d/%d", len(got.Writes), len(got.Removes), tt.writes, tt.removes)
			}
			if got.Enable != tt.enable || got.Disable != tt.disable {
				t.Errorf("enable/disable = %v/%v, want %v/%v", got.Enable, got.Disable, tt.enable, tt.disable)
			}
			if tt.errLike != "" && !strings.Contains(got.Err, tt.errLike) {
				t.Errorf("err = %q, want it to mention %q", got.Err, tt.errLike)
			}
			if tt.want == KindBlocked && (len(got.Writes) > 0 || len(got.Removes) > 0) {
				t.Errorf("blocked action touches files: %+v", got)
			}
		})
	}
}

func TestPlanTemplateChangeRestartsRunningInstances(t *testing.T) {
	old := svc
	entries := []Entry{entry("web@.service", svc+"Environment=V=2\n"), entry("web@1.service", ""), entry("web@2.service", "")}
	cur := Current{
		Files:   map[string]LocalFile{"web@.service": onDisk(old)},
		Managed: map[string]string{"web@.service": "x", "web@1.service": InstanceMarker, "web@2.service": InstanceMarker},
		Units:   map[string]UnitState{"web@.service": absent, "web@1.service": running, "web@2.service": stopped},
	}
	kinds := map[string]Kind{}
	for _, a := range Plan(Desire(Snapshot{Entries: entries}), cur) {
		kinds[a.Unit] = a.Kind
	}
	want := map[string]Kind{"web@.service": KindUpdate, "web@1.service": KindRestart, "web@2.service": KindNone}
	for u, k := range want {
		if kinds[u] != k {
			t.Errorf("%s: %s, want %s", u, kinds[u], k)
		}
	}
}

func TestPlanRemovedInstanceIsStoppedNoFileTouched(t *testing.T) {
	cur := Current{
		Managed: map[string]string{"web@1.service": InstanceMarker},
		Units:   map[string]UnitState{"web@1.service": running},
		Files:   map[string]LocalFile{},
	}
	plan := Plan(Desire(Snapshot{}), cur)
	if len(plan) != 1 || plan[0].Kind != KindRemove || len(plan[0].Removes) != 0 || plan[0].Disable {
		t.Fatalf("plan = %+v", plan)
	}
}

func TestPlanIsDeterministic(t *testing.T) {
	var entries []Entry
	for _, n := range []string{"c.service", "a.service", "b.service"} {
		entries = append(entries, entry(n, svc))
	}
	cur := Current{Files: map[string]LocalFile{}, Managed: map[string]string{}, Units: map[string]UnitState{}}
	plan := Plan(Desire(Snapshot{Entries: entries}), cur)
	var names []string
	for _, a := range plan {
		names = append(names, a.Unit)
	}
	if strings.Join(names, ",") != "a.service,b.service,c.service" {
		t.Fatalf("order = %v", names)
	}
}

func TestValidateUnitName(t *testing.T) {
	good := []string{"hello.service", "a-b_c:d.socket", "web@.service", "web@1.service", `x\x2dy.mount`, "app.slice", "t.timer", "p.path", "multi-user.target"}
	bad := []string{"", "hello", ".service", "hello.exe", "hello.device", "a/b.service", "../x.service", "a..b.service", "a b.service", "@.service", "a@b@c.service", strings.Repeat("a", 250) + ".service", "héllo.service"}
	for _, n := range good {
		if err := ValidateUnitName(n); err != nil {
			t.Errorf("%q: %v", n, err)
		}
	}
	for _, n := range bad {
		if err := ValidateUnitName(n); err == nil {
			t.Errorf("%q: accepted", n)
		}
	}
}

func TestParseKey(t *testing.T) {
	for key, want := range map[string][2]string{
		"hello.service":            {"hello.service", "hello.service"},
		"hello.service.d/env.conf": {"hello.service.d/env.conf", "hello.service"},
	} {
		p, u, err := ParseKey(key)
		if err != nil || p != want[0] || u != want[1] {
			t.Errorf("%q: %q %q %v", key, p, u, err)
		}
	}
	for _, key := range []string{"hello.service.d/env", "hello.service.d/../x.conf", "hello.service.d/a/b.conf", "hello.service.d/.conf", "x.d/y.conf"} {
		if _, _, err := ParseKey(key); err == nil {
			t.Errorf("%q accepted", key)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy([]byte(svc))
	if err != nil || p.State != StateStarted || p.Enable || !p.Rollback || p.HealthySec != 5 || p.OnChange != "auto" {
		t.Fatalf("defaults: %+v %v", p, err)
	}
	p, _ = ParsePolicy([]byte(svc + "[Install]\nWantedBy=default.target\n"))
	if !p.Enable || !p.HasInstall {
		t.Fatalf("enable default with [Install]: %+v", p)
	}
	p, _ = ParsePolicy([]byte(svc + "[Install]\nWantedBy=default.target\n[X-Agentd]\nState=present\n"))
	if p.Enable {
		t.Fatalf("State=present must not enable by default: %+v", p)
	}
	p, err = ParsePolicy([]byte("[X-Agentd]\n# comment\nState = stopped\nEnable=no\nOnChange=reload\nRollback=no\nHealthySec=2\nMaxUnavailable=3\n"))
	if err != nil || p.State != StateStopped || p.Enable || p.OnChange != "reload" || p.Rollback || p.HealthySec != 2 || p.MaxUnavailable != 3 {
		t.Fatalf("explicit: %+v %v", p, err)
	}
	for _, bad := range []string{"State=run", "Enable=maybe", "OnChange=bounce", "HealthySec=-1", "MaxUnavailable=0", "Foo=1"} {
		if _, err := ParsePolicy([]byte("[X-Agentd]\n" + bad + "\n")); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
