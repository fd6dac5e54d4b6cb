package registry

import (
	"strings"
	"testing"
)

// Fuzz targets for the registry's own key parsing (the unit-key suffix
// rule is reconcile.ParseKey, fuzzed there). Seed corpora in
// testdata/fuzz/<FuzzName>/; fuzz with e.g.
//
//	go test ./registry -run '^$' -fuzz '^FuzzParseUnitKey$' -fuzztime 60s -parallel 1

// FuzzParseUnitKey: a full etcd key the watch or `unit ls` reads. An
// accepted key names exactly one target and a unit suffix, and is
// rebuilt exactly from them; a valid target and unit always parse back.
func FuzzParseUnitKey(f *testing.F) {
	c := New(nil, DefaultPrefix)
	f.Fuzz(func(t *testing.T, key string) {
		tg, unit, ok := c.parseUnitKey(key)
		if !ok {
			if tg != (Target{}) || unit != "" {
				t.Fatalf("parseUnitKey(%q) = %+v, %q, false", key, tg, unit)
			}
			return
		}
		if (tg.Host == "") == (tg.Group == "") {
			t.Fatalf("parseUnitKey(%q): target %+v, want exactly one of host and group", key, tg)
		}
		name := tg.Host + tg.Group
		if strings.Contains(name, "/") || unit == "" {
			t.Fatalf("parseUnitKey(%q): name %q, unit %q", key, name, unit)
		}
		if got := c.targetUnits(tg) + unit; got != key {
			t.Fatalf("parseUnitKey(%q) = %+v, %q: rebuilds as %q", key, tg, unit, got)
		}
		if tg.Validate() == nil && ValidateUnit(unit) == nil {
			if strings.Contains(unit, "..") || strings.Count(unit, "/") > 1 {
				t.Fatalf("parseUnitKey(%q): a valid unit suffix %q with \"..\" or more than one \"/\"", key, unit)
			}
		}
	})
}

// FuzzDecodeHalt: a key and value under the halts prefix. A halt key
// names a group and a unit without "/", and is rebuilt exactly from the
// halt's Scope and Unit; a value that does not decode is an error, never a
// halt, and never a panic.
func FuzzDecodeHalt(f *testing.F) {
	c := New(nil, DefaultPrefix)
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		h, ok, err := c.decodeHalt([]byte(key), value)
		if !ok {
			if err != nil {
				t.Fatalf("decodeHalt(%q): not a halt key, yet error %v", key, err)
			}
			return
		}
		if err != nil {
			if !strings.Contains(err.Error(), key) {
				t.Fatalf("decodeHalt(%q): error %v does not name the key", key, err)
			}
			return
		}
		group, isGroup := strings.CutPrefix(h.Scope, "groups/")
		if !isGroup || group == "" || strings.Contains(group, "/") || h.Unit == "" || strings.Contains(h.Unit, "/") {
			t.Fatalf("decodeHalt(%q) = scope %q, unit %q", key, h.Scope, h.Unit)
		}
		if got := c.haltKey(h.Scope, h.Unit); got != key {
			t.Fatalf("decodeHalt(%q): rebuilds as %q", key, got)
		}
	})
}
