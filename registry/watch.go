package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/rollout"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// settleDelay bounds how long Watch keeps collecting watch responses after
// the first one before it hands out a snapshot. A transaction that touches
// several watched prefixes (host and group keys) arrives on separate
// watchers, and must land as one snapshot (one pass, one restart). Watch
// does not wait this long as a rule: it asks etcd for a progress
// notification right after the first event, and etcd queues that behind
// every event of the revisions before it on the same stream; once each
// watcher has shown that revision the transaction is complete. The bound
// holds when etcd does not answer (it ignores the request while any watcher
// of the stream is still catching up, and etcd before 3.4 never answers).
const settleDelay = 10 * time.Millisecond

// a watch that lived this long is considered healthy: its failure restarts
// the retry backoff from the bottom.
const healthyWatch = 10 * time.Second

var errWatchClosed = errors.New("watch channel closed")

// Watch delivers the unit keys meant for host: <p>/hosts/<host>/units/ and
// <p>/groups/<g>/units/ for each of groups, with their signature records
// (<p>/hosts/<host>/signatures/, …: Snapshot.Signatures; each target is one
// watched prefix, so a key and its record written together arrive
// together); and the halts of those groups,
// <p>/halts/groups/<g>/, in Snapshot.Halts (sorted by Scope, Unit; a halt
// whose value does not decode is left out and logged).
//
// It reads all of them in one transaction (one revision R), calls
// onSnapshot with the complete Snapshot, then watches every prefix from R+1
// and calls onSnapshot with the complete new Snapshot after each batch of
// changes, a halt put or deleted included (responses arriving within 10 ms
// are coalesced; all events of one revision on one prefix always arrive in
// one batch). Entries are sorted by (Scope, Group, Unit); their Value
// slices are shared between snapshots and must not be modified.
//
// On compaction, a closed watch channel or a watch error it re-reads
// everything (new R) after a backoff of 100 ms doubling to 10 s with
// jitter; it also re-reads every ResyncInterval (±10 %) and hands out that
// snapshot even when nothing changed. While etcd is unreachable it keeps
// retrying and never calls onSnapshot: a snapshot is only ever the result
// of a successful read plus watched events. Snapshot.Revision is the read
// revision, then the revision of the newest change applied.
//
// While a git mirror's hold names host or one of groups (a commit over
// etcd's limits being written, mirror_chunks.go) it hands on nothing; when
// the hold goes it reads everything again and hands that on.
//
// onSnapshot runs on Watch's goroutine; it should return quickly (store the
// snapshot and poke a loop). Watch returns ctx.Err() when ctx is done, an
// error for invalid arguments, or one when the Client is closed.
func (c *Client) Watch(ctx context.Context, host string, groups []string, onSnapshot func(Snapshot)) error {
	if err := ValidateName("host", host); err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	gs := slices.Clone(groups)
	slices.Sort(gs)
	gs = slices.Compact(gs)
	for _, g := range gs {
		if err := ValidateName("group", g); err != nil {
			return fmt.Errorf("watch: %w", err)
		}
	}
	log := c.log.With("host", host)
	w := &unitWatch{c: c, log: log, host: host, prefixes: []string{c.targetRoot(Target{Host: host})}}
	for _, g := range gs {
		w.prefixes = append(w.prefixes, c.targetRoot(Target{Group: g}), c.groupHalts(g), c.rolloutGroup(g), c.admitDir(g, host))
	}
	w.prefixes = append(w.prefixes, c.progressDir(host), c.holdsRoot()) // holds: mirror_chunks.go

	fails := 0
	retry := func(what string, err error) error {
		if c.cli.Ctx().Err() != nil {
			return fmt.Errorf("watch %s: etcd client closed", host)
		}
		d := backoffDelay(fails)
		fails++
		lvl := slog.LevelWarn
		if errors.Is(err, rpctypes.ErrCompacted) {
			lvl = slog.LevelInfo
		}
		log.Log(ctx, lvl, what+"; keeping the last snapshot and retrying", "err", err, "retry_in", d.Round(time.Millisecond))
		return sleepCtx(ctx, d)
	}
	for {
		state, rev, err := w.read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := retry("registry read failed", err); err != nil {
				return err
			}
			continue
		}
		w.shown = make([]int64, len(w.prefixes))
		w.caughtUp = make([]int64, len(w.prefixes))
		for i := range w.shown {
			w.shown[i] = rev
		}
		w.released, w.keysRev = false, 0
		w.handOut(ctx, state, rev, onSnapshot)
		if c.testAfterRead != nil {
			c.testAfterRead()
		}
		start := time.Now()
		err = w.watch(ctx, state, rev, onSnapshot)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil { // periodic resync
			fails = 0
			continue
		}
		if time.Since(start) > healthyWatch {
			fails = 0
		}
		if err := retry("registry watch ended", err); err != nil {
			return err
		}
	}
}

