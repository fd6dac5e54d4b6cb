package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/agentd/agentd/reconcile"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Rollouts (reconcile.Rollout).
//
// Key layout:
//
//	<p>/rollouts/groups/<group>/<id>      JSON reconcile.Rollout: the change, the strategy, the hosts, control
//	<p>/rollouts/progress/<id>/<host>     JSON reconcile.HostProgress: written by that host's agent
//
// The record is written with the change it stages, in the put's own
// transaction (WithRollout). Agents receive their groups' rollouts and
// every host's progress in their Watch snapshots, so that each computes
// the same phase. No key is bound to a lease: a rollout outlives the CLI
// and every agent. Progress keys of one rollout sit under one prefix so
// that a host taking the change can guard its write with "no host's
// progress moved since I read it" (MaxUnavailable holds exactly).

// ErrRolloutRunning: the put's keys are in a rollout still running.
var ErrRolloutRunning = errors.New("a rollout of these keys is running")

func (c *Client) rolloutsRoot() string               { return c.prefix + "/rollouts/" }
func (c *Client) rolloutGroup(group string) string   { return c.rolloutsRoot() + "groups/" + group + "/" }
func (c *Client) rolloutKey(group, id string) string { return c.rolloutGroup(group) + id }
func (c *Client) progressRoot() string               { return c.rolloutsRoot() + "progress/" }
func (c *Client) progressDir(id string) string       { return c.progressRoot() + id + "/" }

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
func WithRollout(r *reconcile.Rollout, supersede bool) WriteOption {
	return func(o *writeOptions) { o.rollout, o.supersede = r, supersede }
}

// rolloutOps fills o.rollout's Units from the keys' current values and
// returns the guards and operations that write it (and end the rollouts
// it supersedes). to is each key the write changes, with the hash it
// holds after it ("": the write removes it).
func (c *Client) rolloutOps(ctx context.Context, t Target, to map[string]string, o writeOptions) ([]clientv3.Cmp, []clientv3.Op, error) {
	r := o.rollout
	if err := rolloutTarget(t); err != nil {
		return nil, nil, err
	}
	r.Group, r.After = t.Group, "" // After is found again on each attempt (a retried write)
	names := slices.Sorted(maps.Keys(to))
	ops := []clientv3.Op{clientv3.OpGet(c.rolloutGroup(t.Group), clientv3.WithPrefix())}
	for _, u := range names {
		ops = append(ops, clientv3.OpGet(c.targetUnits(t)+u))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("read the rollouts of %s: %w", t, err)
	}
	var cmps []clientv3.Cmp
	var out []clientv3.Op
	now := o.now().UTC()
	held := map[string]string{} // key → hash of what it holds now ("": absent)
	var afterAt time.Time
	for i, u := range names {
		if kvs := resp.Responses[i+1].GetResponseRange().GetKvs(); len(kvs) > 0 {
			held[u] = reconcile.Hash(kvs[0].Value)
		}
	}
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		old, err := decodeRollout(kv.Value, kv.ModRevision)
		if err != nil || (old.End != nil && old.End.State == reconcile.RolloutDone) {
			continue
		}
		var shared []string
		overwritten := false
		for _, u := range names {
			if ou, ok := old.Units[u]; ok {
				shared = append(shared, u)
				overwritten = overwritten || held[u] != ou.ToHash
			}
		}
		if len(shared) == 0 || overwritten {
			continue // a put without a rollout wrote its keys since: it no longer runs
		}
		// The new rollout follows this one: a host that has not taken the
		// new change keeps what this one gives it (reconcile.Overlay).
		if r.After == "" || old.CreatedAt.After(afterAt) {
			r.After, afterAt = old.ID, old.CreatedAt
		}
		if old.End != nil {
			continue // failed or aborted: it still holds back the hosts it did not reach
		}
		if !supersedes(o) {
			return nil, nil, fmt.Errorf("%w: %s (%s) since %s; wait for it, abort it (agentd rollout abort %s), or pass --supersede to end it and start this one",
				ErrRolloutRunning, old.ID, strings.Join(shared, ", "), old.CreatedAt.Local().Format(time.DateTime), old.ID)
		}
		old.End = &reconcile.RolloutEnd{State: reconcile.RolloutSuperseded, Reason: "superseded by " + r.ID, At: now}
		b, err := json.Marshal(old)
		if err != nil {
			return nil, nil, err
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
		out = append(out, clientv3.OpPut(string(kv.Key), string(b)))
	}
	r.Units = map[string]reconcile.RolloutUnit{}
	for i, u := range names {
		ru := reconcile.RolloutUnit{ToHash: to[u]}
		if kvs := resp.Responses[i+1].GetResponseRange().GetKvs(); len(kvs) > 0 {
			from := string(kvs[0].Value)
			ru.From, ru.FromRevision = &from, kvs[0].ModRevision
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.targetUnits(t)+u), "=", kvs[0].ModRevision))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.targetUnits(t)+u), "=", 0))
		}
		r.Units[u] = ru
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = now
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, nil, err
	}
	key := c.rolloutKey(t.Group, r.ID)
	cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
	out = append(out, clientv3.OpPut(key, string(b)))
	return cmps, out, nil
}

