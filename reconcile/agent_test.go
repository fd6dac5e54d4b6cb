package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/unitdir"
)

func TestNoSnapshotTouchesNothing(t *testing.T) {
	a, sd, _ := newAgent(t)
	stop := runAgent(t, a)
	defer stop()
	if _, err := a.DryRun(context.Background()); err == nil {
		t.Fatal("dry-run without a registry snapshot should say so")
	}
	plan, err := a.Sync(context.Background())
	if err != nil || len(plan) != 0 || len(sd.Calls()) != 0 {
		t.Fatalf("sync with no snapshot: %v %v %v", plan, err, sd.Calls())
	}
}

// A batch is written, reloaded ONCE, then started (jobs run in parallel).
func TestOneReloadPerBatchThenJobs(t *testing.T) {
	a, sd, _ := newAgent(t)
	a.SetSnapshot(snapshot("c.service", "a.service", "b.service"))
	stop := runAgent(t, a)
	defer stop()
	got := waitCalls(t, sd, 4)
	if got[0] != "daemon-reload" {
		t.Fatalf("calls = %v: the reload must come first, once", got)
	}
	jobs := slices.Sorted(slices.Values(got[1:]))
	if want := []string{"start a.service", "start b.service", "start c.service"}; !slices.Equal(jobs, want) {
		t.Fatalf("jobs = %v, want %v", jobs, want)
	}
}

// refusesEnable is a fake systemd that refuses to enable one unit, as
// EnableUnitFiles does: the whole call fails.
type refusesEnable struct {
	*fakeSystemd
	bad string
}

func (r *refusesEnable) Enable(ctx context.Context, u ...string) error {
	r.fakeSystemd.Enable(ctx, u...)
	if slices.Contains(u, r.bad) {
		return errors.New("Cannot alias " + r.bad)
	}
	return nil
}

// Units to enable together are enabled in one call (a first sync of 1,000
// units with [Install] made 1,000 calls, one after another); when systemd
// refuses it, unit by unit, so that only the refused unit fails.
func TestEnablesInOneCall(t *testing.T) {
	files, m, _ := testDirs(t)
	sd := &refusesEnable{fakeSystemd: &fakeSystemd{active: map[string]bool{}}}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true})
	withInstall := func(units ...string) reconcile.Snapshot {
		s := snapshot(units...)
		for i := range s.Entries {
			s.Entries[i].Value = []byte("[Service]\nExecStart=/bin/sleep 1\n[Install]\nWantedBy=default.target\n[X-Agentd]\nHealthySec=0\n")
		}
		return s
	}
	a.SetSnapshot(withInstall("c.service", "a.service", "b.service"))
	stop := runAgent(t, a)
	got := waitCalls(t, sd.fakeSystemd, 5)
	stop()
	if got[0] != "enable a.service b.service c.service" || got[1] != "daemon-reload" {
		t.Fatalf("calls = %v, want one enable of the three, then the reload", got)
	}

	files, m, _ = testDirs(t)
	sd = &refusesEnable{fakeSystemd: &fakeSystemd{active: map[string]bool{}}, bad: "b.service"}
	a = reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true})
	a.SetSnapshot(withInstall("c.service", "a.service", "b.service"))
	stop = runAgent(t, a)
	defer stop()
	got = waitCalls(t, sd.fakeSystemd, 5)
	if want := []string{"enable a.service b.service c.service", "enable a.service", "enable b.service", "enable c.service", "daemon-reload"}; !slices.Equal(got[:5], want) {
		t.Fatalf("calls = %v, want %v first", got, want)
	}
	// The statuses come with the end of the pass, after the calls.
	var st []reconcile.Status
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, st = a.Statuses(); len(st) == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(st) != 3 {
		t.Fatalf("statuses %+v, want 3", st)
	}
	for _, s := range st {
		if refused := strings.Contains(s.Error, "Cannot alias"); refused != (s.Unit == "b.service") {
			t.Errorf("%s: status error %q; only b.service's enable was refused", s.Unit, s.Error)
		}
	}
}

