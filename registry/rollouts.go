package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/rollout"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Rollouts (package rollout).
//
// Key layout:
//
//	<p>/rollouts/groups/<g>/<id>            JSON rollout.Record: the change, the strategy, the hosts, control
//	<p>/rollouts/summary/<g>/<id>           JSON rollout.Summary: counts and offenders, by the coordinator
//	<p>/rollouts/admit/<g>/<host>/<id>      JSON rollout.Admission: the coordinator lets host take it
//	<p>/rollouts/hosts/<host>/<id>          JSON rollout.Progress: written by that host's agent only
//	<p>/rollouts/coordinator/<g>/<lease>    the group's election: its value the host
//	<p>/rollouts/gaterun/<g>/<id>           who runs a rollout's gate command now, on that command's lease
//
// The record is written with the change it stages, in the put's own
// transaction (WithRollout). An agent watches its groups' records, its
// own admissions and its own progress, and nothing of the other hosts:
// the coordinator alone reads every host's progress. Each host's progress
// and admissions sit under a prefix of their own, so that `agentd rbac`
// can grant a host write access to its own progress only. No key but the
// election's is bound to a lease: a rollout outlives the CLI and every
// agent.

// ErrRolloutRunning: the put's keys are in a rollout still running.
var ErrRolloutRunning = errors.New("a rollout of these keys is running")

func (c *Client) rolloutsRoot() string                   { return c.prefix + "/rollouts/" }
func (c *Client) rolloutGroup(group string) string       { return c.rolloutsRoot() + "groups/" + group + "/" }
func (c *Client) rolloutKey(group, id string) string     { return c.rolloutGroup(group) + id }
func (c *Client) summaryRoot() string                    { return c.rolloutsRoot() + "summary/" }
func (c *Client) summaryKey(group, id string) string     { return c.summaryRoot() + group + "/" + id }
func (c *Client) progressRoot() string                   { return c.rolloutsRoot() + "hosts/" }
func (c *Client) progressDir(host string) string         { return c.progressRoot() + host + "/" }
func (c *Client) admitRoot() string                      { return c.rolloutsRoot() + "admit/" }
func (c *Client) admitGroup(group string) string         { return c.admitRoot() + group + "/" }
func (c *Client) admitDir(group, host string) string     { return c.admitGroup(group) + host + "/" }
func (c *Client) electionRoot() string                   { return c.rolloutsRoot() + "coordinator/" }
func (c *Client) electionPrefix(group string) string     { return c.electionRoot() + group }
func (c *Client) gateRunRoot() string                    { return c.rolloutsRoot() + "gaterun/" }
func (c *Client) progressKey(host, id string) string     { return c.progressDir(host) + id }
func (c *Client) admitKey(group, host, id string) string { return c.admitDir(group, host) + id }

// NewRolloutID names a rollout: its start time and 4 random bytes, so IDs
// sort by age and two CLIs never pick one.
func NewRolloutID(now time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "r" + now.UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b[:])
}

// WithRollout stages a group write (Put, Remove, RemoveRecursive) as
// rollout r (its ID, Strategy, Hosts, WaveEnds, By and Reason set): the
// same transaction writes r, its Units filled from what the keys held
// (a key the write removes has ToHash ""). A key in another rollout
// still running is refused (ErrRolloutRunning) unless supersede: then
// that rollout ends "superseded" in the same transaction.
func WithRollout(r *rollout.Record, supersede bool) WriteOption {
	return func(o *writeOptions) { o.rollout, o.supersede = r, supersede }
}

