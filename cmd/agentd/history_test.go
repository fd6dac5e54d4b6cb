package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// newRegistryEnv is an env with an etcd and no systemd: for the registry
// commands alone.
func newRegistryEnv(t *testing.T) *env {
	t.Helper()
	e := registrytest.StartEtcd(t)
	return &env{t: t, endpoint: e.Endpoint(), reg: registrytest.NewClient(t, e.Endpoint()), host: "h1"}
}

// putFile stores content as name on e.host without --wait.
func (e *env) putFile(name, content string, extra ...string) int64 {
	e.t.Helper()
	dir := e.t.TempDir()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
	out, code := e.cli(append([]string{"unit", "put", p, "--host", e.host, "--json"}, extra...)...)
	var ev struct{ Revision int64 }
	if code != 0 || json.Unmarshal([]byte(out), &ev) != nil || ev.Revision == 0 {
		e.t.Fatalf("unit put %s: exit %d\n%s", name, code, out)
	}
	return ev.Revision
}

type historyJSON struct {
	Key         string
	Exists      bool
	ModRevision int64
	Versions    []struct {
		Revision int64
		Time     time.Time
		Hash     string
		Size     int
		User     string
		Removed  bool
		Current  bool
	}
}

func (e *env) history(unit string) historyJSON {
	e.t.Helper()
	out, code := e.cli("unit", "history", unit, "--host", e.host, "--json")
	var h historyJSON
	if code != 0 {
		e.t.Fatalf("unit history: exit %d\n%s", code, out)
	}
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		e.t.Fatalf("unit history --json: %v\n%s", err, out)
	}
	return h
}

func (h historyJSON) revisions() []int64 {
	var out []int64
	for _, v := range h.Versions {
		out = append(out, v.Revision)
	}
	return out
}

const (
	hv1 = "[Service]\nExecStart=/bin/true\n"
	hv2 = "[Service]\nExecStart=/bin/true 2\n"
	hv3 = "[Service]\nExecStart=/bin/true 333\n"
)

func TestUnitHistoryListsVersions(t *testing.T) {
	t.Parallel()
	e := newRegistryEnv(t)
	who := storedBy()
	if !strings.Contains(who, "@") || strings.HasPrefix(who, "@") {
		t.Fatalf("storedBy() = %q", who)
	}
	r1 := e.putFile("a.service", hv1)
	r2 := e.putFile("a.service", hv2)
	out, code := e.cli("unit", "rm", "a.service", "--host", e.host, "--json")
	var rm struct{ Revision int64 }
	if code != 0 || json.Unmarshal([]byte(out), &rm) != nil {
		t.Fatalf("unit rm: %d %s", code, out)
	}
	r4 := e.putFile("a.service", hv3)

	h := e.history("a.service")
	if got := fmt.Sprint(h.revisions()); got != fmt.Sprint([]int64{r1, r2, rm.Revision, r4}) {
		t.Fatalf("revisions %s, want %v", got, []int64{r1, r2, rm.Revision, r4})
	}
	for i, v := range h.Versions {
		if v.User != who || v.Time.IsZero() || time.Since(v.Time) > time.Minute {
			t.Errorf("version %d: user %q time %v, want %q now", i, v.User, v.Time, who)
		}
		if v.Current != (i == 3) {
			t.Errorf("version %d: current %v", i, v.Current)
		}
	}
	if v := h.Versions; v[0].Size != len(hv1) || v[1].Size != len(hv2) || !v[2].Removed || v[2].Size != 0 || v[3].Size != len(hv3) || v[3].Hash == v[1].Hash {
		t.Errorf("versions %+v", h.Versions)
	}
	if !h.Exists || h.ModRevision != r4 || h.Key != "hosts/h1/units/a.service" {
		t.Errorf("history = %+v", h)
	}

	out, code = e.cli("unit", "history", "a.service", "--host", e.host)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 5 || !strings.HasPrefix(lines[0], "REVISION") {
		t.Fatalf("unit history: %d\n%s", code, out)
	}
	for i, want := range []string{strconv.Itoa(len(hv1)), strconv.Itoa(len(hv2)), "(removed)", strconv.Itoa(len(hv3))} {
		if l := lines[i+1]; !strings.Contains(l, " "+want+" ") || !strings.Contains(l, who) {
			t.Errorf("line %q: want %q and %q", l, want, who)
		}
	}
	if !strings.HasSuffix(lines[4], "current") {
		t.Errorf("last line %q not marked current", lines[4])
	}

	// Errors and the empty case.
	if out, code := e.cli("unit", "history", "nope.service", "--host", e.host); code != 0 || !strings.Contains(out, "no history kept") {
		t.Errorf("history of an unknown key: %d %s", code, out)
	}
	if _, code := e.cli("unit", "history", "a.service"); code != exitUsage {
		t.Errorf("history without a target: exit %d, want %d", code, exitUsage)
	}
	if _, code := e.cli("unit", "history", "../a.service", "--host", e.host); code != exitUsage {
		t.Errorf("history of a bad key: exit %d, want %d", code, exitUsage)
	}
}

