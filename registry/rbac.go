package registry

import (
	"fmt"
	"slices"
	"strings"
)

// Least privilege in etcd.
//
// An agent turns registry content into root processes, so a machine's etcd
// credentials must not reach anything beyond that machine's own keys: a
// compromised host must not be able to write another host's units or
// status, impersonate another agent, or halt or block rollouts of groups it
// is not in. AgentPermissions is the exact set of key ranges the agent
// (Dial, Watch, Join, Report, Acquire/Holding, Halt) touches; `agentd rbac`
// prints the etcdctl commands that grant it, and the integration tests run
// an agent under that role.
//
// Git mirrors (mirror.go) run with an operator's credentials, not an
// agent's: an agent writes nothing under <p>/mirror/ and reads only the
// holds (<p>/mirror/holds/: a commit over etcd's limits being written,
// mirror_chunks.go). (An operator's role that may Put or Remove
// needs read access to <p>/mirror/owners/: every write checks whether a
// mirror owns its target.)
//
// Lease calls need nothing more: LeaseGrant needs only an authenticated
// user, and etcd allows keep-alive and revoke of a lease only to a user who
// may write every key bound to it — for the agent, its own agents/<host>,
// status/<host>/, facts/<host> and lock keys, all in the set below.

// Permission is one key range of an agent's etcd role.
type Permission struct {
	// Key is the full key, prefix included.
	Key string
	// Prefix: the range is every key starting with Key (etcdctl
	// --prefix=true); otherwise the single key Key.
	Prefix bool
	// Write: read and write; otherwise read only.
	Write bool
	// Why the agent needs it (documentation, `agentd rbac` comments).
	Why string
}

// Type is "read" or "readwrite", as etcdctl role grant-permission takes it.
func (p Permission) Type() string {
	if p.Write {
		return "readwrite"
	}
	return "read"
}

// AgentRole is the name of the etcd role (and user) of host's agent.
func AgentRole(host string) string { return "agentd-host-" + host }

