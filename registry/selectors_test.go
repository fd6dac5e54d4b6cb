package registry

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/selector"
)

func mustSelector(t *testing.T, s string) selector.Selector {
	t.Helper()
	sel, err := selector.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

// TestSelectorsRecord: a selector is recorded under its canonical form at
// the group SelectorGroup names, the same group however it is written;
// WatchSelectors hands out the set at once and after each change.
func TestSelectorsRecord(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)

	got := make(chan map[string]selector.Selector, 10)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.WatchSelectors(wctx, func(m map[string]selector.Selector) { got <- m }) }()
	defer func() { cancel(); <-done }()
	next := func() map[string]selector.Selector {
		t.Helper()
		select {
		case m := <-got:
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("WatchSelectors handed nothing out")
			return nil
		}
	}
	if m := next(); len(m) != 0 {
		t.Fatalf("at start: %v, want none", m)
	}

	a := mustSelector(t, "role=web, env=prod")
	b := mustSelector(t, "env = prod,role=web")
	g, err := c.PutSelector(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if g != SelectorGroup(b) || !IsSelectorGroup(g) || ValidateName("group", g) != nil || len(g) != len("sel-")+12 {
		t.Fatalf("group %q; the same selector written another way is %q", g, SelectorGroup(b))
	}
	if g2, err := c.PutSelector(ctx, b); err != nil || g2 != g {
		t.Fatalf("PutSelector again = %q, %v", g2, err)
	}
	resp, err := c.cli.Get(ctx, c.prefix+"/selectors/"+g)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != a.String() {
		t.Fatalf("record %v %v, want %q", resp.Kvs, err, a.String())
	}
	if m := next(); len(m) != 1 || m[g].String() != a.String() {
		t.Fatalf("after the put: %v", m)
	}
	if _, err := c.PutSelector(ctx, selector.Selector{}); err == nil {
		t.Fatal("an empty selector was recorded")
	}

	dev := mustSelector(t, "env in (dev,test)")
	gd, err := c.PutSelector(ctx, dev)
	if err != nil {
		t.Fatal(err)
	}
	m := next()
	if len(m) != 2 {
		t.Fatalf("after the second put: %v", m)
	}
	for labels, want := range map[string][]string{
		"env=prod,role=web": {g},
		"env=dev,role=web":  {gd},
		"env=prod":          nil,
	} {
		if got := MatchingSelectors(m, mustLabels(t, labels)); !slices.Equal(got, want) {
			t.Errorf("MatchingSelectors(%s) = %v, want %v", labels, got, want)
		}
	}
	// A record that does not parse is left out.
	if _, err := c.cli.Put(ctx, c.prefix+"/selectors/sel-000000000000", "env=="); err != nil {
		t.Fatal(err)
	}
	if all, _, err := c.Selectors(ctx); err != nil || len(all) != 2 {
		t.Fatalf("Selectors with a bad record = %v, %v", all, err)
	}
}

func mustLabels(t *testing.T, s string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for kv := range strings.SplitSeq(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

// TestSessionSetGroups: the membership key and the member record name the
// new groups at once.
func TestSessionSetGroups(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	s := mustJoin(t, c, member("h1", "m1"))
	if err := s.SetGroups(ctxT(t), []string{"all", "sel-0123456789ab"}); err != nil {
		t.Fatal(err)
	}
	known, err := c.KnownHosts(ctxT(t))
	if err != nil || len(known) != 1 || !known[0].Live || !slices.Equal(known[0].Groups, []string{"all", "sel-0123456789ab"}) {
		t.Fatalf("KnownHosts = %+v, %v", known, err)
	}
	members, err := c.Members(ctxT(t))
	if err != nil || len(members) != 1 || !slices.Equal(members[0].Groups, []string{"all", "sel-0123456789ab"}) {
		t.Fatalf("Members = %+v, %v", members, err)
	}
	if lease, ok := keyLease(t, c, c.agentKey("h1")); !ok || lease != s.Lease() {
		t.Fatalf("membership key lease %x (%v), want %x", lease, ok, s.Lease())
	}
}

// TestKnownHostsSelectorGroups: KnownHosts puts a host in the group of
// each recorded (or assumed) selector its labels match, as its agent does,
// and out of one they no longer match.
func TestKnownHostsSelectorGroups(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	prod, dev := mustSelector(t, "env=prod"), mustSelector(t, "env=dev")
	m := member("h1", "m1")
	m.Labels = map[string]string{"env": "prod"}
	m.Groups = []string{"all", SelectorGroup(dev), "sel-unrecorded"}
	mustJoin(t, c, m)
	for _, s := range []selector.Selector{prod, dev} {
		if _, err := c.PutSelector(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	rack := mustSelector(t, "env in (prod),!rack")
	c.AssumeSelector(rack)
	known, err := c.KnownHosts(ctx)
	if err != nil || len(known) != 1 {
		t.Fatalf("KnownHosts = %v, %v", known, err)
	}
	got := slices.Sorted(slices.Values(known[0].Groups))
	want := slices.Sorted(slices.Values([]string{"all", "sel-unrecorded", SelectorGroup(prod), SelectorGroup(rack)}))
	if !slices.Equal(got, want) {
		t.Fatalf("groups %v, want %v", got, want)
	}
}
