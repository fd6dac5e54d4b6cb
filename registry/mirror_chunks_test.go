package registry

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// bigCommit is commit n (parent n-1) putting n keys u000.service… on h1
// and on web.
func bigCommit(n, parent, keys int) MirrorCommit {
	mc := commit(n, parent, fmt.Sprintf("big: %d keys", keys))
	mc.Puts = map[Target]map[string][]byte{mirH1: {}, mirWeb: {}}
	for i := range keys {
		v := []byte(fmt.Sprintf("[Service]\nExecStart=/bin/u%d\n", i))
		mc.Puts[mirH1][fmt.Sprintf("u%03d.service", i)] = v
		mc.Puts[mirWeb][fmt.Sprintf("u%03d.service", i)] = v
	}
	return mc
}

// bigKeys counts the keys of bigCommit in a snapshot.
func bigKeys(s Snapshot) int {
	n := 0
	for _, e := range s.Entries {
		if strings.HasPrefix(e.Unit, "u") {
			n++
		}
	}
	return n
}

// checkWhole fails on any snapshot holding part of a commit of keys keys
// (on h1 and web: 2*keys entries), and says how many hold all of it.
func checkWhole(t *testing.T, r *snapRecorder, keys int) (whole int) {
	t.Helper()
	for _, s := range r.all() {
		switch bigKeys(s) {
		case 0:
		case 2 * keys:
			whole++
		default:
			t.Errorf("snapshot at revision %d holds %d of the commit's %d keys", s.Revision, bigKeys(s), 2*keys)
		}
	}
	return whole
}

// A commit over etcd's default of 128 operations lands whole, in chunks
// behind a hold: a host watching sees the state before it, then all of it.
func TestApplyCommitChunkedLandsWhole(t *testing.T) {
	t.Parallel()
	c := startSmallEtcd(t, 3<<19) // etcd's defaults: 128 operations
	ctx := ctxT(t)
	firstCommit(t, c)
	r, _ := runWatch(t, c, "h1", []string{"web"})
	r.waitFor(t, "the first commit", 5*time.Second, func(s Snapshot) bool { return has(s, "host:a.service=[Service]\nExecStart=/bin/a\n") })

	const keys = 300
	rev := apply(t, c, bigCommit(2, 1, keys))
	r.waitFor(t, "the whole commit", 10*time.Second, func(s Snapshot) bool { return bigKeys(s) == 2*keys })
	if whole := checkWhole(t, r, keys); whole == 0 {
		t.Error("no snapshot with the whole commit")
	}
	st, _, err := c.MirrorState(ctx, "default")
	if err != nil || st.Commit != sha(2) || st.Revision != rev {
		t.Errorf("state %+v (%v); want commit 2 at revision %d", st, err, rev)
	}
	if commit, _, ok, err := c.MirrorHold(ctx, "default"); ok || err != nil {
		t.Errorf("hold of %s left (%v)", commit, err)
	}
	h := history(t, c, mirWeb, "u123.service")
	if len(h.Versions) != 1 || !strings.HasPrefix(h.Versions[0].User, "git "+sha(2)[:12]) || h.Versions[0].Reason != "big: 300 keys" {
		t.Errorf("history of u123.service: %+v", h.Versions)
	}
	// The next, small commit goes in one transaction.
	small := commit(3, 2, "small")
	small.Puts = map[Target]map[string][]byte{mirH1: {"u000.service": []byte("[Service]\nExecStart=/bin/x\n")}}
	if rev3 := apply(t, c, small); rev3 != rev+1 {
		t.Errorf("small commit at revision %d, want %d: one transaction", rev3, rev+1)
	}
}

var errKilled = errors.New("killed")

// A mirror killed halfway leaves the hosts where they were (a host that
// starts meanwhile gets no snapshot); the standby's ApplyCommit of the
// same commit finishes it and each host sees it whole, once.
func TestApplyCommitChunkedKilledThenFinished(t *testing.T) {
	t.Parallel()
	e, c := newTest(t)
	ctx := ctxT(t)
	firstCommit(t, c)
	r, _ := runWatch(t, c, "h1", []string{"web"})
	r.waitFor(t, "the first commit", 5*time.Second, func(s Snapshot) bool { return len(s.Entries) == 3 })

	const keys = 600 // 1,200 puts with their history: over MaxTxnOps
	mc := bigCommit(2, 1, keys)
	c.testAfterChunk = func(n int) error {
		if n == 20 {
			return errKilled
		}
		return nil
	}
	if _, err := c.ApplyCommit(ctx, mc); !errors.Is(err, errKilled) {
		t.Fatalf("ApplyCommit killed after 20 chunks: %v", err)
	}
	if commit, targets, ok, err := c.MirrorHold(ctx, "default"); !ok || err != nil || commit != sha(2) || strings.Join(targets, " ") != "groups/web hosts/h1" {
		t.Fatalf("hold: %s %v %v %v", commit, targets, ok, err)
	}
	if l, err := c.List(ctx, nil); err != nil || len(l) <= 3 || len(l) >= 3+2*keys {
		t.Fatalf("the killed mirror left %d keys (%v), want part of the commit", len(l), err)
	}
	late, _ := runWatch(t, c, "h2", []string{"web"})
	time.Sleep(500 * time.Millisecond)
	if n := len(late.all()); n != 0 {
		t.Errorf("a host starting during the hold got %d snapshots", n)
	}
	if st, _, _ := c.MirrorState(ctx, "default"); st.Commit != sha(1) {
		t.Errorf("state at %s during the hold", st.Commit)
	}

	standby := NewTestClient(t, e.Endpoint())
	apply(t, standby, mc)
	r.waitFor(t, "the whole commit", 10*time.Second, func(s Snapshot) bool { return bigKeys(s) == 2*keys })
	late.waitFor(t, "the whole commit", 10*time.Second, func(s Snapshot) bool { return bigKeys(s) == keys })
	time.Sleep(200 * time.Millisecond)
	if whole := checkWhole(t, r, keys); whole != 1 {
		t.Errorf("%d snapshots with the whole commit, want 1: %s", whole, describe(r.all())[:200])
	}
	for _, s := range late.all() {
		if bigKeys(s) != keys {
			t.Errorf("h2: snapshot at revision %d with %d of %d keys", s.Revision, bigKeys(s), keys)
		}
	}
	if _, _, ok, _ := c.MirrorHold(ctx, "default"); ok {
		t.Error("hold left")
	}
	// Keys written before the kill are not written again.
	for _, u := range []string{"u000.service", "u599.service"} {
		if h := history(t, c, mirH1, u); len(h.Versions) != 1 {
			t.Errorf("%s: %d versions, want 1", u, len(h.Versions))
		}
	}
	if st, _, _ := c.MirrorState(ctx, "default"); st.Commit != sha(2) {
		t.Errorf("state at %s after the standby", st.Commit)
	}
}
