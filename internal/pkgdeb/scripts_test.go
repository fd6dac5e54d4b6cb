package pkgdeb

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// stubScript records each call of the helper it stands in for in $STUBLOG.
// `deb-systemd-helper --quiet was-enabled` answers $WAS_ENABLED.
const stubScript = `#!/bin/sh
echo "${0##*/} $*" >> "$STUBLOG"
case "$*" in
"--quiet was-enabled "*) [ "$WAS_ENABLED" = yes ] ;;
esac
`

// scriptWrapper runs one maintainer script in a private mount namespace
// (unshare --mount): tmpfs over /run/systemd (with system/ when the case
// has systemd as PID 1, the sd_booted test the scripts use), /etc/default
// (holding $DEFAULTS as /etc/default/agentd), /etc/systemd/system and
// /var/lib (holding a non-empty /var/lib/agentd and /var/lib/agentd-mirror,
// the mirror's clones). Nothing reaches the host.
// The script runs with $SCRIPT_PATH as its PATH.
const scriptWrapper = `set -e
for d in /run/systemd /etc/default /etc/systemd/system /var/lib; do
	mount -t tmpfs -o mode=0755 tmpfs "$d"
done
[ "$BOOTED" = yes ] && mkdir /run/systemd/system
[ -n "$DEFAULTS" ] && printf '%s\n' "$DEFAULTS" > /etc/default/agentd
mkdir -m 0700 /var/lib/agentd && touch /var/lib/agentd/managed.json
mkdir -p -m 0700 /var/lib/agentd-mirror/default/repo
set +e
PATH=$SCRIPT_PATH /bin/sh "$@"
rc=$?
[ -d /var/lib/agentd ] && echo "(state kept)" >> "$STUBLOG"
[ -d /var/lib/agentd-mirror ] && echo "(mirror state kept)" >> "$STUBLOG"
exit $rc
`

