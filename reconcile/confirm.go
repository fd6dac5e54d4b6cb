package reconcile

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Commit-confirmed apply ([X-Agentd] ConfirmSec=): a change that could cut
// the host off from its control plane (a firewall, a route, a proxy, a VPN,
// the agent's own endpoint) must be confirmed by the agent reaching the
// control plane again within ConfirmSec= of being applied, or it is put
// back — the "magic rollback" of deploy-rs, the "commit confirmed" of
// network gear.
//
// The parts, as for HealthySec=: the ledger keeps a window per change
// awaiting its confirmation (opened once the change's job is done, or its
// files written and loaded when it needs no job, and only when there is an
// earlier version to put back); a goroutine of the agent's calls the
// Confirmer, one try at a time, while any window is open, and hands each
// try to the loop; JudgeConfirm (pure) says whether a try confirms a window
// and when a window ran out. A window that ran out is a failure of the
// change like an unhealthy one (ledger.failed, FailedOp "confirm", the
// reason "lost control plane: …"), which the planner turns into the
// rollback it makes for every failed change: the previous files, one
// daemon-reload, a restart (planRollback), and the failed content is not
// applied again until the registry holds other content. The status says
// rolled-back with that reason, published as every status is once the
// registry answers again. The agent never waits for the control plane: a
// unit without ConfirmSec= is never affected by it.
//
// Across an agent restart: the record keeps the content awaiting its
// confirmation (UnitRecord.Confirming), and the new agent's first pass that
// finds the unit running it opens the window again, with a whole ConfirmSec=
// from then (resumeConfirm): the change is confirmed by the new agent, or
// put back.

// Confirmer proves the agent still has its control plane: in production
// it renews the agent's lease, makes a linearizable read and writes the
// host's status, all within ctx. The agent calls it from a goroutine of its
// own, never from the loop, one call at a time, with ctx bounded by a
// per-try timeout (confirmTry).
type Confirmer interface {
	Confirm(ctx context.Context) error
}

// ConfirmTry is one call of the Confirmer: when it began and ended, and its
// error (nil: confirmed).
type ConfirmTry struct {
	Began, Ended time.Time
	Err          error
}

// Confirmation is where a change awaiting its confirmation stands.
type Confirmation int

const (
	ConfirmPending   Confirmation = iota // not confirmed yet, ConfirmSec= not over
	ConfirmConfirmed                     // a try that began after the change and succeeded in time
	ConfirmExpired                       // ConfirmSec= is over, unconfirmed: put the change back
)

var confirmationNames = [...]string{"pending", "confirmed", "expired"}

func (c Confirmation) String() string { return confirmationNames[c] }

// JudgeConfirm says where a change applied at since with ConfirmSec=limit
// stands at now, given a try (nil: none to count). Pure. Only a try that
// began after the change was applied counts (one begun before proves
// nothing about the change), and only if it succeeded by since+limit; a
// window with no such try is over at since+limit.
func JudgeConfirm(since time.Time, limit time.Duration, try *ConfirmTry, now time.Time) Confirmation {
	deadline := since.Add(limit)
	if try != nil && try.Err == nil && !try.Began.Before(since) && !try.Ended.After(deadline) {
		return ConfirmConfirmed
	}
	if !now.Before(deadline) {
		return ConfirmExpired
	}
	return ConfirmPending
}

// confirmOp is UnitRecord.FailedOp of a change put back for want of a
// confirmation: its rollback restarts the unit whatever the change's job
// was (a reload changed what the process runs, so putting the files back
// is not enough).
const confirmOp = "confirm"

// lostControlPlane starts the reason of a change put back unconfirmed: the
// status then reads "rolled-back: lost control plane: …".
const lostControlPlane = "lost control plane"

// confirmWindow is a change awaiting its confirmation.
type confirmWindow struct {
	act   Action
	since time.Time // when it was applied: only a try begun after it counts
	// lastErr is the newest failed try's error, for the message.
	lastErr error
}

func (w *confirmWindow) deadline() time.Time { return w.since.Add(w.act.Policy.Confirm) }

// The ledger's side: the windows, and the record's Confirming.

// awaitConfirm opens the window of act's change, applied at since.
func (l *ledger) awaitConfirm(act Action, since time.Time) {
	l.confirm[act.Unit] = &confirmWindow{act: act, since: since}
	rec := l.records[act.Unit]
	rec.Confirming = act.ContentKey
	l.records[act.Unit] = rec
}

// confirming says whether u's change awaits its confirmation.
func (l *ledger) confirming(u string) bool {
	_, ok := l.confirm[u]
	return ok
}

