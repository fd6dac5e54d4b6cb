package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentd/agentd/internal/citest"
	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/internal/testlog"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/systemd"
	"github.com/agentd/agentd/unitdir"
)

// agentdCLI runs an agentd command line in-process, exactly as typed (no
// flags added), and returns its output and exit code.
func agentdCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.ExecuteContext(t.Context())
	code := exitOK
	if err != nil {
		fmt.Fprintln(&out, "error:", err)
		code = exitError
		var ce *codeError
		if errors.As(err, &ce) {
			code = ce.code
		}
	}
	t.Logf("$ agentd %s\n%s", strings.Join(args, " "), out.String())
	return out.String(), code
}

// runtimeBase makes a directory for a runtime directory that uid 65534 can
// traverse (so that only the runtime directory's own mode keeps it out),
// with a short path (unix socket paths are limited to 107 bytes).
func runtimeBase(t *testing.T) string {
	t.Helper()
	base := registrytest.SocketDir(t)
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	return base
}

func fileMode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// With no flags at all the agent serves its embedded etcd on a unix socket
// in its runtime directory (0700) and the client commands find it there;
// nobody else can connect. An https:// --embedded-listen serves remote
// clients that have a client certificate, and no one else. The state
// directory is 0700 (tightened: the harness made it 0755) and its files
// 0600 even under umask 0.
func TestSecurityEmbeddedAgentNoFlags(t *testing.T) {
	h := systemdtest.Start(t)
	rt := filepath.Join(runtimeBase(t), "agentd") // the agent creates it
	t.Setenv("AGENTD_RUNTIME_DIR", rt)            // the hidden --runtime-dir: /run/agentd is the machine's
	certs := registrytest.WriteCerts(t)
	tlsEP := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	old := syscall.Umask(0) // process-wide; this test is not parallel
	defer syscall.Umask(old)

	o := &runOptions{
		host: "h1", groups: []string{"all"}, unitDir: h.UnitDir, stateDir: h.StateDir,
		debugSocket: filepath.Join(h.Dir, "agentd.sock"), logLevel: "info", leaseTTL: 5 * time.Second,
		embedClient: tlsEP, embedCert: certs.ServerCert, embedKey: certs.ServerKey, embedCA: certs.CA,
		dialSystemd: systemd.AddressDialer(h.BusAddress), logOut: t.Output(),
	}
	o.etcd.prefix, o.etcd.timeout, o.etcd.runtimeDir = registry.DefaultPrefix, 5*time.Second, rt
	ready := make(chan *reconcile.Agent, 1)
	o.ready = ready
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runAgent(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("agent exited at start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not start in 30s")
	}

	unit := filepath.Join(t.TempDir(), "hello.service")
	os.WriteFile(unit, []byte(helloV1), 0o644)
	if _, code := agentdCLI(t, "unit", "put", unit, "--host", "h1", "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("unit put with no flags: exit %d", code)
	}
	if out, code := agentdCLI(t, "unit", "ls"); code != 0 || !strings.Contains(out, "hello.service") {
		t.Fatalf("unit ls with no flags: exit %d", code)
	}
	sock := filepath.Join(rt, etcdSocket)
	for p, want := range map[string]os.FileMode{
		rt: 0o700, sock: 0o600,
		h.StateDir: 0o700, filepath.Join(h.StateDir, "managed.journal.json"): 0o600, filepath.Join(h.StateDir, unitdir.SnapshotFile): 0o600,
		filepath.Join(h.StateDir, "blobs"): 0o700,
	} {
		if got := fileMode(t, p); got != want {
			t.Errorf("%s: mode %04o, want %04o", p, got, want)
		}
	}
	blobs, _ := os.ReadDir(filepath.Join(h.StateDir, "blobs"))
	if len(blobs) == 0 {
		t.Error("no blob kept")
	}
	for _, b := range blobs {
		if got := fileMode(t, filepath.Join(h.StateDir, "blobs", b.Name())); got != 0o600 {
			t.Errorf("blob %s: mode %04o, want 0600", b.Name(), got)
		}
	}
	if got := fileMode(t, filepath.Join(h.UnitDir, "hello.service")); got != 0o644 {
		t.Errorf("unit file: mode %04o, want 0644", got)
	}

	// Remote clients: the TLS listener with the right CA, certificate and
	// key; refused without a client certificate or with another CA's.
	tlsFlags := []string{"--etcd-endpoints", tlsEP, "--etcd-ca", certs.CA, "--etcd-cert", certs.ClientCert, "--etcd-key", certs.ClientKey, "--etcd-dial-timeout", "2s"}
	if out, code := agentdCLI(t, append([]string{"unit", "ls"}, tlsFlags...)...); code != 0 || !strings.Contains(out, "hello.service") {
		t.Fatalf("unit ls over TLS with a client certificate: exit %d", code)
	}
	os.WriteFile(unit, []byte(helloV2), 0o644)
	if _, code := agentdCLI(t, append([]string{"unit", "put", unit, "--host", "h1", "--wait", "--timeout", "30s"}, tlsFlags...)...); code != 0 {
		t.Fatalf("unit put --wait over TLS: exit %d", code)
	}
	if out, code := agentdCLI(t, "unit", "ls", "--etcd-endpoints", tlsEP, "--etcd-ca", certs.CA, "--etcd-dial-timeout", "1s"); code == 0 || !strings.Contains(out, "certificate required") {
		t.Errorf("no client certificate: exit %d, want a refusal saying the certificate is required", code)
	}
	if _, code := agentdCLI(t, "unit", "ls", "--etcd-endpoints", tlsEP, "--etcd-ca", certs.CA, "--etcd-cert", certs.StrangerCert, "--etcd-key", certs.StrangerKey, "--etcd-dial-timeout", "1s"); code == 0 {
		t.Error("a client certificate of another CA was accepted")
	}
	if _, code := agentdCLI(t, "unit", "ls", "--etcd-endpoints", "http://"+strings.TrimPrefix(tlsEP, "https://"), "--etcd-dial-timeout", "1s"); code == 0 {
		t.Error("plaintext http was accepted on the TLS listener")
	}

	// doctor finds the embedded etcd the same way, and measures the clock
	// over the socket.
	d := &runOptions{host: "h1", groups: []string{"all"}}
	d.etcd.prefix, d.etcd.timeout, d.etcd.runtimeDir = registry.DefaultPrefix, 5*time.Second, rt
	checks := checkRegistry(t.Context(), d, true)
	if text := checksText(checks); checks[0].Result != checkOK || !strings.Contains(text, "unix://"+sock) || strings.Contains(text, "cannot measure") {
		t.Errorf("doctor over the socket:\n%s", text)
	}

	assertNobodyDenied(t, sock, false)
}

