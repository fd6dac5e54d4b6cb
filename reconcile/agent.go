package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Systemd is what the agent needs from the service manager. Job methods
// wait for the job's result and return an error for anything but "done".
type Systemd interface {
	Reload(ctx context.Context) error
	Start(ctx context.Context, unit string) error
	Stop(ctx context.Context, unit string) error
	Restart(ctx context.Context, unit string) error
	Enable(ctx context.Context, units ...string) error
	Disable(ctx context.Context, units ...string) error
	State(ctx context.Context, unit string) (UnitState, error)
}

// Files is the unit directory. Paths are relative to it.
type Files interface {
	Read(path string) (content []byte, exists bool, err error)
	Write(path string, content []byte) error
	Remove(path string) error
}

// Manifest records the paths the agent owns (see unitdir.Manifest).
type Manifest interface {
	Managed() map[string]string
	Set(path, hash string) error
	Forget(path string) error
}

// Reporter publishes the full set of this host's unit statuses.
type Reporter interface {
	Report(ctx context.Context, statuses []Status) error
}

// Observer hears what the loop does, for metrics and the service manager.
// Methods are called from the loop goroutine and must not block.
type Observer interface {
	// Action is called once per executed action with its kind and result.
	Action(unit string, kind Kind, result string)
	// Pass is called after every pass with its duration and error.
	Pass(d time.Duration, err error)
	// Reported is called after every pass with the statuses it computed.
	Reported(revision int64, st []Status)
	// Heartbeat is called every HeartbeatInterval from the loop itself, so
	// a wedged loop stops calling it (the watchdog's evidence).
	Heartbeat()
	// Drift is called when a managed file was changed behind the agent's back.
	Drift(path string)
	// Rollback is called when a change is rolled back on this host.
	Rollback(unit string)
}

// NopObserver ignores everything; embed it to implement only some methods.
type NopObserver struct{}

func (NopObserver) Action(string, Kind, string) {}
func (NopObserver) Pass(time.Duration, error)   {}
func (NopObserver) Reported(int64, []Status)    {}
func (NopObserver) Heartbeat()                  {}
func (NopObserver) Drift(string)                {}
func (NopObserver) Rollback(string)             {}

// Config wires an Agent. Systemd, Files and Manifest are required.
type Config struct {
	Systemd  Systemd
	Files    Files
	Manifest Manifest
	Reporter Reporter // nil: statuses are only served locally
	Log      *slog.Logger
	Observer Observer // nil: NopObserver

	// HeartbeatInterval is how often the loop calls Observer.Heartbeat
	// (default 1s); set it below half the watchdog interval.
	HeartbeatInterval time.Duration

	// BatchWindow is how long the loop waits for more changes after one
	// arrives, so that a burst is applied with one daemon-reload.
	BatchWindow time.Duration // default 50ms
	// MaxBatchDelay caps that wait under a steady stream of changes.
	MaxBatchDelay time.Duration // default 500ms
	// ResyncInterval is the safety-net full pass, jittered ±10%.
	ResyncInterval time.Duration // default 1m
}

// Agent is the reconcile loop of one host. Run owns all its mutable state;
// other goroutines only poke it (SetSnapshot, UnitChanged) or ask it for
// work through requests, so nothing needs a lock but the hand-off points.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	poke chan struct{}
	reqs chan func(context.Context)

	mu       sync.Mutex
	snap     *Snapshot
	relevant map[string]bool // units the agent cares about, for filtering D-Bus signals
	statuses []Status
	revision int64

	// Loop-owned.
	refused map[string]Refusal
	started map[string]string // unit -> content key last started (see Current.Started)
	last    map[string]outcome
}

type outcome struct {
	action     string
	result     string
	err        string
	contentKey string
	at         time.Time
}

