package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
)

// An agent's facts (reconcile.Facts: the files in its unit directory it
// did not write, the content it will not apply again) live at
// <p>/facts/<host>, one JSON value bound to its lease like its statuses:
// they are true only while the agent that saw them runs. The agent writes
// the key only when its facts change.

// PublishFacts puts f at <p>/facts/<host> bound to the Session's lease,
// guarded, like every status report, by the membership key still carrying
// that lease. gone is closed when that lease is lost (the facts go with
// it): publish them again then; the Session re-creates the lease on its
// own. It fails at once while the lease is lost.
func (s *Session) PublishFacts(ctx context.Context, f reconcile.Facts) (gone <-chan struct{}, err error) {
	val, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("publish facts: encode: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrSessionClosed
	}
	if !s.alive() {
		return nil, fmt.Errorf("publish facts of %s: %w", s.member.Host, errLeaseLost)
	}
	c := s.c
	lease := s.sess.Lease()
	key := c.factsKey(s.member.Host)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Txn(rctx).
		If(clientv3.Compare(clientv3.LeaseValue(c.agentKey(s.member.Host)), "=", lease)).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(lease))).Commit()
	if err != nil {
		return nil, fmt.Errorf("publish facts: put %s: %w", key, err)
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("publish facts of %s: %w", s.member.Host, errLeaseLost)
	}
	return s.sess.Done(), nil
}

// Facts returns the facts host's agent publishes; nil when it publishes
// none (no live agent, an agent older than facts, or one whose first pass
// has not ended).
func (c *Client) Facts(ctx context.Context, host string) (*reconcile.Facts, error) {
	if err := ValidateName("host", host); err != nil {
		return nil, fmt.Errorf("facts: %w", err)
	}
	key := c.factsKey(host)
	resp, err := c.cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return c.decodeFacts(resp.Kvs[0].Key, resp.Kvs[0].Value), nil
}

// AllFacts returns the facts every agent publishes, by host, in one read.
func (c *Client) AllFacts(ctx context.Context) (map[string]*reconcile.Facts, error) {
	root := c.factsRoot()
	resp, err := c.cli.Get(ctx, root, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", root, err)
	}
	out := make(map[string]*reconcile.Facts, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		host := strings.TrimPrefix(string(kv.Key), root)
		if err := ValidateName("host", host); err != nil {
			c.skipKey(kv.Key, "not a facts key", err)
			continue
		}
		if f := c.decodeFacts(kv.Key, kv.Value); f != nil {
			out[host] = f
		}
	}
	return out, nil
}

// decodeFacts decodes a facts value; nil, after a warning naming the key,
// when it does not decode (a preview then goes without).
func (c *Client) decodeFacts(key, val []byte) *reconcile.Facts {
	var f reconcile.Facts
	if err := json.Unmarshal(val, &f); err != nil {
		c.skipKey(key, "value is not an agent's facts", err)
		return nil
	}
	return &f
}
