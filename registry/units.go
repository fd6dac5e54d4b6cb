package registry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/agentd/agentd/reconcile"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Listed is one unit key as the CLI sees it: its target (Host or Group),
// the unit key suffix and the raw value.
type Listed struct {
	Target
	Unit        string // unit name or "<unit>.d/<name>.conf"
	Value       []byte
	Key         string // full etcd key
	ModRevision int64
}

// Put writes units (unit key suffix → file content) for t in one
// transaction and returns its revision. An empty value is allowed (a
// template instance to run).
//
// The same transaction records the new version of each key in its history
// and prunes it to the newest KeepVersions (see History); opts say who
// stores it and may make the write conditional (IfModRevision).
//
// For a group, the same transaction deletes the group's halts (see Halt)
// of the units it gives new content — a drop-in of the unit, its file or
// its template's file with a hash other than the halted one — which
// resumes their rollout. Putting the version that failed again leaves
// its halt in place (delete it with etcdctl to retry that version).
func (c *Client) Put(ctx context.Context, t Target, units map[string][]byte, opts ...WriteOption) (int64, error) {
	o, err := c.resolveWriteOptions(ctx, opts)
	if err != nil {
		return 0, fmt.Errorf("put %s: %w", t, err)
	}
	for range 10 {
		w, err := c.putTxn(ctx, t, units, o)
		if err != nil {
			return 0, err
		}
		resp, err := c.commitWrite(ctx, w)
		if err != nil {
			return 0, err
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		// A key or a halt of the group was written in between: read again.
	}
	return 0, fmt.Errorf("put %s: its keys or the group's halts keep changing; nothing written, retry", t)
}

// CheckPut says whether Put would take units as they are now, without
// writing anything: the names, the values and the size of the request it
// would send (a LimitError in plain words), for `unit put --dry-run`.
func (c *Client) CheckPut(ctx context.Context, t Target, units map[string][]byte, opts ...WriteOption) error {
	o, err := c.resolveWriteOptions(ctx, opts)
	if err != nil {
		return fmt.Errorf("put %s: %w", t, err)
	}
	if o.signer != nil {
		o.signer = sizeOnly{o.signer} // a dry run signs nothing (no passphrase, no touch of a security key)
	}
	w, err := c.putTxn(ctx, t, units, o)
	if err != nil {
		return err
	}
	return checkLimits(w)
}

// putTxn composes the write that puts units to t, guarded by the keys
// (and the group's halts) as read now.
func (c *Client) putTxn(ctx context.Context, t Target, units map[string][]byte, o writeOptions) (*writeTxn, error) {
	names := slices.Sorted(maps.Keys(units))
	if err := checkWrite(t, names, "put", "put"); err != nil {
		return nil, err
	}
	if err := checkValues(t, units); err != nil {
		return nil, err
	}
	if err := c.checkOneWriter(ctx, t, units); err != nil {
		return nil, err
	}
	st, _, err := c.readKeys(ctx, t, names, false)
	if err != nil {
		return nil, fmt.Errorf("put %s: %w", t, err)
	}
	w := c.newWriteTxn("put", t, names, units, st, o)
	if err := w.compose(ctx, func(h reconcile.Halt) bool { return putClears(h, units) }); err != nil {
		return nil, fmt.Errorf("put %s: %w", t, err)
	}
	return w, nil
}

// checkWrite checks the target and the unit keys of a write: verb names
// it in errors about the target ("put", "remove"), verbFrom in the others
// ("put", "remove from").
func checkWrite(t Target, units []string, verb, verbFrom string) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("%s: %w", verb, err)
	}
	if len(units) == 0 {
		return fmt.Errorf("%s %s: %w: no units given", verbFrom, t, ErrInvalid)
	}
	var errs []error
	for _, u := range units {
		if err := ValidateUnit(u); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s %s: %w", verbFrom, t, err)
	}
	return nil
}

