package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"
)

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
	a.focus.reported = map[string]bool{}
	for round := 0; round < maxRounds; round++ {
		a.drainResults(ctx)
		tr := time.Now()
		desired, units, look, cur, err := a.observe(ctx)
		tObserved := time.Now()
		if errors.Is(err, ErrNoRegistry) {
			return nil, nil // nothing known yet: touch nothing
		}
		if err != nil {
			a.focus.all = true // what this round took to look at was not looked at
			return nil, err
		}
		a.judge(ctx, cur)
		a.remember(&cur, look)
		plan := Plan(desired, cur)
		a.planned(units, plan)
		if a.cfg.CheckFocus && units != nil {
			all := a.everyUnit()
			full, err := a.current(ctx, all)
			if err != nil {
				return nil, err
			}
			a.checkFocus(a.desired.units, units, full)
		}
		if round == 0 {
			first = plan
			a.resumeVerification(plan, cur)
		}
		tPlanned := time.Now()
		more, err := a.execute(ctx, plan, cur, round == maxRounds-1)
		a.log.Debug("round", "n", round, "units", len(look), "observe", tObserved.Sub(tr), "plan", tPlanned.Sub(tObserved), "execute", time.Since(tPlanned))
		if err != nil || !more {
			applyErr = err
			break
		}
	}
	a.keepBlobs()
	if err := a.persist(); err != nil {
		// The pass stands: what it did is done, and a later pass saves
		// the records it could not.
		a.log.Error("persist the pass", "err", err)
	}
	t1 := time.Now()
	reportErr := a.report(ctx)
	a.updateFacts()
	if !a.cfg.CheckFocus {
		// Only report looks at this pass's actions again (the check
		// compares them with the next passes' plans).
		a.focus.actions = map[string]Action{}
	}
	a.log.Debug("pass", "apply", t1.Sub(t0), "report", time.Since(t1))
	err := errors.Join(applyErr, reportErr)
	if err != nil {
		a.focus.all = true // the next pass looks at every unit again
	}
	return first, err
}

// drainResults takes the job results that are waiting, so a pass judges
// from the newest knowledge.
func (a *Agent) drainResults(ctx context.Context) {
	for {
		select {
		case r := <-a.jobs.done:
			a.finish(ctx, r)
		default:
			return
		}
	}
}

