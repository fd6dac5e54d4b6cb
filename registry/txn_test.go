package registry

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/rollout"
)

// opsOf lists w's operations as "put <key>" and "del <key>", in order.
func opsOf(w *writeTxn) []string {
	var out []string
	for _, op := range w.ops {
		verb := "put"
		if op.IsDelete() {
			verb = "del"
		}
		out = append(out, verb+" "+string(op.KeyBytes()))
	}
	return out
}

// A signed put staged as a rollout is one transaction: the keys, their
// history and signature records, the halt it clears and the rollout
// record, guarded by every key, record and halt as read; a write in
// between fails it.
func TestWriteTxnPut(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	web := Target{Group: "web"}
	putBy(t, c, web, "a.service", "A1")
	halt, _ := json.Marshal(reconcile.Halt{Hash: reconcile.Hash([]byte("A1")), Host: "h1"})
	if _, err := c.cli.Put(ctxT(t), c.haltKey("groups/web", "a.service"), string(halt)); err != nil {
		t.Fatal(err)
	}
	at := time.UnixMilli(1_000_000)
	s := rollout.Strategy{Canary: rollout.Count{N: 1}, MaxRestarts: -1}
	r := &rollout.Record{ID: "r1", Strategy: s, Hosts: []string{"h1", "h2"}, WaveEnds: s.WaveEnds(2)}
	o, err := c.resolveWriteOptions(ctxT(t), []WriteOption{SignWith(fakeSigner{}), WithRollout(r, false), withClock(func() time.Time { return at })})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.putTxn(ctxT(t), web, map[string][]byte{"a.service": []byte("A2")}, o)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"put /agentd/groups/web/units/a.service",
		"put /agentd/history/groups/web/units/a.service/00000000000000000002",
		"put /agentd/groups/web/signatures/a.service",
		"del /agentd/halts/groups/web/a.service",
		"put /agentd/rollouts/groups/web/r1",
	}
	if got := opsOf(w); !slices.Equal(got, want) {
		t.Errorf("operations:\n got %q\nwant %q", got, want)
	}
	// The key, the target's owner key (no mirror), its signature record,
	// the halts, the key again (From) and the rollout record's absence.
	if len(w.ifs) != 6 {
		t.Errorf("%d guards, want 6", len(w.ifs))
	}
	if w.op != "put" || w.keys != 1 || r.Units["a.service"].From == nil {
		t.Errorf("write %s of %d keys, rollout units %+v", w.op, w.keys, r.Units)
	}
	putBy(t, c, web, "b.service", "B") // not a key of the write: no guard on it
	resp, err := c.commitWrite(ctxT(t), w)
	if err != nil || !resp.Succeeded {
		t.Fatalf("commit: %v", err)
	}
	if resp, err := c.commitWrite(ctxT(t), w); err != nil || resp.Succeeded {
		t.Errorf("the same write again, its keys now moved: succeeded %v, %v", resp != nil && resp.Succeeded, err)
	}
}

// A removal of whole units is guarded on their drop-ins as judged: one
// put in between fails it, and RemoveRecursive reads again.
func TestWriteTxnRemoveWholeUnits(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	h1 := Target{Host: "h1"}
	putBy(t, c, h1, "a.service", "A")
	o, err := c.resolveWriteOptions(ctxT(t), []WriteOption{OnlyWholeUnits()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.removeTxn(ctxT(t), h1, []string{"a.service"}, false, o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w.wholeUnits, []string{"a.service"}) || w.op != "removal" {
		t.Fatalf("write %s, whole units %v", w.op, w.wholeUnits)
	}
	// The key, its drop-ins and config files (a prefix each), and the
	// target's owner key (no mirror).
	if len(w.ifs) != 4 {
		t.Errorf("%d guards, want 4", len(w.ifs))
	}
	putBy(t, c, h1, "a.service.d/x.conf", "X")
	if resp, err := c.commitWrite(ctxT(t), w); err != nil || resp.Succeeded {
		t.Fatalf("removal after a drop-in was put: succeeded %v, %v", resp != nil && resp.Succeeded, err)
	}
	if _, removed, err := c.RemoveRecursive(ctxT(t), h1, []string{"a.service"}); err != nil || !slices.Equal(removed, []string{"a.service", "a.service.d/x.conf"}) {
		t.Errorf("RemoveRecursive: %v, %v", removed, err)
	}
}