type unitWatch struct {
	c        *Client
	log      *slog.Logger
	host     string
	prefixes []string
	// shown is, per prefix, the revision up to which its watcher has
	// delivered every event (a progress notification's revision, or its
	// newest event's): Snapshot.RolloutsRevision is the lowest of the
	// rollout prefixes'.
	shown []int64
	// caughtUp is, per prefix, the revision catchUp read it at (0: never).
	caughtUp []int64
	// handedRollouts is the RolloutsRevision of the last snapshot handed
	// out: when a progress notification moves it, a snapshot goes out
	// again (a unit change held back for it can go on).
	handedRollouts int64
	// released: a mirror's hold over this host's targets went; the watch
	// reads everything again (mirror_chunks.go).
	released bool
	// keysRev is the newest revision of a change of a unit key, signature
	// or halt: a snapshot is handed on once the holds are known up to it.
	keysRev int64
}

// Snapshot is what Watch hands out: the host's keys, and its view of its
// groups' rollouts.
type Snapshot struct {
	reconcile.Snapshot
	Rollouts rollout.HostView
}

// snapshot is state's snapshot at rev, with how far the rollouts are known.
func (w *unitWatch) snapshot(state *unitState, rev int64) Snapshot {
	snap := state.snapshot(rev)
	snap.Rollouts.KnownUpTo = w.rolloutsRevision(rev)
	w.handedRollouts = snap.Rollouts.KnownUpTo
	return snap
}

func (w *unitWatch) isRolloutPrefix(p string) bool {
	return strings.HasPrefix(p, w.c.rolloutsRoot()+"groups/")
}

// unitState is what the watched keys hold, by full key, and the entries
// kept in snapshot order: a change moves one entry, and handing out a
// snapshot copies the list instead of sorting every key again.
type unitState struct {
	entries map[string]reconcile.Entry
	sorted  []reconcile.Entry
	// sigs are the signature records, kept as entries are.
	sigs       map[string]reconcile.Entry
	sortedSigs []reconcile.Entry
	halts      map[string]reconcile.Halt
	// rollouts are the records by key; mine this host's progress and
	// admitted its admissions, by key, with the rollout ID.
	rollouts map[string]*rollout.Record
	mine     map[string]idProgress
	admitted map[string]string
	// holds are the mirrors' holds, by key (mirror_chunks.go).
	holds map[string]mirrorHold
}

type idProgress struct {
	id string
	p  *rollout.Progress
}

func newUnitState() *unitState {
	return &unitState{entries: map[string]reconcile.Entry{}, sigs: map[string]reconcile.Entry{}, halts: map[string]reconcile.Halt{},
		rollouts: map[string]*rollout.Record{}, mine: map[string]idProgress{}, admitted: map[string]string{}, holds: map[string]mirrorHold{}}
}

func (s *unitState) snapshot(rev int64) Snapshot {
	halts := slices.SortedFunc(maps.Values(s.halts), compareHalts)
	snap := Snapshot{Snapshot: reconcile.Snapshot{Revision: rev, Entries: slices.Clone(s.sorted), Halts: halts}}
	if len(s.sortedSigs) > 0 {
		snap.Signatures = slices.Clone(s.sortedSigs)
	}
	if len(s.rollouts) == 0 {
		return snap
	}
	v := &snap.Rollouts
	for _, r := range s.rollouts {
		if r.End == nil || r.End.State != rollout.Done {
			v.Records = append(v.Records, r)
		}
	}
	slices.SortFunc(v.Records, func(a, b *rollout.Record) int { return strings.Compare(a.ID, b.ID) })
	v.Mine = make(map[string]*rollout.Progress, len(s.mine))
	for _, m := range s.mine {
		v.Mine[m.id] = m.p
	}
	v.Admitted = make(map[string]bool, len(s.admitted))
	for _, id := range s.admitted {
		v.Admitted[id] = true
	}
	return snap
}

