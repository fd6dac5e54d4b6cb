package registry

import (
	"strings"
	"testing"

	"github.com/agentd/agentd/reconcile"
)

// covers reports whether perms grant key (write: readwrite).
func covers(perms []Permission, key string, write bool) bool {
	for _, p := range perms {
		in := key == p.Key || p.Prefix && strings.HasPrefix(key, p.Key)
		if in && (p.Write || !write) {
			return true
		}
	}
	return false
}

// AgentPermissions covers every key the agent's own code reads or writes,
// built with the same key functions, and none of another host's or
// group's keys — including hosts whose names extend this one's ("h1" vs
// "h10").
func TestAgentPermissionsMatchKeyLayout(t *testing.T) {
	for _, prefix := range []string{"", "/agentd", "/corp/agentd/"} {
		perms, err := AgentPermissions(prefix, "h1", []string{"web", "all", "web"})
		if err != nil {
			t.Fatal(err)
		}
		c := New(nil, prefix)
		const u, id = "app.service", "r20260102-030405-0a1b2c3d"
		election := func(g string) string { return c.electionPrefix(g) + "/694d7f3a1b2c" } // as concurrency.Election names a candidate
		reads := []string{
			c.prefix + "/", // Dial's probe
			c.hostUnits("h1") + u, c.hostUnits("h1") + u + ".d/x.conf",
			c.groupUnits("web") + u, c.groupUnits("all") + u,
			c.groupHalts("web") + u, c.groupHalts("all") + u,
			c.lockDir("groups/web", u) + "h2", c.lockDir("groups/all", u) + "h3",
			c.agentKey("h1"), c.hostStatus("h1") + u, c.factsKey("h1"),
			c.hostStatus("h1") + reconcile.PassKey, c.memberKey("h1"),
			// Rollouts: Watch reads the records and this host's own progress
			// and admissions; the coordinator every host's progress and its
			// group's admissions, summaries and election.
			c.rolloutKey("web", id), c.rolloutKey("all", id), c.progressKey("h1", id),
			c.admitKey("web", "h1", id), c.admitKey("all", "h1", id),
			c.progressKey("h2", id), c.progressKey("h10", id), c.admitKey("web", "h2", id),
			c.summaryKey("web", id), election("web"), election("all"),
			c.holdKey("default"), // Watch: a mirror's hold
			// ReadFollowed: the summary of another group's rollout that a
			// rollout of this one waits for (--after).
			c.summaryKey("db", id), c.summaryKey("web2", id),
		}
		writes := []string{
			c.agentKey("h1"), c.hostStatus("h1") + u, c.factsKey("h1"),
			c.hostStatus("h1") + reconcile.PassKey, c.memberKey("h1"),
			c.haltKey("groups/web", u), c.haltKey("groups/all", "app@1.service"),
			c.lockKey("groups/web", u, "h1"), c.lockKey("groups/all", u, "h1"),
			// WriteProgress, PauseRollout; as coordinator Admit, End,
			// WriteSummary, Campaign.
			c.progressKey("h1", id), c.rolloutKey("web", id), c.admitKey("web", "h2", id),
			c.summaryKey("all", id), election("web"),
		}
		for _, k := range reads {
			if !covers(perms, k, false) {
				t.Errorf("prefix %q: the agent reads %s but may not", prefix, k)
			}
		}
		for _, k := range writes {
			if !covers(perms, k, true) {
				t.Errorf("prefix %q: the agent writes %s but may not", prefix, k)
			}
		}
		denied := []string{
			c.hostUnits("h2") + u, c.hostUnits("h10") + u,
			c.agentKey("h2"), c.agentKey("h10"), c.agentsRoot(),
			c.hostStatus("h2") + u, c.hostStatus("h10") + u,
			c.factsKey("h2"), c.factsKey("h10"), c.factsKey("h1") + "/x", c.factsRoot(),
			c.memberKey("h2"), c.memberKey("h10"), c.membersRoot(),
			c.groupUnits("db") + u, c.groupHalts("db") + u, c.lockKey("groups/db", u, "h1"),
			c.lockKey("hosts/h2", u, "h1"),
			c.rolloutKey("db", id), c.rolloutKey("web2", id), c.admitKey("db", "h1", id), c.admitKey("web2", "h1", id),
			election("db"), election("web2"),
			c.prefix + "/other", c.mirrorStateKey("default"), c.ownerKey(Target{Host: "h1"}),
		}
		for _, k := range denied {
			if covers(perms, k, false) {
				t.Errorf("prefix %q: the agent may read %s", prefix, k)
			}
		}
		// Another host's progress is read (by a coordinator), never written.
		readOnly := []string{c.summaryKey("db", id), c.summaryKey("web2", id), c.groupUnits("web") + u, c.hostUnits("h1") + u, c.prefix + "/", c.progressKey("h2", id), c.progressKey("h10", id), c.holdKey("default")}
		for _, k := range append(denied, readOnly...) {
			if covers(perms, k, true) {
				t.Errorf("prefix %q: the agent may write %s", prefix, k)
			}
		}
	}
}

func TestAgentPermissionsRefusesBadNames(t *testing.T) {
	for _, tc := range []struct {
		host   string
		groups []string
	}{
		{"", []string{"all"}},
		{"h/1", []string{"all"}},
		{"h1", nil},
		{"h1", []string{"we b"}},
		{"h1", []string{".."}},
	} {
		if _, err := AgentPermissions("", tc.host, tc.groups); err == nil {
			t.Errorf("AgentPermissions(%q, %q) succeeded", tc.host, tc.groups)
		}
	}
}
