package reconcile

import (
	"errors"
	"strings"
	"testing"
)

// TestParseKeyTable is the one rule for unit keys: what the agent accepts
// (and what the registry client lets through, registry/keys_test.go).
func TestParseKeyTable(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	for _, tc := range []struct {
		key      string
		path     string // "" when refused
		unit     string
		errLike  string // part of the error when refused
		reserved bool
	}{
		{key: "hello.service", path: "hello.service", unit: "hello.service"},
		{key: "hello@.service", path: "hello@.service", unit: "hello@.service"},
		{key: "hello@1.service", path: "hello@1.service", unit: "hello@1.service"},
		{key: `dev-disk-by\x2duuid.mount`, path: `dev-disk-by\x2duuid.mount`, unit: `dev-disk-by\x2duuid.mount`},
		{key: `x\x2dy.service`, path: `x\x2dy.service`, unit: `x\x2dy.service`},
		{key: `foo\x2dbar.service`, path: `foo\x2dbar.service`, unit: `foo\x2dbar.service`},
		{key: `a@b\x2dc.service`, path: `a@b\x2dc.service`, unit: `a@b\x2dc.service`},
		{key: `srv-my\x2ddata.mount`, path: `srv-my\x2ddata.mount`, unit: `srv-my\x2ddata.mount`},
		{key: `x\x2Dy.service`, path: `x\x2Dy.service`, unit: `x\x2Dy.service`},
		{key: `\x2ehidden.service`, path: `\x2ehidden.service`, unit: `\x2ehidden.service`},
		{key: `foo\x2dbar.service.d/10-env.conf`, path: `foo\x2dbar.service.d/10-env.conf`, unit: `foo\x2dbar.service`},
		{key: `getty@tty\x2d1.service.d/o.conf`, path: `getty@tty\x2d1.service.d/o.conf`, unit: `getty@tty\x2d1.service`},
		{key: "a@.b.service", path: "a@.b.service", unit: "a@.b.service"},
		{key: "hello.service.d/10-env.conf", path: "hello.service.d/10-env.conf", unit: "hello.service"},
		{key: "hello@.service.d/override.conf", path: "hello@.service.d/override.conf", unit: "hello@.service"},
		{key: "hello@1.service.d/o.conf", path: "hello@1.service.d/o.conf", unit: "hello@1.service"},
		{key: "hello.service.d/a+b.conf", path: "hello.service.d/a+b.conf", unit: "hello.service"},
		{key: long(247) + ".service", path: long(247) + ".service", unit: long(247) + ".service"},
		{key: long(245) + ".service.d/x.conf", path: long(245) + ".service.d/x.conf", unit: long(245) + ".service"},
		{key: "h.service.d/" + long(250) + ".conf", path: "h.service.d/" + long(250) + ".conf", unit: "h.service"},
		{key: "-.mount", reserved: true},
		{key: "user-1000.slice", path: "user-1000.slice", unit: "user-1000.slice"},
		{key: "my-dbus.service", path: "my-dbus.service", unit: "my-dbus.service"},
		{key: `systemd\x2djournald.service`, path: `systemd\x2djournald.service`, unit: `systemd\x2djournald.service`},

		{key: "", errLike: "empty"},
		{key: "hello", errLike: "no unit type"},
		{key: "README.md", errLike: "unsupported unit type"},
		{key: ".service", errLike: "must not start with"},
		{key: "../x.service", errLike: "must not contain"},
		{key: "a/b.service", errLike: "must not contain"},
		{key: "a..b.service", errLike: "must not contain"},
		{key: "..service", errLike: "must not contain"},
		{key: "@.service", errLike: "empty template prefix"},
		{key: "a@b@c.service", errLike: "more than one"},
		{key: "foo@bar@.service", errLike: "more than one"},
		{key: `foo\\x2dbar.service`, errLike: "quoted twice"},
		{key: `foo\x2.service`, errLike: `must start an escape \xNN`},
		{key: `foo\x2gbar.service`, errLike: `must start an escape \xNN`},
		{key: `foo\u002dbar.service`, errLike: `must start an escape \xNN`},
		{key: `foo\.service`, errLike: `must start an escape \xNN`},
		{key: `foo.service\`, errLike: `must start an escape \xNN`},
		{key: `foo\x2dbar.service\x2d`, errLike: "unsupported unit type"},
		{key: "he llo.service", errLike: "not allowed"},
		{key: "héllo.service", errLike: "not allowed"},
		{key: "hello.device", errLike: "unsupported unit type"},
		{key: "hello.scope", errLike: "unsupported unit type"},
		{key: "hello.swap", errLike: "unsupported unit type"},
		{key: "hello.automount", errLike: "unsupported unit type"},
		{key: "sda.device.d/x.conf", errLike: "unsupported unit type"},
		{key: long(248) + ".service", errLike: "longer than 255"},
		{key: long(246) + ".service.d/x.conf", errLike: "directory name longer"},
		{key: "h.service.d/" + long(251) + ".conf", errLike: "file name longer"},
		{key: "service.d/all.conf", errLike: "no unit type"},
		{key: "socket.d/a.conf", errLike: "no unit type"},
		{key: "hello.d/x.conf", errLike: "no unit type"},
		{key: "hello.service.d/x.txt", errLike: "must end in .conf"},
		{key: "hello.service.d/.conf", errLike: "must end in .conf"},
		{key: "hello.service.d/", errLike: "must end in .conf"},
		{key: "hello.service.d/..", errLike: "must end in .conf"},
		{key: "hello.service.d/a/b.conf", errLike: "plain file name"},
		{key: "hello.service.d/../x.conf", errLike: "plain file name"},
		{key: "hello.service.d/a..b.conf", errLike: "plain file name"},
		{key: "hello.service.d/.hidden.conf", errLike: "plain file name"},
		{key: `hello.service.d/a\b.conf`, errLike: "plain file name"},
		{key: "hello.service.d/a b.conf", errLike: "not allowed"},
		{key: "hello.service.d/é.conf", errLike: "not allowed"},
		{key: "hello.service.d/x.conf.d/y.conf", errLike: "plain file name"},
		{key: "hello.service/x.conf", errLike: "must not contain"},

		{key: "agentd.service", reserved: true},
		{key: "agentd.service.d/override.conf", reserved: true},
		{key: "dbus.service", reserved: true},
		{key: "dbus.socket", reserved: true},
		{key: "dbus-broker.service", reserved: true},
		{key: "dbus-.service.d/x.conf", reserved: true}, // prefix drop-in reaching dbus-broker.service
		{key: "dbus.service.d/x.conf", reserved: true},
		{key: "systemd-journald.service", reserved: true},
		{key: "systemd-journald.socket", reserved: true},
		{key: "systemd-fsck@.service", reserved: true},
		{key: "systemd-.service.d/x.conf", reserved: true},
		{key: "systemd-logind.service.d/10-x.conf", reserved: true},
		{key: "-.slice", reserved: true},
		{key: "-.slice.d/limits.conf", reserved: true},
		{key: "init.scope", reserved: true},
		{key: "user@.service", reserved: true},
		{key: "user@1000.service", reserved: true},
		{key: "user@.service.d/delegate.conf", reserved: true},
		{key: "user@1000.service.d/x.conf", reserved: true},
	} {
		path, unit, err := ParseKey(tc.key)
		name := tc.key
		if len(name) > 40 {
			name = name[:40] + "…"
		}
		switch {
		case tc.reserved:
			if err == nil || !errors.Is(err, ErrReserved) ||
				!strings.Contains(err.Error(), "reserved") ||
				!strings.Contains(err.Error(), "agentd never manages its own unit, the bus, systemd's own units, the root slice or user managers") {
				t.Errorf("%q: err %v, want a reserved-unit error", name, err)
			}
		case tc.path == "":
			if err == nil || !strings.Contains(err.Error(), tc.errLike) || errors.Is(err, ErrReserved) {
				t.Errorf("%q: (%q, %q, %v), want an error mentioning %q", name, path, unit, err, tc.errLike)
			}
		default:
			if err != nil || path != tc.path || unit != tc.unit {
				t.Errorf("%q: (%q, %q, %v), want (%q, %q)", name, path, unit, err, tc.path, tc.unit)
			}
		}
		// A unit name key and ValidateUnitName agree.
		if !strings.Contains(tc.key, "/") {
			if verr := ValidateUnitName(tc.key); (verr == nil) != (err == nil) {
				t.Errorf("%q: ParseKey %v but ValidateUnitName %v", name, err, verr)
			}
		}
	}
}

func TestReservedMessage(t *testing.T) {
	for name, what := range map[string]string{
		"agentd.service":        "the agent's own unit",
		"dbus.socket":           "the message bus",
		"systemd-udevd.service": "one of systemd's own units",
		"-.slice":               "the root slice",
		"init.scope":            "PID 1's scope",
		"user@1000.service":     "a user manager",
	} {
		err := ValidateUnitName(name)
		want := `reserved unit "` + name + `" (` + what + `): agentd never manages its own unit, the bus, systemd's own units, the root slice or user managers`
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v\nwant %s", name, err, want)
		}
	}
	// Names are matched literally, as systemd compares them: an escaped
	// name is another unit, reserved only if its own spelling is.
	for _, name := range []string{"agentd@.service", "user.slice", "user-runtime-dir@1000.service", "usr.mount", "systemd.service", "init.service", "a-.slice",
		`systemd\x2dudevd.service`, `user\x401000.service`, `\x2d.slice`, `agentd\x2eservice.service`, `init\x2escope.service`} {
		if _, ok := Reserved(name); ok {
			t.Errorf("%s: reserved, want not", name)
		}
	}
	for _, name := range []string{`dbus\x2dbroker.service`, `user@1000\x2d1.service`, `systemd-\x2d.service`} {
		if _, ok := Reserved(name); !ok {
			t.Errorf("%s: not reserved, want reserved (its literal prefix is)", name)
		}
	}
	_, _, err := ParseKey("dbus.service.d/x.conf")
	if err == nil || !strings.HasPrefix(err.Error(), `drop-in "dbus.service.d/x.conf": reserved unit "dbus.service"`) {
		t.Errorf("drop-in of a reserved unit: %v", err)
	}
}

// TestDesireBlocksReserved: the agent blocks a reserved unit (and a
// drop-in of one) with a status error, and applies the good unit beside it.
func TestDesireBlocksReserved(t *testing.T) {
	const file = "[Service]\nExecStart=/bin/true\n"
	units := Desire(Snapshot{Entries: []Entry{
		{Scope: ScopeHost, Unit: "dbus.service", Value: []byte(file)},
		{Scope: ScopeGroup, Group: "web", Unit: "systemd-journald.service.d/x.conf", Value: []byte(file)},
		{Scope: ScopeHost, Unit: "user@1000.service", Value: nil},
		{Scope: ScopeHost, Unit: "ok.service", Value: []byte(file)},
	}})
	for _, name := range []string{"dbus.service", StatusName("systemd-journald.service.d/x.conf"), "user@1000.service"} {
		u := units[name]
		if u == nil || !errors.Is(u.Err, ErrReserved) || !strings.Contains(u.Err.Error(), "agentd never manages") {
			t.Errorf("%s: %+v, want blocked as reserved", name, u)
		}
	}
	if u := units["ok.service"]; u == nil || u.Err != nil || u.File == nil {
		t.Errorf("ok.service: %+v, want desired", u)
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
