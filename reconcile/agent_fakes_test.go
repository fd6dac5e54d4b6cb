// The agent's test fakes and helpers: a recording systemd, state
// directories in t.TempDir, and waits for calls and statuses.

package reconcile_test

import (
	"context"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/unitdir"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeSystemd records calls; units become active when started. For fast
// tests of the loop's ordering; the real behaviour is tested against a real
// systemd in cmd/agentd and systemd/.
type fakeSystemd struct {
	mu     sync.Mutex
	calls  []string
	active map[string]bool
}

func (f *fakeSystemd) rec(c string) {
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
}

func (f *fakeSystemd) Reload(context.Context) error { f.rec("daemon-reload"); return nil }

func (f *fakeSystemd) Start(_ context.Context, u string) error {
	f.rec("start " + u)
	f.mu.Lock()
	f.active[u] = true
	f.mu.Unlock()
	return nil
}

func (f *fakeSystemd) Stop(_ context.Context, u string) error {
	f.rec("stop " + u)
	f.mu.Lock()
	f.active[u] = false
	f.mu.Unlock()
	return nil
}

func (f *fakeSystemd) Restart(_ context.Context, u string) error { f.rec("restart " + u); return nil }

func (f *fakeSystemd) ReloadUnit(_ context.Context, u string) error { f.rec("reload " + u); return nil }

func (f *fakeSystemd) Enable(_ context.Context, u ...string) error {
	f.rec("enable " + strings.Join(u, " "))
	return nil
}

func (f *fakeSystemd) Disable(_ context.Context, u ...string) error {
	f.rec("disable " + strings.Join(u, " "))
	return nil
}

func (f *fakeSystemd) ResetFailed(_ context.Context, u string) error {
	f.rec("reset-failed " + u)
	return nil
}

func (f *fakeSystemd) State(_ context.Context, u string) (reconcile.UnitState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.active[u] {
		return reconcile.UnitState{LoadState: "loaded", ActiveState: "active", SubState: "running", Ran: true}, nil
	}
	return reconcile.UnitState{LoadState: "loaded", ActiveState: "inactive", SubState: "dead"}, nil
}

func (f *fakeSystemd) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func newAgent(t *testing.T) (*reconcile.Agent, *fakeSystemd, *unitdir.Dir) {
	t.Helper()
	files, m, _ := testDirs(t)
	sd := &fakeSystemd{active: map[string]bool{}}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true})
	return a, sd, files
}

// testDirs opens a unit directory and a state directory in temp dirs; the
// state directory's path comes back too.
func testDirs(t *testing.T) (*unitdir.Dir, *unitdir.Manifest, string) {
	t.Helper()
	files, err := unitdir.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	m, err := unitdir.OpenManifest(state)
	if err != nil {
		t.Fatal(err)
	}
	return files, m, state
}

const unitA = "[Service]\nExecStart=/bin/sleep 1\n[X-Agentd]\nHealthySec=0\n"

func snapshot(units ...string) reconcile.Snapshot {
	var es []reconcile.Entry
	for _, u := range units {
		es = append(es, reconcile.Entry{Scope: reconcile.ScopeHost, Unit: u, Value: []byte(unitA)})
	}
	return reconcile.Snapshot{Revision: 7, Entries: es}
}

func runAgent(t *testing.T, a *reconcile.Agent) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func waitCalls(t *testing.T, sd *fakeSystemd, n int) []string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(sd.Calls()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("calls = %v, want %d", sd.Calls(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // and no more than that
	return sd.Calls()
}

func waitStatuses(t *testing.T, a *reconcile.Agent, ok func([]reconcile.Status) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, st := a.Statuses()
		if ok(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("statuses never came: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
