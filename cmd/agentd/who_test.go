package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// Who and why (issue 26, item 5): every write records who stored it
// (user@host), the etcd user it ran as (with etcd's authentication on)
// and --reason; `unit history` shows them.

// authEtcd is a real etcd with authentication on: root, and alice, whose
// role may read and write the default prefix. It returns alice's flags.
func authEtcd(t *testing.T) (endpoint string, alice []string) {
	t.Helper()
	e := registrytest.StartEtcd(t)
	cli := registrytest.RawClient(t, e.Endpoint())
	ctx, p := t.Context(), registry.DefaultPrefix+"/"
	for _, step := range []func() error{
		func() error { _, err := cli.RoleAdd(ctx, "root"); return err },
		func() error { _, err := cli.UserAdd(ctx, "root", "r00t"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "operator"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "operator", p, clientv3.GetPrefixRangeEnd(p), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, "alice", "a11ce"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "alice", "operator"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("a11ce\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return e.Endpoint(), []string{"--etcd-user", "alice", "--etcd-password-file", pw}
}

type whoJSON struct {
	Versions []struct {
		Revision int64
		User     string
		EtcdUser string
		Reason   string
		Signer   *string
		Removed  bool
		Current  bool
	}
}

// put, rm, revert and edit, as alice with --reason: each version says
// user@host, "alice" and its reason, in the table and in --json; a write
// without --reason has none. A bad --reason is refused (exit 2) by each
// command before anything is stored, and before the editor runs.
func TestHistoryShowsWhoAndWhy(t *testing.T) { // not parallel: $EDITOR
	endpoint, alice := authEtcd(t)
	e := &env{t: t, endpoint: endpoint, host: "h1"}
	as := func(args ...string) (string, int) {
		t.Helper()
		return e.cli(append(args, alice...)...)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "a.service")
	steps := []struct {
		content string // written to file first, when set
		args    []string
		reason  string
	}{
		{hv1, []string{"unit", "put", file, "--host", "h1", "--reason", "  OPS-1: first version  "}, "OPS-1: first version"},
		{hv2, []string{"unit", "put", file, "--host", "h1", "--reason", "OPS-2: the new port, see https://wiki/ports"}, "OPS-2: the new port, see https://wiki/ports"},
		{"", []string{"unit", "rm", "a.service", "--host", "h1", "--reason", "retire it"}, "retire it"},
		{"", []string{"unit", "revert", "a.service", "--host", "h1", "--reason", "bring it back (café ☕)"}, "bring it back (café ☕)"},
		{"", []string{"unit", "edit", "a.service", "--host", "h1", "--yes", "--no-wait", "--reason", "edited by hand"}, "edited by hand"},
		{hv3, []string{"unit", "put", file, "--host", "h1"}, ""},
	}
	t.Setenv("VISUAL", "")
	t.Setenv("TMPDIR", t.TempDir())
	t.Setenv("EDITOR", editorScript(t, dir, `sed -i 's/true 2/true 22/' "$1"`))
	for _, s := range steps {
		if s.content != "" {
			if err := os.WriteFile(file, []byte(s.content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if out, code := as(s.args...); code != 0 || strings.Contains(out, "nothing stored") {
			t.Fatalf("agentd %s: exit %d\n%s", strings.Join(s.args, " "), code, out)
		}
	}

	out, code := as("unit", "history", "a.service", "--host", "h1", "--json")
	var h whoJSON
	if code != 0 || json.Unmarshal([]byte(out), &h) != nil || len(h.Versions) != len(steps) {
		t.Fatalf("unit history --json: exit %d\n%s", code, out)
	}
	for i, v := range h.Versions {
		if v.User != storedBy() || v.EtcdUser != "alice" || v.Reason != steps[i].reason || v.Signer != nil {
			t.Errorf("version %d (%s): user %q, etcd user %q, reason %q, signer %v; want %q, alice, %q, none",
				i, steps[i].args[1], v.User, v.EtcdUser, v.Reason, v.Signer, storedBy(), steps[i].reason)
		}
	}
	if !h.Versions[2].Removed || !h.Versions[5].Current {
		t.Errorf("versions %+v", h.Versions)
	}
	if !strings.Contains(out, `"etcdUser": "alice"`) || !strings.Contains(out, `"reason": ""`) {
		t.Errorf("--json does not spell etcdUser and reason so:\n%s", out)
	}

	out, code = as("unit", "history", "a.service", "--host", "h1")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != len(steps)+1 {
		t.Fatalf("unit history: exit %d\n%s", code, out)
	}
	if f := strings.Fields(lines[0]); strings.Join(f, " ") != "REVISION TIME HASH SIZE USER ETCD USER REASON" {
		t.Errorf("header %q", lines[0])
	}
	for i, s := range steps {
		l, reason := lines[i+1], s.reason
		if reason == "" {
			reason = "-"
		}
		if !strings.Contains(l, storedBy()+"  ") || !strings.Contains(l, " alice ") || !strings.Contains(l, "  "+reason) {
			t.Errorf("line %q: want %s, alice and %q", l, storedBy(), reason)
		}
	}
	if !strings.HasSuffix(lines[len(lines)-1], "current") {
		t.Errorf("last line %q not marked current", lines[len(lines)-1])
	}

	// Bad reasons: exit 2, nothing stored; the editor never runs.
	t.Setenv("EDITOR", editorScript(t, dir, `touch "`+filepath.Join(dir, "editor-ran")+`"; sed -i 's/true 333/true 4/' "$1"`))
	if err := os.WriteFile(file, []byte(hv1), 0o644); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", registry.MaxReasonBytes+1)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"unit", "put", file, "--host", "h1", "--reason", "two\nlines"}, "control character (U+000A)"},
		{[]string{"unit", "put", file, "--host", "h1", "--reason", "colour \x1b[31mred"}, "control character (U+001B)"},
		{[]string{"unit", "put", file, "--host", "h1", "--dry-run", "--reason", "\xffbad"}, "not valid UTF-8"},
		{[]string{"unit", "rm", "a.service", "--host", "h1", "--reason", long}, "1025 bytes long, more than 1024"},
		{[]string{"unit", "revert", "a.service", "--host", "h1", "--reason", "tab\there"}, "control character (U+0009)"},
		{[]string{"unit", "edit", "a.service", "--host", "h1", "--yes", "--no-wait", "--reason", "nul\x00"}, "control character (U+0000)"},
	} {
		out, code := as(c.args...)
		if code != exitUsage || !strings.Contains(out, "--reason: invalid: reason") || !strings.Contains(out, c.want) || !strings.Contains(out, "nothing stored") {
			t.Errorf("agentd %q: exit %d, want %d saying %q", c.args, code, exitUsage, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "editor-ran")); err == nil {
		t.Error("unit edit ran the editor with a bad --reason")
	}
	out, _ = as("unit", "history", "a.service", "--host", "h1", "--json")
	var after whoJSON
	if json.Unmarshal([]byte(out), &after) != nil || len(after.Versions) != len(steps) {
		t.Errorf("a refused write stored a version:\n%s", out)
	}
}

// A signed version (the signature work sets SignedBy) shows a SIGNER
// column, "-" for the unsigned ones; without any, no column.
func TestHistoryShowsTheSigner(t *testing.T) {
	t.Parallel()
	e := newRegistryEnv(t)
	e.putFile("a.service", hv1, "--reason", "unsigned")
	if _, err := e.reg.Put(t.Context(), registry.Target{Host: "h1"}, map[string][]byte{"a.service": []byte(hv2)},
		registry.StoredBy("ci@build"), registry.SignedBy("release@example.com"), registry.WithReason("signed")); err != nil {
		t.Fatal(err)
	}
	out, code := e.cli("unit", "history", "a.service", "--host", "h1")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "REVISION TIME HASH SIZE USER ETCD USER SIGNER REASON" {
		t.Fatalf("unit history: exit %d\n%s", code, out)
	}
	if !strings.Contains(lines[1], " -  ") || !strings.Contains(lines[1], "unsigned") ||
		!strings.Contains(lines[2], "ci@build") || !strings.Contains(lines[2], "release@example.com  signed") {
		t.Errorf("unit history:\n%s", out)
	}
	h := e.history("a.service")
	if len(h.Versions) != 2 {
		t.Fatalf("%+v", h)
	}
	out, _ = e.cli("unit", "history", "a.service", "--host", "h1", "--json")
	if strings.Count(out, `"signer"`) != 1 || !strings.Contains(out, `"signer": "release@example.com"`) {
		t.Errorf("--json: want a signer on the signed version only:\n%s", out)
	}
}

// --reason is one flag with one meaning on put: with a rollout it goes in
// the rollout's record and in the history of every key, without one in
// the history (before, it was refused without a rollout).
func TestRolloutReasonIsInTheHistoryToo(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t, "h1", "h2")
	v1 := e.unit(t, "hello.service", "/bin/true")
	if _, _, code := e.run(t, "unit", "put", v1, "--group", "web", "--reason", "plain group put"); code != 0 {
		t.Fatalf("group put with --reason, no rollout: exit %d", code)
	}
	v2 := e.unit(t, "hello.service", "/bin/sleep 1")
	out, _, code := e.run(t, "unit", "put", v2, "--group", "web", "--canary", "1", "--reason", "OPS-9 new TLS config")
	if code != 0 {
		t.Fatalf("rollout put: exit %d", code)
	}
	if r := e.view(t, rolloutID(t, out)).Record; r.Reason != "OPS-9 new TLS config" || r.By != storedBy() {
		t.Errorf("rollout record: by %q, reason %q", r.By, r.Reason)
	}
	h, err := e.reg.History(t.Context(), registry.Target{Group: "web"}, "hello.service")
	if err != nil || len(h.Versions) != 2 || h.Versions[0].Reason != "plain group put" || h.Versions[1].Reason != "OPS-9 new TLS config" {
		t.Fatalf("history %+v %v", h.Versions, err)
	}
}
