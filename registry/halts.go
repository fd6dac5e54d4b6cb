package registry

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentd/agentd/reconcile"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Rollout halts.
//
// Key layout:
//
//	<p>/halts/groups/<group>/<unit>   JSON reconcile.Halt
//
// A halt says that a host failed (or rolled back) one version of a
// group's unit, so that the group's other hosts do not start it. It is
// not bound to a lease: it outlives the host that failed, until new
// content for the unit is put (Client.Put and Client.Remove delete it in
// the same transaction as the unit keys) or an operator deletes it
// (etcdctl del). Agents receive the halts of their groups in every
// snapshot (Client.Watch). <unit> is a unit name, an instance
// ("hello@1.service") when an instance of a template failed.

var _ reconcile.Coordinator = (*Session)(nil)

// Halt records at <p>/halts/<h.Scope>/<h.Unit> that this host failed
// h.Hash, so that the other hosts of the group hold off (they see it in
// their Watch snapshots). h.Scope must be "groups/<group>" and h.Unit a
// unit name (no drop-in); h.Hash must be set. An empty h.Host is this
// Session's host, a zero h.At the current time.
//
// The key is not bound to the Session's lease: it stays when this agent
// dies, until new content for the unit is put. When the key already
// holds a halt, Halt keeps it if it is for the same hash (the first
// failure is the one shown) or if it is for the group's current content
// of the unit while h.Hash is not (a late failure of an older version
// must not lift the halt of the current one); it returns nil then, too.
// Each etcd round trip is bounded by the request timeout (5 s).
func (s *Session) Halt(ctx context.Context, h reconcile.Halt) error {
	if err := validHalt(h.Scope, h.Unit); err != nil {
		return fmt.Errorf("halt: %w", err)
	}
	if h.Hash == "" {
		return fmt.Errorf("halt %s %s: %w: no hash", h.Scope, h.Unit, ErrInvalid)
	}
	if h.Host == "" {
		h.Host = s.member.Host
	}
	if h.At.IsZero() {
		h.At = time.Now().UTC()
	}
	val, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("halt %s %s: encode: %w", h.Scope, h.Unit, err)
	}
	c := s.c
	key := c.haltKey(h.Scope, h.Unit)
	// The keys whose content h.Hash may be: the unit's own file and, for
	// an instance, its template's.
	units := c.groupUnits(strings.TrimPrefix(h.Scope, "groups/"))
	srcs := []string{units + h.Unit}
	if reconcile.IsInstance(h.Unit) {
		srcs = append(srcs, units+reconcile.TemplateOf(h.Unit))
	}
	reads := []clientv3.Op{clientv3.OpGet(key)}
	for _, k := range srcs {
		reads = append(reads, clientv3.OpGet(k))
	}
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	for range 5 {
		resp, err := c.cli.Txn(rctx).Then(reads...).Commit()
		if err != nil {
			return fmt.Errorf("halt: read %s: %w", key, err)
		}
		// Write only if nothing read has changed since: the decision
		// below depends on all of it.
		var x txn
		var old []byte
		current := map[string]bool{} // hashes of the unit's content now
		for i, r := range resp.Responses {
			var mod int64
			if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
				mod = kvs[0].ModRevision
				if i == 0 {
					old = kvs[0].Value
				} else {
					current[reconcile.Hash(kvs[0].Value)] = true
				}
			}
			k := key
			if i > 0 {
				k = srcs[i-1]
			}
			x.guard(clientv3.Compare(clientv3.ModRevision(k), "=", mod))
		}
		if old != nil {
			var prev reconcile.Halt
			if json.Unmarshal(old, &prev) == nil && (prev.Hash == h.Hash || current[prev.Hash] && !current[h.Hash]) {
				return nil
			}
		}
		x.then(clientv3.OpPut(key, string(val)))
		tr, err := x.commit(rctx, c.cli)
		if err != nil {
			return fmt.Errorf("halt: put %s: %w", key, err)
		}
		if tr.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("halt: put %s: the unit's keys keep changing; retry", key)
}

// Halts returns the halts of scope ("groups/<group>"), or of every group
// when scope is "", sorted by scope and unit. Scope and Unit are taken
// from the key. A value that does not decode is skipped with a warning.
func (c *Client) Halts(ctx context.Context, scope string) ([]reconcile.Halt, error) {
	dir := c.haltsRoot() + "groups/"
	if scope != "" {
		if err := validHaltScope(scope); err != nil {
			return nil, fmt.Errorf("halts: %w", err)
		}
		dir = c.haltDir(scope)
	}
	resp, err := c.cli.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	out := make([]reconcile.Halt, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		h, ok, err := c.decodeHalt(kv.Key, kv.Value)
		if !ok {
			continue // not a halt key (deeper path)
		}
		if err != nil {
			c.skipKey(kv.Key, "value is not a rollout halt (delete it if no agent wrote it)", err)
			continue
		}
		out = append(out, h)
	}
	slices.SortFunc(out, compareHalts)
	return out, nil
}

