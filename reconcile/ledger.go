package reconcile

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// ledger is what the agent remembers of each unit beyond disk and D-Bus,
// and the only writer of it: the unit records (applied / previous / good /
// failed), the refusals, the content this process started, each unit's
// last outcome, the failed enables, the intent, and the HealthySec windows.
// Records and intent are persisted through the Manifest; the methods that
// do so return their errors and log nothing. Other parts read its maps;
// only its methods write them. Loop-owned, like the rest of the Agent.
type ledger struct {
	man       Manifest
	records   map[string]UnitRecord
	saved     map[string]UnitRecord // the records as last persisted
	intent    Intent
	refused   map[string]Refusal
	started   map[string]string // unit -> content key last started (see Memory.Started)
	last      map[string]outcome
	enableErr map[string]string  // unit -> the last failed enable/disable, until one succeeds
	verify    map[string]*window // units inside HealthySec
}

// outcome is the last thing the agent did to a unit, and how it went.
type outcome struct {
	action     ActionWord
	result     ResultWord
	err        string
	contentKey string
}

func newLedger(m Manifest) ledger {
	return ledger{
		man:       m,
		records:   m.Units(),
		saved:     m.Units(),
		intent:    m.Intent(),
		refused:   map[string]Refusal{},
		started:   map[string]string{},
		last:      map[string]outcome{},
		enableErr: map[string]string{},
		verify:    map[string]*window{},
	}
}

// The record state machine. A job's outcome known (applied), a verdict of
// HealthySec (good, failed), a rollback done (rolledBack), the unit gone
// (drop).

// applied records that unit runs act's version now: a job of the agent's
// (job, run under manager) or one owed from before a crash, or a change
// that took effect with the daemon-reload (JobNone). What ran before it
// stays as Previous, what a rollback restores, until it is judged (and
// confirmed, with ConfirmSec=). change says act's version is a change: not
// the one recorded before, nor the way back from a failed version to the
// one that ran before it (an instance restarted onto its template's set
// put back) — no change to confirm.
func (l *ledger) applied(act Action, job Job, manager string) (change bool) {
	rec := l.records[act.Unit]
	if applied := KeyOf(rec.Applied); applied != act.ContentKey {
		back := rec.Failed != "" && applied == rec.Failed && KeyOf(rec.Previous) == act.ContentKey
		rec.Previous = rec.Applied // what ran before, verified or not: what a rollback restores
		rec.Confirming, change = "", !back
	}
	rec.Applied, rec.Own = act.Record.Effective, act.Own
	rec.noteStarted(job, manager)
	l.records[act.Unit] = rec
	return change
}

// own records what the agent owns of a unit it has a record of.
func (l *ledger) own(u string, own Ownership) {
	if rec, ok := l.records[u]; ok && rec.Own != own {
		rec.Own = own
		l.records[u] = rec
	}
}

// good records that effective was judged healthy (or needed no judging):
// it is the last good version, and nothing failed. What ran before is kept
// while the change awaits its confirmation (ConfirmSec=): an unconfirmed
// change is put back, healthy or not.
func (l *ledger) good(u string, effective map[string]string) {
	rec := l.records[u]
	rec.Good = effective
	if rec.Confirming == "" || rec.Confirming != KeyOf(effective) {
		rec.Previous = nil
	}
	rec.Failed, rec.FailReason, rec.FailedOp = "", "", ""
	l.records[u] = rec
}

// failed records that the change of w did not take: its content is not
// retried until the registry changes. For an instance whose template's new
// content failed, the template is held too (its record returned as
// template, "" otherwise): the other instances are not moved onto it, and
// what ran before is the set they stay on (or are restarted back onto).
func (l *ledger) failed(w *window, reason string) (rec UnitRecord, template string) {
	u := w.act.Unit
	rec = l.records[u]
	rec.Failed, rec.FailReason, rec.FailedOp = w.act.ContentKey, reason, w.op.String()
	rec.Confirming = ""
	l.records[u] = rec
	if w.act.Record.TemplateKey == "" {
		return rec, ""
	}
	t := TemplateOf(u)
	tr := l.records[t]
	tr.Failed, tr.FailReason = w.act.Record.TemplateKey, reason
	old := map[string]string{}
	for p, h := range rec.Previous {
		if UnitOfPath(p) == t {
			old[p] = h
		}
	}
	if len(old) > 0 {
		tr.Applied = old
	}
	l.records[t] = tr
	return rec, t
}