// New returns an agent; call Run to start it.
func New(cfg Config) *Agent {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.BatchWindow <= 0 {
		cfg.BatchWindow = 50 * time.Millisecond
	}
	if cfg.MaxBatchDelay <= 0 {
		cfg.MaxBatchDelay = 500 * time.Millisecond
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = time.Minute
	}
	if cfg.Observer == nil {
		cfg.Observer = NopObserver{}
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = time.Second
	}
	return &Agent{
		cfg:      cfg,
		log:      cfg.Log,
		poke:     make(chan struct{}, 1),
		reqs:     make(chan func(context.Context)),
		relevant: map[string]bool{},
		refused:  map[string]Refusal{},
		started:  map[string]string{},
		last:     map[string]outcome{},
	}
}

// SetSnapshot hands the agent a new complete view of the registry.
// Until the first call the agent touches nothing: with the registry unknown,
// the units on disk stay exactly as they are.
func (a *Agent) SetSnapshot(s Snapshot) {
	a.mu.Lock()
	a.snap = &s
	a.mu.Unlock()
	a.trigger()
}

// UnitChanged tells the agent systemd reported a change of unit ("" means
// anything may have changed, e.g. after a D-Bus reconnect).
func (a *Agent) UnitChanged(unit string) {
	a.mu.Lock()
	rel := unit == "" || a.relevant[unit]
	a.mu.Unlock()
	if rel {
		a.trigger()
	}
}

func (a *Agent) trigger() {
	select {
	case a.poke <- struct{}{}:
	default:
	}
}

// Statuses returns the statuses computed by the last pass.
func (a *Agent) Statuses() (revision int64, st []Status) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.revision, append([]Status(nil), a.statuses...)
}

// DryRun computes the plan the next pass would execute, with the same code,
// and changes nothing.
func (a *Agent) DryRun(ctx context.Context) ([]Action, error) {
	var plan []Action
	err := a.do(ctx, func(ctx context.Context) error {
		desired, cur, err := a.observe(ctx)
		if err != nil {
			return err
		}
		plan = Plan(desired, cur)
		return nil
	})
	return plan, err
}

// Sync runs a pass now and returns the plan it executed.
func (a *Agent) Sync(ctx context.Context) ([]Action, error) {
	var plan []Action
	err := a.do(ctx, func(ctx context.Context) error {
		var err error
		plan, err = a.pass(ctx)
		return err
	})
	return plan, err
}

// ErrNoRegistry is returned when no registry snapshot has arrived yet.
var ErrNoRegistry = errors.New("no registry snapshot yet: the agent has not read the registry since it started")

func (a *Agent) do(ctx context.Context, f func(context.Context) error) error {
	done := make(chan error, 1)
	req := func(ctx context.Context) { done <- f(ctx) }
	select {
	case a.reqs <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run is the loop: a pass at start, after every batch of pokes, on the
// periodic resync, and on retry after a failure. It returns when ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	resync := time.NewTimer(jitter(a.cfg.ResyncInterval))
	defer resync.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	heartbeat := time.NewTicker(a.cfg.HeartbeatInterval)
	defer heartbeat.Stop()
	backoff := time.Duration(0)
	a.trigger()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-heartbeat.C:
			a.cfg.Observer.Heartbeat()
			continue
		case req := <-a.reqs:
			req(ctx)
			continue
		case <-a.poke:
			a.settle(ctx)
		case <-resync.C:
		case <-retry.C:
		}
		resync.Reset(jitter(a.cfg.ResyncInterval))
		start := time.Now()
		_, err := a.pass(ctx)
		a.cfg.Observer.Pass(time.Since(start), err)
		a.cfg.Observer.Heartbeat()
		if err != nil && ctx.Err() == nil {
			backoff = min(max(2*backoff, 250*time.Millisecond), 30*time.Second)
			a.log.Warn("pass failed; retrying", "err", err, "retry_in", backoff)
			retry.Reset(jitter(backoff))
		} else {
			backoff = 0
		}
	}
}

