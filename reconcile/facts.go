package reconcile

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// Facts are what the planner reads of a host that the registry does not
// hold, published so that a preview (Preview: `unit put --dry-run`, `unit
// edit`) runs the planner on the host's truth instead of guessing it: a
// hand-written file the agent will not overwrite, content it will not apply
// again. The units' load and active states are in their statuses already.
// An agent publishes its facts only when they change: an idle agent writes
// nothing.
type Facts struct {
	// Unowned are the files in the unit directory the agent did not write
	// (unit files at its top, drop-ins in its <unit>.d/ directories), by
	// path: the planner never overwrites one.
	Unowned map[string]UnownedFile `json:"unowned,omitempty"`
	// Refused maps a unit to content systemd refused to load; it is not
	// tried again until the registry content changes.
	Refused map[string]Refusal `json:"refused,omitempty"`
	// Failed maps a unit to content that failed on this host (and was
	// rolled back where it could be); it is not retried until the registry
	// content changes.
	Failed map[string]Refusal `json:"failed,omitempty"`
	// FileRoots are where the host takes config files (agentd run
	// --file-root), [] when nowhere: a preview refuses the others (RootOf).
	FileRoots []string `json:"fileRoots"`
}

// UnownedFile is what is at a path of the unit directory the agent does not own.
type UnownedFile struct {
	Hash string `json:"hash,omitempty"`  // of its content; "" when it could not be read
	Err  string `json:"error,omitempty"` // not a regular file (a mask's symlink, a directory), unreadable
}

// Equal reports whether f and g hold the same facts.
func (f Facts) Equal(g Facts) bool {
	return maps.Equal(f.Unowned, g.Unowned) && maps.Equal(f.Refused, g.Refused) && maps.Equal(f.Failed, g.Failed) &&
		slices.Equal(f.FileRoots, g.FileRoots)
}

// FactsPublisher publishes this host's facts, bound to the agent's
// presence: they go when the agent goes. gone is closed when the
// published facts are gone again (the registry lease that carried them was
// lost): the agent then publishes them again.
type FactsPublisher interface {
	PublishFacts(ctx context.Context, f Facts) (gone <-chan struct{}, err error)
}

// Lister is an optional capability of Files: the names in the unit
// directory — files at its top and in its <unit>.d/ drop-in directories,
// relative to it — for the facts. Without it the agent publishes no
// unowned files.
type Lister interface {
	List() ([]string, error)
}

// factsState is the loop's view of its facts: the unowned files, kept up to
// date from the same fsnotify events that keep the file cache, and the
// facts last handed to the publisher. The loop tells it which paths changed
// (notePaths) and, at the end of a pass, what the agent manages and
// remembers (update). Loop-owned, but for out.
type factsState struct {
	files   Files
	roots   []string // fileRoots(Files), never nil: published as they are
	log     *slog.Logger
	relist  bool            // list the whole directory at the end of the pass
	dirty   map[string]bool // paths to look at again
	unowned map[string]UnownedFile
	last    *Facts // handed out last
	out     *factsOut
}

// notePaths remembers paths fsnotify reported: they are looked at again
// at the end of the pass. A drop-in directory changed as a whole is listed
// again.
func (f *factsState) notePaths(paths map[string]bool) {
	for p := range paths {
		if p == "" || strings.HasSuffix(p, ".d") && !strings.Contains(p, "/") {
			f.relist = true
			continue
		}
		if f.dirty == nil {
			f.dirty = map[string]bool{}
		}
		f.dirty[p] = true
	}
}

