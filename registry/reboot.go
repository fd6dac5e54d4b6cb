package registry

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/selector"
)

// Reboot slots: a machine's reboot (the FleetLock server's pre-reboot)
// drawn from the same MaxUnavailable= budget as the agents' restarts.
//
// Key layout:
//
//	<p>/locks/groups/<g>/<pool>/fleetlock:<id>     JSON Holder, FleetLockID set
//	<p>/locks/groups/<g>/reboot[,…]/fleetlock:<id> the same, in the group's reboot pool
//
// A reboot of a member of group g takes down every unit it runs, so it
// takes one slot of every MaxUnavailable= semaphore of g — each of g's unit
// keys whose [X-Agentd] MaxUnavailable= is set, under its SlotKey (an
// instance's is its template's), with that limit: the very queues the
// agents of g wait in before a restart (semaphore.go) — and one slot of
// g's reboot pool, whose limit is the smallest MaxUnavailable= of g's
// units, or 1 when none of them sets one (one reboot at a time). Which
// units and limits is read from g's keys at each request (RebootPools),
// with the agent's own rules (reconcile.Desire, reconcile.SlotKey).
//
// Budgets by label: a unit with MaxUnavailableBy=KEY has one semaphore per
// value of the host label KEY (PoolName), and the reboot takes its slot in
// the bucket of the rebooting machine's labels — the very queue that
// machine's agent waits in before it restarts the unit, so a machine's
// reboot and its agent's restarts still draw from one budget, per rack.
// The reboot pool is by KEY too when every unit of g that sets
// MaxUnavailable= sets the same MaxUnavailableBy=KEY (reboots of two racks
// run in parallel, at most the smallest limit per rack); otherwise it is
// the whole group's (the safe side: a unit budgeted for the whole group
// bounds reboots group-wide anyway). A machine without the label is in
// the bucket of the hosts without it, as its agent is.
//
// The key's holder segment, "fleetlock:<id>", cannot be a host name (":"
// is not allowed in one), so a reboot never takes over an agent's key.
// The queue rule is the agents': a key holds a slot once fewer than limit
// keys were created before it, so a host queued before the reboot goes
// first. Unlike Acquire, LockReboot never waits (a FleetLock client asks
// again later): it takes every slot at once or none.
//
// The keys of one (group, id) share a lease of their own, granted with the
// TTL LockReboot is given and never kept alive: they go when the client
// says it is back (UnlockReboot) or, at the latest, when the TTL runs out
// — a machine that never comes back does not wedge its group.

// RebootPool is the pool of a group's reboots: locks/groups/<g>/reboot/.
// It is no unit name (those end in a unit type), so it meets no unit's queue.
const RebootPool = "reboot"

// fleetLockPrefix starts the holder segment of a reboot slot's key.
const fleetLockPrefix = "fleetlock:"

// FleetLockHolder is the holder segment of a reboot slot's key for the
// FleetLock client id.
func FleetLockHolder(id string) string { return fleetLockPrefix + id }

// ErrSlotsFull is returned (wrapped in a *SlotsFullError) by LockReboot when
// a slot the reboot needs is taken: nothing was taken.
var ErrSlotsFull = errors.New("no free slot")

// SlotsFullError says which of a group's semaphores is full, and by whom.
type SlotsFullError struct {
	Group string
	Pool  string // a unit (or template), or RebootPool
	// Bucket is the pool's label bucket (MaxUnavailableBy=), zero for a
	// pool of the whole group.
	Bucket reconcile.Bucket
	Limit  int
	// Ahead are the holders queued before the reboot's key: the first
	// Limit of them hold the slots, or are about to.
	Ahead []string
}

