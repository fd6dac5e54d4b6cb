package registry

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"
)

const (
	testURL    = "https://git.example/ops.git"
	testSigner = "alice SHA256:abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"
)

func sha(n int) string { return fmt.Sprintf("%040x", n) }

var (
	mirH1  = Target{Host: "h1"}
	mirWeb = Target{Group: "web"}
)

// commit is a commit of mirror "default" by Alice.
func commit(n, parent int, subject string) MirrorCommit {
	mc := MirrorCommit{Name: "default", URL: testURL, Branch: "main", Commit: sha(n), Signer: testSigner,
		Author: "Alice <alice@example.com>", Subject: subject, Owned: []Target{mirH1, mirWeb}}
	if parent > 0 {
		mc.Parent = sha(parent)
	}
	return mc
}

func apply(t *testing.T, c *Client, mc MirrorCommit) int64 {
	t.Helper()
	rev, err := c.ApplyCommit(ctxT(t), mc)
	if err != nil {
		t.Fatalf("ApplyCommit %s: %v", mc, err)
	}
	return rev
}

// firstCommit puts a.service on h1, b.service and a drop-in of it on web.
func firstCommit(t *testing.T, c *Client) int64 {
	t.Helper()
	mc := commit(1, 0, "first: a and b")
	mc.Puts = map[Target]map[string][]byte{
		mirH1:  {"a.service": []byte("[Service]\nExecStart=/bin/a\n")},
		mirWeb: {"b.service": []byte("[Service]\nExecStart=/bin/b\n"), "b.service.d/x.conf": []byte("[Service]\nNice=1\n")},
	}
	return apply(t, c, mc)
}

