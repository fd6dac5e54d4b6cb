package registry

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Config.Validate refuses the settings that would silently go unused or
// leak a password, with a message that says what to do.
func TestSecurityValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want string // "" = valid
	}{
		{"unix", Config{Endpoints: []string{"unix:///run/agentd/etcd.sock"}}, ""},
		{"http loopback", Config{Endpoints: []string{"http://127.0.0.1:2379"}}, ""},
		{"https with TLS", Config{Endpoints: []string{"https://etcd1:2379", "https://etcd2:2379"}, CAFile: "ca", CertFile: "c", KeyFile: "k"}, ""},
		{"https with system roots", Config{Endpoints: []string{"https://etcd1:2379"}}, ""},
		{"password on https", Config{Endpoints: []string{"https://etcd1:2379"}, Username: "u", Password: "p"}, ""},
		{"password on unix", Config{Endpoints: []string{"unix:///s"}, Username: "u", Password: "p"}, ""},
		{"password on http loopback", Config{Endpoints: []string{"http://localhost:2379", "http://[::1]:2379"}, Username: "u", Password: "p"}, ""},

		{"no endpoints", Config{}, "no etcd endpoints"},
		{"bare address", Config{Endpoints: []string{"10.0.0.1:2379"}}, "want https://host:port"},
		{"unknown scheme", Config{Endpoints: []string{"ftp://x:1"}}, "want https://host:port"},
		{"relative unix path", Config{Endpoints: []string{"unix://etcd.sock"}}, "unix:///absolute/path"},
		{"mixed", Config{Endpoints: []string{"https://a:2379", "http://b:2379"}}, "mix TLS"},
		{"CA with http", Config{Endpoints: []string{"http://10.0.0.1:2379"}, CAFile: "ca"}, "plaintext and would not use them"},
		{"cert with http loopback", Config{Endpoints: []string{"http://127.0.0.1:2379"}, CertFile: "c", KeyFile: "k"}, "use https:// endpoints"},
		{"CA with unix", Config{Endpoints: []string{"unix:///s"}, CAFile: "ca"}, "takes no TLS"},
		{"cert without key", Config{Endpoints: []string{"https://a:2379"}, CertFile: "c"}, "both a client certificate"},
		{"password on http remote", Config{Endpoints: []string{"http://10.0.0.1:2379"}, Username: "u", Password: "p"}, "in plaintext to http://10.0.0.1:2379"},
		{"password file on http remote", Config{Endpoints: []string{"http://etcd1:2379"}, Username: "u", PasswordFile: "f"}, "in plaintext"},
		{"password twice", Config{Endpoints: []string{"https://a:2379"}, Username: "u", Password: "p", PasswordFile: "f"}, "given twice"},
		{"password without user", Config{Endpoints: []string{"https://a:2379"}, Password: "p"}, "without a user name"},
	} {
		err := c.cfg.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// Security reads the password file (dropping one trailing newline) and
// builds the TLS configuration only for https:// endpoints.
func TestSecurityBuild(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte("s3cret\n"), 0o600)
	sec, err := Config{Endpoints: []string{"unix:///s"}, Username: "u", PasswordFile: pw}.Security()
	if err != nil || sec.Password != "s3cret" || sec.Username != "u" || sec.TLS != nil {
		t.Fatalf("password file: %+v %v", sec, err)
	}
	os.WriteFile(pw, []byte("\n"), 0o600)
	if _, err := (Config{Endpoints: []string{"unix:///s"}, Username: "u", PasswordFile: pw}).Security(); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty password file: %v", err)
	}
	if _, err := (Config{Endpoints: []string{"unix:///s"}, Username: "u", PasswordFile: filepath.Join(dir, "missing")}).Security(); err == nil {
		t.Error("missing password file accepted")
	}
	certs := WriteTestCerts(t)
	sec, err = Config{Endpoints: []string{"https://127.0.0.1:2379"}, CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}.Security()
	if err != nil || sec.TLS == nil || sec.TLS.RootCAs == nil || len(sec.TLS.Certificates) != 1 {
		t.Fatalf("TLS: %+v %v", sec, err)
	}
	if _, err := (Config{Endpoints: []string{"https://a:1"}, CAFile: pw}).Security(); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("CA file without a certificate: %v", err)
	}
}

