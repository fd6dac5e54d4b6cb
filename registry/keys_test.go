package registry

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentd/agentd/reconcile"
)

// TestUnitKeyRuleAgrees feeds the same keys to the registry side (what
// `agentd unit put/rm/cat` and Client.Put/Remove/Get check) and to the agent
// side (reconcile.Desire, which blocks a unit it refuses) and requires them
// to agree. The rows marked "was" are keys on which the two used to differ.
func TestUnitKeyRuleAgrees(t *testing.T) {
	t.Parallel()
	long := func(n int) string { return strings.Repeat("a", n) }
	for _, tc := range []struct {
		key      string
		ok       bool
		reserved bool
	}{
		{key: "hello.service", ok: true},
		{key: "hello.socket", ok: true},
		{key: "hello.timer", ok: true},
		{key: "hello.path", ok: true},
		{key: "hello.target", ok: true},
		{key: "app.slice", ok: true},
		{key: "srv-data.mount", ok: true},
		{key: "hello@.service", ok: true},
		{key: "hello@1.service", ok: true},
		{key: "hello@a:b_c-d.service", ok: true},
		{key: `dev-disk-by\x2duuid.mount`, ok: true},
		{key: `x\x2dy.service`, ok: true},
		{key: "hello.service.d/10-env.conf", ok: true},
		{key: "hello@.service.d/override.conf", ok: true},
		{key: "hello@1.service.d/override.conf", ok: true},
		{key: "hello.service.d/a+b.conf", ok: true},                // was: registry refused, agent accepted
		{key: long(247) + ".service", ok: true},                    // 255 bytes
		{key: "hello.service.d/" + long(250) + ".conf", ok: true},  // 255-byte file name
		{key: long(245) + ".service.d/x.conf", ok: true},           // 255-byte directory name
		{key: "hello.service.d/" + long(251) + ".conf", ok: false}, // was: registry refused, agent accepted (ENAMETOOLONG at write)
		{key: long(246) + ".service.d/x.conf", ok: false},          // was: both accepted, directory name 257 bytes
		{key: long(248) + ".service", ok: false},                   // 256 bytes
		{key: "service.d/all.conf", ok: false},                     // was: registry accepted type-wide drop-ins, agent blocked
		{key: "socket.d/all.conf", ok: false},                      // was
		{key: "a..b.service", ok: false},                           // was
		{key: "..service", ok: false},                              // was
		{key: "@.service", ok: false},                              // was
		{key: "a@b@c.service", ok: false},                          // was
		{key: "foo@bar@.service", ok: false},                       // was
		{key: "hello.device", ok: false},                           // was: registry knew every systemd type
		{key: "hello.scope", ok: false},                            // was
		{key: "hello.swap", ok: false},                             // was
		{key: "hello.automount", ok: false},                        // was
		{key: "sda.device.d/x.conf", ok: false},                    // was
		{key: "hello.service.d/a..b.conf", ok: false},              // was
		{key: "hello.service.d/.hidden.conf", ok: false},           // was
		{key: `hello.service.d/a\b.conf`, ok: false},               // was
		{key: "hello", ok: false},
		{key: "README.md", ok: false},
		{key: "", ok: false},
		{key: ".service", ok: false},
		{key: "../x.service", ok: false},
		{key: "a/b.service", ok: false},
		{key: "he llo.service", ok: false},
		{key: "héllo.service", ok: false},
		{key: "hello.service.d/x.txt", ok: false},
		{key: "hello.service.d/.conf", ok: false},
		{key: "hello.service.d/", ok: false},
		{key: "hello.service.d/a/b.conf", ok: false},
		{key: "hello.service.d/../x.conf", ok: false},
		{key: "hello.service.d/a b.conf", ok: false},
		{key: "hello.d/x.conf", ok: false},
		{key: "hello.service/x.conf", ok: false},

		// The deny-list: both sides refuse, with the same reserved-unit error.
		{key: "agentd.service", reserved: true},
		{key: "agentd.service.d/override.conf", reserved: true},
		{key: "dbus.service", reserved: true},
		{key: "dbus.socket", reserved: true},
		{key: "dbus-broker.service", reserved: true},
		{key: "dbus.service.d/x.conf", reserved: true},
		{key: "systemd-journald.service", reserved: true},
		{key: "systemd-resolved.service.d/dns.conf", reserved: true},
		{key: "systemd-tmpfiles-clean.timer", reserved: true},
		{key: "-.slice", reserved: true},
		{key: "init.scope", reserved: true}, // was: registry accepted, agent refused as an unsupported type
		{key: "user@.service", reserved: true},
		{key: "user@1000.service", reserved: true},
		{key: "user@1000.service.d/limits.conf", reserved: true},
	} {
		name := tc.key
		if len(name) > 40 {
			name = name[:40] + "…"
		}
		regErr := ValidateUnit(tc.key)
		_, _, keyErr := reconcile.ParseKey(tc.key)
		agentErr := agentBlocks(tc.key)

		if (regErr == nil) != (agentErr == nil) || (keyErr == nil) != (agentErr == nil) {
			t.Errorf("%q: registry %v, ParseKey %v, agent %v: they disagree", name, regErr, keyErr, agentErr)
			continue
		}
		if wantOK := tc.ok && !tc.reserved; (regErr == nil) != wantOK {
			t.Errorf("%q: registry %v, want ok=%v", name, regErr, wantOK)
		}
		if regErr != nil {
			if !errors.Is(regErr, ErrInvalid) {
				t.Errorf("%q: %v, want ErrInvalid", name, regErr)
			}
			if regErr.Error() != keyErr.Error() || !strings.Contains(agentErr.Error(), keyErr.Error()) {
				t.Errorf("%q: messages differ:\n registry %v\n ParseKey %v\n agent    %v", name, regErr, keyErr, agentErr)
			}
		}
		if tc.reserved {
			for side, err := range map[string]error{"registry": regErr, "agent": agentErr} {
				if !errors.Is(err, reconcile.ErrReserved) || !strings.Contains(err.Error(), "agentd never manages its own unit, the bus") {
					t.Errorf("%q: %s %v, want a reserved-unit error", name, side, err)
				}
			}
		}
	}
}

// agentBlocks is the agent's verdict on a key: the error Desire blocks the
// key's unit with, nil when it accepts it.
func agentBlocks(key string) error {
	value := []byte("[Unit]\nDescription=test\n") // a section every unit type has
	if reconcile.IsInstance(key) && !strings.Contains(key, "/") {
		value = nil // an instance key runs the template
	}
	units := reconcile.Desire(reconcile.Snapshot{Entries: []reconcile.Entry{{Scope: reconcile.ScopeGroup, Group: "web", Unit: key, Value: value}}})
	if len(units) != 1 {
		return errors.New("Desire did not return exactly one unit")
	}
	for _, u := range units {
		return u.Err
	}
	return nil
}

// TestValidateUnitReserved: a unit on the deny-list is refused before it
// is written (Put, Remove and Get all check it).
func TestValidateUnitReserved(t *testing.T) {
	t.Parallel()
	err := ValidateUnit("dbus.service")
	want := `reserved unit "dbus.service" (the message bus): agentd never manages its own unit, the bus, systemd's own units, the root slice or user managers`
	if err == nil || err.Error() != want || !errors.Is(err, ErrInvalid) || !errors.Is(err, reconcile.ErrReserved) {
		t.Errorf("ValidateUnit(dbus.service) = %v\nwant %s", err, want)
	}
}
