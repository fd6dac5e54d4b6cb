package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/rollout"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNotCoordinator: a coordinator's write found another host elected
// (its term ended): nothing was written.
var ErrNotCoordinator = errors.New("no longer the group's rollout coordinator")

// Coordination is this host's term as its group's rollout coordinator
// (rollout.Coordinator), won in an election at
// <p>/rollouts/coordinator/<group>/ on the agent's membership lease: each
// candidate puts one key bound to its lease, and the oldest key wins (the
// scheme of etcd's concurrency.Election, on the lease the Session already
// keeps: concurrency.Session would keep it a second time, with the
// client's lessor and its wake-ups, see leaseKeeper). A candidate watches
// only the key just older than its own, so a group of N agents costs N
// keys and N one-key watches, and a change of coordinator wakes one
// agent. When the coordinator dies its key goes with its lease (its TTL)
// and the next candidate takes over. Every write of the term is guarded
// by its election key, so two coordinators never both write: a host is
// admitted once, and --max-unavailable holds.
type Coordination struct {
	c     *Client
	host  string
	group string
	key   string
	rev   int64 // the election key's create revision
	lost  <-chan struct{}

	mu sync.Mutex
	st *groupState
}

// Campaign waits until this host coordinates group's rollouts, or ctx
// ends, or the lease is lost.
func (s *Session) Campaign(ctx context.Context, group string) (*Coordination, error) {
	if err := ValidateName("group", group); err != nil {
		return nil, err
	}
	s.mu.Lock()
	k := s.sess
	s.mu.Unlock()
	if k == nil {
		return nil, errLeaseLost
	}
	c := s.c
	key := fmt.Sprintf("%s/%x", c.electionPrefix(group), int64(k.id))
	rctx, cancel := c.reqCtx(ctx)
	resp, err := c.cli.Txn(rctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, s.member.Host, clientv3.WithLease(k.id))).Else(clientv3.OpGet(key)).Commit()
	cancel()
	if err != nil {
		return nil, fmt.Errorf("campaign for group %s: %w", group, err)
	}
	rev := resp.Header.Revision
	if !resp.Succeeded {
		rev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
	}
	co := &Coordination{c: c, host: s.member.Host, group: group, key: key, rev: rev, lost: k.Done()}
	if err := co.waitOlder(ctx); err != nil {
		co.Resign(ctx)
		return nil, fmt.Errorf("campaign for group %s: %w", group, err)
	}
	return co, nil
}

// waitOlder returns once no candidate older than this one is left.
func (co *Coordination) waitOlder(ctx context.Context) error {
	c := co.c
	for {
		rctx, cancel := c.reqCtx(ctx)
		opts := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(co.rev-1))
		resp, err := c.cli.Get(rctx, c.electionPrefix(co.group)+"/", opts...)
		cancel()
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		older := string(resp.Kvs[0].Key)
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		ch := c.cli.Watch(wctx, older, clientv3.WithRev(resp.Header.Revision+1))
		gone := false
		for !gone {
			select {
			case <-ctx.Done():
				wcancel()
				return ctx.Err()
			case <-co.lost:
				wcancel()
				return errLeaseLost
			case wr, ok := <-ch:
				if !ok || wr.Err() != nil {
					gone = true // look again
					break
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypeDelete {
						gone = true
					}
				}
			}
		}
		wcancel()
	}
}

// Lost is closed when the term ended with the lease.
func (co *Coordination) Lost() <-chan struct{} { return co.lost }

// Resign ends the term (or the candidacy): the next candidate takes over
// at once.
func (co *Coordination) Resign(ctx context.Context) {
	_ = co.commit(context.WithoutCancel(ctx), "resign", clientv3.OpDelete(co.key))
}

// Host is the coordinating host (this one).
func (co *Coordination) Host() string { return co.host }

func (co *Coordination) guard() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(co.key), "=", co.rev)
}

// admitChunk bounds the puts of one admission transaction: under etcd's
// default --max-txn-ops (128) with the guard, as a fleet's etcd may have
// it (the embedded one allows MaxTxnOps). A wave of 1,000 hosts is ten
// transactions. Found by BenchmarkRolloutScale at 2,000 agents, whose
// waves of 200 were refused at every pass (the rollout never started).
const admitChunk = maxTxnOps

