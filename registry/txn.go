package registry

import (
	"context"
	"fmt"

	"github.com/agentd/agentd/reconcile"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// txn is one etcd transaction as a write composes it: the guards it
// commits under (every one must hold) and the operations it then runs,
// in the order they were added. Each part of a write adds its own guards
// and operations to the one txn, so that the write stays one atomic
// transaction however many parts it has.
type txn struct {
	ifs []clientv3.Cmp
	ops []clientv3.Op
}

// guard adds compares the transaction commits under.
func (x *txn) guard(cmps ...clientv3.Cmp) { x.ifs = append(x.ifs, cmps...) }

// then adds operations the transaction runs when its guards hold.
func (x *txn) then(ops ...clientv3.Op) { x.ops = append(x.ops, ops...) }

// commit sends the transaction; resp.Succeeded is false (and nothing
// written) when a guard did not hold.
func (x *txn) commit(ctx context.Context, kv clientv3.KV) (*clientv3.TxnResponse, error) {
	return kv.Txn(ctx).If(x.ifs...).Then(x.ops...).Commit()
}

// writeTxn is one write of unit keys of a target (Put, Remove), composed
// as one transaction: the keys, each guarded by its ModRevision as read,
// their history records (history.go) and signature records
// (signatures.go), the group's halts the write clears (halts.go) and the
// rollout it stages (rollouts.go). checkLimits measures it and
// commitWrite sends it.
type writeTxn struct {
	txn
	op     string // "put" or "removal"
	target Target
	keys   int // how many unit keys it writes (LimitError.Keys)
	c      *Client
	names  []string             // the unit keys written, sorted
	values map[string][]byte    // a put's new content of each key; nil for a removal
	st     map[string]*keyState // what was read of each key before
	o      writeOptions
	// wholeUnits are the units whose drop-ins and config files a removal
	// judged as read at readRev (RemoveRecursive, OnlyWholeUnits): it is
	// guarded on none of them written since.
	wholeUnits []string
	readRev    int64
}

func (c *Client) newWriteTxn(op string, t Target, names []string, values map[string][]byte, st map[string]*keyState, o writeOptions) *writeTxn {
	return &writeTxn{op: op, target: t, keys: len(names), c: c, names: names, values: values, st: st, o: o}
}

func (w *writeTxn) removal() bool { return w.values == nil }

// compose adds every guard and operation of the write; clears selects
// the group's halts it deletes. A write to a target a mirror owns is
// refused unless forced (guardOwner, mirror.go).
func (w *writeTxn) compose(ctx context.Context, clears func(reconcile.Halt) bool) error {
	if err := w.guardKeys(); err != nil {
		return err
	}
	if err := w.guardOwner(ctx); err != nil {
		return err
	}
	w.writeKeys()
	if err := w.recordHistory(); err != nil {
		return err
	}
	if err := w.sign(); err != nil {
		return err
	}
	if err := w.clearHalts(ctx, clears); err != nil {
		return err
	}
	return w.stageRollout(ctx)
}

// guardKeys refuses the write when an IfModRevision expectation does not
// hold as read, then guards it on each key being unchanged since it was
// read (ModRevision 0: still absent) and, for each of wholeUnits, on no
// drop-in or config file of it written since readRev. Writes of one key
// are serialized by this guard, which keeps its history records in
// order (see History).
func (w *writeTxn) guardKeys() error {
	root := w.c.targetUnits(w.target)
	for u, rev := range w.o.expect {
		s, ok := w.st[u]
		if !ok {
			return fmt.Errorf("%w: IfModRevision(%s) for a key not written", ErrInvalid, u)
		}
		if s.modRev != rev {
			return &ConflictError{Key: root + u, Want: rev, Got: s.modRev}
		}
	}
	for _, u := range w.names {
		w.guard(clientv3.Compare(clientv3.ModRevision(root+u), "=", w.st[u].modRev))
	}
	for _, u := range w.wholeUnits {
		for _, set := range []string{".d/", reconcile.FilesDir} {
			w.guard(clientv3.Compare(clientv3.ModRevision(root+u+set), "<", w.readRev+1).WithPrefix())
		}
	}
	return nil
}

// writeKeys puts each key's new content, or deletes it (a removal).
func (w *writeTxn) writeKeys() {
	root := w.c.targetUnits(w.target)
	for _, u := range w.names {
		if w.removal() {
			w.then(clientv3.OpDelete(root + u))
		} else {
			w.then(clientv3.OpPut(root+u, string(w.values[u])))
		}
	}
}
