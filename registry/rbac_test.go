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
		const u = "app.service"
		reads := []string{
			c.prefix + "/", // Dial's probe
			c.hostUnits("h1") + u, c.hostUnits("h1") + u + ".d/x.conf",
			c.groupUnits("web") + u, c.groupUnits("all") + u,
			c.groupHalts("web") + u, c.groupHalts("all") + u,
			c.lockDir("groups/web", u) + "h2", c.lockDir("groups/all", u) + "h3",
			c.agentKey("h1"), c.hostStatus("h1") + u, c.factsKey("h1"),
			c.hostStatus("h1") + reconcile.PassKey, c.memberKey("h1"),
		}
		writes := []string{
			c.agentKey("h1"), c.hostStatus("h1") + u, c.factsKey("h1"),
			c.hostStatus("h1") + reconcile.PassKey, c.memberKey("h1"),
			c.haltKey("groups/web", u), c.haltKey("groups/all", "app@1.service"),
			c.lockKey("groups/web", u, "h1"), c.lockKey("groups/all", u, "h1"),
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
			c.prefix + "/other",
		}
		for _, k := range denied {
			if covers(perms, k, false) {
				t.Errorf("prefix %q: the agent may read %s", prefix, k)
			}
		}
		for _, k := range append(denied, c.groupUnits("web")+u, c.hostUnits("h1")+u, c.prefix+"/") {
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
