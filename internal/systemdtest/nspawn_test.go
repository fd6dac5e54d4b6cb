package systemdtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The container boots with journald and the system bus, sees the share
// directory, and leaves nothing behind after poweroff.
func TestContainer(t *testing.T) {
	c := Boot(t, "sdh-test", func(c *Container) error {
		return os.WriteFile(filepath.Join(c.Share, "marker"), []byte("from the host\n"), 0o644)
	})
	if got := c.MustRun(t, "cat", "/run/harness/marker"); got != "from the host\n" {
		t.Errorf("share dir inside: %q", got)
	}
	if got := strings.TrimSpace(c.MustRun(t, "hostname")); got != "sdh-test" {
		t.Errorf("hostname = %q", got)
	}
	for _, u := range []string{"systemd-journald.service", "dbus.service"} {
		if st := c.ActiveState(t, u); st != "active" {
			t.Errorf("%s ActiveState = %s", u, st)
		}
	}
	if pid := c.MainPID(t, "systemd-journald.service"); pid == 0 || int(pid) == c.Leader {
		t.Errorf("journald MainPID = %d: want a PID of the container's namespace", pid)
	}
	c.MustRun(t, "systemd-cat", "-t", "sdh", "echo", "journal-marker")
	if out := c.Journal(t, "-t", "sdh"); !strings.Contains(out, "journal-marker") {
		t.Errorf("journal lacks the marker:\n%s", out)
	}

	cg := c.cgroup
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, root := range cgroupRoots {
		if _, err := os.Stat(filepath.Join(root, cg)); err == nil {
			t.Errorf("cgroup %s/%s left behind", root, cg)
		}
	}
	if _, err := os.Stat(c.Root); err == nil {
		t.Errorf("container PID 1 (%d) still running after Close", c.Leader)
	}
}

// BootDebian: the container has the host's package database and
// configuration, and may change /usr, /etc and /var without the host
// seeing it; none of the host's enabled services runs in it.
func TestDebianContainer(t *testing.T) {
	c := BootDebian(t, "sdh-deb", nil)
	if got := strings.TrimSpace(c.MustRun(t, "hostname")); got != "sdh-deb" {
		t.Errorf("hostname = %q", got)
	}
	host, err := exec.Command("dpkg-query", "-W", "-f=${Version}", "dpkg").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.MustRun(t, "dpkg-query", "-W", "-f=${Version}", "dpkg"); got != string(host) {
		t.Errorf("dpkg version inside = %q, on the host %q", got, host)
	}
	if out := c.MustRun(t, "ls", "-A", "/etc/systemd/system"); out != "" {
		t.Errorf("/etc/systemd/system inside is not empty:\n%s", out)
	}
	marker := fmt.Sprintf("sdh-marker-%d", os.Getpid())
	for _, dir := range []string{"/usr/share", "/etc", "/var/lib"} {
		p := filepath.Join(dir, marker)
		c.MustRun(t, "touch", p)
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			os.Remove(p)
			t.Errorf("%s written inside the container reached the host (%v)", p, err)
		}
	}
	out := c.Systemctl(t, "list-units", "--state=active", "--type=service", "--no-legend", "--plain")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "systemd-") && f[0] != "dbus.service" {
			t.Errorf("unexpected service running in the container: %s", line)
		}
	}
}
