package registry

import (
	"errors"
	"slices"
	"testing"

	"github.com/agentd/agentd/rollout"
)

func mirrorRollout(id string) *rollout.Record {
	s := rollout.Strategy{Waves: []rollout.Count{{N: 50, Percent: true}}, MaxRestarts: -1}
	hosts := []string{"h1", "h2"}
	return &rollout.Record{ID: id, Strategy: s, Hosts: hosts, WaveEnds: s.WaveEnds(len(hosts))}
}

// rolloutsOf reads group web's rollouts by ID.
func rolloutsOf(t *testing.T, c *Client) map[string]rollout.View {
	t.Helper()
	vs, err := c.Rollouts(ctxT(t), "web", false)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]rollout.View{}
	for _, v := range vs {
		out[v.Record.ID] = v
	}
	return out
}

// A group with a rollout gets the commit's puts and its deletes as
// rollouts (one each), in the commit's one revision, recorded in the
// state; a host target is written at once. The next commit supersedes the
// rollouts of the keys it writes again, once even when both its puts and
// its deletes share one.
func TestApplyCommitRollouts(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	firstCommit(t, c)
	mc := commit(2, 1, "second: b2, c, no x")
	mc.Puts = map[Target]map[string][]byte{
		mirH1:  {"a.service": []byte("[Service]\nExecStart=/bin/a2\n")},
		mirWeb: {"b.service": []byte("[Service]\nExecStart=/bin/b2\n"), "c.service": []byte("[Service]\nExecStart=/bin/c\n")},
	}
	mc.Deletes = map[Target][]string{mirWeb: {"b.service.d/x.conf"}}
	r2 := mirrorRollout("r2")
	mc.Rollouts = map[string]*rollout.Record{"web": r2}
	rev2 := apply(t, c, mc)

	st, _, err := c.MirrorState(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	want := []MirrorRollout{{ID: "r2", Group: "web"}, {ID: "r2-rm", Group: "web"}}
	if !slices.Equal(st.Rollouts, want) {
		t.Fatalf("state's rollouts %+v, want %+v", st.Rollouts, want)
	}
	vs := rolloutsOf(t, c)
	put, rm := vs["r2"].Record, vs["r2-rm"].Record
	if put == nil || rm == nil {
		t.Fatalf("rollouts %v: want r2 and r2-rm", vs)
	}
	if put.Revision != rev2 || rm.Revision != rev2 {
		t.Errorf("rollouts written at %d and %d, want the commit's revision %d", put.Revision, rm.Revision, rev2)
	}
	if len(put.Units) != 2 || put.Units["b.service"].From == nil || put.Units["c.service"].From != nil {
		t.Errorf("r2's units %+v: want b.service (from b1) and c.service (new)", put.Units)
	}
	if u, ok := rm.Units["b.service.d/x.conf"]; len(rm.Units) != 1 || !ok || u.ToHash != "" || u.From == nil {
		t.Errorf("r2-rm's units %+v: want the removal of x.conf", rm.Units)
	}
	wantWho := "git " + sha(2)[:12] + " Alice <alice@example.com>, signed by " + testSigner
	if put.By != wantWho || put.Reason != "second: b2, c, no x" || !slices.Equal(put.WaveEnds, []int{1, 2}) {
		t.Errorf("r2: by %q, reason %q, waves %v", put.By, put.Reason, put.WaveEnds)
	}
	if h := history(t, c, mirH1, "a.service"); h.ModRevision != rev2 {
		t.Errorf("a.service on h1 (no rollout): revision %d, want %d", h.ModRevision, rev2)
	}
	// The third commit writes b again and deletes c: both its writes share
	// r2, which ends once, superseded; r2-rm (x.conf) runs on.
	mc = commit(3, 2, "third: b3, no c")
	mc.Puts = map[Target]map[string][]byte{mirWeb: {"b.service": []byte("[Service]\nExecStart=/bin/b3\n")}}
	mc.Deletes = map[Target][]string{mirWeb: {"c.service"}}
	mc.Rollouts = map[string]*rollout.Record{"web": mirrorRollout("r3")}
	apply(t, c, mc)
	vs = rolloutsOf(t, c)
	if e := vs["r2"].Record.End; e == nil || e.State != rollout.Superseded || e.SupersededBy != "r3" {
		t.Errorf("r2 ended %+v, want superseded by r3", e)
	}
	if e := vs["r2-rm"].Record.End; e != nil {
		t.Errorf("r2-rm ended %+v, want running", e)
	}
	if vs["r3"].Record == nil || vs["r3-rm"].Record == nil {
		t.Fatalf("rollouts %v: want r3 and r3-rm", vs)
	}

	// A bad record writes nothing.
	mc = commit(4, 3, "bad")
	mc.Puts = map[Target]map[string][]byte{mirWeb: {"b.service": []byte("[Service]\nExecStart=/bin/b4\n")}}
	bad := mirrorRollout("r4")
	bad.Hosts = nil
	mc.Rollouts = map[string]*rollout.Record{"web": bad}
	if _, err := c.ApplyCommit(ctx, mc); !errors.Is(err, ErrInvalid) {
		t.Errorf("a rollout without hosts: %v, want ErrInvalid", err)
	}

	// A reset forgets the rollouts of the commit it leaves.
	if err := c.ResetMirror(ctx, "default", sha(2), "bob"); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := c.MirrorState(ctx, "default"); st.Rollouts != nil {
		t.Errorf("after a reset, rollouts %+v", st.Rollouts)
	}
}