func TestApplyCommitOneRevision(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	rev1 := firstCommit(t, c)
	wantWho := "git " + sha(1)[:12] + " Alice <alice@example.com>, signed by " + testSigner
	for _, k := range []struct {
		t    Target
		unit string
	}{{mirH1, "a.service"}, {mirWeb, "b.service"}, {mirWeb, "b.service.d/x.conf"}} {
		h := history(t, c, k.t, k.unit)
		if h.ModRevision != rev1 || len(h.Versions) != 1 {
			t.Fatalf("%s %s: ModRevision %d, %d versions; want %d, 1", k.t, k.unit, h.ModRevision, len(h.Versions), rev1)
		}
		if v := h.Versions[0]; v.User != wantWho || v.Reason != "first: a and b" || v.Revision != rev1 {
			t.Errorf("%s %s: version %+v; want who %q, why %q", k.t, k.unit, v, wantWho, "first: a and b")
		}
	}

	mc := commit(2, 1, "second")
	mc.Puts = map[Target]map[string][]byte{mirH1: {"a.service": []byte("[Service]\nExecStart=/bin/a2\n")}}
	mc.Deletes = map[Target][]string{mirWeb: {"b.service.d/x.conf", "never-there.service"}}
	rev2 := apply(t, c, mc)
	if h := history(t, c, mirH1, "a.service"); h.ModRevision != rev2 || string(h.Current) != "[Service]\nExecStart=/bin/a2\n" {
		t.Errorf("a.service after the second commit: %d %q", h.ModRevision, h.Current)
	}
	h := history(t, c, mirWeb, "b.service.d/x.conf")
	if h.Exists || len(h.Versions) != 2 || !h.Versions[1].Removed || h.Versions[1].Revision != rev2 || h.Versions[1].Reason != "second" {
		t.Errorf("x.conf after the second commit: %+v", h)
	}
	st, ok, err := c.MirrorState(ctx, "default")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if st.Commit != sha(2) || st.Revision != rev2 || st.Signer != testSigner || st.Subject != "second" || st.URL != testURL || st.Branch != "main" || st.Refused != nil {
		t.Errorf("state: %+v", st)
	}
	tree, err := c.MirrorTree(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	want := map[Target]map[string][]byte{
		mirH1:  {"a.service": []byte("[Service]\nExecStart=/bin/a2\n")},
		mirWeb: {"b.service": []byte("[Service]\nExecStart=/bin/b\n")},
	}
	if len(tree) != 2 || !maps.EqualFunc(tree[mirH1], want[mirH1], bytesEqual) || !maps.EqualFunc(tree[mirWeb], want[mirWeb], bytesEqual) {
		t.Errorf("tree: %q", tree)
	}

	// An empty commit moves the state only.
	rev3 := apply(t, c, commit(3, 2, "README only"))
	if st, _, _ := c.MirrorState(ctx, "default"); st.Commit != sha(3) || st.Revision != rev3 {
		t.Errorf("state after an empty commit: %+v", st)
	}
	if h := history(t, c, mirH1, "a.service"); h.ModRevision != rev2 {
		t.Errorf("an empty commit wrote a.service (revision %d)", h.ModRevision)
	}
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

func TestApplyCommitParentMoved(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	if _, err := c.ApplyCommit(ctx, commit(2, 1, "parent unknown")); !errors.Is(err, ErrMirrorMoved) {
		t.Fatalf("a first commit with a parent: %v, want ErrMirrorMoved", err)
	}
	rev1 := firstCommit(t, c)
	mc := commit(5, 4, "based on another commit")
	mc.Puts = map[Target]map[string][]byte{mirH1: {"a.service": []byte("x")}}
	_, err := c.ApplyCommit(ctx, mc)
	if !errors.Is(err, ErrMirrorMoved) || !strings.Contains(err.Error(), sha(1)) {
		t.Fatalf("ApplyCommit with a wrong parent: %v, want ErrMirrorMoved naming %s", err, sha(1))
	}
	if h := history(t, c, mirH1, "a.service"); h.ModRevision != rev1 || len(h.Versions) != 1 {
		t.Errorf("written anyway: %+v", h)
	}
	if st, _, _ := c.MirrorState(ctx, "default"); st.Commit != sha(1) {
		t.Errorf("state moved: %+v", st)
	}
}

func TestPutOverMirror(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	firstCommit(t, c)
	_, err := c.Put(ctx, mirWeb, map[string][]byte{"b.service": []byte("mine")}, StoredBy("bob@box"))
	want := `put groups/web: owned by mirror "default" (https://git.example/ops.git main): change it in git, or --force (recorded as drift; the next commit puts git's content back)`
	var me *MirroredError
	if !errors.Is(err, ErrMirrored) || !errors.As(err, &me) || err.Error() != want {
		t.Fatalf("Put over a mirror:\n got %v\nwant %s", err, want)
	}
	if me.Mirror != "default" || me.URL != testURL || me.Target != mirWeb {
		t.Errorf("MirroredError: %+v", me)
	}
	if err := c.CheckPut(ctx, mirWeb, map[string][]byte{"b.service": []byte("mine")}); !errors.Is(err, ErrMirrored) {
		t.Errorf("CheckPut over a mirror: %v", err)
	}
	if _, err := c.Remove(ctx, mirH1, []string{"a.service"}); !errors.Is(err, ErrMirrored) || !strings.HasPrefix(err.Error(), `remove from hosts/h1: owned by mirror "default"`) {
		t.Errorf("Remove over a mirror: %v", err)
	}
	if _, err := c.Put(ctx, Target{Host: "h2"}, map[string][]byte{"b.service": []byte("x")}); err != nil {
		t.Errorf("Put to a target no mirror owns: %v", err)
	}
	if name, url, ok, err := c.MirrorOwner(ctx, mirWeb); name != "default" || url != testURL || !ok || err != nil {
		t.Errorf("MirrorOwner = %q %q %v %v", name, url, ok, err)
	}

	rev, err := c.Put(ctx, mirWeb, map[string][]byte{"b.service": []byte("mine")}, StoredBy("bob@box"), WithReason("hotfix"), Force())
	if err != nil {
		t.Fatalf("Put with Force: %v", err)
	}
	h := history(t, c, mirWeb, "b.service")
	v := h.Versions[len(h.Versions)-1]
	if v.Revision != rev || v.User != "bob@box" || v.Reason != "hotfix; forced over mirror default (https://git.example/ops.git): drift from git" {
		t.Errorf("forced version: %+v", v)
	}
	if _, err := c.Remove(ctx, mirWeb, []string{"b.service.d/x.conf"}, Force()); err != nil {
		t.Errorf("Remove with Force: %v", err)
	}
	tree, err := c.MirrorTree(ctx, "default")
	if err != nil || string(tree[mirWeb]["b.service"]) != "mine" || tree[mirWeb]["b.service.d/x.conf"] != nil {
		t.Errorf("tree after drift: %q %v", tree, err)
	}
}

func TestMirrorOwnership(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	firstCommit(t, c)
	mc := commit(2, 1, "h1 leaves the tree")
	mc.Deletes = map[Target][]string{mirH1: {"a.service"}}
	mc.Owned = []Target{mirWeb}
	apply(t, c, mc)
	if _, _, ok, err := c.MirrorOwner(ctx, mirH1); ok || err != nil {
		t.Errorf("h1 still owned (%v)", err)
	}
	if _, err := c.Put(ctx, mirH1, map[string][]byte{"a.service": []byte("by hand")}); err != nil {
		t.Errorf("Put to a target the mirror left: %v", err)
	}
	tree, err := c.MirrorTree(ctx, "default")
	if err != nil || len(tree) != 1 || tree[mirWeb] == nil {
		t.Errorf("tree: %q %v", tree, err)
	}

	other := MirrorCommit{Name: "other", URL: "https://git.example/other.git", Branch: "main", Commit: sha(9), Owned: []Target{mirWeb}}
	if _, err := c.ApplyCommit(ctx, other); !errors.Is(err, ErrMirrored) || !strings.Contains(err.Error(), `mirror "default"`) {
		t.Errorf("another mirror taking web: %v", err)
	}
	other.Owned = nil
	other.Deletes = map[Target][]string{mirWeb: {"b.service"}}
	if _, err := c.ApplyCommit(ctx, other); !errors.Is(err, ErrMirrored) {
		t.Errorf("another mirror deleting from web: %v", err)
	}
	if _, ok, _ := c.MirrorState(ctx, "other"); ok {
		t.Error("the refused commit wrote the other mirror's state")
	}
	twice := commit(3, 2, "web named twice")
	twice.Owned = []Target{mirWeb, mirWeb}
	apply(t, c, twice)
}

func TestCampaignMirror(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	l1, err := c.CampaignMirror(ctx, "default", "r1", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	campaign := func(id string) <-chan *MirrorLeader {
		ch := make(chan *MirrorLeader, 1)
		go func() {
			l, err := c.CampaignMirror(ctx, "default", id, 2*time.Second)
			if err != nil {
				t.Errorf("campaign %s: %v", id, err)
			}
			ch <- l
		}()
		return ch
	}
	second := campaign("r2")
	select {
	case <-second:
		t.Fatal("r2 leads while r1 does")
	case <-time.After(300 * time.Millisecond):
	}
	if id, ok, err := c.MirrorLeaderID(ctx, "default"); id != "r1" || !ok || err != nil {
		t.Errorf("leader = %q %v %v", id, ok, err)
	}
	if _, err := c.cli.Revoke(ctx, l1.sess.Lease()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l1.Done():
	case <-ctx.Done():
		t.Fatal("Done not closed after the lease was revoked")
	}
	l2 := <-second
	if l2 == nil {
		t.FailNow()
	}
	mc := commit(1, 0, "first")
	mc.Leader = l1
	if _, err := c.ApplyCommit(ctx, mc); !errors.Is(err, ErrNotLeader) {
		t.Errorf("ApplyCommit by a lost leader: %v, want ErrNotLeader", err)
	}
	mc.Leader = l2
	apply(t, c, mc)

	third := campaign("r3")
	if err := l2.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	l3 := <-third
	if l3 == nil {
		t.FailNow()
	}
	defer l3.Resign(ctx)
	if id, _, _ := c.MirrorLeaderID(ctx, "default"); id != "r3" {
		t.Errorf("leader after r2 resigned: %q", id)
	}
	mc = commit(2, 1, "second")
	mc.Leader = l2
	if _, err := c.ApplyCommit(ctx, mc); !errors.Is(err, ErrNotLeader) {
		t.Errorf("ApplyCommit by a resigned leader: %v, want ErrNotLeader", err)
	}
}

func TestMirrorSyncRequests(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	if err := c.RequestMirrorSync(ctx, "default", SyncRequest{AllowMassDelete: true, By: "alice@box"}); err != nil {
		t.Fatal(err)
	}
	w1, w2 := c.WatchMirrorSync(ctx, "default"), c.WatchMirrorSync(ctx, "default")
	got := func() SyncRequest {
		t.Helper()
		var r SyncRequest
		select {
		case r = <-w1:
		case r = <-w2:
		case <-ctx.Done():
			t.Fatal("no sync request delivered")
		}
		select {
		case d := <-w1:
			t.Fatalf("delivered twice: %+v", d)
		case d := <-w2:
			t.Fatalf("delivered twice: %+v", d)
		case <-time.After(300 * time.Millisecond):
		}
		return r
	}
	if r := got(); !r.AllowMassDelete || r.By != "alice@box" || r.At.IsZero() {
		t.Errorf("the waiting request: %+v", r)
	}
	if err := c.RequestMirrorSync(ctx, "default", SyncRequest{By: "bob@box"}); err != nil {
		t.Fatal(err)
	}
	if r := got(); r.AllowMassDelete || r.By != "bob@box" {
		t.Errorf("the next request: %+v", r)
	}
	if resp, err := c.cli.Get(ctx, c.mirrorSyncKey("default")); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the request key stays: %v %v", resp, err)
	}
}

func TestResetMirror(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	rev1 := firstCommit(t, c)
	if err := c.ResetMirror(ctx, "default", "abc", "alice@box"); !errors.Is(err, ErrInvalid) {
		t.Errorf("reset to a short ID: %v", err)
	}
	if err := c.ResetMirror(ctx, "default", sha(7), "alice@box"); err != nil {
		t.Fatal(err)
	}
	st, _, err := c.MirrorState(ctx, "default")
	if err != nil || st.Commit != sha(7) || st.Subject != "reset by alice@box to "+sha(7)[:12] || st.URL != testURL || st.Revision <= rev1 {
		t.Errorf("state after reset: %+v %v", st, err)
	}
	if h := history(t, c, mirH1, "a.service"); h.ModRevision != rev1 {
		t.Error("the reset wrote a unit")
	}
	if _, err := c.ApplyCommit(ctx, commit(2, 1, "based on the old tip")); !errors.Is(err, ErrMirrorMoved) {
		t.Errorf("ApplyCommit after a reset: %v", err)
	}
	apply(t, c, commit(8, 7, "after the reset"))
}

func TestRefuseCommit(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	r := MirrorRefusal{Commit: sha(1), Author: "Mallory <m@example.com>", Reason: "not signed"}
	if err := c.RefuseCommit(ctx, "default", r); err != nil {
		t.Fatal(err)
	}
	st, ok, err := c.MirrorState(ctx, "default")
	if err != nil || !ok || st.Name != "default" || st.Commit != "" || st.Refused == nil || st.Refused.Reason != "not signed" || st.Refused.At.IsZero() {
		t.Fatalf("state after a refusal: %+v %v %v", st, ok, err)
	}
	rev := firstCommit(t, c)
	if st, _, _ := c.MirrorState(ctx, "default"); st.Refused != nil {
		t.Errorf("a good commit kept the refusal: %+v", st.Refused)
	}
	if err := c.RefuseCommit(ctx, "default", MirrorRefusal{Commit: sha(2), Reason: "expired key"}); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := c.MirrorState(ctx, "default"); st.Commit != sha(1) || st.Revision != rev || st.Refused == nil || st.Refused.Commit != sha(2) {
		t.Errorf("state after refusing the next commit: %+v", st)
	}
}

func TestApplyCommitLimits(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	mc := commit(1, 0, "too many")
	mc.Puts = map[Target]map[string][]byte{mirH1: {}, mirWeb: {}}
	for i := range 300 {
		mc.Puts[mirH1][fmt.Sprintf("u%03d.service", i)] = []byte("[Service]\n")
		mc.Puts[mirWeb][fmt.Sprintf("u%03d.service", i)] = []byte("[Service]\n")
	}
	_, err := c.ApplyCommit(ctx, mc)
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != LimitOps || le.Keys != 600 || !strings.Contains(err.Error(), "commit "+sha(1)[:12]) || !strings.Contains(err.Error(), "mirror default") {
		t.Fatalf("ApplyCommit of 600 keys: %v", err)
	}
	if _, ok, _ := c.MirrorState(ctx, "default"); ok {
		t.Error("state written")
	}
	if l, err := c.List(ctx, nil); err != nil || len(l) != 0 {
		t.Errorf("keys written: %d %v", len(l), err)
	}

	big := commit(1, 0, "too large")
	big.Puts = map[Target]map[string][]byte{mirH1: {}}
	for i := range 8 {
		big.Puts[mirH1][fmt.Sprintf("big%d.service", i)] = []byte("[Service]\n#" + strings.Repeat("x", 120<<10) + "\n")
	}
	if _, err := c.ApplyCommit(ctx, big); !errors.As(err, &le) || le.Limit != LimitRequest || !strings.Contains(err.Error(), "commit "+sha(1)[:12]) {
		t.Errorf("ApplyCommit of 2 MB: %v", err)
	}
}

func TestAgentsGetNothingOfMirrors(t *testing.T) {
	t.Parallel()
	perms, err := AgentPermissions("", "h1", []string{"web"})
	if err != nil {
		t.Fatal(err)
	}
	c := New(nil, "")
	for _, p := range perms {
		if strings.HasPrefix(p.Key, c.mirrorRoot()) || strings.HasPrefix(c.mirrorRoot(), p.Key) && p.Prefix {
			t.Errorf("an agent is granted %s (prefix %v): mirror keys are an operator's", p.Key, p.Prefix)
		}
	}
}
