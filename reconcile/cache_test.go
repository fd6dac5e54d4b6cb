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
		// created: systemd had no file for the unit when last asked
		created bool
	}{
		{"never read, or not loaded then", "x.service", without, "", true, false},
		{"never read, removed", "x.service", nil, "", true, false},
		{"no [Install], static", "x.service", without, "static", false, false},
		{"no [Install], disabled", "x.service", without, "disabled", false, false},
		{"no [Install], enabled: may be disabled", "x.service", without, "enabled", true, false},
		{"[Install]: may be enabled", "x.service", withInstall, "static", true, false},
		{"[Install], enabled", "x.service", withInstall, "enabled", true, false},
		{"removed, disabled", "x.service", nil, "disabled", false, false},
		{"removed, enabled: planRemove disables", "x.service", nil, "enabled", true, false},
		{"drop-ins only", "x.service", dropInsOnly, "static", false, false},
		{"instance", "w@1.service", withInstall, "enabled", false, false},
		{"instance, never read", "w@1.service", withInstall, "", true, false},
		{"created, no [Install]: static", "x.service", without, "", false, true},
		{"created, [Install]: may be enabled", "x.service", withInstall, "", true, true},
		{"created, removed", "x.service", nil, "", true, true},
		{"created, drop-ins only", "x.service", dropInsOnly, "", true, true},
		{"created instance", "w@1.service", withInstall, "", true, true},
		{"not read since created, no [Install]", "x.service", without, fileStateUnread, false, false},
		{"not read since created, [Install] now", "x.service", withInstall, fileStateUnread, true, false},
		{"not read since created, removed: planRemove may disable", "x.service", nil, fileStateUnread, true, false},
	}
	for _, c := range cases {
		if got := needsFileState(c.unit, c.d, c.last, c.created); got != c.want {
			t.Errorf("%s: needsFileState(%s, last %q, created %v) = %v, want %v", c.name, c.unit, c.last, c.created, got, c.want)
		}
	}
}
