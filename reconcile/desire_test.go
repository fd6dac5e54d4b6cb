package reconcile

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// The loop's desiredState gives what Desire gives, snapshot after snapshot,
// whatever it kept from the one before, and names exactly the units whose
// keys changed.
func TestDesiredStateMatchesDesire(t *testing.T) {
	good := "[Service]\nExecStart=/bin/true\n"
	bad := "[Service]\nExecStart=/bin/true\n[X-Agentd]\nNope=1\n"
	group := func(g, key, value string) Entry {
		return Entry{Scope: ScopeGroup, Group: g, Unit: key, Value: []byte(value)}
	}
	steps := []struct {
		s       Snapshot
		changed []string
	}{
		{Snapshot{Entries: []Entry{entry("a.service", good), entry("b.service", good), entry("bad.service", bad)}},
			[]string{"a.service", "b.service", "bad.service"}},
		// Unsorted, a drop-in, a template and an instance: a goes, b changes.
		{Snapshot{Entries: []Entry{entry("b.service", good+"[X-Agentd]\nHealthySec=3\n"), entry("bad.service", bad),
			entry("b.service.d/x.conf", "[Service]\nEnvironment=A=1\n"), entry("w@.service", good), entry("w@1.service", "")}},
			[]string{"a.service", "b.service", "w@.service", "w@1.service"}},
		// Only b's drop-in changes.
		{Snapshot{Entries: []Entry{entry("b.service", good+"[X-Agentd]\nHealthySec=3\n"), entry("bad.service", bad),
			entry("b.service.d/x.conf", "[Service]\nEnvironment=A=2\n"), entry("w@.service", good), entry("w@1.service", "")}},
			[]string{"b.service"}},
		// Groups agree on c, a host key overrides d, groups disagree on e.
		{Snapshot{Entries: []Entry{entry("a.service", good), group("g", "c.service", good), group("h", "c.service", good),
			entry("d.service", good), group("g", "d.service", bad), group("g", "e.service", good), group("h", "e.service", bad)}},
			[]string{"a.service", "b.service", "bad.service", "c.service", "d.service", "e.service", "w@.service", "w@1.service"}},
		// One group changes its mind on e: they agree now.
		{Snapshot{Entries: []Entry{entry("a.service", good), group("g", "c.service", good), group("h", "c.service", good),
			entry("d.service", good), group("g", "d.service", bad), group("g", "e.service", good), group("h", "e.service", good)}},
			[]string{"e.service"}},
		// An invalid key is a unit of its own.
		{Snapshot{Entries: []Entry{entry("a.service", good), entry("../x.service", good)}},
			[]string{"%2E%2E%2Fx.service", "c.service", "d.service", "e.service"}},
		{Snapshot{}, []string{"%2E%2E%2Fx.service", "a.service"}},
		// Of two keys for one path, the last wins.
		{Snapshot{Entries: []Entry{entry("a.service", good), entry("a.service", good+"# two host keys\n")}}, []string{"a.service"}},
	}
	var d desiredState
	for i, st := range steps {
		changes := d.update(st.s)
		if got, want := d.units, Desire(st.s); !reflect.DeepEqual(got, want) {
			t.Fatalf("snapshot %d: kept desire differs:\n got %+v\nwant %+v", i, got, want)
		}
		var names []string
		for _, c := range changes {
			names = append(names, c.name)
			if c.now != d.units[c.name] {
				t.Errorf("snapshot %d: change of %s does not carry the unit now desired", i, c.name)
			}
		}
		if !slices.Equal(names, st.changed) {
			t.Errorf("snapshot %d: changed units %v, want %v", i, names, st.changed)
		}
	}
	if got := d.units["a.service"]; got.File == nil || string(got.File.Content) != "[Service]\nExecStart=/bin/true\n# two host keys\n" {
		t.Errorf("of two host keys for one path, the last should win: %+v", got.File)
	}
}

// Random snapshot sequences over a small set of keys and values: the kept
// desire always equals Desire, and every unit whose Desire changed is named.
func TestDesiredStateRandom(t *testing.T) {
	keys := []string{"a.service", "a.service.d/x.conf", "b.service", "t@.service", "t@1.service", "../bad", "b.service.d/y.conf"}
	values := []string{"", "[Service]\nExecStart=/bin/true\n", "[Service]\nExecStart=/bin/false\n", "[X-Agentd]\nNope=1\n"}
	rng := rand.New(rand.NewPCG(1, 2))
	var d desiredState
	prev := map[string]*DesiredUnit{}
	for i := range 2000 {
		var s Snapshot
		for _, k := range keys {
			for _, g := range []string{"", "g", "h"} {
				if rng.IntN(3) != 0 {
					continue
				}
				e := entry(k, values[rng.IntN(len(values))])
				if g != "" {
					e.Scope, e.Group = ScopeGroup, g
				}
				s.Entries = append(s.Entries, e)
			}
		}
		rng.Shuffle(len(s.Entries), reflect.Swapper(s.Entries))
		changes := d.update(s)
		want := Desire(s)
		if !reflect.DeepEqual(d.units, want) {
			t.Fatalf("step %d: kept desire differs:\n got %+v\nwant %+v", i, d.units, want)
		}
		named := map[string]bool{}
		for _, c := range changes {
			named[c.name] = true
		}
		for name := range want {
			if !named[name] && !reflect.DeepEqual(prev[name], want[name]) {
				t.Fatalf("step %d: %s changed but was not named", i, name)
			}
		}
		for name := range prev {
			if want[name] == nil && !named[name] {
				t.Fatalf("step %d: %s went but was not named", i, name)
			}
		}
		prev = want
	}
}
