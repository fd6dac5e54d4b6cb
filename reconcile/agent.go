package reconcile

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Config wires an Agent. Systemd, Files and Manifest are required.
type Config struct {
	Systemd  Systemd
	Files    Files
	Manifest Manifest
	Reporter Reporter // nil: statuses are only served locally
	// Facts publishes what previews need of this host (facts.go); nil:
	// nothing is published.
	Facts    FactsPublisher
	Log      *slog.Logger
	Observer Observer // nil: NopObserver
	// Coordinator coordinates MaxUnavailable= and halts across hosts; nil
	// means this agent alone (slots are always free, nothing is halted).
	Coordinator Coordinator
	// Host is this agent's host name (for halt records).
	Host string
	// Labels returns this host's labels as it publishes them
	// (Member.Labels), read at every pass: a unit with MaxUnavailableBy=
	// takes its slot in the bucket of this host's value (Bucket). It is
	// the one way the agent reads its labels, so that labels changed at
	// run time are used from the next pass; it must be safe to call from
	// the loop. nil: no labels (every such unit in its "(no KEY)" bucket).
	Labels func() map[string]string
	// Prober runs the [X-Agentd] health probes (probe.Runner); nil: every
	// probe fails, saying no prober is configured.
	Prober Prober
	// Confirmer confirms that the agent still reaches its control plane
	// after a change of a unit with ConfirmSec= (confirm.go); nil: no
	// change awaits a confirmation (ConfirmSec= is ignored).
	Confirmer Confirmer

	// HeartbeatInterval is how often the idle loop calls Observer.Heartbeat
	// (it also calls it after every pass); set it below half the watchdog
	// interval. 0: only after passes — no timer wakes an idle agent.
	HeartbeatInterval time.Duration

	// BatchWindow is how long the loop waits for more changes after one
	// arrives, so that a burst is applied with one daemon-reload.
	BatchWindow time.Duration // default 20ms
	// MaxBatchDelay caps that wait under a steady stream of changes.
	MaxBatchDelay time.Duration // default 500ms
	// ResyncInterval is the safety-net full pass, jittered ±10%.
	ResyncInterval time.Duration // default 5m

	// CheckFocus, for tests, plans every unit beside each pass that looks
	// at only some of them, and panics when a unit it left out would have
	// been planned differently (see focus.go). It makes every pass cost
	// what a full one does.
	CheckFocus bool

	// Trust, when set, makes the agent refuse every change of a registry
	// key that an allowed signer did not sign (trust.go); nil: none is
	// checked.
	Trust *Trust

	// Secrets decrypts the config files put with --secret (the host's age
	// identity, secret.Identity); nil: a secret is the unit's error.
	Secrets Decrypter
	// Credentials makes the systemd credentials of secrets put with
	// --credential (systemd-creds); nil: such a secret is the unit's
	// error.
	Credentials Credentials

	// Pause, when set, is called at named points of a pass ("files-written":
	// files are on disk, the daemon-reload not done; "reloaded": reloaded,
	// no job started; "jobs-started": the pass's jobs under way, its
	// records not written; "job-done": a job's result taken, not yet
	// recorded in the state directory). Crash tests block there and kill
	// the agent.
	Pause func(ctx context.Context, at string)
}