// rolledBack records that a rollback's restart (job) ran act's version,
// the one that ran before the failed change: it runs again, and is good.
func (l *ledger) rolledBack(act Action, job Job, manager string) UnitRecord {
	rec := l.records[act.Unit]
	rec.Applied, rec.Good, rec.Previous, rec.Confirming = act.Record.Effective, act.Record.Effective, nil, ""
	rec.noteStarted(job, manager)
	l.records[act.Unit] = rec
	return rec
}

// rolledBackInPlace records a rollback that needed no job (a failed
// reload's files put back): the version put back is good.
func (l *ledger) rolledBackInPlace(u string, effective map[string]string) {
	rec := l.records[u]
	rec.Good, rec.Previous, rec.Confirming = effective, nil, ""
	l.records[u] = rec
}

// drop forgets a unit that is gone: its record, HealthySec window, refusal, start,
// failed enable and owed job.
func (l *ledger) drop(u string) {
	delete(l.records, u)
	delete(l.verify, u)
	delete(l.refused, u)
	delete(l.started, u)
	delete(l.enableErr, u)
	delete(l.intent.Jobs, u)
	delete(l.intent.Confirm, u)
}

// The record's side of a change awaiting its confirmation (ConfirmSec=;
// the windows are the confirms part's, confirm.go).

// confirmOp is UnitRecord.FailedOp of a change put back for want of a
// confirmation: its rollback restarts the unit whatever the change's job
// was (a reload changed what the process runs, so putting the files back
// is not enough).
const confirmOp = "confirm"

// markConfirming records that u's change, of content key, awaits its
// confirmation (UnitRecord.Confirming).
func (l *ledger) markConfirming(u, key string) {
	rec := l.records[u]
	rec.Confirming = key
	l.records[u] = rec
}

// unmarkConfirming clears the mark: a job for other content (or a
// rollback) superseded the change.
func (l *ledger) unmarkConfirming(u string) {
	rec := l.records[u]
	rec.Confirming = ""
	l.records[u] = rec
}

// confirmed records that u's change was confirmed: the change stays. What
// ran before is forgotten once the change is also judged healthy (good
// keeps it while a confirmation is awaited).
func (l *ledger) confirmed(u string) {
	rec := l.records[u]
	rec.Confirming = ""
	if len(rec.Good) > 0 && KeyOf(rec.Good) == KeyOf(rec.Applied) {
		rec.Previous = nil
	}
	l.records[u] = rec
}

// unconfirmed records that act's change was not confirmed in time: a
// failure of the change (failed), whatever its HealthySec window would say.
func (l *ledger) unconfirmed(act Action, reason string) (rec UnitRecord, template string) {
	u := act.Unit
	delete(l.verify, u)
	rec, template = l.failed(&window{act: act, op: act.Kind}, reason)
	rec.FailedOp = confirmOp
	l.records[u] = rec
	return rec, template
}

// rollbackWhyNot says why a failed change of a unit with policy p and
// record rec is not rolled back, "" when it is: Rollback=no, or no earlier
// version to go back to. The planner's rollback and the failure's message
// both ask it.
func rollbackWhyNot(p Policy, rec UnitRecord) string {
	switch {
	case !p.Rollback:
		return "Rollback=no: left as it is"
	case len(rec.Previous) == 0 || KeyOf(rec.Previous) == rec.Failed:
		return "no earlier version to roll back to"
	}
	return ""
}

// What else the agent remembers of a unit.

func (l *ledger) refuse(u string, r Refusal)     { l.refused[u] = r }
func (l *ledger) startedWith(u, key string)      { l.started[u] = key }
func (l *ledger) setOutcome(u string, o outcome) { l.last[u] = o }
func (l *ledger) forgetOutcome(u string)         { delete(l.last, u) }
func (l *ledger) enableFailed(u, err string)     { l.enableErr[u] = err }
func (l *ledger) enableOK(u string)              { delete(l.enableErr, u) }

// The intent.

