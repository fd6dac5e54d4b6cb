package registry

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
)

// Security is how a Config reaches etcd, checked: the TLS configuration
// (nil for plaintext http:// and unix:// endpoints) and the credentials.
// Config.Security is the one place where the endpoints, TLS files and
// credentials are checked against each other: the agent (Dial), the
// client commands (Dial) and `agentd doctor` (its /health request) all use it.
type Security struct {
	TLS                *tls.Config
	Username, Password string
}

// Endpoint is one parsed etcd endpoint.
type Endpoint struct {
	URL    string // as given
	Scheme string // "http", "https" or "unix"
	Host   string // host:port ("" for unix)
	Path   string // socket path (unix only)
}

// Loopback reports whether the endpoint never leaves this machine: a unix
// socket, or localhost / a loopback IP address.
func (e Endpoint) Loopback() bool {
	if e.Scheme == "unix" {
		return true
	}
	return IsLoopbackHost(e.Host)
}

// IsLoopbackHost reports whether hostport ("host:port" or "host") names
// this machine only: "localhost" or a loopback IP address. Other names are
// not resolved: they count as remote.
func IsLoopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ParseEndpoint parses an etcd endpoint: http://host:port, https://host:port
// or unix:///absolute/path.sock. A bare host:port is refused: whether it
// means TLS would be a guess.
func ParseEndpoint(s string) (Endpoint, error) {
	if rest, ok := strings.CutPrefix(s, "unix://"); ok {
		if !strings.HasPrefix(rest, "/") || len(rest) < 2 {
			return Endpoint{}, fmt.Errorf("etcd endpoint %q: want unix:///absolute/path", s)
		}
		return Endpoint{URL: s, Scheme: "unix", Path: rest}, nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return Endpoint{}, fmt.Errorf("etcd endpoint %q: want https://host:port, http://host:port or unix:///path", s)
	}
	return Endpoint{URL: s, Scheme: u.Scheme, Host: u.Host}, nil
}

// Validate checks that cfg's settings make sense together, without reading
// any file:
//
//   - endpoints are all https:// (TLS) or all plaintext (http://, unix://);
//   - CAFile, CertFile and KeyFile need https:// endpoints (with http:// or
//     unix:// they would be silently unused); CertFile and KeyFile go together;
//   - a password needs a user name, comes from Password or PasswordFile (not
//     both), and is never sent in plaintext to a non-loopback http:// endpoint.
func (cfg Config) Validate() error {
	_, err := cfg.endpoints()
	return err
}

// endpoints is Validate, returning the parsed endpoints.
func (cfg Config) endpoints() ([]Endpoint, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("no etcd endpoints given")
	}
	eps := make([]Endpoint, 0, len(cfg.Endpoints))
	var secure, plain []string
	for _, s := range cfg.Endpoints {
		ep, err := ParseEndpoint(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		eps = append(eps, ep)
		if ep.Scheme == "https" {
			secure = append(secure, ep.URL)
		} else {
			plain = append(plain, ep.URL)
		}
	}
	if len(secure) > 0 && len(plain) > 0 {
		return nil, fmt.Errorf("etcd endpoints mix TLS (%s) and plaintext (%s): use https:// for all of them",
			strings.Join(secure, ","), strings.Join(plain, ","))
	}
	hasTLSFiles := cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != ""
	if hasTLSFiles && len(plain) > 0 && strings.HasPrefix(plain[0], "unix://") {
		return nil, fmt.Errorf("TLS settings (--etcd-ca, --etcd-cert, --etcd-key) given, but %s is a local socket, which takes no TLS: drop the TLS settings, or give https:// endpoints", plain[0])
	}
	if hasTLSFiles && len(plain) > 0 {
		return nil, fmt.Errorf("TLS settings (--etcd-ca, --etcd-cert, --etcd-key) given, but %s is plaintext and would not use them: use https:// endpoints, or drop the TLS settings", plain[0])
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("TLS: give both a client certificate (--etcd-cert) and its key (--etcd-key), or neither")
	}
	if cfg.Password != "" && cfg.PasswordFile != "" {
		return nil, errors.New("etcd password given twice (--etcd-password or AGENTD_ETCD_PASSWORD, and --etcd-password-file): give one")
	}
	if (cfg.Password != "" || cfg.PasswordFile != "") && cfg.Username == "" {
		return nil, errors.New("etcd password given without a user name (--etcd-user)")
	}
	if cfg.Password != "" || cfg.PasswordFile != "" {
		for _, ep := range eps {
			if ep.Scheme == "http" && !ep.Loopback() {
				return nil, fmt.Errorf("refusing to send the etcd password in plaintext to %s: use https:// endpoints", ep.URL)
			}
		}
	}
	return eps, nil
}

// Security checks cfg (Validate) and builds its TLS configuration and
// credentials, reading the CA bundle, the client certificate and the
// password file. https:// endpoints without CAFile verify etcd against the
// system roots.
func (cfg Config) Security() (*Security, error) {
	eps, err := cfg.endpoints()
	if err != nil {
		return nil, err
	}
	sec := &Security{Username: cfg.Username, Password: cfg.Password}
	if cfg.PasswordFile != "" {
		b, err := os.ReadFile(cfg.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("etcd password file: %w", err)
		}
		sec.Password = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if sec.Password == "" {
			return nil, fmt.Errorf("etcd password file %s is empty", cfg.PasswordFile)
		}
	}
	if eps[0].Scheme != "https" {
		return sec, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS: CA bundle: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS: CA bundle %s: no PEM certificate found", cfg.CAFile)
		}
		t.RootCAs = pool
	}
	if cfg.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("TLS: client certificate: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	sec.TLS = t
	return sec, nil
}
