package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentd/agentd/internal/privdir"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
)

const (
	// placeholderPeerURL is the peer URL the single member advertises. Nothing
	// listens there: a single-node etcd has no peers to talk to, and a peer
	// listener would let any local user inject raft messages. It is the
	// address earlier versions listened on, so a member created by them is
	// the same member.
	placeholderPeerURL    = "http://127.0.0.1:2380"
	embedStartTimeout     = 60 * time.Second
	embedTestStartTimeout = 15 * time.Second
	closeGrace            = time.Second
	closeGraceForTests    = 100 * time.Millisecond
	// maxSocketPath is the longest path a unix socket address holds
	// (sun_path is 108 bytes with its terminating NUL).
	maxSocketPath = 107
)

// EmbedConfig configures a single-node etcd running inside the process.
//
// It has no peer listener. Its clients reach it on ClientURL, a unix socket,
// and optionally from other machines on TLSURL, with TLS and
// client-certificate authentication. A plaintext TCP listener exists only
// when asked for by name (InsecureURL), or in tests (ForTests).
type EmbedConfig struct {
	Dir string // data directory (created 0700 if missing)
	// ClientURL is the listener local clients (the agent itself, the CLI)
	// use, and what Endpoint returns: unix:///path/etcd.sock. The socket is
	// made 0600 and its directory must be entered by its owner only (mode
	// 0700 or narrower, owned by this process's user), so only root (or the
	// agent's user) reaches it. With ForTests it may instead be
	// http://<loopback>:port; outside tests a plaintext ClientURL is
	// refused (see InsecureURL).
	ClientURL string
	// TLSURL, when set, is a second client listener, https://host:port (any
	// address; ClientURL must then be a unix socket), with TLS and
	// client-certificate authentication: CertFile and
	// KeyFile are etcd's certificate and key, ClientCAFile the CA that signs
	// the client certificates it accepts. All three are required.
	TLSURL                          string
	CertFile, KeyFile, ClientCAFile string
	// InsecureURL, when set, is a plaintext TCP listener beside the socket,
	// http://<loopback>:port (ClientURL must be a unix socket): every local
	// user can reach it, and through it have units run as root. Only for an
	// operator who asked for it by name (agentd run --embedded-insecure-tcp);
	// the caller warns. InsecureEndpoint returns it. A non-loopback address
	// is refused.
	InsecureURL string
	// PeerURL is ignored: the embedded etcd has no peer listener (it is a
	// single member; a peer listener would let any local user send it raft
	// messages). Kept so that older callers compile.
	PeerURL string
	// ForTests allows port 0, shortens raft timings (TickMs=10,
	// ElectionMs=100) and disables fsync. Never for real data.
	ForTests bool
	// Logger receives etcd's own errors (default: discarded). etcd's
	// info and warning chatter is always dropped.
	Logger *slog.Logger
}

// Embedded is a running in-process etcd.
type Embedded struct {
	etcd             *embed.Etcd
	endpoint         string
	tlsEndpoint      string
	insecureEndpoint string
	grace            time.Duration
	closeOnce        sync.Once
	closing          atomic.Bool // silences etcd's shutdown noise in the log bridge

	mu  sync.Mutex
	gss []*grpc.Server // etcd's client-facing gRPC servers
}