// rolloutTarget refuses a rollout to one host.
func rolloutTarget(t Target) error {
	if t.Group == "" {
		return fmt.Errorf("%w: a rollout stages a change to a group's hosts; %s is one host (write without the rollout options)", ErrInvalid, t)
	}
	return nil
}

func supersedes(o writeOptions) bool { return o.supersede }

func decodeRollout(v []byte, modRev int64) (*reconcile.Rollout, error) {
	var r reconcile.Rollout
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("not a rollout record: %w", err)
	}
	if r.ID == "" || len(r.WaveEnds) == 0 || r.WaveEnds[len(r.WaveEnds)-1] != len(r.Hosts) {
		return nil, errors.New("not a rollout record: no id, or waves that do not cover its hosts")
	}
	r.ModRevision = modRev
	return &r, nil
}

// RolloutView is one rollout with every host's progress, read at one
// revision.
type RolloutView struct {
	Rollout  *reconcile.Rollout
	Progress map[string]*reconcile.HostProgress
	// Entries are the group's unit keys now (to tell a superseded rollout).
	Entries  []reconcile.Entry
	Revision int64
}

// Phase is the rollout's phase now.
func (v RolloutView) Phase(now time.Time) reconcile.Phase {
	if v.Rollout.End == nil && v.Rollout.Superseded(v.Entries) {
		return reconcile.Phase{State: reconcile.RolloutSuperseded, Reason: "its keys were written again since"}
	}
	return v.Rollout.Phase(v.Progress, now)
}

// Rollouts lists the rollouts of group ("": every group), newest first.
func (c *Client) Rollouts(ctx context.Context, group string) ([]RolloutView, error) {
	root := c.rolloutsRoot() + "groups/"
	if group != "" {
		if err := ValidateName("group", group); err != nil {
			return nil, err
		}
		root = c.rolloutGroup(group)
	}
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Txn(rctx).Then(
		clientv3.OpGet(root, clientv3.WithPrefix()),
		clientv3.OpGet(c.progressRoot(), clientv3.WithPrefix()),
		clientv3.OpGet(c.groupsRoot(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("read rollouts: %w", err)
	}
	progress := map[string]map[string]*reconcile.HostProgress{}
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		if id, host, p, ok := c.decodeProgress(kv.Key, kv.Value); ok {
			if progress[id] == nil {
				progress[id] = map[string]*reconcile.HostProgress{}
			}
			progress[id][host] = p
		}
	}
	var entries []reconcile.Entry
	for _, kv := range resp.Responses[2].GetResponseRange().GetKvs() {
		if t, unit, ok := c.parseUnitKey(string(kv.Key)); ok && t.Group != "" {
			entries = append(entries, reconcile.Entry{Scope: reconcile.ScopeGroup, Group: t.Group, Unit: unit, Value: kv.Value, ModRevision: kv.ModRevision})
		}
	}
	var out []RolloutView
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		r, err := decodeRollout(kv.Value, kv.ModRevision)
		if err != nil {
			c.skipKey(kv.Key, "not a rollout record", err)
			continue
		}
		out = append(out, RolloutView{Rollout: r, Progress: progress[r.ID], Entries: entries, Revision: resp.Header.Revision})
	}
	slices.SortFunc(out, func(a, b RolloutView) int { // IDs tell seconds only
		if c := b.Rollout.CreatedAt.Compare(a.Rollout.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.Rollout.ID, a.Rollout.ID)
	})
	return out, nil
}

// ErrNoRollout: no rollout has the ID asked for.
var ErrNoRollout = errors.New("no such rollout")