// AgentPermissions returns the key ranges the agent of host, a member of
// groups, needs under prefix (DefaultPrefix when empty), and nothing else:
//
//	<p>/                       key     read       Dial's connection probe (a count-only get of this one key; it holds nothing)
//	<p>/hosts/<h>/             prefix  read       its own unit keys (Watch)
//	<p>/agents/<h>             key     readwrite  its membership record (Join compares and reads it; every Report is guarded by it)
//	<p>/status/<h>/            prefix  readwrite  its statuses (Report puts them, lists the prefix, deletes stale keys)
//	<p>/facts/<h>              key     readwrite  its facts for previews (PublishFacts puts them)
//	<p>/selectors/             prefix  read       the selector targets (WatchSelectors); and each per-group key below for "sel-" as a key prefix: every selector group
//	<p>/groups/<g>/            prefix  read       each group's unit keys (Watch; Halt reads the unit's current content)
//	<p>/halts/groups/<g>/      prefix  readwrite  each group's halts (Watch; Halt records a version this host failed)
//	<p>/locks/groups/<g>/      prefix  readwrite  each group's MaxUnavailable queues (Acquire reads and watches the queue, writes its own key)
//	<p>/rollouts/hosts/<h>/         prefix  readwrite  its own rollout progress (Watch; WriteProgress)
//	<p>/rollouts/hosts/             prefix  read       every host's rollout progress (read by the group's coordinator only)
//	<p>/rollouts/groups/<g>/        prefix  readwrite  each group's rollouts (Watch; the coordinator ends one, a host pauses one)
//	<p>/rollouts/admit/<g>/         prefix  readwrite  each group's admissions (a host watches its own; the coordinator writes them)
//	<p>/rollouts/summary/<g>/       prefix  readwrite  each group's rollout summaries (the coordinator writes them)
//	<p>/rollouts/summary/           prefix  read       every group's summaries (a coordinator reads the one its rollout follows: --after)
//	<p>/rollouts/coordinator/<g>/   prefix  readwrite  each group's coordinator election (Campaign)
//	<p>/mirror/holds/               prefix  read       the git mirrors' holds (Watch waits while one covers its targets)
//
// Groups are sorted and deduplicated, as Watch does.
func AgentPermissions(prefix, host string, groups []string) ([]Permission, error) {
	if err := ValidateName("host", host); err != nil {
		return nil, err
	}
	gs := slices.Clone(groups)
	slices.Sort(gs)
	gs = slices.Compact(gs)
	if len(gs) == 0 {
		return nil, fmt.Errorf("%w: no group; an agent is in at least one (default \"all\")", ErrInvalid)
	}
	for _, g := range gs {
		if err := ValidateName("group", g); err != nil {
			return nil, err
		}
	}
	c := New(nil, prefix) // key layout only; no connection
	perms := []Permission{
		{Key: c.prefix + "/", Why: "connection probe: a count-only get of this one key, which holds nothing"},
		{Key: c.hostsRoot() + host + "/", Prefix: true, Why: "its own unit keys and their signatures (watched)"},
		{Key: c.agentKey(host), Write: true, Why: "its membership record, bound to its lease (compared and read when joining; guards every status report)"},
		{Key: c.hostStatus(host), Prefix: true, Write: true, Why: "its unit statuses and pass record, bound to its lease (put, listed, stale ones deleted)"},
		{Key: c.memberKey(host), Write: true, Why: "its member record, without a lease (put at join, every minute, and at leave)"},
		{Key: c.factsKey(host), Write: true, Why: "its facts for previews (the files it did not write, the content it refused), bound to its lease"},
		{Key: c.progressDir(host), Prefix: true, Write: true, Why: "its own progress in the rollouts (watched; written as it takes, soaks or reverts a change)"},
		{Key: c.progressRoot(), Prefix: true, Why: "every host's progress in the rollouts (read by its group's coordinator, when this host is elected)"},
		{Key: c.summaryRoot(), Prefix: true, Why: "every group's rollout summaries (read by a coordinator whose rollout waits for another group's to end: --after)"},
		{Key: c.holdsRoot(), Prefix: true, Why: "the git mirrors' holds (watched: a commit over etcd's limits being written; its hosts wait for the whole of it)"},
		{Key: c.selectorsRoot(), Prefix: true, Why: "the selector targets (watched: it joins the sel- groups whose selectors match its labels)"},
	}
	for _, g := range gs {
		perms = append(perms, c.groupPermissions(g, "group "+g)...)
	}
	// Every selector group (sel-…): which of them it joins it decides by
	// its own labels (cmd/agentd), so its role covers them all, by the
	// key prefix their names share.
	for _, p := range c.groupPermissions(selectorPrefix, "every selector group (sel-…)") {
		p.Key = strings.TrimSuffix(p.Key, "/")
		perms = append(perms, p)
	}
	return perms, nil
}

// groupPermissions are what an agent needs of group g, who naming it.
func (c *Client) groupPermissions(g, who string) []Permission {
	return []Permission{
		{Key: c.groupsRoot() + g + "/", Prefix: true, Why: who + "'s unit keys and their signatures (watched; read before recording a halt)"},
		{Key: c.groupHalts(g), Prefix: true, Write: true, Why: who + "'s rollout halts (watched; written when this host fails a version)"},
		{Key: c.prefix + "/locks/groups/" + g + "/", Prefix: true, Write: true, Why: who + "'s MaxUnavailable= queues (read and watched; its own slot keys written and deleted)"},
		{Key: c.rolloutGroup(g), Prefix: true, Write: true, Why: who + "'s rollouts (watched; written to end one that completed or failed, as coordinator, or to pause one whose unit restarts too often)"},
		{Key: c.admitGroup(g), Prefix: true, Write: true, Why: who + "'s rollout admissions (its own watched; written as coordinator)"},
		{Key: c.summaryRoot() + g + "/", Prefix: true, Write: true, Why: who + "'s rollout summaries (written as coordinator)"},
		{Key: c.electionPrefix(g) + "/", Prefix: true, Write: true, Why: who + "'s coordinator election (its candidacy, on its lease)"},
	}
}
