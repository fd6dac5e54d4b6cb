package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// slotTable is this host's MaxUnavailable slots, and its halts, through
// the Coordinator (nil: this agent alone, slots are always free). Acquire
// blocks, so slots are acquired by goroutines the agent owns (wg) and
// handed to the loop under mu; poke wakes the loop when one is.
type slotTable struct {
	coord Coordinator
	host  string // for halt records
	log   *slog.Logger
	poke  func()
	mu    sync.Mutex
	slots map[string]*slot
	wg    sync.WaitGroup
}

// slot is this host's place in one (scope, bucket, unit) MaxUnavailable
// semaphore.
type slot struct {
	scope, hash string
	bucket      Bucket // MaxUnavailableBy=: this host's label bucket; zero: the whole scope
	limit       int
	waiting     bool
	held        bool
	release     func(context.Context) error
	cancel      context.CancelFunc // ends the wait of a queued slot
	err         error
	retryAt     time.Time
}

// scopeOf is the registry target a unit's content came from, as the
// semaphore and halts name it: "groups/<g>", or "" for a host's own key
// (one host: nothing to coordinate).
func scopeOf(d *DesiredUnit, desired map[string]*DesiredUnit) string {
	src := ""
	switch {
	case d == nil:
	case d.File != nil:
		src = d.File.Source
	case IsInstance(d.Name):
		if t := desired[TemplateOf(d.Name)]; t != nil && t.File != nil {
			src = t.File.Source
		}
	}
	if g, ok := strings.CutPrefix(src, "group:"); ok {
		return "groups/" + g
	}
	return ""
}

// held maps each unit whose slot this host holds to the hash it holds it for.
func (t *slotTable) held() map[string]string {
	t.mu.Lock()
	defer t.mu.Unlock()
	held := map[string]string{}
	for u, s := range t.slots {
		if s.held {
			held[u] = s.hash
		}
	}
	return held
}

// recheck is the step after planning that the fleet has a say in. It checks
// with the Coordinator that every slot this host holds is still held: a
// slot whose lease was lost is no slot, and the plan must not take a
// disruptive step on it, so plan is made again without it (from desired
// and cur, what it was made from). Then it halts the rollouts of the
// changes judged failed (before their slots are given back, at the end of
// the pass: SlotsNeeded). It returns the plan to execute and what it was
// made from.
func (t *slotTable) recheck(ctx context.Context, failures []judged, desired map[string]*DesiredUnit, cur Current, plan []Action) ([]Action, Current) {
	if t.check(ctx) {
		cur.Fleet.Slots = t.held()
		plan = Plan(desired, cur)
	}
	for _, j := range failures {
		w := j.w
		t.halt(ctx, SlotKey(w.act.Unit), w.act.Scope, w.act.Hash, j.why)
	}
	return plan, cur
}