// stageRollout, for a write WithRollout, fills o.rollout's Units from
// what the keys hold now and writes it, guarded by their ModRevisions, and
// ends the rollouts it supersedes.
func (w *writeTxn) stageRollout(ctx context.Context) error {
	r := w.o.rollout
	if r == nil {
		return nil
	}
	if err := rolloutTarget(w.target); err != nil {
		return err
	}
	r.Group, r.After = w.target.Group, "" // After is found again on each attempt (a retried write)
	base, err := w.readRolloutBase(ctx)
	if err != nil {
		return err
	}
	now := w.o.now().UTC()
	olds, err := w.follow(base, now)
	if err != nil {
		return err
	}
	r.Units = map[string]rollout.Unit{}
	for _, u := range w.names {
		ru, err := w.rolloutUnit(u, base, olds)
		if err != nil {
			return err
		}
		r.Units[u] = ru
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = now
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	key := w.c.rolloutKey(w.target.Group, r.ID)
	w.guard(clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
	w.then(clientv3.OpPut(key, string(b)))
	return nil
}

// rolloutBase is what a staged write reads, at one revision, before it
// stages its rollout: the group's rollout records, and each key written
// with its signature record (absent: not in the map).
type rolloutBase struct {
	records    []*mvccpb.KeyValue
	keys, sigs map[string]*mvccpb.KeyValue
}

func (w *writeTxn) readRolloutBase(ctx context.Context) (rolloutBase, error) {
	c, t := w.c, w.target
	ops := []clientv3.Op{clientv3.OpGet(c.rolloutGroup(t.Group), clientv3.WithPrefix())}
	for _, u := range w.names {
		ops = append(ops, clientv3.OpGet(c.targetUnits(t)+u))
	}
	for _, u := range w.names {
		ops = append(ops, clientv3.OpGet(c.signatureRoot(t)+u))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return rolloutBase{}, fmt.Errorf("read the rollouts of %s: %w", t, err)
	}
	base := rolloutBase{records: resp.Responses[0].GetResponseRange().GetKvs(), keys: map[string]*mvccpb.KeyValue{}, sigs: map[string]*mvccpb.KeyValue{}}
	for i, u := range w.names {
		if kvs := resp.Responses[1+i].GetResponseRange().GetKvs(); len(kvs) > 0 {
			base.keys[u] = kvs[0]
		}
		if kvs := resp.Responses[1+len(w.names)+i].GetResponseRange().GetKvs(); len(kvs) > 0 {
			base.sigs[u] = kvs[0]
		}
	}
	return base, nil
}

// follow finds the rollout of the group this one follows (After): the
// newest that has not ended done and shares a key with it that no write
// without a rollout has written since (a rollout so overwritten no longer
// runs). A running one that shares a key is refused (ErrRolloutRunning)
// or, with supersede, ended in the same transaction. It returns the
// group's rollouts not done, by ID: the chain of After, for the ways back.
func (w *writeTxn) follow(base rolloutBase, now time.Time) (map[string]*rollout.Record, error) {
	r := w.o.rollout
	held := map[string]string{} // key → hash of what it holds now ("": absent)
	for u, kv := range base.keys {
		held[u] = reconcile.Hash(kv.Value)
	}
	var afterAt time.Time
	olds := map[string]*rollout.Record{}
	for _, kv := range base.records {
		old, err := decodeRollout(kv)
		if err != nil || (old.End != nil && old.End.State == rollout.Done) {
			continue
		}
		olds[old.ID] = old
		var shared []string
		overwritten := false
		for _, u := range w.names {
			if ou, ok := old.Units[u]; ok {
				shared = append(shared, u)
				overwritten = overwritten || held[u] != ou.ToHash
			}
		}
		if len(shared) == 0 || overwritten {
			continue // a put without a rollout wrote its keys since: it no longer runs
		}
		// The new rollout follows this one: a host that has not taken the
		// new change keeps what this one gives it (rollout.Overlay).
		if r.After == "" || old.CreatedAt.After(afterAt) {
			r.After, afterAt = old.ID, old.CreatedAt
		}
		if old.End != nil {
			continue // failed or aborted: it still holds back the hosts it did not reach
		}
		if !supersedes(w.o) {
			return nil, fmt.Errorf("%w: %s (%s) since %s; wait for it, abort it (agentd rollout abort %s), or pass --supersede to end it and start this one",
				ErrRolloutRunning, old.ID, strings.Join(shared, ", "), old.CreatedAt.Local().Format(time.DateTime), old.ID)
		}
		if !w.o.endOnce(old.ID) {
			continue // another write of the transaction ends it
		}
		old.End = &rollout.End{State: rollout.Superseded, Reason: "superseded by " + r.ID, At: now, SupersededBy: r.ID}
		b, err := json.Marshal(old)
		if err != nil {
			return nil, err
		}
		w.guard(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
		w.then(clientv3.OpPut(string(kv.Key), string(b)))
	}
	return olds, nil
}

// rolloutUnit is key u's part of the rollout: what it holds now (From,
// guarded by its ModRevision), the hash it holds after the write, and for
// a signed write the signed ways back.
func (w *writeTxn) rolloutUnit(u string, base rolloutBase, olds map[string]*rollout.Record) (rollout.Unit, error) {
	ru := rollout.Unit{}
	if !w.removal() {
		ru.ToHash = reconcile.Hash(w.values[u])
	}
	key := w.c.targetUnits(w.target) + u
	if kv := base.keys[u]; kv != nil {
		from := string(kv.Value)
		ru.From, ru.FromRevision = &from, kv.ModRevision
		w.guard(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision))
	} else {
		w.guard(clientv3.Compare(clientv3.ModRevision(key), "=", 0))
	}
	if w.o.signer == nil {
		return ru, nil
	}
	back, err := w.signBack(u, ru.From)
	if err != nil {
		return ru, err
	}
	ru.BackSig = back
	// The record that signs From: a host that never ran the key and joins
	// before it takes the change runs From with it.
	if sig := base.sigs[u]; sig != nil && ru.From != nil {
		var rec reconcile.SignatureRecord
		if json.Unmarshal(sig.Value, &rec) == nil && rec.Signature != "" && rec.Hash == hashOf(ru.From) {
			ru.FromSig = string(sig.Value)
		}
	}
	// A host that did not take the rollouts this one follows (or went back
	// from them) goes back past From, to what they give it
	// (rollout.Overlay): sign that way back too.
	seen := map[string]bool{hashOf(ru.From): true}
	for _, from := range chainFroms(olds, w.o.rollout.After, u) {
		if seen[hashOf(from)] {
			continue
		}
		seen[hashOf(from)] = true
		back, err := w.signBack(u, from)
		if err != nil {
			return ru, err
		}
		ru.BackSigs = append(ru.BackSigs, back)
	}
	return ru, nil
}

// signBack signs, for a signed rollout, the way back of key u: its
// previous content (from; nil: the key did not exist, so the way back is
// its removal), marked a revert, at a sequence above the write's own (the
// write's is max(now, previous+1), see sign). A host that took the change
// and goes back (auto-revert, abort --revert) runs that content with this
// record (rollout.OverlaySignatures): its agent accepts it by the usual
// rules, where the old record would be "replayed".
func (w *writeTxn) signBack(u string, from *string) (string, error) {
	var prev uint64
	if ks := w.st[u]; ks != nil {
		prev = ks.sigSeq
	}
	o := w.o
	now := uint64(max(o.now().UnixMilli(), 0))
	ch := reconcile.SignedChange{Key: w.c.targetUnits(w.target) + u, Target: w.target.String(), Seq: max(now, prev+1) + 1, Revert: true}
	if from != nil {
		ch.Hash = reconcile.Hash([]byte(*from))
	}
	sig, err := o.signer.SignChange(ch.Message())
	if err != nil {
		return "", fmt.Errorf("sign the way back of %s: %w", ch.Key, err)
	}
	b, err := json.Marshal(reconcile.SignatureRecord{Key: ch.Key, Hash: ch.Hash, Removed: from == nil, Seq: ch.Seq, Revert: true,
		Signer: o.signer.Fingerprint(), Signature: string(sig)})
	return string(b), err
}

// chainFroms are what key u held before each rollout of the chain that
// starts at id and follows After (each one's From), as rollout.Overlay
// walks it: up to a rollout that is not known (done, or gone) or did not
// write u.
func chainFroms(olds map[string]*rollout.Record, id, u string) []*string {
	var out []*string
	for n := 0; id != "" && n < len(olds); n++ {
		r := olds[id]
		if r == nil {
			break
		}
		ru, ok := r.Units[u]
		if !ok {
			break
		}
		out = append(out, ru.From)
		id = r.After
	}
	return out
}

// hashOf is the hash of content ("" for none: a removal).
func hashOf(content *string) string {
	if content == nil {
		return ""
	}
	return reconcile.Hash([]byte(*content))
}

// rolloutTarget refuses a rollout to one host.
func rolloutTarget(t Target) error {
	if t.Group == "" {
		return fmt.Errorf("%w: a rollout stages a change to a group's hosts; %s is one host (write without the rollout options)", ErrInvalid, t)
	}
	return nil
}

func supersedes(o writeOptions) bool { return o.supersede }

func decodeRollout(kv *mvccpb.KeyValue) (*rollout.Record, error) {
	var r rollout.Record
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return nil, fmt.Errorf("not a rollout record: %w", err)
	}
	if r.ID == "" || len(r.WaveEnds) == 0 || r.WaveEnds[len(r.WaveEnds)-1] != len(r.Hosts) {
		return nil, errors.New("not a rollout record: no id, or waves that do not cover its hosts")
	}
	r.ModRevision = kv.ModRevision
	if r.Revision == 0 {
		r.Revision = kv.CreateRevision // the put's: the record is written in its transaction
	}
	return &r, nil
}

// Rollouts lists the rollouts of group ("": every group), newest first,
// each with its summary, the group's keys and its coordinator. With hosts,
// each view also holds every host's progress (O(hosts) to read: only for
// a command that shows each host).
func (c *Client) Rollouts(ctx context.Context, group string, hosts bool) ([]rollout.View, error) {
	root, sums, units := c.rolloutsRoot()+"groups/", c.summaryRoot(), c.groupsRoot()
	if group != "" {
		if err := ValidateName("group", group); err != nil {
			return nil, err
		}
		root, sums, units = c.rolloutGroup(group), c.summaryRoot()+group+"/", c.targetUnits(Target{Group: group})
	}
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	ops := []clientv3.Op{
		clientv3.OpGet(root, clientv3.WithPrefix()),
		clientv3.OpGet(sums, clientv3.WithPrefix()),
		clientv3.OpGet(units, clientv3.WithPrefix()),
		clientv3.OpGet(c.electionRoot(), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
	}
	ops = append(ops, clientv3.OpGet(c.gateRunRoot(), clientv3.WithPrefix()))
	if hosts {
		ops = append(ops, clientv3.OpGet(c.progressRoot(), clientv3.WithPrefix()))
	}
	resp, err := c.cli.Txn(rctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("read rollouts: %w", err)
	}
	summaries := c.decodeSummaries(resp.Responses[1].GetResponseRange().GetKvs())
	var entries []reconcile.Entry
	for _, kv := range resp.Responses[2].GetResponseRange().GetKvs() {
		if t, unit, ok := c.parseUnitKey(string(kv.Key)); ok && t.Group != "" {
			entries = append(entries, reconcile.Entry{Scope: reconcile.ScopeGroup, Group: t.Group, Unit: unit, Value: kv.Value, ModRevision: kv.ModRevision})
		}
	}
	leaders := map[string]string{} // group → coordinating host (the oldest candidate)
	for _, kv := range resp.Responses[3].GetResponseRange().GetKvs() {
		g, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), c.electionRoot()), "/")
		if _, seen := leaders[g]; ok && !seen {
			leaders[g] = string(kv.Value)
		}
	}
	gateRunners := map[string]string{} // rollout ID → who runs its gate
	for _, kv := range resp.Responses[4].GetResponseRange().GetKvs() {
		gateRunners[string(kv.Key[strings.LastIndexByte(string(kv.Key), '/')+1:])] = string(kv.Value)
	}
	var progress map[string]map[string]*rollout.Progress
	if hosts {
		progress = c.decodeAllProgress(resp.Responses[5].GetResponseRange().GetKvs())
	}
	var out []rollout.View
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		r, err := decodeRollout(kv)
		if err != nil {
			c.skipKey(kv.Key, "not a rollout record", err)
			continue
		}
		v := rollout.View{Record: r, Summary: summaries[r.ID], Entries: entries, Coordinator: leaders[r.Group], GateRunner: gateRunners[r.ID], Revision: resp.Header.Revision}
		if hosts {
			v.Progress = progress[r.ID]
			if v.Progress == nil {
				v.Progress = map[string]*rollout.Progress{}
			}
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b rollout.View) int { // IDs tell seconds only
		if c := b.Record.CreatedAt.Compare(a.Record.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.Record.ID, a.Record.ID)
	})
	return out, nil
}

