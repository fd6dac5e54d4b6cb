package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentd/agentd/internal/testlog"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/unitdir"
)

// notes records what a service sent to the service manager.
type notes struct {
	mu   sync.Mutex
	msgs []string
}

func (n *notes) send(s string) {
	n.mu.Lock()
	n.msgs = append(n.msgs, s)
	n.mu.Unlock()
}

func (n *notes) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.msgs)
}

func (n *notes) count(prefix string) int {
	c := 0
	for _, m := range n.all() {
		if strings.HasPrefix(m, prefix) {
			c++
		}
	}
	return c
}

func testService(t *testing.T, watchdog time.Duration) (*service, *notes, *time.Time) {
	n := &notes{}
	now := time.Unix(1000, 0)
	s := &service{
		notify: n.send, log: slog.New(slog.NewTextHandler(t.Output(), nil)),
		watchdog: watchdog, tick: max(watchdog/4, time.Millisecond), now: func() time.Time { return now },
		waits: map[int]time.Time{},
	}
	s.beat = now
	return s, n, &now
}

var twoUnits = []reconcile.Status{
	{Unit: "a.service", Hash: "h", DesiredHash: "h", ActiveState: "active"},
	{Unit: "b.service", Hash: "h", DesiredHash: "h2", ActiveState: "active"},
}

func TestServiceReadyAfterFirstSuccessfulPassWithSnapshot(t *testing.T) {
	s, n, _ := testService(t, 0)
	s.Pass(time.Millisecond, nil) // no snapshot yet: nothing reported
	s.Reported(7, twoUnits)
	s.Pass(time.Millisecond, errors.New("daemon-reload: boom")) // failed pass
	if got := n.all(); len(got) != 0 {
		t.Fatalf("sent %q before a successful pass", got)
	}
	s.Reported(7, twoUnits)
	s.Pass(time.Millisecond, nil)
	want := "READY=1\nSTATUS=registry revision 7: 1 units converged, 1 pending, 0 failed"
	if got := n.all(); len(got) != 1 || got[0] != want {
		t.Fatalf("sent %q, want [%q]", got, want)
	}
	// Later passes update STATUS only when it changes.
	s.Reported(7, twoUnits)
	s.Pass(time.Millisecond, nil)
	s.Reported(8, twoUnits[:1])
	s.Pass(time.Millisecond, nil)
	if got := n.all(); len(got) != 2 || got[1] != "STATUS=registry revision 8: 1 units converged, 0 pending, 0 failed" || n.count("READY=1") != 1 {
		t.Fatalf("sent %q", got)
	}
}

