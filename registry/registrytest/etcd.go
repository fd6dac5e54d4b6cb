// Package registrytest starts real etcd servers and clients for tests: a
// single-node etcd in a temporary directory (StartEtcd), one behind TLS with
// fresh certificates (StartEtcdTLS, WriteCerts), and a client dialled to
// either: the registry's (NewClient), or a bare etcd client for what a test
// does behind the registry's back (RawClient, RawClientConfig). Everything
// it starts is stopped when the test ends.
//
// It lives outside package registry so the agent binary does not link it.
// The registry package's own tests reach it through registry/bridge_test.go.
package registrytest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentd/agentd/registry"
)

// StartEtcd runs a real single-node etcd for a test: temporary data
// directory, random loopback ports, fast raft timings, no fsync. It is
// closed when the test ends.
func StartEtcd(t testing.TB) *registry.Embedded {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := registry.StartEmbedded(ctx, registry.EmbedConfig{
		Dir:       t.TempDir(),
		ClientURL: "http://127.0.0.1:0",
		PeerURL:   "http://127.0.0.1:0",
		ForTests:  true,
	})
	if err != nil {
		t.Fatalf("start test etcd: %v", err)
	}
	t.Cleanup(e.Close)
	return e
}

// NewClient dials endpoint (e.g. StartEtcd(t).Endpoint()) with the
// default prefix, logging to t. It is closed when the test ends (before the
// etcd it talks to, if that was started earlier in the same test).
func NewClient(t testing.TB, endpoint string) *registry.Client {
	t.Helper()
	c, err := registry.Dial(context.Background(), registry.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 10 * time.Second,
		Logger:      slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("dial test etcd: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// RawClient dials a bare etcd client to endpoint, for a test that reads or
// writes keys behind the registry's back (an operator's etcdctl, a
// compaction, a user with other rights). It is closed when the test ends.
func RawClient(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	return RawClientConfig(t, clientv3.Config{Endpoints: []string{endpoint}})
}

// RawClientConfig is RawClient with more settings (credentials, TLS): a
// zero DialTimeout becomes 5 s and a nil Logger a silent one. It is closed
// when the test ends.
func RawClientConfig(t testing.TB, cfg clientv3.Config) *clientv3.Client {
	t.Helper()
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("dial test etcd %v: %v", cfg.Endpoints, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