// settle waits until no poke arrived for BatchWindow (at most MaxBatchDelay),
// so changes that arrive together are applied together.
func (a *Agent) settle(ctx context.Context) {
	deadline := time.Now().Add(a.cfg.MaxBatchDelay)
	t := time.NewTimer(a.cfg.BatchWindow)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.poke:
			wait := min(a.cfg.BatchWindow, time.Until(deadline))
			if wait <= 0 {
				return
			}
			t.Reset(wait)
		case <-t.C:
			return
		}
	}
}

func jitter(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}

// observe reads desired state (the last snapshot) and current state (disk,
// manifest, D-Bus).
func (a *Agent) observe(ctx context.Context) (map[string]*DesiredUnit, Current, error) {
	a.mu.Lock()
	snap := a.snap
	a.mu.Unlock()
	if snap == nil {
		return nil, Current{}, ErrNoRegistry
	}
	desired := Desire(*snap)
	cur := Current{
		Files:   map[string]LocalFile{},
		Managed: a.cfg.Manifest.Managed(),
		Units:   map[string]UnitState{},
		Refused: a.refused,
		Started: a.started,
	}
	paths := map[string]bool{}
	units := map[string]bool{}
	for name, u := range desired {
		units[name] = true
		for _, f := range u.Files() {
			paths[f.Path] = true
		}
	}
	for p, h := range cur.Managed {
		units[UnitOfPath(p)] = true
		if h != InstanceMarker {
			paths[p] = true
		}
	}
	for p := range paths {
		b, exists, err := a.cfg.Files.Read(p)
		lf := LocalFile{Exists: exists}
		if err != nil {
			lf.Err = err.Error()
		} else if exists {
			lf.Hash = Hash(b)
		}
		cur.Files[p] = lf
	}
	rel := map[string]bool{}
	for u := range units {
		rel[u] = true
		if d := desired[u]; d != nil && d.Err != nil {
			continue // maybe not even a valid name: do not ask systemd
		}
		st, err := a.cfg.Systemd.State(ctx, u)
		if err != nil {
			return nil, Current{}, fmt.Errorf("read state of %s: %w", u, err)
		}
		cur.Units[u] = st
	}
	a.mu.Lock()
	a.relevant = rel
	a.mu.Unlock()
	return desired, cur, nil
}

// pass observes, plans, applies and reports.
func (a *Agent) pass(ctx context.Context) ([]Action, error) {
	desired, cur, err := a.observe(ctx)
	if errors.Is(err, ErrNoRegistry) {
		return nil, nil // nothing known yet: touch nothing
	}
	if err != nil {
		return nil, err
	}
	plan := Plan(desired, cur)
	applyErr := a.apply(ctx, plan, cur)
	return plan, errors.Join(applyErr, a.report(ctx, desired, plan))
}

