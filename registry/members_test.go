package registry

import (
	"maps"
	"slices"
	"testing"
)

// TestSessionSetMember: a relabelled agent's new labels and groups are in
// its membership key (on its lease) and its member record at once; a lease
// re-created later carries them; the selector groups KnownHosts computes
// follow the new labels.
func TestSessionSetMember(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	prod := mustSelector(t, "env=prod")
	if _, err := c.PutSelector(ctx, prod); err != nil {
		t.Fatal(err)
	}
	m := member("h1", "m1")
	m.Labels = map[string]string{"env": "dev"}
	s := mustJoin(t, c, m)
	labels := map[string]string{"env": "prod", "rack": "r1"}
	groups := []string{"all", SelectorGroup(prod)}
	if err := s.SetMember(ctx, groups, labels); err != nil {
		t.Fatal(err)
	}
	labels["rack"] = "changed after the call" // SetMember keeps its own copy
	want := map[string]string{"env": "prod", "rack": "r1"}
	members, err := c.Members(ctx)
	if err != nil || len(members) != 1 || !maps.Equal(members[0].Labels, want) || !slices.Equal(members[0].Groups, groups) {
		t.Fatalf("Members = %+v, %v; want labels %v, groups %v", members, err, want, groups)
	}
	if lease, ok := keyLease(t, c, c.agentKey("h1")); !ok || lease != s.Lease() {
		t.Fatalf("membership key lease %x (%v), want %x", lease, ok, s.Lease())
	}
	known, err := c.KnownHosts(ctx)
	if err != nil || len(known) != 1 || !maps.Equal(known[0].Labels, want) || !slices.Contains(known[0].Groups, SelectorGroup(prod)) {
		t.Fatalf("KnownHosts = %+v, %v", known, err)
	}
	if got := s.Member(); !maps.Equal(got.Labels, want) || !slices.Equal(got.Groups, groups) {
		t.Fatalf("Member() = %+v", got)
	}
	// The member record (no lease) keeps the labels once the agent left.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	known, err = c.KnownHosts(ctx)
	if err != nil || len(known) != 1 || known[0].Live || !maps.Equal(known[0].Labels, want) {
		t.Fatalf("KnownHosts after leaving = %+v, %v", known, err)
	}
	if err := s.SetMember(ctx, groups, want); err == nil {
		t.Fatal("SetMember on a closed Session succeeded")
	}
}