// Dry-run uses the planning code and changes nothing; sync then applies
// the same plan.
func TestDryRunChangesNothing(t *testing.T) {
	a, sd, files := newAgent(t)
	a.SetSnapshot(snapshot("a.service"))
	stop := runAgent(t, a)
	defer stop()
	waitCalls(t, sd, 2)
	// A hand edit nobody told the agent about (no file watch here).
	if err := files.Write("a.service", []byte("[Service]\nExecStart=/bin/false\n")); err != nil {
		t.Fatal(err)
	}
	before := sd.Calls()
	plan, err := a.DryRun(context.Background())
	if err != nil || len(plan) != 1 || plan[0].Kind != reconcile.KindUpdate || len(plan[0].Steps.Writes) != 1 {
		t.Fatalf("dry-run plan: %+v %v", plan, err)
	}
	if b, _, _ := files.Read("a.service"); string(b) != "[Service]\nExecStart=/bin/false\n" {
		t.Fatal("dry-run wrote the file")
	}
	if !slices.Equal(sd.Calls(), before) {
		t.Fatalf("dry-run called systemd: %v", sd.Calls()[len(before):])
	}
	plan2, err := a.Sync(context.Background())
	if err != nil || len(plan2) != 1 || plan2[0].Kind != plan[0].Kind || plan2[0].Reason != plan[0].Reason {
		t.Fatalf("sync plan %+v differs from the dry-run's %+v (%v)", plan2, plan, err)
	}
	if b, _, _ := files.Read("a.service"); string(b) != unitA {
		t.Fatal("sync did not restore the file")
	}
	// Same content as what runs: daemon-reload only, no restart.
	if got := sd.Calls()[len(before):]; !slices.Equal(got, []string{"daemon-reload"}) {
		t.Fatalf("sync calls = %v", got)
	}
}

// The loop and everything it started end with its context.
func TestRunLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	a, sd, _ := newAgent(t)
	a.SetSnapshot(snapshot("a.service"))
	stop := runAgent(t, a)
	waitCalls(t, sd, 2)
	stop()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An agent restarted inside a unit's HealthySec window verifies that
// version again instead of forgetting it.
func TestVerificationResumesAfterAgentRestart(t *testing.T) {
	files, _ := unitdir.Open(t.TempDir())
	m, _ := unitdir.OpenManifest(t.TempDir())
	content := []byte("[Service]\nExecStart=/bin/sleep 1\n[X-Agentd]\nHealthySec=60\n")
	h := reconcile.Hash(content)
	if err := files.Write("a.service", content); err != nil {
		t.Fatal(err)
	}
	m.Set("a.service", reconcile.Owned{Hash: h})
	m.SetUnits(map[string]reconcile.UnitRecord{"a.service": {Applied: map[string]string{"a.service": h}, Good: map[string]string{"a.service": "older"}}}, reconcile.Intent{})
	sd := &fakeSystemd{active: map[string]bool{"a.service": true}}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true})
	a.SetSnapshot(reconcile.Snapshot{Entries: []reconcile.Entry{{Unit: "a.service", Value: content}}})
	stop := runAgent(t, a)
	defer stop()
	if _, err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, st := a.Statuses()
	if len(st) != 1 || !st[0].Verifying {
		t.Fatalf("status = %+v, want verifying", st)
	}
	if calls := sd.Calls(); len(calls) != 0 {
		t.Fatalf("resuming verification touched the unit: %v", calls)
	}
}

// failingStart is a systemd whose start of one unit leaves it failed and
// returns only when the test releases it: a pass can then report while the
// job's failure is visible in systemd but not yet taken by the loop.
type failingStart struct {
	*fakeSystemd
	unit    string
	failed  chan struct{}
	release chan struct{}
}

func (f *failingStart) Start(ctx context.Context, u string) error {
	if u != f.unit {
		return f.fakeSystemd.Start(ctx, u)
	}
	f.rec("start " + u)
	close(f.failed)
	<-f.release
	return context.DeadlineExceeded
}