// ensure queues this host for unit's slot unless it already holds or
// waits for it. Acquire blocks, so it runs in a goroutine the agent owns;
// when it returns the loop is poked and the next pass acts.
func (t *slotTable) ensure(ctx context.Context, unit string, n SlotNeed) {
	if t.coord == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.slots[unit]; s != nil {
		if s.scope == n.Scope && s.bucket == n.Bucket && (s.held || s.waiting) {
			return
		}
		if s.err != nil && time.Now().Before(s.retryAt) {
			return
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	s := &slot{scope: n.Scope, bucket: n.Bucket, hash: n.Hash, limit: n.Limit, waiting: true, cancel: cancel}
	t.slots[unit] = s
	log := t.log.With("unit", unit, "scope", n.Scope, "max_unavailable", n.Limit)
	switch b := n.Bucket; {
	case b.Key == "":
		log.Info("waiting for a rollout slot", "action", "wait")
	case b.Labelled():
		log.Info("waiting for a rollout slot of "+b.String(), "bucket", b.String(), "action", "wait")
	default:
		log.Info("waiting for a rollout slot of "+b.String()+": this host has no "+b.Key+" label, so it shares one budget with every host of the group without one",
			"bucket", b.String(), "action", "wait")
	}
	t.wg.Go(func() {
		defer cancel()
		release, err := t.coord.Acquire(wctx, n.Scope, n.Bucket, unit, n.Hash, n.Limit)
		t.mu.Lock()
		current := t.slots[unit] == s
		if current {
			s.waiting = false
			if err != nil {
				s.err = fmt.Errorf("waiting for a MaxUnavailable slot%s: %w", of(n.Bucket), err)
				s.retryAt = time.Now().Add(2 * time.Second)
			} else {
				s.held, s.release, s.err = true, release, nil
			}
		}
		t.mu.Unlock()
		if err == nil && !current {
			_ = release(context.WithoutCancel(ctx))
		}
		if ctx.Err() == nil {
			if err != nil {
				time.AfterFunc(2*time.Second, t.poke)
			}
			t.poke()
		}
	})
}

// check re-checks with etcd that every slot this host holds is still
// held, and drops the ones that are not; lost says some were.
func (t *slotTable) check(ctx context.Context) (lost bool) {
	if t.coord == nil {
		return false
	}
	t.mu.Lock()
	held := map[string]*slot{}
	for u, s := range t.slots {
		if s.held {
			held[u] = s
		}
	}
	t.mu.Unlock()
	for unit, s := range held {
		ok, err := t.coord.Holding(ctx, s.scope, s.bucket, unit)
		if err != nil || !ok {
			lost = true
			t.drop(ctx, unit)
			t.log.Warn("rollout slot"+of(s.bucket)+" lost; waiting again before any disruptive step", "unit", unit, "scope", s.scope, "err", err)
		}
	}
	return lost
}

// sync makes the slots this host holds or queues for exactly need:
// missing ones are queued for, the rest given back — a slot granted after
// the operator reverted a change is released at once, and a revert while
// queued gives the queue position back.
func (t *slotTable) sync(ctx context.Context, need map[string]SlotNeed) {
	if t.coord == nil {
		return
	}
	t.mu.Lock()
	var drop []string
	for key, s := range t.slots {
		// A changed bucket (the host's label changed) is another
		// semaphore: the old slot is given back, the new one queued for.
		if n, ok := need[key]; !ok || n.Scope != s.scope || n.Bucket != s.bucket {
			drop = append(drop, key)
		}
	}
	t.mu.Unlock()
	for _, key := range drop {
		t.drop(ctx, key)
	}
	for key, n := range need {
		t.ensure(ctx, key, n)
	}
}

// drop gives a slot back, or leaves its queue. The release runs in the
// background: etcd being slow must not stall the loop; a slot not released
// in time goes with the lease.
func (t *slotTable) drop(ctx context.Context, unit string) {
	t.mu.Lock()
	s := t.slots[unit]
	delete(t.slots, unit)
	t.mu.Unlock()
	if s == nil {
		return
	}
	if s.cancel != nil {
		s.cancel() // still queued: leave the queue
	}
	if !s.held {
		return
	}
	t.wg.Go(func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := s.release(rctx); err != nil {
			t.log.Warn("releasing rollout slot", "unit", unit, "err", err)
		}
	})
	t.log.Info("released rollout slot"+of(s.bucket), "unit", unit, "scope", s.scope)
}

// of names a slot's bucket in a message: " of rack=r1", or "" for a slot
// of the whole scope.
func of(b Bucket) string {
	if b.Key == "" {
		return ""
	}
	return " of " + b.String()
}

// halt records in the registry that this host failed a group's version of
// unit, so the rest of the group holds off.
func (t *slotTable) halt(ctx context.Context, unit, scope, hash, reason string) {
	if t.coord == nil || scope == "" || hash == "" {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h := Halt{Scope: scope, Unit: unit, Hash: hash, Host: t.host, Reason: reason, At: time.Now().UTC()}
	if err := t.coord.Halt(hctx, h); err != nil {
		t.log.Error("could not halt the rollout in the registry", "unit", unit, "scope", scope, "err", err)
		return
	}
	t.log.Warn("rollout halted for the group", "unit", unit, "scope", scope, "hash", short(hash), "action", "halt")
}