func TestUnitHistoryKeep(t *testing.T) {
	t.Parallel()
	e := newRegistryEnv(t)
	var revs []int64
	for i := range 12 {
		revs = append(revs, e.putFile("a.service", fmt.Sprintf("[Service]\nExecStart=/bin/true %d\n", i)))
	}
	if got := e.history("a.service").revisions(); fmt.Sprint(got) != fmt.Sprint(revs[2:]) {
		t.Fatalf("default --keep 10: %v, want %v", got, revs[2:])
	}
	revs = append(revs, e.putFile("a.service", hv1, "--keep", "3"))
	if got := e.history("a.service").revisions(); fmt.Sprint(got) != fmt.Sprint(revs[10:]) {
		t.Fatalf("--keep 3: %v, want %v", got, revs[10:])
	}
	if out, code := e.cli("unit", "rm", "a.service", "--host", e.host, "--keep", "2"); code != 0 {
		t.Fatalf("rm --keep 2: %d %s", code, out)
	}
	if h := e.history("a.service"); len(h.Versions) != 2 || !h.Versions[1].Removed || h.Versions[0].Revision != revs[12] {
		t.Fatalf("rm --keep 2: %+v", h.Versions)
	}
	if out, code := e.cli("unit", "put", "x.service", "--host", e.host, "--keep", "0"); code != exitUsage {
		t.Fatalf("--keep 0: exit %d, want %d\n%s", code, exitUsage, out)
	}
}

func TestUnitRevert(t *testing.T) {
	t.Parallel()
	e := newRegistryEnv(t)
	cat := func() string {
		out, code := e.cli("unit", "cat", "a.service", "--host", e.host)
		if code != 0 {
			return "(absent)"
		}
		return out
	}
	if out, code := e.cli("unit", "revert", "a.service", "--host", e.host); code != exitError || !strings.Contains(out, "no history kept") {
		t.Fatalf("revert with no history: exit %d, want %d\n%s", code, exitError, out)
	}
	r1 := e.putFile("a.service", hv1)
	if out, code := e.cli("unit", "revert", "a.service", "--host", e.host); code != exitError || !strings.Contains(out, "no version before the current one") {
		t.Fatalf("revert with one version: exit %d\n%s", code, out)
	}
	r2 := e.putFile("a.service", hv2)
	e.putFile("a.service", hv3)

	// To the previous version: a new version with hv2's content.
	out, code := e.cli("unit", "revert", "a.service", "--host", e.host)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("to revision %d", r2)) || cat() != hv2 {
		t.Fatalf("revert: exit %d, content %q\n%s", code, cat(), out)
	}
	h := e.history("a.service")
	if n := len(h.Versions); n != 4 || h.Versions[3].Hash != h.Versions[1].Hash || !h.Versions[3].Current || h.Versions[3].User != storedBy() {
		t.Fatalf("history after revert: %+v", h.Versions)
	}
	// Reverting again goes back one more: the previous of the revert is hv3.
	if out, code := e.cli("unit", "revert", "a.service", "--host", e.host); code != 0 || cat() != hv3 {
		t.Fatalf("second revert: %d %q\n%s", code, cat(), out)
	}

	// --to a named revision.
	if out, code := e.cli("unit", "revert", "a.service", "--host", e.host, "--to", strconv.FormatInt(r1, 10), "--json"); code != 0 || cat() != hv1 || !strings.Contains(out, `"event":"reverted"`) {
		t.Fatalf("revert --to %d: %d %q\n%s", r1, code, cat(), out)
	}
	n := len(e.history("a.service").Versions)

	// --to the revision whose content is current: a no-op.
	out, code = e.cli("unit", "revert", "a.service", "--host", e.host, "--to", strconv.FormatInt(r1, 10))
	if code != 0 || !strings.Contains(out, "nothing stored") {
		t.Fatalf("revert to the current content: exit %d\n%s", code, out)
	}
	if got := len(e.history("a.service").Versions); got != n {
		t.Fatalf("a no-op revert stored a version: %d → %d", n, got)
	}

	// An unknown revision.
	out, code = e.cli("unit", "revert", "a.service", "--host", e.host, "--to", "99999")
	if code != exitError || !strings.Contains(out, "no kept version at revision 99999") || !strings.Contains(out, "kept: "+strconv.FormatInt(r1, 10)) {
		t.Fatalf("revert --to an unknown revision: exit %d\n%s", code, out)
	}
	if _, code := e.cli("unit", "revert", "a.service", "--host", e.host, "--to", "x"); code != exitUsage {
		t.Fatalf("--to x: exit %d", code)
	}
	if _, code := e.cli("unit", "revert", "a.service", "--host", e.host, "--to", "0"); code != exitUsage {
		t.Fatalf("--to 0: exit %d", code)
	}
	if got := len(e.history("a.service").Versions); got != n || cat() != hv1 {
		t.Fatalf("an error stored something: %d versions, content %q", got, cat())
	}

	// Undo a removal, then revert to the removal.
	if out, code := e.cli("unit", "rm", "a.service", "--host", e.host); code != 0 {
		t.Fatalf("rm: %s", out)
	}
	if out, code := e.cli("unit", "revert", "a.service", "--host", e.host); code != 0 || cat() != hv1 {
		t.Fatalf("revert of a removal: %d %q\n%s", code, cat(), out)
	}
	if out, code := e.cli("unit", "revert", "a.service", "--host", e.host); code != 0 || cat() != "(absent)" || !strings.Contains(out, "a removal") {
		t.Fatalf("revert to a removal: %d %q\n%s", code, cat(), out)
	}
}

