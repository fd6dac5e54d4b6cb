package systemdtest

// System mode (shared/HARNESS.md, "System mode"): a throw-away container
// booted with systemd-nspawn, systemd as its PID 1, journald and the system
// bus, for the few end-to-end tests that need the agent running as a real
// system service. The host's systemd (there is none) is never involved.

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"github.com/agentd/agentd/internal/citest"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/agentd/agentd/systemd"
)

//go:embed nspawn.sh
var nspawnScript []byte

const (
	// containerBootTimeout bounds the wait for the container's systemd to
	// report running (1.3–3.2 s measured; a loaded machine needs more).
	containerBootTimeout = 60 * time.Second
	// containerStopTimeout bounds the clean poweroff (≤ 20 s, then the
	// script kills what is left) plus the script's own cleanup.
	containerStopTimeout = 30 * time.Second
)

// Container is a booted container with systemd as PID 1. Its root is a
// fresh tmpfs with the host's /usr mounted read-only; /etc and /var start
// empty and vanish at poweroff. It has its own network namespace with only
// a loopback interface.
type Container struct {
	Dir        string // temporary directory of the harness; removed at cleanup
	Share      string // Dir/share, mounted read-write at /run/harness inside
	Bin        string // Dir/bin, mounted read-only at /usr/local/bin inside
	Machine    string // the container's hostname
	Leader     int    // the container's PID 1, as a PID of the host
	Root       string // /proc/<Leader>/root: the container's file system, from the host
	BusAddress string // the container's system bus, reachable from the host
	BootTime   time.Duration

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	cgroup string

	unitProps // Prop, ActiveState, MainPID; its connection is closed by Close

	closeOnce sync.Once
	closeErr  error
}

// Boot starts a container named machine for the test, calls setup (if not
// nil) to fill c.Bin and c.Share before the boot, and registers the
// poweroff with t.Cleanup. When the container cannot boot, Boot fails the
// test if the environment variable CI is "true" (a missing harness must not
// pass silently in CI), and skips it with the reason otherwise.
func Boot(t testing.TB, machine string, setup func(c *Container) error) *Container {
	t.Helper()
	return bootTest(t, machine, volatileRoot, setup)
}

// BootDebian is Boot for a container that installs, upgrades and removes
// Debian packages as a machine of its own would: its /usr, /etc and /var
// are copy-on-write clones of the host's (dpkg's database, apt, man-db and
// their configuration as installed on the host; writes go to an upper layer
// on a tmpfs and vanish at poweroff), except /etc/systemd/system, which starts
// empty, so that none of the host's enabled services boots. The host's
// /etc/hostname is overridden: the hostname is machine.
func BootDebian(t testing.TB, machine string, setup func(c *Container) error) *Container {
	t.Helper()
	return bootTest(t, machine, debianRoot, setup)
}

// The root file systems nspawn.sh knows (its ROOT argument).
const (
	volatileRoot = "volatile"
	debianRoot   = "debian"
)

func bootTest(t testing.TB, machine, root string, setup func(c *Container) error) *Container {
	t.Helper()
	c, err := bootContainer(t.Name(), machine, root, setup)
	if err != nil {
		citest.Unavailable(t, "systemd-nspawn harness unavailable: %v", err)
	}
	t.Logf("container %s booted in %s (PID 1 is host PID %d)", machine, c.BootTime.Round(time.Millisecond), c.Leader)
	t.Cleanup(func() {
		start := time.Now()
		if err := c.Close(); err != nil {
			t.Errorf("systemd-nspawn harness teardown: %v", err)
		}
		t.Logf("container %s powered off in %s", machine, time.Since(start).Round(time.Millisecond))
		if t.Failed() {
			t.Logf("container log (%s):\n%s", c.Dir, c.Log())
		}
		if err := os.RemoveAll(c.Dir); err != nil {
			t.Errorf("systemd-nspawn harness: %v", err)
		}
	})
	return c
}

// nspawnPreconditions reports why a container cannot boot here, or nil.
func nspawnPreconditions() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (cgroups, mount namespace, nspawn)")
	}
	if _, err := os.Stat(systemdBinary); err != nil {
		return fmt.Errorf("%s missing (package systemd): %w", systemdBinary, err)
	}
	if _, err := exec.LookPath("systemd-nspawn"); err != nil {
		return fmt.Errorf("systemd-nspawn missing (package systemd-container, pinned to the host's systemd version: see .ci/run): %w", err)
	}
	for _, p := range cgroupRoots {
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err != nil {
			return fmt.Errorf("needs the hybrid cgroup layout (%s): %w", p, err)
		}
	}
	for _, bin := range []string{"unshare", "nsenter", "bash"} {
		if _, err := exec.LookPath(bin); err != nil {
			return err
		}
	}
	return nil
}