// confirmed ends u's window: the change stays. What ran before is
// forgotten once the change is also judged healthy (good keeps it while a
// confirmation is awaited).
func (l *ledger) confirmed(u string) {
	delete(l.confirm, u)
	rec := l.records[u]
	rec.Confirming = ""
	if len(rec.Good) > 0 && KeyOf(rec.Good) == KeyOf(rec.Applied) {
		rec.Previous = nil
	}
	l.records[u] = rec
}

// endConfirm ends u's window without a verdict: a job for other content
// (or a rollback) supersedes the change.
func (l *ledger) endConfirm(u string) {
	if _, ok := l.confirm[u]; !ok {
		return
	}
	delete(l.confirm, u)
	rec := l.records[u]
	rec.Confirming = ""
	l.records[u] = rec
}

// unconfirmed records that w's change was not confirmed in time: a failure
// of the change (failed), whatever its HealthySec window would say.
func (l *ledger) unconfirmed(w *confirmWindow, reason string) (rec UnitRecord, template string) {
	u := w.act.Unit
	delete(l.verify, u)
	rec, template = l.failed(&window{act: w.act, op: w.act.Kind}, reason)
	rec.FailedOp = confirmOp
	l.records[u] = rec
	return rec, template
}

// nextConfirmDeadline is the earliest end of a window.
func (l *ledger) nextConfirmDeadline() (time.Time, bool) {
	var next time.Time
	for _, w := range l.confirm {
		if d := w.deadline(); next.IsZero() || d.Before(next) {
			next = d
		}
	}
	return next, !next.IsZero()
}

// confirmTimeout is how long one try may take: a third of the shortest
// ConfirmSec= awaited, at most 5 s, so a try that hangs leaves time for
// others.
func (l *ledger) confirmTimeout() time.Duration {
	t := 5 * time.Second
	for _, w := range l.confirm {
		t = min(t, w.act.Policy.Confirm/3)
	}
	return max(t, 10*time.Millisecond)
}

// confirms runs the Confirmer's tries: one at a time, in a goroutine the
// agent owns (wg), each bounded by its timeout, its result handed to the
// loop over done. Loop-owned but for done; it decides nothing.
type confirms struct {
	c       Confirmer
	running bool // a try is in flight
	done    chan ConfirmTry
	wg      sync.WaitGroup
	timer   *time.Timer // the next try due after a failed one; armed only when one is
	armed   bool
}

func newConfirms(c Confirmer) confirms {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return confirms{c: c, done: make(chan ConfirmTry, 1), timer: t}
}

// wake is the channel of the next try due, nil when none is.
func (c *confirms) wake() <-chan time.Time {
	if !c.armed {
		return nil
	}
	return c.timer.C
}

// launch starts a try bounded by timeout.
func (c *confirms) launch(ctx context.Context, timeout time.Duration) {
	c.running = true
	c.wg.Go(func() {
		tctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		began := time.Now()
		err := c.c.Confirm(tctx)
		if err == nil && tctx.Err() != nil {
			err = tctx.Err() // an answer after the timeout is no answer
		}
		r := ConfirmTry{Began: began, Ended: time.Now(), Err: err}
		select {
		case c.done <- r:
		case <-ctx.Done():
		}
	})
}

// retryAfter arms the timer for the next try.
func (c *confirms) retryAfter(d time.Duration) {
	c.timer.Stop()
	c.timer.Reset(d)
	c.armed = true
}

// The loop's side.

// awaitConfirm opens the window of act's change, applied at since, when
// its policy asks for one (ConfirmSec=), the agent has a Confirmer, and
// there is something to put back: act's version is a change (change, see
// ledger.applied) and an earlier version ran (a first install has nothing
// to go back to). It
// runs before the HealthySec window opens, which keeps what ran before
// until the change is confirmed.
func (a *Agent) awaitConfirm(act Action, change bool, since time.Time) {
	if a.cfg.Confirmer == nil || act.Policy.Confirm <= 0 || !change || len(a.ledger.records[act.Unit].Previous) == 0 {
		return
	}
	a.ledger.awaitConfirm(act, since)
	u := act.Unit
	a.log.Info(fmt.Sprintf("%s: confirming the change with the control plane — the agent must renew its lease, read and write the registry within ConfirmSec=%s, or the previous version is put back", u, act.Policy.Confirm),
		"unit", u, "action", "confirming", "confirm_sec", act.Policy.Confirm.Seconds(), "hash", short(actionHash(act)))
}

