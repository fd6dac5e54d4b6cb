package registry

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
)

// Overwrite is a write to a unit key after the one a client waits on, with
// other content: the client's write will never run.
type Overwrite struct {
	Unit     string    `json:"unit"`
	Revision int64     `json:"revision"` // 0 when a removal's revision is not known
	Hash     string    `json:"hash,omitempty"`
	Removed  bool      `json:"removed,omitempty"`
	User     string    `json:"user,omitempty"` // from the key's history, when it has the write
	Time     time.Time `json:"time,omitzero"`
}

// WatchOverwrite blocks until one of the unit keys of t in want (unit key
// suffix → the hash written at rev, "" for a removal) holds other content
// written after rev, and returns that write with who stored it where the
// key's history has it. Writing the same content again is not an
// overwrite: the hosts still run what the client wrote. It returns
// ctx.Err() when ctx ends, or an error etcd gives that retrying cannot
// change.
func (c *Client) WatchOverwrite(ctx context.Context, t Target, want map[string]string, rev int64) (Overwrite, error) {
	if err := t.Validate(); err != nil {
		return Overwrite{}, fmt.Errorf("watch writes: %w", err)
	}
	root := c.targetUnits(t)
	var o Overwrite
	err := c.keepWatching(ctx, "watch of "+root, func() (found bool, err error) {
		o, found, err = c.overwrite(ctx, root, want, rev)
		return found, err
	})
	if err != nil {
		return Overwrite{}, err
	}
	c.whoWrote(ctx, t, &o)
	return o, nil
}

// overwrite reads the keys, then watches them from the revision read;
// (found=false, err=nil) asks the caller to read again.
func (c *Client) overwrite(ctx context.Context, root string, want map[string]string, rev int64) (o Overwrite, found bool, err error) {
	units := slices.Sorted(maps.Keys(want))
	var read int64
	for chunk := range slices.Chunk(units, maxTxnOps) {
		ops := make([]clientv3.Op, len(chunk))
		for i, u := range chunk {
			ops[i] = clientv3.OpGet(root+u, clientv3.WithRev(read))
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return Overwrite{}, false, fmt.Errorf("read %s*: %w", root, err)
		}
		if read == 0 {
			read = resp.Header.Revision
		}
		for i, r := range resp.Responses {
			u := chunk[i]
			kvs := r.GetResponseRange().GetKvs()
			switch {
			case len(kvs) == 0 && want[u] != "":
				return Overwrite{Unit: u, Removed: true}, true, nil
			case len(kvs) > 0 && kvs[0].ModRevision > rev && reconcile.Hash(kvs[0].Value) != want[u]:
				return Overwrite{Unit: u, Revision: kvs[0].ModRevision, Hash: reconcile.Hash(kvs[0].Value)}, true, nil
			}
		}
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range c.cli.Watch(wctx, root, clientv3.WithPrefix(), clientv3.WithRev(read+1)) {
		if resp.CompactRevision != 0 {
			return Overwrite{}, false, nil
		}
		if err := resp.Err(); err != nil {
			return Overwrite{}, false, fmt.Errorf("watch %s: %w", root, err)
		}
		for _, ev := range resp.Events {
			u := strings.TrimPrefix(string(ev.Kv.Key), root)
			w, ok := want[u]
			if !ok {
				continue
			}
			if ev.Type == clientv3.EventTypeDelete {
				if w != "" {
					return Overwrite{Unit: u, Revision: ev.Kv.ModRevision, Removed: true}, true, nil
				}
				continue
			}
			if h := reconcile.Hash(ev.Kv.Value); h != w {
				return Overwrite{Unit: u, Revision: ev.Kv.ModRevision, Hash: h}, true, nil
			}
		}
	}
	return Overwrite{}, false, ctx.Err()
}

// whoWrote fills in who stored o and when, from the key's history (the
// record of a write is created in the write's transaction, so it carries
// the write's revision). Best effort: without history o stays as it is.
func (c *Client) whoWrote(ctx context.Context, t Target, o *Overwrite) {
	h, err := c.History(ctx, t, o.Unit)
	if err != nil {
		return
	}
	for i := len(h.Versions) - 1; i >= 0; i-- {
		v := h.Versions[i]
		if v.Revision == o.Revision || o.Revision == 0 && v.Removed == o.Removed {
			o.Revision, o.User, o.Time = v.Revision, v.User, v.Time
			return
		}
	}
}