// Agent is the reconcile loop of one host. Run's goroutine owns its state
// but for four parts shared under a lock each with the goroutines it
// meets: handoff (the snapshot in, statuses out, what signals and fsnotify
// said changed), slots (filled by the goroutines that wait for them), and
// the statuses' and the facts' publishers (each emptied by the goroutine
// that publishes). Other goroutines only poke it (SetSnapshot,
// UnitChanged), hand it job and probe results over channels, or ask it
// for work through requests.
//
// Its parts keep their own state and know none of each other: the view
// (what the loop sees; it reads the others only through remembered and
// inbox), the ledger, the executor, the jobs, the probes, the confirms, the slots, the
// facts and the statuses' publisher. The loop alone calls them, in order: observe (view),
// judge and plan, recheck (slots, halts), execute (executor, jobs), record
// (ledger, finish), publish (report, facts).
type Agent struct {
	cfg  Config
	log  *slog.Logger
	reqs requests

	handoff handoff  // the snapshot in, statuses out, the pokes
	view    view     // what the loop sees: systemd's and the disk's state, the desired units, which units a pass looks at
	ledger  ledger   // the records, intent and HealthySec windows: its only writer
	exec    executor // does the steps of a plan
	jobs    jobs     // jobs in flight, and what runs them
	probes  probes   // health probes, and what runs them
	// confirms are the tries to confirm the changes awaiting it (ConfirmSec=)
	confirms confirms
	slots    slotTable // MaxUnavailable slots
	// managed is the loop's copy of the manifest's owned paths.
	managed managedIndex
	out     reports // the statuses handed out, and their publisher
	// facts are the host's facts for previews, and their publisher.
	facts factsState

	// What works on the parts above, each holding those it needs.
	round    round         // carries out a round's plan (execute.go)
	results  results       // takes what comes back: job and probe results, verdicts (results.go)
	statuses statusBuilder // builds and hands out the statuses (report.go)
}

// agentMemory is what the view reads of the agent's other parts
// (remembered): the ledger, the jobs in flight, the managed paths and the
// slots held.
type agentMemory struct {
	l *ledger
	j *jobs
	m *managedIndex
	s *slotTable
}

func (r agentMemory) records() map[string]UnitRecord { return r.l.records }
func (r agentMemory) verifying() map[string]*window  { return r.l.verify }
func (r agentMemory) intent() Intent                 { return r.l.intent }
func (r agentMemory) refused() map[string]Refusal    { return r.l.refused }
func (r agentMemory) started() map[string]string     { return r.l.started }
func (r agentMemory) inFlight() map[string]*jobRun   { return r.j.inflight }
func (r agentMemory) managedOf(unit string) iter.Seq2[string, Owned] {
	return r.m.of(unit)
}
func (r agentMemory) managedPaths() map[string]Owned    { return r.m.paths }
func (r agentMemory) managedUnits() map[string][]string { return r.m.byUnit }
func (r agentMemory) slotsHeld() map[string]string      { return r.s.held() }

// New returns an agent; call Run to start it.
func New(cfg Config) *Agent {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.BatchWindow <= 0 {
		cfg.BatchWindow = 20 * time.Millisecond
	}
	if cfg.MaxBatchDelay <= 0 {
		cfg.MaxBatchDelay = 500 * time.Millisecond
	}
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = 5 * time.Minute
	}
	if cfg.Observer == nil {
		cfg.Observer = NopObserver{}
	}
	if cfg.Pause == nil {
		cfg.Pause = func(context.Context, string) {}
	}
	a := &Agent{
		out:      newReports(cfg.Reporter, cfg.Log),
		cfg:      cfg,
		log:      cfg.Log,
		reqs:     make(requests),
		handoff:  handoff{poke: make(chan struct{}, 1), relevant: map[string]bool{}},
		ledger:   newLedger(cfg.Manifest),
		exec:     executor{sd: cfg.Systemd, files: cfg.Files, man: cfg.Manifest, log: cfg.Log},
		jobs:     newJobs(cfg.Systemd, cfg.Log),
		probes:   newProbes(cfg.Prober, cfg.Observer, cfg.Log),
		confirms: newConfirms(cfg.Confirmer, cfg.Log),
		slots:    slotTable{coord: cfg.Coordinator, host: cfg.Host, log: cfg.Log, slots: map[string]*slot{}},
		managed:  newManagedIndex(cfg.Manifest.Managed()),
		facts:    newFactsState(cfg.Facts, cfg.Files, fileRoots(cfg.Files), cfg.Log),
	}
	a.slots.poke = a.handoff.trigger
	a.view = newView(cfg, agentMemory{&a.ledger, &a.jobs, &a.managed, &a.slots}, &a.handoff, a.facts.notePaths)
	rec := recorder{ledger: &a.ledger, obs: cfg.Observer, log: cfg.Log}
	a.round = round{ledger: &a.ledger, managed: &a.managed, view: &a.view, exec: a.exec, jobs: &a.jobs, probes: &a.probes,
		confirms: &a.confirms, slots: &a.slots, handoff: &a.handoff, man: cfg.Manifest, log: cfg.Log, pause: cfg.Pause, rec: rec}
	a.results = results{ledger: &a.ledger, view: &a.view, jobs: &a.jobs, probes: &a.probes, confirms: &a.confirms,
		handoff: &a.handoff, obs: cfg.Observer, log: cfg.Log, pause: cfg.Pause, rec: rec}
	a.statuses = statusBuilder{view: &a.view, ledger: &a.ledger, jobs: &a.jobs, probes: &a.probes, confirms: &a.confirms,
		out: &a.out, handoff: &a.handoff, obs: cfg.Observer, check: cfg.CheckFocus}
	return a
}

