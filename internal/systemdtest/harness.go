// Package systemdtest boots a private, throw-away `systemd --user` manager
// for one test, so adapters that talk to systemd over D-Bus are tested
// against the real thing (see shared/HARNESS.md, "User mode").
//
// Each Harness runs harness.sh (embedded) under `unshare --mount`: the
// manager lives in a cgroup subtree of its own, with its own bus socket,
// unit directories and log, all below a fresh temporary directory. The test
// holds the script's stdin; closing it (Close, test cleanup, or the death of
// the test process) tears the manager down and removes its cgroups.
//
// A Harness is safe for concurrent use by the test's goroutines. Tests in
// different packages may run harnesses in parallel; on two cores more than
// two at a time gains nothing.
package systemdtest

import (
	"bufio"
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"github.com/agentd/agentd/internal/citest"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/agentd/agentd/systemd"
)

//go:embed cgroup.sh
var cgroupLib []byte

// writeScript puts a harness script and the cgroup library it sources in dir.
func writeScript(dir, name string, script []byte) (string, error) {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.sh"), cgroupLib, 0o600); err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, script, 0o700)
}

// startScript starts the harness script body (file name file, with its
// log file.log) in dir under `unshare --mount --propagation private`, with
// the arguments dir, name and args. The caller holds its stdin (closing it
// starts the teardown: stopScript) and reads its "ready PID" line from
// stdout (readyPID).
func startScript(dir, file string, body []byte, name string, args ...string) (_ *exec.Cmd, stdin io.WriteCloser, stdout io.Reader, err error) {
	scriptPath, err := writeScript(dir, file, body)
	if err != nil {
		return nil, nil, nil, err
	}
	stderr, err := os.Create(filepath.Join(dir, strings.TrimSuffix(file, ".sh")+".log"))
	if err != nil {
		return nil, nil, nil, err
	}
	defer stderr.Close() // the child holds its own copy
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "bash", scriptPath, dir, name}, args...)...)
	cmd.Stderr = stderr
	if stdin, err = cmd.StdinPipe(); err != nil {
		return nil, nil, nil, err
	}
	if stdout, err = cmd.StdoutPipe(); err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	return cmd, stdin, stdout, nil
}

// scriptCgroup is the cgroup subtree of the script cmd started with name:
// unshare without --fork execs bash in place, so the script's $$ is our
// child's PID.
func scriptCgroup(cmd *exec.Cmd, name string) string {
	return fmt.Sprintf("systemd-harness-%d-%s", cmd.Process.Pid, name)
}

// readyPID waits at most timeout for the script file to print "ready PID"
// on stdout and returns the PID.
func readyPID(stdout io.Reader, file string, timeout time.Duration) (int, error) {
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case s := <-line:
		pid, ok := strings.CutPrefix(strings.TrimSpace(s), "ready ")
		if !ok {
			return 0, fmt.Errorf("%s did not become ready (said %q)", file, s)
		}
		n, err := strconv.Atoi(pid)
		if err != nil {
			return 0, fmt.Errorf("%s: bad ready line %q", file, s)
		}
		return n, nil
	case <-timer.C:
		return 0, fmt.Errorf("%s not ready after %s", file, timeout)
	}
}

//go:embed harness.sh
var script []byte

const (
	systemdBinary = "/lib/systemd/systemd"
	dbusSocket    = "/usr/lib/systemd/user/dbus.socket"
	// bootTimeout bounds the wait for "ready" and for systemd to answer on
	// the bus (a loaded machine has been seen needing 2.7 s).
	bootTimeout = 30 * time.Second
	// stopTimeout bounds the script's teardown before it is killed.
	stopTimeout = 10 * time.Second
)

// cgroupRoots are the hierarchies in which harness.sh creates its subtree.
var cgroupRoots = []string{"/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"}

// Harness is a running private systemd --user manager.
type Harness struct {
	Dir        string // temporary directory holding everything; removed at cleanup
	BusAddress string // D-Bus address of the manager's user bus: "unix:path=DIR/run/bus"
	UnitDir    string // $XDG_CONFIG_HOME/systemd/user: the agent's unit dir, where EnableUnitFiles puts symlinks
	StateDir   string // a fresh, empty directory for the agent's state
	ManagerPID int

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	cgroup string // subtree name below each of cgroupRoots

	unitProps // Prop, ActiveState, MainPID; its connection is closed by Close

	closeOnce sync.Once
	closeErr  error
}

