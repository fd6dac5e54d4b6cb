package reconcile

import (
	"errors"
	"github.com/agentd/agentd/internal/citest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// systemdTool finds a systemd binary the test runs; its absence fails the
// test with CI=true (where .ci/run has installed systemd) and skips it
// otherwise, as systemdtest.Start does for the harness (which this package
// cannot import: it imports reconcile).
func systemdTool(t *testing.T, name string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		citest.Unavailable(t, "%s is not installed: %v", name, err)
	}
	return bin
}

// TestValidateUnitNameTakesWhatSystemdEscapeMakes: every name the real
// systemd-escape prints for these paths and instances is valid, and means
// what systemd says it means (a mount's path, a template's instance).
func TestValidateUnitNameTakesWhatSystemdEscapeMakes(t *testing.T) {
	bin := systemdTool(t, "systemd-escape")
	for _, tc := range []struct {
		args     []string
		want     string // what systemd-escape prints, for the reader
		instance bool
	}{
		{args: []string{"--path", "/srv/my-data", "--suffix", "mount"}, want: `srv-my\x2ddata.mount`},
		{args: []string{"--path", "/var/lib/a-b/c_d", "--suffix", "mount"}, want: `var-lib-a\x2db-c_d.mount`},
		{args: []string{"--path", "/mnt/with space", "--suffix", "mount"}, want: `mnt-with\x20space.mount`},
		{args: []string{"--path", "/mnt/.hidden", "--suffix", "mount"}, want: `mnt-.hidden.mount`},
		{args: []string{"--path", "/mnt/ünï", "--suffix", "mount"}, want: `mnt-\xc3\xbcn\xc3\xaf.mount`},
		{args: []string{"--suffix", "service", "foo-bar"}, want: `foo\x2dbar.service`},
		{args: []string{"--suffix", "service", ".dot"}, want: `\x2edot.service`},
		{args: []string{"--suffix", "slice", "a b"}, want: `a\x20b.slice`},
		{args: []string{"--suffix", "target", "x/y"}, want: `x-y.target`},
		{args: []string{"--template", "a@.service", "b-c"}, want: `a@b\x2dc.service`, instance: true},
		{args: []string{"--template", "getty@.service", "tty/1"}, want: `getty@tty-1.service`, instance: true},
		{args: []string{"--template", "x@.service", "u@h:22"}, want: `x@u\x40h:22.service`, instance: true},
		{args: []string{"--template", "x@.service", ".5"}, want: `x@\x2e5.service`, instance: true},
		{args: []string{"--template", "web@.socket", "--path", "/run/my-app.sock"}, want: `web@run-my\x2dapp.sock.socket`, instance: true},
	} {
		out, err := exec.Command(bin, tc.args...).Output()
		if err != nil {
			t.Fatalf("systemd-escape %s: %v", strings.Join(tc.args, " "), err)
		}
		name := strings.TrimSpace(string(out))
		if name != tc.want {
			t.Errorf("systemd-escape %s = %q; the table says %q", strings.Join(tc.args, " "), name, tc.want)
		}
		if err := ValidateUnitName(name); err != nil {
			t.Errorf("systemd-escape %s: %v", strings.Join(tc.args, " "), err)
		}
		if path, unit, err := ParseKey(name); err != nil || path != name || unit != name {
			t.Errorf("ParseKey(%q) = %q, %q, %v", name, path, unit, err)
		}
		if IsInstance(name) != tc.instance || IsTemplate(name) {
			t.Errorf("%q: IsInstance %v, IsTemplate %v; want instance %v", name, IsInstance(name), IsTemplate(name), tc.instance)
		}
		if tc.instance && TemplateOf(name) != tc.args[1] {
			t.Errorf("TemplateOf(%q) = %q, want %q", name, TemplateOf(name), tc.args[1])
		}
	}
}

