// Executing a round's plan: the executor's steps in their order, and
// what the ledger, the managed paths and the jobs take of them.

package reconcile

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// round carries out the plan of a round: it has the executor do the steps
// and the jobs run, and records what came of them in the ledger, the
// managed paths, the confirms and the probes, telling the view what its
// steps changed. It decides nothing. Loop-owned: the parts it holds are
// the Agent's.
type round struct {
	ledger   *ledger
	managed  *managedIndex
	view     *view
	exec     executor
	jobs     *jobs
	probes   *probes
	confirms *confirms
	slots    *slotTable
	handoff  *handoff
	man      Manifest
	log      *slog.Logger
	pause    func(ctx context.Context, at string) // Config.Pause
	rec      recorder
	written  []DesiredFile // files written this pass, kept by hash at its end
}

// execute does what the plan says, in a fixed order: record the intent,
// disable, write and remove files, enable, ONE daemon-reload; then, in a
// round without a reload (or the last), start the jobs. The executor does
// the steps; execute records what came of them. It decides nothing. more
// says the files changed and the caller should plan again.
func (r *round) execute(ctx context.Context, plan []Action, cur Current, last bool) (more bool, err error) {
	reload, why := ReloadNeeded(plan, cur)
	// 1. The intent, with the ownership of every path about to be
	// written, in one write, before any side effect.
	claims, err := r.ledger.claim(plan, reload, cur.Host.Files)
	if err != nil {
		return false, err
	}
	for p, h := range claims {
		r.managed.set(p, Owned{Hash: h})
	}
	r.pause(ctx, "claimed")
	// 2.-4. Disable, files, enable.
	failed, err := r.applyFiles(ctx, plan)
	r.ledger.wrote()
	if err != nil {
		return false, err
	}
	// 5. One daemon-reload for the whole batch.
	if reload {
		r.pause(ctx, "files-written")
		if err := r.exec.reload(ctx, why); err != nil {
			return false, err // the intent keeps Reload: the next pass reloads first
		}
		// Recorded before any job starts (startJobs), or else with the
		// pass's records: a crash before that costs one more
		// daemon-reload at the next start, nothing else.
		r.ledger.reloaded()
	}
	r.view.afterExecute(plan, reload)
	r.bookkeep(plan, cur, failed)
	if reload && !last {
		return true, nil
	}
	return false, r.startJobs(ctx, plan, cur, failed)
}

// applyFiles has the executor disable, write and remove files, and enable,
// and records what failed: a unit that failed a step goes no further (but
// a removal whose disable failed: its files must not stay for ever). The
// error is that of making the writes durable.
func (r *round) applyFiles(ctx context.Context, plan []Action) (failed map[string]bool, err error) {
	failed = map[string]bool{}
	// Disables see the [Install] of the file on disk now.
	disableErrs := r.exec.disable(ctx, plan)
	for _, act := range plan {
		if act.Steps.Disable {
			if err := disableErrs[act.Unit]; err != nil {
				r.ledger.enableFailed(act.Unit, err.Error())
				r.rec.record(act, ResultFailed, err)
				failed[act.Unit] = act.Kind != KindRemove
			} else if !act.Steps.Enable {
				r.ledger.enableOK(act.Unit)
			}
		}
	}
	r.exec.resetFailed(ctx, plan, failed) // a removed unit's failed state is forgotten before its files go
	w := r.exec.write(plan, failed, r.view.replaced(plan))
	r.written = append(r.written, w.written...)
	for _, p := range w.forgotten {
		r.managed.forget(p)
	}
	for _, act := range plan {
		if err := w.errs[act.Unit]; err != nil {
			failed[act.Unit] = true
			r.rec.record(act, ResultFailed, err)
		}
	}
	if w.any {
		if err := r.exec.flush(); err != nil {
			return nil, err
		}
	}
	enableErrs := r.exec.enable(ctx, plan, failed)
	for _, act := range plan {
		if act.Steps.Enable && !failed[act.Unit] {
			if err := enableErrs[act.Unit]; err != nil {
				r.ledger.enableFailed(act.Unit, err.Error())
				r.rec.record(act, ResultFailed, err)
				failed[act.Unit] = true
			} else {
				r.ledger.enableOK(act.Unit)
			}
		}
	}
	return failed, nil
}

