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