// SetSnapshot hands the agent a new complete view of the registry.
// Until the first call the agent touches nothing: with the registry unknown,
// the units on disk stay exactly as they are. The agent keeps s and
// compares the next snapshot with it: neither s.Entries nor their values
// may be modified afterwards (the registry's watcher hands out a new slice
// each time and shares only unchanged values).
func (a *Agent) SetSnapshot(s Snapshot) {
	a.log.Debug("registry snapshot", "revision", s.Revision)
	a.handoff.setSnapshot(&s)
}

// UnitChanged tells the agent systemd reported a change of unit ("" means
// anything may have changed, e.g. after a D-Bus reconnect).
func (a *Agent) UnitChanged(unit string) { a.handoff.unitChanged(unit) }

// FileChanged tells the agent something changed in the unit directory
// (fsnotify; path is relative to it, "" means anything may have): a managed
// file edited by hand is restored on the next pass.
func (a *Agent) FileChanged(path string) { a.handoff.fileChanged(path) }

// Statuses returns the statuses computed by the last pass.
func (a *Agent) Statuses() (revision int64, st []Status) { return a.handoff.lastStatuses() }

// DryRun computes the plan Sync would execute, with the same code and from
// everything read afresh, and changes nothing.
func (a *Agent) DryRun(ctx context.Context) ([]Action, error) {
	var plan []Action
	err := a.reqs.do(ctx, func(ctx context.Context) error {
		a.view.forgetAll()
		desired, _, _, cur, err := a.view.observe(ctx)
		if err != nil {
			return err
		}
		plan, _ = a.slots.recheck(ctx, nil, desired, cur, Plan(desired, cur))
		a.view.lookAtAll() // nothing was kept of this plan: the next pass plans every unit
		return nil
	})
	return plan, err
}

// Sync runs a pass now, from everything read afresh (what an operator asks
// for), and returns the plan it executed once its statuses are published.
func (a *Agent) Sync(ctx context.Context) ([]Action, error) {
	var plan []Action
	var gen uint64
	err := a.reqs.do(ctx, func(ctx context.Context) error {
		a.view.forgetAll()
		var err error
		plan, err = a.observedPass(ctx)
		gen = a.out.gen
		return err
	})
	if err == nil && a.out.pub != nil {
		err = a.out.pub.published(ctx, gen)
	}
	return plan, err
}

// ErrNoRegistry is returned when no registry snapshot has arrived yet.
var ErrNoRegistry = errors.New("no registry snapshot yet: the agent has not read the registry since it started")

