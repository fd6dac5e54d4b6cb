package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func mustHalt(t *testing.T, s *Session, scope, unit, hash, reason string) {
	t.Helper()
	if err := s.Halt(ctxT(t), reconcile.Halt{Scope: scope, Unit: unit, Hash: hash, Reason: reason}); err != nil {
		t.Fatalf("Halt(%s, %s, %.8s): %v", scope, unit, hash, err)
	}
}

// haltsOf renders halts as "scope:unit=hash/host".
func haltsOf(hs []reconcile.Halt) []string {
	out := []string{}
	for _, h := range hs {
		out = append(out, fmt.Sprintf("%s:%s=%s/%s", h.Scope, h.Unit, h.Hash, h.Host))
	}
	return out
}

func mustHalts(t *testing.T, c *Client, scope string) []string {
	t.Helper()
	hs, err := c.Halts(ctxT(t), scope)
	if err != nil {
		t.Fatalf("Halts(%q): %v", scope, err)
	}
	return haltsOf(hs)
}

// keyAt reports whether key exists at revision rev, and its value.
func keyAt(t *testing.T, c *Client, key string, rev int64) (string, bool) {
	t.Helper()
	resp, err := c.cli.Get(ctxT(t), key, clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "", false
	}
	return string(resp.Kvs[0].Value), true
}

func TestHaltRoundTrip(t *testing.T) {
	t.Parallel()
	e := StartTestEtcd(t)
	c, s1 := agent(t, e.Endpoint(), "h1")
	_, s2 := agent(t, e.Endpoint(), "h2")
	v1, v2 := reconcile.Hash([]byte("v1")), reconcile.Hash([]byte("v2"))

	before := time.Now().UTC()
	mustHalt(t, s1, "groups/web", "hello.service", "abc", "exit status 3")
	hs, err := c.Halts(ctxT(t), "groups/web")
	if err != nil || len(hs) != 1 {
		t.Fatalf("Halts = %+v, %v; want one", hs, err)
	}
	h := hs[0]
	if h.Scope != "groups/web" || h.Unit != "hello.service" || h.Hash != "abc" || h.Host != "h1" || h.Reason != "exit status 3" || h.At.Before(before) {
		t.Errorf("halt read back = %+v", h)
	}
	// Stored as documented, as JSON, without a lease.
	const key = "/agentd/halts/groups/web/hello.service"
	if lease, ok := keyLease(t, c, key); !ok || lease != clientv3.NoLease {
		t.Errorf("%s: exists %v, lease %x; want a key without a lease", key, ok, lease)
	}
	val, _ := keyAt(t, c, key, 0)
	for _, f := range []string{`"scope":"groups/web"`, `"unit":"hello.service"`, `"hash":"abc"`, `"host":"h1"`, `"reason":"exit status 3"`, `"at":`} {
		if !strings.Contains(val, f) {
			t.Errorf("halt value %s lacks %s", val, f)
		}
	}

	// A second failure of the same version keeps the first record.
	mustHalt(t, s2, "groups/web", "hello.service", "abc", "timeout")
	if got, want := mustHalts(t, c, "groups/web"), []string{"groups/web:hello.service=abc/h1"}; !slices.Equal(got, want) {
		t.Errorf("after a second halt of the same hash: %v, want %v", got, want)
	}
	// A failure of another version replaces it...
	mustHalt(t, s2, "groups/web", "hello.service", v1, "timeout")
	// ...unless the halted version is the group's content and the new one
	// is not (a late failure of an older version).
	mustPut(t, c, Target{Group: "web"}, "hello.service", "v2")
	mustHalt(t, s1, "groups/web", "hello.service", v2, "exit status 1")
	mustHalt(t, s2, "groups/web", "hello.service", v1, "late")
	// An instance halt carries its template's hash.
	mustPut(t, c, Target{Group: "web"}, "a@.service", "T")
	mustHalt(t, s2, "groups/web", "a@1.service", reconcile.Hash([]byte("T")), "failed")
	mustHalt(t, s1, "groups/web", "a@1.service", "older", "late")
	mustHalt(t, s1, "groups/all", "x.service", "def", "exit status 2")

	want := []string{"groups/web:a@1.service=" + reconcile.Hash([]byte("T")) + "/h2", "groups/web:hello.service=" + v2 + "/h1"}
	if got := mustHalts(t, c, "groups/web"); !slices.Equal(got, want) {
		t.Errorf("Halts(groups/web) = %v, want %v", got, want)
	}
	want = append([]string{"groups/all:x.service=def/h1"}, want...)
	if got := mustHalts(t, c, ""); !slices.Equal(got, want) {
		t.Errorf("Halts(\"\") = %v, want %v (sorted by scope, unit)", got, want)
	}

	// The halt outlives the host that failed.
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	if got := mustHalts(t, c, ""); !slices.Equal(got, want) {
		t.Errorf("after the failing agent left: %v, want %v", got, want)
	}
}

