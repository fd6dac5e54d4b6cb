// Planning from systemd's listing (Summaries, Timeouts, Queue): new units
// and changed ones without a full read of each.

package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/agentd/agentd/reconcile"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// unknownManager gives a fake the service manager's identity and load
// time, both unknown (as PlainSystemd does).
type unknownManager struct{}

func (unknownManager) ManagerID(context.Context) (string, error) { return "", errors.ErrUnsupported }

func (unknownManager) UnitsLoaded(context.Context) (uint64, error) {
	return 0, errors.ErrUnsupported
}

// lightSystemd is a fake systemd that knows no unit until the first
// daemon-reload, lists units (Summaries), reads timeouts alone
// (Timeouts), and records each start's deadline.
type lightSystemd struct {
	*fakeSystemd
	unknownManager
	reloaded  atomic.Bool
	full      atomic.Int64 // full state reads after the reload, before the jobs
	starts    atomic.Int64
	timeouts  map[string][2]uint64
	deadlines sync.Map // unit -> time.Duration until the job's deadline (-1: none)
	queued    sync.Map // unit -> true: its job was queued
	early     atomic.Int64
}

func (l *lightSystemd) Reload(ctx context.Context) error {
	l.reloaded.Store(true)
	return l.fakeSystemd.Reload(ctx)
}

func (l *lightSystemd) State(ctx context.Context, u string) (reconcile.UnitState, error) {
	if !l.reloaded.Load() {
		return reconcile.UnitState{LoadState: "not-found", ActiveState: "inactive", SubState: "dead"}, nil
	}
	if l.starts.Load() == 0 {
		l.full.Add(1)
	}
	st, err := l.fakeSystemd.State(ctx, u)
	st.TimeoutStartUSec, st.TimeoutStopUSec = l.timeouts[u][0], l.timeouts[u][1]
	return st, err
}

// StateSkippingFileState reads in full.
func (l *lightSystemd) StateSkippingFileState(ctx context.Context, u string) (reconcile.UnitState, error) {
	return l.State(ctx, u)
}

func (l *lightSystemd) Summaries(ctx context.Context, units []string) (map[string]reconcile.UnitSummary, error) {
	out := map[string]reconcile.UnitSummary{}
	for _, u := range units {
		st, _ := l.fakeSystemd.State(ctx, u)
		if !l.reloaded.Load() {
			st.LoadState = "not-found"
		}
		out[u] = reconcile.UnitSummary{LoadState: st.LoadState, ActiveState: st.ActiveState, SubState: st.SubState}
	}
	return out, nil
}

func (l *lightSystemd) Timeouts(_ context.Context, u string) (uint64, uint64, error) {
	if _, ok := l.queued.Load(u); !ok {
		l.early.Add(1)
	}
	return l.timeouts[u][0], l.timeouts[u][1], nil
}

// Queue queues a job; its Start runs when it is waited for.
func (l *lightSystemd) Queue(_ context.Context, job reconcile.Job, u string) (func(context.Context) error, error) {
	l.queued.Store(u, true)
	return func(ctx context.Context) error { return reconcile.DoJob(ctx, l, job, u) }, nil
}

func (l *lightSystemd) Start(ctx context.Context, u string) error {
	l.starts.Add(1)
	storeDeadline(ctx, &l.deadlines, u)
	return l.fakeSystemd.Start(ctx, u)
}

// storeDeadline keeps how long a job's wait may last (-1: no deadline).
func storeDeadline(ctx context.Context, m *sync.Map, u string) {
	d := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
	}
	m.Store(u, d)
}

