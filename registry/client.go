package registry

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

const (
	defaultDialTimeout    = 5 * time.Second
	defaultRequestTimeout = 5 * time.Second
	defaultResyncInterval = 5 * time.Minute
	defaultSessionTTL     = 15 * time.Second
)

// Config says how to reach etcd.
type Config struct {
	Endpoints          []string // e.g. "http://127.0.0.1:2379"; https:// uses TLS
	Prefix             string   // key prefix; DefaultPrefix when empty
	Username, Password string
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
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Dial connects to etcd and checks it with a real round trip, so that a
// wrong endpoint, TLS setup or password fails here rather than later.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("dial etcd: no endpoints given")
	}
	timeout := cfg.DialTimeout
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}
	tlsCfg, err := tlsConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dial etcd: %w", err)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		DialTimeout:          timeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		PermitWithoutStream:  true,
		TLS:                  tlsCfg,
		Username:             cfg.Username,
		Password:             cfg.Password,
		Logger:               zap.NewNop(),
		DialOptions: []grpc.DialOption{
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
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := cli.Get(pctx, c.prefix+"/", clientv3.WithCountOnly()); err != nil {
		cli.Close()
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

func tlsConfig(cfg Config) (*tls.Config, error) {
	if cfg.CertFile == "" && cfg.KeyFile == "" && cfg.CAFile == "" {
		return nil, nil // https:// endpoints still get TLS with system roots
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("TLS: give both a client certificate and its key, or neither")
	}
	info := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CAFile}
	t, err := info.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	return t, nil
}

// Close closes the underlying etcd client.
func (c *Client) Close() error { return c.cli.Close() }

// Prefix returns the key prefix, without a trailing "/".
func (c *Client) Prefix() string { return c.prefix }

// reqCtx bounds one agent-side round trip.
func (c *Client) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.requestTimeout)
}
