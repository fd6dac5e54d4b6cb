package registry

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func putBy(t *testing.T, c *Client, tg Target, unit, content string, opts ...WriteOption) int64 {
	t.Helper()
	rev, err := c.Put(ctxT(t), tg, map[string][]byte{unit: []byte(content)}, opts...)
	if err != nil {
		t.Fatalf("Put %s: %v", unit, err)
	}
	return rev
}

func history(t *testing.T, c *Client, tg Target, unit string) History {
	t.Helper()
	h, err := c.History(ctxT(t), tg, unit)
	if err != nil {
		t.Fatalf("History %s: %v", unit, err)
	}
	return h
}

func revisions(h History) []int64 {
	var out []int64
	for _, v := range h.Versions {
		out = append(out, v.Revision)
	}
	return out
}

func TestHistoryRecordsPutsAndRemovals(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	h1 := Target{Host: "h1"}
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := withClock(func() time.Time { return at })
	r1 := putBy(t, c, h1, "a.service", "A1", StoredBy("alice@box"), clock)
	r2, err := c.Put(ctxT(t), h1, map[string][]byte{"a.service": []byte("A22"), "a.service.d/x.conf": []byte("[Service]\n")}, StoredBy("bob@box"))
	if err != nil {
		t.Fatal(err)
	}
	r3, err := c.Remove(ctxT(t), h1, []string{"a.service"}, StoredBy("carol@box"))
	if err != nil {
		t.Fatal(err)
	}
	bin := "\xff\x00binary"
	r4 := putBy(t, c, h1, "a.service", bin) // no StoredBy: user ""

	h := history(t, c, h1, "a.service")
	if got := revisions(h); !slices.Equal(got, []int64{r1, r2, r3, r4}) {
		t.Fatalf("revisions %v, want %v", got, []int64{r1, r2, r3, r4})
	}
	v := h.Versions
	if v[0].User != "alice@box" || v[0].Size != 2 || v[0].Hash != reconcile.Hash([]byte("A1")) || string(v[0].Content) != "A1" || !v[0].Time.Equal(at) || v[0].Removed {
		t.Errorf("version 1 = %+v", v[0])
	}
	if v[1].User != "bob@box" || v[1].Size != 3 || string(v[1].Content) != "A22" {
		t.Errorf("version 2 = %+v", v[1])
	}
	if !v[2].Removed || v[2].User != "carol@box" || v[2].Hash != "" || v[2].Size != 0 {
		t.Errorf("version 3 = %+v", v[2])
	}
	if string(v[3].Content) != bin || v[3].User != "" || v[3].Size != len(bin) {
		t.Errorf("version 4 (not UTF-8) = %+v", v[3])
	}
	if !h.Exists || h.ModRevision != r4 || h.CurrentIndex() != 3 || !h.Is(v[3]) || h.Is(v[1]) {
		t.Errorf("current: exists %v modrev %d index %d", h.Exists, h.ModRevision, h.CurrentIndex())
	}
	// The drop-in has a history of its own, and a.service's does not
	// include it.
	if d := history(t, c, h1, "a.service.d/x.conf"); !slices.Equal(revisions(d), []int64{r2}) {
		t.Errorf("drop-in revisions %v, want [%d]", revisions(d), r2)
	}
	// Another target's key of the same name is another history.
	if g := history(t, c, Target{Group: "h1"}, "a.service"); len(g.Versions) != 0 || g.Exists {
		t.Errorf("group h1 history = %+v", g)
	}
	// A failed remove records nothing.
	if _, err := c.Remove(ctxT(t), h1, []string{"a.service", "nope.service"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("remove of a missing unit: %v", err)
	}
	if got := revisions(history(t, c, h1, "a.service")); len(got) != 4 {
		t.Errorf("after a failed remove: %v", got)
	}
}

func TestHistoryKeepPrunes(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	g := Target{Group: "web"}
	var revs []int64
	for i := range 12 {
		revs = append(revs, putBy(t, c, g, "a.service", fmt.Sprint("v", i)))
	}
	if got := revisions(history(t, c, g, "a.service")); !slices.Equal(got, revs[2:]) {
		t.Fatalf("default keep: %v, want the newest 10 %v", got, revs[2:])
	}
	revs = append(revs, putBy(t, c, g, "a.service", "v12", KeepVersions(3)))
	if got := revisions(history(t, c, g, "a.service")); !slices.Equal(got, revs[10:]) {
		t.Fatalf("keep 3: %v, want %v", got, revs[10:])
	}
	revs = append(revs, putBy(t, c, g, "a.service", "v13", KeepVersions(1)))
	h := history(t, c, g, "a.service")
	if got := revisions(h); !slices.Equal(got, revs[13:]) {
		t.Fatalf("keep 1: %v, want %v", got, revs[13:])
	}
	if _, err := h.Previous(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Previous with one version kept: %v", err)
	}
	// The history keys live outside hosts/ and groups/.
	resp, err := c.cli.Get(ctxT(t), c.prefix+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if strings.Contains(k, "/history/") && !strings.HasPrefix(k, "/agentd/history/groups/web/units/a.service/000") {
			t.Errorf("history key %s", k)
		}
	}
}

func TestHistorySurvivesCompaction(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	h1 := Target{Host: "h1"}
	r1 := putBy(t, c, h1, "a.service", "A1")
	r2 := putBy(t, c, h1, "a.service", "A2")
	rev := putBy(t, c, h1, "b.service", "B")
	if _, err := c.cli.Compact(ctxT(t), rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cli.Get(ctxT(t), c.hostUnits("h1")+"a.service", clientv3.WithRev(r1)); err == nil {
		t.Fatal("etcd still has revision r1 after compaction")
	}
	h := history(t, c, h1, "a.service")
	if got := revisions(h); !slices.Equal(got, []int64{r1, r2}) {
		t.Fatalf("after compaction: %v, want [%d %d]", got, r1, r2)
	}
	if v, err := h.Previous(); err != nil || string(v.Content) != "A1" {
		t.Fatalf("Previous = %+v, %v", v, err)
	}
	// And it goes on after compaction.
	r3 := putBy(t, c, h1, "a.service", "A3")
	if got := revisions(history(t, c, h1, "a.service")); !slices.Equal(got, []int64{r1, r2, r3}) {
		t.Fatalf("after a new put: %v", got)
	}
}

// Writers racing on one key each record their version exactly once, in
// revision order, and pruning keeps exactly Keep.
func TestHistoryConcurrentWriters(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	g := Target{Group: "web"}
	const n = 8
	var wg sync.WaitGroup
	revs := make([]int64, n)
	for i := range n {
		wg.Go(func() {
			r, err := c.Put(ctxT(t), g, map[string][]byte{"a.service": []byte(fmt.Sprint("v", i)), fmt.Sprintf("b%d.service", i): nil}, KeepVersions(n))
			if err != nil {
				t.Errorf("put %d: %v", i, err)
			}
			revs[i] = r
		})
	}
	wg.Wait()
	slices.Sort(revs)
	h := history(t, c, g, "a.service")
	if got := revisions(h); !slices.Equal(got, revs) {
		t.Fatalf("history %v, want every put once %v", got, revs)
	}
	if h.CurrentIndex() != n-1 {
		t.Fatalf("current index %d", h.CurrentIndex())
	}
	putBy(t, c, g, "a.service", "last", KeepVersions(3))
	if got := len(history(t, c, g, "a.service").Versions); got != 3 {
		t.Fatalf("kept %d after keep 3", got)
	}
}

func TestIfModRevision(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	h1 := Target{Host: "h1"}
	r1 := putBy(t, c, h1, "a.service", "A1")
	putBy(t, c, h1, "a.service", "A2")
	_, err := c.Put(ctxT(t), h1, map[string][]byte{"a.service": []byte("A3")}, IfModRevision("a.service", r1))
	var ce *ConflictError
	if !errors.Is(err, ErrConflict) || !errors.As(err, &ce) || ce.Want != r1 {
		t.Fatalf("stale put: %v, want a conflict", err)
	}
	if _, err := c.Remove(ctxT(t), h1, []string{"a.service"}, IfModRevision("a.service", r1)); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale remove: %v, want a conflict", err)
	}
	h := history(t, c, h1, "a.service")
	if len(h.Versions) != 2 || string(h.Current) != "A2" {
		t.Fatalf("a conflict wrote something: %+v", h)
	}
	if _, err := c.Put(ctxT(t), h1, map[string][]byte{"a.service": []byte("A3")}, IfModRevision("a.service", h.ModRevision)); err != nil {
		t.Fatalf("put at the current revision: %v", err)
	}
	if _, err := c.Put(ctxT(t), h1, map[string][]byte{"n.service": []byte("N")}, IfModRevision("n.service", 0)); err != nil {
		t.Fatalf("put of a new key with revision 0: %v", err)
	}
}

// The agents' watch never sees history keys.
func TestWatchIgnoresHistory(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	putBy(t, c, Target{Host: "h1"}, "a.service", "A1")
	putBy(t, c, Target{Group: "all"}, "g.service", "G1")
	r, _ := runWatch(t, c, "h1", []string{"all"})
	putBy(t, c, Target{Host: "h1"}, "a.service", "A2")
	if _, err := c.Remove(ctxT(t), Target{Group: "all"}, []string{"g.service"}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "a.service=A2 and g.service gone", 5*time.Second, func(s Snapshot) bool {
		return has(s, "host:a.service=A2") && len(s.Entries) == 1
	})
	for i, s := range r.all() {
		for _, e := range s.Entries {
			if e.Unit != "a.service" && e.Unit != "g.service" {
				t.Errorf("snapshot %d has entry %+v", i, e)
			}
		}
	}
}

func TestHistoryPreviousAndAt(t *testing.T) {
	t.Parallel()
	v := func(rev int64, content string) Version {
		if content == "-" {
			return Version{Revision: rev, Removed: true}
		}
		return Version{Revision: rev, Content: []byte(content)}
	}
	for _, tc := range []struct {
		name    string
		h       History
		prev    int64 // 0: error
		current int
	}{
		{"current is newest", History{Exists: true, Current: []byte("b"), ModRevision: 5, Versions: []Version{v(3, "a"), v(5, "b")}}, 3, 1},
		{"current in the middle", History{Exists: true, Current: []byte("b"), ModRevision: 5, Versions: []Version{v(3, "a"), v(5, "b"), v(7, "c")}}, 3, 1},
		{"removed", History{Versions: []Version{v(3, "a"), v(5, "-")}}, 3, 1},
		{"changed by etcdctl", History{Exists: true, Current: []byte("x"), ModRevision: 9, Versions: []Version{v(3, "a"), v(5, "b")}}, 5, -1},
		{"deleted by etcdctl", History{Versions: []Version{v(3, "a"), v(5, "b")}}, 5, -1},
		{"only the current", History{Exists: true, Current: []byte("a"), ModRevision: 3, Versions: []Version{v(3, "a")}}, 0, 0},
		{"nothing kept", History{Exists: true, Current: []byte("a"), ModRevision: 3}, 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.h.CurrentIndex(); got != tc.current {
				t.Errorf("CurrentIndex = %d, want %d", got, tc.current)
			}
			p, err := tc.h.Previous()
			switch {
			case tc.prev == 0 && !errors.Is(err, ErrNotFound):
				t.Errorf("Previous = %+v, %v; want ErrNotFound", p, err)
			case tc.prev != 0 && (err != nil || p.Revision != tc.prev):
				t.Errorf("Previous = %+v, %v; want revision %d", p, err, tc.prev)
			}
		})
	}
	h := History{Key: "/agentd/hosts/h1/units/a.service", Exists: true, Current: []byte("b"), ModRevision: 5, Versions: []Version{v(3, "a"), v(5, "b")}}
	if got, err := h.At(3); err != nil || string(got.Content) != "a" {
		t.Errorf("At(3) = %+v, %v", got, err)
	}
	if _, err := h.At(4); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "kept: 3, 5") {
		t.Errorf("At(4) = %v", err)
	}
	if !h.Is(v(5, "b")) || h.Is(v(3, "a")) || h.Is(v(6, "-")) || !(History{}).Is(v(6, "-")) {
		t.Error("Is")
	}
}
