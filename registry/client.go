package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/agentd/agentd/selector"
)

const (
	defaultDialTimeout    = 5 * time.Second
	defaultRequestTimeout = 5 * time.Second
	defaultResyncInterval = 5 * time.Minute
	defaultSessionTTL     = 15 * time.Second
)

// Config says how to reach etcd.
type Config struct {
	// Endpoints: all https://host:port (TLS), or plaintext http://host:port
	// and unix:///path.sock. See Config.Security for what is refused.
	Endpoints          []string
	Prefix             string // key prefix; DefaultPrefix when empty
	Username, Password string
	PasswordFile       string // read at every Dial; one trailing newline is dropped
	CertFile, KeyFile  string // client certificate (both or neither)
	CAFile             string // CA bundle to verify the server
	// DialTimeout bounds Dial's first round trip (default 5 s).
	DialTimeout time.Duration
	// Logger receives Watch/Session retry messages (default: discarded).
	Logger *slog.Logger
	// ResyncInterval is Watch's periodic full re-read (default 5 min).
	ResyncInterval time.Duration
}

// Client is agentd's view of the registry. Safe for concurrent use.
type Client struct {
	// assumed are selectors KnownHosts counts as recorded (AssumeSelector).
	assumed        map[string]selector.Selector
	cli            *clientv3.Client
	prefix         string
	log            *slog.Logger
	resyncInterval time.Duration
	requestTimeout time.Duration
	// lockProbe is how often Acquire checks, while it waits, that etcd is
	// reachable and its key still there.
	lockProbe time.Duration

	// testAfterRead, when set (tests only), runs in Watch between the
	// full read and the start of the watch.
	testAfterRead func()
	// testNoProgress, when set (tests only), makes Watch never ask etcd
	// for a progress notification, as etcd ignores the request while a
	// watcher of the stream catches up (the catch-up read must do).
	testNoProgress bool
	// testAfterChunk, when set (tests only), runs after the nth chunk of
	// a commit written behind a hold; an error stops the commit there, as
	// a mirror killed would.
	testAfterChunk func(n int) error
	// testAfterKeysRead, when set (tests only), runs in Remove between
	// its read of the keys and its transaction.
	testAfterKeysRead func()
	// settleDelay is settleDelay (watch.go); tests make it long to show
	// that a transaction lands without waiting it out.
	settleDelay time.Duration

	// authName is the etcd user this client would run as with etcd's
	// authentication on: its user name, else its client certificate's
	// common name ("" with neither). EtcdUser asks etcd whether it is on.
	authName string
	authMu   sync.Mutex
	authDone bool
	etcdUser string
}

// Option adjusts a Client built by New.
type Option func(*Client)

// WithLogger sets the logger for retry and resync messages.
func WithLogger(l *slog.Logger) Option {
	return func(c *Client) {
		if l != nil {
			c.log = l
		}
	}
}

// WithResyncInterval sets Watch's periodic full re-read interval.
func WithResyncInterval(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.resyncInterval = d
		}
	}
}

// New wraps an existing etcd client. The Client takes ownership: Close
// closes cli. An empty prefix means DefaultPrefix; a trailing "/" is dropped.
func New(cli *clientv3.Client, prefix string, opts ...Option) *Client {
	prefix = strings.TrimRight(prefix, "/")
	if prefix == "" {
		prefix = DefaultPrefix
	}
	c := &Client{
		cli:            cli,
		prefix:         prefix,
		log:            slog.New(slog.NewTextHandler(io.Discard, nil)),
		resyncInterval: defaultResyncInterval,
		requestTimeout: defaultRequestTimeout,
		lockProbe:      defaultLockProbe,
		settleDelay:    settleDelay,
	}
	if cli != nil { // nil: a Client for key arithmetic only (tests)
		c.authName = cli.Username
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Dial connects to etcd and checks it with a real round trip, so that a
// wrong endpoint, TLS setup or password fails here rather than later.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	sec, err := cfg.Security()
	if err != nil {
		return nil, fmt.Errorf("dial etcd: %w", err)
	}
	timeout := cfg.DialTimeout
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}
	if err := checkSockets(cfg.Endpoints); err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: timeout,
		// Pings only while a stream is open (an agent always has its watch
		// and lease keep-alive): etcd's server refuses pings on an idle
		// connection by default and closes it ("too_many_pings"). The
		// lease keep-alive (every 7.5 s by default) already reads from
		// the connection, so this check pings only when that stalls; it
		// still wakes the process each time it looks, so it looks every
		// 15 s (the default lease TTL), not every 10.
		DialKeepAliveTime:    15 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		TLS:                  sec.TLS,
		Username:             sec.Username,
		Password:             sec.Password,
		Logger:               zap.NewNop(),
		DialOptions: []grpc.DialOption{
			// Fixed flow-control windows: gRPC sizes its dynamic ones with
			// a ping sent when data arrives, so the idle agent's one
			// message, the lease renewal every 7.5 s, cost a second round
			// trip and twice the socket reads (strace, 20 renewals: 89
			// reads → 45). 4 MiB may be in flight, 64× gRPC's starting
			// window; a larger response waits for the agent's reads, a
			// round trip per MiB.
			grpc.WithStaticStreamWindowSize(4 << 20),
			grpc.WithStaticConnWindowSize(4 << 20),
			// gRPC's default reconnect backoff grows to 120 s; an agent
			// must notice a restarted etcd within seconds.
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff: backoff.Config{
					BaseDelay:  100 * time.Millisecond,
					Multiplier: 1.6,
					Jitter:     0.2,
					MaxDelay:   3 * time.Second,
				},
				MinConnectTimeout: timeout,
			}),
		},
	})
	if err != nil {
		return nil, dialError(cfg.Endpoints, timeout, err)
	}
	c := New(cli, cfg.Prefix, WithLogger(cfg.Logger), WithResyncInterval(cfg.ResyncInterval))
	if c.authName == "" && sec.TLS != nil && len(sec.TLS.Certificates) > 0 {
		c.authName = certCommonName(sec.TLS.Certificates[0])
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := cli.Get(pctx, c.prefix+"/", clientv3.WithCountOnly()); err != nil {
		cli.Close()
		if sec.TLS != nil && errors.Is(err, context.DeadlineExceeded) {
			// gRPC hides a failed handshake behind the timeout: say why.
			if why := probeTLS(ctx, cfg.Endpoints, sec.TLS); why != nil {
				err = fmt.Errorf("%w; %w", err, why)
			}
		}
		return nil, dialError(cfg.Endpoints, timeout, err)
	}
	return c, nil
}