func (f *failingStart) State(ctx context.Context, u string) (reconcile.UnitState, error) {
	if u == f.unit {
		select {
		case <-f.failed:
			return reconcile.UnitState{LoadState: "loaded", ActiveState: "failed", SubState: "failed", Result: "exit-code"}, nil
		default:
		}
	}
	return f.fakeSystemd.State(ctx, u)
}

// A unit that failed while its job is still running has no verdict yet:
// status must not say "failed" (an operator's --wait would return before
// the rollback the loop is about to make).
func TestNoFailureVerdictWhileJobRuns(t *testing.T) {
	files, m, _ := testDirs(t)
	sd := &failingStart{fakeSystemd: &fakeSystemd{active: map[string]bool{}}, unit: "a.service",
		failed: make(chan struct{}), release: make(chan struct{})}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true})
	a.SetSnapshot(snapshot("a.service"))
	stop := runAgent(t, a)
	defer stop()
	defer close(sd.release)
	<-sd.failed
	if _, err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, sts := a.Statuses()
	if len(sts) != 1 {
		t.Fatalf("statuses = %+v", sts)
	}
	if s := sts[0]; s.Error != "" || s.Result != "running" || s.Job != "start" {
		t.Fatalf("status while the start job runs = %+v, want a running job and no error", s)
	}
}

// counting counts the reads that a pass costs: systemd state reads and
// file reads.
type counting struct {
	*fakeSystemd
	states atomic.Int64
}

func (c *counting) State(ctx context.Context, u string) (reconcile.UnitState, error) {
	c.states.Add(1)
	return c.fakeSystemd.State(ctx, u)
}

type countingFiles struct {
	*unitdir.Dir
	reads atomic.Int64
}

func (c *countingFiles) Read(p string) ([]byte, bool, error) {
	c.reads.Add(1)
	return c.Dir.Read(p)
}

// A change to one unit of many reads that unit, not the others: state comes
// from the cache that signals, fsnotify and the loop's own actions keep.
func TestPassReadsOnlyWhatChanged(t *testing.T) {
	dir, m, _ := testDirs(t)
	sd := &counting{fakeSystemd: &fakeSystemd{active: map[string]bool{}}}
	files := &countingFiles{Dir: dir}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true})
	var names []string
	for i := range 100 {
		names = append(names, fmt.Sprintf("u%03d.service", i))
	}
	snap := snapshot(names...)
	a.SetSnapshot(snap)
	stop := runAgent(t, a)
	defer stop()
	waitCalls(t, sd.fakeSystemd, 101)

	states, reads := sd.states.Load(), files.reads.Load()
	snap.Revision++
	snap.Entries = slices.Clone(snap.Entries) // the agent keeps the snapshot it was given
	snap.Entries[42].Value = []byte(unitA + "# changed\n")
	a.SetSnapshot(snap)
	waitCalls(t, sd.fakeSystemd, 102) // the daemon-reload (a comment: nothing to restart)
	t.Logf("one change: %d state reads, %d file reads", sd.states.Load()-states, files.reads.Load()-reads)
	if got := sd.states.Load() - states; got > 5 {
		t.Errorf("one changed unit of 100 cost %d state reads", got)
	}
	if got := files.reads.Load() - reads; got > 5 {
		t.Errorf("one changed unit of 100 cost %d file reads", got)
	}
	// A signal for one unit re-reads that one.
	states = sd.states.Load()
	a.UnitChanged("u007.service")
	deadline := time.Now().Add(5 * time.Second)
	for sd.states.Load() == states && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if got := sd.states.Load() - states; got != 1 {
		t.Errorf("a signal for one unit cost %d state reads, want 1", got)
	}
}

// restartGate fails the first restart (a bad change) and holds the second
// (the rollback) until released.
type restartGate struct {
	*fakeSystemd
	n       atomic.Int32
	held    chan struct{}
	release chan struct{}
}

func (g *restartGate) Restart(ctx context.Context, u string) error {
	g.rec("restart " + u)
	switch g.n.Add(1) {
	case 1:
		return errors.New("job failed")
	case 2:
		close(g.held)
		<-g.release
	}
	return nil
}

