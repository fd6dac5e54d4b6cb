package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// A unit and its config file are one set: the file is written under the
// agent's --file-root with its mode and owner, its change restarts the unit
// only when RestartTriggers= names it (and costs no daemon-reload), a failed
// set is rolled back whole, and a refused file leaves nothing of its set on
// disk. All judged by systemd's view (MainPID, /proc/<pid>/environ, which
// the unit reads from the config file through EnvironmentFile=) and stat.
func TestConfigFileSet(t *testing.T) {
	t.Parallel() // waits on systemd, not the CPU
	e := newEnv(t)
	root := filepath.Join(e.h.Dir, "etc", "myapp")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) { o.fileRoots = []string{root} })
	env, notes := filepath.Join(root, "app.env"), filepath.Join(root, "notes.txt")
	unit := func(extra string) string {
		return "[Service]\nType=exec\nEnvironmentFile=" + env + "\n" + extra +
			"ExecStart=/bin/sh -c 'test \"$V\" != bad && exec /bin/sleep 1000'\n" +
			"[X-Agentd]\nHealthySec=1s\nRestartTriggers=" + env + "\n"
	}
	src := func(name, content string) string { return e.writeUnit("files/"+name, content) }
	put := func(unitContent string, files ...string) (string, int) {
		args := []string{"unit", "put", e.writeUnit("web.service", unitContent), "--host", e.host, "--wait", "--timeout", "30s"}
		for _, f := range files {
			args = append(args, "--file", f)
		}
		return e.cli(args...)
	}
	pid := func() uint32 { return e.h.MainPID(t, "web.service") }
	reloads := e.h.CountReloads(t)

	// 1. The set lands: mode and owner as asked, the unit reads the file.
	if out, code := put(unit(""), env+"="+src("v1.env", "V=1\n")+":0640:nobody:nogroup", notes+"="+src("n1", "one\n")); code != 0 {
		t.Fatalf("put the set: exit %d\n%s", code, out)
	}
	st, err := os.Stat(env)
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); st.Mode().Perm() != 0o640 || sys.Uid != 65534 || sys.Gid != 65534 {
		t.Errorf("%s: mode %v uid %d gid %d, want 0640 nobody:nogroup", env, st.Mode(), sys.Uid, sys.Gid)
	}
	if b, _ := os.ReadFile(notes); string(b) != "one\n" {
		t.Errorf("%s holds %q", notes, b)
	}
	pid1 := pid()
	if !environHas(pid1, "V=1") {
		t.Fatalf("web.service (MainPID %d) does not run V=1 from its config file", pid1)
	}

	// 2. The triggered file alone: a restart onto it, no daemon-reload.
	before := reloads()
	if out, code := put(unit(""), env+"="+src("v2.env", "V=2\n")+":0640:nobody:nogroup", notes+"="+src("n1", "one\n")); code != 0 {
		t.Fatalf("put V=2: exit %d\n%s", code, out)
	}
	pid2 := pid()
	if pid2 == pid1 || !environHas(pid2, "V=2") {
		t.Errorf("after the config file changed: MainPID %d → %d, V=2 in its environ: %v", pid1, pid2, environHas(pid2, "V=2"))
	}
	if n := reloads() - before; n != 0 {
		t.Errorf("a config file alone cost %d daemon-reloads, want 0", n)
	}

	// 3. A file no trigger names: written, the unit left alone.
	if out, code := put(unit(""), env+"="+src("v2.env", "V=2\n")+":0640:nobody:nogroup", notes+"="+src("n2", "two\n")); code != 0 {
		t.Fatalf("put notes: exit %d\n%s", code, out)
	}
	if b, _ := os.ReadFile(notes); string(b) != "two\n" || pid() != pid2 {
		t.Errorf("notes %q, MainPID %d → %d: want two and the same process", b, pid2, pid())
	}

	// A chmod or an edit by hand is drift: put back at once (the roots are
	// watched), and the unit restarted onto its own file again.
	if err := os.Chmod(notes, 0o600); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	eventually(t, "notes.txt back to 0644", func() bool {
		fi, err := os.Stat(notes)
		return err == nil && fi.Mode().Perm() == 0o644
	})
	t.Logf("a chmod by hand put back in %v", time.Since(began).Round(time.Millisecond))
	if err := os.WriteFile(notes, []byte("by hand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, "notes.txt holds two again", func() bool {
		b, _ := os.ReadFile(notes)
		return string(b) == "two\n"
	})
	if p := pid(); p != pid2 {
		t.Errorf("drift of an untriggered file restarted the unit: MainPID %d → %d", pid2, p)
	}

	// --dry-run predicts a trigger's restart and a file alone as such.
	for file, want := range map[string]string{
		env + "=" + src("v9.env", "V=9\n") + ":0640:nobody:nogroup": "restart",
		notes + "=" + src("n9", "nine\n"):                           reconcile.DoWrite,
	} {
		out, code := e.cli("unit", "put", e.writeUnit("web.service", unit("")), "--host", e.host, "--file", file, "--dry-run")
		if code != 0 || !regexp.MustCompile(`web\.service +`+want+` `).MatchString(out) {
			t.Errorf("put --dry-run --file %s: exit %d, want web.service %q\n%s", file, code, want, out)
		}
	}
	// ... and a file this host takes under none of its roots (its facts
	// publish them) as refused.
	elsewhere := filepath.Join(e.h.Dir, "elsewhere", "y.conf")
	out, code := e.cli("unit", "put", e.writeUnit("web.service", unit("")), "--host", e.host, "--file", elsewhere+"="+src("y", "y\n"), "--dry-run")
	if code != 0 || !regexp.MustCompile(`web\.service +blocked`).MatchString(out) || !strings.Contains(out, "outside every --file-root") {
		t.Errorf("put --dry-run --file %s: exit %d, want web.service blocked, outside every --file-root\n%s", elsewhere, code, out)
	}
	if b, _ := os.ReadFile(env); string(b) != "V=2\n" || pid() != pid2 {
		t.Errorf("a dry run changed something: %s holds %q, MainPID %d → %d", env, b, pid2, pid())
	}

	// 4. A set that fails (the new config makes the unit exit) is rolled
	// back whole: the unit file and the config file as they were, the unit
	// running the old set again.
	good, _ := os.ReadFile(filepath.Join(e.h.UnitDir, "web.service"))
	out, code = put(unit("Environment=W=3\n"), env+"="+src("bad.env", "V=bad\n")+":0640:nobody:nogroup")
	if code != 3 {
		t.Fatalf("put a failing set: exit %d, want 3\n%s", code, out)
	}
	eventually(t, "web.service runs the old set again", func() bool {
		return e.h.ActiveState(t, "web.service") == "active" && environHas(pid(), "V=2")
	})
	if b, _ := os.ReadFile(env); string(b) != "V=2\n" {
		t.Errorf("after the rollback %s holds %q, want V=2", env, b)
	}
	if b, _ := os.ReadFile(filepath.Join(e.h.UnitDir, "web.service")); string(b) != string(good) {
		t.Errorf("after the rollback the unit file is not the old one:\n%s", b)
	}

	// 5. Refused files: nothing of their set is written, the unit keeps
	// running. Outside every root, onto a symlink, an unknown owner.
	outside := filepath.Join(e.h.Dir, "elsewhere", "x.conf")
	target := filepath.Join(e.h.Dir, "target")
	if err := os.WriteFile(target, []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link.conf")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	goodSet := func() {
		t.Helper()
		if out, code := put(unit(""), env+"="+src("v2.env", "V=2\n")+":0640:nobody:nogroup"); code != 0 {
			t.Fatalf("put the good set back in the registry: exit %d\n%s", code, out)
		}
	}
	goodSet() // what the host runs: no job
	running := pid()
	handWritten := filepath.Join(root, "hand.conf")
	if err := os.WriteFile(handWritten, []byte("by hand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{
		{outside + "=" + src("x", "x\n"), "outside every --file-root"},
		{handWritten + "=" + src("h", "h\n"), "agentd did not write it"},
		{link + "=" + src("l", "l\n"), "symlink"},
		{filepath.Join(root, "o.conf") + "=" + src("o", "o\n") + ":0600:no-such-user:nogroup", "no-such-user"},
	} {
		out, code := put(unit("Environment=W=4\n"), tc.file)
		if code != 3 || !strings.Contains(out, tc.want) {
			t.Errorf("put --file %s: exit %d, want 3 naming %q\n%s", tc.file, code, tc.want, out)
		}
		if strings.Contains(out, "rolled back") {
			t.Errorf("put --file %s: a refusal after the rollback of other content reads as that rollback:\n%s", tc.file, out)
		}
		if b, _ := os.ReadFile(filepath.Join(e.h.UnitDir, "web.service")); string(b) != string(good) {
			t.Errorf("--file %s refused, yet the unit file of its set was written:\n%s", tc.file, b)
		}
		if p := pid(); p != running {
			t.Errorf("--file %s refused, yet web.service restarted (MainPID %d → %d)", tc.file, running, p)
		}
		// The good unit file back first (no --wait: its set still holds the
		// refused file, so the host applies nothing), then the refused
		// file's key out, then the good set confirmed: the other order
		// leaves, between the two commands, the refused put's unit file
		// (W=4) with nothing refused in its set, which the agent then
		// rightly applies (seen in CI: a restart, and one back).
		if out, code := e.cli("unit", "put", e.writeUnit("web.service", unit("")), "--host", e.host); code != 0 {
			t.Fatalf("put the good unit file back: exit %d\n%s", code, out)
		}
		dest, _, _ := strings.Cut(tc.file, "=")
		if out, code := e.cli("unit", "rm", reconcile.ConfigKey("web.service", dest), "--host", e.host); code != 0 {
			t.Fatalf("rm the refused file's key: exit %d\n%s", code, out)
		}
		goodSet()
	}
	if p := pid(); p != running {
		t.Errorf("web.service restarted while its good set was put back (MainPID %d → %d)", running, p)
	}
	if _, err := os.Lstat(outside); err == nil {
		t.Errorf("%s was written outside every root", outside)
	}
	if b, _ := os.ReadFile(target); string(b) != "mine\n" {
		t.Errorf("the symlink's target was written through: %q", b)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the symlink at %s was replaced: %v %v", link, fi.Mode(), err)
	}
	if _, err := os.Lstat(filepath.Join(root, "o.conf")); err == nil {
		t.Errorf("o.conf was written though its owner does not exist")
	}
	if b, _ := os.ReadFile(handWritten); string(b) != "by hand\n" {
		t.Errorf("a file agentd did not write was overwritten: %q", b)
	}

	// 6. History and revert take a config file's key like a unit's: after
	// V=3, the previous V=2 comes back and its trigger restarts the unit.
	if out, code := put(unit(""), env+"="+src("v3.env", "V=3\n")+":0640:nobody:nogroup"); code != 0 {
		t.Fatalf("put V=3: exit %d\n%s", code, out)
	}
	key := reconcile.ConfigKey("web.service", env)
	if out, code := e.cli("unit", "history", key, "--host", e.host); code != 0 || strings.Count(strings.TrimSpace(out), "\n") < 2 {
		t.Errorf("unit history %s: exit %d, want its versions\n%s", key, code, out)
	}
	was := pid()
	out, code = e.cli("unit", "revert", key, "--host", e.host, "--wait", "--timeout", "30s")
	if code != 0 {
		t.Fatalf("unit revert %s: exit %d\n%s", key, code, out)
	}
	if !strings.Contains(out, "note: hosts/h1/units/web.service was stored with it") {
		t.Errorf("the revert of one key of a set does not name the others stored with it:\n%s", out)
	}
	if b, _ := os.ReadFile(env); string(b) != "V=2\n" {
		t.Errorf("after the revert %s holds %q, want V=2", env, b)
	}
	if p := pid(); p == was || !environHas(p, "V=2") {
		t.Errorf("after the revert MainPID %d → %d, V=2 in its environ: %v", was, p, environHas(p, "V=2"))
	}
}