func (s *unitState) setEntry(key string, e reconcile.Entry) {
	setSorted(s.entries, &s.sorted, key, e)
}

// setSorted puts e under key in byKey and in its place in sorted.
func setSorted(byKey map[string]reconcile.Entry, sorted *[]reconcile.Entry, key string, e reconcile.Entry) {
	i, found := slices.BinarySearchFunc(*sorted, e, reconcile.CompareEntries)
	if found {
		(*sorted)[i] = e
	} else {
		*sorted = slices.Insert(*sorted, i, e)
	}
	byKey[key] = e
}

// deleteSorted takes key out of byKey and sorted.
func deleteSorted(byKey map[string]reconcile.Entry, sorted *[]reconcile.Entry, key string) {
	if e, ok := byKey[key]; ok {
		if i, found := slices.BinarySearchFunc(*sorted, e, reconcile.CompareEntries); found {
			*sorted = slices.Delete(*sorted, i, i+1)
		}
		delete(byKey, key)
	}
}

func (s *unitState) delete(key string) {
	deleteSorted(s.entries, &s.sorted, key)
	deleteSorted(s.sigs, &s.sortedSigs, key)
	delete(s.halts, key)
	delete(s.rollouts, key)
	delete(s.mine, key)
	delete(s.admitted, key)
	delete(s.holds, key)
}

func (w *unitWatch) put(s *unitState, kv *mvccpb.KeyValue) {
	if h, ok, err := w.c.decodeHalt(kv.Key, kv.Value); ok {
		if err != nil {
			w.log.Warn("skipping registry key "+string(kv.Key)+": value is not a rollout halt", "key", string(kv.Key), "err", err)
			delete(s.halts, string(kv.Key))
			return
		}
		s.halts[string(kv.Key)] = h
		return
	}
	if strings.HasPrefix(string(kv.Key), w.c.rolloutsRoot()) {
		w.putRollout(s, kv)
		return
	}
	if strings.HasPrefix(string(kv.Key), w.c.holdsRoot()) {
		w.putHold(s, kv)
		return
	}
	t, unit, ok := w.c.parseUnitKey(string(kv.Key))
	if !ok {
		if t, unit, ok := w.c.parseSignatureKey(string(kv.Key)); ok {
			e := reconcile.Entry{Scope: t.Scope(), Group: t.Group, Unit: unit, Value: kv.Value, ModRevision: kv.ModRevision}
			setSorted(s.sigs, &s.sortedSigs, string(kv.Key), e)
		}
		return // not a unit key (e.g. <p>/hosts/h/other); ignore
	}
	e := reconcile.Entry{Scope: reconcile.ScopeHost, Unit: unit, Value: kv.Value, ModRevision: kv.ModRevision}
	if t.Group != "" {
		e.Scope, e.Group = reconcile.ScopeGroup, t.Group
	}
	s.setEntry(string(kv.Key), e)
}

// read gets every watched prefix in one transaction, at one revision.
func (w *unitWatch) read(ctx context.Context) (*unitState, int64, error) {
	ops := make([]clientv3.Op, len(w.prefixes))
	for i, p := range w.prefixes {
		ops[i] = clientv3.OpGet(p, clientv3.WithPrefix())
	}
	rctx, cancel := w.c.reqCtx(ctx)
	defer cancel()
	resp, err := w.c.cli.Txn(rctx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", w.prefixes[0], err)
	}
	s := newUnitState()
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().GetKvs() {
			w.put(s, kv)
		}
	}
	return s, resp.Header.Revision, nil
}

type watchItem struct {
	from   int // index in prefixes
	resp   clientv3.WatchResponse
	closed bool
}