// A process running as uid 65534 (nobody) cannot connect to the embedded
// etcd's socket, with or without flags: the runtime directory (0700) keeps
// it out, and so does the socket's own mode (0600) when the directory is
// opened up. With both opened up it connects: the modes are what stop it.
func TestSecurityNobodyCannotReachEmbeddedEtcd(t *testing.T) {
	rt := filepath.Join(runtimeBase(t), "agentd")
	if err := unitdir.MkdirPrivate(rt); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(rt, etcdSocket)
	e, err := registry.StartEmbedded(t.Context(), registry.EmbedConfig{Dir: t.TempDir(), ClientURL: "unix://" + sock, ForTests: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	assertNobodyDenied(t, sock, true)
}

// assertNobodyDenied runs this test binary as uid 65534 (see
// TestSecurityHelperProcess) against sock: raw connect(2), the CLI with
// --etcd-endpoints and the CLI with no flags must all get EACCES. With
// control, it also opens the directory (still denied: the socket is 0600),
// then the socket, and checks that the helper then connects.
func assertNobodyDenied(t *testing.T, sock string, control bool) {
	t.Helper()
	citest.NeedRoot(t, "to run a process as uid 65534")
	bin := nobodyCopy(t)
	run := func() string {
		t.Helper()
		cmd := exec.Command(bin, "-test.run=^TestSecurityHelperProcess$")
		cmd.Dir = "/"
		cmd.Env = []string{"AGENTD_SECURITY_HELPER=1", "AGENTD_SECURITY_SOCK=" + sock,
			"AGENTD_RUNTIME_DIR=" + filepath.Dir(sock), "PATH=/usr/bin:/bin", "HOME=/nonexistent"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		out, err := cmd.CombinedOutput()
		t.Logf("as uid 65534:\n%s", out)
		if err != nil {
			t.Fatalf("helper: %v", err)
		}
		return string(out)
	}
	out := run()
	for _, want := range []string{"uid=65534", "connect: EACCES", "cli-endpoint: exit=1 permission denied", "cli-default: exit=1 permission denied"} {
		if !strings.Contains(out, want) {
			t.Errorf("as uid 65534: no %q", want)
		}
	}
	if !control {
		return
	}
	dir := filepath.Dir(sock)
	defer os.Chmod(dir, 0o700)
	defer os.Chmod(sock, 0o600)
	os.Chmod(dir, 0o755)
	if out := run(); !strings.Contains(out, "connect: EACCES") {
		t.Error("with the directory opened up, the socket's 0600 did not keep uid 65534 out")
	}
	os.Chmod(sock, 0o666)
	if out := run(); !strings.Contains(out, "connect: ok") || !strings.Contains(out, "cli-endpoint: exit=0") {
		t.Error("control: with the directory and socket opened up, uid 65534 could not connect: the test proves nothing")
	}
}

// nobodyCopy copies the test binary where uid 65534 can run it (go test
// builds it in a private directory).
func nobodyCopy(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := runtimeBase(t)
	dst := filepath.Join(dir, "agentd.test")
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestSecurityHelperProcess is not a test: assertNobodyDenied runs it as
// uid 65534 to try the embedded etcd's socket, and reads what it prints.
func TestSecurityHelperProcess(t *testing.T) {
	if os.Getenv("AGENTD_SECURITY_HELPER") != "1" {
		return // run only as assertNobodyDenied's helper process
	}
	sock := os.Getenv("AGENTD_SECURITY_SOCK")
	fmt.Printf("uid=%d\n", os.Getuid())
	c, err := net.DialTimeout("unix", sock, 2*time.Second)
	switch {
	case err == nil:
		c.Close()
		fmt.Println("connect: ok")
	case errors.Is(err, syscall.EACCES):
		fmt.Println("connect: EACCES:", err)
	default:
		fmt.Println("connect: other error:", err)
	}
	try := func(name string, args ...string) {
		var out bytes.Buffer
		root := newRoot()
		root.SetArgs(args)
		root.SetOut(&out)
		root.SetErr(&out)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := root.ExecuteContext(ctx)
		code, msg := exitOK, ""
		if err != nil {
			code, msg = exitError, err.Error()
			if strings.Contains(msg, "permission denied") {
				msg = "permission denied: " + msg
			}
		}
		fmt.Printf("%s: exit=%d %s\n", name, code, msg)
	}
	try("cli-endpoint", "unit", "ls", "--etcd-endpoints", "unix://"+sock, "--etcd-dial-timeout", "2s")
	try("cli-default", "unit", "ls", "--etcd-dial-timeout", "2s") // AGENTD_RUNTIME_DIR: the hidden --runtime-dir
}

// The combinations that would send secrets in the clear, leave TLS flags
// unused, or open the embedded etcd to others are refused up front (exit 2),
// with a message that says what to do.
func TestSecurityFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte("x\n"), 0o600)
	local := []string{"--host", "h1", "--state-dir", filepath.Join(dir, "state"), "--unit-dir", filepath.Join(dir, "units"),
		"--debug-socket", filepath.Join(dir, "agentd.sock"), "--runtime-dir", filepath.Join(dir, "run")}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"unit", "ls", "--etcd-endpoints", "http://127.0.0.1:1", "--etcd-ca", "ca.pem"}, nil, "plaintext and would not use them"},
		{[]string{"unit", "ls", "--etcd-endpoints", "http://etcd1:2379", "--etcd-cert", "c", "--etcd-key", "k"}, nil, "use https:// endpoints"},
		{[]string{"hosts", "--etcd-endpoints", "unix:///run/agentd/etcd.sock", "--etcd-ca", "ca.pem"}, nil, "takes no TLS"},
		{[]string{"unit", "ls", "--etcd-ca", "ca.pem"}, nil, "takes no TLS"}, // the default: the local socket
		{[]string{"unit", "ls", "--etcd-endpoints", "http://10.0.0.1:2379", "--etcd-user", "u", "--etcd-password", "p"}, nil, "in plaintext to http://10.0.0.1:2379"},
		{[]string{"unit", "ls", "--etcd-endpoints", "http://10.0.0.1:2379", "--etcd-user", "u"}, map[string]string{"AGENTD_ETCD_PASSWORD": "p"}, "in plaintext"},
		{[]string{"unit", "ls", "--etcd-endpoints", "http://etcd1:2379", "--etcd-user", "u", "--etcd-password-file", pw}, nil, "in plaintext"},
		{[]string{"unit", "ls", "--etcd-endpoints", "https://etcd1:2379", "--etcd-user", "u", "--etcd-password", "p", "--etcd-password-file", pw}, nil, "given twice"},
		{[]string{"unit", "ls", "--etcd-endpoints", "etcd1:2379"}, nil, "want https://host:port"},
		{append([]string{"run", "--embedded-listen", "http://0.0.0.0:2379"}, local...), nil, "non-loopback address"},
		{append([]string{"run", "--embedded-listen", "http://192.168.1.10:2379"}, local...), nil, "--embedded-ca"},
		{append([]string{"run", "--embedded-listen", "https://0.0.0.0:2379"}, local...), nil, "needs --embedded-cert, --embedded-key and --embedded-ca"},
		{append([]string{"run", "--embedded-listen", "https://0.0.0.0:2379", "--embedded-cert", "c", "--embedded-key", "k"}, local...), nil, "client-certificate auth"},
		{append([]string{"run", "--embedded-cert", "c", "--embedded-key", "k", "--embedded-ca", "ca"}, local...), nil, "need an https:// --embedded-listen"},
		{append([]string{"run", "--embedded-listen", "ftp://x:1"}, local...), nil, "want https://ADDR:PORT"},
		{append([]string{"run", "--etcd-endpoints", "http://10.0.0.1:2379", "--etcd-ca", "ca.pem"}, local...), nil, "plaintext"},
		{append([]string{"run", "--etcd-endpoints", "http://10.0.0.1:2379", "--etcd-user", "u", "--etcd-password", "p"}, local...), nil, "in plaintext"},
	} {
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		out, code := agentdCLI(t, c.args...)
		for k := range c.env {
			os.Unsetenv(k) // t.Setenv restores it at the end
		}
		if code != exitUsage || !strings.Contains(out, c.want) {
			t.Errorf("agentd %s: exit %d, want %d and a message saying %q", strings.Join(c.args, " "), code, exitUsage, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "run")); err == nil {
		t.Error("a refused run created its runtime directory")
	}
}

