package reconcile

import "testing"

func TestNeedsFileState(t *testing.T) {
	withInstall := &DesiredUnit{File: &DesiredFile{}, Policy: Policy{HasInstall: true}}
	without := &DesiredUnit{File: &DesiredFile{}}
	dropInsOnly := &DesiredUnit{DropIns: map[string]DesiredFile{"x.service.d/a.conf": {}}, Policy: Policy{HasInstall: true}}
	cases := []struct {
		name string
		unit string
		d    *DesiredUnit
		last string
		want bool
	}{
		{"never read, or not loaded then", "x.service", without, "", true},
		{"never read, removed", "x.service", nil, "", true},
		{"no [Install], static", "x.service", without, "static", false},
		{"no [Install], disabled", "x.service", without, "disabled", false},
		{"no [Install], enabled: may be disabled", "x.service", without, "enabled", true},
		{"[Install]: may be enabled", "x.service", withInstall, "static", true},
		{"[Install], enabled", "x.service", withInstall, "enabled", true},
		{"removed, disabled", "x.service", nil, "disabled", false},
		{"removed, enabled: planRemove disables", "x.service", nil, "enabled", true},
		{"drop-ins only", "x.service", dropInsOnly, "static", false},
		{"instance", "w@1.service", withInstall, "enabled", false},
		{"instance, never read", "w@1.service", withInstall, "", true},
	}
	for _, c := range cases {
		if got := needsFileState(c.unit, c.d, c.last); got != c.want {
			t.Errorf("%s: needsFileState(%s, last %q) = %v, want %v", c.name, c.unit, c.last, got, c.want)
		}
	}
}

// A change in a directory of dependency links (the agent's own first
// enable makes default.target.wants/) forgets every unit's state, as any
// path that is not a unit's file does, but not which units systemd had no
// file for: forgetting that too made a first sync of units with [Install]
// read each of them in full before its job. A drop-in directory for a whole
// type forgets everything.
func TestForgetPathOfLinks(t *testing.T) {
	v := &view{pathsChanged: func(map[string]bool) {}}
	setUp := func() {
		v.forgetAll()
		v.focus.touched, v.focus.all = map[string]bool{}, false
		v.keepState("new.service", UnitState{LoadState: "not-found", ActiveState: "inactive", SubState: "dead"})
		v.keepState("run.service", UnitState{LoadState: "loaded", ActiveState: "active", SubState: "running", UnitFileState: "enabled"})
	}
	for _, p := range []string{"default.target.wants", "default.target.wants/run.service", "default.target.requires"} {
		setUp()
		v.forgetPath(p)
		if len(v.cache.states) != 0 || len(v.cache.fileStates) != 0 || !v.cache.unknown["new.service"] || !v.focus.all {
			t.Errorf("after %s: states %v, file states %v (want none), new.service unknown %v (want), every unit planned %v (want)",
				p, v.cache.states, v.cache.fileStates, v.cache.unknown["new.service"], v.focus.all)
		}
	}
	setUp()
	v.forgetPath("service.d")
	if len(v.cache.states) != 0 || len(v.cache.unknown) != 0 {
		t.Errorf("a drop-in directory for every service: states %v, unknown %v; want everything forgotten", v.cache.states, v.cache.unknown)
	}
}