// decodeSummaries decodes rollout summaries by ID, skipping (with a
// warning) a value that does not decode.
func (c *Client) decodeSummaries(kvs []*mvccpb.KeyValue) map[string]*rollout.Summary {
	summaries := map[string]*rollout.Summary{}
	for _, kv := range kvs {
		var s rollout.Summary
		if err := json.Unmarshal(kv.Value, &s); err != nil {
			c.skipKey(kv.Key, "not a rollout summary", err)
			continue
		}
		summaries[s.ID] = &s
	}
	return summaries
}

// decodeAllProgress decodes hosts' progress keys (see decodeProgress),
// by rollout ID and host.
func (c *Client) decodeAllProgress(kvs []*mvccpb.KeyValue) map[string]map[string]*rollout.Progress {
	progress := map[string]map[string]*rollout.Progress{}
	for _, kv := range kvs {
		if host, id, p, ok := c.decodeProgress(kv.Key, kv.Value); ok {
			if progress[id] == nil {
				progress[id] = map[string]*rollout.Progress{}
			}
			progress[id][host] = p
		}
	}
	return progress
}

// RunGate says that who runs rollout r's gate command, until release is
// called or this process dies (a lease of 5 s, kept alive meanwhile): a
// rollout waiting for a gate that no command runs says so.
func (c *Client) RunGate(ctx context.Context, r *rollout.Record, who string) (release func(), err error) {
	g, err := c.cli.Grant(ctx, 5)
	if err != nil {
		return nil, fmt.Errorf("rollout %s: mark its gate as run here: %w", r.ID, err)
	}
	if _, err := c.cli.Put(ctx, c.gateRunRoot()+r.Group+"/"+r.ID, who, clientv3.WithLease(g.ID)); err != nil {
		return nil, fmt.Errorf("rollout %s: mark its gate as run here: %w", r.ID, err)
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ch, err := c.cli.KeepAlive(kctx, g.ID)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("rollout %s: mark its gate as run here: %w", r.ID, err)
	}
	go func() {
		for range ch { // drain until cancel
		}
	}()
	return func() {
		cancel()
		rctx, rcancel := c.reqCtx(context.WithoutCancel(ctx))
		defer rcancel()
		_, _ = c.cli.Revoke(rctx, g.ID)
	}, nil
}