// claim records, before any side effect of plan, the intent (a reload
// owed when reload, the jobs it starts, what each path it writes holds
// now, as disk says) with the ownership of every path it writes, in one
// write. It returns the paths claimed (path → hash).
func (l *ledger) claim(plan []Action, reload bool, disk map[string]LocalFile) (map[string]string, error) {
	claims := map[string]string{}
	intent := Intent{Reload: l.intent.Reload || reload, Jobs: maps.Clone(l.intent.Jobs), Confirm: maps.Clone(l.intent.Confirm)}
	if intent.Jobs == nil {
		intent.Jobs = map[string]string{}
	}
	for _, act := range plan {
		for _, w := range act.Steps.Writes {
			claims[w.Path] = w.Hash
			if intent.Writes == nil {
				intent.Writes = map[string]string{}
			}
			if lf := disk[w.Path]; lf.Exists {
				intent.Writes[w.Path] = lf.Hash
			} else {
				intent.Writes[w.Path] = ""
			}
		}
		if act.Steps.Job != JobNone && act.Record.Effective != nil {
			intent.Jobs[act.Unit] = act.ContentKey
			if act.Policy.Confirm > 0 {
				if intent.Confirm == nil {
					intent.Confirm = map[string]string{}
				}
				intent.Confirm[act.Unit] = act.ContentKey
			}
		}
	}
	if len(claims) == 0 && intentEqual(intent, l.intent) {
		return nil, nil
	}
	if err := l.man.Claim(claims, intent); err != nil {
		return nil, fmt.Errorf("record intent in the state directory: %w", err)
	}
	l.intent = intent
	return claims, nil
}

// wrote records that the claimed writes are done, or failed (in memory:
// saved with the pass's records).
func (l *ledger) wrote() { l.intent.Writes = nil }

// reloaded records that the daemon-reload owed is done (in memory: saved
// by saveReload or with the pass's records).
func (l *ledger) reloaded() { l.intent.Reload = false }

// saveReload records in the state directory that the reload this pass did
// is done, before its jobs start, when it is not yet: an owed reload hides
// when systemd loaded the files from the next start (Current.Loaded), so a
// job that ran before a crash would be run again.
func (l *ledger) saveReload() error {
	if !l.man.Intent().Reload {
		return nil
	}
	if err := l.man.SetIntent(l.intent); err != nil {
		return fmt.Errorf("record the daemon-reload in the state directory: %w", err)
	}
	return nil
}

// jobEnded forgets the owed job of u when it was for key.
func (l *ledger) jobEnded(u, key string) {
	if l.intent.Jobs[u] == key {
		delete(l.intent.Jobs, u)
		delete(l.intent.Confirm, u)
	}
}

// noJob forgets the owed job of u: the plan has none for it.
func (l *ledger) noJob(u string) {
	delete(l.intent.Jobs, u)
	delete(l.intent.Confirm, u)
}

// save persists the records of units (nil: all) that changed, and the
// intent, in one write. A failed save changes nothing in memory: a later
// save of those units writes them.
func (l *ledger) save(units map[string]bool) error {
	if units == nil {
		units = map[string]bool{}
		for u := range l.saved {
			units[u] = true
		}
		for u := range l.records {
			units[u] = true
		}
	}
	changed := map[string]UnitRecord{}
	for u := range units {
		rec, ok := l.records[u]
		saved, wasSaved := l.saved[u]
		if !recordEqual(saved, rec) || (wasSaved && !ok) {
			changed[u] = rec // an empty record deletes
		}
	}
	if len(changed) == 0 && intentEqual(l.man.Intent(), l.intent) {
		return nil
	}
	if err := l.man.SetUnits(changed, l.intent); err != nil {
		return fmt.Errorf("save unit records: %w", err)
	}
	for u, rec := range changed {
		if _, ok := l.records[u]; ok {
			l.saved[u] = rec
		} else {
			delete(l.saved, u)
		}
	}
	return nil
}

// gc drops from the state directory the blobs no record refers to.
func (l *ledger) gc() error {
	if err := l.man.GC(); err != nil {
		return fmt.Errorf("clean state directory: %w", err)
	}
	return nil
}

func recordEqual(x, y UnitRecord) bool {
	return maps.Equal(x.Applied, y.Applied) && maps.Equal(x.Good, y.Good) && maps.Equal(x.Previous, y.Previous) &&
		x.Failed == y.Failed && x.FailReason == y.FailReason && x.FailedOp == y.FailedOp && x.Own == y.Own && x.StartedIn == y.StartedIn &&
		x.Confirming == y.Confirming
}

func intentEqual(x, y Intent) bool {
	return x.Reload == y.Reload && maps.Equal(x.Jobs, y.Jobs) && maps.Equal(x.Confirm, y.Confirm) && maps.Equal(x.Writes, y.Writes)
}

// The HealthySec windows.

