package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/rollout"
)

// rbacOut runs `agentd rbac args…` in-process.
func rbacOut(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	root := newRoot()
	root.SetArgs(append([]string{"rbac"}, args...))
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.ExecuteContext(context.Background())
	code := 0
	if err != nil {
		code = exitError
		var ce *codeError
		if errors.As(err, &ce) {
			code = ce.code
		}
		out.WriteString("error: " + err.Error() + "\n")
	}
	return out.String(), code
}

// commands is the output without comments and blank lines.
func commands(out string) []string {
	var cmds []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			cmds = append(cmds, l)
		}
	}
	return cmds
}

func TestRbacPrintsExactlyTheAgentsPermissions(t *testing.T) {
	out, code := rbacOut(t, "--host", "h1", "--group", "web", "--group", "db", "--password-file", "/root/h1 pw")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, out)
	}
	want := []string{
		"etcdctl role add agentd-host-h1",
		"etcdctl role grant-permission agentd-host-h1 read /agentd/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true read /agentd/hosts/h1/",
		"etcdctl role grant-permission agentd-host-h1 readwrite /agentd/agents/h1",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/status/h1/",
		"etcdctl role grant-permission agentd-host-h1 readwrite /agentd/members/h1",
		"etcdctl role grant-permission agentd-host-h1 readwrite /agentd/facts/h1",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/hosts/h1/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true read /agentd/rollouts/hosts/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true read /agentd/rollouts/summary/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true read /agentd/mirror/holds/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true read /agentd/selectors/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true read /agentd/groups/db/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/halts/groups/db/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/locks/groups/db/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/groups/db/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/admit/db/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/summary/db/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/coordinator/db/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true read /agentd/groups/web/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/halts/groups/web/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/locks/groups/web/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/groups/web/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/admit/web/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/summary/web/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/coordinator/web/",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true read /agentd/groups/sel-",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/halts/groups/sel-",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/locks/groups/sel-",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/groups/sel-",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/admit/sel-",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/summary/sel-",
		"etcdctl role grant-permission agentd-host-h1 --prefix=true readwrite /agentd/rollouts/coordinator/sel-",
		"etcdctl user add agentd-host-h1 --interactive=false < '/root/h1 pw'",
		"etcdctl user grant-role agentd-host-h1 agentd-host-h1",
	}
	if got := commands(out); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Defaults: group all, prefix /agentd, the password prompted for.
	out, _ = rbacOut(t, "--host", "h1")
	if !strings.Contains(out, "--prefix=true read /agentd/groups/all/\n") || !strings.Contains(out, "etcdctl user add agentd-host-h1\n") {
		t.Fatalf("defaults:\n%s", out)
	}
	out, _ = rbacOut(t, "--host", "h1", "--prefix", "/my agentd/", "--no-password")
	if !strings.Contains(out, "read '/my agentd/hosts/h1/'\n") || !strings.Contains(out, "etcdctl user add agentd-host-h1 --no-password\n") {
		t.Fatalf("--prefix with a space, --no-password:\n%s", out)
	}
	out, code = rbacOut(t, "--host", "h1", "--group", "web", "--json")
	var v struct {
		Role        string
		Permissions []struct {
			Key, Permission string
			Prefix          bool
		}
	}
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.Role != "agentd-host-h1" || len(v.Permissions) != 25 ||
		v.Permissions[2].Key != "/agentd/agents/h1" || v.Permissions[2].Permission != "readwrite" || v.Permissions[2].Prefix {
		t.Fatalf("--json: exit %d, %v\n%s", code, err, out)
	}
	for _, args := range [][]string{
		{},
		{"--host", "h/1"},
		{"--host", "h1", "--group", "a b"},
		{"--host", "h1", "--no-password", "--password-file", "x"},
		{"--host", "h1", "extra"},
	} {
		if out, code := rbacOut(t, args...); code != exitUsage {
			t.Errorf("rbac %v: exit %d, want %d\n%s", args, code, exitUsage, out)
		}
	}
}