// --etcd-password-file (and AGENTD_ETCD_PASSWORD) against a real etcd
// with authentication enabled, reached over its socket.
func TestSecurityPasswordFile(t *testing.T) {
	rt := filepath.Join(registrytest.SocketDir(t), "agentd")
	if err := unitdir.MkdirPrivate(rt); err != nil {
		t.Fatal(err)
	}
	ep := "unix://" + filepath.Join(rt, etcdSocket)
	e, err := registry.StartEmbedded(t.Context(), registry.EmbedConfig{Dir: t.TempDir(), ClientURL: ep, ForTests: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli := registrytest.RawClient(t, ep)
	for _, step := range []func() error{
		func() error { _, err := cli.RoleAdd(t.Context(), "root"); return err },
		func() error { _, err := cli.UserAdd(t.Context(), "root", "pa55"); return err },
		func() error { _, err := cli.UserGrantRole(t.Context(), "root", "root"); return err },
		func() error { _, err := cli.AuthEnable(t.Context()); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	cli.Close()
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte("pa55\n"), 0o600)
	unit := filepath.Join(dir, "hello.service")
	os.WriteFile(unit, []byte(helloV1), 0o644)
	base := []string{"--etcd-endpoints", ep, "--etcd-user", "root", "--etcd-dial-timeout", "2s"}
	if _, code := agentdCLI(t, append([]string{"unit", "put", unit, "--host", "h1", "--etcd-password-file", pw}, base...)...); code != 0 {
		t.Fatalf("unit put with --etcd-password-file: exit %d", code)
	}
	if out, code := agentdCLI(t, append([]string{"unit", "ls", "--etcd-password-file", pw}, base...)...); code != 0 || !strings.Contains(out, "hello.service") {
		t.Fatalf("unit ls with --etcd-password-file: exit %d", code)
	}
	t.Setenv("AGENTD_ETCD_PASSWORD", "pa55")
	if _, code := agentdCLI(t, append([]string{"unit", "ls"}, base...)...); code != 0 {
		t.Fatalf("unit ls with AGENTD_ETCD_PASSWORD: exit %d", code)
	}
	os.Unsetenv("AGENTD_ETCD_PASSWORD")
	os.WriteFile(pw, []byte("wrong\n"), 0o600)
	if out, code := agentdCLI(t, append([]string{"unit", "ls", "--etcd-password-file", pw}, base...)...); code != exitError || !strings.Contains(out, "authentication failed") {
		t.Errorf("wrong password: exit %d", code)
	}
	if _, code := agentdCLI(t, "unit", "ls", "--etcd-endpoints", ep, "--etcd-dial-timeout", "2s"); code == 0 {
		t.Error("no credentials accepted with auth enabled")
	}
}

// doctor reaches etcd with the one TLS builder the agent and the CLI use:
// its registry and clock checks pass over TLS with the client certificate,
// and fail with the fix to make without it.
func TestSecurityDoctorTLS(t *testing.T) {
	t.Parallel()
	e, certs := registrytest.StartEtcdTLS(t)
	o := &runOptions{host: "h1", groups: []string{"all"}}
	o.etcd.endpoints = []string{e.TLSEndpoint()}
	o.etcd.prefix, o.etcd.timeout = registry.DefaultPrefix, 2*time.Second
	o.etcd.ca, o.etcd.cert, o.etcd.key = certs.CA, certs.ClientCert, certs.ClientKey
	checks := checkRegistry(t.Context(), o, false)
	text := checksText(checks)
	if checks[0].Result != checkOK || !strings.Contains(text, "clock differs from etcd") {
		t.Fatalf("doctor over TLS:\n%s", text)
	}
	o.etcd.cert, o.etcd.key = "", ""
	checks = checkRegistry(t.Context(), o, false)
	if len(checks) != 1 || checks[0].Result != checkFail || !strings.Contains(checks[0].Fix, "--etcd-cert") {
		t.Errorf("doctor without a client certificate:\n%s", checksText(checks))
	}
	o.etcd.endpoints = []string{"http://127.0.0.1:1"}
	o.etcd.ca = certs.CA
	checks = checkRegistry(t.Context(), o, false)
	if len(checks) != 1 || checks[0].Result != checkFail || !strings.Contains(checks[0].Detail, "plaintext") {
		t.Errorf("doctor with TLS flags and an http:// endpoint:\n%s", checksText(checks))
	}
}

// Without --etcd-endpoints a client command reaches the system agent's
// socket as root, the user agent's with --user or as any other user.
func TestSecurityDefaultEndpoints(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/x/run")
	f := &etcdFlags{}
	if got := f.localEndpoint(false); got != "unix:///run/agentd/etcd.sock" {
		t.Errorf("system: %s", got)
	}
	if got := f.localEndpoint(true); got != "unix:///x/run/agentd/etcd.sock" {
		t.Errorf("user: %s", got)
	}
	f.runtimeDir = "/t/rt"
	if got := f.localEndpoint(false); got != "unix:///t/rt/etcd.sock" {
		t.Errorf("--runtime-dir: %s", got)
	}
	if !clientUserMode(true) || clientUserMode(false) != (os.Geteuid() != 0) {
		t.Error("clientUserMode")
	}
	cmd := newRunCmd()
	if fl := cmd.Flags().Lookup("embedded-listen"); fl == nil || fl.DefValue != "" {
		t.Errorf("--embedded-listen default: %+v", fl)
	}
	if fl := cmd.Flags().Lookup("runtime-dir"); fl == nil || !fl.Hidden {
		t.Errorf("--runtime-dir must exist and be hidden: %+v", fl)
	}
}

// The embedded etcd's TCP doors (issue 26, item 4): an https://
// --embedded-listen takes only clients with a certificate of
// --embedded-ca; a plaintext one is refused at start unless
// --embedded-insecure-tcp, and then warned about at every start and by
// doctor. Tried as a local user would: a process running as uid 65534
// (nobody) with etcd's Go client and with curl on etcd's HTTP JSON gateway.

// evilKey is the key a local user tries to write: a unit for h1, which
// its agent would run as root.
const (
	evilKey  = "/agentd/hosts/h1/units/evil.service"
	evilUnit = "[Service]\nType=exec\nExecStart=/bin/sleep 1007\n"
)

// doorAgent runs `agentd run` in-process (runAgent, as the command does)
// on a private systemd, with the embedded etcd (its socket in rt) and the
// --embedded-* settings edit gives; it returns once the agent runs. The
// agent's log goes to logs as well as to the test's output.
type doorAgent struct {
	h    *systemdtest.Harness
	rt   string
	logs *testlog.Buffer
}

func newDoorAgent(t *testing.T) *doorAgent {
	t.Helper()
	return &doorAgent{h: systemdtest.Start(t), rt: filepath.Join(runtimeBase(t), "agentd"), logs: &testlog.Buffer{}}
}

// start runs the agent until the test ends (or the returned stop).
func (d *doorAgent) start(t *testing.T, edit func(o *runOptions)) (stop func()) {
	t.Helper()
	o := &runOptions{
		host: "h1", groups: []string{"all"}, unitDir: d.h.UnitDir, stateDir: d.h.StateDir,
		debugSocket: filepath.Join(d.h.Dir, "agentd.sock"), logLevel: "info", leaseTTL: 5 * time.Second,
		dialSystemd: systemd.AddressDialer(d.h.BusAddress), logOut: io.MultiWriter(t.Output(), d.logs),
	}
	o.etcd.prefix, o.etcd.timeout, o.etcd.runtimeDir = registry.DefaultPrefix, 5*time.Second, d.rt
	edit(o)
	ready := make(chan *reconcile.Agent, 1)
	o.ready = ready
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runAgent(ctx, o) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	select {
	case <-ready:
	case err := <-done:
		stopped = true
		t.Fatalf("agent exited at start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not start in 30s")
	}
	return stop
}

// socket is a client of the embedded etcd over its socket, as root.
func (d *doorAgent) socket(t *testing.T) *clientv3.Client {
	t.Helper()
	cli := registrytest.RawClient(t, "unix://"+filepath.Join(d.rt, etcdSocket))
	return cli
}

// doctorChecks runs doctor's registry checks against the local agent, as
// `agentd doctor` with no etcd flags does.
func (d *doorAgent) doctorChecks(t *testing.T) []check {
	t.Helper()
	o := &runOptions{host: "h1", groups: []string{"all"}}
	o.etcd.prefix, o.etcd.timeout, o.etcd.runtimeDir = registry.DefaultPrefix, 5*time.Second, d.rt
	return checkRegistry(t.Context(), o, true)
}

// gatewayPut is the body of a put through etcd's HTTP JSON gateway
// (POST /v3/kv/put; keys and values base64).
func gatewayPut(key, value string) string {
	enc := base64.StdEncoding.EncodeToString
	return fmt.Sprintf(`{"key":%q,"value":%q}`, enc([]byte(key)), enc([]byte(value)))
}

// asNobody runs this test binary's TestDoorHelperProcess as uid 65534
// against endpoint and returns what it printed.
func asNobody(t *testing.T, endpoint string) string {
	t.Helper()
	citest.NeedRoot(t, "to run a process as uid 65534")
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is needed to try etcd's HTTP gateway as a local user would: apt-get install curl")
	}
	cmd := exec.Command(nobodyCopy(t), "-test.run=^TestDoorHelperProcess$")
	cmd.Dir = "/"
	cmd.Env = []string{"AGENTD_DOOR_HELPER=1", "AGENTD_DOOR_ENDPOINT=" + endpoint, "PATH=/usr/bin:/bin", "HOME=/nonexistent"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	t.Logf("as uid 65534 against %s:\n%s", endpoint, out)
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	if !strings.Contains(string(out), "uid=65534") {
		t.Fatal("the helper did not run as uid 65534")
	}
	return string(out)
}

// TestDoorHelperProcess is not a test: asNobody runs it as uid 65534 to
// write evilKey through the endpoint in $AGENTD_DOOR_ENDPOINT, with no
// credentials: with etcd's Go client (over TLS without a certificate, and
// in plaintext) and with curl on the HTTP JSON gateway. It prints one
// line per try: "<try>: stored" or "<try>: refused <why>".
func TestDoorHelperProcess(t *testing.T) {
	if os.Getenv("AGENTD_DOOR_HELPER") != "1" {
		return // run only as asNobody's helper process
	}
	ep := os.Getenv("AGENTD_DOOR_ENDPOINT")
	u, err := url.Parse(ep)
	if err != nil {
		fmt.Println("bad endpoint:", err)
		return
	}
	fmt.Printf("uid=%d\n", os.Getuid())
	try := func(name string, err error) {
		if err != nil {
			fmt.Printf("%s: refused %s\n", name, strings.ReplaceAll(err.Error(), "\n", " "))
			return
		}
		fmt.Printf("%s: stored\n", name)
	}
	put := func(cfg clientv3.Config) error {
		cfg.DialTimeout, cfg.Logger = time.Second, zap.NewNop()
		cli, err := clientv3.New(cfg)
		if err != nil {
			return err
		}
		defer cli.Close()
		// A refused handshake shows as this deadline (gRPC retries it).
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = cli.Put(ctx, evilKey, evilUnit)
		return err
	}
	if u.Scheme == "https" {
		// An attacker does not care who the server is: no verification.
		noCert := &tls.Config{InsecureSkipVerify: true}
		try("go-client-tls-without-certificate", put(clientv3.Config{Endpoints: []string{ep}, TLS: noCert}))
		// gRPC says only "deadline exceeded": the handshake alone says why.
		try("tls-handshake-without-certificate", func() error {
			c, err := tls.Dial("tcp", u.Host, noCert)
			if err != nil {
				return err
			}
			defer c.Close()
			// TLS 1.3: the server's refusal comes with the first read.
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 1))
			return err
		}())
	}
	try("go-client-plaintext", put(clientv3.Config{Endpoints: []string{"http://" + u.Host}}))
	curl := func(scheme string) error {
		out, err := exec.Command("curl", "-sS", "-k", "--max-time", "3", "-X", "POST",
			scheme+"://"+u.Host+"/v3/kv/put", "-d", gatewayPut(evilKey, evilUnit)).CombinedOutput()
		switch {
		case err != nil:
			return fmt.Errorf("%v: %s", err, out)
		case !strings.Contains(string(out), `"revision"`):
			return fmt.Errorf("no put response: %s", out)
		}
		return nil
	}
	if u.Scheme == "https" {
		try("curl-gateway-tls-without-certificate", curl("https"))
	}
	try("curl-gateway-plaintext", curl("http"))
}

// A plaintext TCP listener is refused at start unless asked for by name,
// with a message that says what to use instead; so are the flags that
// would go unused or open the door wider.
func TestDoorPlaintextTCPRefusedWithoutTheFlag(t *testing.T) {
	dir := t.TempDir()
	local := []string{"--host", "h1", "--state-dir", filepath.Join(dir, "state"), "--unit-dir", filepath.Join(dir, "units"),
		"--debug-socket", filepath.Join(dir, "agentd.sock"), "--runtime-dir", filepath.Join(dir, "run")}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--embedded-listen", "http://127.0.0.1:2379"}, []string{"plaintext TCP lets every local user write units that run as root",
			"use https:// with --embedded-cert, --embedded-key and --embedded-ca", "--embedded-insecure-tcp"}},
		{[]string{"--embedded-listen", "http://localhost:2379"}, []string{"--embedded-insecure-tcp"}},
		{[]string{"--embedded-listen", "http://0.0.0.0:2379", "--embedded-insecure-tcp"}, []string{"non-loopback address"}},
		{[]string{"--embedded-listen", "http://[::]:2379", "--embedded-insecure-tcp"}, []string{"non-loopback address"}},
		{[]string{"--embedded-listen", "http://127.0.0.1:2379/x", "--embedded-insecure-tcp"}, []string{"want https://ADDR:PORT"}},
		{[]string{"--embedded-insecure-tcp"}, []string{"goes with an http://127.0.0.1:PORT --embedded-listen"}},
		{[]string{"--embedded-listen", "https://127.0.0.1:2379", "--embedded-insecure-tcp"}, []string{"goes with an http://"}},
		{[]string{"--etcd-endpoints", "https://etcd1:2379", "--embedded-insecure-tcp"}, []string{"runs only without --etcd-endpoints"}},
		{[]string{"--etcd-endpoints", "https://etcd1:2379", "--embedded-listen", "https://0.0.0.0:2379"}, []string{"runs only without --etcd-endpoints"}},
	} {
		args := append(append([]string{"run"}, c.args...), local...)
		out, code := agentdCLI(t, args...)
		if code != exitUsage {
			t.Errorf("agentd %s: exit %d, want %d", strings.Join(args, " "), code, exitUsage)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("agentd %s: the error does not say %q", strings.Join(args, " "), w)
			}
		}
	}
	t.Setenv("AGENTD_EMBEDDED_LISTEN", "http://127.0.0.1:2379") // as /etc/default/agentd would set it
	if out, code := agentdCLI(t, append([]string{"run"}, local...)...); code != exitUsage || !strings.Contains(out, "--embedded-insecure-tcp") {
		t.Errorf("AGENTD_EMBEDDED_LISTEN=http://…: exit %d", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "run")); err == nil {
		t.Error("a refused run created its runtime directory")
	}
	if _, err := os.Stat(filepath.Join(dir, "state")); err == nil {
		t.Error("a refused run created its state directory")
	}
}