// The history is made of live keys: compaction leaves it, and revert works
// from it.
func TestUnitHistorySurvivesCompaction(t *testing.T) {
	t.Parallel()
	e := newRegistryEnv(t)
	r1 := e.putFile("a.service", hv1)
	r2 := e.putFile("a.service", hv2)
	r3 := e.putFile("b.service", hv3)
	raw := registrytest.RawClient(t, e.endpoint)
	if _, err := raw.Compact(t.Context(), r3, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Get(t.Context(), "/agentd/hosts/h1/units/a.service", clientv3.WithRev(r1)); err == nil {
		t.Fatal("etcd still serves revision r1 after compaction")
	}
	if got := e.history("a.service").revisions(); fmt.Sprint(got) != fmt.Sprint([]int64{r1, r2}) {
		t.Fatalf("history after compaction: %v, want [%d %d]", got, r1, r2)
	}
	out, code := e.cli("unit", "revert", "a.service", "--host", e.host, "--to", strconv.FormatInt(r1, 10))
	if code != 0 {
		t.Fatalf("revert after compaction: %d\n%s", code, out)
	}
	if b, err := e.reg.Get(t.Context(), registry.Target{Host: e.host}, "a.service"); err != nil || string(b) != hv1 {
		t.Fatalf("content after revert: %q, %v", b, err)
	}
	if got := len(e.history("a.service").Versions); got != 3 {
		t.Fatalf("versions after revert: %d", got)
	}
}

// revert --wait restarts the unit in place onto the old content.
func TestRevertWaitRestartsOntoOldContent(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	e.startAgent()
	unit := func(v string) string {
		return "[Service]\nType=exec\nEnvironment=AGENTD_TEST_VERSION=" + v + "\nExecStart=/bin/sleep 1003\n" + fast
	}
	e.put("env.service", unit("old"))
	e.put("env.service", unit("new"))
	pid := e.h.MainPID(t, "env.service")
	if env := procEnviron(t, pid); !strings.Contains(env, "AGENTD_TEST_VERSION=new") {
		t.Fatalf("before revert: environ of %d lacks the new version: %q", pid, env)
	}
	out, code := e.cli("unit", "revert", "env.service", "--host", e.host, "--wait", "--timeout", "30s")
	if code != 0 {
		t.Fatalf("revert --wait: exit %d\n%s\n%s", code, out, e.h.Log())
	}
	if got, _ := e.readLocal("env.service"); got != unit("old") {
		t.Fatalf("file on disk after revert: %q", got)
	}
	pid2 := e.h.MainPID(t, "env.service")
	if pid2 == 0 || pid2 == pid {
		t.Fatalf("MainPID %d → %d: not restarted", pid, pid2)
	}
	if env := procEnviron(t, pid2); !strings.Contains(env, "AGENTD_TEST_VERSION=old") {
		t.Fatalf("after revert: environ of %d lacks the old version: %q", pid2, env)
	}
	if s, _ := e.status("env.service"); s.Action != "restart" || s.Hash != s.DesiredHash {
		t.Fatalf("status = %+v", s)
	}
}

func procEnviron(t *testing.T, pid uint32) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(b), "\x00", "\n")
}