// ErrNoRollout: no rollout has the ID asked for.
var ErrNoRollout = errors.New("no such rollout")

// Rollout reads one rollout by ID (with hosts: every host's progress).
func (c *Client) Rollout(ctx context.Context, id string, hosts bool) (rollout.View, error) {
	// The ID does not say the group: find it from the record keys alone,
	// then read that group's rollouts only (a follow reads this every
	// 200 ms: not every group's records and keys).
	rctx, cancel := c.reqCtx(ctx)
	resp, err := c.cli.Get(rctx, c.rolloutsRoot()+"groups/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	cancel()
	if err != nil {
		return rollout.View{}, fmt.Errorf("read rollouts: %w", err)
	}
	group := ""
	for _, kv := range resp.Kvs {
		g, rid, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), c.rolloutsRoot()+"groups/"), "/")
		if ok && rid == id {
			group = g
			break
		}
	}
	if group == "" {
		return rollout.View{}, fmt.Errorf("%w: %q (agentd rollout ls lists them)", ErrNoRollout, id)
	}
	all, err := c.Rollouts(ctx, group, hosts)
	if err != nil {
		return rollout.View{}, err
	}
	for _, v := range all {
		if v.Record.ID == id {
			return v, nil
		}
	}
	return rollout.View{}, fmt.Errorf("%w: %q (agentd rollout ls lists them)", ErrNoRollout, id)
}