// applyEtcdctl runs the etcdctl commands agentd rbac printed through
// clientv3's Auth API, one API call per command, as etcdctl itself would.
func applyEtcdctl(t *testing.T, cli *clientv3.Client, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, line := range commands(out) {
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != "etcdctl" {
			t.Fatalf("not an etcdctl command: %q", line)
		}
		var err error
		switch f[1] + " " + f[2] {
		case "role add":
			_, err = cli.RoleAdd(ctx, f[3])
		case "role grant-permission":
			prefix := false
			var args []string
			for _, a := range f[3:] {
				if a == "--prefix=true" {
					prefix = true
				} else {
					args = append(args, a)
				}
			}
			if len(args) != 3 {
				t.Fatalf("%q: want ROLE TYPE KEY", line)
			}
			perm := clientv3.PermissionType(map[string]authpb.Permission_Type{"read": clientv3.PermRead, "write": clientv3.PermWrite, "readwrite": clientv3.PermReadWrite}[args[1]])
			end := ""
			if prefix {
				end = clientv3.GetPrefixRangeEnd(args[2])
			}
			_, err = cli.RoleGrantPermission(ctx, args[0], args[2], end, perm)
		case "user add":
			// etcdctl user add NAME --interactive=false < FILE reads the
			// password from stdin.
			if len(f) != 7 || f[4] != "--interactive=false" || f[5] != "<" {
				t.Fatalf("%q: want user add NAME --interactive=false < FILE", line)
			}
			pw, rerr := os.ReadFile(f[6])
			if rerr != nil {
				t.Fatal(rerr)
			}
			_, err = cli.UserAdd(ctx, f[3], strings.TrimSpace(string(pw)))
		case "user grant-role":
			_, err = cli.UserGrantRole(ctx, f[3], f[4])
		default:
			t.Fatalf("unexpected command %q", line)
		}
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
	}
}

func isDenied(err error) bool {
	return errors.Is(err, rpctypes.ErrPermissionDenied) || err != nil && strings.Contains(err.Error(), "permission denied")
}