// While the rollback's restart runs, status says rolling back (the old
// version is not running yet); rolled back once it is done.
func TestRollbackInFlightIsNotRolledBack(t *testing.T) {
	files, m, _ := testDirs(t)
	sd := &restartGate{fakeSystemd: &fakeSystemd{active: map[string]bool{}}, held: make(chan struct{}), release: make(chan struct{})}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true})
	snap := snapshot("a.service")
	a.SetSnapshot(snap)
	stop := runAgent(t, a)
	defer stop()
	var once sync.Once
	release := func() { once.Do(func() { close(sd.release) }) }
	defer release()                 // before stop: the loop waits for its jobs
	waitCalls(t, sd.fakeSystemd, 2) // reload, start
	snap.Revision++
	snap.Entries = slices.Clone(snap.Entries) // the agent keeps the snapshot it was given
	snap.Entries[0].Value = []byte("[Service]\nExecStart=/bin/sleep 2\n[X-Agentd]\nHealthySec=0\n")
	a.SetSnapshot(snap)
	select {
	case <-sd.held:
	case <-time.After(5 * time.Second):
		t.Fatalf("no rollback restart: %v", sd.Calls())
	}
	if _, err := a.DryRun(context.Background()); err != nil { // a pass of the loop has run since
		t.Fatal(err)
	}
	_, sts := a.Statuses()
	if len(sts) != 1 || sts[0].Action != "rolling-back" || sts[0].Job != "restart" {
		t.Fatalf("status during the rollback job = %+v", sts)
	}
	release()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, sts = a.Statuses()
		if len(sts) == 1 && sts[0].Action == "rolled-back" && sts[0].Job == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status after the rollback job = %+v", sts)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startGate holds every start until released.
type startGate struct {
	*counting
	release chan struct{}
}

func (g *startGate) Start(ctx context.Context, u string) error {
	g.rec("start " + u)
	<-g.release
	return nil
}

// The signals of a unit whose job is in flight cost no state read: nothing
// is decided about it until the job ends, and then the state read right
// after the job is what the loop plans from. A new registry snapshot reads
// such a unit afresh (something new may be wanted of it).
func TestSignalsOfAUnitWithAJobInFlightAreMuted(t *testing.T) {
	dir, m, _ := testDirs(t)
	sd := &startGate{counting: &counting{fakeSystemd: &fakeSystemd{active: map[string]bool{}}}, release: make(chan struct{})}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: dir, Manifest: m, CheckFocus: true})
	snap := snapshot("a.service")
	a.SetSnapshot(snap)
	stop := runAgent(t, a)
	defer stop()
	var once sync.Once
	release := func() { once.Do(func() { close(sd.release) }) }
	defer release()
	waitCalls(t, sd.fakeSystemd, 2) // reload, start (held)

	// The loop's passes are over once its statuses are of snap's revision
	// and nothing moved for a while.
	settled := func() int64 {
		deadline := time.Now().Add(5 * time.Second)
		for {
			if rev, _ := a.Statuses(); rev == snap.Revision || time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		return sd.states.Load()
	}
	before := settled()
	for range 20 {
		a.UnitChanged("a.service")
	}
	if got := settled() - before; got != 0 {
		t.Errorf("20 signals of a unit whose start runs cost %d state reads, want 0", got)
	}

	snap.Revision++
	a.SetSnapshot(snap) // same content, a new snapshot
	if got := settled() - before; got != 1 {
		t.Errorf("a new snapshot with muted signals cost %d state reads, want 1", got)
	}

	before = settled()
	release()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, sts := a.Statuses()
		if len(sts) == 1 && sts[0].Job == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job never ended: %+v", sts)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := settled() - before; got != 1 {
		t.Errorf("the job's end cost %d state reads, want 1 (the one right after it)", got)
	}
}

