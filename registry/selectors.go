package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/selector"
)

// Selector targets.
//
// Key layout:
//
//	<p>/selectors/<group>   the selector's canonical text (selector.String)
//
// A selector target is a group whose members are the hosts whose labels
// match the selector: its keys live under <p>/groups/<group>/ as any
// group's, and <group> is SelectorGroup of the canonical text, so the same
// selector however written is the same group. Each agent evaluates every
// recorded selector against its own labels and joins the groups of those
// that match (cmd/agentd). The record is written before the first put to
// the group (PutSelector) and never deleted by agentd.

// selectorPrefix is what every selector group's name starts with.
const selectorPrefix = "sel-"

func (c *Client) selectorsRoot() string { return c.prefix + "/selectors/" }

// SelectorGroup is the group that stands for the selector s: "sel-" and
// the first 12 hex digits of the SHA-256 of its canonical text.
func SelectorGroup(s selector.Selector) string {
	sum := sha256.Sum256([]byte(s.String()))
	return selectorPrefix + hex.EncodeToString(sum[:])[:12]
}

// IsSelectorGroup says whether group is named as SelectorGroup names one.
func IsSelectorGroup(group string) bool { return strings.HasPrefix(group, selectorPrefix) }

// PutSelector records s at <p>/selectors/<SelectorGroup(s)> unless it is
// there, and returns the group. An empty selector (every host) is refused:
// that is a group of its own (--group all).
func (c *Client) PutSelector(ctx context.Context, s selector.Selector) (string, error) {
	if s.Empty() {
		return "", fmt.Errorf("%w selector: empty (it would match every host; use a group)", ErrInvalid)
	}
	group := SelectorGroup(s)
	key := c.selectorsRoot() + group
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, s.String())).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return "", fmt.Errorf("put %s: %w", key, err)
	}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 1 && string(kvs[0].Value) != s.String() {
			return "", fmt.Errorf("%s holds selector %q, not %q: two selectors share a group name; choose another way to write it", key, kvs[0].Value, s.String())
		}
	}
	return group, nil
}

// Selectors returns every recorded selector by its group, parsed, and the
// revision it was read at. A record that does not parse, or whose group is
// not its SelectorGroup, is left out and logged.
func (c *Client) Selectors(ctx context.Context) (map[string]selector.Selector, int64, error) {
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(rctx, c.selectorsRoot(), clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("list %s: %w", c.selectorsRoot(), err)
	}
	return c.decodeSelectors(resp.Kvs), resp.Header.Revision, nil
}

// decodeSelectors decodes selector records by group, leaving out (and
// logging) those that do not parse or are not at their group.
func (c *Client) decodeSelectors(kvs []*mvccpb.KeyValue) map[string]selector.Selector {
	out := map[string]selector.Selector{}
	for _, kv := range kvs {
		group := strings.TrimPrefix(string(kv.Key), c.selectorsRoot())
		s, err := selector.Parse(string(kv.Value))
		if err == nil && SelectorGroup(s) != group {
			err = fmt.Errorf("the selector's group is %s", SelectorGroup(s))
		}
		if err != nil {
			c.skipKey(kv.Key, "not a selector record", err)
			continue
		}
		out[group] = s
	}
	return out
}

// withSelectorGroups are groups without the groups of the selectors in
// all, plus those of them that match labels: the groups a host with these
// labels is in, as its agent computes them. (A group named like a selector
// group without a record, given to an agent with --group, stays.)
func withSelectorGroups(groups []string, all map[string]selector.Selector, labels map[string]string) []string {
	out := slices.DeleteFunc(slices.Clone(groups), func(g string) bool { _, ok := all[g]; return ok })
	for _, g := range MatchingSelectors(all, labels) {
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}

// AssumeSelector makes KnownHosts count the group of s as if s were
// recorded: for a command that records it only later (a dry run never).
// Call it before the Client is used concurrently.
func (c *Client) AssumeSelector(s selector.Selector) {
	if c.assumed == nil {
		c.assumed = map[string]selector.Selector{}
	}
	c.assumed[SelectorGroup(s)] = s
}

// SelectorOf returns the selector recorded for group (false: none).
func (c *Client) SelectorOf(ctx context.Context, group string) (selector.Selector, bool, error) {
	all, _, err := c.Selectors(ctx)
	if err != nil {
		return selector.Selector{}, false, err
	}
	s, ok := all[group]
	return s, ok, nil
}

// WatchSelectors calls onChange with every recorded selector (Selectors)
// at once, then again after each change of <p>/selectors/ (the whole set,
// re-read). It re-reads after a watch error with a backoff of 100 ms
// doubling to 10 s, calling onChange only when the set differs from the
// last one handed out. It returns ctx.Err() when ctx is done. onChange
// runs on WatchSelectors' goroutine.
func (c *Client) WatchSelectors(ctx context.Context, onChange func(map[string]selector.Selector)) error {
	var last map[string]string
	fails := 0
	for {
		all, rev, err := c.Selectors(ctx)
		if err == nil {
			if texts := selectorTexts(all); last == nil || !maps.Equal(last, texts) {
				last = texts
				onChange(all)
			}
			err = c.waitSelectorChange(ctx, rev)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			fails = 0
			continue
		}
		d := backoffDelay(fails)
		fails++
		c.log.Log(ctx, slog.LevelWarn, "selectors: registry read or watch failed; retrying", "err", err, "retry_in", d.Round(time.Millisecond))
		if err := sleepCtx(ctx, d); err != nil {
			return err
		}
	}
}

// waitSelectorChange returns nil at the first change of <p>/selectors/
// after rev, an error when the watch fails.
func (c *Client) waitSelectorChange(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range c.cli.Watch(wctx, c.selectorsRoot(), clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			return err
		}
		if len(resp.Events) > 0 {
			return nil
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errWatchClosed
}

func selectorTexts(all map[string]selector.Selector) map[string]string {
	out := make(map[string]string, len(all))
	for g, s := range all {
		out[g] = s.String()
	}
	return out
}

// MatchingSelectors returns the groups of the selectors in all that match
// labels, sorted.
func MatchingSelectors(all map[string]selector.Selector, labels map[string]string) []string {
	var out []string
	for g, s := range all {
		if s.Matches(labels) {
			out = append(out, g)
		}
	}
	slices.Sort(out)
	return out
}
