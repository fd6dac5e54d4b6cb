package pkgdeb

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/systemdtest"
)

// helloUnit is the unit put through the installed agent. It verifies its
// health for 1 s instead of the default 5 s.
const helloUnit = "[Unit]\nDescription=hello\n[Service]\nType=exec\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n[X-Agentd]\nHealthySec=1\n"

// The package, installed and used as an operator would, in a booted
// container with systemd as PID 1 that is a copy-on-write clone of this
// Debian machine (systemdtest.BootDebian: the host's dpkg database, apt,
// man-db; nothing reaches the host):
//
//  1. apt install ./agentd_*.deb (README's command): daemon-reload,
//     agentd enabled but not started;
//  2. dpkg -P, then dpkg -i on a machine whose PID 1 is not systemd (the
//     container's /run/systemd hidden for the install): it says so,
//     enables agentd and succeeds;
//  3. systemctl enable --now agentd; agentd --version; agentd unit put
//     --wait hello.service: it runs; journalctl -u agentd shows the agent
//     starting it; man agentd; the bash completion completes; dpkg -i
//     again (an upgrade): the agent restarts, hello.service does not;
//  4. dpkg -r agentd: the agent stops and is gone, hello.service keeps
//     running (same PID), /var/lib/agentd and /etc/default/agentd stay;
//  5. dpkg -P agentd (purge): /var/lib/agentd, the conffile and the
//     enablement go; hello.service still runs. agentd-mirror.service,
//     disabled by the installation and enabled by the admin before the
//     removal, loses its enablement and /var/lib/agentd-mirror too.
func TestInstalledAsAUser(t *testing.T) {
	t.Parallel()
	startBuild() // builds while the container boots
	const host = "deb1"
	c := systemdtest.BootDebian(t, host, nil)
	waited := time.Now()
	p := builtPackage(t)
	t.Logf("waited %s for the package (built in %s)", time.Since(waited).Round(time.Millisecond), built.took.Round(time.Millisecond))
	debName := filepath.Base(p.Path)
	if err := os.Link(p.Path, filepath.Join(c.Share, debName)); err != nil {
		data, err := os.ReadFile(p.Path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(c.Share, debName), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	deb := "/run/harness/" + debName
	if err := os.WriteFile(filepath.Join(c.Share, "hello.service"), []byte(helloUnit), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	step := func(what string) {
		t.Logf("%s (%s)", what, time.Since(start).Round(time.Millisecond))
		start = time.Now()
	}

	// run runs a shell command line inside the container and returns its
	// output and exit code.
	run := func(cmdline string) (string, int) {
		t.Helper()
		start := time.Now()
		out, err := c.Run("sh", "-c", cmdline)
		took := time.Since(start).Round(time.Millisecond)
		var ee *exec.ExitError
		switch {
		case err == nil:
			t.Logf("(%s) # %s [%s]\n%s", host, cmdline, took, out)
			return out, 0
		case errors.As(err, &ee):
			t.Logf("(%s) # %s → exit %d [%s]\n%s", host, cmdline, ee.ExitCode(), took, out)
			return out, ee.ExitCode()
		}
		t.Fatalf("%s: %v", cmdline, err)
		return "", -1
	}
	mustRun := func(cmdline string) string {
		t.Helper()
		out, code := run(cmdline)
		if code != 0 {
			t.Fatalf("%s: exit %d", cmdline, code)
		}
		return out
	}
	exists := func(path string) bool {
		_, err := os.Lstat(filepath.Join(c.Root, path))
		return err == nil
	}
	isActive := func(unit string) string {
		out, _ := run("systemctl is-active " + unit)
		return strings.TrimSpace(out)
	}
	const (
		wants       = "/etc/systemd/system/multi-user.target.wants/agentd.service"
		mirrorWants = "/etc/systemd/system/multi-user.target.wants/agentd-mirror.service"
	)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.Run("journalctl", "--no-pager", "-b", "-u", "agentd", "-n", "100")
			t.Logf("journalctl -u agentd:\n%s", out)
		}
	})

	// The host image may carry Docker's policy-rc.d ("exit 101": never start
	// or stop a service from a maintainer script), meant for image builds. A
	// booted machine has none; this one's copy goes (the host keeps its own).
	if exists("/usr/sbin/policy-rc.d") {
		mustRun("rm /usr/sbin/policy-rc.d")
	}

	// 1. As README says, with systemd running: enabled, not started.
	out := mustRun("apt-get install -y " + deb + " 2>&1")
	if !strings.Contains(out, "agentd.service is enabled, not started") {
		t.Errorf("apt install does not say that agentd is enabled and not started")
	}
	if st := isActive("agentd"); st != "inactive" {
		t.Errorf("agentd %s after installation without AGENTD_START=yes: want inactive", st)
	}
	if out := mustRun("systemctl is-enabled agentd"); strings.TrimSpace(out) != "enabled" {
		t.Errorf("systemctl is-enabled agentd = %q", out)
	}
	if got := mustRun("dpkg-query -W -f '${Version} ${Status}' agentd"); got != p.Version+" install ok installed" {
		t.Errorf("dpkg-query: %q, want %q", got, p.Version+" install ok installed")
	}
	if got := mustRun("systemctl show -p FragmentPath,ExecStart agentd"); !strings.Contains(got, "FragmentPath="+SystemUnitPath) || !strings.Contains(got, "path=/usr/bin/agentd") {
		t.Errorf("agentd.service is not the packaged one:\n%s", got)
	}
	if out, _ := run("systemctl is-enabled agentd-mirror"); strings.TrimSpace(out) != "disabled" {
		t.Errorf("systemctl is-enabled agentd-mirror = %q after installation: want disabled", out)
	}
	if !exists(MirrorDefaults) {
		t.Errorf("%s not installed", MirrorDefaults)
	}
	if got := mustRun("stat -c %a /var/lib/agentd"); strings.TrimSpace(got) != "700" {
		t.Errorf("/var/lib/agentd mode %s", got)
	}
	// Both units load as systemd reads them (their binary, and the man page
	// of Documentation=, found); the user unit as a user's manager would.
	if out := mustRun("systemd-analyze verify " + SystemUnitPath + " 2>&1"); out != "" {
		t.Errorf("systemd-analyze verify %s:\n%s", SystemUnitPath, out)
	}
	if out := mustRun("mkdir -p -m 0700 /run/user/0 && XDG_RUNTIME_DIR=/run/user/0 systemd-analyze --user verify " + UserUnitPath + " 2>&1"); out != "" {
		t.Errorf("systemd-analyze --user verify %s:\n%s", UserUnitPath, out)
	}
	step("1. apt install ./" + debName)

	// Gone again, enablement included (purged, never started).
	mustRun("dpkg -P agentd 2>&1")
	if exists(wants) || exists(BinPath) {
		t.Errorf("purge left %s or %s", wants, BinPath)
	}

	// 2. PID 1 is not systemd: the maintainer scripts see no
	// /run/systemd/system (sd_booted), say so and do not fail.
	out = mustRun("unshare --mount sh -c 'mount -t tmpfs tmpfs /run/systemd && dpkg -i " + deb + "' 2>&1")
	if !strings.Contains(out, "systemd is not running (PID 1 is not systemd)") {
		t.Errorf("dpkg -i without systemd does not say that systemd is not running")
	}
	if !exists(wants) {
		t.Errorf("agentd.service not enabled (%s missing) after an install without systemd", wants)
	}
	if st := isActive("agentd"); st != "inactive" {
		t.Errorf("agentd %s after an install without systemd", st)
	}
	step("2. dpkg -P; dpkg -i without systemd as PID 1")

	// 3. Use it.
	mustRun("systemctl enable --now agentd")
	if st := isActive("agentd"); st != "active" {
		t.Fatalf("agentd %s after systemctl enable --now", st)
	}
	if got := strings.TrimSpace(mustRun("agentd --version")); got != "agentd version "+p.Describe {
		t.Errorf("agentd --version = %q, want %q", got, "agentd version "+p.Describe)
	}
	step("3. systemctl enable --now agentd")
	mustRun("agentd unit put /run/harness/hello.service --host " + host + " --wait --timeout 30s")
	if st := isActive("hello.service"); st != "active" {
		t.Fatalf("hello.service %s after unit put --wait", st)
	}
	hello := mustRun("systemctl show -p MainPID --value hello.service")
	step("   agentd unit put --wait hello.service")

	journal := mustRun("journalctl --no-pager -b -u agentd -o json")
	var started, agentLines int
	for _, line := range strings.Split(strings.TrimSpace(journal), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("journalctl -o json: %v: %s", err, line)
		}
		if e["AGENTD_HOST"] == host {
			agentLines++
		}
		if e["AGENTD_ACTION"] == "start" && e["AGENTD_RESULT"] == "done" && e["OBJECT_SYSTEMD_UNIT"] == "hello.service" {
			started++
		}
	}
	if agentLines == 0 || started != 1 {
		t.Errorf("journalctl -u agentd: %d lines from the agent, %d saying it started hello.service", agentLines, started)
	}
	t.Logf("journalctl -u agentd:\n%s", mustRun("journalctl --no-pager -b -u agentd -o short-precise"))

	if exists("/usr/bin/man") {
		out := mustRun("MANPAGER=cat MANWIDTH=80 man agentd 2>&1")
		// man breaks a long SEE ALSO list after a hyphen ("agentd-\n unit(8)").
		joined := regexp.MustCompile(`-\n\s+`).ReplaceAllString(out, "-")
		if !strings.Contains(joined, "agentd - Redeploy systemd units in place across a fleet") || !strings.Contains(joined, "agentd-unit(8)") {
			t.Errorf("man agentd:\n%s", out)
		}
		if out := mustRun("MANPAGER=cat man 8 agentd-unit-put 2>&1"); !strings.Contains(out, "--wait") {
			t.Errorf("man agentd-unit-put:\n%s", out)
		}
	} else {
		t.Logf("man-db is not installed: checking the page files only")
		for _, page := range []string{"agentd.8.gz", "agentd-unit-put.8.gz"} {
			gunzip(t, filepath.Join(c.Root, ManDir, page))
		}
	}
	// The completion script loads in bash and, through `agentd __complete`,
	// completes "agentd unit p" to "put". Without the bash-completion
	// package (cobra's script needs its _get_comp_words_by_ref) a minimal
	// stand-in provides that function.
	const completion = `
if [ -r /usr/share/bash-completion/bash_completion ]; then
	. /usr/share/bash-completion/bash_completion
else
	_get_comp_words_by_ref() {
		cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
		words=("${COMP_WORDS[@]}") cword=$COMP_CWORD
	}
fi
. ` + BashCompletion + ` || exit 1
complete -p agentd || exit 1
COMP_WORDS=(agentd unit p) COMP_CWORD=2 COMP_LINE="agentd unit p" COMP_POINT=13
__start_agentd agentd p unit
printf 'reply: %s\n' "${COMPREPLY[@]}"`
	if out := mustRun("bash -c '" + strings.ReplaceAll(completion, "'", `'\''`) + "' 2>&1"); !strings.Contains(out, "reply: put") {
		t.Errorf("bash completion of \"agentd unit p\" lacks put:\n%s", out)
	}
	step("   journalctl, man, bash completion")

	// An upgrade (the same package again, as dpkg sees it): the running
	// agent restarts on the new binary, hello.service is left alone.
	agent := mustRun("systemctl show -p MainPID --value agentd")
	mustRun("dpkg -i " + deb + " 2>&1")
	if st := isActive("agentd"); st != "active" {
		t.Errorf("agentd %s after an upgrade", st)
	} else if got := mustRun("systemctl show -p MainPID --value agentd"); got == agent {
		t.Errorf("agentd not restarted by the upgrade (MainPID %s)", strings.TrimSpace(got))
	}
	if got := mustRun("systemctl show -p MainPID --value hello.service"); got != hello {
		t.Errorf("hello.service MainPID %s → %s across the upgrade", hello, got)
	}
	step("   dpkg -i again: an upgrade")

	mustRun("ls -lA " + StateDir)

	// The admin enables the mirror (not started: it has no repository),
	// and it has left a clone in its state directory.
	mustRun("systemctl enable agentd-mirror 2>&1 && mkdir -p -m 0700 " + MirrorStateDir + "/default/repo")
	if !exists(mirrorWants) {
		t.Fatalf("systemctl enable agentd-mirror made no %s", mirrorWants)
	}

	// 4. Remove: the agent stops and goes; what it started keeps running.
	// dpkg, not apt-get: the same maintainer scripts without apt's cache
	// rebuild (seconds here, with the host's package lists).
	mustRun("dpkg -r agentd 2>&1")
	if exists(BinPath) {
		t.Errorf("%s still there after remove", BinPath)
	}
	if st := isActive("agentd"); st == "active" || st == "activating" {
		t.Errorf("agentd %s after remove", st)
	}
	if got := mustRun("systemctl show -p LoadState --value agentd"); strings.TrimSpace(got) != "not-found" {
		t.Errorf("agentd.service LoadState %q after remove: want not-found (daemon-reload)", got)
	}
	if out, _ := run("for c in /proc/[0-9]*/comm; do [ \"$(cat $c 2>/dev/null)\" = agentd ] && echo $c; done"); strings.TrimSpace(out) != "" {
		t.Errorf("an agentd process is still running after remove: %s", out)
	}
	if st := isActive("hello.service"); st != "active" {
		t.Errorf("hello.service %s after removing agentd", st)
	} else if got := mustRun("systemctl show -p MainPID --value hello.service"); got != hello {
		t.Errorf("hello.service MainPID %s → %s across the removal", hello, got)
	}
	if state := mustRun("ls -A " + StateDir); state == "" {
		t.Errorf("%s is empty after remove: want the agent's state kept until purge", StateDir)
	}
	for _, kept := range []string{DefaultsPath, "/etc/systemd/system/hello.service"} {
		if !exists(kept) {
			t.Errorf("%s gone after remove: want it kept until purge", kept)
		}
	}
	if got := mustRun("dpkg-query -W -f '${Status}' agentd"); got != "deinstall ok config-files" {
		t.Errorf("dpkg-query after remove: %q", got)
	}
	step("4. dpkg -r agentd")

	// 5. Purge: state, configuration and enablement go; hello stays.
	mustRun("dpkg -P agentd 2>&1")
	for _, gone := range []string{StateDir, DefaultsPath, wants, MirrorStateDir, MirrorDefaults, mirrorWants} {
		if exists(gone) {
			t.Errorf("%s still there after purge", gone)
		}
	}
	if out, _ := run("dpkg-query -W -f '${Status}' agentd"); strings.Contains(out, "installed") || strings.Contains(out, "config-files") {
		t.Errorf("dpkg-query after purge: %q", out)
	}
	if st := isActive("hello.service"); st != "active" {
		t.Errorf("hello.service %s after purging agentd", st)
	}
	step("5. dpkg -P agentd")
}
