package main

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
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
)

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
