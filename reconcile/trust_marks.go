// The marks' publisher: the newest version accepted of each signed key
// (Mark), written to the state directory off the loop (Trust.SaveMarks).

package reconcile

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// marksOut saves the marks off the loop (Trust.SaveMarks: an atomic,
// fsynced write of the state directory's file, a few ms, up to tens under
// load, that no change should wait for): a quarter of a second after they
// moved — after the pass's own file writes and their fsyncs, which it
// would otherwise compete with — the newest marks win, a failed save is
// retried with backoff, and the last marks are saved when the agent stops.
// A crash within that time forgets the newest marks: the versions they
// accepted are accepted again at restart.
type marksOut struct {
	save  func(map[string]Mark) error
	log   *slog.Logger
	delay time.Duration
	mu    sync.Mutex
	want  map[string]Mark
	gen   uint64
	wake  chan struct{}
}

func newMarksOut(t *Trust, log *slog.Logger) *marksOut {
	if t == nil || t.SaveMarks == nil {
		return nil
	}
	return &marksOut{save: t.SaveMarks, log: log, delay: 250 * time.Millisecond, wake: make(chan struct{}, 1)}
}

func (o *marksOut) offer(m map[string]Mark) {
	o.mu.Lock()
	o.want, o.gen = m, o.gen+1
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// start runs the saver until ctx ends; the returned func waits for it
// (and its last save).
func (o *marksOut) start(ctx context.Context) (wait func()) {
	if o == nil {
		return func() {}
	}
	var wg sync.WaitGroup
	wg.Go(func() { o.run(ctx) })
	return wg.Wait
}

func (o *marksOut) run(ctx context.Context) {
	var done uint64
	var backoff time.Duration
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	flush := func() error {
		o.mu.Lock()
		m, gen := o.want, o.gen
		o.mu.Unlock()
		if gen == done {
			return nil
		}
		if err := o.save(m); err != nil {
			return err
		}
		done = gen
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			if err := flush(); err != nil {
				o.log.Warn("cannot save the sequence numbers of the signed changes accepted; the next start accepts those versions again", "err", err)
			}
			return
		case <-o.wake:
			select {
			case <-ctx.Done():
				continue // saved on the way out
			case <-time.After(o.delay):
			}
		case <-retry.C:
		}
		if err := flush(); err != nil {
			if backoff == 0 {
				o.log.Warn("cannot save the sequence numbers of the signed changes accepted; retrying (until saved, a restart would accept older signed versions again)", "err", err)
			}
			backoff = min(max(2*backoff, 250*time.Millisecond), 5*time.Second)
			retry.Reset(Jitter(backoff))
			continue
		}
		backoff = 0
		retry.Stop()
	}
}