// Run is the loop: a pass at start, after every batch of pokes and job
// results, on the periodic resync, at the next HealthySec or ConfirmSec
// deadline, on retry after a failure, when a health probe's result changes
// a status or may end a window, and when a change is confirmed. It returns
// when ctx ends, once the goroutines it started (jobs, probes, confirm
// tries, slot waits) have returned.
func (a *Agent) Run(ctx context.Context) error {
	resync := time.NewTimer(Jitter(a.cfg.ResyncInterval))
	defer resync.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	defer a.slots.wg.Wait()
	defer a.jobs.wg.Wait()
	defer a.probes.wg.Wait()
	defer a.confirms.wg.Wait()
	defer a.facts.start(ctx)()
	defer a.view.marks.start(ctx)()
	if a.out.pub != nil {
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { a.out.pub.run(ctx) })
	}
	var heartbeat <-chan time.Time // none: no watchdog to feed
	if a.cfg.HeartbeatInterval > 0 {
		t := time.NewTicker(a.cfg.HeartbeatInterval)
		defer t.Stop()
		heartbeat = t.C
	}
	wake := time.NewTimer(time.Hour) // the next HealthySec deadline
	wake.Stop()
	defer wake.Stop()
	backoff := time.Duration(0)
	a.handoff.trigger()
	hot := false // an event came in during the last pass
	var lastEnd time.Time
	for {
		// An event that came in during the last pass has waited out a
		// whole pass already: it gets no batch window.
		if !hot {
			select {
			case <-ctx.Done():
				return nil
			case <-heartbeat:
				a.cfg.Observer.Heartbeat()
				continue
			case req := <-a.reqs:
				req(ctx)
				continue
			case r := <-a.jobs.done:
				a.results.finish(ctx, r)
				a.settle(ctx, lastEnd)
			case <-a.handoff.poke:
				a.settle(ctx, lastEnd)
			case r := <-a.probes.done:
				if !a.results.probeDone(r) {
					a.results.launchProbes(ctx)
					continue
				}
			case <-a.probes.wake():
				a.results.launchProbes(ctx)
				continue
			case r := <-a.confirms.done:
				if !a.results.confirmed(ctx, r) {
					continue
				}
			case <-a.confirms.wake():
				a.confirms.woken(ctx)
				continue
			case <-resync.C:
				a.view.resyncCache(ctx)
			case <-retry.C:
			case <-wake.C:
			}
		}
		hot = false
		resync.Reset(Jitter(a.cfg.ResyncInterval))
		_, err := a.observedPass(ctx)
		lastEnd = time.Now()
		a.cfg.Observer.Heartbeat()
		// The loop looks again by the clock at the next end of a
		// HealthySec window or of a ConfirmSec window.
		next, ok := a.ledger.nextDeadline(time.Now())
		if c, cok := a.confirms.nextDeadline(); cok && (!ok || c.Before(next)) {
			next, ok = c, true
		}
		if ok {
			wake.Reset(time.Until(next) + 10*time.Millisecond)
		}
		select {
		case <-a.handoff.poke:
			hot = err == nil // a failed pass waits for its retry
		default:
		}
		if err != nil && ctx.Err() == nil {
			a.view.forgetAll() // the retry reads everything again
			backoff = min(max(2*backoff, 250*time.Millisecond), 30*time.Second)
			a.log.Warn("pass failed; retrying", "err", err, "retry_in", backoff)
			retry.Reset(Jitter(backoff))
		} else {
			backoff = 0
		}
	}
}

// observedPass is a pass between the Observer's PassStart and Pass.
func (a *Agent) observedPass(ctx context.Context) ([]Action, error) {
	start := time.Now()
	a.cfg.Observer.PassStart()
	plan, err := a.pass(ctx)
	a.cfg.Observer.Pass(time.Since(start), err)
	return plan, err
}

// settle waits until no poke or job result arrived for BatchWindow (at
// most MaxBatchDelay), so changes that arrive together are applied
// together. But it starts the pass at once when the loop was quiet for a
// BatchWindow before this event (the last pass ended at lastEnd): a lone
// change pays no batching delay (the registry already let a transaction
// settle). Otherwise events are coming in a stream, and it settles.
func (a *Agent) settle(ctx context.Context, lastEnd time.Time) {
	if time.Since(lastEnd) >= a.cfg.BatchWindow {
		return
	}
	deadline := time.Now().Add(a.cfg.MaxBatchDelay)
	t := time.NewTimer(a.cfg.BatchWindow)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-a.jobs.done:
			a.results.finish(ctx, r)
		case <-a.handoff.poke:
		case <-t.C:
			return
		}
		wait := min(a.cfg.BatchWindow, time.Until(deadline))
		if wait <= 0 {
			return
		}
		t.Reset(wait)
	}
}

// maxRounds bounds the plan → execute rounds of one pass. A round that
// changes files ends with the daemon-reload and the next round plans again
// from what systemd then says (a unit it refuses to load, the jobs to run);
// a round without a reload runs the jobs. Normally two rounds.
const maxRounds = 3