// update brings the facts up to date at the end of a pass, with the paths
// the agent manages and the refusals and records it keeps, and hands them
// to the publisher when they changed. The unit directory is listed only at
// start and after everything was forgotten (a resync, a reconnect, a failed
// pass); otherwise only the paths fsnotify named are read again.
func (f *factsState) update(managed map[string]Owned, refused map[string]Refusal, records map[string]UnitRecord) {
	lister, ok := f.files.(Lister)
	if f.out == nil || !ok {
		return
	}
	if f.relist || f.unowned == nil {
		names, err := lister.List()
		if err != nil {
			f.log.Warn("facts: cannot list the unit directory; the unowned files published stay as they were", "err", err)
			return // relist stays set: the next pass tries again
		}
		f.unowned = map[string]UnownedFile{}
		for _, p := range names {
			f.lookUnowned(p, managed)
		}
		f.relist, f.dirty = false, nil
	}
	for p := range f.dirty {
		f.lookUnowned(p, managed)
	}
	f.dirty = nil
	for p := range f.unowned {
		if _, mine := managed[p]; mine {
			delete(f.unowned, p) // moved away and written by the agent since
		}
	}
	next := Facts{Unowned: maps.Clone(f.unowned), Refused: map[string]Refusal{}, Failed: map[string]Refusal{}, FileRoots: f.roots}
	maps.Copy(next.Refused, refused)
	for u, rec := range records {
		if rec.Failed != "" {
			next.Failed[u] = Refusal{ContentKey: rec.Failed, Reason: rec.FailReason}
		}
	}
	if f.last != nil && f.last.Equal(next) {
		return
	}
	f.last = &next
	f.out.offer(next)
}

// lookUnowned reads what is at p, when it could be a registry key the agent
// does not own, into the unowned files.
func (f *factsState) lookUnowned(p string, managed map[string]Owned) {
	delete(f.unowned, p)
	if _, _, err := ParseKey(p); err != nil {
		return // no key names it: nothing the planner would look at
	}
	if _, mine := managed[p]; mine {
		return
	}
	b, exists, err := f.files.Read(p)
	switch {
	case err != nil:
		f.unowned[p] = UnownedFile{Err: err.Error()}
	case exists:
		f.unowned[p] = UnownedFile{Hash: Hash(b)}
	}
}

// factsOut hands facts to the FactsPublisher off the loop: the newest win,
// a failed publish is retried with backoff, and facts whose lease was lost
// are published again. It sleeps while there is nothing to do.
type factsOut struct {
	p    FactsPublisher
	mu   sync.Mutex
	want Facts
	gen  uint64
	wake chan struct{}
}

func (o *factsOut) offer(f Facts) {
	o.mu.Lock()
	o.want, o.gen = f, o.gen+1
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// start runs the facts publisher until ctx ends; the returned func
// waits for it.
func (f *factsState) start(ctx context.Context) (wait func()) {
	if f.out == nil {
		return func() {}
	}
	var wg sync.WaitGroup
	wg.Go(func() { f.out.run(ctx, f.log) })
	return wg.Wait
}

func (o *factsOut) run(ctx context.Context, log *slog.Logger) {
	var gone <-chan struct{} // closed when the published facts went with their lease
	var done uint64          // generation published
	var backoff time.Duration
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.wake:
		case <-retry.C:
		case <-gone:
			gone, done = nil, 0
		}
		o.mu.Lock()
		f, gen := o.want, o.gen
		o.mu.Unlock()
		if gen == 0 || gen == done {
			continue
		}
		g, err := o.p.PublishFacts(ctx, f)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if backoff == 0 {
				log.Debug("publishing facts failed; retrying", "err", err)
			}
			// At most a few seconds: before the agent has joined, and while
			// its lease is re-created, trying costs no round trip.
			backoff = min(max(2*backoff, 250*time.Millisecond), 5*time.Second)
			retry.Reset(Jitter(backoff))
			continue
		}
		backoff, done, gone = 0, gen, g
		retry.Stop()
	}
}

func newFactsState(p FactsPublisher, files Files, roots []string, log *slog.Logger) factsState {
	f := factsState{relist: true, files: files, roots: roots, log: log}
	if p != nil {
		f.out = &factsOut{p: p, wake: make(chan struct{}, 1)}
	}
	return f
}