// apply executes a plan in a fixed order — stops of removed units, disables,
// file writes and removals, enables, ONE daemon-reload, load checks, jobs —
// so a batch of changes costs one reload. A failure ends that unit's chain
// only; the returned error is for failures that affect every unit (D-Bus).
func (a *Agent) apply(ctx context.Context, plan []Action, cur Current) error {
	failed := map[string]bool{}
	noted := map[string]bool{} // a failure recorded for a unit whose chain goes on
	fail := func(act Action, result string, err error) {
		failed[act.Unit] = true
		a.record(act, result, err)
	}

	// 1–2. Units leaving: stop with their current definition, then disable.
	for _, act := range plan {
		if act.Kind != KindRemove {
			continue
		}
		if st := cur.Units[act.Unit]; st.Active() {
			if err := a.cfg.Systemd.Stop(ctx, act.Unit); err != nil {
				// Keep going: the registry no longer wants this unit, and a
				// unit that will not stop must not keep its file forever.
				a.record(act, resultOf(err), err)
				noted[act.Unit] = true
			}
		}
		if act.Disable {
			if err := a.cfg.Systemd.Disable(ctx, act.Unit); err != nil {
				a.record(act, "failed", err)
				noted[act.Unit] = true
			}
		}
	}

	// 3. Files. The manifest claims a path before the file is written, so a
	// crash in between never leaves a file the agent forgot it owns.
	reloadNeeded := false
	previous := map[string][]byte{} // path -> content before this pass (nil: absent)
	for _, act := range plan {
		if act.Kind == KindBlocked || !act.Changes() {
			continue
		}
		if err := a.writeFiles(act, previous); err != nil {
			fail(act, "failed", err)
		}
		reloadNeeded = true
	}
	for _, act := range plan {
		if act.Kind != KindRemove {
			continue
		}
		for p, h := range cur.Managed {
			if h == InstanceMarker && p == act.Unit {
				if err := a.cfg.Manifest.Forget(p); err != nil {
					fail(act, "failed", err)
				}
			}
		}
	}

	// 4. Enable per [Install]; symlinks only, the reload below picks them up.
	for _, act := range plan {
		if act.Enable && !failed[act.Unit] {
			if err := a.cfg.Systemd.Enable(ctx, act.Unit); err != nil {
				fail(act, "failed", err)
			}
		}
	}

	// 5. One daemon-reload for the whole batch.
	if reloadNeeded {
		if err := a.cfg.Systemd.Reload(ctx); err != nil {
			err = fmt.Errorf("daemon-reload: %w", err)
			for _, act := range plan {
				if act.Changes() && !failed[act.Unit] {
					fail(act, "failed", err)
				}
			}
			return err
		}
	}

	// 6. Content systemd will not load is put back the way it was.
	reloadAgain := false
	for _, act := range plan {
		if len(act.Writes) == 0 || failed[act.Unit] || IsTemplate(act.Unit) {
			continue
		}
		st, err := a.cfg.Systemd.State(ctx, act.Unit)
		if err != nil {
			fail(act, "failed", err)
			continue
		}
		if st.LoadState == "loaded" {
			continue
		}
		reason := fmt.Sprintf("systemd refused to load %s (%s): %s", act.Unit, st.LoadState, st.LoadError)
		if err := a.restoreFiles(act, previous); err != nil {
			reason += "; restoring the previous files failed: " + err.Error()
		}
		a.refused[act.Unit] = Refusal{ContentKey: act.ContentKey, Reason: reason}
		fail(act, "refused", errors.New(reason))
		reloadAgain = true
	}
	if reloadAgain {
		if err := a.cfg.Systemd.Reload(ctx); err != nil {
			return fmt.Errorf("daemon-reload after restoring refused files: %w", err)
		}
	}

	// 7. Jobs, each waited on.
	for _, act := range plan {
		if failed[act.Unit] {
			continue
		}
		var err error
		switch act.Kind {
		case KindStart:
			if act.Instance {
				if err = a.cfg.Manifest.Set(act.Unit, InstanceMarker); err != nil {
					break
				}
			}
			a.started[act.Unit] = act.ContentKey
			err = a.cfg.Systemd.Start(ctx, act.Unit)
		case KindRestart:
			a.started[act.Unit] = act.ContentKey
			err = a.cfg.Systemd.Restart(ctx, act.Unit)
		case KindStop:
			err = a.cfg.Systemd.Stop(ctx, act.Unit)
		case KindNone, KindBlocked:
			continue
		}
		if err != nil {
			fail(act, resultOf(err), err)
			continue
		}
		if !noted[act.Unit] {
			a.record(act, "done", nil)
		}
	}
	for _, act := range plan {
		if act.Kind == KindBlocked {
			if prev, ok := a.last[act.Unit]; !ok || prev.err != act.Err {
				a.record(act, "blocked", errors.New(act.Err))
			}
		}
		if act.Kind == KindRemove {
			delete(a.refused, act.Unit)
			delete(a.started, act.Unit)
		}
	}
	return nil
}

