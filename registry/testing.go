package registry

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// StartTestEtcd runs a real single-node etcd for a test: temporary data
// directory, random loopback ports, fast raft timings, no fsync. It is
// closed when the test ends.
func StartTestEtcd(t testing.TB) *Embedded {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := StartEmbedded(ctx, EmbedConfig{
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

// NewTestClient dials endpoint (e.g. StartTestEtcd(t).Endpoint()) with the
// default prefix, logging to t. It is closed when the test ends (before the
// etcd it talks to, if that was started earlier in the same test).
func NewTestClient(t testing.TB, endpoint string) *Client {
	t.Helper()
	c, err := Dial(context.Background(), Config{
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