// StartEmbedded starts etcd and waits until it serves clients (up to 60 s,
// 15 s with ForTests, or until ctx is done). Outside tests the URLs must
// have fixed ports so that a restart on the same Dir finds its member
// again; auto-compaction keeps one hour of history.
func StartEmbedded(ctx context.Context, cfg EmbedConfig) (*Embedded, error) {
	if cfg.Dir == "" {
		return nil, errors.New("start embedded etcd: no data directory given")
	}
	l, err := parseEmbedListeners(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	em := &Embedded{grace: closeGrace}
	timeout := embedStartTimeout
	if cfg.ForTests {
		timeout = embedTestStartTimeout
		em.grace = closeGraceForTests
	}
	e, err := embed.StartEtcd(em.etcdConfig(cfg, l))
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", cfg.Dir, err)
	}
	if l.client.Scheme == "unix" {
		// The directory already keeps others out; the socket's own mode
		// is a second lock (connect(2) needs write permission on it).
		if err := os.Chmod(l.client.Path, 0o600); err != nil {
			e.Close()
			return nil, fmt.Errorf("start embedded etcd: %w", err)
		}
	}
	if err := waitReady(ctx, e, timeout); err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", cfg.Dir, err)
	}
	em.etcd = e
	for _, ln := range e.Clients { // in no particular order
		switch {
		case ln.Addr().Network() == "unix":
			em.endpoint = "unix://" + l.client.Path
		case l.client.Scheme == "http":
			em.endpoint = "http://" + ln.Addr().String()
		case l.insecure != nil && isListenerOf(ln.Addr(), l.insecure, l.tls):
			em.insecureEndpoint = "http://" + ln.Addr().String()
		default:
			em.tlsEndpoint = "https://" + ln.Addr().String()
		}
	}
	return em, nil
}

// embedListeners are the client listeners of an embedded etcd, checked:
// the local one (a unix socket, or plaintext TCP in tests), and the TLS
// and plaintext TCP ones beside it (nil when not asked for).
type embedListeners struct {
	client, tls, insecure *url.URL
	tlsInfo               transport.TLSInfo
}

func (l embedListeners) urls() []url.URL {
	urls := []url.URL{*l.client}
	for _, u := range []*url.URL{l.tls, l.insecure} {
		if u != nil {
			urls = append(urls, *u)
		}
	}
	return urls
}

// parseEmbedListeners checks the listeners cfg asks for.
func parseEmbedListeners(cfg EmbedConfig) (embedListeners, error) {
	var l embedListeners
	var err error
	if l.client, err = parseEmbedURL(cfg.ClientURL, cfg.ForTests); err != nil {
		return l, err
	}
	if cfg.TLSURL != "" || cfg.CertFile != "" || cfg.KeyFile != "" || cfg.ClientCAFile != "" {
		if l.tls, err = parseEmbedTLSURL(cfg); err != nil {
			return l, err
		}
		if l.client.Scheme != "unix" {
			return l, errors.New("with a TLS listener the local one must be a unix socket")
		}
		l.tlsInfo = transport.TLSInfo{
			CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.ClientCAFile, ClientCertAuth: true,
		}
	}
	if cfg.InsecureURL != "" {
		if l.insecure, err = parseEmbedInsecureURL(cfg.InsecureURL, cfg.ForTests); err != nil {
			return l, err
		}
		if l.client.Scheme != "unix" {
			return l, errors.New("with a plaintext TCP listener the local one must be a unix socket")
		}
		if l.tls != nil && l.tls.Port() == "0" && l.insecure.Port() == "0" {
			return l, errors.New("port 0 for the TLS or the plaintext TCP listener, not both (their real ports could not be told apart)")
		}
	}
	return l, nil
}

// etcdConfig is the configuration of the embedded etcd: one member
// listening on l, its gRPC servers captured in em and its log in
// cfg.Logger (errors only).
func (em *Embedded) etcdConfig(cfg EmbedConfig, l embedListeners) *embed.Config {
	purl, _ := url.Parse(placeholderPeerURL)
	ec := embed.NewConfig()
	ec.Name = "agentd"
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = l.urls()
	ec.AdvertiseClientUrls = l.urls()
	ec.ClientTLSInfo = l.tlsInfo
	ec.ListenPeerUrls = nil
	ec.AdvertisePeerUrls = []url.URL{*purl}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	// The limits every write is checked against before it is sent
	// (limits.go): MaxTxnOps is raised from etcd's 128 (a put writes each
	// key, its history record and a prune in one transaction); the
	// request size is etcd's default, set here so that the two agree.
	ec.MaxTxnOps = MaxTxnOps
	ec.MaxRequestBytes = MaxRequestBytes
	// Capture the client gRPC servers: etcd's own Close waits ~5 s for
	// open watch and keep-alive streams; Close cuts them after a short
	// grace instead.
	ec.ServiceRegister = func(gs *grpc.Server) {
		em.mu.Lock()
		em.gss = append(em.gss, gs)
		em.mu.Unlock()
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	if cfg.Logger != nil {
		core := &slogCore{log: cfg.Logger.With("component", "etcd"), min: zapcore.ErrorLevel, mute: &em.closing}
		ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(core))
	}
	if cfg.ForTests {
		ec.TickMs, ec.ElectionMs = 10, 100
		ec.UnsafeNoFsync = true
	} else {
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = "1h"
	}
	return ec
}