func (a *Agent) writeFiles(act Action, previous map[string][]byte) error {
	for _, w := range act.Writes {
		old, exists, err := a.cfg.Files.Read(w.Path)
		if err != nil {
			return err
		}
		if exists {
			previous[w.Path] = old
		} else {
			previous[w.Path] = nil
		}
		if err := a.cfg.Manifest.Set(w.Path, w.Hash); err != nil {
			return err
		}
		if err := a.cfg.Files.Write(w.Path, w.Content); err != nil {
			return err
		}
	}
	for _, p := range act.Removes {
		if err := a.cfg.Files.Remove(p); err != nil {
			return err
		}
		if err := a.cfg.Manifest.Forget(p); err != nil {
			return err
		}
	}
	return nil
}

func (a *Agent) restoreFiles(act Action, previous map[string][]byte) error {
	var errs []error
	for _, w := range act.Writes {
		old, ok := previous[w.Path]
		if !ok {
			continue
		}
		if old == nil {
			errs = append(errs, a.cfg.Files.Remove(w.Path), a.cfg.Manifest.Forget(w.Path))
			continue
		}
		errs = append(errs, a.cfg.Manifest.Set(w.Path, Hash(old)), a.cfg.Files.Write(w.Path, old))
	}
	return errors.Join(errs...)
}

func (a *Agent) record(act Action, result string, err error) {
	o := outcome{action: act.Kind.String(), result: result, contentKey: act.ContentKey, at: time.Now()}
	if err != nil {
		o.err = err.Error()
	}
	a.last[act.Unit] = o
	a.cfg.Observer.Action(act.Unit, act.Kind, result)
	log := a.log.With("unit", act.Unit, "action", o.action, "result", result)
	if act.Reason != "" {
		log = log.With("reason", act.Reason)
	}
	switch {
	case err != nil && result == "blocked":
		log.Warn("unit not applied", "err", err)
	case err != nil:
		log.Error("action failed", "err", err)
	default:
		log.Info(actionMessage(act.Kind))
	}
}

func actionMessage(k Kind) string {
	switch k {
	case KindStart:
		return "started unit"
	case KindRestart:
		return "replaced unit file, restarted in place"
	case KindStop:
		return "stopped unit"
	case KindUpdate:
		return "replaced unit file"
	case KindRemove:
		return "removed unit"
	}
	return k.String()
}