func (e *SlotsFullError) Error() string {
	what := fmt.Sprintf("%s has MaxUnavailable=%d", e.Pool, e.Limit)
	if e.Pool == RebootPool {
		what = fmt.Sprintf("its reboots take at most %d slot(s) at once", e.Limit)
	}
	where := "group " + e.Group
	if b := e.Bucket; b.Key != "" {
		// "group web, rack=r1: app.service has MaxUnavailable=1 per rack, …"
		where += ", " + b.String()
		what += " per " + b.Key
	}
	return fmt.Sprintf("%s: %s, taken by %s", where, what, strings.Join(e.Ahead, ", "))
}

func (e *SlotsFullError) Unwrap() error { return ErrSlotsFull }

// Pool is one of a group's semaphores a reboot takes a slot of: a unit's
// (a template's for its instances) or the group's RebootPool, with its
// limit and, for budgets by label, the label key (MaxUnavailableBy=) whose
// value picks the bucket; By "" is the semaphore of the whole group.
type Pool struct {
	Unit  string
	By    string
	Limit int
}

// Bucket is the pool's bucket for a machine with labels.
func (p Pool) Bucket(labels map[string]string) reconcile.Bucket {
	return reconcile.BucketOf(p.By, labels)
}

// RebootPools returns the semaphores a reboot of a member of group takes a
// slot of, each with its limit and label key: every unit of the group's
// keys that sets MaxUnavailable= (by reconcile.SlotKey), and RebootPool.
func (c *Client) RebootPools(ctx context.Context, group string) (map[string]Pool, error) {
	if err := ValidateName("group", group); err != nil {
		return nil, fmt.Errorf("reboot pools: %w", err)
	}
	dir := c.groupUnits(group)
	resp, err := c.cli.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	return c.rebootPools(group, resp.Kvs), nil
}

// rebootPools is RebootPools from a read of the group's unit keys, by unit
// (or RebootPool). A unit the agents would not apply (blocked: a bad key
// or policy) has no slots.
func (c *Client) rebootPools(group string, kvs []*mvccpb.KeyValue) map[string]Pool {
	dir := c.groupUnits(group)
	es := make([]reconcile.Entry, 0, len(kvs))
	for _, kv := range kvs {
		es = append(es, reconcile.Entry{Scope: reconcile.ScopeGroup, Group: group,
			Unit: strings.TrimPrefix(string(kv.Key), dir), Value: kv.Value, ModRevision: kv.ModRevision})
	}
	pools := map[string]Pool{}
	reboots := math.MaxInt
	by, sameBy := "", true // the MaxUnavailableBy= of every unit, if one
	for name, u := range reconcile.Desire(reconcile.Snapshot{Entries: es}) {
		// The agent's rule (reconcile.Plan, SlotsNeeded): a unit file of
		// the group with MaxUnavailable= set; instance keys use their
		// template's slot, which its own file gives.
		n := u.Policy.SlotLimit
		if u.Err != nil || u.File == nil || n <= 0 {
			continue
		}
		k := reconcile.SlotKey(name)
		if old, ok := pools[k]; !ok || n < old.Limit {
			pools[k] = Pool{Unit: k, By: u.Policy.SlotBy, Limit: n}
		}
		if reboots == math.MaxInt {
			by = u.Policy.SlotBy
		} else if by != u.Policy.SlotBy {
			sameBy = false
		}
		reboots = min(reboots, n)
	}
	if reboots == math.MaxInt {
		reboots = 1
	}
	if !sameBy {
		by = ""
	}
	pools[RebootPool] = Pool{Unit: RebootPool, By: by, Limit: reboots}
	return pools
}

