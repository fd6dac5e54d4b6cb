package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// executor does the steps of the actions it is given, each kind of step
// for the whole plan at once, and returns what came of them. It decides
// nothing, looks at nothing (what it needs of the disk is handed to it)
// and records nothing: the loop records its results (the ledger, the
// managed paths). The loop calls its steps in the order of Steps: disable,
// write and remove, enable, one daemon-reload; the jobs follow (jobs.go).
type executor struct {
	sd    Systemd
	files Files
	man   Manifest
	log   *slog.Logger
}

// disable disables the units whose action says so, in one call; it
// returns the error of each unit that failed.
func (x executor) disable(ctx context.Context, plan []Action) map[string]error {
	return inOneCall(ctx, plan, func(act Action) bool { return act.Steps.Disable }, x.sd.Disable)
}

// enable enables the units whose action says so and did not fail, in one
// call: symlinks only, the daemon-reload picks them up. It returns the
// error of each unit that failed.
func (x executor) enable(ctx context.Context, plan []Action, failed map[string]bool) map[string]error {
	return inOneCall(ctx, plan, func(act Action) bool { return act.Steps.Enable && !failed[act.Unit] }, x.sd.Enable)
}

// resetFailed forgets the failed state of the units whose action says so
// and did not fail (a removed unit's, before its files go). A failure is
// only logged: nothing depends on it.
func (x executor) resetFailed(ctx context.Context, plan []Action, failed map[string]bool) {
	for _, act := range plan {
		if act.Steps.ResetFailed && !failed[act.Unit] {
			if err := x.sd.ResetFailed(ctx, act.Unit); err != nil {
				x.log.Warn(act.Unit+": reset-failed", "unit", act.Unit, "err", err)
			}
		}
	}
}

// reload is the one daemon-reload of a batch; why says what needs it.
func (x executor) reload(ctx context.Context, why string) error {
	x.log.Debug("daemon-reload", "why", why)
	began := time.Now()
	if err := x.sd.Reload(ctx); err != nil {
		return err // names the daemon-reload already (Systemd's contract)
	}
	x.log.Debug("daemon-reload done", "took", time.Since(began))
	return nil
}

// wrote is what came of the file steps of a plan.
type wrote struct {
	errs      map[string]error // by unit: its chain stops there
	written   []DesiredFile    // files written
	forgotten []string         // paths no longer the agent's (removed, or forgotten)
	any       bool             // some unit's files were to change
}

// write writes and removes the files of the actions that did not fail, and
// drops the paths they remove or forget from the Manifest's owned paths.
// replaced holds the files as last read from disk: what a write replaces is
// kept first, for a rollback of the change.
func (x executor) write(plan []Action, failed map[string]bool, replaced map[string]LocalFile) wrote {
	var w wrote
	for _, act := range plan {
		if failed[act.Unit] || (!act.Changes() && len(act.Steps.Forget) == 0) {
			continue
		}
		w.any = true
		if err := x.writeFiles(act, replaced, &w); err != nil {
			if w.errs == nil {
				w.errs = map[string]error{}
			}
			w.errs[act.Unit] = err
		}
	}
	return w
}

func (x executor) writeFiles(act Action, replaced map[string]LocalFile, out *wrote) error {
	// One file of the set refused means none of it written.
	if c, ok := x.files.(checker); ok {
		for _, w := range act.Steps.Writes {
			if err := c.Check(w.Path, w.Content); err != nil {
				return err
			}
		}
	}
	write := x.files.Write
	if b, ok := x.files.(batchWriter); ok {
		write = b.WriteBatched
	}
	for _, w := range act.Steps.Writes {
		// What the file holds now is what a rollback of this change puts
		// back: normally kept since the pass that wrote it (keepBlobs),
		// unless the agent died before that pass ended.
		// (PutBlob only looks when it is there already.)
		if old, ok := replaced[w.Path]; ok && old.Exists && old.Hash != w.Hash {
			if err := x.man.PutBlob(old.Hash, old.Content); err != nil {
				return err
			}
		}
		if w.Sealed != "" {
			// A secret is kept now, not at the end of the pass: its
			// records know it by its ciphertext's hash, which the file
			// on disk cannot give back if the agent dies before then.
			if err := x.man.PutBlob(w.Sealed, w.Content); err != nil {
				return err
			}
		}
		if err := write(w.Path, w.Content); err != nil {
			return err
		}
		out.written = append(out.written, w)
	}
	for _, p := range act.Steps.Removes {
		if err := x.files.Remove(p); err != nil {
			return err
		}
		if err := x.man.Forget(p); err != nil {
			return err
		}
		out.forgotten = append(out.forgotten, p)
	}
	for _, p := range act.Steps.Forget {
		if err := x.man.Forget(p); err != nil {
			return err
		}
		out.forgotten = append(out.forgotten, p)
	}
	return nil
}

// flush makes the writes and blobs durable: the renames reach the disk
// before systemd reads the files.
func (x executor) flush() error {
	var errs []error
	if b, ok := x.files.(batchWriter); ok {
		errs = append(errs, b.Flush())
	}
	if f, ok := x.man.(flusher); ok {
		errs = append(errs, f.Flush()) // a blob writeFiles kept
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sync the unit and state directories: %w", err)
	}
	return nil
}

// keep keeps the content of files by hash, for classifying and rolling
// back later changes (see round.keepBlobs).
func (x executor) keep(files []DesiredFile) error {
	var errs []error
	for _, w := range files {
		errs = append(errs, x.man.PutBlob(w.Shown(), w.Content)) // the hash records know it by
	}
	if f, ok := x.man.(flusher); ok {
		errs = append(errs, f.Flush())
	}
	return errors.Join(errs...)
}

// batchWriter is an optional capability of Files: a write whose directory
// fsync waits for Flush, so a batch of files costs one fsync per directory
// rather than one per file (unitdir.Dir).
type batchWriter interface {
	WriteBatched(path string, content []byte) error
	Flush() error
}

// checker is an optional capability of Files: Check says whether Write
// would refuse content at path (a config file outside every root, an owner
// this host does not have, a directory or symlink in the file's place)
// without writing anything. writeFiles checks every write of a unit's set
// before the first, so a refused file leaves the whole set unwritten.
type checker interface {
	Check(path string, content []byte) error
}

// flusher is an optional capability of the Manifest: blobs put since the
// last Flush are durable once it returns.
type flusher interface{ Flush() error }

// inOneCall calls f (Enable, Disable) for the units of the actions pick
// says, in one call: a first sync of 1,000 units with [Install] sections
// made 1,000 calls, one after the other (1.0 s in the agent's debug log).
// When the one call fails, f is called unit by unit, so that one unit's
// error is its own and the others go on (enabling and disabling are
// idempotent). It returns the error of each unit that failed.
func inOneCall(ctx context.Context, plan []Action, pick func(Action) bool, f func(context.Context, ...string) error) map[string]error {
	var units []string
	for _, act := range plan {
		if pick(act) {
			units = append(units, act.Unit)
		}
	}
	if len(units) == 0 {
		return nil
	}
	err := f(ctx, units...)
	if err == nil {
		return nil
	}
	if len(units) == 1 {
		return map[string]error{units[0]: err}
	}
	errs := map[string]error{}
	for _, u := range units {
		if err := f(ctx, u); err != nil {
			errs[u] = err
		}
	}
	return errs
}
