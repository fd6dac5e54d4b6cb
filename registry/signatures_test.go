package registry

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// fakeSigner "signs" by quoting the message: what a signed write stores
// is checked here, the signature itself in package sshsig.
type fakeSigner struct{ fail bool }

func (f fakeSigner) SignChange(msg []byte) ([]byte, error) {
	if f.fail {
		return nil, errors.New("the agent refused to sign")
	}
	return []byte("SIG(" + string(msg) + ")"), nil
}
func (fakeSigner) Fingerprint() string { return "SHA256:test" }

func sigOf(t *testing.T, c *Client, tg Target, unit string) (reconcile.SignatureRecord, bool) {
	t.Helper()
	resp, err := c.cli.Get(ctxT(t), c.signatureRoot(tg)+unit)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return reconcile.SignatureRecord{}, false
	}
	var r reconcile.SignatureRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
		t.Fatal(err)
	}
	return r, true
}

// A signed put, rm and revert store, in the write's own transaction, a
// record beside each key that signs the documented message with a growing
// sequence number; an unsigned write clears the record; Watch hands the
// records out with their keys, in one snapshot.
func TestSignedWrites(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	h1, web := Target{Host: "h1"}, Target{Group: "web"}
	r, stop := runWatch(t, c, "h1", []string{"web"})
	defer stop()
	at := time.UnixMilli(1_000_000)
	clock := withClock(func() time.Time { return at })

	rev := putBy(t, c, h1, "a.service", "A1", SignWith(fakeSigner{}), clock)
	s1, ok := sigOf(t, c, h1, "a.service")
	want := reconcile.SignedChange{Key: "/agentd/hosts/h1/units/a.service", Target: "hosts/h1", Hash: reconcile.Hash([]byte("A1")), Seq: 1_000_000}
	if !ok || s1.Signature != "SIG("+string(want.Message())+")" || s1.Seq != want.Seq || s1.Key != want.Key || s1.Hash != want.Hash || s1.Signer != "SHA256:test" || s1.Removed {
		t.Fatalf("record %+v, ok %v", s1, ok)
	}
	snap := r.waitFor(t, "the put", 10*time.Second, func(s Snapshot) bool { return s.Revision >= rev })
	if len(snap.Signatures) != 1 || snap.Signatures[0].Unit != "a.service" || snap.Signatures[0].Scope != reconcile.ScopeHost || snap.Signatures[0].ModRevision != rev {
		t.Fatalf("snapshot at %d: signatures %+v", rev, snap.Signatures)
	}

	// The clock went back: the sequence still grows.
	putBy(t, c, h1, "a.service", "A2", SignWith(fakeSigner{}), clock)
	if s2, _ := sigOf(t, c, h1, "a.service"); s2.Seq != s1.Seq+1 {
		t.Errorf("second put: sequence %d, want %d", s2.Seq, s1.Seq+1)
	}
	// A revert says so; a removal signs "removed" and its record stays.
	putBy(t, c, h1, "a.service", "A1", SignWith(fakeSigner{}), Reverting())
	s3, _ := sigOf(t, c, h1, "a.service")
	if !s3.Revert || !strings.Contains(s3.Signature, "revert yes\n") || s3.Seq <= s1.Seq+1 {
		t.Errorf("revert record %+v", s3)
	}
	rmRev, err := c.Remove(ctxT(t), h1, []string{"a.service"}, SignWith(fakeSigner{}))
	if err != nil {
		t.Fatal(err)
	}
	s4, ok := sigOf(t, c, h1, "a.service")
	if !ok || !s4.Removed || s4.Hash != "" || !strings.Contains(s4.Signature, "content removed\n") || s4.Seq <= s3.Seq {
		t.Errorf("removal record %+v, ok %v", s4, ok)
	}
	snap = r.waitFor(t, "the removal", 10*time.Second, func(s Snapshot) bool { return s.Revision >= rmRev })
	if len(snap.Entries) != 0 || len(snap.Signatures) != 1 || snap.Signatures[0].ModRevision != rmRev {
		t.Fatalf("snapshot after the removal: %+v", snap)
	}

	// A group's keys are signed for the group; an unsigned put empties
	// the record of each key it writes, keeping its sequence: the next
	// signed put goes on from it, whatever its clock says.
	putBy(t, c, web, "b.service", "B1", SignWith(fakeSigner{}), clock)
	sb, _ := sigOf(t, c, web, "b.service")
	if sb.Key != "/agentd/groups/web/units/b.service" || !strings.Contains(sb.Signature, "target groups/web\n") {
		t.Errorf("group record %+v", sb)
	}
	rev = putBy(t, c, web, "b.service", "B2")
	if s, ok := sigOf(t, c, web, "b.service"); !ok || s.Signature != "" || s.Seq != sb.Seq || s.Hash != "" {
		t.Errorf("after an unsigned put the record is %+v (ok %v): want no signature, sequence %d", s, ok, sb.Seq)
	}
	snap = r.waitFor(t, "the unsigned put", 10*time.Second, func(s Snapshot) bool { return s.Revision >= rev })
	if len(snap.Signatures) != 2 {
		t.Errorf("signatures after the unsigned put: %+v", snap.Signatures)
	}
	putBy(t, c, web, "b.service", "B3", SignWith(fakeSigner{}), withClock(func() time.Time { return time.UnixMilli(5) }))
	if s, _ := sigOf(t, c, web, "b.service"); s.Seq != sb.Seq+1 {
		t.Errorf("a signed put after an unsigned one, with a clock behind: sequence %d, want %d", s.Seq, sb.Seq+1)
	}
	// The records are not unit keys: ls and the agent's entries skip them.
	ls, err := c.List(ctxT(t), nil)
	if err != nil || len(ls) != 1 || ls[0].Unit != "b.service" {
		t.Errorf("ls: %+v %v", ls, err)
	}
	// A signer that fails stores nothing.
	if _, err := c.Put(ctxT(t), h1, map[string][]byte{"c.service": []byte("C")}, SignWith(fakeSigner{fail: true})); err == nil || !strings.Contains(err.Error(), "refused to sign") {
		t.Fatalf("put with a failing signer: %v", err)
	}
	if _, err := c.Get(ctxT(t), h1, "c.service"); !errors.Is(err, ErrNotFound) {
		t.Errorf("c.service stored without its signature: %v", err)
	}
}