// rebootOrder is the order LockReboot takes pools in: the reboot pool
// first (competing reboots meet there before they queue anywhere else),
// then the units by name.
func rebootOrder(pools map[string]Pool) []string {
	return slices.SortedFunc(maps.Keys(pools), func(a, b string) int {
		return cmp.Or(-cmp.Compare(boolInt(a == RebootPool), boolInt(b == RebootPool)), cmp.Compare(a, b))
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// LockReboot takes, for the FleetLock client id, one slot of every
// semaphore a reboot of a member of group needs (RebootPools), all or
// none, without waiting: when one of them is full it takes nothing and
// returns a *SlotsFullError (ErrSlotsFull). The slots are bound to a lease
// of ttl (rounded up to whole seconds) that is never kept alive. labels
// are the rebooting machine's (its agent's published labels): a pool by
// label (MaxUnavailableBy=) is taken in their bucket (Pool.Bucket); a
// label that is not a valid one (selector.Validate) is refused.
//
// It is idempotent: an id that already holds slots of group keeps them,
// its lease's TTL starts again, and only the slots it lacks (a unit that
// got MaxUnavailable= since) are taken; if one of those is full it returns
// the error and keeps what it held before. group and id must be valid
// names (ValidateName); nothing is written otherwise. Each etcd round
// trip is bounded by the request timeout.
func (c *Client) LockReboot(ctx context.Context, group, id string, labels map[string]string, ttl time.Duration) error {
	if err := validReboot(group, id); err != nil {
		return fmt.Errorf("lock reboot: %w", err)
	}
	for k, v := range labels {
		if err := selector.Validate(k, v); err != nil {
			return fmt.Errorf("lock reboot: %w the machine's labels: %w", ErrInvalid, err)
		}
	}
	if ttl <= 0 {
		return fmt.Errorf("lock reboot: %w TTL %s: want more than 0", ErrInvalid, ttl)
	}
	holder := FleetLockHolder(id)
	locks := c.prefix + "/locks/groups/" + group + "/"
	rctx, cancel := c.reqCtx(ctx)
	resp, err := c.cli.Txn(rctx).Then(
		clientv3.OpGet(c.groupUnits(group), clientv3.WithPrefix()),
		clientv3.OpGet(locks, clientv3.WithPrefix()),
	).Commit()
	cancel()
	if err != nil {
		return fmt.Errorf("lock reboot: read %s: %w", locks, err)
	}
	pools := c.rebootPools(group, resp.Responses[0].GetResponseRange().GetKvs())
	mine := map[string]*mvccpb.KeyValue{} // pool segment (PoolName) → this id's key
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		pool, h, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), locks), "/")
		if ok && h == holder {
			mine[pool] = kv
		}
	}
	lease, fresh, err := c.rebootLease(ctx, id, mine, ttl)
	if err != nil {
		return fmt.Errorf("lock reboot: %w", err)
	}
	var taken []*lock
	undo := func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.requestTimeout)
		defer cancel()
		if fresh { // every key of this call is on it
			c.revokeQuietly(lease)
			return
		}
		for _, l := range taken {
			if err := l.drop(uctx); err != nil {
				c.log.Warn("could not give back a reboot slot; it goes with its lease", "key", l.key, "err", err)
			}
		}
	}
	now := time.Now().UTC()
	for _, name := range rebootOrder(pools) {
		p := pools[name]
		b := p.Bucket(labels)
		pool := PoolName(name, b)
		if kv := mine[pool]; kv != nil && clientv3.LeaseID(kv.Lease) == lease && heldBy(kv, id) {
			continue
		}
		dir := locks + pool + "/"
		l := &lock{c: c, key: dir + holder, dir: dir, lease: lease,
			val: Holder{Host: holder, FleetLockID: id, RequestedAt: now}}
		if err := l.enqueue(ctx); err != nil {
			undo()
			return fmt.Errorf("lock reboot: %s: %w", l.key, err)
		}
		taken = append(taken, l)
		ahead, _, err := l.readAhead(ctx)
		if err != nil {
			undo()
			return fmt.Errorf("lock reboot: %s: %w", l.key, err)
		}
		if limit := p.Limit; len(ahead) >= limit {
			undo()
			full := &SlotsFullError{Group: group, Pool: name, Bucket: b, Limit: limit}
			for k := range ahead {
				full.Ahead = append(full.Ahead, strings.TrimPrefix(k, dir))
			}
			slices.Sort(full.Ahead)
			return fmt.Errorf("lock reboot: %w", full)
		}
		if err := l.grant(ctx); err != nil {
			undo()
			return fmt.Errorf("lock reboot: %s: %w", l.key, err)
		}
	}
	return nil
}