// resumeConfirm reopens, from now, the window of a unit whose record says
// its change awaits a confirmation while no window is open — the agent
// restarted inside it — and which runs that change: the new agent confirms
// it within a whole ConfirmSec=, or puts it back.
func (a *Agent) resumeConfirm(plan []Action) {
	if a.cfg.Confirmer == nil {
		return
	}
	for _, act := range plan {
		rec := a.ledger.records[act.Unit]
		if rec.Confirming == "" || rec.Confirming != act.ContentKey || KeyOf(rec.Applied) != act.ContentKey ||
			act.Policy.Confirm <= 0 || a.ledger.confirming(act.Unit) || len(rec.Previous) == 0 {
			continue
		}
		if _, job := a.jobs.inflight[act.Unit]; job {
			continue
		}
		a.ledger.awaitConfirm(act, time.Now())
		a.log.Info(fmt.Sprintf("%s: resuming the confirmation of a change the control plane has not confirmed — ConfirmSec=%s from now", act.Unit, act.Policy.Confirm),
			"unit", act.Unit, "action", "confirming", "confirm_sec", act.Policy.Confirm.Seconds())
	}
}

// launchConfirm starts a try when a change awaits its confirmation and no
// try is in flight or due later.
func (a *Agent) launchConfirm(ctx context.Context) {
	if a.cfg.Confirmer == nil || len(a.ledger.confirm) == 0 || a.confirms.running || a.confirms.armed || ctx.Err() != nil {
		return
	}
	a.confirms.launch(ctx, a.ledger.confirmTimeout())
}

// confirmDone takes a try: it confirms every window it counts for (logged,
// its unit touched) and starts the next try while windows stay open —
// at once after a success (the windows left opened after it began), after
// a short pause after a failure. It says whether a pass is owed (a status
// changed). The windows a try does not confirm run out in a pass
// (expireConfirms), by the clock, whatever the tries do.
func (a *Agent) confirmDone(ctx context.Context, r ConfirmTry) bool {
	a.confirms.running = false
	pass := false
	for _, u := range slices.Sorted(maps.Keys(a.ledger.confirm)) {
		w := a.ledger.confirm[u]
		if JudgeConfirm(w.since, w.act.Policy.Confirm, &r, r.Ended) == ConfirmConfirmed {
			a.ledger.confirmed(u)
			a.view.touch(u)
			pass = true
			a.log.Info(fmt.Sprintf("%s: change confirmed by the control plane %s after it was applied (ConfirmSec=%s)", u, r.Ended.Sub(w.since).Round(time.Millisecond), w.act.Policy.Confirm),
				"unit", u, "action", "confirmed", "hash", short(actionHash(w.act)))
			continue
		}
		if r.Err != nil {
			w.lastErr = r.Err
		}
	}
	if len(a.ledger.confirm) > 0 {
		if r.Err != nil {
			a.log.Debug("control plane not confirmed yet; trying again", "err", r.Err)
			a.confirms.retryAfter(min(250*time.Millisecond, max(a.ledger.confirmTimeout()/4, 10*time.Millisecond)))
		} else {
			a.launchConfirm(ctx)
		}
	}
	return pass
}

// confirmWake starts the try that was due.
func (a *Agent) confirmWake(ctx context.Context) {
	a.confirms.armed = false
	a.launchConfirm(ctx)
}

// expireConfirms ends the windows whose ConfirmSec= ran out unconfirmed:
// each change is a failure (ledger.unconfirmed) that the planner of this
// round rolls back, its unit touched so the round plans it. It runs
// before the round observes.
func (a *Agent) expireConfirms() {
	now := time.Now()
	for _, u := range slices.Sorted(maps.Keys(a.ledger.confirm)) {
		w := a.ledger.confirm[u]
		if JudgeConfirm(w.since, w.act.Policy.Confirm, nil, now) != ConfirmExpired {
			continue
		}
		reason := fmt.Sprintf("%s: the change was not confirmed within ConfirmSec=%s (the agent must renew its lease, read and write the registry", lostControlPlane, w.act.Policy.Confirm)
		if w.lastErr != nil {
			reason += "; last try: " + errorLine(w.lastErr)
		} else {
			reason += "; no try ended in time"
		}
		reason += ")"
		rec, template := a.ledger.unconfirmed(w, reason)
		a.view.touch(u)
		if template != "" {
			a.view.touch(template)
		}
		if why := rollbackWhyNot(w.act.Policy, rec); why != "" {
			a.recordAs(w.act, w.act.Kind.Word(), "failed", errors.New(reason+"; "+why))
		} else {
			// Not final: this round's plan rolls it back.
			a.recordAs(w.act, ActionRollingBack, "pending", errors.New(reason))
		}
	}
}

// errorLine is err's text cut at its first line.
func errorLine(err error) string {
	s := err.Error()
	for i := range len(s) {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}

// nextWake is when the loop must look again by the clock: the next end of
// a HealthySec window or of a ConfirmSec window.
func (a *Agent) nextWake(now time.Time) (time.Time, bool) {
	next, ok := a.ledger.nextDeadline(now)
	if c, cok := a.ledger.nextConfirmDeadline(); cok && (!ok || c.Before(next)) {
		next, ok = c, true
	}
	return next, ok
}
