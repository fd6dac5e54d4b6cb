package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"
)

// jobs are the systemd jobs the agent started and has not heard back from,
// and what runs them. Each runs in a goroutine the agent owns (wg) and hands
// its result to the loop over done: the loop never waits for a job, so one
// unit's hung start never holds up another unit's change, the status or the
// watchdog. It records nothing: the loop takes the results (results.finish).
type jobs struct {
	sd       Systemd
	log      *slog.Logger
	seq      uint64
	inflight map[string]*jobRun // by unit; loop-owned
	done     chan jobResult
	wg       sync.WaitGroup
	// reads bounds the state reads the jobs make at once, as prefetch
	// bounds the loop's (readWorkers). A read is a dozen property calls in
	// flight, each with a goroutine of godbus's; 1,000 jobs ending together
	// read without a bound took the agent's peak RSS from 88 to 123 MiB
	// (goroutines are never freed: their memory stays) and systemd answers
	// one call at a time anyway.
	reads chan struct{}
}

func newJobs(sd Systemd, log *slog.Logger) jobs {
	return jobs{sd: sd, log: log, inflight: map[string]*jobRun{}, done: make(chan jobResult, 64), reads: make(chan struct{}, readWorkers)}
}

// read runs f while holding one of the jobs' read slots.
func (j *jobs) read(ctx context.Context, f func()) {
	select {
	case j.reads <- struct{}{}:
	case <-ctx.Done():
		f() // fails at once on the done context
		return
	}
	defer func() { <-j.reads }()
	f()
}

type jobRun struct {
	id  uint64
	act Action
}

type jobResult struct {
	id   uint64
	unit string
	err  error
	// base is the unit's state read right after the job ended: the
	// baseline its health is judged against (NRestarts, timestamps).
	base  UnitState
	ended time.Time
	fresh bool // base was read
	muted int  // the unit's muted signals before base was read
}

// jobMargin is added to a unit's own timeouts: systemd ends the job by
// then, so a wait that runs out means the agent lost track, not a slow unit.
const jobMargin = 15 * time.Second

// defaultJobTimeout stands in for units whose type has no timeout of its
// own (timers, paths, targets): systemd's default.
const defaultJobTimeout = 90 * time.Second

// JobDeadline is how long the agent waits for a job's result: the unit's
// own start and/or stop timeouts plus a margin; 0 means no deadline (a
// timeout of infinity: systemd waits for ever, and so does the agent,
// without blocking anything else). Pure.
func JobDeadline(job Job, st UnitState) time.Duration {
	limit := func(us uint64) (time.Duration, bool) {
		switch {
		case us == math.MaxUint64:
			return 0, false
		case us == 0:
			return defaultJobTimeout, true
		}
		return time.Duration(us) * time.Microsecond, true
	}
	start, okStart := limit(st.TimeoutStartUSec)
	stop, okStop := limit(st.TimeoutStopUSec)
	switch job {
	case JobStop:
		if !okStop {
			return 0
		}
		return stop + jobMargin
	case JobRestart:
		if !okStart || !okStop {
			return 0
		}
		return stop + start + jobMargin
	}
	if !okStart {
		return 0
	}
	return start + jobMargin
}