// waitReady waits until e serves clients, for at most timeout or until
// ctx is done; it closes e when it does not.
func waitReady(ctx context.Context, e *embed.Etcd, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		e.Close()
		return err
	case <-t.C:
		e.Server.Stop()
		e.Close()
		return fmt.Errorf("not ready after %s", timeout)
	case <-ctx.Done():
		e.Server.Stop()
		e.Close()
		return ctx.Err()
	}
}

// isListenerOf reports whether the TCP listener at addr is the one asked
// for by u rather than by other (nil: there is no other): the port asked
// for, or, when u asked for port 0, not other's port.
func isListenerOf(addr net.Addr, u, other *url.URL) bool {
	_, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return false
	}
	if u.Port() != "0" {
		return port == u.Port()
	}
	return other == nil || port != other.Port()
}

// parseEmbedURL checks the local client URL: a unix socket in a private
// directory, or, in tests only, plaintext TCP on a loopback address.
func parseEmbedURL(s string, forTests bool) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("no client URL given (want unix:///path/etcd.sock)")
	}
	if _, ok := strings.CutPrefix(s, "unix://"); ok {
		ep, err := ParseEndpoint(s)
		if err != nil {
			return nil, err
		}
		if len(ep.Path) > maxSocketPath {
			return nil, fmt.Errorf("socket path %s is %d bytes long, more than a unix socket address holds (%d)", ep.Path, len(ep.Path), maxSocketPath)
		}
		if err := privdir.Check(filepath.Dir(ep.Path)); err != nil {
			return nil, fmt.Errorf("socket %s: %w", ep.Path, err)
		}
		if err := checkNotServed(ep.Path); err != nil {
			return nil, err
		}
		return &url.URL{Scheme: "unix", Path: ep.Path}, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	switch {
	case u.Scheme == "https":
		return nil, fmt.Errorf("client URL %q: TLS listeners go in TLSURL (with certificates); the local listener is a unix socket", s)
	case u.Scheme != "http" || u.Port() == "":
		return nil, fmt.Errorf("client URL %q: want unix:///path/etcd.sock", s)
	case !forTests && IsLoopbackHost(u.Host):
		return nil, fmt.Errorf("client URL %q: plaintext TCP would let every local user have units run as root; "+
			"the local listener is a unix socket (a plaintext TCP listener beside it only as InsecureURL, asked for by name)", s)
	}
	return parseEmbedInsecureURL(s, forTests)
}

// parseEmbedInsecureURL checks a plaintext TCP listener:
// http://<loopback>:port, port 0 in tests only.
func parseEmbedInsecureURL(s string, forTests bool) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	switch {
	case u.Scheme != "http" || u.Port() == "" || (u.Path != "" && u.Path != "/"):
		return nil, fmt.Errorf("plaintext TCP listener %q: want http://127.0.0.1:port", s)
	case !IsLoopbackHost(u.Host):
		return nil, fmt.Errorf("plaintext TCP listener %q: a plaintext listener on a non-loopback address would let anyone who reaches it have units run as root: "+
			"use https:// with a server certificate, key and client CA (client-certificate auth), or the default unix socket", s)
	case u.Port() == "0" && !forTests:
		return nil, fmt.Errorf("plaintext TCP listener %q: port 0 only in tests; a restart must find the same port", s)
	}
	u.Path = ""
	return u, nil
}

