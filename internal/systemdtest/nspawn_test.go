package systemdtest

import (
	"os"
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