// Every branch of the maintainer scripts, with deb-systemd-helper,
// deb-systemd-invoke and systemctl replaced by stubs that record their
// calls: what debhelper's scripts would do, plus the AGENTD_START choice
// and the words an operator reads.
func TestMaintainerScripts(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		needTool(t, "root (unshare --mount)", os.ErrPermission)
		return
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		needTool(t, "unshare", err)
		return
	}
	stubs := t.TempDir()
	for _, name := range []string{"deb-systemd-helper", "deb-systemd-invoke", "systemctl"} {
		if err := os.WriteFile(filepath.Join(stubs, name), []byte(stubScript), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A PATH without the helpers (they fail soft): rm only.
	noStubs := t.TempDir()
	if err := os.Symlink("/bin/rm", filepath.Join(noStubs, "rm")); err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "wrapper.sh")
	if err := os.WriteFile(wrapper, []byte(scriptWrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	const (
		started = "AGENTD_START=yes"
		// agentd-mirror.service is never enabled nor started: its state
		// is recorded (for purge), and a running one restarts on upgrade.
		mirror   = "deb-systemd-helper update-state agentd-mirror.service\n"
		enable   = "deb-systemd-helper --quiet was-enabled agentd.service\ndeb-systemd-helper enable agentd.service\n" + mirror
		disabled = "deb-systemd-helper --quiet was-enabled agentd.service\ndeb-systemd-helper update-state agentd.service\n" + mirror
		reload   = "systemctl --system daemon-reload\n"
		mirrorUp = reload + "deb-systemd-invoke try-restart agentd-mirror.service\n"
		kept     = "(state kept)\n(mirror state kept)\n"
	)
	for _, c := range []struct {
		name       string
		args       []string
		booted     bool
		defaults   string
		wasEnabled bool
		noHelpers  bool
		calls      string
		stderr     string // a substring of the output; "" for none
	}{
		{name: "install", args: []string{"postinst", "configure", ""}, booted: true, wasEnabled: true,
			calls: enable + reload + kept, stderr: "agentd: agentd.service is enabled, not started."},
		{name: "install with AGENTD_START=yes", args: []string{"postinst", "configure", ""}, booted: true, wasEnabled: true, defaults: started,
			calls: enable + reload + "deb-systemd-invoke start agentd.service\n" + kept},
		{name: "install, AGENTD_START=no", args: []string{"postinst", "configure", ""}, booted: true, wasEnabled: true, defaults: "AGENTD_START=no",
			calls: enable + reload + kept, stderr: "enabled, not started"},
		{name: "install, PID 1 not systemd", args: []string{"postinst", "configure", ""}, wasEnabled: true, defaults: started,
			calls: enable + kept, stderr: "agentd: systemd is not running (PID 1 is not systemd): agentd.service not started"},
		{name: "install, no helpers", args: []string{"postinst", "configure", ""}, booted: true, noHelpers: true,
			calls: kept, stderr: "enabled, not started"},
		{name: "upgrade", args: []string{"postinst", "configure", "1.0-1"}, booted: true, wasEnabled: true,
			calls: enable + mirrorUp + "deb-systemd-invoke try-restart agentd.service\n" + kept},
		{name: "upgrade with AGENTD_START=yes", args: []string{"postinst", "configure", "1.0-1"}, booted: true, wasEnabled: true, defaults: started,
			calls: enable + mirrorUp + "deb-systemd-invoke restart agentd.service\n" + kept},
		{name: "upgrade, disabled by the admin", args: []string{"postinst", "configure", "1.0-1"}, booted: true,
			calls: disabled + mirrorUp + "deb-systemd-invoke try-restart agentd.service\n" + kept},
		{name: "abort-upgrade", args: []string{"postinst", "abort-upgrade", "1.1-1"}, booted: true, wasEnabled: true,
			calls: enable + mirrorUp + "deb-systemd-invoke try-restart agentd.service\n" + kept},
		{name: "prerm remove", args: []string{"prerm", "remove"}, booted: true, calls: "deb-systemd-invoke stop agentd.service agentd-mirror.service\n" + kept},
		{name: "prerm remove, PID 1 not systemd", args: []string{"prerm", "remove"}, calls: kept},
		{name: "prerm upgrade", args: []string{"prerm", "upgrade", "1.1-1"}, booted: true, calls: kept},
		{name: "postrm remove", args: []string{"postrm", "remove"}, booted: true, calls: reload + kept},
		{name: "postrm remove, PID 1 not systemd", args: []string{"postrm", "remove"}, calls: kept},
		{name: "postrm purge", args: []string{"postrm", "purge"}, booted: true, calls: "deb-systemd-helper purge agentd.service\ndeb-systemd-helper purge agentd-mirror.service\n"},
		{name: "postrm purge, no helpers", args: []string{"postrm", "purge"}, noHelpers: true, stderr: "deb-systemd-helper: not found"},
		{name: "postrm upgrade", args: []string{"postrm", "upgrade", "1.1-1"}, booted: true, calls: kept},
	} {
		t.Run(c.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "calls")
			path := stubs + ":/usr/sbin:/usr/bin:/sbin:/bin"
			if c.noHelpers {
				path = noStubs
			}
			script := filepath.Join("../../contrib/deb", c.args[0])
			cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "/bin/sh", wrapper, script}, c.args[1:]...)...)
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "SCRIPT_PATH=" + path, "STUBLOG=" + log,
				"DEFAULTS=" + c.defaults, "BOOTED=" + yesNo(c.booted), "WAS_ENABLED=" + yesNo(c.wasEnabled)}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s %s: %v\n%s", c.args[0], strings.Join(c.args[1:], " "), err, out)
			}
			calls, _ := os.ReadFile(log)
			if string(calls) != c.calls {
				t.Errorf("calls:\n%s\nwant:\n%s", calls, c.calls)
			}
			if c.stderr != "" && !strings.Contains(string(out), c.stderr) {
				t.Errorf("output %q lacks %q", out, c.stderr)
			}
			if c.stderr == "" && len(out) != 0 {
				t.Errorf("unexpected output %q", out)
			}
		})
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