// Start boots a private systemd --user manager for the test and registers
// its teardown with t.Cleanup. When the harness cannot start, Start fails
// the test if the environment variable CI is "true" (a missing harness must
// not pass silently in CI), and skips it with the reason otherwise.
func Start(t testing.TB) *Harness {
	t.Helper()
	h, err := start(t.Name())
	if err != nil {
		citest.Unavailable(t, "systemd harness unavailable: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("systemd harness teardown: %v", err)
		}
		if t.Failed() {
			t.Logf("systemd harness log (%s):\n%s", h.Dir, h.Log())
		}
		if err := os.RemoveAll(h.Dir); err != nil {
			t.Errorf("systemd harness: %v", err)
		}
	})
	return h
}

// preconditions reports why a harness cannot run here, or nil.
func preconditions() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (cgroups, mount namespace)")
	}
	for _, p := range []string{systemdBinary, dbusSocket} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s missing (packages systemd, dbus-user-session): %w", p, err)
		}
	}
	for _, p := range cgroupRoots {
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err != nil {
			return fmt.Errorf("needs the hybrid cgroup layout (%s): %w", p, err)
		}
	}
	for _, bin := range []string{"unshare", "bash"} {
		if _, err := exec.LookPath(bin); err != nil {
			return err
		}
	}
	return nil
}