// window is a unit after a job, until Health gives a verdict.
type window struct {
	act     Action
	op      Kind // the action that started it, for messages
	outcome JobOutcome
	jobErr  string
	base    UnitState
	ended   time.Time // when the job ended
}

func (w *window) deadline() time.Time {
	return w.ended.Add(w.act.Policy.Healthy)
}

// nextDeadline is the next end of a HealthySec window after now. A window
// with health probes whose HealthySec is over waits for a passing probe:
// the probe's result wakes the loop, not the clock.
func (l *ledger) nextDeadline(now time.Time) (time.Time, bool) {
	var next time.Time
	for _, w := range l.verify {
		d := w.deadline()
		if w.act.Policy.Probe.Any() && !d.After(now) {
			continue
		}
		if next.IsZero() || d.Before(next) {
			next = d
		}
	}
	return next, !next.IsZero()
}

// begin opens the HealthySec window of a unit after its job ended. A unit
// not meant to run, or with HealthySec=0, no health probe and a job that
// ended "done", is good at once.
func (l *ledger) begin(act Action, outcome JobOutcome, jobErr string, base UnitState, ended time.Time) {
	if act.Policy.State != StateStarted || (act.Policy.Healthy == 0 && !act.Policy.Probe.Any() && outcome == JobDone) {
		l.good(act.Unit, act.Record.Effective)
		return
	}
	l.verify[act.Unit] = &window{act: act, op: act.Kind, outcome: outcome, jobErr: jobErr, base: base, ended: ended}
}

// supersede ends the window of u without a verdict: a new job supersedes
// the verification of what the unit ran.
func (l *ledger) supersede(u string) { delete(l.verify, u) }

// verifying says whether u is inside its HealthySec window.
func (l *ledger) verifying(u string) bool {
	_, ok := l.verify[u]
	return ok
}

// judged is a verdict on a window judge ended; for an unhealthy one, the
// unit's record after the failure and the template held with it (failed).
type judged struct {
	w        *window
	verdict  Verdict
	why      string
	rec      UnitRecord
	template string
}

// judge ends the HealthySec windows Health has a verdict for, at now, in
// unit order: healthy units become the last good version; unhealthy ones
// are failures (the planner rolls them back, see failed); unknown ones are
// left as they are. probe says where a unit's health probes stand on the
// version a window verifies (its content key). It returns the verdicts it
// gave, for the caller to report (and halt the rollouts of the failures).
func (l *ledger) judge(units map[string]UnitState, probe func(unit, key string) ProbeState, now time.Time) []judged {
	var out []judged
	for _, u := range slices.Sorted(maps.Keys(l.verify)) {
		w := l.verify[u]
		st, ok := units[u]
		if !ok {
			continue
		}
		v, why := Health(HealthInput{
			Unit: u, Healthy: w.act.Policy.Healthy, Op: w.op.String(), Job: w.outcome, JobErr: w.jobErr,
			Base: w.base, Now: st, Elapsed: now.Sub(w.ended),
			Probes: w.act.Policy.Probe, Probe: probe(u, w.act.ContentKey),
		})
		if v == VerdictPending {
			continue
		}
		delete(l.verify, u)
		j := judged{w: w, verdict: v, why: why}
		switch v {
		case VerdictHealthy:
			l.good(u, w.act.Record.Effective)
		case VerdictUnhealthy:
			j.rec, j.template = l.failed(w, why)
		}
		out = append(out, j)
	}
	return out
}

// resume reopens the HealthySec window of a unit that runs a version never
// judged healthy — the agent restarted inside the window — so that version
// is still verified (and rolled back if it dies). It returns the actions
// whose window it reopened.
func (l *ledger) resume(plan []Action, cur Current, now time.Time) []Action {
	var out []Action
	for _, act := range plan {
		rec := l.records[act.Unit]
		if act.Kind != KindNone || act.Record.Effective == nil || act.Policy.State != StateStarted || (act.Policy.Healthy == 0 && !act.Policy.Probe.Any()) ||
			len(rec.Applied) == 0 || KeyOf(rec.Applied) != act.ContentKey || KeyOf(rec.Good) == act.ContentKey ||
			!cur.Host.Units[act.Unit].Active() {
			continue
		}
		if l.verifying(act.Unit) {
			continue
		}
		act.Kind = KindRestart // what put it there, as far as messages go
		l.verify[act.Unit] = &window{act: act, op: act.Kind, outcome: JobDone, base: cur.Host.Units[act.Unit], ended: now}
		out = append(out, act)
	}
	return out
}