// The content a change overwrites is kept (by hash, in the state directory)
// before the file is overwritten: a rollback needs it. Normally the pass
// that wrote it kept it at its end; when the agent died before that, the
// next change keeps it from the file itself.
func TestOverwrittenContentIsKept(t *testing.T) {
	files, m, state := testDirs(t)
	sd := &fakeSystemd{active: map[string]bool{}}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true})
	snap := snapshot("a.service")
	a.SetSnapshot(snap)
	stop := runAgent(t, a)
	defer stop()
	waitCalls(t, sd, 2) // reload, start
	v1 := reconcile.Hash([]byte(unitA))
	waitBlob := func(h string) bool {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if _, ok := m.Blob(h); ok {
				return true
			}
			time.Sleep(5 * time.Millisecond)
		}
		return false
	}
	if !waitBlob(v1) {
		t.Fatal("the installed version was never kept")
	}
	// As if the agent had died before the end of that pass.
	if err := os.Remove(filepath.Join(state, "blobs", v1)); err != nil {
		t.Fatal(err)
	}
	v2 := "[Service]\nExecStart=/bin/sleep 2\n[X-Agentd]\nHealthySec=0\n" // a restart: v1 is what a rollback puts back
	snap.Revision++
	snap.Entries = slices.Clone(snap.Entries) // the agent keeps the snapshot it was given
	snap.Entries[0].Value = []byte(v2)
	a.SetSnapshot(snap)
	if !waitBlob(reconcile.Hash([]byte(v2))) {
		t.Fatal("the new version was never kept")
	}
	if b, ok := m.Blob(v1); !ok || string(b) != unitA {
		t.Fatalf("the overwritten version was not kept before the overwrite: %q %v", b, ok)
	}
}

// A pass looks only at the units something touched (focus.go), but what it
// leaves out must not go stale: a unit stopped behind the agent's back shows
// as stopped once its signal came, and the others keep their statuses.
func TestSignalRefreshesOnlyItsUnitsStatus(t *testing.T) {
	a, sd, _ := newAgent(t)
	names := []string{"a.service", "b.service", "c.service"}
	a.SetSnapshot(snapshot(names...))
	stop := runAgent(t, a)
	defer stop()
	waitCalls(t, sd, 4) // daemon-reload, three starts
	statusOf := func(u string) reconcile.Status {
		_, st := a.Statuses()
		for _, s := range st {
			if s.Unit == u {
				return s
			}
		}
		t.Fatalf("no status for %s in %+v", u, st)
		return reconcile.Status{}
	}
	deadline := time.Now().Add(5 * time.Second)
	for statusOf("b.service").ActiveState != "active" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	before := statusOf("a.service")

	sd.mu.Lock()
	sd.active["b.service"] = false // an operator's systemctl stop
	sd.mu.Unlock()
	a.UnitChanged("b.service")
	for statusOf("b.service").ActiveState != "inactive" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := statusOf("b.service"); got.ActiveState != "inactive" {
		t.Fatalf("b.service stopped behind the agent's back: status %+v", got)
	}
	if got := statusOf("a.service"); !got.UpdatedAt.Equal(before.UpdatedAt) || got.ActiveState != "active" {
		t.Errorf("a.service was not touched but its status was built again: before %+v, after %+v", before, got)
	}
	if calls := sd.Calls(); len(calls) != 4 {
		t.Errorf("an operator's stop was undone or acted on: %v", calls)
	}
}

// The periodic resync is the safety net for a missed signal: a unit stopped
// behind the agent's back with no signal at all shows as stopped after it,
// though no pass looked at the unit in between.
func TestResyncCatchesAMissedSignal(t *testing.T) {
	files, m, _ := testDirs(t)
	sd := &fakeSystemd{active: map[string]bool{}}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true, ResyncInterval: 300 * time.Millisecond})
	a.SetSnapshot(snapshot("a.service", "b.service"))
	stop := runAgent(t, a)
	defer stop()
	waitCalls(t, sd, 3)
	sd.mu.Lock()
	sd.active["b.service"] = false // no UnitChanged: the signal was lost
	sd.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		_, st := a.Statuses()
		for _, s := range st {
			if s.Unit == "b.service" && s.ActiveState == "inactive" {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, st := a.Statuses()
	t.Fatalf("after the resync b.service should show inactive: %+v", st)
}