// resultOf maps a job error to the status "result" word.
func resultOf(err error) string {
	var jr interface{ JobResult() string }
	if errors.As(err, &jr) {
		return jr.JobResult()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "failed"
}

// report builds every unit's status from fresh state and publishes it.
func (a *Agent) report(ctx context.Context, desired map[string]*DesiredUnit, plan []Action) error {
	managed := a.cfg.Manifest.Managed()
	units := map[string]bool{}
	for n := range desired {
		units[n] = true
	}
	for p := range managed {
		units[UnitOfPath(p)] = true
	}
	blockedErr := map[string]string{}
	for _, act := range plan {
		if act.Kind == KindBlocked {
			blockedErr[act.Unit] = act.Err
		}
	}
	var out []Status
	for _, name := range sortedKeys(units) {
		d := desired[name]
		s := Status{Unit: name, UpdatedAt: time.Now().UTC()}
		if d != nil {
			s.DesiredHash = d.Hash()
			if d.File != nil {
				s.Source = d.File.Source
			}
		}
		if _, owned := managed[name]; owned || d == nil || d.Err == nil {
			if b, exists, err := a.cfg.Files.Read(name); err == nil && exists && managed[name] != InstanceMarker {
				s.Hash = Hash(b)
			}
		}
		for p, h := range managed {
			if p != name && UnitOfPath(p) == name && h != InstanceMarker {
				if b, exists, err := a.cfg.Files.Read(p); err == nil && exists {
					if s.DropIns == nil {
						s.DropIns = map[string]string{}
					}
					s.DropIns[p] = Hash(b)
				}
			}
		}
		if d == nil || d.Err == nil {
			st, err := a.cfg.Systemd.State(ctx, name)
			if err != nil {
				return fmt.Errorf("read state of %s: %w", name, err)
			}
			s.LoadState, s.ActiveState, s.SubState = st.LoadState, st.ActiveState, st.SubState
			s.UnitResult, s.MainPID = st.Result, st.MainPID
			if d != nil && d.Policy.State == StateStarted && !IsTemplate(name) && st.ActiveState == "failed" {
				s.Error = fmt.Sprintf("unit failed (result: %s)", st.Result)
			}
		}
		if o, ok := a.last[name]; ok {
			s.Action, s.Result = o.action, o.result
			if o.err != "" && (d == nil || o.contentKey == ContentKey(d)) {
				s.Error = o.err
			}
		}
		if e, ok := blockedErr[name]; ok {
			s.Action, s.Result, s.Error = KindBlocked.String(), "blocked", e
		}
		out = append(out, s)
	}
	a.mu.Lock()
	a.statuses = out
	if a.snap != nil {
		a.revision = a.snap.Revision
	}
	rev := a.revision
	a.mu.Unlock()
	a.cfg.Observer.Reported(rev, out)
	for u := range a.last {
		if !units[u] {
			delete(a.last, u)
		}
	}
	if a.cfg.Reporter == nil {
		return nil
	}
	if err := a.cfg.Reporter.Report(ctx, out); err != nil {
		return fmt.Errorf("report status: %w", err)
	}
	return nil
}

// FileDiff pairs the registry's and the disk's version of one file.
type FileDiff struct {
	Path          string `json:"path"`
	Unit          string `json:"unit"`
	Registry      string `json:"registry"`
	InRegistry    bool   `json:"inRegistry"`
	Local         string `json:"local"`
	OnDisk        bool   `json:"onDisk"`
	Managed       bool   `json:"managed"`
	RegistryHash  string `json:"registryHash,omitempty"`
	LocalHash     string `json:"localHash,omitempty"`
	LocalReadErr  string `json:"localReadError,omitempty"`
	RegistryError string `json:"registryError,omitempty"`
}

// Diff returns registry and disk content of every file of unit ("" for all
// units the agent knows), for `agentd diff`.
func (a *Agent) Diff(ctx context.Context, unit string) ([]FileDiff, error) {
	var out []FileDiff
	err := a.do(ctx, func(ctx context.Context) error {
		a.mu.Lock()
		snap := a.snap
		a.mu.Unlock()
		if snap == nil {
			return ErrNoRegistry
		}
		desired := Desire(*snap)
		managed := a.cfg.Manifest.Managed()
		files := map[string]*FileDiff{}
		for name, u := range desired {
			if unit != "" && name != unit {
				continue
			}
			if u.Err != nil {
				files[name] = &FileDiff{Path: name, Unit: name, RegistryError: u.Err.Error()}
				continue
			}
			for _, f := range u.Files() {
				files[f.Path] = &FileDiff{Path: f.Path, Unit: name, Registry: string(f.Content), InRegistry: true, RegistryHash: f.Hash}
			}
		}
		for p, h := range managed {
			if h == InstanceMarker || (unit != "" && UnitOfPath(p) != unit) {
				continue
			}
			if files[p] == nil {
				files[p] = &FileDiff{Path: p, Unit: UnitOfPath(p)}
			}
		}
		for _, p := range sortedKeys(files) {
			fd := files[p]
			if fd.RegistryError == "" {
				_, fd.Managed = managed[p]
				b, exists, err := a.cfg.Files.Read(p)
				switch {
				case err != nil:
					fd.LocalReadErr = err.Error()
				case exists:
					fd.Local, fd.OnDisk, fd.LocalHash = string(b), true, Hash(b)
				}
			}
			out = append(out, *fd)
		}
		if unit != "" && len(out) == 0 {
			return fmt.Errorf("unit %s is neither in the registry for this host nor managed by the agent", unit)
		}
		return nil
	})
	return out, err
}