// Remove deletes units of t in one transaction. If any of them does not
// exist nothing is removed and the error (wrapping ErrNotFound) names the
// missing ones. The same transaction records a removal in each key's
// history (see Put and History). For a group, it also deletes the group's
// halts of every unit whose content it removes a part of.
//
// With OnlyWholeUnits, a unit whose drop-ins would stay in the registry is
// not removed (see DropInsError). WithRollout stages the removal across
// a group's hosts (a host keeps each key until its wave takes the
// change), as for Put.
func (c *Client) Remove(ctx context.Context, t Target, units []string, opts ...WriteOption) (int64, error) {
	rev, _, err := c.remove(ctx, t, units, false, opts)
	return rev, err
}

// RemoveRecursive deletes units of t and every drop-in of them in the
// registry ("<unit>.d/…"), named or not, in one transaction, and returns
// its revision and the keys it removed, sorted. A unit whose own key is
// gone but whose drop-ins are there is not missing: its drop-ins go. The
// rest is as for Remove.
func (c *Client) RemoveRecursive(ctx context.Context, t Target, units []string, opts ...WriteOption) (int64, []string, error) {
	return c.remove(ctx, t, units, true, opts)
}

// OnlyWholeUnits makes Remove refuse to remove a unit whose drop-ins in
// the registry it is not removing too: those drop-ins alone would leave
// each host a drop-in for a unit it no longer has, and the unit stopped
// but not gone from the operator's view. The error is a *DropInsError
// listing them; nothing is removed. (`unit rm` asks for it; a revert to a
// removal does not, and the hosts then keep the drop-ins only.)
func OnlyWholeUnits() WriteOption { return func(o *writeOptions) { o.wholeUnits = true } }

// ErrDropInsStay is wrapped by a DropInsError.
var ErrDropInsStay = errors.New("drop-ins would stay without their unit")

// DropInsError: Remove was asked to remove units whose drop-ins it was
// not asked to remove. Nothing was removed.
type DropInsError struct {
	Target Target
	Stay   map[string][]string // unit → its drop-in keys still in the registry, sorted
}

func (e *DropInsError) Error() string {
	var parts []string
	for _, u := range slices.Sorted(maps.Keys(e.Stay)) {
		parts = append(parts, fmt.Sprintf("%s has %s", u, strings.Join(e.Stay[u], ", ")))
	}
	return fmt.Sprintf("drop-ins or config files in the registry for %s would stay without their unit: %s; nothing removed", e.Target, strings.Join(parts, "; "))
}

func (e *DropInsError) Unwrap() error { return ErrDropInsStay }

func (c *Client) remove(ctx context.Context, t Target, units []string, recursive bool, opts []WriteOption) (int64, []string, error) {
	if err := checkWrite(t, units, "remove", "remove from"); err != nil {
		return 0, nil, err
	}
	o, err := c.resolveWriteOptions(ctx, opts)
	if err != nil {
		return 0, nil, fmt.Errorf("remove from %s: %w", t, err)
	}
	if o.rollout != nil {
		if err := rolloutTarget(t); err != nil {
			return 0, nil, fmt.Errorf("remove from %s: %w", t, err)
		}
	}
	named := slices.Clone(units)
	slices.Sort(named)
	named = slices.Compact(named)
	for range 10 {
		w, err := c.removeTxn(ctx, t, named, recursive, o)
		if err != nil {
			return 0, nil, err
		}
		resp, err := c.commitWrite(ctx, w)
		if err != nil {
			return 0, nil, err
		}
		if resp.Succeeded {
			return resp.Header.Revision, w.names, nil
		}
		// A key, a drop-in or a halt of the group was written in between:
		// read again.
	}
	return 0, nil, fmt.Errorf("remove from %s: its keys or the group's halts keep changing; nothing removed, retry", t)
}