// An https:// --embedded-listen: a local user (uid 65534) without a client
// certificate cannot write through it, with etcd's Go client or with curl
// on the HTTP JSON gateway, over TLS or in plaintext; with the certificate
// curl's same request is stored (the request is right: the certificate is
// what stops the others). doctor sees no plaintext listener.
func TestDoorTLSListenerRefusesClientsWithoutACertificate(t *testing.T) {
	d := newDoorAgent(t)
	certs := registrytest.WriteCerts(t)
	tlsEP := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	d.start(t, func(o *runOptions) {
		o.embedClient, o.embedCert, o.embedKey, o.embedCA = tlsEP, certs.ServerCert, certs.ServerKey, certs.CA
	})
	out := asNobody(t, tlsEP)
	for _, try := range []string{"go-client-tls-without-certificate", "tls-handshake-without-certificate", "go-client-plaintext",
		"curl-gateway-tls-without-certificate", "curl-gateway-plaintext"} {
		if !strings.Contains(out, try+": refused") {
			t.Errorf("as uid 65534, %s was not refused", try)
		}
	}
	if !strings.Contains(out, "tls-handshake-without-certificate: refused remote error: tls: certificate required") {
		t.Error("the TLS handshake without a client certificate was not refused for want of one")
	}
	cli := d.socket(t)
	if resp, err := cli.Get(t.Context(), evilKey); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("%s after the tries without a certificate: %v %v", evilKey, resp, err)
	}

	// Control: curl's same request with the client certificate is stored.
	// (The gateway reaches etcd's gRPC through one of its listeners, picked
	// at random; through the TLS one it presents the server's certificate,
	// which must then be good for client auth too: registrytest's is.)
	ctl, err := exec.Command("curl", "-sS", "--max-time", "5", "--cacert", certs.CA, "--cert", certs.ClientCert, "--key", certs.ClientKey,
		"-X", "POST", tlsEP+"/v3/kv/put", "-d", gatewayPut("/agentd/door-control", "x")).CombinedOutput()
	if err != nil || !strings.Contains(string(ctl), `"revision"`) {
		t.Fatalf("control: curl with the client certificate: %v\n%s", err, ctl)
	}
	if resp, err := cli.Get(t.Context(), "/agentd/door-control"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("control: the certified put is not stored: %v %v", resp, err)
	}

	text := checksText(d.doctorChecks(t))
	if !strings.Contains(text, "no plaintext TCP") || strings.Contains(text, "plaintext TCP at") {
		t.Errorf("doctor with a TLS listener:\n%s", text)
	}
	if strings.Contains(d.logs.String(), "plaintext TCP") {
		t.Error("the agent warned about plaintext TCP it does not serve")
	}
}