// startJobs starts the plan's jobs in the background (jobs.launch); their
// results come back to the loop. Then the slots, level-triggered: queue
// for the ones needed now, give back the rest (after any halt this pass
// wrote).
func (r *round) startJobs(ctx context.Context, plan []Action, cur Current, failed map[string]bool) error {
	jobs := jobsToRun(plan)
	if jobs {
		r.pause(ctx, "reloaded")
	}
	if ctx.Err() != nil {
		return ctx.Err() // shutting down: start nothing new
	}
	if jobs {
		// The reload this pass did (in this round or an earlier one) is
		// recorded before its jobs start, not with the pass's records.
		if err := r.ledger.saveReload(); err != nil {
			return err
		}
	}
	ends := jobEnds(plan, failed)
	for _, act := range plan {
		if failed[act.Unit] {
			continue
		}
		if act.Steps.Job == JobNone {
			if !r.jobs.running(act.Unit) {
				r.ledger.noJob(act.Unit)
			}
			continue
		}
		if act.Record.Instance && act.Steps.Job == JobStart {
			if err := r.man.Set(act.Unit, Owned{Instance: true}); err != nil {
				r.rec.record(act, ResultFailed, err)
				continue
			}
			r.managed.set(act.Unit, Owned{Instance: true})
		}
		if act.Steps.Job == JobStart || act.Steps.Job == JobRestart {
			r.ledger.startedWith(act.Unit, act.ContentKey)
		}
		r.handoff.jobStarted(act.Unit)
		// A new job supersedes the verification of what the unit ran: that
		// version is not judged by what the new job does to the unit. Its
		// confirmation too, when the job is for other content.
		r.ledger.supersede(act.Unit)
		if r.confirms.supersede(act) {
			r.ledger.unmarkConfirming(act.Unit)
		}
		r.probes.reset(act.Unit) // and its probes start afresh
		r.jobs.launch(ctx, act, cur.Host.Units[act.Unit], ends, r.view.stateReader(act.Unit), r.handoff.mutedOf)
		delete(ends, act.Unit)
	}
	for _, e := range ends {
		close(e) // a job not launched after all: nothing to wait for
	}
	r.view.afterJobs()
	if jobs {
		r.pause(ctx, "jobs-started") // crash tests: jobs under way, the pass's records not written
	}
	r.view.rememberInFlight(&cur)
	r.slots.sync(ctx, SlotsNeeded(plan, cur))
	return nil
}

// bookkeep records what the plan says about units that need no job: a
// change that took effect with the reload, a refusal, a removal, a block.
func (r *round) bookkeep(plan []Action, cur Current, failed map[string]bool) {
	for _, act := range plan {
		if failed[act.Unit] {
			continue
		}
		u := act.Unit
		if act.Own != OwnNone && act.Kind != KindBlocked {
			r.ledger.own(u, act.Own)
		}
		if act.Record.Adopt {
			job := JobNone
			if act.Record.Ran {
				job = JobRestart // the owed job was the agent's start or restart
			}
			change := r.ledger.applied(act, job, r.view.manager())
			if r.confirms.await(act, change, r.ledger.records[u], time.Now()) {
				r.ledger.markConfirming(u, act.ContentKey)
			}
			if act.Record.Ran {
				// The owed job ran before the agent died: judged as if it
				// had just ended (HealthySec from now).
				r.rec.recordAs(act, ActionAdopt, ResultDone, nil)
				r.ledger.begin(act, JobDone, "", cur.Host.Units[u], time.Now())
			} else if !r.ledger.verifying(u) {
				r.ledger.good(u, act.Record.Effective)
			}
		}
		if act.Kind != KindBlocked && r.ledger.last[u].action == ActionBlocked {
			r.ledger.forgetOutcome(u) // no longer blocked: the old verdict would only confuse
		}
		switch {
		case act.Record.Refuse != nil:
			r.ledger.refuse(u, *act.Record.Refuse)
			r.rec.record(act, ResultRefused, errors.New(act.Err))
		case act.Kind == KindBlocked:
			// A rollback's verdict stays what the status says while its
			// content is held; other content blocked after it is news.
			p, ok := r.ledger.last[u]
			held := p.action == ActionRolledBack && p.contentKey == act.ContentKey
			if !ok || (p.err != act.Err && !held) {
				r.rec.record(act, ResultBlocked, errors.New(act.Err))
			}
		case act.Kind == KindUpdate && act.Err != "":
			if prev, ok := r.ledger.last[u]; !ok || prev.err != act.Err {
				r.rec.record(act, ResultFailed, errors.New(act.Err))
			}
		case act.Kind == KindUpdate:
			r.rec.record(act, ResultDone, nil)
		case act.Kind == KindRollback && act.Steps.Job == JobNone:
			r.rec.recordAs(act, ActionRolledBack, ResultDone, errors.New(act.Reason))
			r.ledger.rolledBackInPlace(u, act.Record.Effective)
		}
		if act.Record.DropRecord {
			if act.Kind == KindRemove && (len(act.Steps.Removes) > 0 || len(act.Steps.Forget) > 0) {
				r.rec.record(act, ResultDone, nil)
			}
			r.ledger.drop(u)
			r.confirms.forget(u)
		}
	}
}

// keepBlobs keeps the content of the files this pass wrote by hash, for
// classifying and rolling back later changes. It runs at the end of the
// pass, after the jobs began: the new content is on disk (in the unit
// file itself) until a later pass overwrites it, and that pass makes sure
// its blob exists first (executor.writeFiles). Before, two more fsyncs
// stood between every put and its restart.
func (r *round) keepBlobs() {
	if len(r.written) == 0 {
		return
	}
	err := r.exec.keep(r.written)
	r.written = r.written[:0]
	if err != nil {
		// Only a rollback of a later change needs them; writeFiles
		// tries again from the file itself before it overwrites it.
		r.log.Warn("keep unit file versions in the state directory", "err", err)
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
