package main

import (
	"strings"
	"testing"
)

// A host that has not joined yet is waited for quietly (the first line of
// `make demo` once said "no live agent — never seen" of a host whose agent
// was starting), and a group's --dry-run names the members whose agent is
// down instead of leaving them out.
func TestWaitForAHostThatHasNotJoinedAndPreviewADownMember(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2, "")
	f.put(f.unit("/bin/sleep 1001", "HealthySec=0"), 0)
	e, h2 := f.hosts[0], f.hosts[1]
	h2.agent.stop(t)

	out, code := e.cli("unit", "put", e.writeUnit("app.service", f.unit("/bin/sleep 1002", "HealthySec=0")), "--group", "web", "--dry-run")
	if code != 0 || !regexpLine(out, `h1\s+app.service\s+restart`) || !regexpLine(out, `h2\s+app.service\s+no live agent\s+down \(last seen .* ago\)`) {
		t.Errorf("group --dry-run with h2 down: exit %d, want h1 restarting and h2 named as down\n%s", code, out)
	}

	out, code = e.cli("unit", "put", e.writeUnit("app.service", f.unit("/bin/sleep 1003", "HealthySec=0")), "--host", "newcomer", "--wait", "--timeout", "2s")
	if code != exitTimeout || !strings.Contains(out, "newcomer app.service: waiting for newcomer to join\n") ||
		!strings.Contains(out, "newcomer app.service (newcomer has not joined") || strings.Contains(out, "no live agent") {
		t.Errorf("put --wait to a host that never joined: exit %d, want %d, waiting quietly for it to join\n%s", code, exitTimeout, out)
	}
}
