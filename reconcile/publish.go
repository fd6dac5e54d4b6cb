package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// publisher hands statuses to the Reporter off the loop, so the next change
// never waits for an etcd round trip. The newest statuses win: a pass that
// ends while an older set is being published replaces whatever is still
// waiting. Statuses with a job still running wait up to coalesceJob for the
// job's result first: most restarts take milliseconds, and one write per
// change instead of two halves etcd's work for a fleet-wide rollout. A
// failed publish is retried with backoff until newer statuses or success;
// only then does the publisher sleep again (no timer while idle).
type publisher struct {
	r   Reporter
	log *slog.Logger

	mu      sync.Mutex
	pending []Status
	acted   int64  // the registry revision the pending statuses' pass acted on
	offered uint64 // generation of the newest statuses handed in
	done    uint64 // generation last published
	failed  uint64 // generation whose last attempt failed, with err
	err     error
	wake    chan struct{} // something to publish
	changed chan struct{} // closed and replaced when done moves
}

func newPublisher(r Reporter, log *slog.Logger) *publisher {
	return &publisher{r: r, log: log, wake: make(chan struct{}, 1), changed: make(chan struct{})}
}

// offer queues st, computed by a pass that acted on registry revision
// acted, for publishing and returns its generation.
func (p *publisher) offer(acted int64, st []Status) uint64 {
	p.mu.Lock()
	p.offered++
	p.pending, p.acted = st, acted
	gen := p.offered
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return gen
}

// published waits until the statuses of generation gen (or newer) are in
// the registry, or an attempt to publish them failed.
func (p *publisher) published(ctx context.Context, gen uint64) error {
	for {
		p.mu.Lock()
		done, failed, err, changed := p.done, p.failed, p.err, p.changed
		p.mu.Unlock()
		if done >= gen {
			return nil
		}
		if failed >= gen {
			return fmt.Errorf("publish statuses: %w", err)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// run publishes until ctx ends.
func (p *publisher) run(ctx context.Context) {
	var backoff time.Duration
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-retry.C:
		}
		acted, st, gen := p.take()
		if gen == p.doneGen() {
			continue
		}
		if !failing && jobRunning(st) {
			t := time.NewTimer(coalesceJob)
			select {
			case <-p.wake:
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			t.Stop()
			acted, st, gen = p.take()
		}
		if err := p.r.Report(ctx, acted, st); err != nil {
			if ctx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, 250*time.Millisecond), 30*time.Second)
			if !failing {
				p.log.Warn("publishing statuses failed; retrying", "err", err, "retry_in", backoff)
			}
			failing = true
			retry.Reset(Jitter(backoff))
			p.settled(func() { p.failed, p.err = gen, err })
			continue
		}
		if failing {
			p.log.Info("statuses published again")
		}
		failing, backoff = false, 0
		retry.Stop()
		p.settled(func() { p.done = gen })
	}
}

// settled records an attempt's end and wakes those waiting in published.
func (p *publisher) settled(f func()) {
	p.mu.Lock()
	f()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// coalesceJob is how long statuses showing a running job wait for newer ones.
const coalesceJob = 100 * time.Millisecond

func jobRunning(st []Status) bool {
	for _, s := range st {
		if s.Job != "" {
			return true
		}
	}
	return false
}

func (p *publisher) take() (int64, []Status, uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.acted, p.pending, p.offered
}

func (p *publisher) doneGen() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}