func TestServiceOffline(t *testing.T) {
	s, n, _ := testService(t, 0)
	desc := describeSaved(5, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	s.setOffline(desc)
	s.Reported(5, twoUnits[:1])
	s.Pass(time.Millisecond, nil)
	want := "READY=1\nSTATUS=registry unreachable: running on the last-known-good snapshot (revision 5, saved 2026-01-02T03:04:05Z); registry revision 5: 1 units converged, 0 pending, 0 failed"
	if got := n.all(); len(got) != 1 || got[0] != want {
		t.Fatalf("sent %q, want %q", got, want)
	}
	s.setOffline("") // the registry answered
	s.Reported(9, twoUnits[:1])
	if got := n.all(); got[len(got)-1] != "STATUS=registry revision 9: 1 units converged, 0 pending, 0 failed" {
		t.Fatalf("sent %q", got)
	}
}

func TestServiceReadyWithout(t *testing.T) {
	s, n, _ := testService(t, 0)
	s.readyWithout("registry unreachable for 30s and no saved snapshot: touching nothing until it answers")
	s.readyWithout("again")
	if got := n.all(); len(got) != 1 || !strings.HasPrefix(got[0], "READY=1\nSTATUS=registry unreachable for 30s") {
		t.Fatalf("sent %q", got)
	}
	s.Reported(3, nil)
	s.Pass(time.Millisecond, nil)
	if n.count("READY=1") != 1 || n.all()[1] != "STATUS=registry revision 3: 0 units converged, 0 pending, 0 failed" {
		t.Fatalf("sent %q", n.all())
	}
}

// The loop counts as alive while it beats, or while it is inside a call
// bounded by a deadline that has not passed; otherwise not.
func TestServiceAlive(t *testing.T) {
	s, _, now := testService(t, 4*time.Second) // tick 1s: alive up to 2s after a beat
	step := func(d time.Duration) { *now = now.Add(d) }
	if ok, _ := s.alive(); !ok {
		t.Fatal("not alive at start")
	}
	step(1900 * time.Millisecond)
	if ok, _ := s.alive(); !ok {
		t.Fatal("not alive 1.9s after a beat")
	}
	step(200 * time.Millisecond)
	if ok, silent := s.alive(); ok || silent != 2100*time.Millisecond {
		t.Fatalf("alive 2.1s after the last beat (silent %s)", silent)
	}
	s.Heartbeat()
	if ok, _ := s.alive(); !ok {
		t.Fatal("not alive right after a beat")
	}
	done := s.boundedWait(90 * time.Second) // e.g. a start job
	step(60 * time.Second)
	if ok, _ := s.alive(); !ok {
		t.Fatal("not alive inside a bounded wait")
	}
	step(31 * time.Second)
	if ok, _ := s.alive(); ok {
		t.Fatal("alive after the bounded wait's deadline passed")
	}
	done()
	if ok, _ := s.alive(); !ok {
		t.Fatal("returning from the call is progress")
	}
}

// run pings the watchdog only after READY and only while the loop is
// alive; before READY it extends the start timeout instead; at the end it
// says STOPPING. Fake time (synctest): deterministic.
func TestServiceRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := &notes{}
		var buf testlog.Buffer
		s := &service{
			notify: n.send, log: slog.New(slog.NewTextHandler(&buf, nil)),
			watchdog: 40 * time.Millisecond, tick: 10 * time.Millisecond, now: time.Now, waits: map[int]time.Time{},
		}
		s.beat = time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.run(ctx); close(done) }()
		beat := func(d time.Duration) {
			for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
				s.Heartbeat()
			}
		}
		time.Sleep(5 * time.Millisecond) // act between ticks (every 10ms), never on one
		beat(50 * time.Millisecond)
		if n.count("EXTEND_TIMEOUT_USEC=40000") != 5 || n.count("WATCHDOG=1") != 0 {
			t.Fatalf("before READY: %q", n.all())
		}
		s.Reported(1, nil)
		s.Pass(0, nil)
		beat(50 * time.Millisecond)
		if got := n.count("WATCHDOG=1"); got != 5 {
			t.Fatalf("%d watchdog pings in 50ms of a beating loop, want 5: %q", got, n.all())
		}
		time.Sleep(200 * time.Millisecond) // wedged: no beats
		// Alive for 2 ticks after the last beat, then silent.
		if got := n.count("WATCHDOG=1"); got != 6 {
			t.Fatalf("%d pings, want 6: the pings went on while the loop was silent", got)
		}
		logged := buf.String()
		if !strings.Contains(logged, "reconcile loop shows no progress") {
			t.Errorf("stall not logged:\n%s", logged)
		}
		beat(20 * time.Millisecond)
		if got := n.count("WATCHDOG=1"); got != 8 {
			t.Fatalf("%d pings after the loop came back, want 8", got)
		}
		cancel()
		<-done
		if all := n.all(); all[len(all)-1] != "STOPPING=1\nSTATUS=stopping" {
			t.Fatalf("last message %q", all[len(all)-1])
		}
	})
}

