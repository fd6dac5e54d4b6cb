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

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
)

// A group's members are the hosts that have joined it. Their agents'
// membership keys (<p>/agents/<host>) go with their leases, so a host whose
// agent is down would drop out of every group `--wait` counts and be called
// done by omission. Each agent therefore also keeps a record without a
// lease at <p>/members/<host>, refreshed while it runs, until an operator
// retires the host (ForgetHost).

// memberRefresh is how often a running agent renews its member record's
// LastSeen: one put a minute per agent.
const memberRefresh = time.Minute

// ErrHostLive is returned by ForgetHost for a host whose agent is up.
var ErrHostLive = errors.New("host has a live agent")

// KnownHost is a host that has joined the registry, live or not.
type KnownHost struct {
	reconcile.Member
	// LastSeen is when its agent last renewed its record (within
	// memberRefresh of its last moment up, or the time it left cleanly).
	LastSeen time.Time `json:"lastSeen"`
	// Live says an agent holds the host's membership key now. Not stored.
	Live bool `json:"live"`
}

func (c *Client) membersRoot() string          { return c.prefix + "/members/" }
func (c *Client) memberKey(host string) string { return c.membersRoot() + host }

// putMember writes m's member record with LastSeen now.
func (c *Client) putMember(ctx context.Context, m reconcile.Member) error {
	val, err := json.Marshal(KnownHost{Member: m, LastSeen: time.Now().UTC()})
	if err != nil {
		return fmt.Errorf("encode member record: %w", err)
	}
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	if _, err := c.cli.Put(rctx, c.memberKey(m.Host), string(val)); err != nil {
		return fmt.Errorf("put %s: %w", c.memberKey(m.Host), err)
	}
	return nil
}

// KnownHosts returns every host that has joined (its member record) or has
// a live agent (its membership key, for an agent that wrote no record),
// sorted by host, read at one revision. For a live agent the groups and
// version are its own; for one that is down, those of its last record.
// The selector groups among Groups are those whose selectors (read at the
// same revision) match the host's labels, as its agent computes them: a
// selector's members are known before its agents have followed its record.
func (c *Client) KnownHosts(ctx context.Context) ([]KnownHost, error) {
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(c.membersRoot(), clientv3.WithPrefix()),
		clientv3.OpGet(c.agentsRoot(), clientv3.WithPrefix()),
		clientv3.OpGet(c.selectorsRoot(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("list %s and %s: %w", c.membersRoot(), c.agentsRoot(), err)
	}
	byHost := map[string]*KnownHost{}
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		host := strings.TrimPrefix(string(kv.Key), c.membersRoot())
		if err := ValidateName("host", host); err != nil {
			c.skipKey(kv.Key, "not a member key", err)
			continue
		}
		var k KnownHost
		if err := json.Unmarshal(kv.Value, &k); err != nil {
			c.skipKey(kv.Key, "value is not a member record (delete it if no agent wrote it)", err)
			continue
		}
		k.Host, k.Live = host, false
		byHost[host] = &k
	}
	for _, m := range c.decodeMembers(resp.Responses[1].GetResponseRange().GetKvs()) {
		k := byHost[m.Host]
		if k == nil {
			k = &KnownHost{}
			byHost[m.Host] = k
		}
		k.Member, k.Live = m, true
	}
	sels := c.decodeSelectors(resp.Responses[2].GetResponseRange().GetKvs())
	for g, s := range c.assumed {
		sels[g] = s
	}
	out := make([]KnownHost, 0, len(byHost))
	for _, k := range byHost {
		k.Groups = withSelectorGroups(k.Groups, sels, k.Labels)
		out = append(out, *k)
	}
	slices.SortFunc(out, func(a, b KnownHost) int { return strings.Compare(a.Host, b.Host) })
	return out, nil
}

// ForgetHost deletes host's member record: it no longer counts as a member
// of its groups. It refuses (ErrHostLive) while an agent holds the host's
// membership key, in the same transaction as the delete.
func (c *Client) ForgetHost(ctx context.Context, host string) error {
	if err := ValidateName("host", host); err != nil {
		return fmt.Errorf("forget: %w", err)
	}
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(c.agentKey(host)), "=", 0)).
		Then(clientv3.OpDelete(c.memberKey(host))).
		Commit()
	if err != nil {
		return fmt.Errorf("forget %s: %w", host, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("forget %s: %w: stop its agent first", host, ErrHostLive)
	}
	if resp.Responses[0].GetResponseDeleteRange().GetDeleted() == 0 {
		return fmt.Errorf("forget %s: %w: no such member", host, ErrNotFound)
	}
	return nil
}

// SetGroups changes the groups the Session's membership record names to
// groups: the membership key (on the current lease, when there is one) and
// the member record are put again at once. A lease re-created later
// carries the new groups too.
func (s *Session) SetGroups(ctx context.Context, groups []string) error {
	return s.update(ctx, "set groups", func(m *reconcile.Member) { m.Groups = slices.Clone(groups) })
}

// SetMember changes the groups and the labels the Session's membership
// record names (an agent whose labels changed, and with them the selector
// groups it is in), in one put of each record, as SetGroups does.
func (s *Session) SetMember(ctx context.Context, groups []string, labels map[string]string) error {
	return s.update(ctx, "set groups and labels", func(m *reconcile.Member) {
		m.Groups, m.Labels = slices.Clone(groups), maps.Clone(labels)
	})
}

// update changes the Session's membership record with edit and puts it
// again: the membership key on the current lease (when there is one), then
// the member record. what names the change in an error.
func (s *Session) update(ctx context.Context, what string, edit func(*reconcile.Member)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrSessionClosed
	}
	edit(&s.member)
	if s.sess != nil {
		rctx, cancel := s.c.reqCtx(ctx)
		err := s.c.claim(rctx, s.member, s.sess.Lease())
		cancel()
		if err != nil {
			return fmt.Errorf("%s of %s: %w", what, s.member.Host, err)
		}
	}
	if err := s.c.putMember(ctx, s.member); err != nil {
		return fmt.Errorf("%s of %s: %w", what, s.member.Host, err)
	}
	return nil
}

// Member is the Session's membership record as it stands (SetGroups and
// SetMember change it): a copy.
func (s *Session) Member() reconcile.Member { return s.memberNow() }

func (s *Session) memberNow() reconcile.Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.member
	m.Groups, m.Labels = slices.Clone(m.Groups), maps.Clone(m.Labels)
	return m
}