// TestValidateUnitNameAgreesWithSystemdVerify writes a small valid unit
// under each name into a temp dir and runs the real systemd-analyze verify
// on it: agentd takes a name when systemd does, except where it is
// stricter on purpose (stricter names why; see ValidateUnitName).
func TestValidateUnitNameAgreesWithSystemdVerify(t *testing.T) {
	bin := systemdTool(t, "systemd-analyze")
	esc := systemdTool(t, "systemd-escape")
	long := strings.Repeat("a", 247)
	for _, tc := range []struct {
		name     string
		agentd   bool
		stricter string // why agentd refuses a name systemd takes
		quirk    string // why systemd-analyze verify cannot tell
	}{
		{name: "hello.service", agentd: true},
		{name: `foo\x2dbar.service`, agentd: true},
		{name: `a@b\x2dc.service`, agentd: true}, // an instance file, no template beside it
		{name: "a@.service", agentd: true},
		{name: `a@\x2e5.service`, agentd: true},
		{name: "a@.b.service", agentd: true},
		{name: `srv-my\x2ddata.mount`, agentd: true},
		{name: `mnt-with\x20space.mount`, agentd: true},
		{name: `x\x2Dy.service`, agentd: true},
		{name: `\x2edot.service`, agentd: true},
		{name: "web:8080.service", agentd: true, quirk: `verify (252) fails on this name with "Couldn't process aliases"; unit_name_is_valid takes ":"`},
		{name: "my_app.target", agentd: true},
		{name: `a\x20b.slice`, agentd: true},
		{name: long + ".service", agentd: true},

		{name: long + "a.service"},
		{name: "a b.service"},
		{name: "héllo.service"},
		{name: "@x.service"},
		{name: "hello"},
		{name: "hello.bogus"},
		{name: "a!.service"},
		{name: "srv-a..b.mount", stricter: `".." is never in a name agentd writes`},
		{name: "a..b.service", stricter: `".." is never in a name agentd writes`},
		{name: ".hidden.service", stricter: "a hidden file, and where the agent keeps temp files"},
		{name: `foo\\x2dbar.service`, stricter: "a backslash that starts no \\xNN escape"},
		{name: `a\q.service`, stricter: "a backslash that starts no \\xNN escape"},
		{name: "a@b@c.service", stricter: "a second @"},
	} {
		err := ValidateUnitName(tc.name)
		if (err == nil) != tc.agentd {
			t.Errorf("ValidateUnitName(%q) = %v, want valid %v", tc.name, err, tc.agentd)
		}
		systemd, out := systemdVerifies(t, bin, esc, tc.name)
		switch {
		case tc.quirk != "":
			t.Logf("%q: systemd-analyze verify takes it: %v (%s); not compared: %s", tc.name, systemd, out, tc.quirk)
		case tc.stricter != "" && !systemd:
			t.Errorf("%q: systemd refuses it too (%s): drop the stricter note %q", tc.name, out, tc.stricter)
		case tc.stricter == "" && systemd != tc.agentd:
			t.Errorf("%q: systemd-analyze verify takes it: %v (%s); agentd: %v", tc.name, systemd, out, err)
		}
	}
}

// systemdVerifies writes a unit named name that systemd loads when the
// name is valid, and reports whether systemd-analyze verify takes it.
func systemdVerifies(t *testing.T, bin, esc, name string) (bool, string) {
	t.Helper()
	content := "[Unit]\nDescription=name test\n"
	switch filepath.Ext(name) {
	case ".service":
		content += "[Service]\nExecStart=/bin/true\n"
	case ".mount":
		where, err := exec.Command(esc, "--unescape", "--path", "--", strings.TrimSuffix(name, ".mount")).Output()
		if err != nil {
			t.Fatalf("systemd-escape --unescape --path %q: %v", name, err)
		}
		content += "[Mount]\nWhat=tmpfs\nType=tmpfs\nWhere=" + strings.TrimSpace(string(where)) + "\n"
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		if errors.Is(err, syscall.ENAMETOOLONG) {
			return false, "file name too long"
		}
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "verify", "--man=no", p).CombinedOutput()
	return err == nil, strings.TrimSpace(string(out))
}

func TestValidateUnitName(t *testing.T) {
	good := []string{"hello.service", "a-b_c:d.socket", "web@.service", "web@1.service", `x\x2dy.mount`, "app.slice", "t.timer", "p.path", "multi-user.target"}
	bad := []string{"", "hello", ".service", "hello.exe", "hello.device", "a/b.service", "../x.service", "a..b.service", "a b.service", "@.service", "a@b@c.service", strings.Repeat("a", 250) + ".service", "héllo.service"}
	for _, n := range good {
		if err := ValidateUnitName(n); err != nil {
			t.Errorf("%q: %v", n, err)
		}
	}
	for _, n := range bad {
		if err := ValidateUnitName(n); err == nil {
			t.Errorf("%q: accepted", n)
		}
	}
}