func bootContainer(testName, machine, root string, setup func(*Container) error) (_ *Container, err error) {
	if err := nspawnPreconditions(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sdn")
	if err != nil {
		return nil, err
	}
	c := &Container{
		Dir:     dir,
		Share:   filepath.Join(dir, "share"),
		Bin:     filepath.Join(dir, "bin"),
		Machine: machine,
	}
	c.unitProps.dial = c.Dial // BusAddress is known once it booted
	defer func() {
		if err != nil && c.cmd == nil {
			os.RemoveAll(dir)
		}
	}()
	for _, d := range []string{c.Share, c.Bin} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
	}
	if setup != nil {
		if err := setup(c); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
	}
	name := "ns-" + cgroupName(testName)
	start := time.Now()
	cmd, stdin, stdout, err := startScript(dir, "nspawn.sh", nspawnScript, name, machine, root)
	if err != nil {
		return nil, err
	}
	c.cmd, c.stdin, c.cgroup = cmd, stdin, scriptCgroup(cmd, name)
	defer func() {
		if err != nil {
			if cerr := c.Close(); cerr != nil {
				err = fmt.Errorf("%w (and: %v)", err, cerr)
			}
			err = fmt.Errorf("%w\n%s", err, c.Log())
			os.RemoveAll(dir)
		}
	}()

	if c.Leader, err = readyPID(stdout, "nspawn.sh", containerBootTimeout); err != nil {
		return nil, err
	}
	c.BootTime = time.Since(start)
	c.Root = fmt.Sprintf("/proc/%d/root", c.Leader)
	c.BusAddress = "unix:path=" + filepath.Join(c.Root, "run/dbus/system_bus_socket")
	return c, nil
}

// ansiEscape matches the colour codes of the console output.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;]*m`)

// Log returns nspawn.sh's errors and the end of the container's console
// (boot and shutdown messages), for failure messages. The journal has the
// rest: Journal.
func (c *Container) Log() string {
	var b strings.Builder
	for _, name := range []string{"nspawn.log", "console.log"} {
		data, err := os.ReadFile(filepath.Join(c.Dir, name))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(&b, "--- %s: %v\n", name, err)
			continue
		}
		if name == "nspawn.log" && len(data) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(ansiEscape.ReplaceAllString(string(data), ""), "\n"), "\n")
		if len(lines) > consoleTail {
			lines = append([]string{fmt.Sprintf("[… %d lines]", len(lines)-consoleTail)}, lines[len(lines)-consoleTail:]...)
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", name, strings.Join(lines, "\n"))
	}
	return b.String()
}

// consoleTail is how many console lines Log keeps.
const consoleTail = 40

// Command returns a command that runs args inside the container: in all its
// namespaces (mount, UTS, IPC, network, PID), as root.
func (c *Container) Command(ctx context.Context, args ...string) *exec.Cmd {
	full := append([]string{"-t", strconv.Itoa(c.Leader), "-m", "-u", "-i", "-n", "-p", "--"}, args...)
	return exec.CommandContext(ctx, "nsenter", full...)
}

// Run runs args inside the container (bounded by 60 s) and returns their
// combined output and error.
func (c *Container) Run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := c.Command(ctx, args...).CombinedOutput()
	if err != nil {
		err = fmt.Errorf("%s: %w", strings.Join(args, " "), err)
	}
	return string(out), err
}

// MustRun is Run that fails the test on error.
func (c *Container) MustRun(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.Run(args...)
	if err != nil {
		t.Fatalf("in container: %v\n%s", err, out)
	}
	return out
}

// Systemctl runs systemctl inside the container and fails the test on error.
func (c *Container) Systemctl(t testing.TB, args ...string) string {
	t.Helper()
	return c.MustRun(t, append([]string{"systemctl", "--no-pager"}, args...)...)
}

// Journal runs journalctl inside the container (the journal of this boot)
// and fails the test on error.
func (c *Container) Journal(t testing.TB, args ...string) string {
	t.Helper()
	return c.MustRun(t, append([]string{"journalctl", "--no-pager", "-b"}, args...)...)
}

// WriteFile writes a file at path inside the container (creating its
// directories).
func (c *Container) WriteFile(t testing.TB, path string, data []byte, perm os.FileMode) {
	t.Helper()
	p := filepath.Join(c.Root, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, perm); err != nil {
		t.Fatal(err)
	}
}

// Dial opens a go-systemd connection to the container's PID 1 through its
// system bus. PIDs it reports are the container's. ctx bounds the
// connection's lifetime; the caller closes it.
func (c *Container) Dial(ctx context.Context) (*sddbus.Conn, error) {
	return systemd.Connect(ctx, systemd.AddressDialer(c.BusAddress))
}

// Close powers the container off: it closes the script's stdin, which
// SIGTERMs nspawn (a clean poweroff: units stopped, journal flushed), waits
// for the script (at most 30 s, then kills it and every process left in the
// harness's cgroups) and checks that the cgroups are gone. It does not
// remove Dir (Boot's cleanup does, after logging on failure). Close is
// idempotent.
func (c *Container) Close() error {
	c.closeOnce.Do(func() {
		c.closeConn()

		c.closeErr = stopScript(c.stdin, c.cmd, containerStopTimeout, "nspawn.sh", c.cgroup)
	})
	return c.closeErr
}
