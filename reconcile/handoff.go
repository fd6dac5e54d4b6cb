// Where other goroutines meet the loop: the handoff (a snapshot, what
// changed and pokes in; statuses out) and the requests (work run in the
// loop's goroutine).

package reconcile

import (
	"context"
	"sync"
)

// handoff is where other goroutines meet the loop ("handoff" means this
// alone): they hand it a snapshot, what changed (signals, fsnotify) and
// pokes; the loop hands back the statuses.
type handoff struct {
	poke     chan struct{} // a coalescing trigger: size 1, sent to without blocking
	mu       sync.Mutex
	snap     *Snapshot
	relevant map[string]bool // units the agent cares about, for filtering D-Bus signals
	// jobbing holds the units with a job of the agent's in flight: their
	// signals are not passed on. Nothing is decided about such a unit
	// until its job ends, and the job's end brings a fresh read (finish);
	// re-reading it on each of its signals while 1,000 units started kept
	// systemd answering GetAll instead of running the jobs.
	jobbing map[string]bool
	// muted counts the signals not passed on per unit, so finish knows
	// whether the state read after the job is still the newest.
	muted    map[string]int
	dirty    dirty // what signals and fsnotify said changed since the last look
	statuses []Status
	revision int64
}

// trigger pokes the loop: a pass comes soon (Run batches the pokes).
func (h *handoff) trigger() {
	select {
	case h.poke <- struct{}{}:
	default:
	}
}

// setSnapshot keeps s as the registry's newest snapshot.
func (h *handoff) setSnapshot(s *Snapshot) {
	h.mu.Lock()
	h.snap = s
	h.mu.Unlock()
	h.trigger()
}

// unitChanged notes systemd's change of unit ("": anything) and pokes the
// loop, unless its signals are muted (a job of the agent's is in flight)
// or the agent does not care about unit.
func (h *handoff) unitChanged(unit string) {
	h.mu.Lock()
	if h.jobbing[unit] {
		if h.muted == nil {
			h.muted = map[string]int{}
		}
		h.muted[unit]++
		h.mu.Unlock()
		return
	}
	rel := unit == "" || h.relevant[unit]
	switch {
	case unit == "":
		h.dirty.all = true
	case rel:
		h.dirty.unit(unit)
	}
	h.mu.Unlock()
	if rel {
		h.trigger()
	}
}

// fileChanged notes a change in the unit directory (path "": anything)
// and pokes the loop.
func (h *handoff) fileChanged(path string) {
	h.mu.Lock()
	if path == "" {
		h.dirty.all = true
	} else {
		h.dirty.path(path)
	}
	h.mu.Unlock()
	h.trigger()
}

// published keeps the statuses a pass computed, and the revision of the
// snapshot then newest; it returns that revision.
func (h *handoff) published(list []Status) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.statuses = list
	if h.snap != nil {
		h.revision = h.snap.Revision
	}
	return h.revision
}

// lastStatuses are the statuses the last pass computed.
func (h *handoff) lastStatuses() (revision int64, st []Status) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.revision, append([]Status(nil), h.statuses...)
}

// jobEnded takes unit's signals again once its job ended, and says whether
// none came since the state was read after the job (muted, as counted
// then: that state is still the newest).
func (h *handoff) jobEnded(unit string, muted int) (fresh bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	fresh = h.muted[unit] == muted
	delete(h.jobbing, unit)
	delete(h.muted, unit)
	return fresh
}

func (h *handoff) snapshot() *Snapshot {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.snap
}

func (h *handoff) takeDirty() dirty {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.dirty
	h.dirty = dirty{}
	return d
}

func (h *handoff) eachMuted(f func(unit string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for u, n := range h.muted {
		if n > 0 {
			f(u)
		}
	}
}

func (h *handoff) setRelevant(units map[string]bool) {
	h.mu.Lock()
	h.relevant = units
	h.mu.Unlock()
}

// jobStarted stops passing on unit's signals while its job is in flight.
func (h *handoff) jobStarted(unit string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.jobbing == nil {
		h.jobbing = map[string]bool{}
	}
	h.jobbing[unit] = true
}

// mutedOf counts unit's signals not passed on while its job is in flight.
func (h *handoff) mutedOf(unit string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.muted[unit]
}

// requests carry work into the loop: a request runs in Run's goroutine,
// between passes.
type requests chan func(context.Context)

// do has the loop run f and waits for its error.
func (r requests) do(ctx context.Context, f func(context.Context) error) error {
	done := make(chan error, 1)
	req := func(ctx context.Context) { done <- f(ctx) }
	select {
	case r <- req:
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