// parseEmbedTLSURL checks the TLS listener and that its certificates are
// all there.
func parseEmbedTLSURL(cfg EmbedConfig) (*url.URL, error) {
	if cfg.TLSURL == "" {
		return nil, errors.New("TLS certificate, key or client CA given without an https:// listener")
	}
	u, err := url.Parse(cfg.TLSURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "https" || u.Port() == "" || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("TLS listener %q: want https://host:port", cfg.TLSURL)
	}
	if u.Port() == "0" && !cfg.ForTests {
		return nil, fmt.Errorf("TLS listener %q: port 0 only in tests; a restart must find the same port", cfg.TLSURL)
	}
	if cfg.CertFile == "" || cfg.KeyFile == "" || cfg.ClientCAFile == "" {
		return nil, fmt.Errorf("TLS listener %s needs a server certificate, its key and the CA of the client certificates it accepts (client-certificate auth): "+
			"without the CA anyone who reaches it could have units run as root", cfg.TLSURL)
	}
	for _, f := range []string{cfg.CertFile, cfg.KeyFile, cfg.ClientCAFile} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("TLS listener %s: %w", cfg.TLSURL, err)
		}
	}
	u.Path = ""
	return u, nil
}

// checkNotServed refuses a socket path some process still listens on
// (another agent): etcd would remove that socket and take its place.
func checkNotServed(path string) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil // missing, or stale: etcd replaces it
	}
	c.Close()
	return fmt.Errorf("socket %s: another process listens there (another agent with this runtime directory?)", path)
}

// Endpoint is the local client URL actually listened on, e.g.
// "unix:///run/agentd/etcd.sock" (or "http://127.0.0.1:41234" with the real
// port when port 0 was asked for).
func (e *Embedded) Endpoint() string { return e.endpoint }

// TLSEndpoint is the TLS listener's URL with its real port, e.g.
// "https://10.0.0.5:2379"; "" without one.
func (e *Embedded) TLSEndpoint() string { return e.tlsEndpoint }

// InsecureEndpoint is the plaintext TCP listener's URL (InsecureURL) with
// its real port, e.g. "http://127.0.0.1:2379"; "" without one.
func (e *Embedded) InsecureEndpoint() string { return e.insecureEndpoint }

// Close stops etcd. Client streams still open (watches, lease keep-alives)
// get a short grace (1 s, 100 ms with ForTests) and are then cut. Calling
// Close again does nothing.
func (e *Embedded) Close() {
	e.closeOnce.Do(func() {
		e.closing.Store(true)
		e.mu.Lock()
		gss := e.gss
		e.mu.Unlock()
		var wg sync.WaitGroup
		for _, gs := range gss {
			wg.Go(func() {
				done := make(chan struct{})
				go func() {
					gs.GracefulStop()
					close(done)
				}()
				t := time.NewTimer(e.grace)
				defer t.Stop()
				select {
				case <-done:
				case <-t.C:
					gs.Stop()
					<-done
				}
			})
		}
		wg.Wait()
		e.etcd.Close()
	})
}

// slogCore forwards etcd's zap records at or above min to slog.
type slogCore struct {
	log    *slog.Logger
	min    zapcore.Level
	mute   *atomic.Bool
	fields []zapcore.Field
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.min && !c.mute.Load() }

func (c *slogCore) With(fs []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, min: c.min, mute: c.mute, fields: append(append([]zapcore.Field(nil), c.fields...), fs...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fs {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields))
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		attrs = append(attrs, slog.Any(k, enc.Fields[k]))
	}
	lvl := slog.LevelError
	if e.Level < zapcore.ErrorLevel {
		lvl = slog.LevelWarn
	}
	c.log.LogAttrs(context.Background(), lvl, e.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }
