package reconcile_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// urlProber answers each URL with the status the test set for it, and
// hangs every command until its context ends.
type urlProber struct {
	mu      sync.Mutex
	codes   map[string]int
	started chan string // a command began (buffered)
}

func (p *urlProber) set(url string, code int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.codes[url] = code
}

func (p *urlProber) HTTP(_ context.Context, url string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.codes[url]; ok {
		return c, nil
	}
	return 0, errors.New("connect: connection refused")
}

func (p *urlProber) TCP(context.Context, string) error { return nil }

func (p *urlProber) Command(ctx context.Context, c reconcile.ProbeCommand) error {
	select {
	case p.started <- strings.Join(c.Argv, " "):
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

func probedAgent(t *testing.T, p reconcile.Prober) (*reconcile.Agent, *fakeSystemd) {
	a, sd, _ := countedAgent(t, p)
	return a, sd
}

// passCounter counts the loop's passes.
type passCounter struct {
	reconcile.NopObserver
	n atomic.Int64
}

func (c *passCounter) PassStart() { c.n.Add(1) }

func countedAgent(t *testing.T, p reconcile.Prober) (*reconcile.Agent, *fakeSystemd, *passCounter) {
	t.Helper()
	files, m, _ := testDirs(t)
	sd := &fakeSystemd{active: map[string]bool{}}
	c := &passCounter{}
	return reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, Prober: p, Observer: c, CheckFocus: true}), sd, c
}

func probedUnit(url, extra string) string {
	return "[Service]\nExecStart=/bin/web " + url + "\n[X-Agentd]\nHealthySec=100ms\nHealthURL=" + url +
		"\nHealthIntervalSec=20ms\nHealthRetries=2\n" + extra
}

func putUnits(a *reconcile.Agent, rev int64, units map[string]string) {
	var es []reconcile.Entry
	for _, u := range slices.Sorted(maps.Keys(units)) {
		es = append(es, reconcile.Entry{Scope: reconcile.ScopeHost, Unit: u, Value: []byte(units[u]), ModRevision: rev})
	}
	a.SetSnapshot(reconcile.Snapshot{Revision: rev, Entries: es})
}

func statusOf(st []reconcile.Status, unit string) reconcile.Status {
	for _, s := range st {
		if s.Unit == unit {
			return s
		}
	}
	return reconcile.Status{}
}

// A new version whose HealthURL fails HealthRetries times in its window
// is rolled back, as a systemd-judged failure is; the version put back
// runs its own probes, which pass.
func TestProbeFailureInTheWindowRollsBack(t *testing.T) {
	p := &urlProber{codes: map[string]int{"http://v1/": 200, "http://v2/": 500}}
	a, sd := probedAgent(t, p)
	putUnits(a, 2, map[string]string{"web.service": probedUnit("http://v1/", "")})
	stop := runAgent(t, a)
	defer stop()
	waitStatuses(t, a, func(st []reconcile.Status) bool {
		s := statusOf(st, "web.service")
		return s.Health == "healthy" && s.Probe == "HealthURL http://v1/: 200"
	})
	putUnits(a, 3, map[string]string{"web.service": probedUnit("http://v2/", "")})
	waitStatuses(t, a, func(st []reconcile.Status) bool {
		s := statusOf(st, "web.service")
		return s.Action == reconcile.ActionRolledBack && s.Job == "" && s.Health == "" && s.Probe == "HealthURL http://v1/: 200"
	})
	s := statusOf(func() []reconcile.Status { _, st := a.Statuses(); return st }(), "web.service")
	want := "health probe failed after restart: HealthURL http://v2/: 500 (want 2xx), 2 failures in a row (HealthRetries=2)"
	if !strings.HasPrefix(s.Error, want) {
		t.Fatalf("error %q, want it to start with %q", s.Error, want)
	}
	if calls := sd.Calls(); slices.Index(calls, "restart web.service") < 0 || calls[len(calls)-1] != "restart web.service" {
		t.Fatalf("calls %v: want the change's restart and the rollback's", calls)
	}
}

// After its window a version is not rolled back for a failing probe: its
// status says unhealthy (with the probe's result) and healthy again once
// the probe passes.
func TestProbeFailureAfterTheWindowIsUnhealthyOnly(t *testing.T) {
	p := &urlProber{codes: map[string]int{"http://v1/": 200}}
	a, sd := probedAgent(t, p)
	putUnits(a, 2, map[string]string{"web.service": probedUnit("http://v1/", "")})
	stop := runAgent(t, a)
	defer stop()
	waitStatuses(t, a, func(st []reconcile.Status) bool { return statusOf(st, "web.service").Health == "healthy" })
	calls := len(sd.Calls())
	p.set("http://v1/", 503)
	waitStatuses(t, a, func(st []reconcile.Status) bool {
		s := statusOf(st, "web.service")
		return s.Health == "unhealthy" && strings.HasPrefix(s.Error, "health probe failing: HealthURL http://v1/: 503 (want 2xx), 2 failures in a row")
	})
	p.set("http://v1/", 200)
	waitStatuses(t, a, func(st []reconcile.Status) bool {
		s := statusOf(st, "web.service")
		return s.Health == "healthy" && s.Error == "" && s.Probe == "HealthURL http://v1/: 200"
	})
	if got := sd.Calls(); len(got) != calls {
		t.Fatalf("systemd calls after the window: %v; a failing probe there must not restart or roll back", got[calls:])
	}
}

// A hung HealthCmd holds up nothing: another unit's change applies while
// it runs, and it is cut at HealthTimeoutSec; the unit fails its window.
func TestHungProbeDoesNotBlockTheLoop(t *testing.T) {
	p := &urlProber{codes: map[string]int{}, started: make(chan string, 8)}
	a, sd, passes := countedAgent(t, p)
	hung := "[Service]\nExecStart=/bin/web\n[X-Agentd]\nHealthySec=0\nHealthCmd=/bin/sleep 100\nHealthTimeoutSec=1s\nHealthRetries=1\n"
	units := map[string]string{"hung.service": hung}
	putUnits(a, 2, units)
	stop := runAgent(t, a)
	defer stop()
	select {
	case c := <-p.started:
		if c != "/bin/sleep 100" {
			t.Fatalf("command %q", c)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no probe started: %v", sd.Calls())
	}
	t0, passes0 := time.Now(), passes.n.Load()
	units["other.service"] = unitA
	putUnits(a, 3, units)
	if _, err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitStatuses(t, a, func(st []reconcile.Status) bool { return statusOf(st, "other.service").Health == "healthy" })
	if d := time.Since(t0); d > 500*time.Millisecond {
		t.Fatalf("another unit's change took %v while a probe hung", d)
	}
	if s := statusOf(func() []reconcile.Status { _, st := a.Statuses(); return st }(), "hung.service"); !s.Verifying {
		t.Fatalf("hung.service %+v: want it still verifying while its probe hangs", s)
	}
	waitStatuses(t, a, func(st []reconcile.Status) bool {
		s := statusOf(st, "hung.service")
		return s.Health == "unhealthy" && strings.HasPrefix(s.Error, "health probe failed after start: HealthCmd /bin/sleep 100: no answer within HealthTimeoutSec=1s, 1 failure in a row (HealthRetries=1)")
	})
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("the hung probe was judged after %v, want about HealthTimeoutSec=1s", d)
	}
	// A window waiting for its probe past HealthySec=0 is woken by the
	// probe's result, not by a clock that has run out: no busy loop.
	if n := passes.n.Load() - passes0; n > 20 {
		t.Fatalf("%d passes while one probe hung for a second", n)
	}
}
