package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/agentd/agentd/reconcile"
)

// ErrConflict is wrapped by a ConflictError: a conditional write
// (IfModRevision) found the key at another revision than the one it was
// read at.
var ErrConflict = errors.New("changed since it was read")

// ConflictError says a key was written (or removed) by someone else
// between the read at Want and the compare-and-swap; Got is its revision
// now, 0 when it no longer exists. Nothing was written.
type ConflictError struct {
	Key       string
	Want, Got int64
}

func (e *ConflictError) Error() string {
	if e.Got == 0 {
		return fmt.Sprintf("%s was removed since it was read at revision %d; nothing written", e.Key, e.Want)
	}
	return fmt.Sprintf("%s changed since it was read (revision %d → %d); nothing written", e.Key, e.Want, e.Got)
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

// GetRevision returns the content of one unit key of t and the revision
// that last wrote it (its ModRevision), for a later Put with
// IfModRevision. The
// error wraps ErrNotFound when the key does not exist.
func (c *Client) GetRevision(ctx context.Context, t Target, unit string) ([]byte, int64, error) {
	if err := t.Validate(); err != nil {
		return nil, 0, fmt.Errorf("get: %w", err)
	}
	if err := ValidateUnit(unit); err != nil {
		return nil, 0, fmt.Errorf("get: %w", err)
	}
	key := c.targetUnits(t) + unit
	resp, err := c.cli.Get(ctx, key)
	if err != nil {
		return nil, 0, fmt.Errorf("get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	return resp.Kvs[0].Value, resp.Kvs[0].ModRevision, nil
}

// HostSnapshot reads, in one transaction, every unit key meant for host
// (its own and those of groups) and the halts of those groups: what the
// agent of host would read (see Watch), once.
func (c *Client) HostSnapshot(ctx context.Context, host string, groups []string) (reconcile.Snapshot, error) {
	if err := ValidateName("host", host); err != nil {
		return reconcile.Snapshot{}, fmt.Errorf("read: %w", err)
	}
	gs := slices.Clone(groups)
	slices.Sort(gs)
	gs = slices.Compact(gs)
	w := &unitWatch{c: c, log: c.log.With("host", host), prefixes: []string{c.targetRoot(Target{Host: host})}}
	for _, g := range gs {
		if err := ValidateName("group", g); err != nil {
			return reconcile.Snapshot{}, fmt.Errorf("read: %w", err)
		}
		w.prefixes = append(w.prefixes, c.targetRoot(Target{Group: g}), c.groupHalts(g))
	}
	state, rev, err := w.read(ctx)
	if err != nil {
		return reconcile.Snapshot{}, err
	}
	return state.snapshot(rev).Snapshot, nil
}

// PutClears reports whether putting units (key suffix → value) for a group
// clears the halt h: the rule Put applies (a new version resumes a halted
// rollout; the version that failed, put again, does not).
func PutClears(h reconcile.Halt, units map[string][]byte) bool { return putClears(h, units) }