// Item 3: an agent runs under exactly the role `agentd rbac` prints, on an
// etcd with auth enabled: it applies its host's and its group's units,
// takes a MaxUnavailable slot, reports statuses, halts a rollout when a
// version fails, and leaves (revoking its lease). With the same
// credentials, nothing of another host or group can be written or read.
func TestAgentUnderLeastPrivilegeRole(t *testing.T) {
	t.Parallel() // waits on timers and HealthySec, not the CPU
	h := systemdtest.Start(t)
	etcd := registrytest.StartEtcd(t)
	ep := etcd.Endpoint()

	// As root: the role and user of host "a" (groups web), from the
	// printed commands; then auth on.
	pwFile := filepath.Join(t.TempDir(), "a.pw")
	if err := os.WriteFile(pwFile, []byte("secret-of-a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := rbacOut(t, "--host", "a", "--group", "web", "--password-file", pwFile)
	if code != 0 {
		t.Fatalf("agentd rbac: exit %d\n%s", code, out)
	}
	admin := registrytest.RawClient(t, ep)
	ctx := context.Background()
	if _, err := admin.UserAdd(ctx, "root", "root-pw"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	applyEtcdctl(t, admin, out)
	if _, err := admin.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Get(ctx, "/agentd/"); err == nil {
		t.Fatal("auth is not enabled: an anonymous read succeeded")
	}
	root := dialRegistry(t, []string{ep}, "root", "root-pw")

	e := &env{t: t, h: h, endpoint: ep, reg: root, host: "a", groups: []string{"web"}}
	e.startAgentOn([]string{ep}, func(o *runOptions) {
		o.etcd.user, o.etcd.password = registry.AgentRole("a"), "secret-of-a"
	})
	waitStatus := func(what, unit string, ok func(reconcile.Status) bool) reconcile.Status {
		t.Helper()
		var s reconcile.Status
		eventually(t, what, func() bool {
			st, err := root.Statuses(ctx, "a")
			s = st[unit]
			return err == nil && ok(s)
		})
		return s
	}

	// A unit root puts for host a is applied, and its status appears.
	if _, err := root.Put(ctx, registry.Target{Host: "a"}, map[string][]byte{"hello.service": []byte(helloV1)}); err != nil {
		t.Fatal(err)
	}
	waitStatus("hello.service runs on a", "hello.service", func(s reconcile.Status) bool {
		return s.Hash == reconcile.Hash([]byte(helloV1)) && s.ActiveState == "active"
	})
	// A group unit with MaxUnavailable=1: a change takes a slot (locks/).
	app := func(exec, policy string) []byte {
		return []byte("[Service]\nType=exec\nExecStart=" + exec + "\n[X-Agentd]\nMaxUnavailable=1\n" + policy + "\n")
	}
	for _, v := range [][]byte{app("/bin/sleep 1000", "HealthySec=0"), app("/bin/sleep 1001", "HealthySec=0")} {
		if _, err := root.Put(ctx, registry.Target{Group: "web"}, map[string][]byte{"app.service": v}); err != nil {
			t.Fatal(err)
		}
		waitStatus("app.service runs the group's version on a", "app.service", func(s reconcile.Status) bool {
			return s.Hash == reconcile.Hash(v) && s.ActiveState == "active" && !s.Verifying
		})
	}
	if p := e.h.MainPID(t, "app.service"); p == 0 {
		t.Fatal("app.service not running")
	}
	// Its facts, for previews (facts/a).
	eventually(t, "a publishes its facts", func() bool {
		f, err := root.Facts(ctx, "a")
		return err == nil && f != nil
	})
	// A version that fails is rolled back and halts the group (halts/).
	bad := app("/bin/sh -c 'sleep 0.2; exit 3'", "HealthySec=1")
	if _, err := root.Put(ctx, registry.Target{Group: "web"}, map[string][]byte{"app.service": bad}); err != nil {
		t.Fatal(err)
	}
	waitStatus("a rolled the failing version back", "app.service", func(s reconcile.Status) bool { return s.Action == "rolled-back" })
	halts, err := root.Halts(ctx, "groups/web")
	if err != nil || len(halts) != 1 || halts[0].Host != "a" || halts[0].Hash != reconcile.Hash(bad) {
		t.Fatalf("halts of groups/web = %+v, %v; want the one a recorded", halts, err)
	}

	// A rollout to the group, coordinated by a (the group's only agent)
	// on its own rights: the election, every host's progress read, its
	// admission, summary and end written, its own progress.
	roll := []byte("[Service]\nType=exec\nExecStart=/bin/sleep 1002\n[X-Agentd]\nHealthySec=0\n")
	s := rollout.Strategy{Canary: rollout.Count{N: 1}, MaxRestarts: -1}
	rec := &rollout.Record{ID: registry.NewRolloutID(time.Now()), Strategy: s, Hosts: []string{"a"}, WaveEnds: s.WaveEnds(1), By: "test"}
	if _, err := root.Put(ctx, registry.Target{Group: "web"}, map[string][]byte{"roll.service": roll}, registry.WithRollout(rec, false)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a rollout coordinated by a under its role ends done", func() bool {
		v, err := root.Rollout(ctx, rec.ID, false)
		return err == nil && v.Record.End != nil && v.Record.End.State == rollout.Done && v.Coordinator == "a" && v.Count(rollout.HostHealthy) == 1
	})
	waitStatus("a runs the rollout's unit", "roll.service", func(s reconcile.Status) bool {
		return s.Hash == reconcile.Hash(roll) && s.ActiveState == "active"
	})

	// Host a's credentials, as a stolen copy would use them.
	stolen := registrytest.RawClientConfig(t, clientv3.Config{Endpoints: []string{ep}, Username: registry.AgentRole("a"), Password: "secret-of-a"})
	if r, err := stolen.Get(ctx, "/agentd/hosts/a/units/hello.service"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("a cannot read its own unit: %v", err)
	}
	for _, k := range []string{
		"/agentd/hosts/b/units/x.service", // another host's units
		"/agentd/status/b/x.service",      // another host's status
		"/agentd/agents/b",                // another host's membership
		"/agentd/agents/ab",               // a name that extends its own
		"/agentd/status/ab/x.service",
		"/agentd/facts/b", // another host's facts
		"/agentd/facts/ab",
		"/agentd/hosts/a/units/x.service", // its own units: read only
		"/agentd/groups/web/units/x.service",
		"/agentd/groups/db/units/x.service",
		"/agentd/halts/groups/db/x.service", // another group's halts and slots
		"/agentd/locks/groups/db/x.service/a",
		"/agentd/rollouts/hosts/b/r1",          // another host's rollout progress
		"/agentd/rollouts/admit/db/b/r1",       // another group's admissions
		"/agentd/rollouts/coordinator/db/1234", // another group's election
		"/agentd/other",
	} {
		if _, err := stolen.Put(ctx, k, "[Service]\nExecStart=/bin/sh -c 'id > /tmp/pwned'\n"); !isDenied(err) {
			t.Errorf("host a's credentials: put %s: %v, want permission denied", k, err)
		}
	}
	if _, err := stolen.Delete(ctx, "/agentd/status/b/", clientv3.WithPrefix()); !isDenied(err) {
		t.Errorf("host a's credentials: delete status/b/: %v, want permission denied", err)
	}
	for _, k := range []string{"/agentd/hosts/b/", "/agentd/groups/db/", "/agentd/status/", "/agentd/agents/", "/agentd/halts/"} {
		if _, err := stolen.Get(ctx, k, clientv3.WithPrefix()); !isDenied(err) {
			t.Errorf("host a's credentials: get %s*: %v, want permission denied", k, err)
		}
	}

	// The FleetLock server runs on the agent's own rights: a reboot's slots
	// in its groups (taken, renewed, given back, the lease revoked), none in
	// another group.
	asA := dialRegistry(t, []string{ep}, registry.AgentRole("a"), "secret-of-a")
	eventually(t, "a takes a reboot's slots in web with its own credentials", func() bool {
		return asA.LockReboot(ctx, "web", "node-1", nil, time.Minute) == nil // once a gave app.service's slot back
	})
	if err := asA.LockReboot(ctx, "web", "node-1", nil, time.Minute); err != nil {
		t.Errorf("a renews a reboot's slots in web: %v", err)
	}
	if n, err := asA.UnlockReboot(ctx, "web", "node-1"); err != nil || n != 2 {
		t.Errorf("a gives a reboot's slots in web back: %d keys, %v; want 2 (app.service, reboot)", n, err)
	}
	if err := asA.LockReboot(ctx, "db", "node-1", nil, time.Minute); !isDenied(err) {
		t.Errorf("a takes a reboot's slots in db: %v, want permission denied", err)
	}

	// Leaving revokes the lease (etcd lets only a user who may write every
	// key bound to it): membership and statuses go at once, not after the TTL.
	e.agent.stop(t)
	if ms, err := root.Members(ctx); err != nil || len(ms) != 0 {
		t.Fatalf("members after a left: %+v, %v", ms, err)
	}
	if st, err := root.Statuses(ctx, "a"); err != nil || len(st) != 0 {
		t.Fatalf("statuses after a left: %d, %v", len(st), err)
	}
	if f, err := root.Facts(ctx, "a"); err != nil || f != nil {
		t.Fatalf("facts after a left: %+v, %v", f, err)
	}
}