// Without a watchdog, run extends the start timeout until READY and then
// has nothing to do: no timer wakes the idle agent. Fake time (synctest).
func TestServiceRunWithoutWatchdogGoesQuiet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := &notes{}
		s := &service{
			notify: n.send, log: slog.New(slog.DiscardHandler),
			tick: 10 * time.Millisecond, now: time.Now, waits: map[int]time.Time{},
		}
		if d := s.heartbeatInterval(); d != 0 {
			t.Fatalf("heartbeat interval without a watchdog = %s, want none", d)
		}
		s.beat = time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.run(ctx); close(done) }()
		time.Sleep(35 * time.Millisecond) // no beats: the loop may wait for the registry
		if got := n.count("EXTEND_TIMEOUT_USEC=40000"); got != 3 {
			t.Fatalf("before READY: %d extensions in 35ms, want 3: %q", got, n.all())
		}
		s.Reported(1, nil)
		s.Pass(0, nil)
		time.Sleep(20 * time.Millisecond)
		before := len(n.all())
		time.Sleep(time.Hour)
		if got := len(n.all()); got != before {
			t.Fatalf("%d messages after READY in an idle hour: %q", got-before, n.all()[before:])
		}
		cancel()
		<-done
		if all := n.all(); all[len(all)-1] != "STOPPING=1\nSTATUS=stopping" {
			t.Fatalf("last message %q", all[len(all)-1])
		}
	})
}

func TestLastKnownGood(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	dir := t.TempDir()
	snap := reconcile.Snapshot{Revision: 42, Entries: []reconcile.Entry{{Unit: "a.service", Value: []byte("[Service]\nExecStart=/bin/true\n"), ModRevision: 40}}}

	l, err := openLastKnownGood(dir, "h1", "/agentd", []string{"web", "all"}, log)
	if err != nil {
		t.Fatal(err)
	}
	var got []reconcile.Snapshot
	apply := func(s reconcile.Snapshot) { got = append(got, s) }
	l.received(snap, apply)
	l.Close()
	if len(got) != 1 {
		t.Fatalf("applied %d snapshots", len(got))
	}
	if fi, err := os.Stat(filepath.Join(dir, unitdir.SnapshotFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("saved snapshot: %v (want mode 0600: it may hold secrets)", err)
	}

	// A new start with the registry away: after the timeout the saved
	// snapshot is applied and STATUS says so.
	l, _ = openLastKnownGood(dir, "h1", "/agentd", []string{"all", "web"}, log)
	defer l.Close()
	s, n, _ := testService(t, 0)
	got = nil
	l.fallback(context.Background(), time.Millisecond, apply, s)
	if len(got) != 1 || got[0].Revision != 42 || string(got[0].Entries[0].Value) != string(snap.Entries[0].Value) {
		t.Fatalf("fallback applied %+v", got)
	}
	s.Reported(42, nil)
	s.Pass(0, nil)
	if m := n.all(); len(m) != 1 || !strings.Contains(m[0], "running on the last-known-good snapshot (revision 42, saved ") {
		t.Fatalf("sent %q", m)
	}

	// A snapshot from the registry before the timeout: no fallback.
	l.received(snap, apply)
	got = nil
	l.fallback(context.Background(), time.Millisecond, apply, s)
	if len(got) != 0 {
		t.Fatal("fallback after the registry answered")
	}

	// Another identity's snapshot is never used; with none the agent is
	// ready touching nothing.
	for name, o := range map[string]struct {
		host   string
		groups []string
		dir    string
	}{
		"other host":   {"h2", []string{"all", "web"}, dir},
		"other groups": {"h1", []string{"all"}, dir},
		"none saved":   {"h1", []string{"all"}, t.TempDir()},
	} {
		t.Run(name, func(t *testing.T) {
			l, _ := openLastKnownGood(o.dir, o.host, "/agentd", o.groups, log)
			defer l.Close()
			s, n, _ := testService(t, 0)
			got = nil
			l.fallback(context.Background(), time.Millisecond, apply, s)
			if len(got) != 0 || n.count("READY=1\nSTATUS=registry unreachable for 1ms and ") != 1 {
				t.Fatalf("applied %d, sent %q", len(got), n.all())
			}
		})
	}
}