// UpdateRollout applies change to rollout id's record and writes it back,
// guarded by the record being unchanged since it was read (retried on a
// race). change returns an error to refuse: nothing is written.
func (c *Client) UpdateRollout(ctx context.Context, id string, change func(v rollout.View) error) (rollout.View, error) {
	for range 10 {
		v, err := c.Rollout(ctx, id, false)
		if err != nil {
			return v, err
		}
		if err := change(v); err != nil {
			return v, err
		}
		ok, err := c.writeRollout(ctx, v.Record, nil)
		if err != nil || ok {
			return v, err
		}
	}
	return rollout.View{}, fmt.Errorf("rollout %s: its record keeps changing; nothing written, retry", id)
}

// writeRollout writes r if its record is still at r.ModRevision (and the
// guards hold); written, r.ModRevision is the write's revision.
func (c *Client) writeRollout(ctx context.Context, r *rollout.Record, guards []clientv3.Cmp) (bool, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return false, err
	}
	key := c.rolloutKey(r.Group, r.ID)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	x := txn{ifs: guards}
	x.guard(clientv3.Compare(clientv3.ModRevision(key), "=", r.ModRevision))
	x.then(clientv3.OpPut(key, string(b)))
	resp, err := x.commit(rctx, c.cli)
	if err != nil {
		return false, fmt.Errorf("write rollout %s: %w", r.ID, err)
	}
	if resp.Succeeded {
		r.ModRevision = resp.Header.Revision
	}
	return resp.Succeeded, nil
}