// execute does what the plan says, in a fixed order: record the intent,
// disable, write and remove files, enable, ONE daemon-reload; then, in a
// round without a reload (or the last), start the jobs. It decides
// nothing. more says the files changed and the caller should plan again.
func (a *Agent) execute(ctx context.Context, plan []Action, cur Current, last bool) (more bool, err error) {
	reload, why := ReloadNeeded(plan, cur)

	// 1. The intent, with the ownership of every path about to be
	// written, in one write, before any side effect.
	claims, err := a.ledger.claim(plan, reload)
	if err != nil {
		return false, err
	}
	for p, h := range claims {
		a.managed.set(p, h)
	}

	// 2. Disables see the [Install] of the file on disk now.
	failed := map[string]bool{}
	disableErrs := inOneCall(ctx, plan, func(act Action) bool { return act.Steps.Disable }, a.cfg.Systemd.Disable)
	for _, act := range plan {
		if act.Steps.Disable {
			if err := disableErrs[act.Unit]; err != nil {
				a.ledger.enableFailed(act.Unit, err.Error())
				a.record(act, "failed", err)
				failed[act.Unit] = act.Kind != KindRemove // a removal goes on: its files must not stay for ever
			} else if !act.Steps.Enable {
				a.ledger.enableOK(act.Unit)
			}
		}
	}
	// 3. Files (a removed unit's failed state is forgotten first).
	for _, act := range plan {
		if act.Steps.ResetFailed && !failed[act.Unit] {
			if err := a.cfg.Systemd.ResetFailed(ctx, act.Unit); err != nil {
				a.log.Warn(act.Unit+": reset-failed", "unit", act.Unit, "err", err)
			}
		}
	}
	wrote := false
	for _, act := range plan {
		if failed[act.Unit] || (!act.Changes() && len(act.Steps.Forget) == 0) {
			continue
		}
		wrote = true
		if err := a.writeFiles(act); err != nil {
			failed[act.Unit] = true
			a.record(act, "failed", err)
		}
	}
	if wrote {
		// The renames reach the disk before systemd reads the files.
		if err := a.flushWrites(); err != nil {
			return false, err
		}
	}
	// 4. Enables: symlinks only, the reload below picks them up.
	enableErrs := inOneCall(ctx, plan, func(act Action) bool { return act.Steps.Enable && !failed[act.Unit] }, a.cfg.Systemd.Enable)
	for _, act := range plan {
		if act.Steps.Enable && !failed[act.Unit] {
			if err := enableErrs[act.Unit]; err != nil {
				a.ledger.enableFailed(act.Unit, err.Error())
				a.record(act, "failed", err)
				failed[act.Unit] = true
			} else {
				a.ledger.enableOK(act.Unit)
			}
		}
	}
	// 5. One daemon-reload for the whole batch.
	if reload {
		a.pause(ctx, "files-written")
		a.log.Debug("daemon-reload", "why", why)
		began := time.Now()
		if err := a.cfg.Systemd.Reload(ctx); err != nil {
			// The intent keeps Reload: the next pass reloads first. The
			// error names the daemon-reload already (Systemd's contract).
			return false, err
		}
		a.log.Debug("daemon-reload done", "took", time.Since(began))
		// Recorded before any job starts (below), or else with the pass's
		// records: a crash before that costs one more daemon-reload at the
		// next start, nothing else.
		a.ledger.reloaded()
		a.mem.loaded = 0 // Current.Loaded: no longer when systemd last loaded the files
	}
	a.afterExecute(plan, reload)
	a.bookkeep(plan, cur, failed)
	if reload && !last {
		return true, nil
	}
	jobs := jobsToRun(plan)
	if jobs {
		a.pause(ctx, "reloaded")
	}
	if ctx.Err() != nil {
		return false, ctx.Err() // shutting down: start nothing new
	}

	// 6. Jobs, in the background; their results come back to the loop.
	if jobs {
		// The reload this pass did (in this round or an earlier one) is
		// recorded before its jobs start, not with the pass's records.
		if err := a.ledger.saveReload(); err != nil {
			return false, err
		}
	}
	gates := jobGates(plan, failed)
	for _, act := range plan {
		if failed[act.Unit] {
			continue
		}
		if act.Steps.Job == JobNone {
			if _, inflight := a.jobs.inflight[act.Unit]; !inflight {
				a.ledger.noJob(act.Unit)
			}
			continue
		}
		if act.Record.Instance && act.Steps.Job == JobStart {
			if err := a.cfg.Manifest.Set(act.Unit, InstanceMarker); err != nil {
				a.record(act, "failed", err)
				continue
			}
			a.managed.set(act.Unit, InstanceMarker)
		}
		if act.Steps.Job == JobStart || act.Steps.Job == JobRestart {
			a.ledger.startedWith(act.Unit, act.ContentKey)
		}
		a.launch(ctx, act, cur.Host.Units[act.Unit], gates)
		delete(gates, act.Unit)
	}
	for _, g := range gates {
		close(g) // a job not launched after all: nothing to wait for
	}
	a.afterJobs()
	if jobs {
		a.pause(ctx, "jobs-started") // crash tests: jobs under way, the pass's records not written
	}
	// 7. Slots, level-triggered: queue for the ones needed now, give back
	// the rest (after any halt this pass wrote).
	a.rememberInFlight(&cur)
	a.syncSlots(ctx, SlotsNeeded(plan, cur))
	return false, nil
}

// inOneCall calls f (Enable, Disable) for the units of the actions pick
// says, in one call: a first sync of 1,000 units with [Install] sections
// made 1,000 calls, one after the other (1.0 s in the agent's debug log).
// When the one call fails, f is called unit by unit, so that one unit's
// error is its own and the others go on (enabling and disabling are
// idempotent). It returns the error of each unit that failed.
func inOneCall(ctx context.Context, plan []Action, pick func(Action) bool, f func(context.Context, ...string) error) map[string]error {
	var units []string
	for _, act := range plan {
		if pick(act) {
			units = append(units, act.Unit)
		}
	}
	if len(units) == 0 {
		return nil
	}
	err := f(ctx, units...)
	if err == nil {
		return nil
	}
	if len(units) == 1 {
		return map[string]error{units[0]: err}
	}
	errs := map[string]error{}
	for _, u := range units {
		if err := f(ctx, u); err != nil {
			errs[u] = err
		}
	}
	return errs
}

// bookkeep records what the plan says about units that need no job: a
// change that took effect with the reload, a refusal, a removal, a block.
func (a *Agent) bookkeep(plan []Action, cur Current, failed map[string]bool) {
	for _, act := range plan {
		if failed[act.Unit] {
			continue
		}
		u := act.Unit
		if act.Own != OwnNone && act.Kind != KindBlocked {
			a.ledger.own(u, act.Own)
		}
		if act.Record.Adopt {
			job := JobNone
			if act.Record.Ran {
				job = JobRestart // the owed job was the agent's start or restart
			}
			a.ledger.applied(act, job, a.mem.manager)
			if act.Record.Ran {
				// The owed job ran before the agent died: judged as if it
				// had just ended (HealthySec from now).
				a.recordAs(act, ActionAdopt, "done", nil)
				a.ledger.begin(act, JobDone, "", cur.Host.Units[u], time.Now())
			} else if !a.ledger.verifying(u) {
				a.ledger.good(u, act.Record.Effective)
			}
		}
		if act.Kind != KindBlocked && a.ledger.last[u].action == ActionBlocked {
			a.ledger.forgetOutcome(u) // no longer blocked: the old verdict would only confuse
		}
		switch {
		case act.Record.Refuse != nil:
			a.ledger.refuse(u, *act.Record.Refuse)
			a.record(act, "refused", errors.New(act.Err))
		case act.Kind == KindBlocked:
			if prev, ok := a.ledger.last[u]; !ok || (prev.err != act.Err && prev.action != ActionRolledBack) {
				a.record(act, "blocked", errors.New(act.Err))
			}
		case act.Kind == KindUpdate && act.Err != "":
			if prev, ok := a.ledger.last[u]; !ok || prev.err != act.Err {
				a.record(act, "failed", errors.New(act.Err))
			}
		case act.Kind == KindUpdate:
			a.record(act, "done", nil)
		case act.Kind == KindRollback && act.Steps.Job == JobNone:
			a.recordAs(act, ActionRolledBack, "done", errors.New(act.Reason))
			a.ledger.rolledBackInPlace(u, act.Record.Effective)
		}
		if act.Record.DropRecord {
			if act.Kind == KindRemove && (len(act.Steps.Removes) > 0 || len(act.Steps.Forget) > 0) {
				a.record(act, "done", nil)
			}
			a.ledger.drop(u)
		}
	}
}

