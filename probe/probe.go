// Package probe runs the agent's health probes on the host: a command, an
// HTTP(S) GET, a TCP connect. Runner implements reconcile.Prober; what an
// answer means (which status is wanted, how many failures make a unit
// unhealthy, the timeout) is reconcile's business, given through ctx.
//
// Every method is safe for concurrent use, returns when ctx ends, and
// leaves nothing running behind it: a command's whole process group is
// killed when ctx ends, and once the command has exited.
package probe

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// Path is the PATH a HealthCmd= runs with, and where a program named
// without a slash is looked up (systemd's default for services).
const Path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Runner runs probes. The zero value is ready to use.
type Runner struct{}

var _ reconcile.Prober = Runner{}

// client is the HTTP client of every probe: no proxy from the
// environment (a probe of 127.0.0.1 through HTTP_PROXY would test the
// proxy), no connection kept between probes (each probe is a fresh
// connection, as a new client's would be), redirects not followed (the
// first answer is judged), and, as Kubernetes' HTTPS probes, no
// verification of the certificate: a probe asks whether the service
// answers, not who it is.
var client = &http.Client{
	Transport: &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// HTTP fetches rawURL with GET and returns the answer's status code. The
// body is read (up to 64 KiB) and dropped.
func (Runner) HTTP(ctx context.Context, rawURL string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("User-Agent", "agentd-health-probe")
	resp, err := client.Do(req)
	if err != nil {
		return 0, cause(err) // the URL is named by the caller
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TCP connects to addr and closes the connection at once.
func (Runner) TCP(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return cause(err) // the address is named by the caller
	}
	return c.Close()
}

// cause strips an error of the URL and address the caller names already:
// "connect: connection refused", not "Get \"http://…\": dial tcp …: connect:
// connection refused".
func cause(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err
	}
	return err
}

// Command runs c.Argv without a shell: the program (an absolute path, or
// a name looked up in Path), as c.User and c.Group when set (the agent
// must then be root, or be that user), in "/", with stdin from /dev/null
// and the environment PATH=Path, HOME, USER and LOGNAME of the user, and
// AGENTD_UNIT=<unit>. It runs in a process group of its own, killed
// (SIGKILL) when ctx ends and once the command exited. A non-zero exit is
// an error naming the status and the first line of its output.
func (Runner) Command(ctx context.Context, c reconcile.ProbeCommand) error {
	if len(c.Argv) == 0 {
		return errors.New("empty command")
	}
	prog, err := lookPath(c.Argv[0])
	if err != nil {
		return err
	}
	as, err := credentials(c.User, c.Group)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, prog, c.Argv[1:]...)
	cmd.Args[0] = c.Argv[0]
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=" + Path, "HOME=" + as.home, "AGENTD_UNIT=" + c.Unit}
	if as.name != "" {
		cmd.Env = append(cmd.Env, "USER="+as.name, "LOGNAME="+as.name)
	}
	out := &headBuffer{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: as.cred}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A child that keeps the output open after the group was killed (it
	// left the group) does not hold the probe past this.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return err
	}
	err = cmd.Wait()
	// What the command left behind in its group goes with it.
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		if line := out.firstLine(); line != "" {
			return fmt.Errorf("%w: %s", err, line)
		}
		return err
	}
	return nil
}

// lookPath finds prog: an absolute path as it is, a bare name in Path.
func lookPath(prog string) (string, error) {
	if strings.Contains(prog, "/") {
		if !filepath.IsAbs(prog) {
			return "", fmt.Errorf("%s: not an absolute path", prog)
		}
		return prog, nil
	}
	for _, dir := range filepath.SplitList(Path) {
		p := filepath.Join(dir, prog)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found in %s", prog, Path)
}

// runAs is whom a command runs as.
type runAs struct {
	cred *syscall.Credential // nil: the agent's own
	name string              // the user's name ("" for the agent's own)
	home string
}

// credentials resolves User= and Group= (names or numeric ids) to the
// credentials a command runs with: the user's uid, the group's gid (else
// the user's primary group) and the user's supplementary groups. Without
// either, the agent's own. A user other than the agent's needs root.
func credentials(userName, groupName string) (runAs, error) {
	if userName == "" && groupName == "" {
		return runAs{home: homeOf(os.Getuid())}, nil
	}
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	as := runAs{home: "/"}
	var groups []uint32
	if userName != "" {
		u, err := lookupUser(userName)
		if err != nil {
			return runAs{}, fmt.Errorf("as User=%s: %w", userName, err)
		}
		id, err1 := strconv.ParseUint(u.Uid, 10, 32)
		g, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return runAs{}, fmt.Errorf("as User=%s: %w", userName, err)
		}
		uid, gid, as.name, as.home = uint32(id), uint32(g), u.Username, u.HomeDir
		if ids, err := u.GroupIds(); err == nil {
			for _, s := range ids {
				if n, err := strconv.ParseUint(s, 10, 32); err == nil {
					groups = append(groups, uint32(n))
				}
			}
		}
	}
	if groupName != "" {
		g, err := lookupGroup(groupName)
		if err != nil {
			return runAs{}, fmt.Errorf("as Group=%s: %w", groupName, err)
		}
		gid = g
	}
	if os.Getuid() != 0 {
		if int(uid) != os.Getuid() || int(gid) != os.Getgid() {
			return runAs{}, fmt.Errorf("cannot run as User=%s Group=%s: the agent runs as uid %d, not root", userName, groupName, os.Getuid())
		}
		return as, nil // the agent's own: nothing to switch
	}
	as.cred = &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}
	if groups == nil {
		as.cred.Groups = []uint32{} // not the agent's (root's) groups
	}
	return as, nil
}

func lookupUser(s string) (*user.User, error) {
	if _, err := strconv.ParseUint(s, 10, 32); err == nil {
		if u, err := user.LookupId(s); err == nil {
			return u, nil
		}
		// A uid with no name, as systemd takes it.
		return &user.User{Uid: s, Gid: s, HomeDir: "/"}, nil
	}
	return user.Lookup(s)
}

func lookupGroup(s string) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(n), nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(g.Gid, 10, 32)
	return uint32(n), err
}

func homeOf(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil && u.HomeDir != "" {
		return u.HomeDir
	}
	return "/"
}

// headBuffer keeps the first max bytes written to it.
type headBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *headBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// firstLine is the first non-blank line of the output, at most 200 bytes.
func (b *headBuffer) firstLine() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	for line := range strings.Lines(b.buf.String()) {
		if line = strings.TrimSpace(line); line != "" {
			if len(line) > 200 {
				line = line[:200] + "…"
			}
			return line
		}
	}
	return ""
}