// decodeProgress reads <p>/rollouts/hosts/<host>/<id>.
func (c *Client) decodeProgress(key, value []byte) (host, id string, p *rollout.Progress, ok bool) {
	rest, found := strings.CutPrefix(string(key), c.progressRoot())
	if !found {
		return "", "", nil, false
	}
	host, id, found = strings.Cut(rest, "/")
	if !found || id == "" || host == "" {
		return "", "", nil, false
	}
	var hp rollout.Progress
	if err := json.Unmarshal(value, &hp); err != nil {
		c.skipKey(key, "not a rollout host's progress", err)
		return "", "", nil, false
	}
	return host, id, &hp, true
}

// WriteProgress writes this host's progress in rollout id: its own key,
// nothing to race with. It returns the revision of the write.
func (s *Session) WriteProgress(ctx context.Context, id string, p rollout.Progress) (int64, error) {
	c := s.c
	b, err := json.Marshal(p)
	if err != nil {
		return 0, err
	}
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Put(rctx, c.progressKey(s.member.Host, id), string(b))
	if err != nil {
		return 0, fmt.Errorf("rollout %s: write this host's progress: %w", id, err)
	}
	return resp.Header.Revision, nil
}

// PauseRollout pauses r with reason, if its record did not change since it
// was read (false: it did; look again).
func (s *Session) PauseRollout(ctx context.Context, r *rollout.Record, reason string) (bool, error) {
	next := *r
	next.Paused, next.PauseReason, next.PausedAt = true, reason, time.Now().UTC()
	return s.c.writeRollout(ctx, &next, nil)
}