// Admit lets hosts take rollout r (one key per host, written once).
func (co *Coordination) Admit(ctx context.Context, r *rollout.Record, hosts []string, a rollout.Admission) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	for chunk := range slices.Chunk(hosts, admitChunk) {
		ops := make([]clientv3.Op, len(chunk))
		for i, h := range chunk {
			ops[i] = clientv3.OpPut(co.c.admitKey(r.Group, h, r.ID), string(b))
		}
		if err := co.commit(ctx, "admit hosts to rollout "+r.ID, ops...); err != nil {
			return err
		}
		// In the state at once: the next pass must not admit them again
		// before the watch shows the keys.
		co.mu.Lock()
		if st := co.st; st != nil {
			if st.admitted[r.ID] == nil {
				st.admitted[r.ID] = map[string]bool{}
			}
			for _, h := range chunk {
				st.admitted[r.ID][h] = true
			}
		}
		co.mu.Unlock()
	}
	return nil
}

// End writes r's end, if its record did not change since it was read
// (false: it did; look again).
func (co *Coordination) End(ctx context.Context, r *rollout.Record, e rollout.End) (bool, error) {
	next := *r
	next.End = &e
	return co.WriteRecord(ctx, &next)
}

// Join adds hosts to r's last wave, if its record did not change since it
// was read (false: it did; look again).
func (co *Coordination) Join(ctx context.Context, r *rollout.Record, hosts []string) (bool, error) {
	next := *r
	next.Hosts = append(slices.Clone(r.Hosts), hosts...)
	next.WaveEnds = slices.Clone(r.WaveEnds)
	next.WaveEnds[len(next.WaveEnds)-1] = len(next.Hosts)
	next.Joined = append(slices.Clone(r.Joined), hosts...)
	return co.WriteRecord(ctx, &next)
}

// WriteRecord writes next, if its record is still at next.ModRevision
// (false: it moved; look again), in this term only.
//
// Written, the record is in the followed state at once, as admissions are:
// a pass before the watch shows it must not decide on the record as it was
// (run the gate again, write the end again).
func (co *Coordination) WriteRecord(ctx context.Context, next *rollout.Record) (bool, error) {
	w := *next
	ok, err := co.c.writeRollout(ctx, &w, []clientv3.Cmp{co.guard()})
	if err == nil && !ok && !co.elected(ctx) {
		return false, ErrNotCoordinator
	}
	if ok {
		co.mu.Lock()
		if st := co.st; st != nil {
			key := co.c.rolloutKey(w.Group, w.ID)
			if cur := st.records[key]; cur == nil || cur.ModRevision < w.ModRevision {
				st.records[key] = &w
			}
		}
		co.mu.Unlock()
	}
	return ok, err
}

// WriteSummary writes s as rollout s.ID's summary.
func (co *Coordination) WriteSummary(ctx context.Context, s rollout.Summary) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return co.commit(ctx, "write the summary of rollout "+s.ID, clientv3.OpPut(co.c.summaryKey(co.group, s.ID), string(b)))
}

func (co *Coordination) commit(ctx context.Context, what string, ops ...clientv3.Op) error {
	rctx, cancel := co.c.reqCtx(ctx)
	defer cancel()
	x := txn{ifs: []clientv3.Cmp{co.guard()}, ops: ops}
	resp, err := x.commit(rctx, co.c.cli)
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", what, err)
	case !resp.Succeeded:
		return fmt.Errorf("%s: %w", what, ErrNotCoordinator)
	}
	return nil
}

// elected says the election key of this term still stands (a key of
// the same name from a later candidacy of this lease is another term).
func (co *Coordination) elected(ctx context.Context) bool {
	rctx, cancel := co.c.reqCtx(ctx)
	defer cancel()
	resp, err := co.c.cli.Get(rctx, co.key)
	if err != nil {
		return true // not known: the caller looks again
	}
	return len(resp.Kvs) > 0 && resp.Kvs[0].CreateRevision == co.rev
}