func compareHalts(a, b reconcile.Halt) int {
	return cmp.Or(cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Unit, b.Unit))
}

// validHalt checks a halt's scope ("groups/<group>") and unit (a unit
// name, not a drop-in).
func validHalt(scope, unit string) error {
	if err := validHaltScope(scope); err != nil {
		return err
	}
	return validLock(scope, reconcile.Bucket{}, unit)
}

func validHaltScope(scope string) error {
	name, ok := strings.CutPrefix(scope, "groups/")
	if !ok {
		return fmt.Errorf("%w halt scope %q: want \"groups/<group>\"", ErrInvalid, scope)
	}
	return ValidateName("group", name)
}

func (c *Client) haltsRoot() string              { return c.prefix + "/halts/" }
func (c *Client) haltDir(scope string) string    { return c.haltsRoot() + scope + "/" }
func (c *Client) groupHalts(group string) string { return c.haltDir("groups/" + group) }
func (c *Client) haltKey(scope, unit string) string {
	return c.haltDir(scope) + unit
}

// decodeHalt decodes a halt key's value, with Scope and Unit taken from
// the key. ok is false for a key that is not "<p>/halts/groups/<g>/<unit>";
// err is set for a value that does not decode.
func (c *Client) decodeHalt(key, value []byte) (h reconcile.Halt, ok bool, err error) {
	rest, found := strings.CutPrefix(string(key), c.haltsRoot()+"groups/")
	if !found {
		return h, false, nil
	}
	group, unit, found := strings.Cut(rest, "/")
	if !found || group == "" || unit == "" || strings.Contains(unit, "/") {
		return h, false, nil
	}
	if err := json.Unmarshal(value, &h); err != nil {
		return h, true, fmt.Errorf("decode %s (delete it if no agent wrote it): %w", key, err)
	}
	h.Scope, h.Unit = "groups/"+group, unit
	return h, true, nil
}

// clearHalts, for a group, deletes the group's halts that clears selects,
// guarded by no halt of the group written since (see haltsToClear).
func (w *writeTxn) clearHalts(ctx context.Context, clears func(reconcile.Halt) bool) error {
	if w.target.Group == "" {
		return nil
	}
	dels, guard, err := w.c.haltsToClear(ctx, w.target.Group, clears)
	if err != nil {
		return err
	}
	w.guard(guard)
	w.then(dels...)
	return nil
}

// haltsToClear reads the halts of group and returns a delete for each
// that clear selects (a halt whose value does not decode has only Scope
// and Unit set), and a comparison that holds while no halt of the group
// has been written since the read: a transaction guarded by it deletes
// exactly the selected halts of the moment it commits.
func (c *Client) haltsToClear(ctx context.Context, group string, clear func(reconcile.Halt) bool) ([]clientv3.Op, clientv3.Cmp, error) {
	dir := c.groupHalts(group)
	resp, err := c.cli.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return nil, clientv3.Cmp{}, fmt.Errorf("read %s: %w", dir, err)
	}
	var dels []clientv3.Op
	for _, kv := range resp.Kvs {
		h, ok, _ := c.decodeHalt(kv.Key, kv.Value)
		if ok && clear(h) {
			dels = append(dels, clientv3.OpDelete(string(kv.Key)))
		}
	}
	guard := clientv3.Compare(clientv3.ModRevision(dir), "<", resp.Header.Revision+1).WithPrefix()
	return dels, guard, nil
}

// partOf reports whether the unit key suffix key (a unit file, instance
// marker or drop-in) is part of unit's content: unit's own key or
// drop-in, its template's (unit an instance), or a drop-in for every unit
// of its type ("service.d/x.conf").
func partOf(key, unit string) bool {
	owner, _, dropIn := strings.Cut(key, "/")
	if dropIn {
		owner = strings.TrimSuffix(owner, ".d")
	}
	switch {
	case owner == unit:
		return true
	case reconcile.IsInstance(unit) && owner == reconcile.TemplateOf(unit):
		return true
	case dropIn && isUnitType(owner) && strings.HasSuffix(unit, "."+owner):
		return true
	}
	return false
}

// putClears reports whether writing units (key suffix → value) gives h's
// unit new content: a drop-in of it, or a unit file (its own, or its
// template's) whose hash is not the halted one. Putting the version that
// failed again, or only an instance's empty marker, keeps the halt.
func putClears(h reconcile.Halt, units map[string][]byte) bool {
	for k, v := range units {
		switch {
		case !partOf(k, h.Unit):
		case strings.Contains(k, "/"):
			return true // drop-in: the halt records only the unit file's hash
		case len(v) == 0 && k == h.Unit && reconcile.IsInstance(k):
			// an instance marker: no content of its own
		case reconcile.Hash(v) != h.Hash:
			return true
		}
	}
	return false
}
