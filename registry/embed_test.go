package registry

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The embedded etcd serves its clients on a unix socket (0600, in a 0700
// directory) and opens no peer listener and no TCP port at all; a restart
// on the same data directory keeps the data, also when an earlier version
// served it on loopback TCP.
func TestEmbeddedUnixSocket(t *testing.T) {
	t.Parallel()
	dir, data := TestSocketDir(t), t.TempDir()
	sock := filepath.Join(dir, "etcd.sock")
	old, err := StartEmbedded(ctxT(t), EmbedConfig{Dir: data, ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), ForTests: true})
	if err != nil {
		t.Fatal(err)
	}
	c := NewTestClient(t, old.Endpoint())
	mustPut(t, c, Target{Host: "h1"}, "a.service", "A")
	c.Close()
	old.Close()

	start := time.Now()
	e, err := StartEmbedded(ctxT(t), EmbedConfig{Dir: data, ClientURL: "unix://" + sock, PeerURL: "http://127.0.0.1:0", ForTests: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	t.Logf("ready on the socket in %s", time.Since(start).Round(time.Millisecond))
	if e.Endpoint() != "unix://"+sock || e.TLSEndpoint() != "" {
		t.Fatalf("endpoints %q %q", e.Endpoint(), e.TLSEndpoint())
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket: %v %v", fi.Mode(), err)
	}
	if len(e.etcd.Peers) != 0 {
		t.Errorf("%d peer listener(s), want none", len(e.etcd.Peers))
	}
	for _, l := range e.etcd.Clients {
		if l.Addr().Network() != "unix" {
			t.Errorf("client listener on %s %s, want only the socket", l.Addr().Network(), l.Addr())
		}
	}
	c = NewTestClient(t, e.Endpoint())
	if b, err := c.Get(t.Context(), Target{Host: "h1"}, "a.service"); err != nil || string(b) != "A" {
		t.Fatalf("data after the restart on the socket: %q %v", b, err)
	}
	// A second etcd on the same socket would remove it and take its place.
	_, err = StartEmbedded(ctxT(t), EmbedConfig{Dir: t.TempDir(), ClientURL: "unix://" + sock, ForTests: true})
	if err == nil || !strings.Contains(err.Error(), "another process listens") {
		t.Errorf("second etcd on a live socket: %v", err)
	}
	if _, err := c.Get(t.Context(), Target{Host: "h1"}, "a.service"); err != nil {
		t.Errorf("the first etcd lost its socket: %v", err)
	}
}

// Listeners other users could reach are refused with a clear error.
func TestEmbeddedRefusesOpenListeners(t *testing.T) {
	t.Parallel()
	open := t.TempDir()
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	certs := WriteTestCerts(t)
	long := "/" + strings.Repeat("x", 120) + "/etcd.sock"
	for name, c := range map[string]struct {
		cfg  EmbedConfig
		want string
	}{
		"no client URL":          {EmbedConfig{}, "no client URL"},
		"socket in an open dir":  {EmbedConfig{ClientURL: "unix://" + filepath.Join(open, "etcd.sock")}, "mode 0755"},
		"socket path too long":   {EmbedConfig{ClientURL: "unix://" + long}, "more than a unix socket address holds"},
		"plaintext on all":       {EmbedConfig{ClientURL: "http://0.0.0.0:2379"}, "non-loopback"},
		"plaintext on a LAN IP":  {EmbedConfig{ClientURL: "http://10.1.2.3:2379"}, "non-loopback"},
		"https as the local one": {EmbedConfig{ClientURL: "https://127.0.0.1:2379"}, "TLSURL"},
		"TLS without client CA": {EmbedConfig{ClientURL: "unix://" + filepath.Join(TestSocketDir(t), "s"), TLSURL: "https://0.0.0.0:2379",
			CertFile: certs.ServerCert, KeyFile: certs.ServerKey}, "client-certificate auth"},
		"certificates without TLS URL": {EmbedConfig{ClientURL: "unix://" + filepath.Join(TestSocketDir(t), "s"),
			CertFile: certs.ServerCert, KeyFile: certs.ServerKey, ClientCAFile: certs.CA}, "without an https:// listener"},
		"TLS next to plaintext TCP": {EmbedConfig{ClientURL: "http://127.0.0.1:2379", TLSURL: "https://0.0.0.0:2379",
			CertFile: certs.ServerCert, KeyFile: certs.ServerKey, ClientCAFile: certs.CA, ForTests: true}, "must be a unix socket"},
		"plaintext loopback outside tests": {EmbedConfig{ClientURL: "http://127.0.0.1:2379"}, "every local user have units run as root"},
		"insecure listener on all": {EmbedConfig{ClientURL: "unix://" + filepath.Join(TestSocketDir(t), "s"), InsecureURL: "http://0.0.0.0:2379"},
			"non-loopback"},
		"insecure listener as https": {EmbedConfig{ClientURL: "unix://" + filepath.Join(TestSocketDir(t), "s"), InsecureURL: "https://127.0.0.1:2379"},
			"want http://127.0.0.1:port"},
		"insecure listener port 0 outside tests": {EmbedConfig{ClientURL: "unix://" + filepath.Join(TestSocketDir(t), "s"), InsecureURL: "http://127.0.0.1:0"},
			"port 0 only in tests"},
		"insecure listener next to plaintext TCP": {EmbedConfig{ClientURL: "http://127.0.0.1:2379", InsecureURL: "http://127.0.0.1:2380", ForTests: true},
			"must be a unix socket"},
		"insecure and TLS listeners both on port 0": {EmbedConfig{ClientURL: "unix://" + filepath.Join(TestSocketDir(t), "s"), InsecureURL: "http://127.0.0.1:0",
			TLSURL: "https://127.0.0.1:0", CertFile: certs.ServerCert, KeyFile: certs.ServerKey, ClientCAFile: certs.CA, ForTests: true}, "not both"},
		"TLS port 0 outside tests": {EmbedConfig{ClientURL: "unix://" + filepath.Join(TestSocketDir(t), "s"), TLSURL: "https://0.0.0.0:0",
			CertFile: certs.ServerCert, KeyFile: certs.ServerKey, ClientCAFile: certs.CA}, "port 0 only in tests"},
	} {
		c.cfg.Dir = t.TempDir()
		e, err := StartEmbedded(ctxT(t), c.cfg)
		if err == nil {
			e.Close()
			t.Errorf("%s: started", name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not say %q", name, err, c.want)
		}
	}
}

// A client on a missing socket is told at once that no agent runs there.
func TestEmbeddedSocketMissing(t *testing.T) {
	t.Parallel()
	ep := "unix://" + filepath.Join(TestSocketDir(t), "etcd.sock")
	start := time.Now()
	_, err := Dial(t.Context(), Config{Endpoints: []string{ep}})
	if err == nil || !strings.Contains(err.Error(), "no agent with an embedded etcd runs here") {
		t.Fatalf("dial a missing socket: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("took %s, want an immediate answer", d)
	}
}

// The three listeners together: the socket, the TLS listener (client
// certificates only) and the plaintext one asked for by name; each
// endpoint is reported with its real port, the plaintext one takes writes
// with no credentials at all (the door it is), the TLS one refuses a
// client without a certificate, and etcd advertises all three (what
// doctor reads).
func TestEmbeddedInsecureListenerBesideTheOthers(t *testing.T) {
	t.Parallel()
	certs := WriteTestCerts(t)
	sock := filepath.Join(TestSocketDir(t), "etcd.sock")
	insecure := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	e, err := StartEmbedded(ctxT(t), EmbedConfig{
		Dir: t.TempDir(), ClientURL: "unix://" + sock, InsecureURL: insecure,
		TLSURL: "https://127.0.0.1:0", CertFile: certs.ServerCert, KeyFile: certs.ServerKey, ClientCAFile: certs.CA,
		ForTests: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	if e.Endpoint() != "unix://"+sock || e.InsecureEndpoint() != insecure || !strings.HasPrefix(e.TLSEndpoint(), "https://127.0.0.1:") || strings.HasSuffix(e.TLSEndpoint(), ":0") {
		t.Fatalf("endpoints: %q %q %q", e.Endpoint(), e.InsecureEndpoint(), e.TLSEndpoint())
	}
	plain := NewTestClient(t, e.InsecureEndpoint())
	mustPut(t, plain, Target{Host: "h1"}, "a.service", "A")
	urls, err := plain.ClientURLs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(urls, " "); !strings.Contains(got, "unix://"+sock) || !strings.Contains(got, insecure) || !strings.Contains(got, "https://127.0.0.1:") {
		t.Errorf("advertised client URLs %q", got)
	}
	_, err = Dial(t.Context(), Config{Endpoints: []string{e.TLSEndpoint()}, CAFile: certs.CA, DialTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("TLS without a client certificate: %v", err)
	}
}