// groupState is what the coordinator follows: the group's records,
// summaries, admissions and keys, and every host's progress, decoded once
// per event (the coordinator decides on it many times).
type groupState struct {
	records   map[string]*rollout.Record // by key
	summaries map[string]*rollout.Summary
	progress  map[string]map[string]*rollout.Progress // ID → host
	admitted  map[string]map[string]bool              // ID → host
	entries   map[string]reconcile.Entry              // by key
	// candidates are the group's election keys, each the host of a live
	// agent (its lease holds it): which hosts are up.
	candidates map[string]string
	rev        int64
	// created is each record's create revision (by key), and entriesAt
	// the revision the group's keys are known up to: each prefix has a
	// watch of its own, and a rollout's record may arrive before the keys
	// its transaction wrote (which would read as superseded). A record is
	// shown only once its keys are known (every rollout writes them in
	// the record's own transaction).
	created   map[string]int64
	entriesAt int64
}

// Read runs fn with the group's state as last followed (nil maps before
// the first read). fn must not keep it.
func (co *Coordination) Read(fn func(rollout.GroupState)) {
	co.mu.Lock()
	defer co.mu.Unlock()
	st := co.st
	if st == nil {
		fn(rollout.GroupState{})
		return
	}
	g := rollout.GroupState{Progress: st.progress, Admitted: st.admitted, Summaries: st.summaries, Revision: st.rev,
		Live: make(map[string]bool, len(st.candidates))}
	for _, h := range st.candidates {
		g.Live[h] = true
	}
	for key, r := range st.records {
		if st.created[key] <= st.entriesAt {
			g.Records = append(g.Records, r)
		}
	}
	slices.SortFunc(g.Records, func(a, b *rollout.Record) int { return strings.Compare(a.ID, b.ID) })
	g.Entries = slices.SortedFunc(maps.Values(st.entries), reconcile.CompareEntries)
	fn(g)
}

// Follow reads the group's rollout state at one revision, then follows
// it, calling poke after each change, until ctx ends or the watch fails
// (then it returns the error; call it again to read afresh).
func (co *Coordination) Follow(ctx context.Context, poke func()) error {
	c := co.c
	units := c.targetUnits(Target{Group: co.group})
	prefixes := []string{c.rolloutGroup(co.group), c.summaryRoot() + co.group + "/", c.admitGroup(co.group), c.progressRoot(), c.electionPrefix(co.group) + "/", units}
	st, err := co.readState(ctx, prefixes)
	if err != nil {
		return err
	}
	co.mu.Lock()
	co.st = st
	co.mu.Unlock()
	poke()

	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	var wg sync.WaitGroup
	defer wg.Wait()
	defer wcancel()
	merged := c.watchPrefixes(wctx, &wg, prefixes, st.rev)
	for {
		var it watchItem
		select {
		case <-ctx.Done():
			return ctx.Err()
		case it = <-merged:
		}
		resp := it.resp
		if it.closed {
			resp = clientv3.WatchResponse{Canceled: true, CancelReason: "watch channel closed"}
		}
		if err := resp.Err(); err != nil {
			return fmt.Errorf("follow the rollouts of group %s: %w", co.group, err)
		}
		if resp.Canceled {
			return fmt.Errorf("follow the rollouts of group %s: %s", co.group, resp.CancelReason)
		}
		if len(resp.Events) == 0 {
			continue
		}
		co.mu.Lock()
		for _, ev := range resp.Events {
			co.apply(st, ev.Type, ev.Kv)
			st.rev = max(st.rev, ev.Kv.ModRevision)
		}
		if prefixes[it.from] == units { // the group's keys
			st.entriesAt = max(st.entriesAt, resp.Header.Revision)
		}
		co.mu.Unlock()
		poke()
	}
}

// readState reads the group's state: every key under prefixes, at one
// revision.
func (co *Coordination) readState(ctx context.Context, prefixes []string) (*groupState, error) {
	c := co.c
	ops := make([]clientv3.Op, len(prefixes))
	for i, p := range prefixes {
		ops[i] = clientv3.OpGet(p, clientv3.WithPrefix())
	}
	rctx, cancel := c.reqCtx(ctx)
	resp, err := c.cli.Txn(rctx).Then(ops...).Commit()
	cancel()
	if err != nil {
		return nil, fmt.Errorf("read the rollouts of group %s: %w", co.group, err)
	}
	st := &groupState{records: map[string]*rollout.Record{}, summaries: map[string]*rollout.Summary{},
		progress: map[string]map[string]*rollout.Progress{}, admitted: map[string]map[string]bool{}, entries: map[string]reconcile.Entry{}, rev: resp.Header.Revision,
		candidates: map[string]string{},
		created:    map[string]int64{}, entriesAt: resp.Header.Revision}
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().GetKvs() {
			co.apply(st, clientv3.EventTypePut, kv)
		}
	}
	return st, nil
}