func TestHaltInvalid(t *testing.T) {
	t.Parallel()
	e := StartTestEtcd(t)
	c, s := agent(t, e.Endpoint(), "h1")
	for _, h := range []reconcile.Halt{
		{Scope: "hosts/h1", Unit: "a.service", Hash: "x"},
		{Scope: "web", Unit: "a.service", Hash: "x"},
		{Scope: "groups/", Unit: "a.service", Hash: "x"},
		{Scope: "groups/a/b", Unit: "a.service", Hash: "x"},
		{Scope: "groups/../x", Unit: "a.service", Hash: "x"},
		{Scope: "groups/web", Unit: "a.service.d/x.conf", Hash: "x"},
		{Scope: "groups/web", Unit: "a", Hash: "x"},
		{Scope: "groups/web", Unit: "", Hash: "x"},
		{Scope: "groups/web", Unit: "a.service", Hash: ""},
	} {
		if err := s.Halt(ctxT(t), h); !errors.Is(err, ErrInvalid) {
			t.Errorf("Halt(%+v): %v, want ErrInvalid", h, err)
		}
	}
	for _, scope := range []string{"hosts/h1", "web", "groups/", "groups/a/b"} {
		if _, err := c.Halts(ctxT(t), scope); !errors.Is(err, ErrInvalid) {
			t.Errorf("Halts(%q): %v, want ErrInvalid", scope, err)
		}
	}
	if got := mustHalts(t, c, ""); len(got) != 0 {
		t.Errorf("invalid halts stored: %v", got)
	}
	// A value an agent did not write: Halts skips it, with a warning
	// that says which key to delete.
	w := recordWarnings(c)
	if _, err := c.cli.Put(ctxT(t), "/agentd/halts/groups/web/b.service", "junk"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Halts(ctxT(t), "groups/web"); err != nil || len(got) != 0 {
		t.Errorf("Halts with an undecodable value: %v, %v; want none, nil", got, err)
	}
	w.mustName(t, "/agentd/halts/groups/web/b.service")
	if !strings.Contains(w.String(), "delete it") {
		t.Errorf("the warning does not say what to do: %s", w)
	}
}

func TestWatchHalts(t *testing.T) {
	t.Parallel()
	e := StartTestEtcd(t)
	c, s := agent(t, e.Endpoint(), "h2")
	mustPut(t, c, Target{Group: "web"}, "w.service", "W")
	mustHalt(t, s, "groups/web", "w.service", "w1", "r")
	mustHalt(t, s, "groups/all", "z.service", "z1", "r")
	mustHalt(t, s, "groups/web", "a.service", "a1", "r")
	mustHalt(t, s, "groups/db", "d.service", "d1", "r")                                         // not h1's group
	mustHalt(t, s, "groups/web2", "w.service", "x", "r")                                        // a prefix sibling of web
	if _, err := c.cli.Put(ctxT(t), "/agentd/halts/groups/web/junk.service", "{"); err != nil { // left out
		t.Fatal(err)
	}
	resp, err := c.cli.Get(ctxT(t), "/agentd/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	last := resp.Header.Revision

	r, _ := runWatch(t, c, "h1", []string{"web", "all"})
	first := r.waitFor(t, "initial snapshot", 5*time.Second, func(Snapshot) bool { return true })
	want := []string{"groups/all:z.service=z1/h2", "groups/web:a.service=a1/h2", "groups/web:w.service=w1/h2"}
	if got := haltsOf(first.Halts); !slices.Equal(got, want) {
		t.Fatalf("initial halts = %v, want %v (the agent's groups only, sorted)", got, want)
	}
	// At or after the last write (h2's session may write its own keys
	// meanwhile: seen in CI one revision later), units and halts from
	// that one read.
	if first.Revision < last || !has(first, "group:web:w.service=W") {
		t.Errorf("initial snapshot at revision %d with %v, want revision %d or later (units and halts read at once)", first.Revision, units(first), last)
	}

	// Halts of other groups produce no callback; a halt of the agent's
	// group, put or deleted, does.
	n := len(r.all())
	mustHalt(t, s, "groups/db", "d.service", "d2", "r")
	mustHalt(t, s, "groups/web2", "w.service", "y", "r")
	mustHalt(t, s, "groups/all", "b.service", "b1", "r")
	got := r.waitFor(t, "new halt", 5*time.Second, func(s Snapshot) bool { return len(s.Halts) == 4 })
	if k := len(r.all()) - n; k != 1 {
		t.Errorf("%d callbacks for one relevant halt among irrelevant ones, want 1:%s", k, describe(r.all()[n:]))
	}
	want = []string{"groups/all:b.service=b1/h2", "groups/all:z.service=z1/h2", "groups/web:a.service=a1/h2", "groups/web:w.service=w1/h2"}
	if !slices.Equal(haltsOf(got.Halts), want) {
		t.Errorf("halts = %v, want %v", haltsOf(got.Halts), want)
	}
	if len(got.Entries) != 1 {
		t.Errorf("entries after a halt = %v, want the unit still there", units(got))
	}
	del, err := c.cli.Delete(ctxT(t), "/agentd/halts/groups/web/a.service")
	if err != nil {
		t.Fatal(err)
	}
	got = r.waitFor(t, "halt deleted", 5*time.Second, func(s Snapshot) bool { return len(s.Halts) == 3 })
	if got.Revision != del.Header.Revision {
		t.Errorf("snapshot after the delete at revision %d, want %d", got.Revision, del.Header.Revision)
	}
	// New content for the group clears the unit's halt.
	mustPut(t, c, Target{Group: "web"}, "w.service", "W2")
	r.waitFor(t, "halt cleared by new content", 5*time.Second, func(s Snapshot) bool {
		return has(s, "group:web:w.service=W2") && len(s.Halts) == 2
	})
}

func TestPutClearsHalts(t *testing.T) {
	t.Parallel()
	e := StartTestEtcd(t)
	c, s := agent(t, e.Endpoint(), "h1")
	web := Target{Group: "web"}
	mustPut(t, c, web, "hello.service", "v2", "a@.service", "T", "o.service", "O")
	mustHalt(t, s, "groups/web", "hello.service", reconcile.Hash([]byte("v2")), "r")
	mustHalt(t, s, "groups/web", "a@1.service", reconcile.Hash([]byte("T")), "r")
	mustHalt(t, s, "groups/web", "o.service", reconcile.Hash([]byte("O")), "r")
	mustHalt(t, s, "groups/all", "hello.service", reconcile.Hash([]byte("v2")), "r")
	const hello = "/agentd/halts/groups/web/hello.service"
	allHalts := mustHalts(t, c, "groups/all")

	// Putting the version that failed again, another host's key, or
	// another group's key leaves the halt.
	mustPut(t, c, web, "hello.service", "v2", "a@1.service", "")
	mustPut(t, c, Target{Host: "h1"}, "hello.service", "v3")
	mustPut(t, c, Target{Group: "web2"}, "hello.service", "v3")
	if got := mustHalts(t, c, "groups/web"); len(got) != 3 {
		t.Fatalf("halts after puts of no new content for web: %v, want all 3", got)
	}

	// New content: unit key written and halt deleted at one revision;
	// the other units' halts, and the other group's, stay.
	rev := mustPut(t, c, web, "hello.service", "v3")
	if _, ok := keyAt(t, c, hello, rev-1); !ok {
		t.Fatalf("halt missing before the put")
	}
	if _, ok := keyAt(t, c, hello, rev); ok {
		t.Errorf("halt still there at the put's revision %d", rev)
	}
	if v, _ := keyAt(t, c, "/agentd/groups/web/units/hello.service", rev); v != "v3" {
		t.Errorf("unit at revision %d = %q", rev, v)
	}
	if got := mustHalts(t, c, "groups/web"); len(got) != 2 || strings.Contains(strings.Join(got, " "), "hello.service") {
		t.Errorf("halts after new content for hello.service: %v, want a@1 and o", got)
	}
	if got := mustHalts(t, c, "groups/all"); !slices.Equal(got, allHalts) {
		t.Errorf("another group's halts: %v, want %v", got, allHalts)
	}

	// A drop-in of the template is new content for its instances.
	rev = mustPut(t, c, web, "a@.service.d/10-x.conf", "[Service]\n")
	if _, ok := keyAt(t, c, "/agentd/halts/groups/web/a@1.service", rev); ok {
		t.Errorf("instance halt survived a template drop-in")
	}
	// Remove clears the halts of what it removes, at its revision.
	rev, err := c.Remove(ctxT(t), web, []string{"o.service"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := keyAt(t, c, "/agentd/halts/groups/web/o.service", rev); ok {
		t.Errorf("halt survived the removal of its unit")
	}
	if got := mustHalts(t, c, "groups/web"); len(got) != 0 {
		t.Errorf("halts left: %v", got)
	}
	// A failed Remove removes no halt either.
	mustHalt(t, s, "groups/web", "hello.service", reconcile.Hash([]byte("v3")), "r")
	if _, err := c.Remove(ctxT(t), web, []string{"hello.service", "gone.service"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Remove of a missing unit: %v", err)
	}
	if got := mustHalts(t, c, "groups/web"); len(got) != 1 {
		t.Errorf("halts after a failed Remove: %v, want the one", got)
	}
}

// A halt written between haltsToClear's read and the transaction fails
// the guard (Put and Remove then read again).
func TestHaltsToClearGuard(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	val, _ := json.Marshal(reconcile.Halt{Hash: "x"})
	if _, err := c.cli.Put(ctxT(t), c.haltKey("groups/web", "a.service"), string(val)); err != nil {
		t.Fatal(err)
	}
	all := func(reconcile.Halt) bool { return true }
	dels, guard, err := c.haltsToClear(ctxT(t), "web", all)
	if err != nil || len(dels) != 1 {
		t.Fatalf("haltsToClear: %d deletes, %v", len(dels), err)
	}
	if _, err := c.cli.Put(ctxT(t), c.haltKey("groups/web", "b.service"), string(val)); err != nil {
		t.Fatal(err)
	}
	resp, err := c.cli.Txn(ctxT(t)).If(guard).Then(dels...).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("guarded txn after a new halt: succeeded %v, %v; want it to fail", resp.Succeeded, err)
	}
	// A deletion in between does not matter.
	dels, guard, _ = c.haltsToClear(ctxT(t), "web", all)
	if _, err := c.cli.Delete(ctxT(t), c.haltKey("groups/web", "b.service")); err != nil {
		t.Fatal(err)
	}
	resp, err = c.cli.Txn(ctxT(t)).If(guard).Then(dels...).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("guarded txn after a deletion: succeeded %v, %v", resp.Succeeded, err)
	}
	if got := mustHalts(t, c, ""); len(got) != 0 {
		t.Errorf("halts left: %v", got)
	}
}

func TestPartOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		key, unit string
		want      bool
	}{
		{"a.service", "a.service", true},
		{"a.service.d/x.conf", "a.service", true},
		{"service.d/x.conf", "a.service", true},
		{"service.d/x.conf", "a.socket", false},
		{"b.service", "a.service", false},
		{"a.service.d/x.conf", "a.socket", false},
		{"a@.service", "a@1.service", true},
		{"a@.service.d/x.conf", "a@1.service", true},
		{"a@1.service", "a@1.service", true},
		{"a@1.service", "a@2.service", false},
		{"a@1.service.d/x.conf", "a@2.service", false},
		{"a@.socket", "a@1.service", false},
		{"a@.service", "a@.service", true},
		{"ab@.service", "a@1.service", false},
	} {
		if got := partOf(tc.key, tc.unit); got != tc.want {
			t.Errorf("partOf(%q, %q) = %v, want %v", tc.key, tc.unit, got, tc.want)
		}
	}
	h := reconcile.Halt{Unit: "a@1.service", Hash: reconcile.Hash([]byte("T"))}
	for _, tc := range []struct {
		units map[string][]byte
		want  bool
	}{
		{map[string][]byte{"a@.service": []byte("T")}, false},
		{map[string][]byte{"a@1.service": nil}, false},
		{map[string][]byte{"b.service": []byte("x")}, false},
		{map[string][]byte{"a@.service": []byte("T2")}, true},
		{map[string][]byte{"a@.service": []byte("T"), "a@.service.d/x.conf": []byte("x")}, true},
		{map[string][]byte{"a@1.service": []byte("own")}, true},
	} {
		if got := putClears(h, tc.units); got != tc.want {
			t.Errorf("putClears(%v) = %v, want %v", tc.units, got, tc.want)
		}
	}
}
