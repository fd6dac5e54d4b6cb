package reconcile

import (
	"context"
	"fmt"
	"log/slog"
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
// The part (confirms, this file) keeps a window per change awaiting its
// confirmation (opened once the change's job is done, or its files written
// and loaded when it needs no job, and only when there is an earlier
// version to put back), and calls the Confirmer from a goroutine of the
// agent's, one try at a time, while any window is open, handing each try
// to the loop; ConfirmationAt (pure) says whether a try confirms a window
// and when a window ran out. The ledger keeps the record's side
// (UnitRecord.Confirming, ledger.markConfirming). A window that ran out is
// a failure of the change like an unhealthy one (ledger.unconfirmed,
// FailedOp "confirm", the
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
// from then (confirms.resume): the change is confirmed by the new agent, or
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

// ConfirmationAt says where a change applied at since with ConfirmSec=limit
// stands at now, given a try (nil: none to count). Pure. Only a try that
// began after the change was applied counts (one begun before proves
// nothing about the change), and only if it succeeded by since+limit; a
// window with no such try is over at since+limit.
func ConfirmationAt(since time.Time, limit time.Duration, try *ConfirmTry, now time.Time) Confirmation {
	deadline := since.Add(limit)
	if try != nil && try.Err == nil && !try.Began.Before(since) && !try.Ended.After(deadline) {
		return ConfirmConfirmed
	}
	if !now.Before(deadline) {
		return ConfirmExpired
	}
	return ConfirmPending
}

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

// confirms is the commit-confirmed part: the windows of the changes
// awaiting their confirmation, and the Confirmer's tries — one at a time,
// in a goroutine the agent owns (wg), each bounded by its timeout, its
// result handed to the loop over done. Loop-owned but for done. It knows
// no other part: the loop tells the ledger what it says (a change
// confirmed, one that ran out).
type confirms struct {
	c       Confirmer // nil: no change awaits a confirmation
	log     *slog.Logger
	windows map[string]*confirmWindow
	running bool // a try is in flight
	done    chan ConfirmTry
	wg      sync.WaitGroup
	timer   *time.Timer // the next try due after a failed one; armed only when one is
	armed   bool
}

func newConfirms(c Confirmer, log *slog.Logger) confirms {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return confirms{c: c, log: log, windows: map[string]*confirmWindow{}, done: make(chan ConfirmTry, 1), timer: t}
}

// await opens the window of act's change, applied at since, when its
// policy asks for one (ConfirmSec=), the agent has a Confirmer, and there
// is something to put back: act's version is a change (change, see
// ledger.applied) and an earlier version ran (rec, the unit's record, has
// a Previous: a first install has nothing to go back to). It says whether
// it opened one: the caller marks the record (ledger.markConfirming). It
// runs before the HealthySec window opens, which keeps what ran before
// until the change is confirmed.
func (c *confirms) await(act Action, change bool, rec UnitRecord, since time.Time) bool {
	if c.c == nil || act.Policy.Confirm <= 0 || !change || len(rec.Previous) == 0 {
		return false
	}
	c.windows[act.Unit] = &confirmWindow{act: act, since: since}
	u := act.Unit
	c.log.Info(fmt.Sprintf("%s: confirming the change with the control plane — the agent must renew its lease, read and write the registry within ConfirmSec=%s, or the previous version is put back", u, act.Policy.Confirm),
		"unit", u, "action", "confirming", "confirm_sec", act.Policy.Confirm.Seconds(), "hash", short(actionHash(act)))
	return true
}

// resume reopens, from now, the window of a unit whose record says its
// change awaits a confirmation while no window is open — the agent
// restarted inside it — and which runs that change (no job of the
// agent's on it: jobRunning): the new agent confirms it within a whole
// ConfirmSec=, or puts it back. The record says so already.
func (c *confirms) resume(plan []Action, records map[string]UnitRecord, jobRunning func(unit string) bool) {
	if c.c == nil {
		return
	}
	for _, act := range plan {
		rec := records[act.Unit]
		if rec.Confirming == "" || rec.Confirming != act.ContentKey || KeyOf(rec.Applied) != act.ContentKey ||
			act.Policy.Confirm <= 0 || c.awaiting(act.Unit) || len(rec.Previous) == 0 {
			continue
		}
		if jobRunning(act.Unit) {
			continue
		}
		c.windows[act.Unit] = &confirmWindow{act: act, since: time.Now()}
		c.log.Info(fmt.Sprintf("%s: resuming the confirmation of a change the control plane has not confirmed — ConfirmSec=%s from now", act.Unit, act.Policy.Confirm),
			"unit", act.Unit, "action", "confirming", "confirm_sec", act.Policy.Confirm.Seconds())
	}
}

// awaiting says whether u's change awaits its confirmation.
func (c *confirms) awaiting(u string) bool {
	_, ok := c.windows[u]
	return ok
}

// forget ends u's window without a verdict: the change failed, or the
// unit is gone.
func (c *confirms) forget(u string) { delete(c.windows, u) }

// supersede ends the window of act's unit when act's job is for other
// content (or a rollback): that job supersedes the change. It says
// whether it ended one: the caller clears the record's mark
// (ledger.unmarkConfirming).
func (c *confirms) supersede(act Action) bool {
	w := c.windows[act.Unit]
	if w == nil || (w.act.ContentKey == act.ContentKey && act.Kind != KindRollback) {
		return false
	}
	delete(c.windows, act.Unit)
	return true
}

// nextDeadline is the earliest end of a window.
func (c *confirms) nextDeadline() (time.Time, bool) {
	var next time.Time
	for _, w := range c.windows {
		if d := w.deadline(); next.IsZero() || d.Before(next) {
			next = d
		}
	}
	return next, !next.IsZero()
}

// timeout is how long one try may take: a third of the shortest
// ConfirmSec= awaited, at most 5 s, so a try that hangs leaves time for
// others.
func (c *confirms) timeout() time.Duration {
	t := 5 * time.Second
	for _, w := range c.windows {
		t = min(t, w.act.Policy.Confirm/3)
	}
	return max(t, 10*time.Millisecond)
}

// wake is the channel of the next try due, nil when none is.
func (c *confirms) wake() <-chan time.Time {
	if !c.armed {
		return nil
	}
	return c.timer.C
}

// woken starts the try that was due (wake fired).
func (c *confirms) woken(ctx context.Context) {
	c.armed = false
	c.tryIfDue(ctx)
}

// tryIfDue starts a try when a change awaits its confirmation and no try
// is in flight or due later.
func (c *confirms) tryIfDue(ctx context.Context) {
	if c.c == nil || len(c.windows) == 0 || c.running || c.armed || ctx.Err() != nil {
		return
	}
	c.launch(ctx, c.timeout())
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

// take takes a try: it ends every window the try confirms (logged) and
// returns their units, for the loop to tell the ledger (and to look at
// them again). It starts the next try while windows stay open — at once
// after a success (the windows left opened after it began), after a short
// pause after a failure. The windows a try does not confirm run out by
// the clock (expire), whatever the tries do.
func (c *confirms) take(ctx context.Context, r ConfirmTry) (confirmed []string) {
	c.running = false
	for _, u := range slices.Sorted(maps.Keys(c.windows)) {
		w := c.windows[u]
		if ConfirmationAt(w.since, w.act.Policy.Confirm, &r, r.Ended) == ConfirmConfirmed {
			delete(c.windows, u)
			confirmed = append(confirmed, u)
			c.log.Info(fmt.Sprintf("%s: change confirmed by the control plane %s after it was applied (ConfirmSec=%s)", u, r.Ended.Sub(w.since).Round(time.Millisecond), w.act.Policy.Confirm),
				"unit", u, "action", "confirmed", "hash", short(actionHash(w.act)))
			continue
		}
		if r.Err != nil {
			w.lastErr = r.Err
		}
	}
	if len(c.windows) > 0 {
		if r.Err != nil {
			c.log.Debug("control plane not confirmed yet; trying again", "err", r.Err)
			c.retryAfter(min(250*time.Millisecond, max(c.timeout()/4, 10*time.Millisecond)))
		} else {
			c.tryIfDue(ctx)
		}
	}
	return confirmed
}

// unconfirmedChange is a change whose ConfirmSec= ran out unconfirmed, and
// why it is put back.
type unconfirmedChange struct {
	act    Action
	reason string
}

// expire ends the windows whose ConfirmSec= ran out unconfirmed at now, in
// unit order, and returns them: each is a failure of its change
// (ledger.unconfirmed) that the planner rolls back.
func (c *confirms) expire(now time.Time) []unconfirmedChange {
	var out []unconfirmedChange
	for _, u := range slices.Sorted(maps.Keys(c.windows)) {
		w := c.windows[u]
		if ConfirmationAt(w.since, w.act.Policy.Confirm, nil, now) != ConfirmExpired {
			continue
		}
		reason := fmt.Sprintf("%s: the change was not confirmed within ConfirmSec=%s (the agent must renew its lease, read and write the registry", lostControlPlane, w.act.Policy.Confirm)
		if w.lastErr != nil {
			reason += "; last try: " + errorLine(w.lastErr)
		} else {
			reason += "; no try ended in time"
		}
		reason += ")"
		delete(c.windows, u)
		out = append(out, unconfirmedChange{act: w.act, reason: reason})
	}
	return out
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