// heldBy says kv is a reboot slot of id marked held.
func heldBy(kv *mvccpb.KeyValue, id string) bool {
	var h Holder
	return json.Unmarshal(kv.Value, &h) == nil && h.FleetLockID == id && !h.Waiting()
}

// rebootLease returns the lease of id's existing keys (mine) with its TTL
// started again, or a new lease of ttl (fresh).
func (c *Client) rebootLease(ctx context.Context, id string, mine map[string]*mvccpb.KeyValue, ttl time.Duration) (clientv3.LeaseID, bool, error) {
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	for _, pool := range slices.Sorted(maps.Keys(mine)) {
		kv := mine[pool]
		var h Holder
		if kv.Lease == 0 || json.Unmarshal(kv.Value, &h) != nil || h.FleetLockID != id {
			continue // not written by LockReboot: never renew someone else's lease
		}
		_, err := c.cli.KeepAliveOnce(rctx, clientv3.LeaseID(kv.Lease))
		if err == nil {
			return clientv3.LeaseID(kv.Lease), false, nil
		}
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return 0, false, fmt.Errorf("renew the lease of %s: %w", kv.Key, err)
		}
	}
	resp, err := c.cli.Grant(rctx, int64(math.Ceil(ttl.Seconds())))
	if err != nil {
		return 0, false, fmt.Errorf("grant a lease: %w", err)
	}
	return resp.ID, true, nil
}

// UnlockReboot gives back every slot the FleetLock client id holds or
// queues for in group, and returns how many keys that was; none is no
// error (the protocol's UnlockIfHeld). A lease left with no key is
// revoked. Each etcd round trip is bounded by the request timeout.
func (c *Client) UnlockReboot(ctx context.Context, group, id string) (int, error) {
	if err := validReboot(group, id); err != nil {
		return 0, fmt.Errorf("unlock reboot: %w", err)
	}
	holder := FleetLockHolder(id)
	locks := c.prefix + "/locks/groups/" + group + "/"
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(rctx, locks, clientv3.WithPrefix()) // not WithKeysOnly: it leaves out the lease
	if err != nil {
		return 0, fmt.Errorf("unlock reboot: read %s: %w", locks, err)
	}
	var dels []clientv3.Op
	leases := map[clientv3.LeaseID]bool{}
	for _, kv := range resp.Kvs {
		_, h, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), locks), "/")
		if ok && h == holder {
			dels = append(dels, clientv3.OpDelete(string(kv.Key)))
			if kv.Lease != 0 {
				leases[clientv3.LeaseID(kv.Lease)] = true
			}
		}
	}
	if len(dels) == 0 {
		return 0, nil
	}
	if _, err := c.cli.Txn(rctx).Then(dels...).Commit(); err != nil {
		return 0, fmt.Errorf("unlock reboot: delete %s's keys: %w", holder, err)
	}
	for id := range leases {
		// Revoke only a lease nothing else is bound to: the keys were
		// found under a FleetLock holder's name, but anyone who may write
		// the prefix could have bound an agent's lease to one.
		ttl, err := c.cli.TimeToLive(rctx, id, clientv3.WithAttachedKeys())
		if err == nil && ttl.TTL > 0 && len(ttl.Keys) == 0 {
			c.revokeQuietly(id)
		}
	}
	return len(dels), nil
}

// validReboot checks a reboot's group and FleetLock client id, each with
// the rule for a name used as a key segment.
func validReboot(group, id string) error {
	if err := ValidateName("group", group); err != nil {
		return err
	}
	return ValidateName("FleetLock client id", id)
}