// watch follows every prefix from rev+1, updating state and handing out
// snapshots. It returns nil when the periodic resync is due, or the error
// that ended the watch.
func (w *unitWatch) watch(ctx context.Context, state *unitState, rev int64, onSnapshot func(Snapshot)) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	merged := w.c.watchPrefixes(wctx, &wg, w.prefixes, rev)

	resync := time.NewTimer(reconcile.Jitter(w.c.resyncInterval))
	defer resync.Stop()
	// catchUp fires when a snapshot went out with the rollouts known only
	// up to a revision below its own (a unit change held back for them):
	// etcd may never answer the progress request (it ignores one while a
	// watcher of the stream is catching up, which at thousands of agents
	// happens), so the rollout prefixes are read at the revision instead.
	catchUp := time.NewTimer(time.Hour)
	catchUp.Stop()
	defer catchUp.Stop()
	catchUpWait := time.Duration(0)
	armCatchUp := func() {
		if w.handedRollouts < rev {
			catchUpWait = min(max(2*catchUpWait, 250*time.Millisecond), 5*time.Second)
			catchUp.Reset(catchUpWait)
		} else {
			catchUpWait = 0
		}
	}
	for {
		if w.released {
			return nil // read it all again, at one revision
		}
		var it watchItem
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-resync.C:
			return nil
		case <-catchUp.C:
			if w.handedRollouts < rev {
				if err := w.catchUp(ctx, state, rev); err != nil {
					return err
				}
				w.handOut(ctx, state, rev, onSnapshot)
			}
			armCatchUp()
			continue
		case it = <-merged:
		}
		changed, err := w.apply(state, &rev, it)
		if err != nil {
			return err
		}
		if !changed {
			if w.handedRollouts < rev && w.rolloutsRevision(rev) > w.handedRollouts {
				w.handOut(ctx, state, rev, onSnapshot)
				armCatchUp()
			}
			continue
		}
		// This host's own progress and admissions are written alone:
		// handed out at once, without asking etcd for a progress
		// notification (a request per host per step).
		if p := w.prefixes[it.from]; p == w.c.progressDir(w.host) || strings.HasPrefix(p, w.c.admitRoot()) {
			w.handOut(ctx, state, rev, onSnapshot)
			continue
		}
		if err := w.settle(ctx, wctx, state, &rev, it.from, merged); err != nil {
			return err
		}
		w.handOut(ctx, state, rev, onSnapshot)
		armCatchUp()
	}
}

// watchPrefixes watches every prefix from rev+1, each in a goroutine of
// wg, and merges their responses into one channel (from: the prefix's
// index), until wctx ends; a watch whose channel closes sends one item
// marked closed.
func (c *Client) watchPrefixes(wctx context.Context, wg *sync.WaitGroup, prefixes []string, rev int64) <-chan watchItem {
	merged := make(chan watchItem)
	for i, p := range prefixes {
		ch := c.cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		wg.Go(func() {
			defer func() {
				for range ch { // drain until the client closes it after cancel
				}
			}()
			for resp := range ch {
				select {
				case merged <- watchItem{from: i, resp: resp}:
				case <-wctx.Done():
					return
				}
			}
			select {
			case merged <- watchItem{closed: true}:
			case <-wctx.Done():
			}
		})
	}
	return merged
}

// requestProgress asks etcd for a progress notification on every watcher
// of the stream; a failed request only costs the wait.
func (w *unitWatch) requestProgress(ctx context.Context) {
	if !w.c.testNoProgress {
		_ = w.c.cli.RequestProgress(ctx)
	}
}

// catchUp reads every rollout prefix whose watcher has not shown rev at
// rev, and takes that as shown: the records then speak for rev. A watch
// event of a revision up to rev that arrives after it is skipped (apply),
// so an older value never overwrites the one read.
func (w *unitWatch) catchUp(ctx context.Context, state *unitState, rev int64) error {
	rctx, cancel := w.c.reqCtx(ctx)
	defer cancel()
	for i, p := range w.prefixes {
		if !w.isRolloutPrefix(p) || w.shown[i] >= rev {
			continue
		}
		resp, err := w.c.cli.Get(rctx, p, clientv3.WithPrefix(), clientv3.WithRev(rev))
		if err != nil {
			return fmt.Errorf("read %s at revision %d: %w", p, rev, err)
		}
		for key := range state.rollouts {
			if strings.HasPrefix(key, p) {
				delete(state.rollouts, key)
			}
		}
		for _, kv := range resp.Kvs {
			w.put(state, kv)
		}
		w.shown[i] = rev
		w.caughtUp[i] = rev
	}
	return nil
}

// rolloutsRevision is how far every rollout prefix's watcher has shown
// (at most rev).
func (w *unitWatch) rolloutsRevision(rev int64) int64 {
	low := rev
	for i, p := range w.prefixes {
		if w.isRolloutPrefix(p) && w.shown[i] < low {
			low = w.shown[i]
		}
	}
	return low
}

// rolloutSettleMax bounds how long settle waits for the rollouts' watchers
// (see settle); etcd answers a progress request within milliseconds unless
// a watcher of the stream is catching up.
const rolloutSettleMax = time.Second