// Killed between writing a set's files and its daemon-reload: the whole set
// is on disk (unit file and config file), the old process still runs; the
// next agent reloads and restarts onto the whole new set.
func TestCrashBetweenSetWriteAndReload(t *testing.T) {
	buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()
	s := newCrashScene(t, "crash-set")
	root := filepath.Join(s.h.Dir, "etc")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	envFile := filepath.Join(root, "app.env")
	unit := func(u string) string {
		return "[Service]\nType=exec\nEnvironment=U=" + u + "\nEnvironmentFile=" + envFile + "\nExecStart=/bin/sleep 1000\n" +
			"[X-Agentd]\nHealthySec=0\nRestartTriggers=" + envFile + "\n"
	}
	set := func(v string) map[string]string {
		return map[string]string{changedUnit: unit(v),
			reconcile.ConfigKey(changedUnit, envFile): string(reconcile.ConfigFile{Mode: 0o600, Content: []byte("V=" + v + "\n")}.Encode())}
	}
	a1 := s.agent("--file-root", root)
	s.put(set("1"))
	waitFor(t, a1, 30*time.Second, "set 1 runs", func() bool { return s.converged(changedUnit, unit("1")) })
	pid1 := s.h.MainPID(t, changedUnit)
	a1.stop(t)

	a2 := s.agent("--file-root", root, "--test-pause-at", "files-written")
	s.put(set("2"))
	waitFor(t, a2, 30*time.Second, "the agent pauses at files-written", func() bool {
		_, err := os.Stat(filepath.Join(s.h.StateDir, "paused-at-files-written"))
		return err == nil
	})
	a2.kill()
	// The whole set on disk, nothing of it running yet.
	if b, _ := os.ReadFile(filepath.Join(s.h.UnitDir, changedUnit)); string(b) != unit("2") {
		t.Errorf("killed after the writes: the unit file is not set 2's:\n%s", b)
	}
	if b, _ := os.ReadFile(envFile); string(b) != "V=2\n" {
		t.Errorf("killed after the writes: %s holds %q, not set 2's", envFile, b)
	}
	if p := s.h.MainPID(t, changedUnit); p != pid1 || !environHas(p, "V=1") || !needDaemonReload(t, s.h, changedUnit) {
		t.Fatalf("killed before the daemon-reload, yet MainPID %d → %d or NeedDaemonReload=no", pid1, p)
	}

	a3 := s.agent("--file-root", root)
	var pid uint32
	waitFor(t, a3, 30*time.Second, "the unit runs set 2 whole (U=2 and V=2 in its environ)", func() bool {
		pid = s.h.MainPID(t, changedUnit)
		return !needDaemonReload(t, s.h, changedUnit) && environHas(pid, "U=2") && environHas(pid, "V=2")
	})
	waitFor(t, a3, 30*time.Second, "the agent reports set 2", func() bool { return s.converged(changedUnit, unit("2")) })
	if fi, err := os.Stat(envFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v %v, want mode 0600", envFile, fi.Mode(), err)
	}
}
