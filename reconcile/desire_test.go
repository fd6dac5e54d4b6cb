package reconcile

import (
	"reflect"
	"testing"
)

// The loop's desireCache gives what Desire gives, snapshot after snapshot,
// whatever it kept from the one before.
func TestDesireCacheMatchesDesire(t *testing.T) {
	good := "[Service]\nExecStart=/bin/true\n"
	snaps := []Snapshot{
		{Entries: []Entry{entry("a.service", good), entry("b.service", good), entry("bad.service", "[Service]\nExecStart=/bin/true\n[X-Agentd]\nNope=1\n")}},
		{Entries: []Entry{entry("b.service", good+"[X-Agentd]\nHealthySec=3\n"), entry("bad.service", "[Service]\nExecStart=/bin/true\n[X-Agentd]\nNope=1\n"),
			entry("b.service.d/x.conf", "[Service]\nEnvironment=A=1\n"), entry("w@.service", good), entry("w@1.service", "")}},
		{Entries: []Entry{entry("a.service", good), entry("b.service", good), {Scope: ScopeGroup, Group: "g", Unit: "c.service", Value: []byte(good)}}},
		{},
		{Entries: []Entry{entry("a.service", good), entry("a.service", good+"# two host keys\n")}},
	}
	var c desireCache
	for i, s := range snaps {
		if got, want := c.desire(s), Desire(s); !reflect.DeepEqual(got, want) {
			t.Fatalf("snapshot %d: cached desire differs:\n got %+v\nwant %+v", i, got, want)
		}
	}
	// The last snapshot has one value in use (of two keys for one path, the
	// last wins): the cache keeps only that.
	if len(c.values) != 1 || len(c.policies) != 1 {
		t.Errorf("the cache keeps %d values and %d policies after the last snapshot, want 1 and 1", len(c.values), len(c.policies))
	}
}