// A real etcd with TLS and client-certificate auth: reachable with the
// right CA, certificate and key; refused without a client certificate, with
// one from another CA, and without the CA.
func TestSecurityTLSEtcd(t *testing.T) {
	t.Parallel()
	e, certs := StartTestEtcdTLS(t)
	ep := e.TLSEndpoint()
	if !strings.HasPrefix(ep, "https://127.0.0.1:") || !strings.HasPrefix(e.Endpoint(), "unix:///") {
		t.Fatalf("endpoints %q, %q", e.Endpoint(), ep)
	}
	dial := func(cfg Config) error {
		cfg.Endpoints, cfg.DialTimeout = []string{ep}, time.Second
		c, err := Dial(t.Context(), cfg)
		if err == nil {
			_, err = c.List(t.Context(), nil)
			c.Close()
		}
		return err
	}
	if err := dial(Config{CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}); err != nil {
		t.Fatalf("with CA, certificate and key: %v", err)
	}
	for name, c := range map[string]struct {
		cfg  Config
		want string // the reason Dial gives
	}{
		"no client certificate":     {Config{CAFile: certs.CA}, "certificate required"},
		"certificate of another CA": {Config{CAFile: certs.CA, CertFile: certs.StrangerCert, KeyFile: certs.StrangerKey}, "certificate required"}, // Go offers only a certificate of a CA the server names
		"no CA (system roots)":      {Config{CertFile: certs.ClientCert, KeyFile: certs.ClientKey}, "x509"},
		"wrong CA":                  {Config{CAFile: certs.StrangerCA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}, "x509"},
	} {
		err := dial(c.cfg)
		switch {
		case err == nil:
			t.Errorf("%s: connected", name)
		case !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: refused, but the error does not say %q: %v", name, c.want, err)
		default:
			t.Logf("%s: refused: %v", name, err)
		}
	}
	if c, err := Dial(t.Context(), Config{Endpoints: []string{"http://" + strings.TrimPrefix(ep, "https://")}, DialTimeout: time.Second}); err == nil {
		c.Close()
		t.Error("plaintext http to the TLS port: connected")
	}
	// The local socket needs no certificate: only the owner reaches it.
	c := NewTestClient(t, e.Endpoint())
	if _, err := c.List(t.Context(), nil); err != nil {
		t.Fatalf("unix socket: %v", err)
	}
}

// --etcd-password-file against a real etcd with authentication enabled.
func TestSecurityPasswordFileAuth(t *testing.T) {
	t.Parallel()
	dir := TestSocketDir(t)
	e, err := StartEmbedded(ctxT(t), EmbedConfig{Dir: t.TempDir(), ClientURL: "unix://" + filepath.Join(dir, "etcd.sock"), ForTests: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	enableAuth(t, e.Endpoint(), "root", "pa55")
	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("pa55\n"), 0o600)
	c, err := Dial(t.Context(), Config{Endpoints: []string{e.Endpoint()}, Username: "root", PasswordFile: pw})
	if err != nil {
		t.Fatalf("with the password file: %v", err)
	}
	if _, err := c.Put(t.Context(), Target{Host: "h1"}, map[string][]byte{"a.service": []byte("[Service]\nExecStart=/bin/true\n")}); err != nil {
		t.Fatalf("put as root: %v", err)
	}
	c.Close()
	os.WriteFile(pw, []byte("wrong\n"), 0o600)
	if c, err := Dial(t.Context(), Config{Endpoints: []string{e.Endpoint()}, Username: "root", PasswordFile: pw}); err == nil {
		c.Close()
		t.Error("wrong password accepted")
	} else if !strings.Contains(err.Error(), "authentication failed") {
		t.Errorf("wrong password: %v", err)
	}
	if c, err := Dial(t.Context(), Config{Endpoints: []string{e.Endpoint()}, DialTimeout: 2 * time.Second}); err == nil {
		c.Close()
		t.Error("no credentials accepted with auth enabled")
	}
}

// enableAuth creates user (with the root role) and turns authentication on.
func enableAuth(t *testing.T, endpoint, user, password string) {
	t.Helper()
	cli := RawTestClient(t, endpoint)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := cli.RoleAdd(ctx, "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserAdd(ctx, user, password); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, user, "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
}