func start(testName string) (*Harness, error) {
	if err := preconditions(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sdh")
	if err != nil {
		return nil, err
	}
	h, err := boot(dir, cgroupName(testName))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return h, nil
}

// cgroupName turns a test name into a short, safe cgroup name component.
func cgroupName(testName string) string {
	b := []byte(testName)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if len(b) > 48 {
		b = b[len(b)-48:]
	}
	return string(b)
}

func boot(dir, name string) (_ *Harness, err error) {
	cmd, stdin, stdout, err := startScript(dir, "harness.sh", script, name)
	if err != nil {
		return nil, err
	}
	h := &Harness{
		Dir:        dir,
		BusAddress: "unix:path=" + filepath.Join(dir, "run", "bus"),
		UnitDir:    filepath.Join(dir, "home", ".config", "systemd", "user"),
		StateDir:   filepath.Join(dir, "state"),
		cmd:        cmd,
		stdin:      stdin,
		cgroup:     scriptCgroup(cmd, name),
	}
	h.unitProps.dial = h.Dial
	defer func() {
		if err != nil {
			if cerr := h.Close(); cerr != nil {
				err = fmt.Errorf("%w (and: %v)", err, cerr)
			}
			err = fmt.Errorf("%w\n%s", err, h.Log())
		}
	}()

	if h.ManagerPID, err = readyPID(stdout, "harness.sh", bootTimeout); err != nil {
		return nil, err
	}
	if err := os.Mkdir(h.StateDir, 0o755); err != nil {
		return nil, err
	}

	// The socket exists before systemd has connected to the bus; the bus
	// holds a call to org.freedesktop.systemd1 until it has.
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	if err := h.ping(ctx); err != nil {
		return nil, fmt.Errorf("systemd --user does not answer on %s: %w", h.BusAddress, err)
	}
	return h, nil
}

// ping waits until the manager answers a D-Bus Peer.Ping on its bus.
func (h *Harness) ping(ctx context.Context) error {
	conn, err := h.rawConn(ctx)
	// systemd binds the socket before it listens on it: in between (seen
	// on a loaded machine) a connect is refused. Try again until ctx ends.
	for err != nil && errors.Is(err, syscall.ECONNREFUSED) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
		conn, err = h.rawConn(ctx)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").
		CallWithContext(ctx, "org.freedesktop.DBus.Peer.Ping", 0).Err
}

// rawConn opens a godbus connection to the harness's bus, authenticated and
// introduced by the systemd package's own dialer. ctx bounds the
// connection's whole lifetime.
func (h *Harness) rawConn(ctx context.Context) (*godbus.Conn, error) {
	return systemd.AddressDialer(h.BusAddress)(ctx)
}

// Dial opens a go-systemd connection to this manager through its bus
// address, without touching the process environment. As with every
// systemd.Dialer, ctx bounds the connection's lifetime: cancelling it closes
// the connection. The caller closes the connection.
func (h *Harness) Dial(ctx context.Context) (*sddbus.Conn, error) {
	return systemd.Connect(ctx, systemd.AddressDialer(h.BusAddress))
}

// Log returns the manager's log (manager.log) and the output of its units
// (units.log), plus harness.sh's own errors if it had any, for failure
// messages.
func (h *Harness) Log() string {
	var b strings.Builder
	for _, name := range []string{"manager.log", "units.log", "harness.log"} {
		data, err := os.ReadFile(filepath.Join(h.Dir, name))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(&b, "--- %s: %v\n", name, err)
			continue
		}
		if name == "harness.log" && len(data) == 0 {
			continue
		}
		fmt.Fprintf(&b, "--- %s\n%s", name, data)
		if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// CountReloads subscribes to the manager's Reloading signal and returns a
// function giving the number of completed reloads (Reloading(false)) seen
// since the call. Signals travel on their own connection, so a reload's
// signal may arrive shortly after the Reload call returned: poll.
func (h *Harness) CountReloads(t testing.TB) func() int {
	t.Helper()
	var n atomic.Int64
	h.onSignal(t, "Reloading", func(sig *godbus.Signal) {
		if len(sig.Body) != 1 {
			return
		}
		if active, ok := sig.Body[0].(bool); ok && !active {
			n.Add(1)
		}
	})
	return func() int { return int(n.Load()) }
}

// CountLoads subscribes to the manager's UnitNew signal and returns a
// function giving the number of times systemd loaded a unit since the
// call: it sends UnitNew whenever it creates a unit's object, and it drops
// the object of an inactive unit nothing refers to after every call about
// it (garbage collection), so the next call loads the unit — parses its
// files — again. Poll, as for CountReloads.
func (h *Harness) CountLoads(t testing.TB) func(unit string) int {
	t.Helper()
	var mu sync.Mutex
	n := map[string]int{}
	h.onSignal(t, "UnitNew", func(sig *godbus.Signal) {
		if len(sig.Body) != 2 {
			return
		}
		if unit, ok := sig.Body[0].(string); ok {
			mu.Lock()
			n[unit]++
			mu.Unlock()
		}
	})
	return func(unit string) int {
		mu.Lock()
		defer mu.Unlock()
		return n[unit]
	}
}

// onSignal calls f, on a goroutine of its own, for each signal member of
// the manager's interface from now until the test ends.
func (h *Harness) onSignal(t testing.TB, member string, f func(*godbus.Signal)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := h.rawConn(ctx)
	if err != nil {
		cancel()
		t.Fatalf("subscribe to %s: %v", member, err)
	}
	ch := make(chan *godbus.Signal, 64)
	conn.Signal(ch)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for sig := range ch { // closed when conn closes
			if sig.Name == "org.freedesktop.systemd1.Manager."+member {
				f(sig)
			}
		}
	}()
	t.Cleanup(func() {
		cancel() // closes conn and with it ch
		<-done
	})
	err = conn.AddMatchSignalContext(ctx,
		godbus.WithMatchInterface("org.freedesktop.systemd1.Manager"),
		godbus.WithMatchMember(member))
	if err == nil {
		// Without a subscriber systemd emits no signals on the bus.
		err = conn.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1").
			CallWithContext(ctx, "org.freedesktop.systemd1.Manager.Subscribe", 0).Err
	}
	if err != nil {
		t.Fatalf("subscribe to %s: %v", member, err)
	}
}

// Close stops the manager: it closes the script's stdin, waits for its
// teardown (at most 10 s, then kills it and every process left in the
// harness's cgroups) and checks that the cgroups are gone. It does not
// remove Dir (the test cleanup does, after logging on failure). Close is
// idempotent; Start registers it as a cleanup.
func (h *Harness) Close() error {
	h.closeOnce.Do(func() {
		h.closeConn()

		h.closeErr = stopScript(h.stdin, h.cmd, stopTimeout, "harness.sh", h.cgroup)
	})
	return h.closeErr
}

// stopScript ends a harness script we started: closing its stdin starts its
// teardown; after timeout it is killed by PID. Then whatever is left of its
// cgroup subtree is killed and removed: nothing may outlive a test.
func stopScript(stdin io.Closer, cmd *exec.Cmd, timeout time.Duration, name, cgroup string) error {
	stdin.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var err error
	select {
	case <-done:
	case <-timer.C:
		cmd.Process.Kill() // our own child, by PID
		<-done
		err = fmt.Errorf("%s did not stop within %s; killed it", name, timeout)
	}
	for _, root := range cgroupRoots {
		sub := filepath.Join(root, cgroup)
		if _, serr := os.Stat(sub); serr != nil {
			continue
		}
		if kerr := killTree(sub); kerr != nil {
			err = errors.Join(err, fmt.Errorf("cgroup %s left behind: %w", sub, kerr))
		}
	}
	return err
}

// killTree SIGKILLs every process in the cgroup subtree root (processes the
// harness started: nothing else lives there) and removes the subtree,
// deepest first.
func killTree(root string) error {
	var dirs []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	deadline := time.Now().Add(2 * time.Second)
	for {
		left := 0
		for _, d := range dirs {
			data, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					syscall.Kill(pid, syscall.SIGKILL)
					left++
				}
			}
		}
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- { // WalkDir lists parents first
		if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