// --embedded-insecure-tcp: the door is real (uid 65534 stores a unit with
// curl, and the agent runs it), so the agent warns at every start and
// doctor reports it; the unix socket is still there for root.
func TestDoorInsecureTCPIsWarnedAboutAtEveryStart(t *testing.T) {
	d := newDoorAgent(t)
	plainEP := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	insecure := func(o *runOptions) { o.embedClient, o.embedInsecureTCP = plainEP, true }
	stop := d.start(t, insecure)
	warning := "level=WARN msg=\"" + insecureTCPWarning(plainEP)
	if n := strings.Count(d.logs.String(), warning); n != 1 {
		t.Fatalf("%d warnings after the first start, want 1 (%s)", n, warning)
	}
	var doc *check
	checks := d.doctorChecks(t)
	for i, c := range checks {
		if strings.Contains(c.Detail, "plaintext TCP at "+plainEP) {
			doc = &checks[i]
		}
	}
	if doc == nil || doc.Result != checkWarn || !strings.Contains(doc.Fix, "--embedded-insecure-tcp") {
		t.Fatalf("doctor does not report the plaintext listener as a problem:\n%s", checksText(checks))
	}
	if checks[0].Result != checkOK || !strings.Contains(checks[0].Detail, "unix://") {
		t.Errorf("doctor does not reach the agent over its socket:\n%s", checksText(checks))
	}

	out := asNobody(t, plainEP)
	if !strings.Contains(out, "curl-gateway-plaintext: stored") {
		t.Fatal("as uid 65534, curl could not write through the plaintext listener: the test proves nothing")
	}
	eventually(t, "the agent runs the unit uid 65534 stored", func() bool { return d.h.MainPID(t, "evil.service") != 0 })

	stop()
	d.start(t, insecure)
	if n := strings.Count(d.logs.String(), warning); n != 2 {
		t.Errorf("%d warnings after the second start, want 2", n)
	}
}

