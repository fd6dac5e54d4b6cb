// Executing a round's plan: the executor's steps in their order, and
// what the ledger, the managed paths and the jobs take of them.

package reconcile

import (
	"context"
	"errors"
	"time"
)

// execute does what the plan says, in a fixed order: record the intent,
// disable, write and remove files, enable, ONE daemon-reload; then, in a
// round without a reload (or the last), start the jobs. The executor does
// the steps; execute records what came of them. It decides nothing. more
// says the files changed and the caller should plan again.
func (a *Agent) execute(ctx context.Context, plan []Action, cur Current, last bool) (more bool, err error) {
	reload, why := ReloadNeeded(plan, cur)
	// 1. The intent, with the ownership of every path about to be
	// written, in one write, before any side effect.
	claims, err := a.ledger.claim(plan, reload, cur.Host.Files)
	if err != nil {
		return false, err
	}
	for p, h := range claims {
		a.managed.set(p, Owned{Hash: h})
	}
	a.cfg.Pause(ctx, "claimed")
	// 2.-4. Disable, files, enable.
	failed, err := a.applyFiles(ctx, plan)
	a.ledger.wrote()
	if err != nil {
		return false, err
	}
	// 5. One daemon-reload for the whole batch.
	if reload {
		a.cfg.Pause(ctx, "files-written")
		if err := a.exec.reload(ctx, why); err != nil {
			return false, err // the intent keeps Reload: the next pass reloads first
		}
		// Recorded before any job starts (startJobs), or else with the
		// pass's records: a crash before that costs one more
		// daemon-reload at the next start, nothing else.
		a.ledger.reloaded()
	}
	a.view.afterExecute(plan, reload)
	a.bookkeep(plan, cur, failed)
	if reload && !last {
		return true, nil
	}
	return false, a.startJobs(ctx, plan, cur, failed)
}

// applyFiles has the executor disable, write and remove files, and enable,
// and records what failed: a unit that failed a step goes no further (but
// a removal whose disable failed: its files must not stay for ever). The
// error is that of making the writes durable.
func (a *Agent) applyFiles(ctx context.Context, plan []Action) (failed map[string]bool, err error) {
	failed = map[string]bool{}
	// Disables see the [Install] of the file on disk now.
	disableErrs := a.exec.disable(ctx, plan)
	for _, act := range plan {
		if act.Steps.Disable {
			if err := disableErrs[act.Unit]; err != nil {
				a.ledger.enableFailed(act.Unit, err.Error())
				a.record(act, ResultFailed, err)
				failed[act.Unit] = act.Kind != KindRemove
			} else if !act.Steps.Enable {
				a.ledger.enableOK(act.Unit)
			}
		}
	}
	a.exec.resetFailed(ctx, plan, failed) // a removed unit's failed state is forgotten before its files go
	w := a.exec.write(plan, failed, a.view.replaced(plan))
	a.written = append(a.written, w.written...)
	for _, p := range w.forgotten {
		a.managed.forget(p)
	}
	for _, act := range plan {
		if err := w.errs[act.Unit]; err != nil {
			failed[act.Unit] = true
			a.record(act, ResultFailed, err)
		}
	}
	if w.any {
		if err := a.exec.flush(); err != nil {
			return nil, err
		}
	}
	enableErrs := a.exec.enable(ctx, plan, failed)
	for _, act := range plan {
		if act.Steps.Enable && !failed[act.Unit] {
			if err := enableErrs[act.Unit]; err != nil {
				a.ledger.enableFailed(act.Unit, err.Error())
				a.record(act, ResultFailed, err)
				failed[act.Unit] = true
			} else {
				a.ledger.enableOK(act.Unit)
			}
		}
	}
	return failed, nil
}

