package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/agentd/agentd/reconcile"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Members returns the membership records of the live agents, sorted by
// host. Host is taken from the key. A key whose host part is not a valid
// host name, or whose value does not decode, is skipped with a warning.
func (c *Client) Members(ctx context.Context) ([]reconcile.Member, error) {
	resp, err := c.cli.Get(ctx, c.agentsRoot(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", c.agentsRoot(), err)
	}
	return c.decodeMembers(resp.Kvs), nil
}

// decodeMembers decodes membership keys, sorted by host.
func (c *Client) decodeMembers(kvs []*mvccpb.KeyValue) []reconcile.Member {
	out := make([]reconcile.Member, 0, len(kvs))
	for _, kv := range kvs {
		host := strings.TrimPrefix(string(kv.Key), c.agentsRoot())
		if err := ValidateName("host", host); err != nil {
			c.skipKey(kv.Key, "not a membership key", err)
			continue
		}
		var m reconcile.Member
		if err := json.Unmarshal(kv.Value, &m); err != nil {
			c.skipKey(kv.Key, "value is not a membership record (delete it if no agent wrote it)", err)
			continue
		}
		m.Host = host
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b reconcile.Member) int { return strings.Compare(a.Host, b.Host) })
	return out
}

// Statuses returns the published statuses of host, by unit. A key whose
// value does not decode is skipped with a warning.
func (c *Client) Statuses(ctx context.Context, host string) (map[string]reconcile.Status, error) {
	if err := ValidateName("host", host); err != nil {
		return nil, fmt.Errorf("statuses: %w", err)
	}
	root := c.hostStatus(host)
	resp, err := c.cli.Get(ctx, root, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", root, err)
	}
	r := reconcile.HostReport{Statuses: make(map[string]reconcile.Status, len(resp.Kvs))}
	for _, kv := range resp.Kvs {
		c.decodeInto(root, kv, &r)
	}
	return r.Statuses, nil
}

// decodeInto adds one key under root (a host's status prefix) to r: its
// pass record, or a unit's status. A value that does not decode is left
// out, with a warning naming the key.
func (c *Client) decodeInto(root string, kv *mvccpb.KeyValue, r *reconcile.HostReport) {
	if strings.TrimPrefix(string(kv.Key), root) == reconcile.PassKey {
		var p reconcile.Pass
		if err := json.Unmarshal(kv.Value, &p); err != nil {
			c.skipKey(kv.Key, "value is not a pass record (the agent of that host rewrites it after its next pass)", err)
			return
		}
		r.Pass = p
		return
	}
	if unit, st, ok := c.decodeStatus(root, kv); ok {
		r.Statuses[unit] = st
	}
}

// decodeStatus decodes a status key under root (a host's status prefix).
// ok is false, after a warning naming the key, for a value that does not
// decode or an empty unit part.
func (c *Client) decodeStatus(root string, kv *mvccpb.KeyValue) (unit string, st reconcile.Status, ok bool) {
	unit = strings.TrimPrefix(string(kv.Key), root)
	if unit == "" {
		c.skipKey(kv.Key, "a status key without a unit", nil)
		return "", st, false
	}
	if err := json.Unmarshal(kv.Value, &st); err != nil {
		c.skipKey(kv.Key, "value is not a unit status (the agent of that host removes it when it next reports)", err)
		return "", st, false
	}
	if st.Unit == "" {
		st.Unit = unit
	}
	return unit, st, true
}

// WatchStatuses is WatchReports for the statuses alone.
func (c *Client) WatchStatuses(ctx context.Context, hosts []string, fn func(map[string]map[string]reconcile.Status) (done bool)) error {
	return c.WatchReports(ctx, hosts, func(all map[string]reconcile.HostReport) bool {
		st := make(map[string]map[string]reconcile.Status, len(all))
		for h, r := range all {
			st[h] = r.Statuses
		}
		return fn(st)
	})
}

// WatchReports calls fn with what hosts have published (every requested
// host has an entry, possibly empty: no pass record, no statuses) read at
// one revision R, then again after every change under <p>/status/<host>/
// for those hosts, watched from R+1. fn gets a fresh map each time; a key
// whose value does not decode is left out (with a warning). It returns nil
// once fn returns true, ctx.Err() when ctx is done, or an error (etcd
// unreachable, watch refused). On compaction or a closed watch channel it
// re-reads and carries on.
func (c *Client) WatchReports(ctx context.Context, hosts []string, fn func(map[string]reconcile.HostReport) (done bool)) error {
	hs := slices.Clone(hosts)
	slices.Sort(hs)
	hs = slices.Compact(hs)
	for _, h := range hs {
		if err := ValidateName("host", h); err != nil {
			return fmt.Errorf("watch statuses: %w", err)
		}
	}
	return c.keepWatching(ctx, "status watch", func() (bool, error) {
		state, rev, err := c.readStatuses(ctx, hs)
		if err != nil {
			return false, err
		}
		if fn(cloneStatuses(state)) {
			return true, nil
		}
		return c.followStatuses(ctx, hs, state, rev, fn)
	})
}

