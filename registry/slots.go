package registry

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
)

// Slot is one key of a MaxUnavailable= queue — an agent's (Acquire) or a
// reboot's (LockReboot) — as `agentd locks` shows it.
type Slot struct {
	Scope string // "groups/<g>" (or "hosts/<h>")
	Pool  string // the unit (a template for instances) the slot is for, or RebootPool
	// Bucket is the label bucket of the pool (MaxUnavailableBy=): the
	// queue is the one of the hosts with that label value; zero for the
	// queue of the whole scope.
	Bucket reconcile.Bucket
	Holder string // the key's last segment: a host, or "fleetlock:<id>"
	// Value is the key's value (Host is Holder); Garbled when it does not
	// decode — the key still takes its place in the queue.
	Value   Holder
	Garbled bool
	// Position is the key's place in its queue, from 1, by creation.
	Position int
	// Limit is the queue's limit as the registry says now: the unit's
	// MaxUnavailable= in the group's keys, or the group's reboot limit
	// (RebootPools); 0 when no key of the group sets it any more, or sets
	// it by another label than the bucket's (the holders still hold what
	// they took).
	Limit int
	// Lease is the lease the key is bound to, TTL what is left of it
	// (negative: no lease, or it has just expired).
	Lease int64
	TTL   time.Duration
	// Ahead are the holders of the keys created before this one, in
	// queue order: the first Limit of them hold the slots (or are about
	// to), the rest wait too.
	Ahead []string
}

// Held says the holder holds its slot (it marked its key).
func (s Slot) Held() bool { return !s.Garbled && !s.Value.Waiting() }

// Slots returns every key of the MaxUnavailable= queues under
// <p>/locks/<scope>/ (scope "groups/<g>"), or of all of them when scope is
// "", sorted by scope, pool, bucket and position; with each queue's limit
// as the group's keys say now, and what is left of each key's lease. A
// key that does not have the shape <p>/locks/<kind>/<name>/<pool>/<holder>
// (pool: PoolName) is skipped with a warning.
func (c *Client) Slots(ctx context.Context, scope string) ([]Slot, error) {
	root := c.prefix + "/locks/"
	dir := root
	if scope != "" {
		if err := validHaltScope(scope); err != nil {
			return nil, fmt.Errorf("slots: %w", err)
		}
		dir = root + scope + "/"
	}
	resp, err := c.cli.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var out []Slot
	queues := map[string][]string{} // scope/pool segment → holders so far, in queue order
	groups := map[string]bool{}
	for _, kv := range resp.Kvs {
		parts := strings.Split(strings.TrimPrefix(string(kv.Key), root), "/")
		if len(parts) != 4 || (parts[0] != "groups" && parts[0] != "hosts") || slices.Contains(parts, "") {
			c.skipKey(kv.Key, "not a semaphore key (<prefix>/locks/groups/<group>/<unit>/<holder>)", nil)
			continue
		}
		unit, bucket, ok := ParsePool(parts[2])
		if !ok {
			c.skipKey(kv.Key, "not a semaphore key: "+parts[2]+" is not <unit> or <unit>,<label key>=<value>", nil)
			continue
		}
		s := Slot{Scope: parts[0] + "/" + parts[1], Pool: unit, Bucket: bucket, Holder: parts[3], Lease: kv.Lease}
		if err := json.Unmarshal(kv.Value, &s.Value); err != nil {
			s.Garbled, s.Value = true, Holder{}
		}
		s.Value.Host = s.Holder
		q := s.Scope + "/" + parts[2]
		s.Ahead = slices.Clone(queues[q])
		s.Position = len(s.Ahead) + 1
		queues[q] = append(queues[q], s.Holder)
		if parts[0] == "groups" {
			groups[parts[1]] = true
		}
		out = append(out, s)
	}
	limits, err := c.groupLimits(ctx, slices.Sorted(maps.Keys(groups)))
	if err != nil {
		return nil, err
	}
	ttls := map[int64]time.Duration{}
	for i := range out {
		s := &out[i]
		if p, ok := limits[s.Scope][s.Pool]; ok && p.By == s.Bucket.Key {
			s.Limit = p.Limit
		}
		if s.Lease == 0 {
			s.TTL = -1
			continue
		}
		ttl, ok := ttls[s.Lease]
		if !ok {
			ttl = -1
			if r, err := c.cli.TimeToLive(ctx, clientv3.LeaseID(s.Lease)); err == nil && r.TTL >= 0 {
				ttl = time.Duration(r.TTL) * time.Second
			} else if err != nil && ctx.Err() != nil {
				return nil, fmt.Errorf("lease of %s: %w", s.Holder, err)
			}
			ttls[s.Lease] = ttl
		}
		s.TTL = ttl
	}
	slices.SortStableFunc(out, func(a, b Slot) int {
		return cmp.Or(cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Bucket.Key, b.Bucket.Key),
			cmp.Compare(a.Bucket.Value, b.Bucket.Value), cmp.Compare(a.Position, b.Position))
	})
	return out, nil
}

// groupLimits reads the unit keys of groups, in one transaction, and
// returns each group's pools ("groups/<g>" → unit or RebootPool → pool).
func (c *Client) groupLimits(ctx context.Context, groups []string) (map[string]map[string]Pool, error) {
	out := map[string]map[string]Pool{}
	if len(groups) == 0 {
		return out, nil
	}
	ops := make([]clientv3.Op, 0, len(groups))
	for _, g := range groups {
		ops = append(ops, clientv3.OpGet(c.groupUnits(g), clientv3.WithPrefix()))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("read the groups' unit keys: %w", err)
	}
	for i, g := range groups {
		out["groups/"+g] = c.rebootPools(g, resp.Responses[i].GetResponseRange().GetKvs())
	}
	return out, nil
}