// rolloutsSeen says every rollout prefix's watcher has shown the target
// revision.
func (w *unitWatch) rolloutsSeen(seen []bool) bool {
	for i, p := range w.prefixes {
		if !seen[i] && w.isRolloutPrefix(p) {
			return false
		}
	}
	return true
}

// settle collects the rest of the transactions up to *rev: it returns once
// every prefix's watcher has delivered a response at *rev or later (an
// event, or the progress notification it asks for), or after settleDelay.
// first is the prefix whose event started it.
func (w *unitWatch) settle(ctx, wctx context.Context, state *unitState, rev *int64, first int, merged <-chan watchItem) error {
	if len(w.prefixes) == 1 {
		return nil
	}
	start := time.Now()
	timer := time.NewTimer(w.c.settleDelay)
	defer timer.Stop()
	target := *rev
	seen := make([]bool, len(w.prefixes))
	seen[first] = true
	left := len(w.prefixes) - 1
	// A failed request only costs the wait: the timer ends it.
	w.requestProgress(wctx)
	for left > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			// A rollout's record must come with the keys it stages (a
			// host outside the first wave would otherwise run the change
			// for the moment between them): its group's watcher is waited
			// for, asking again, up to rolloutSettleMax.
			if !w.rolloutsSeen(seen) && time.Since(start) < rolloutSettleMax {
				w.requestProgress(wctx)
				timer.Reset(w.c.settleDelay)
				continue
			}
			return nil
		case it := <-merged:
			if _, err := w.apply(state, rev, it); err != nil {
				return err
			}
			if *rev > target {
				// Another transaction began meanwhile: wait for it too.
				target = *rev
				clear(seen)
				left = len(w.prefixes)
				w.requestProgress(wctx)
			}
			if !seen[it.from] && it.resp.Header.Revision >= target {
				seen[it.from] = true
				left--
			}
		}
	}
	return nil
}

// apply folds one watch response into state. It reports whether any key
// changed.
func (w *unitWatch) apply(state *unitState, rev *int64, it watchItem) (bool, error) {
	if it.closed {
		return false, errWatchClosed
	}
	resp := it.resp
	if err := resp.Err(); err != nil {
		return false, fmt.Errorf("watch %s from revision %d: %w", w.prefixes[0], *rev+1, err)
	}
	if resp.Canceled {
		return false, fmt.Errorf("watch %s canceled by etcd: %s", w.prefixes[0], resp.CancelReason)
	}
	if resp.IsProgressNotify() {
		w.shown[it.from] = max(w.shown[it.from], resp.Header.Revision)
	}
	for _, ev := range resp.Events {
		if ev.Kv.ModRevision <= w.caughtUp[it.from] {
			continue // read since by catchUp
		}
		w.shown[it.from] = max(w.shown[it.from], ev.Kv.ModRevision)
		switch ev.Type {
		case clientv3.EventTypePut:
			w.put(state, ev.Kv)
		case clientv3.EventTypeDelete:
			w.release(state, string(ev.Kv.Key))
			state.delete(string(ev.Kv.Key))
		}
		*rev = max(*rev, ev.Kv.ModRevision)
		w.noteChange(it.from, ev.Kv.ModRevision)
	}
	return len(resp.Events) > 0, nil
}

// putRollout keeps a rollout record, or this host's progress or admission
// in one.
func (w *unitWatch) putRollout(s *unitState, kv *mvccpb.KeyValue) {
	key := string(kv.Key)
	if id, ok := strings.CutPrefix(key, w.c.progressDir(w.host)); ok {
		var p rollout.Progress
		if err := json.Unmarshal(kv.Value, &p); err != nil || id == "" {
			w.log.Warn("skipping registry key "+key+": value is not a rollout host's progress", "key", key, "err", err)
			delete(s.mine, key)
			return
		}
		s.mine[key] = idProgress{id: id, p: &p}
		return
	}
	if strings.HasPrefix(key, w.c.admitRoot()) {
		if id := key[strings.LastIndexByte(key, '/')+1:]; id != "" {
			s.admitted[key] = id
		}
		return
	}
	r, err := decodeRollout(kv)
	if err != nil {
		w.log.Warn("skipping registry key "+key+": value is not a rollout record", "key", key, "err", err)
		delete(s.rollouts, key)
		return
	}
	s.rollouts[key] = r
}
