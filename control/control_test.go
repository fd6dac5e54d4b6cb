package control

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/rollout"
)

type backend struct{}

func (backend) Statuses() (int64, []reconcile.Status) {
	return 7, []reconcile.Status{{Unit: "a.service"}}
}
func (backend) DryRun(context.Context) ([]reconcile.Action, error) { return nil, nil }
func (backend) Sync(context.Context) ([]reconcile.Action, error)   { return nil, nil }
func (backend) Diff(context.Context, string) ([]reconcile.FileDiff, error) {
	return nil, nil
}

// The debug socket is the agent user's alone (0600) and serves the status
// and the runtime's profiles.
func TestServe(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "run", "agentd.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, sock, "h1", backend{}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	cli := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	get := func(path string) string {
		t.Helper()
		var resp *http.Response
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if resp, err = cli.Get("http://agentd" + path); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s: %s", path, resp.Status, b)
		}
		return string(b)
	}
	if got := get("/v1/status"); !strings.Contains(got, `"host": "h1"`) || !strings.Contains(got, `"revision": 7`) || strings.Contains(got, "rollouts") {
		t.Errorf("status: %s", got)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket: %v, mode %v (want 0600)", err, fi.Mode().Perm())
	}
	if got := get("/debug/pprof/heap?debug=1"); !strings.Contains(got, "heap profile:") {
		t.Errorf("heap profile: %.200s", got)
	}
	if got := get("/debug/pprof/goroutine?debug=1"); !strings.Contains(got, "goroutine profile:") {
		t.Errorf("goroutine profile: %.200s", got)
	}
	var prof bytes.Buffer // gzip-compressed protobuf
	if err := NewClient(sock).Profile(ctx, time.Second, &prof); err != nil || !bytes.HasPrefix(prof.Bytes(), []byte{0x1f, 0x8b}) {
		t.Errorf("CPU profile: %v, %d bytes starting % x", err, prof.Len(), prof.Bytes()[:min(prof.Len(), 4)])
	}
}

// rolloutBackend also tells the rollouts it sees.
type rolloutBackend struct {
	backend
	ris []RolloutInfo
}

func (b rolloutBackend) Rollouts() []RolloutInfo { return b.ris }

// A backend that tells its rollouts has them in the status reply; one
// that does not (an older agent) leaves the field out (above), and the
// client reads no rollout from it.
func TestServeRollouts(t *testing.T) {
	dir := t.TempDir()
	since := time.Date(2025, 12, 4, 10, 0, 0, 0, time.UTC)
	want := []RolloutInfo{{ID: "r1", Group: "web", Units: []string{"web.service"}, State: rollout.Running, Waves: 3, Hosts: 5,
		Soak: 30 * time.Second, HostWave: 2, HostState: rollout.HostSoaking, HostSince: since}}
	for _, c := range []struct {
		name string
		b    Backend
		want []RolloutInfo
	}{{"old", backend{}, nil}, {"new", rolloutBackend{ris: want}, want}} {
		sock := filepath.Join(dir, c.name+".sock")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- Serve(ctx, sock, "h1", c.b) }()
		var r StatusReply
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if r, err = NewClient(sock).Status(ctx); err == nil || time.Now().After(deadline) {
				break
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(r.Rollouts) != len(c.want) || len(c.want) > 0 && !reflect.DeepEqual(r.Rollouts, c.want) {
			t.Errorf("%s agent: rollouts %+v, want %+v", c.name, r.Rollouts, c.want)
		}
	}
}