// pass observes, judges health, plans and executes, in rounds, then
// persists and reports. It returns the first round's plan: what the pass
// decided.
func (a *Agent) pass(ctx context.Context) ([]Action, error) {
	t0 := time.Now()
	var first []Action
	var applyErr error
	a.view.beginPass()
	for i := 0; i < maxRounds; i++ {
		a.results.drain(ctx)
		a.results.expireConfirms() // before observing: a change put back is planned this round
		tr := time.Now()
		desired, units, look, cur, err := a.view.observe(ctx)
		tObserved := time.Now()
		if errors.Is(err, ErrNoRegistry) {
			return nil, nil // nothing known yet: touch nothing
		}
		if err != nil {
			a.view.lookAtAll() // what this round took to look at was not looked at
			return nil, err
		}
		failures := a.results.judge(cur)
		a.view.remember(&cur, look)
		plan := Plan(desired, cur)
		plan, cur = a.slots.recheck(ctx, failures, desired, cur, plan)
		a.view.planned(units, plan)
		a.probes.follow(plan, look, cur)
		if a.cfg.CheckFocus && units != nil {
			all := a.view.everyUnit()
			full, err := a.view.current(ctx, all)
			if err != nil {
				return nil, err
			}
			a.view.checkFocus(units, full)
		}
		if i == 0 {
			first = plan
			// A unit that runs a version never judged healthy gets its
			// HealthySec window back (ledger.resume).
			for _, act := range a.ledger.resume(plan, cur, time.Now()) {
				a.log.Info(act.Unit+": resuming the health check of a version not yet judged healthy", "unit", act.Unit, "healthy_sec", act.Policy.Healthy.Seconds())
			}
			a.confirms.resume(plan, a.ledger.records, a.jobs.running)
		}
		tPlanned := time.Now()
		more, err := a.round.execute(ctx, plan, cur, i == maxRounds-1)
		a.log.Debug("round", "n", i, "units", len(look), "observe", tObserved.Sub(tr), "plan", tPlanned.Sub(tObserved), "execute", time.Since(tPlanned))
		if err != nil || !more {
			applyErr = err
			break
		}
	}
	a.round.keepBlobs()
	if err := a.persist(); err != nil {
		// The pass stands: what it did is done, and a later pass saves
		// the records it could not.
		a.log.Error("persist the pass", "err", err)
	}
	t1 := time.Now()
	reportErr := a.statuses.report(ctx)
	a.facts.update(a.managed.paths, a.ledger.refused, a.ledger.records)
	a.view.endPass()
	a.results.launchProbes(ctx)
	a.confirms.tryIfDue(ctx)
	a.log.Debug("pass", "apply", t1.Sub(t0), "report", time.Since(t1))
	err := errors.Join(applyErr, reportErr)
	if err != nil {
		a.view.lookAtAll() // the next pass looks at every unit again
	}
	return first, err
}

// persist saves the records that changed, in one write (ledger.save).
// Only the records of units this pass planned, or touched for the next,
// can have changed; after a pass over every unit all are compared, and
// blobs nothing refers to any more are dropped. A failed save skips the
// clean-up.
func (a *Agent) persist() error {
	units := a.view.changedUnits() // nil: all
	full := units == nil
	if err := a.ledger.save(units); err != nil {
		return err
	}
	if !full {
		return nil
	}
	a.view.pruneKept()
	return a.ledger.gc()
}

// Jitter spreads a periodic interval by ±10 %, so that agents restarted
// together do not act in step (the loop's resync and retry, the
// registry's lease renewal and resync, the rollout coordinator's
// retries): one rule for all of them.
func Jitter(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}

// Diff returns registry and disk content of every file of unit ("" for all
// units the agent knows), for `agentd diff`.
func (a *Agent) Diff(ctx context.Context, unit string) ([]FileDiff, error) {
	var out []FileDiff
	err := a.reqs.do(ctx, func(ctx context.Context) error {
		snap := a.handoff.snapshot()
		if snap == nil {
			return ErrNoRegistry
		}
		var err error
		out, err = diffFiles(*snap, a.cfg.Manifest.Managed(), a.cfg.Files, a.view.desired.units, unit)
		return err
	})
	return out, err
}