// launch starts act's job in the background: at once, or once the job of
// act.After has ended when ends has that unit's channel. It closes act's
// own channel, if any, when its job has ended. Then it reads the unit's state
// (read) and hands the result to the loop with the count of the unit's
// signals not passed on before that read (muted).
func (j *jobs) launch(ctx context.Context, act Action, st UnitState, ends map[string]chan struct{},
	read func(context.Context) (UnitState, error), muted func(unit string) int) {
	wait, done := ends[act.Steps.After], ends[act.Unit]
	j.seq++
	run := &jobRun{id: j.seq, act: act}
	j.inflight[act.Unit] = run
	deadline := JobDeadline(act.Steps.Job, st)
	j.log.Debug("job started", "unit", act.Unit, "job", act.Steps.Job.String(), "deadline", deadline, "light", st.Light)
	j.wg.Go(func() {
		if wait != nil {
			select {
			case <-wait:
			case <-ctx.Done():
				return // shutting down: the intent keeps the job owed
			}
		}
		var err error
		if st.Light {
			err = j.runLightJob(ctx, act, st)
		} else {
			err = underDeadline(ctx, deadline, func(jctx context.Context) error { return j.runJob(jctx, act) })
		}
		if done != nil {
			close(done)
		}
		r := jobResult{id: run.id, unit: act.Unit, err: err, ended: time.Now()}
		if ctx.Err() != nil {
			return // shutting down: judge nothing
		}
		r.muted = muted(act.Unit)
		var base UnitState
		j.read(ctx, func() {
			sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
			base, err = read(sctx)
			scancel()
		})
		r.base, r.fresh = base, err == nil
		select {
		case j.done <- r:
		case <-ctx.Done():
		}
	})
}

// runLightJob runs the job of a unit planned from a listing (Light), whose
// own timeouts are not known yet. They are read once systemd has queued
// the job — read before, they made systemd load the unit's files again
// (Systemd.Queue); until then the wait is bounded by systemd's defaults. A
// restart that stops other units first (a socket's service) reads them
// first: the whole of it runs under one deadline.
func (j *jobs) runLightJob(ctx context.Context, act Action, st UnitState) error {
	sd := j.sd
	// withDeadline runs f under the job's deadline as far as it is known.
	withDeadline := func(f func(context.Context) error) error {
		return underDeadline(ctx, JobDeadline(act.Steps.Job, st), f)
	}
	timeouts := func(tctx context.Context) error {
		var err error
		j.read(tctx, func() { st.TimeoutStartUSec, st.TimeoutStopUSec, err = sd.Timeouts(tctx, act.Unit) })
		if err != nil && ctx.Err() == nil {
			j.log.Warn(act.Unit+": its job timeouts could not be read; waiting for systemd's default", "unit", act.Unit, "err", err)
		}
		return nil
	}
	if len(act.Steps.AlsoStop) > 0 {
		withDeadline(timeouts)
		return withDeadline(func(jctx context.Context) error { return j.runJob(jctx, act) })
	}
	var wait func(context.Context) error
	if err := withDeadline(func(qctx context.Context) (err error) {
		wait, err = sd.Queue(qctx, act.Steps.Job, act.Unit)
		return err
	}); err != nil {
		return err
	}
	withDeadline(timeouts)
	return withDeadline(wait)
}

// underDeadline runs f with ctx bounded by deadline (0: none) and marks an
// error that came of that deadline (not of ctx, the agent's life) as
// ErrOutcomeUnknown.
func underDeadline(ctx context.Context, deadline time.Duration, f func(context.Context) error) error {
	jctx, cancel := ctx, context.CancelFunc(func() {})
	if deadline > 0 {
		jctx, cancel = context.WithTimeout(ctx, deadline)
	}
	defer cancel()
	err := f(jctx)
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrOutcomeUnknown) {
		return fmt.Errorf("%w: no result within %s: %w", ErrOutcomeUnknown, deadline, err)
	}
	return err
}

// running says whether a job of the agent's on unit is in flight.
func (j *jobs) running(unit string) bool {
	_, ok := j.inflight[unit]
	return ok
}

func (j *jobs) runJob(ctx context.Context, act Action) error {
	if act.Steps.Job == JobRestart {
		for _, other := range act.Steps.AlsoStop {
			if err := j.sd.Stop(ctx, other); err != nil {
				return err
			}
		}
	}
	return DoJob(ctx, j.sd, act.Steps.Job, act.Unit)
}

// resultOf maps a job error to the status "result" word.
func resultOf(err error) ResultWord {
	var jr interface{ JobResult() string }
	switch {
	case err == nil:
		return ResultDone
	case errors.As(err, &jr):
		return ResultWord(jr.JobResult())
	case errors.Is(err, ErrOutcomeUnknown):
		return ResultUnknown
	}
	return ResultFailed
}
