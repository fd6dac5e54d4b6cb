package systemd

import (
	"strings"
	"testing"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

func TestUnitOfPath(t *testing.T) {
	for _, c := range []struct {
		path, unit string
		ok         bool
	}{
		{"/org/freedesktop/systemd1/unit/p0001_2eservice", "p0001.service", true},
		{"/org/freedesktop/systemd1/unit/w_401_2eservice", "w@1.service", true},
		{"/org/freedesktop/systemd1/unit/foo_2dbar_2eservice", "foo-bar.service", true},
		{"/org/freedesktop/systemd1/unit/_2d_2eslice", "-.slice", true},
		{"/org/freedesktop/systemd1/unit/bad_2", "", false},
		{"/org/freedesktop/systemd1/unit/bad_zz", "", false},
		{"/org/freedesktop/systemd1/unit/", "", false},
		{"/org/freedesktop/systemd1/job/12", "", false},
	} {
		u, ok := unitOfPath(godbus.ObjectPath(c.path))
		if u != c.unit || ok != c.ok {
			t.Errorf("unitOfPath(%s) = %q, %v; want %q, %v", c.path, u, ok, c.unit, c.ok)
		}
		if ok && sddbus.PathBusEscape(u) != strings.TrimPrefix(c.path, unitPathPrefix) {
			t.Errorf("unitOfPath(%s) = %q, which go-systemd escapes as %s", c.path, u, sddbus.PathBusEscape(u))
		}
	}
}
