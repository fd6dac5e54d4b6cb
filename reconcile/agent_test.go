package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"math"
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
func (f *fakeSystemd) Restart(_ context.Context, u string) error    { f.rec("restart " + u); return nil }
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
	_, st := a.Statuses()
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