func dialError(endpoints []string, timeout time.Duration, err error) error {
	eps := strings.Join(endpoints, ",")
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("etcd at %s unreachable within %s (check --etcd-endpoints and the TLS flags): %w", eps, timeout, err)
	}
	return fmt.Errorf("etcd at %s: %w", eps, err)
}

// checkSockets connects once to each unix:// endpoint when every endpoint
// is one, so that a missing socket or one this user may not reach fails at
// once with the reason, instead of as a dial timeout.
func checkSockets(endpoints []string) error {
	var errs []error
	for _, s := range endpoints {
		ep, err := ParseEndpoint(s)
		if err != nil || ep.Scheme != "unix" {
			return nil
		}
		c, err := net.DialTimeout("unix", ep.Path, 2*time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		switch {
		case errors.Is(err, fs.ErrPermission):
			err = fmt.Errorf("etcd at %s: %w: only root, or the user the agent runs as, may reach an agent's embedded etcd", ep.URL, err)
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED):
			err = fmt.Errorf("etcd at %s: %w: no agent with an embedded etcd runs here", ep.URL, err)
		default:
			err = fmt.Errorf("etcd at %s: %w", ep.URL, err)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// probeTLS shakes hands with each https:// endpoint with t and returns
// the reasons the handshakes failed (unknown authority, certificate
// required or refused, …), or nil if one succeeded or none could be tried.
func probeTLS(ctx context.Context, endpoints []string, t *tls.Config) error {
	var errs []string
	for _, s := range endpoints {
		ep, err := ParseEndpoint(s)
		if err != nil || ep.Scheme != "https" {
			continue
		}
		err = probeOne(ctx, ep.Host, t)
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Sprintf("TLS with %s: %v", ep.URL, err))
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}

func probeOne(ctx context.Context, hostport string, t *tls.Config) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d := tls.Dialer{Config: t}
	conn, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return err
	}
	defer conn.Close()
	// With TLS 1.3 a server refuses the client's certificate after the
	// client's side of the handshake is done: its alert comes with the
	// first read. A server that accepted waits for the client to speak.
	_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		return err
	}
	return nil
}

// certCommonName is the common name of a client certificate: the etcd
// user a request without a token runs as over TLS when etcd's
// authentication is on.
func certCommonName(cert tls.Certificate) string {
	leaf := cert.Leaf
	if leaf == nil && len(cert.Certificate) > 0 {
		leaf, _ = x509.ParseCertificate(cert.Certificate[0])
	}
	if leaf == nil {
		return ""
	}
	return leaf.Subject.CommonName
}

// EtcdUser is the etcd user this client's requests run as: its user name
// (--etcd-user; a password authenticated it), else the common name of its
// client certificate — when etcd's authentication is on. It is "" when
// authentication is off (every request is then anonymous, whatever name
// was given) or the client has neither. etcd is asked once (AuthStatus,
// which any client may call); a failure is returned and asked again next
// time.
func (c *Client) EtcdUser(ctx context.Context) (string, error) {
	if c.authName == "" {
		return "", nil
	}
	c.authMu.Lock()
	defer c.authMu.Unlock()
	if !c.authDone {
		ctx, cancel := c.reqCtx(ctx)
		defer cancel()
		resp, err := c.cli.AuthStatus(ctx)
		if err != nil {
			return "", fmt.Errorf("ask etcd whether authentication is on: %w", err)
		}
		if resp.Enabled {
			c.etcdUser = c.authName
		}
		c.authDone = true
	}
	return c.etcdUser, nil
}

// Close closes the underlying etcd client.
func (c *Client) Close() error { return c.cli.Close() }

// Prefix returns the key prefix, without a trailing "/".
func (c *Client) Prefix() string { return c.prefix }

// reqCtx bounds one agent-side round trip.
func (c *Client) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.requestTimeout)
}
