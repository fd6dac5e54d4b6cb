package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A commit over etcd's limits: the write hold (issue 35).
//
// A commit whose one transaction etcd would refuse (more than MaxTxnOps
// operations, more than MaxRequestBytes, or less on a server whose own
// limits are lower: etcd's default is 128 operations) is written in
// several transactions behind a hold:
//
//  1. one transaction puts the hold <p>/mirror/holds/<name> = {commit,
//     parent, targets} and claims the owner keys of the targets the commit
//     brings into the tree; it is guarded as the whole commit would be (the
//     state holding the parent, the leader, the hold as read);
//  2. the unit keys, with their history records and the halts they clear,
//     in chunks of at most chunkKeys keys (each well under etcd's default
//     limits), each guarded by the hold and the leader;
//  3. one last transaction moves the state, writes the owners and removes
//     the hold.
//
// An agent's Watch hands on no snapshot while a hold covers one of its
// targets (its host or one of its groups): the units it runs stay as they
// are, as when etcd is away. When the hold goes, it reads everything again
// at one revision and hands on the whole commit at once.
//
// The hold is not bound to a lease: a mirror killed in step 2 leaves it,
// and the hosts it covers stay as they were, until a commit lands. The
// standby (or the restarted leader) finds the state still at the parent
// and mirrors the same commit again, diffed against what the registry
// holds (MirrorTree, which covers the targets step 1 claimed): ApplyCommit
// of the commit a hold names takes the hold over, skips the keys already
// written, writes the rest and removes the hold. A commit other than the
// held one (after a reset, or a rewritten branch) takes it over too: its
// targets are added to the hold's, and since it is diffed against the
// registry's keys it replaces what the held commit left half written.
// A small commit removes a hold in its own one transaction.
//
// Why a hold and not content-addressed blobs behind a pointer: with
// blobs every reader of a unit key (the agent's watch and its snapshot,
// `unit cat`, history, preview, --wait, the rollouts' hashes) would have
// to follow a pointer and every write would have to collect garbage
// blobs; the hold keeps every key as it is, costs the agent one watched
// prefix that is empty when no mirror is used, and costs a commit that
// fits nothing.
//
// Readers that read keys directly (`unit cat`, history) see a commit in
// progress as it is written; their keys are owned by the mirror, so no
// operator write (Put, Remove, --wait) races with it unless forced.

// chunkKeys is how many unit keys one chunk writes at most: with its
// history record and a prune each, about 100 operations, under etcd's
// default of 128.
const chunkKeys = 32

// chunkBytes is how many bytes of values one chunk writes at most (each
// value twice: the key and its history record), under etcd's default
// --max-request-bytes.
const chunkBytes = 512 << 10

// chunkMaxOps is the most operations a chunk may hold: etcd's default
// --max-txn-ops, which an external cluster may keep.
const chunkMaxOps = 128

// mirrorHold is the value of a hold key.
type mirrorHold struct {
	Commit  string   `json:"commit"`
	Parent  string   `json:"parent,omitempty"`
	Targets []string `json:"targets"` // "hosts/h1", "groups/web"
	all     bool     // a value that does not decode: it holds every host
}

func (c *Client) holdsRoot() string          { return c.mirrorRoot() + "holds/" }
func (c *Client) holdKey(name string) string { return c.holdsRoot() + name }

// readHold reads the hold of mirror name; modRev 0: none.
func (c *Client) readHold(ctx context.Context, name string) (mirrorHold, int64, error) {
	key := c.holdKey(name)
	resp, err := c.cli.Get(ctx, key)
	if err != nil {
		return mirrorHold{}, 0, fmt.Errorf("read %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return mirrorHold{}, 0, nil
	}
	var h mirrorHold
	if err := json.Unmarshal(resp.Kvs[0].Value, &h); err != nil {
		// Kept as a hold of no known commit: the next commit removes it.
		h = mirrorHold{}
	}
	return h, resp.Kvs[0].ModRevision, nil
}

// guardHold guards the commit's last (or only) transaction on the hold as
// read, and removes it there when there is one.
func (c *Client) guardHold(ctx context.Context, x *txn, mc MirrorCommit) error {
	_, modRev, err := c.readHold(ctx, mc.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", mc, err)
	}
	key := c.holdKey(mc.Name)
	x.guard(clientv3.Compare(clientv3.ModRevision(key), "=", modRev))
	if modRev != 0 {
		x.then(clientv3.OpDelete(key))
	}
	return nil
}

// MirrorHold says which commit mirror name is writing in chunks now, if
// any (a hold: see above), and the targets whose hosts wait for it.
func (c *Client) MirrorHold(ctx context.Context, name string) (commit string, targets []string, ok bool, err error) {
	if err := validMirrorName(name); err != nil {
		return "", nil, false, err
	}
	h, modRev, err := c.readHold(ctx, name)
	return h.Commit, h.Targets, modRev != 0, err
}

// commitTargets are the targets mc writes keys of, sorted.
func (mc MirrorCommit) commitTargets() []Target {
	all := map[Target]bool{}
	for t, ks := range mc.Puts {
		if len(ks) > 0 {
			all[t] = true
		}
	}
	for t, ks := range mc.Deletes {
		if len(ks) > 0 {
			all[t] = true
		}
	}
	return slices.SortedFunc(maps.Keys(all), compareTargets)
}

// applyChunked writes mc behind a hold (see above) and returns the
// revision of its last transaction.
func (c *Client) applyChunked(ctx context.Context, mc MirrorCommit, o writeOptions) (int64, error) {
	holdRev, resumed, err := c.putHold(ctx, mc)
	if err != nil {
		return 0, err
	}
	if resumed {
		if mc, err = c.dropWritten(ctx, mc); err != nil {
			return 0, err
		}
	}
	n := 0
	var staged []MirrorRollout
	for _, t := range mc.commitTargets() {
		chunks := chunkNames(mc.Puts[t], mc.Deletes[t])
		if t.Group != "" && mc.Rollouts[t.Group] != nil {
			// A rollout's record stages its keys in one write.
			chunks = [][]string{slices.Concat(chunks...)}
		}
		for _, names := range chunks {
			rs, err := c.writeChunk(ctx, mc, t, names, holdRev, o)
			if err != nil {
				return 0, err
			}
			staged = append(staged, rs...)
			n++
			if c.testAfterChunk != nil {
				if err := c.testAfterChunk(n); err != nil {
					return 0, err
				}
			}
		}
	}
	return c.releaseHold(ctx, mc, holdRev, staged, o)
}

// putHold writes the hold of mc (its targets added to those of a hold
// already there) and claims the owner keys of the targets mc brings into
// the tree, guarded as mc's own transaction would be. resumed says the
// hold was mc's already (a mirror killed while writing it).
func (c *Client) putHold(ctx context.Context, mc MirrorCommit) (holdRev int64, resumed bool, err error) {
	key := c.holdKey(mc.Name)
	for range 10 {
		old, _, err := c.readHold(ctx, mc.Name)
		if err != nil {
			return 0, false, err
		}
		// The guards of mc's whole transaction: the state at the parent,
		// the leader, the hold as read (the state's write is left out).
		x := &txn{}
		if _, err := c.guardMirrorState(ctx, x, mc, time.Time{}); err != nil {
			return 0, false, err
		}
		hx := &txn{ifs: x.ifs}
		if err := c.claimOwners(ctx, hx, mc); err != nil {
			return 0, false, err
		}
		h := mirrorHold{Commit: mc.Commit, Parent: mc.Parent, Targets: old.Targets}
		for _, t := range mc.commitTargets() {
			h.Targets = append(h.Targets, t.String())
		}
		slices.Sort(h.Targets)
		h.Targets = slices.Compact(h.Targets)
		b, err := json.Marshal(h)
		if err != nil {
			return 0, false, err
		}
		hx.then(clientv3.OpPut(key, string(b)))
		resp, err := hx.commit(ctx, c.cli)
		if err != nil {
			return 0, false, fmt.Errorf("%s: write %s: %w", mc, key, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, old.Commit == mc.Commit, nil
		}
	}
	return 0, false, fmt.Errorf("%s: %s keeps changing; nothing written, retry", mc, key)
}

// claimOwners adds to x the owner keys of the targets of mc.Owned that no
// mirror owns yet, each guarded as absent; a target mc owns or writes
// that another mirror owns is refused.
func (c *Client) claimOwners(ctx context.Context, x *txn, mc MirrorCommit) error {
	cur, b, err := c.readOwners(ctx, mc)
	if err != nil {
		return err
	}
	claimed := map[string]bool{}
	for _, t := range append(slices.Clone(mc.Owned), mc.commitTargets()...) {
		key := c.ownerKey(t)
		var own mirrorOwner
		if kv := cur[key]; kv != nil {
			if json.Unmarshal(kv.Value, &own) == nil && own.Name != mc.Name {
				return fmt.Errorf("%s: %s: %w", mc, t, &MirroredError{Target: t, Mirror: own.Name, URL: own.URL, Branch: own.Branch})
			}
			continue
		}
		if claimed[key] || !slices.Contains(mc.Owned, t) {
			continue
		}
		claimed[key] = true
		x.guard(clientv3.Compare(clientv3.ModRevision(key), "=", 0))
		x.then(clientv3.OpPut(key, string(b)))
	}
	return nil
}

// dropWritten leaves out of mc the puts whose key holds that content
// already (written before the mirror writing mc stopped).
func (c *Client) dropWritten(ctx context.Context, mc MirrorCommit) (MirrorCommit, error) {
	puts := make(map[Target]map[string][]byte, len(mc.Puts))
	for t, ks := range mc.Puts {
		root := c.targetUnits(t)
		resp, err := c.cli.Get(ctx, root, clientv3.WithPrefix())
		if err != nil {
			return mc, fmt.Errorf("%s: read %s: %w", mc, root, err)
		}
		have := map[string][]byte{}
		for _, kv := range resp.Kvs {
			have[strings.TrimPrefix(string(kv.Key), root)] = kv.Value
		}
		puts[t] = map[string][]byte{}
		for u, v := range ks {
			if old, ok := have[u]; !ok || string(old) != string(v) {
				puts[t][u] = v
			}
		}
	}
	mc.Puts = puts
	return mc, nil
}

// chunkNames splits the keys of one target into chunks of at most
// chunkKeys keys and about chunkBytes of values.
func chunkNames(puts map[string][]byte, dels []string) [][]string {
	names := slices.Compact(slices.Sorted(slices.Values(append(slices.Collect(maps.Keys(puts)), dels...))))
	var out [][]string
	var cur []string
	size := 0
	for _, u := range names {
		n := 2*len(puts[u]) + 512
		if len(cur) > 0 && (len(cur) == chunkKeys || size+n > chunkBytes) {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, u)
		size += n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// writeChunk writes the keys names of target t of mc in one transaction,
// guarded by the hold (holdRev) and the leader, and returns the rollouts
// it stages; one over the limits is split in two (unless it stages a
// rollout: refused then).
func (c *Client) writeChunk(ctx context.Context, mc MirrorCommit, t Target, names []string, holdRev int64, o writeOptions) ([]MirrorRollout, error) {
	puts, dels := map[string][]byte{}, []string{}
	for _, u := range names {
		if v, ok := mc.Puts[t][u]; ok {
			puts[u] = v
		} else {
			dels = append(dels, u)
		}
	}
	for range 10 {
		x := &txn{}
		x.guard(clientv3.Compare(clientv3.ModRevision(c.holdKey(mc.Name)), "=", holdRev))
		if mc.Leader != nil {
			x.guard(mc.Leader.Guard())
		}
		ws, err := c.commitTarget(ctx, t, puts, dels, mc.optionsFor(t, o))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mc, err)
		}
		for _, w := range ws {
			x.guard(w.ifs...)
			x.then(w.ops...)
		}
		if len(x.ops) == 0 {
			return nil, nil // deletes of keys gone already
		}
		what := LimitError{Op: "put", Target: t, Keys: len(names), Write: fmt.Sprintf("a chunk of commit %s of mirror %s", short(mc.Commit), mc.Name)}
		lerr := checkTxnLimits(x, what)
		rollout := t.Group != "" && mc.Rollouts[t.Group] != nil
		if lerr != nil && (rollout || len(names) == 1) {
			return nil, fmt.Errorf("mirror %s: %w", mc.Name, lerr)
		}
		if lerr != nil || max(len(x.ifs), len(x.ops)) > chunkMaxOps && !rollout {
			a, err := c.writeChunk(ctx, mc, t, names[:len(names)/2], holdRev, o)
			if err != nil {
				return nil, err
			}
			b, err := c.writeChunk(ctx, mc, t, names[len(names)/2:], holdRev, o)
			return append(a, b...), err
		}
		resp, err := x.commit(ctx, c.cli)
		if err != nil {
			if lerr := serverLimit(err, x, what); lerr != nil {
				return nil, fmt.Errorf("mirror %s: %w", mc.Name, lerr)
			}
			return nil, fmt.Errorf("%s: %w", mc, err)
		}
		if resp.Succeeded {
			return stagedRollouts(ws), nil
		}
		if err := c.checkHold(ctx, mc, holdRev); err != nil {
			return nil, err
		}
		// A key or a halt changed in between: compose again.
	}
	return nil, fmt.Errorf("%s: its keys keep changing; the hold stays, retry", mc)
}

// checkHold says why a chunk's guard failed when it is not a key's: the
// hold was taken over, or the leadership lost.
func (c *Client) checkHold(ctx context.Context, mc MirrorCommit, holdRev int64) error {
	h, modRev, err := c.readHold(ctx, mc.Name)
	if err != nil {
		return err
	}
	if modRev != holdRev {
		return fmt.Errorf("%s: %w: the hold is now commit %s's", mc, ErrMirrorMoved, short(h.Commit))
	}
	if mc.Leader != nil {
		resp, err := c.cli.Get(ctx, mc.Leader.key)
		if err != nil {
			return fmt.Errorf("%s: %w", mc, err)
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != mc.Leader.rev {
			return fmt.Errorf("%s: %w (%s); the hold stays for the next leader", mc, ErrNotLeader, mc.Leader.id)
		}
	}
	return nil
}

// releaseHold is the last transaction of a chunked commit: the state
// (with the rollouts the chunks staged), the owners and the removal of
// the hold, as the one transaction of a small commit without keys.
func (c *Client) releaseHold(ctx context.Context, mc MirrorCommit, holdRev int64, staged []MirrorRollout, o writeOptions) (int64, error) {
	written := map[Target]bool{}
	for _, t := range mc.commitTargets() {
		written[t] = true
	}
	for range 10 {
		x := &txn{}
		next, err := c.guardMirrorState(ctx, x, mc, o.now().UTC())
		if err != nil {
			return 0, err
		}
		if err := c.guardOwners(ctx, x, mc, written); err != nil {
			return 0, err
		}
		next.Rollouts = staged
		if err := c.putMirrorState(x, next); err != nil {
			return 0, err
		}
		x.guard(clientv3.Compare(clientv3.ModRevision(c.holdKey(mc.Name)), "=", holdRev))
		resp, err := x.commit(ctx, c.cli)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", mc, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		if err := c.checkHold(ctx, mc, holdRev); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("%s: its owners keep changing; the hold stays, retry", mc)
}

// The agent's side: Watch's hook.

// putHold keeps a mirror's hold; one that does not decode holds every
// host.
func (w *unitWatch) putHold(s *unitState, kv *mvccpb.KeyValue) {
	var h mirrorHold
	if err := json.Unmarshal(kv.Value, &h); err != nil {
		w.log.Warn("registry key "+string(kv.Key)+": value is not a mirror's hold; holding as if it covered this host", "key", string(kv.Key), "err", err)
		h = mirrorHold{all: true}
	}
	s.holds[string(kv.Key)] = h
}

// covers says whether h holds this host: it names its host target or one
// of its groups (each is a watched prefix).
func (w *unitWatch) covers(h mirrorHold) bool {
	return h.all || slices.ContainsFunc(h.Targets, func(t string) bool {
		return slices.Contains(w.prefixes, w.c.prefix+"/"+t+"/")
	})
}

// release notes that key, deleted, was a hold over this host: the watch
// then reads everything again and hands that on.
func (w *unitWatch) release(s *unitState, key string) {
	if h, ok := s.holds[key]; ok && w.covers(h) {
		w.released = true
	}
}

// noteChange keeps the revision of a change of a key a commit writes
// (not a rollout's nor a hold).
func (w *unitWatch) noteChange(from int, modRev int64) {
	if p := w.prefixes[from]; !strings.HasPrefix(p, w.c.rolloutsRoot()) && p != w.c.holdsRoot() {
		w.keysRev = max(w.keysRev, modRev)
	}
}

// handOut hands on the snapshot of state at rev, unless a mirror's hold
// covers this host (a commit over etcd's limits is being written), or
// went (the watch reads everything again first). The holds are made known
// up to the newest change of a unit key first: their watcher may lag
// behind the others (it is read at rev then).
func (w *unitWatch) handOut(ctx context.Context, state *unitState, rev int64, onSnapshot func(Snapshot)) {
	if w.released {
		return
	}
	i := slices.Index(w.prefixes, w.c.holdsRoot())
	if i >= 0 && w.shown[i] < w.keysRev {
		if err := w.readHolds(ctx, state, i, rev); err != nil {
			w.log.Warn("not handing on the registry's change yet: "+err.Error(), "revision", rev)
			return
		}
	}
	if w.released {
		return
	}
	for key, h := range state.holds {
		if w.covers(h) {
			w.log.Debug("registry change held: a mirror is writing a commit over etcd's limits", "hold", key, "commit", short(h.Commit), "revision", rev)
			return
		}
	}
	onSnapshot(w.snapshot(state, rev))
}

// readHolds reads the holds (prefix i) at rev, as catchUp does the
// rollouts; a hold over this host gone since releases it.
func (w *unitWatch) readHolds(ctx context.Context, state *unitState, i int, rev int64) error {
	rctx, cancel := w.c.reqCtx(ctx)
	defer cancel()
	p := w.prefixes[i]
	resp, err := w.c.cli.Get(rctx, p, clientv3.WithPrefix(), clientv3.WithRev(rev))
	if err != nil {
		return fmt.Errorf("read %s at revision %d: %w", p, rev, err)
	}
	old := state.holds
	state.holds = map[string]mirrorHold{}
	for _, kv := range resp.Kvs {
		w.putHold(state, kv)
	}
	for key, h := range old {
		if _, ok := state.holds[key]; !ok && w.covers(h) {
			w.released = true
		}
	}
	w.shown[i], w.caughtUp[i] = rev, rev
	return nil
}
