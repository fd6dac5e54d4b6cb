package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/citest"
	"github.com/agentd/agentd/internal/systemdtest"
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