// keepWatching runs attempt — a read, then a watch from the revision
// read — until it says done: again at once when it ends without an error
// (a compaction, a closed watch channel), after a backoff when it fails in
// a way retrying can change. It returns ctx.Err() when ctx ends and any
// other error as it is.
func (c *Client) keepWatching(ctx context.Context, what string, attempt func() (done bool, err error)) error {
	for fails := 0; ; {
		done, err := attempt()
		if done {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			continue
		}
		if !retryable(err) {
			return err
		}
		d := backoffDelay(fails)
		fails++
		c.log.Warn(what+" failed; retrying", "err", err, "retry_in", d.Round(time.Millisecond))
		if err := sleepCtx(ctx, d); err != nil {
			return err
		}
	}
}

// retryable: etcd without a leader, a member away, a request timed out —
// anything but a refusal that retrying cannot change.
func retryable(err error) bool {
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	switch code {
	case codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument:
		return false
	}
	return true
}

// readStatuses reads what hosts published at one revision: the first
// transaction picks R, the others read at R.
// Reports reads the statuses and pass records of hosts, in transactions of
// many hosts each (one read per 1,000 hosts, not one per host).
func (c *Client) Reports(ctx context.Context, hosts []string) (map[string]reconcile.HostReport, error) {
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	state, _, err := c.readStatuses(rctx, hosts)
	return state, err
}

func (c *Client) readStatuses(ctx context.Context, hosts []string) (map[string]reconcile.HostReport, int64, error) {
	state := make(map[string]reconcile.HostReport, len(hosts))
	for _, h := range hosts {
		state[h] = reconcile.HostReport{Statuses: map[string]reconcile.Status{}}
	}
	var rev int64
	for chunk := range slices.Chunk(hosts, maxTxnOps) {
		ops := make([]clientv3.Op, len(chunk))
		for i, h := range chunk {
			ops[i] = clientv3.OpGet(c.hostStatus(h), clientv3.WithPrefix(), clientv3.WithRev(rev))
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, 0, fmt.Errorf("read %s: %w", c.statusRoot(), err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for i, r := range resp.Responses {
			root := c.hostStatus(chunk[i])
			hr := state[chunk[i]]
			for _, kv := range r.GetResponseRange().GetKvs() {
				c.decodeInto(root, kv, &hr)
			}
			state[chunk[i]] = hr
		}
	}
	return state, rev, nil
}

// followStatuses watches from rev+1. done reports fn returned true; (false,
// nil) asks the caller to re-read.
func (c *Client) followStatuses(ctx context.Context, hosts []string, state map[string]reconcile.HostReport, rev int64,
	fn func(map[string]reconcile.HostReport) bool) (done bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	prefix := c.statusRoot() // several hosts: one watcher, filtered here
	if len(hosts) == 1 {
		prefix = c.hostStatus(hosts[0])
	}
	for resp := range c.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if resp.CompactRevision != 0 {
			return false, nil
		}
		if err := resp.Err(); err != nil {
			return false, fmt.Errorf("watch %s: %w", prefix, err)
		}
		changed := false
		for _, ev := range resp.Events {
			host, unit, ok := strings.Cut(strings.TrimPrefix(string(ev.Kv.Key), c.statusRoot()), "/")
			hr, watched := state[host]
			if !ok || !watched {
				continue
			}
			changed = true
			// What the key held before is gone, whether or not its new
			// value decodes.
			if unit == reconcile.PassKey {
				hr.Pass = reconcile.Pass{}
			} else {
				delete(hr.Statuses, unit)
			}
			if ev.Type != clientv3.EventTypeDelete {
				c.decodeInto(c.hostStatus(host), ev.Kv, &hr)
			}
			state[host] = hr
		}
		if changed && fn(cloneStatuses(state)) {
			return true, nil
		}
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	return false, nil // channel closed: re-read
}

func cloneStatuses(s map[string]reconcile.HostReport) map[string]reconcile.HostReport {
	out := make(map[string]reconcile.HostReport, len(s))
	for h, r := range s {
		out[h] = reconcile.HostReport{Pass: r.Pass, Statuses: maps.Clone(r.Statuses)}
	}
	return out
}