// Rollout reads one rollout by ID.
func (c *Client) Rollout(ctx context.Context, id string) (RolloutView, error) {
	all, err := c.Rollouts(ctx, "")
	if err != nil {
		return RolloutView{}, err
	}
	for _, v := range all {
		if v.Rollout.ID == id {
			return v, nil
		}
	}
	return RolloutView{}, fmt.Errorf("%w: %q (agentd rollout ls lists them)", ErrNoRollout, id)
}

// UpdateRollout applies change to rollout id's record and writes it back,
// guarded by the record being unchanged since it was read (retried on a
// race). change returns an error to refuse: nothing is written.
func (c *Client) UpdateRollout(ctx context.Context, id string, change func(v RolloutView) error) (RolloutView, error) {
	for range 10 {
		v, err := c.Rollout(ctx, id)
		if err != nil {
			return v, err
		}
		if err := change(v); err != nil {
			return v, err
		}
		ok, err := c.writeRollout(ctx, v.Rollout)
		if err != nil || ok {
			return v, err
		}
	}
	return RolloutView{}, fmt.Errorf("rollout %s: its record keeps changing; nothing written, retry", id)
}

// writeRollout writes r if its record is still at r.ModRevision.
func (c *Client) writeRollout(ctx context.Context, r *reconcile.Rollout) (bool, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return false, err
	}
	key := c.rolloutKey(r.Group, r.ID)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Txn(rctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", r.ModRevision)).
		Then(clientv3.OpPut(key, string(b))).Commit()
	if err != nil {
		return false, fmt.Errorf("write rollout %s: %w", r.ID, err)
	}
	return resp.Succeeded, nil
}

// decodeProgress reads <p>/rollouts/progress/<id>/<host>.
func (c *Client) decodeProgress(key, value []byte) (id, host string, p *reconcile.HostProgress, ok bool) {
	rest, found := strings.CutPrefix(string(key), c.progressRoot())
	if !found {
		return "", "", nil, false
	}
	id, host, found = strings.Cut(rest, "/")
	if !found || id == "" || host == "" {
		return "", "", nil, false
	}
	var hp reconcile.HostProgress
	if err := json.Unmarshal(value, &hp); err != nil {
		c.skipKey(key, "not a rollout host's progress", err)
		return "", "", nil, false
	}
	return id, host, &hp, true
}

// RolloutStep writes what this host decided about rollout r
// (reconcile.RolloutStep), seen at snapshot revision seen. A host that
// starts taking the change writes only if the record did not change
// since (not paused, not aborted) and, under MaxUnavailable, no host's
// progress moved since seen: it loses a race rather than exceed the
// budget (0, nil: look again at the next snapshot). It returns the
// revision of its write: a snapshot older than that does not show it.
func (s *Session) RolloutStep(ctx context.Context, r *reconcile.Rollout, seen int64, w reconcile.RolloutWrite) (int64, error) {
	c := s.c
	key := c.rolloutKey(r.Group, r.ID)
	guard := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", r.ModRevision)}
	var ops []clientv3.Op
	if p := w.Progress; p != nil {
		b, err := json.Marshal(p)
		if err != nil {
			return 0, err
		}
		ops = append(ops, clientv3.OpPut(c.progressDir(r.ID)+s.member.Host, string(b)))
		if p.State == reconcile.HostApplying && !r.Strategy.MaxUnavailable.IsZero() {
			guard = append(guard, clientv3.Compare(clientv3.ModRevision(c.progressDir(r.ID)), "<", seen+1).WithPrefix())
		}
	}
	if w.End != nil || w.Pause != "" {
		next := *r
		if w.End != nil {
			next.End = w.End
		}
		if w.Pause != "" {
			next.Paused, next.PauseReason, next.PausedAt = true, w.Pause, time.Now().UTC()
		}
		b, err := json.Marshal(next)
		if err != nil {
			return 0, err
		}
		ops = append(ops, clientv3.OpPut(key, string(b)))
	}
	if w.Progress != nil && w.Progress.State != reconcile.HostApplying && w.End == nil && w.Pause == "" {
		guard = nil // its own progress: nothing to race with
	}
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Txn(rctx).If(guard...).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("rollout %s: %w", r.ID, err)
	}
	if !resp.Succeeded {
		return 0, nil
	}
	return resp.Header.Revision, nil
}