// startJobs starts the plan's jobs in the background (jobs.launch); their
// results come back to the loop. Then the slots, level-triggered: queue
// for the ones needed now, give back the rest (after any halt this pass
// wrote).
func (a *Agent) startJobs(ctx context.Context, plan []Action, cur Current, failed map[string]bool) error {
	jobs := jobsToRun(plan)
	if jobs {
		a.cfg.Pause(ctx, "reloaded")
	}
	if ctx.Err() != nil {
		return ctx.Err() // shutting down: start nothing new
	}
	if jobs {
		// The reload this pass did (in this round or an earlier one) is
		// recorded before its jobs start, not with the pass's records.
		if err := a.ledger.saveReload(); err != nil {
			return err
		}
	}
	ends := jobEnds(plan, failed)
	for _, act := range plan {
		if failed[act.Unit] {
			continue
		}
		if act.Steps.Job == JobNone {
			if !a.jobs.running(act.Unit) {
				a.ledger.noJob(act.Unit)
			}
			continue
		}
		if act.Record.Instance && act.Steps.Job == JobStart {
			if err := a.cfg.Manifest.Set(act.Unit, Owned{Instance: true}); err != nil {
				a.record(act, ResultFailed, err)
				continue
			}
			a.managed.set(act.Unit, Owned{Instance: true})
		}
		if act.Steps.Job == JobStart || act.Steps.Job == JobRestart {
			a.ledger.startedWith(act.Unit, act.ContentKey)
		}
		a.handoff.jobStarted(act.Unit)
		// A new job supersedes the verification of what the unit ran: that
		// version is not judged by what the new job does to the unit. Its
		// confirmation too, when the job is for other content.
		a.ledger.supersede(act.Unit)
		if a.confirms.supersede(act) {
			a.ledger.unmarkConfirming(act.Unit)
		}
		a.probes.reset(act.Unit) // and its probes start afresh
		a.jobs.launch(ctx, act, cur.Host.Units[act.Unit], ends, a.view.stateReader(act.Unit), a.handoff.mutedOf)
		delete(ends, act.Unit)
	}
	for _, e := range ends {
		close(e) // a job not launched after all: nothing to wait for
	}
	a.view.afterJobs()
	if jobs {
		a.cfg.Pause(ctx, "jobs-started") // crash tests: jobs under way, the pass's records not written
	}
	a.view.rememberInFlight(&cur)
	a.slots.sync(ctx, SlotsNeeded(plan, cur))
	return nil
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
			change := a.ledger.applied(act, job, a.view.manager())
			if a.confirms.await(act, change, a.ledger.records[u], time.Now()) {
				a.ledger.markConfirming(u, act.ContentKey)
			}
			if act.Record.Ran {
				// The owed job ran before the agent died: judged as if it
				// had just ended (HealthySec from now).
				a.recordAs(act, ActionAdopt, ResultDone, nil)
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
			a.record(act, ResultRefused, errors.New(act.Err))
		case act.Kind == KindBlocked:
			// A rollback's verdict stays what the status says while its
			// content is held; other content blocked after it is news.
			p, ok := a.ledger.last[u]
			held := p.action == ActionRolledBack && p.contentKey == act.ContentKey
			if !ok || (p.err != act.Err && !held) {
				a.record(act, ResultBlocked, errors.New(act.Err))
			}
		case act.Kind == KindUpdate && act.Err != "":
			if prev, ok := a.ledger.last[u]; !ok || prev.err != act.Err {
				a.record(act, ResultFailed, errors.New(act.Err))
			}
		case act.Kind == KindUpdate:
			a.record(act, ResultDone, nil)
		case act.Kind == KindRollback && act.Steps.Job == JobNone:
			a.recordAs(act, ActionRolledBack, ResultDone, errors.New(act.Reason))
			a.ledger.rolledBackInPlace(u, act.Record.Effective)
		}
		if act.Record.DropRecord {
			if act.Kind == KindRemove && (len(act.Steps.Removes) > 0 || len(act.Steps.Forget) > 0) {
				a.record(act, ResultDone, nil)
			}
			a.ledger.drop(u)
			a.confirms.forget(u)
		}
	}
}

// keepBlobs keeps the content of the files this pass wrote by hash, for
// classifying and rolling back later changes. It runs at the end of the
// pass, after the jobs began: the new content is on disk (in the unit
// file itself) until a later pass overwrites it, and that pass makes sure
// its blob exists first (executor.writeFiles). Before, two more fsyncs
// stood between every put and its restart.
func (a *Agent) keepBlobs() {
	if len(a.written) == 0 {
		return
	}
	err := a.exec.keep(a.written)
	a.written = a.written[:0]
	if err != nil {
		// Only a rollback of a later change needs them; writeFiles
		// tries again from the file itself before it overwrites it.
		a.log.Warn("keep unit file versions in the state directory", "err", err)
	}
}

// jobEnds has a channel for each unit whose job another job of this plan
// runs after (Action.After; the planner sets it only beside a job):
// closed when that unit's job has ended, or when it is not launched.
func jobEnds(plan []Action, failed map[string]bool) map[string]chan struct{} {
	ends := map[string]chan struct{}{}
	for _, act := range plan {
		if act.Steps.After != "" && act.Steps.Job != JobNone && !failed[act.Unit] {
			ends[act.Steps.After] = make(chan struct{})
		}
	}
	return ends
}

func jobsToRun(plan []Action) bool {
	for _, act := range plan {
		if act.Steps.Job != JobNone {
			return true
		}
	}
	return false
}