// The first sync of many new units plans them from one listing after the
// daemon-reload (a full read of a unit systemd has just loaded costs it
// milliseconds), yet each job still waits as long as the unit's own
// timeouts say: none for TimeoutStartSec=infinity.
func TestFirstSyncPlansNewUnitsFromTheListing(t *testing.T) {
	files, m, _ := testDirs(t)
	sd := &lightSystemd{fakeSystemd: &fakeSystemd{active: map[string]bool{}}, timeouts: map[string][2]uint64{
		"inf.service":  {math.MaxUint64, 90_000_000},
		"slow.service": {600_000_000, 20_000_000},
	}}
	a := reconcile.New(reconcile.Config{Systemd: sd, Files: files, Manifest: m, CheckFocus: true})
	names := []string{"inf.service", "slow.service"}
	for i := range 10 {
		names = append(names, fmt.Sprintf("u%02d.service", i))
	}
	a.SetSnapshot(snapshot(names...))
	stop := runAgent(t, a)
	defer stop()
	waitCalls(t, sd.fakeSystemd, 1+len(names))
	if n := sd.full.Load(); n != 0 {
		t.Errorf("%d full state reads of units systemd had just loaded, before their jobs; want them planned from the listing", n)
	}
	if n := sd.early.Load(); n != 0 {
		t.Errorf("the timeouts of %d units were read before their jobs were queued (systemd loads such a unit again for the read)", n)
	}
	deadline := func(u string) time.Duration {
		d, ok := sd.deadlines.Load(u)
		if !ok {
			t.Fatalf("%s was not started", u)
		}
		return d.(time.Duration)
	}
	if d := deadline("inf.service"); d != -1 {
		t.Errorf("TimeoutStartSec=infinity: the start's wait has a deadline in %s, want none", d)
	}
	if d := deadline("slow.service"); d < 10*time.Minute || d > 10*time.Minute+time.Minute {
		t.Errorf("TimeoutStartSec=10min: the start's wait ends in %s, want 10 min and a margin", d)
	}
	if d := deadline("u00.service"); d < 90*time.Second || d > 2*time.Minute {
		t.Errorf("systemd's default timeout: the start's wait ends in %s, want 90 s and a margin", d)
	}
	// After the jobs, the units are read in full: their statuses are systemd's.
	deadlineAt := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadlineAt) {
		_, st := a.Statuses()
		done := len(st) == len(names)
		for _, s := range st {
			done = done && s.ActiveState == "active" && s.Health == "healthy"
		}
		if done {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, st := a.Statuses()
	t.Fatalf("after the first sync every unit should be active and healthy: %+v", st)
}

// reloadListing is a fake systemd that counts the full state reads made
// between the agent's daemon-reload and its first restart after it, and can
// make a unit fail to load at the reload.
type reloadListing struct {
	*fakeSystemd
	unknownManager
	window    atomic.Bool // after a daemon-reload, before a restart
	full      sync.Map    // unit -> true: read in full in the window
	reads     sync.Map    // unit -> *atomic.Int64: full reads
	bad       sync.Map    // unit -> true: bad-setting once reloaded
	timeouts  sync.Map    // unit -> [2]uint64
	deadlines sync.Map    // unit -> time.Duration until the restart's deadline
	onReload  func()      // runs after each daemon-reload
}

func (l *reloadListing) Reload(ctx context.Context) error {
	l.window.Store(true)
	err := l.fakeSystemd.Reload(ctx)
	if l.onReload != nil {
		l.onReload()
	}
	return err
}

func (l *reloadListing) state(ctx context.Context, u string) reconcile.UnitState {
	st, _ := l.fakeSystemd.State(ctx, u)
	st.UnitFileState = "static" // no [Install] section
	if _, bad := l.bad.Load(u); bad && l.window.Load() {
		st.LoadState, st.LoadError = "bad-setting", "Unit "+u+" has a bad unit file setting."
	}
	if t, ok := l.timeouts.Load(u); ok {
		st.TimeoutStartUSec, st.TimeoutStopUSec = t.([2]uint64)[0], t.([2]uint64)[1]
	}
	return st
}

func (l *reloadListing) State(ctx context.Context, u string) (reconcile.UnitState, error) {
	if l.window.Load() {
		l.full.Store(u, true)
	}
	n, _ := l.reads.LoadOrStore(u, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	return l.state(ctx, u), nil
}

// StateSkippingFileState reads in full.
func (l *reloadListing) StateSkippingFileState(ctx context.Context, u string) (reconcile.UnitState, error) {
	return l.State(ctx, u)
}

func (l *reloadListing) Summaries(ctx context.Context, units []string) (map[string]reconcile.UnitSummary, error) {
	out := map[string]reconcile.UnitSummary{}
	for _, u := range units {
		st := l.state(ctx, u)
		out[u] = reconcile.UnitSummary{LoadState: st.LoadState, ActiveState: st.ActiveState, SubState: st.SubState}
	}
	return out, nil
}

func (l *reloadListing) Timeouts(ctx context.Context, u string) (uint64, uint64, error) {
	st := l.state(ctx, u)
	return st.TimeoutStartUSec, st.TimeoutStopUSec, nil
}

func (l *reloadListing) Queue(_ context.Context, job reconcile.Job, u string) (func(context.Context) error, error) {
	return func(ctx context.Context) error { return reconcile.DoJob(ctx, l, job, u) }, nil
}

func (l *reloadListing) Restart(ctx context.Context, u string) error {
	l.window.Store(false)
	storeDeadline(ctx, &l.deadlines, u)
	return l.fakeSystemd.Restart(ctx, u)
}

// A change of many running units: after the agent's daemon-reload they are
// planned from one listing, not read one by one before their restarts (the
// reads held 100 restarts back by 144–162 ms). Yet a restart waits as long
// as the new file's own timeout says, a unit the reload could not load is
// read in full (its error is systemd's), and a unit that gets no job is
// read in full at the next round.
func TestChangedUnitsPlannedFromTheListing(t *testing.T) {
	files, m, _ := testDirs(t)
	sd := &reloadListing{fakeSystemd: &fakeSystemd{active: map[string]bool{}}}
	a := reconcile.New(reconcile.Config{Systemd: sd, Files: files, Manifest: m, CheckFocus: true})
	var names []string
	for i := range 10 {
		names = append(names, fmt.Sprintf("u%02d.service", i))
	}
	version := func(rev int64, v string) reconcile.Snapshot {
		s := snapshot(names...)
		s.Revision = rev
		for i := range s.Entries {
			s.Entries[i].Value = []byte("[Service]\nExecStart=/bin/sleep " + v + "\n[X-Agentd]\nHealthySec=0\n")
		}
		s.Entries = append(s.Entries, reconcile.Entry{Scope: reconcile.ScopeHost, Unit: "hold.service",
			Value: []byte("[Service]\nExecStart=/bin/sleep " + v + "\n[X-Agentd]\nHealthySec=0\nOnChange=none\n")})
		return s
	}
	a.SetSnapshot(version(7, "1"))
	stop := runAgent(t, a)
	defer stop()
	waitCalls(t, sd.fakeSystemd, 1+len(names)+1) // daemon-reload, 11 starts
	waitStatuses(t, a, func(st []reconcile.Status) bool {
		for _, s := range st {
			if s.Job != "" || s.Health != "healthy" {
				return false
			}
		}
		return len(st) == len(names)+1
	})

	sd.timeouts.Store("u00.service", [2]uint64{600_000_000, 90_000_000}) // TimeoutStartSec=10min in the new file
	sd.bad.Store("u09.service", true)
	holdReads := func() int64 {
		n, _ := sd.reads.LoadOrStore("hold.service", new(atomic.Int64))
		return n.(*atomic.Int64).Load()
	}
	before := holdReads()
	// Someone edits u01's file right after the reload: NeedDaemonReload,
	// so a full read.
	var once sync.Once
	sd.onReload = func() {
		once.Do(func() {
			os.WriteFile(filepath.Join(files.Path(), "u01.service"), []byte("[Service]\nExecStart=/bin/true\n"), 0o644)
			a.FileChanged("u01.service")
		})
	}
	sd.window.Store(false)
	sd.full.Clear()
	a.SetSnapshot(version(8, "2"))
	waitStatuses(t, a, func(st []reconcile.Status) bool {
		n := 0
		for _, s := range st {
			if s.Action == "restart" && s.Result == "done" {
				n++
			}
		}
		return n == len(names)-1 && holdReads() > before
	})
	var full []string
	sd.full.Range(func(u, _ any) bool { full = append(full, u.(string)); return true })
	slices.Sort(full)
	if !slices.Equal(full, []string{"u01.service", "u09.service"}) && !slices.Equal(full, []string{"hold.service", "u01.service", "u09.service"}) {
		t.Errorf("read in full after the daemon-reload, before the restarts: %v; want u01.service (edited since), u09.service (it failed to load), and no other unit that is restarted", full)
	}
	// A restart is a stop (TimeoutStopSec=90s) then a start (10 min).
	if d, _ := sd.deadlines.Load("u00.service"); d.(time.Duration) < 11*time.Minute+30*time.Second || d.(time.Duration) > 12*time.Minute+30*time.Second {
		t.Errorf("TimeoutStartSec=10min in the new file: the restart's wait ends in %s, want 11.5 min and a margin", d)
	}
	_, st := a.Statuses()
	for _, s := range st {
		switch s.Unit {
		case "u09.service":
			if s.LoadState != "bad-setting" || !strings.Contains(s.Error, "bad unit file setting") {
				t.Errorf("the unit the reload could not load: %+v", s)
			}
		case "hold.service":
			if !s.PendingRestart || s.Action == "restart" {
				t.Errorf("OnChange=none: %+v", s)
			}
		}
	}
}