// removeTxn composes the write that removes named (sorted, no
// duplicates) from t, with their drop-ins when recursive, guarded by the
// keys, the drop-ins judged and the group's halts as read now.
func (c *Client) removeTxn(ctx context.Context, t Target, named []string, recursive bool, o writeOptions) (*writeTxn, error) {
	judged := recursive || o.wholeUnits
	st, readRev, err := c.readKeys(ctx, t, named, judged)
	if err != nil {
		return nil, fmt.Errorf("remove from %s: %w", t, err)
	}
	if c.testAfterKeysRead != nil {
		c.testAfterKeysRead()
	}
	names, err := removedKeys(t, st, named, recursive, o.wholeUnits)
	if err != nil {
		return nil, err
	}
	for k := range st {
		if !slices.Contains(names, k) {
			delete(st, k) // a drop-in read only to be judged: not written
		}
	}
	w := c.newWriteTxn("removal", t, names, nil, st, o)
	if judged {
		// Guarded too on none of their drop-ins written since.
		for _, u := range named {
			if reconcile.UnitOfPath(u) == u {
				w.wholeUnits = append(w.wholeUnits, u)
			}
		}
		w.readRev = readRev
	}
	clears := func(h reconcile.Halt) bool {
		return slices.ContainsFunc(names, func(u string) bool { return partOf(u, h.Unit) })
	}
	if err := w.compose(ctx, clears); err != nil {
		return nil, fmt.Errorf("remove from %s: %w", t, err)
	}
	return w, nil
}

// removedKeys are the keys of st (read for named) that a removal of named
// deletes, sorted: each named key, and with recursive every drop-in and
// config file of a named unit. Nothing is removed when a named key is
// missing (an error wrapping ErrNotFound), or with wholeUnits when a named
// unit's drop-in would stay (a *DropInsError).
func removedKeys(t Target, st map[string]*keyState, named []string, recursive, wholeUnits bool) ([]string, error) {
	var (
		names   []string
		missing []string
		stay    = map[string][]string{}
		hasDrop = map[string]bool{}
	)
	for _, k := range slices.Sorted(maps.Keys(st)) {
		owner := reconcile.UnitOfPath(k)
		isDrop := owner != k // a drop-in or a config file of owner's set
		switch {
		case st[k].modRev != 0 && isDrop:
			hasDrop[owner] = true
			if recursive || slices.Contains(named, k) {
				names = append(names, k)
			} else if wholeUnits && slices.Contains(named, owner) && st[owner].modRev != 0 {
				stay[owner] = append(stay[owner], k)
			}
		case st[k].modRev != 0:
			names = append(names, k)
		}
	}
	for _, u := range named {
		if st[u].modRev == 0 && !(recursive && hasDrop[u]) {
			missing = append(missing, u)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("remove from %s: %w: %s (nothing removed)", t, ErrNotFound, strings.Join(missing, ", "))
	}
	if len(stay) > 0 {
		return nil, &DropInsError{Target: t, Stay: stay}
	}
	return names, nil
}

// List returns the unit keys of t, or of every host and group when t is
// nil, sorted by host, then group, then unit (host entries first).
func (c *Client) List(ctx context.Context, t *Target) ([]Listed, error) {
	var ops []clientv3.Op
	if t == nil {
		ops = []clientv3.Op{
			clientv3.OpGet(c.hostsRoot(), clientv3.WithPrefix()),
			clientv3.OpGet(c.groupsRoot(), clientv3.WithPrefix()),
		}
	} else {
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
		ops = []clientv3.Op{clientv3.OpGet(c.targetUnits(*t), clientv3.WithPrefix())}
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", c.prefix, err)
	}
	var out []Listed
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().GetKvs() {
			tg, unit, ok := c.parseUnitKey(string(kv.Key))
			if !ok {
				continue
			}
			out = append(out, Listed{Target: tg, Unit: unit, Value: kv.Value, Key: string(kv.Key), ModRevision: kv.ModRevision})
		}
	}
	slices.SortFunc(out, func(a, b Listed) int {
		return cmp.Or(
			cmp.Compare(a.Scope(), b.Scope()), // hosts first
			cmp.Compare(a.Host, b.Host),
			cmp.Compare(a.Group, b.Group),
			cmp.Compare(a.Unit, b.Unit))
	})
	return out, nil
}

// Get returns the content of one unit key of t; the error wraps
// ErrNotFound when it does not exist.
func (c *Client) Get(ctx context.Context, t Target, unit string) ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	if err := ValidateUnit(unit); err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	key := c.targetUnits(t) + unit
	resp, err := c.cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	return resp.Kvs[0].Value, nil
}