func (a *Agent) writeFiles(act Action) error {
	write := a.cfg.Files.Write
	if b, ok := a.cfg.Files.(batchWriter); ok {
		write = b.WriteBatched
	}
	for _, w := range act.Steps.Writes {
		// What the file holds now is what a rollback of this change puts
		// back: normally kept since the pass that wrote it (keepBlobs),
		// unless the agent died before that pass ended.
		// (PutBlob only looks when it is there already.)
		if old, ok := a.cache.files[w.Path]; ok && old.Exists && old.Hash != w.Hash {
			if err := a.cfg.Manifest.PutBlob(old.Hash, old.Content); err != nil {
				return err
			}
		}
		if err := write(w.Path, w.Content); err != nil {
			return err
		}
		a.blobs.written = append(a.blobs.written, w)
	}
	for _, p := range act.Steps.Removes {
		if err := a.cfg.Files.Remove(p); err != nil {
			return err
		}
		if err := a.cfg.Manifest.Forget(p); err != nil {
			return err
		}
		a.managed.forget(p)
	}
	for _, p := range act.Steps.Forget {
		if err := a.cfg.Manifest.Forget(p); err != nil {
			return err
		}
		a.managed.forget(p)
	}
	return nil
}

// keepBlobs keeps the content of the files this pass wrote by hash, for
// classifying and rolling back later changes. It runs at the end of the
// pass, after the jobs began: the new content is on disk (in the unit
// file itself) until a later pass overwrites it, and that pass makes sure
// its blob exists first (writeFiles). Before, two more fsyncs stood
// between every put and its restart.
func (a *Agent) keepBlobs() {
	if len(a.blobs.written) == 0 {
		return
	}
	var errs []error
	for _, w := range a.blobs.written {
		errs = append(errs, a.cfg.Manifest.PutBlob(w.Hash, w.Content))
	}
	if f, ok := a.cfg.Manifest.(flusher); ok {
		errs = append(errs, f.Flush())
	}
	a.blobs.written = a.blobs.written[:0]
	if err := errors.Join(errs...); err != nil {
		// Only a rollback of a later change needs them; writeFiles
		// tries again from the file itself before it overwrites it.
		a.log.Warn("keep unit file versions in the state directory", "err", err)
	}
}

// batchWriter is an optional capability of Files: a write whose directory
// fsync waits for Flush, so a batch of files costs one fsync per directory
// rather than one per file (unitdir.Dir).
type batchWriter interface {
	WriteBatched(path string, content []byte) error
	Flush() error
}

// flusher is an optional capability of the Manifest: blobs put since the
// last Flush are durable once it returns.
type flusher interface{ Flush() error }

// flushWrites makes the pass's file writes and blobs durable.
func (a *Agent) flushWrites() error {
	var errs []error
	if b, ok := a.cfg.Files.(batchWriter); ok {
		errs = append(errs, b.Flush())
	}
	if f, ok := a.cfg.Manifest.(flusher); ok {
		errs = append(errs, f.Flush()) // a blob writeFiles kept
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sync the unit and state directories: %w", err)
	}
	return nil
}

func (a *Agent) pause(ctx context.Context, at string) {
	if a.cfg.Pause != nil {
		a.cfg.Pause(ctx, at)
	}
}

// jobGates has a channel for each unit whose job another job of this plan
// runs after (Action.After; the planner sets it only beside a job):
// closed when that unit's job has ended, or when it is not launched.
func jobGates(plan []Action, failed map[string]bool) map[string]chan struct{} {
	gates := map[string]chan struct{}{}
	for _, act := range plan {
		if act.Steps.After != "" && act.Steps.Job != JobNone && !failed[act.Unit] {
			gates[act.Steps.After] = make(chan struct{})
		}
	}
	return gates
}

func jobsToRun(plan []Action) bool {
	for _, act := range plan {
		if act.Steps.Job != JobNone {
			return true
		}
	}
	return false
}