// apply folds one key into st.
func (co *Coordination) apply(st *groupState, typ mvccpb.Event_EventType, kv *mvccpb.KeyValue) {
	c, key, del := co.c, string(kv.Key), typ == clientv3.EventTypeDelete
	switch {
	case strings.HasPrefix(key, c.progressRoot()):
		rest := strings.TrimPrefix(key, c.progressRoot())
		host, id, ok := strings.Cut(rest, "/")
		if !ok {
			return
		}
		if del {
			if m := st.progress[id]; m != nil {
				delete(m, host)
			}
			return
		}
		if _, _, p, ok := c.decodeProgress(kv.Key, kv.Value); ok {
			if st.progress[id] == nil {
				st.progress[id] = map[string]*rollout.Progress{}
			}
			st.progress[id][host] = p
		}
	case strings.HasPrefix(key, c.electionPrefix(co.group)+"/"):
		if del {
			delete(st.candidates, key)
		} else {
			st.candidates[key] = string(kv.Value)
		}
	case strings.HasPrefix(key, c.admitGroup(co.group)):
		host, id, ok := strings.Cut(strings.TrimPrefix(key, c.admitGroup(co.group)), "/")
		if !ok {
			return
		}
		if del {
			delete(st.admitted[id], host)
			return
		}
		if st.admitted[id] == nil {
			st.admitted[id] = map[string]bool{}
		}
		st.admitted[id][host] = true
	case strings.HasPrefix(key, c.summaryRoot()):
		id := key[strings.LastIndexByte(key, '/')+1:]
		var s rollout.Summary
		if del || json.Unmarshal(kv.Value, &s) != nil {
			delete(st.summaries, id)
			return
		}
		st.summaries[id] = &s
	case strings.HasPrefix(key, c.rolloutGroup(co.group)):
		if del {
			delete(st.records, key)
			return
		}
		r, err := decodeRollout(kv)
		if err != nil {
			c.skipKey(kv.Key, "not a rollout record", err)
			delete(st.records, key)
			return
		}
		st.records[key], st.created[key] = r, kv.CreateRevision
	default:
		t, unit, ok := c.parseUnitKey(key)
		if !ok || t.Group != co.group {
			return
		}
		if del {
			delete(st.entries, key)
			return
		}
		st.entries[key] = reconcile.Entry{Scope: reconcile.ScopeGroup, Group: t.Group, Unit: unit, Value: kv.Value, ModRevision: kv.ModRevision}
	}
}

// Coordinator is the host that coordinates group now ("": none), by the
// election's oldest candidate.
func (c *Client) Coordinator(ctx context.Context, group string) (string, error) {
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(rctx, c.electionPrefix(group)+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", fmt.Errorf("read the coordinator of group %s: %w", group, err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

var _ rollout.Term = (*Coordination)(nil)

// ReadFollowed reads the summary of the rollout ref names, which a
// rollout of this group follows (--after): its phase, or why it could not
// be read. Only the summary: an agent's role reads every group's
// summaries, not their records (which hold unit content).
func (co *Coordination) ReadFollowed(ctx context.Context, ref rollout.Ref) rollout.Followed {
	rctx, cancel := co.c.reqCtx(ctx)
	defer cancel()
	resp, err := co.c.cli.Get(rctx, co.c.summaryKey(ref.Group, ref.ID))
	if err != nil {
		return rollout.Followed{Err: err.Error()}
	}
	if len(resp.Kvs) == 0 {
		return rollout.Followed{}
	}
	var s rollout.Summary
	if err := json.Unmarshal(resp.Kvs[0].Value, &s); err != nil {
		return rollout.Followed{Err: "its summary does not decode: " + err.Error()}
	}
	return rollout.Followed{Phase: &s.Phase, At: s.At}
}
