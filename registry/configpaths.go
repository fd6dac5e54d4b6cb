package registry

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
)

// ErrTwoWriters: a put would give a path two writers (checkOneWriter).
// It wraps ErrInvalid.
var ErrTwoWriters = fmt.Errorf("%w: two keys write one path", ErrInvalid)

// checkOneWriter refuses a put to t whose config files would write a path
// another key of t writes too (reconcile.PathWriters): each path has one
// writer, and a unit that reads a path of another unit's set names it in
// its RestartTriggers= or ReloadTriggers= instead. The agent blocks the
// later key of such a pair all the same (a concurrent put, or keys of
// another target on the same host); this says so before anything is
// stored, naming both keys.
func (c *Client) checkOneWriter(ctx context.Context, t Target, units map[string][]byte) error {
	if !slices.ContainsFunc(slices.Collect(maps.Keys(units)), reconcile.IsConfigPath) {
		return nil
	}
	root := c.targetUnits(t)
	resp, err := c.cli.Get(ctx, root, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("put %s: read %s: %w", t, root, err)
	}
	keys := slices.Collect(maps.Keys(units))
	for _, kv := range resp.Kvs {
		if k := strings.TrimPrefix(string(kv.Key), root); reconcile.IsConfigPath(k) && units[k] == nil {
			keys = append(keys, k)
		}
	}
	var errs []string
	writers := reconcile.PathWriters(keys)
	for _, dest := range slices.Sorted(maps.Keys(writers)) {
		ks := writers[dest]
		var ours []string
		for _, k := range ks {
			if units[k] != nil {
				ours = append(ours, k)
			}
		}
		if len(ours) == 0 {
			continue // a conflict already stored, not this put's
		}
		errs = append(errs, fmt.Sprintf("%s would be written by %s", dest, strings.Join(ks, " and ")))
	}
	if len(errs) > 0 {
		return fmt.Errorf("put %s: %w: %s; a path has one writer: put the file with one unit and name it in the other's [X-Agentd] RestartTriggers= or ReloadTriggers=",
			t, ErrTwoWriters, strings.Join(errs, "; "))
	}
	return nil
}