// doctor warns of any etcd that serves clients on plaintext TCP, an
// external one too (here a test etcd on loopback http://), and says how to
// close it; over TLS it sees none.
func TestDoctorWarnsOfAPlaintextEtcd(t *testing.T) {
	t.Parallel()
	e := registrytest.StartEtcd(t)
	o := &runOptions{host: "h1", groups: []string{"all"}}
	o.etcd.endpoints = []string{e.Endpoint()}
	o.etcd.prefix, o.etcd.timeout = registry.DefaultPrefix, 5*time.Second
	checks := checkRegistry(t.Context(), o, false)
	found := false
	for _, c := range checks {
		// (A test etcd advertises the port it was asked for: 0.)
		if strings.Contains(c.Detail, "etcd serves clients on plaintext TCP at http://127.0.0.1:") {
			found = c.Result == checkWarn && strings.Contains(c.Fix, "--client-cert-auth")
		}
	}
	if !found {
		t.Errorf("doctor against a plaintext etcd:\n%s", checksText(checks))
	}

	tlsE, certs := registrytest.StartEtcdTLS(t)
	o.etcd.endpoints = []string{tlsE.TLSEndpoint()}
	o.etcd.ca, o.etcd.cert, o.etcd.key = certs.CA, certs.ClientCert, certs.ClientKey
	if text := checksText(checkRegistry(t.Context(), o, false)); !strings.Contains(text, "(no plaintext TCP)") || !strings.Contains(text, "https://127.0.0.1:") {
		t.Errorf("doctor against a TLS etcd:\n%s", text)
	}
}
