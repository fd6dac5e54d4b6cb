package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
)

const (
	defaultEmbedClientURL = "http://127.0.0.1:2379"
	defaultEmbedPeerURL   = "http://127.0.0.1:2380"
	embedStartTimeout     = 60 * time.Second
	embedTestStartTimeout = 15 * time.Second
	closeGrace            = time.Second
	closeGraceForTests    = 100 * time.Millisecond
)

// EmbedConfig configures a single-node etcd running inside the process.
type EmbedConfig struct {
	Dir       string // data directory (created 0700 if missing)
	ClientURL string // default http://127.0.0.1:2379
	PeerURL   string // default http://127.0.0.1:2380
	// ForTests allows port 0, shortens raft timings (TickMs=10,
	// ElectionMs=100) and disables fsync. Never for real data.
	ForTests bool
	// Logger receives etcd's own errors (default: discarded). etcd's
	// info and warning chatter is always dropped.
	Logger *slog.Logger
}

// Embedded is a running in-process etcd.
type Embedded struct {
	etcd      *embed.Etcd
	endpoint  string
	grace     time.Duration
	closeOnce sync.Once
	closing   atomic.Bool // silences etcd's shutdown noise in the log bridge

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
	curl, err := parseEmbedURL(cfg.ClientURL, defaultEmbedClientURL, cfg.ForTests)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: client URL: %w", err)
	}
	purl, err := parseEmbedURL(cfg.PeerURL, defaultEmbedPeerURL, cfg.ForTests)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: peer URL: %w", err)
	}
	ec := embed.NewConfig()
	ec.Name = "agentd"
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{*curl}
	ec.AdvertiseClientUrls = []url.URL{*curl}
	ec.ListenPeerUrls = []url.URL{*purl}
	ec.AdvertisePeerUrls = []url.URL{*purl}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	em := &Embedded{grace: closeGrace}
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
	timeout := embedStartTimeout
	if cfg.ForTests {
		ec.TickMs, ec.ElectionMs = 10, 100
		ec.UnsafeNoFsync = true
		timeout = embedTestStartTimeout
		em.grace = closeGraceForTests
	} else {
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = "1h"
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", cfg.Dir, err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("start embedded etcd in %s: %w", cfg.Dir, err)
	case <-t.C:
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("start embedded etcd in %s: not ready after %s", cfg.Dir, timeout)
	case <-ctx.Done():
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("start embedded etcd in %s: %w", cfg.Dir, ctx.Err())
	}
	scheme := "http://"
	if curl.Scheme == "https" {
		scheme = "https://"
	}
	em.etcd, em.endpoint = e, scheme+e.Clients[0].Addr().String()
	return em, nil
}

func parseEmbedURL(s, def string, allowPort0 bool) (*url.URL, error) {
	if s == "" {
		s = def
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" || u.Port() == "" {
		return nil, fmt.Errorf("%q: want http://host:port", s)
	}
	if u.Port() == "0" && !allowPort0 {
		return nil, fmt.Errorf("%q: port 0 only in tests; a restart must find the same port", s)
	}
	return u, nil
}

// Endpoint is the client URL actually listened on (with the real port
// when port 0 was asked for), e.g. "http://127.0.0.1:2379".
func (e *Embedded) Endpoint() string { return e.endpoint }

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
