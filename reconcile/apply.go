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

// maxParallelJobs bounds the jobs in flight at once: systemd runs them in
// parallel, but a burst of hundreds should not all fork at the same moment.
const maxParallelJobs = 16

// healthWait is a unit inside its HealthySec window after a (re)start.
type healthWait struct {
	key       string
	effective map[string]string
	until     time.Time
	policy    Policy
	op        string // the action that started it, for messages
	scope     string
	hash      string
}

// failure is a change that did not take: a failed job or an unhealthy unit.
type failure struct {
	unit   string
	key    string
	op     string
	reason string
	policy Policy
	// keepRunning: the unit's process still runs the old version (a reload
	// failed); a rollback restores files without restarting it.
	keepRunning bool
	scope, hash string // for the group halt
}

func (a *Agent) nextHealthDeadline() (time.Time, bool) {
	var next time.Time
	for _, w := range a.health {
		if next.IsZero() || w.until.Before(next) {
			next = w.until
		}
	}
	return next, !next.IsZero()
}

// observe reads desired state (the last snapshot) and current state (disk,
// manifest, D-Bus).
func (a *Agent) observe(ctx context.Context) (map[string]*DesiredUnit, Current, error) {
	a.mu.Lock()
	snap := a.snap
	a.mu.Unlock()
	if snap == nil {
		return nil, Current{}, ErrNoRegistry
	}
	desired := Desire(*snap)
	cur := Current{
		Files:     map[string]LocalFile{},
		Managed:   a.cfg.Manifest.Managed(),
		Units:     map[string]UnitState{},
		Records:   maps.Clone(a.records),
		Blobs:     map[string][]byte{},
		Refused:   a.refused,
		Started:   a.started,
		Verifying: map[string]bool{},
		Slots:     a.slotsHeld(),
		Halts:     map[string]Halt{},
	}
	for _, h := range snap.Halts {
		cur.Halts[h.Unit] = h
	}
	for u := range a.health {
		cur.Verifying[u] = true
	}
	paths := map[string]bool{}
	units := map[string]bool{}
	for name, u := range desired {
		units[name] = true
		for _, f := range u.Files() {
			paths[f.Path] = true
		}
	}
	for p, h := range cur.Managed {
		units[UnitOfPath(p)] = true
		if h != InstanceMarker {
			paths[p] = true
		}
	}
	for p := range paths {
		b, exists, err := a.cfg.Files.Read(p)
		lf := LocalFile{Exists: exists}
		if err != nil {
			lf.Err = err.Error()
		} else if exists {
			lf.Hash, lf.Content = Hash(b), b
		}
		cur.Files[p] = lf
		a.noteDrift(p, cur.Managed[p], lf)
	}
	for _, rec := range cur.Records {
		for p, h := range rec.Applied {
			if lf := cur.Files[p]; lf.Hash == h {
				continue
			}
			if b, ok := a.cfg.Manifest.Blob(h); ok {
				cur.Blobs[h] = b
			}
		}
	}
	rel := map[string]bool{}
	for u := range units {
		rel[u] = true
		if d := desired[u]; d != nil && d.Err != nil {
			continue // maybe not even a valid name: do not ask systemd
		}
		st, err := a.state(ctx, u)
		if err != nil {
			return nil, Current{}, err
		}
		cur.Units[u] = st
	}
	a.mu.Lock()
	a.relevant = rel
	a.mu.Unlock()
	return desired, cur, nil
}

// state asks systemd about a unit; a template has no state of its own
// (systemd refuses the name), only its instances do.
func (a *Agent) state(ctx context.Context, unit string) (UnitState, error) {
	if IsTemplate(unit) {
		return UnitState{LoadState: "template", ActiveState: "inactive", SubState: "template"}, nil
	}
	st, err := a.cfg.Systemd.State(ctx, unit)
	if err != nil {
		return st, fmt.Errorf("read state of %s: %w", unit, err)
	}
	return st, nil
}

// noteDrift logs, once per distinct content, a managed file changed behind
// the agent's back. The pass then restores it like any other difference.
func (a *Agent) noteDrift(path, want string, lf LocalFile) {
	if want == "" || want == InstanceMarker || lf.Err != "" {
		return
	}
	found := lf.Hash
	if !lf.Exists {
		found = "deleted"
	}
	if found == want {
		delete(a.drifted, path)
		return
	}
	if a.drifted[path] == found {
		return
	}
	a.drifted[path] = found
	a.log.Warn("drift: managed file changed on disk; restoring the registry version",
		"unit", UnitOfPath(path), "path", path, "hash", short(want), "found_hash", short(found), "action", "drift")
	a.cfg.Observer.Drift(path)
}

// pass observes, checks health, plans, applies and reports.
func (a *Agent) pass(ctx context.Context) ([]Action, error) {
	t0 := time.Now()
	desired, cur, err := a.observe(ctx)
	if errors.Is(err, ErrNoRegistry) {
		return nil, nil // nothing known yet: touch nothing
	}
	if err != nil {
		return nil, err
	}
	if fails := a.checkHealth(ctx, cur); len(fails) > 0 {
		a.rollback(ctx, fails, desired)
		if desired, cur, err = a.observe(ctx); err != nil {
			return nil, err
		}
	}
	for u := range cur.Verifying {
		if _, still := a.health[u]; !still {
			delete(cur.Verifying, u) // healthy now: the next instance may go
		}
	}
	plan := Plan(desired, cur)
	a.resumeVerification(ctx, plan, cur)
	t1 := time.Now()
	applyErr := a.apply(ctx, plan, cur, desired)
	a.persist()
	t2 := time.Now()
	reportErr := a.report(ctx, desired, plan)
	a.log.Debug("pass", "units", len(cur.Units), "observe", t1.Sub(t0), "apply", t2.Sub(t1), "report", time.Since(t2))
	return plan, errors.Join(applyErr, reportErr)
}

// resumeVerification reopens the HealthySec window of a unit that runs a
// version never confirmed healthy — the agent restarted inside the window —
// so that version is still verified (and rolled back if it dies).
func (a *Agent) resumeVerification(ctx context.Context, plan []Action, cur Current) {
	for _, act := range plan {
		rec := a.records[act.Unit]
		if act.Kind != KindNone || act.Effective == nil || act.Policy.State != StateStarted || act.Policy.HealthySec == 0 ||
			len(rec.Applied) == 0 || KeyOf(rec.Applied) != act.ContentKey || KeyOf(rec.Good) == act.ContentKey ||
			!cur.Units[act.Unit].Active() {
			continue
		}
		if _, verifying := a.health[act.Unit]; verifying {
			continue
		}
		a.log.Info("resuming the health check of a version not yet confirmed healthy", "unit", act.Unit, "healthy_sec", act.Policy.HealthySec)
		act.Kind = KindRestart // what put it there, as far as messages go
		a.begin(ctx, act)
	}
}

// checkHealth ends HealthySec windows: units that stayed active are now the
// last good version; units that went down are failures.
func (a *Agent) checkHealth(ctx context.Context, cur Current) []failure {
	var fails []failure
	now := time.Now()
	for _, u := range slices.Sorted(maps.Keys(a.health)) {
		w := a.health[u]
		st := cur.Units[u]
		switch {
		case !st.Active():
			delete(a.health, u)
			fails = append(fails, failure{unit: u, key: w.key, op: w.op, policy: w.policy, scope: w.scope, hash: w.hash,
				reason: fmt.Sprintf("%s became %s within HealthySec=%d after %s (%s)", u, st.ActiveState, w.policy.HealthySec, w.op, ExitDetail(st))})
		case !now.Before(w.until):
			delete(a.health, u)
			a.markGood(u, w.effective)
			a.releaseSlot(ctx, u)
			a.log.Info("unit healthy", "unit", u, "healthy_sec", w.policy.HealthySec, "action", "healthy")
		}
	}
	return fails
}

func (a *Agent) markGood(u string, effective map[string]string) {
	rec := a.records[u]
	rec.Good = effective
	rec.Failed, rec.FailReason = "", ""
	a.records[u] = rec
}

// apply executes a plan in a fixed order — stops that need the old
// definition, disables, file writes and removals, enables, ONE
// daemon-reload, load checks, jobs — so a batch of changes costs one
// reload. A failure ends that unit's chain only; the returned error is for
// failures that affect every unit (D-Bus).
func (a *Agent) apply(ctx context.Context, plan []Action, cur Current, desired map[string]*DesiredUnit) error {
	failed := map[string]bool{}
	noted := map[string]bool{} // a failure recorded for a unit whose chain goes on
	fail := func(act Action, result string, err error) {
		failed[act.Unit] = true
		a.record(act, result, err)
	}

	// 1. Stops that must run with the current (old) definition, and
	// disables that must see the old [Install].
	for _, act := range plan {
		switch {
		case act.Kind == KindRemove && cur.Units[act.Unit].Active():
			if err := a.cfg.Systemd.Stop(ctx, act.Unit); err != nil {
				// Keep going: the registry no longer wants this unit, and a
				// unit that will not stop must not keep its file forever.
				a.record(act, resultOf(err), err)
				noted[act.Unit] = true
			}
		case act.Kind == KindStopStart:
			if err := a.cfg.Systemd.Stop(ctx, act.Unit); err != nil {
				fail(act, resultOf(err), err)
				continue
			}
		}
		if act.Disable {
			if err := a.cfg.Systemd.Disable(ctx, act.Unit); err != nil {
				a.record(act, "failed", err)
				noted[act.Unit] = true
			}
		}
	}

	// 2. Files. The manifest claims a path before the file is written, so a
	// crash in between never leaves a file the agent forgot it owns.
	reloadNeeded := false
	previous := map[string][]byte{} // path -> content before this pass (nil: absent)
	claims := map[string]string{}
	for _, act := range plan {
		if act.Kind == KindBlocked || act.Kind == KindWait || failed[act.Unit] {
			continue
		}
		for _, w := range act.Writes {
			claims[w.Path] = w.Hash
		}
	}
	// One manifest write claims every path of the batch (not one per file).
	if err := a.cfg.Manifest.SetMany(claims); err != nil {
		err = fmt.Errorf("claim files in the state directory: %w", err)
		for _, act := range plan {
			if len(act.Writes) > 0 {
				fail(act, "failed", err)
			}
		}
	}
	for _, act := range plan {
		if act.Kind == KindBlocked || act.Kind == KindWait || !act.Changes() || failed[act.Unit] {
			continue
		}
		if err := a.writeFiles(act, previous); err != nil {
			fail(act, "failed", err)
		}
		reloadNeeded = true
	}
	for _, act := range plan {
		if act.Kind != KindRemove {
			continue
		}
		if cur.Managed[act.Unit] == InstanceMarker {
			if err := a.cfg.Manifest.Forget(act.Unit); err != nil {
				fail(act, "failed", err)
			}
		}
	}

	// 3. Enable per [Install]; symlinks only, the reload below picks them up.
	for _, act := range plan {
		if act.Enable && !failed[act.Unit] {
			if err := a.cfg.Systemd.Enable(ctx, act.Unit); err != nil {
				fail(act, "failed", err)
			}
		}
	}

	// 4. One daemon-reload for the whole batch.
	if reloadNeeded {
		if err := a.cfg.Systemd.Reload(ctx); err != nil {
			err = fmt.Errorf("daemon-reload: %w", err)
			for _, act := range plan {
				if act.Changes() && !failed[act.Unit] {
					fail(act, "failed", err)
				}
			}
			return err
		}
	}

	// 5. Content systemd will not load is put back the way it was.
	reloadAgain := false
	for _, act := range plan {
		if len(act.Writes) == 0 || failed[act.Unit] || IsTemplate(act.Unit) {
			continue
		}
		st, err := a.cfg.Systemd.State(ctx, act.Unit)
		if err != nil {
			fail(act, "failed", err)
			continue
		}
		if st.LoadState == "loaded" {
			continue
		}
		if st.LoadState != "bad-setting" && st.LoadState != "error" || !a.stillOurs(act) {
			// Not a verdict on the content: the file was changed or removed
			// behind our back between the write and the reload (or the unit
			// is masked). The next pass looks again.
			a.log.Warn("unit not loaded after daemon-reload; checking again", "unit", act.Unit, "load_state", st.LoadState)
			a.trigger()
			continue
		}
		reason := fmt.Sprintf("systemd refused to load %s (%s): %s", act.Unit, st.LoadState, st.LoadError)
		if err := a.restoreFiles(act, previous); err != nil {
			reason += "; restoring the previous files failed: " + err.Error()
		}
		a.refused[act.Unit] = Refusal{ContentKey: act.ContentKey, Reason: reason}
		fail(act, "refused", errors.New(reason))
		reloadAgain = true
	}
	if reloadAgain {
		if err := a.cfg.Systemd.Reload(ctx); err != nil {
			return fmt.Errorf("daemon-reload after restoring refused files: %w", err)
		}
	}

	// 6. Jobs, each waited on; what they started is then watched for
	// HealthySec. systemd runs jobs in parallel, so they are enqueued
	// together (each unit's own steps stay in order) and judged after.
	type job struct {
		act Action
		run func(context.Context) error
		err error
	}
	var jobs []*job
	for _, act := range plan {
		if ctx.Err() != nil {
			// Shutting down: start nothing new, judge nothing.
			return ctx.Err()
		}
		if failed[act.Unit] {
			continue
		}
		if act.Kind.Disruptive() && act.Policy.MaxUnavailable > 0 && act.Scope != "" && !a.stillHolding(ctx, act.Unit, act.Scope) {
			continue
		}
		unit := act.Unit
		switch act.Kind {
		case KindStart, KindStopStart:
			if act.Instance {
				if err := a.cfg.Manifest.Set(unit, InstanceMarker); err != nil {
					fail(act, "failed", err)
					continue
				}
			}
			a.started[unit] = act.ContentKey
			jobs = append(jobs, &job{act: act, run: func(ctx context.Context) error { return a.cfg.Systemd.Start(ctx, unit) }})
		case KindRestart:
			a.started[unit] = act.ContentKey
			also := act.AlsoStop
			jobs = append(jobs, &job{act: act, run: func(ctx context.Context) error {
				for _, other := range also {
					if err := a.cfg.Systemd.Stop(ctx, other); err != nil {
						return err
					}
				}
				return a.cfg.Systemd.Restart(ctx, unit)
			}})
		case KindReload:
			if !cur.Units[unit].CanReload {
				// Nothing ran: the unit still runs the old version. Report,
				// and do not try this content again; no rollback needed.
				err := fmt.Errorf("reload %s: the unit cannot reload (no ExecReload=); not restarting it silently — use OnChange=reload-or-restart or restart", unit)
				a.record(act, "failed", err)
				rec := a.records[unit]
				rec.Failed, rec.FailReason = act.ContentKey, err.Error()
				a.records[unit] = rec
				continue
			}
			jobs = append(jobs, &job{act: act, run: func(ctx context.Context) error { return a.cfg.Systemd.ReloadUnit(ctx, unit) }})
		case KindStop:
			jobs = append(jobs, &job{act: act, run: func(ctx context.Context) error { return a.cfg.Systemd.Stop(ctx, unit) }})
		case KindRemove:
			delete(a.records, unit)
			delete(a.health, unit)
			a.releaseSlot(ctx, unit)
			if !noted[unit] {
				a.record(act, "done", nil)
			}
		case KindUpdate, KindNone:
			// The unit keeps running; if it runs, it now counts as current.
			if act.Effective != nil && cur.Units[unit].Active() && KeyOf(a.records[unit].Applied) != act.ContentKey {
				rec := a.records[unit]
				rec.Applied = act.Effective
				a.records[unit] = rec
				if _, verifying := a.health[unit]; !verifying {
					a.markGood(unit, act.Effective)
				}
			}
			if act.Kind == KindUpdate {
				a.record(act, "done", nil)
			}
		case KindWait:
			if act.NeedSlot {
				a.ensureSlot(ctx, unit, act.Scope, act.Hash, act.Policy.MaxUnavailable)
			}
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallelJobs)
	for _, j := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			j.err = j.run(ctx)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var fails []failure
	for _, j := range jobs {
		act := j.act
		if j.err != nil {
			a.record(act, resultOf(j.err), j.err)
			if act.Kind != KindStop && act.Effective != nil {
				fails = append(fails, failure{unit: act.Unit, key: act.ContentKey, op: act.Kind.String(), reason: j.err.Error(), policy: act.Policy,
					keepRunning: act.Kind == KindReload, scope: act.Scope, hash: act.Hash})
			}
			continue
		}
		a.record(act, "done", nil)
		if act.Kind != KindStop {
			a.begin(ctx, act)
		}
	}
	if len(fails) > 0 {
		a.rollback(ctx, fails, desired)
	}
	for _, act := range plan {
		if act.Kind == KindBlocked {
			if prev, ok := a.last[act.Unit]; !ok || (prev.err != act.Err && prev.action != "rolled-back") {
				a.record(act, "blocked", errors.New(act.Err))
			}
		}
		if act.Kind == KindRemove {
			delete(a.refused, act.Unit)
			delete(a.started, act.Unit)
		}
	}
	return nil
}

// stillOurs reports whether the files just written are still on disk as written.
func (a *Agent) stillOurs(act Action) bool {
	for _, w := range act.Writes {
		b, exists, err := a.cfg.Files.Read(w.Path)
		if err != nil || !exists || Hash(b) != w.Hash {
			return false
		}
	}
	return true
}

// begin records what a unit now runs and opens its HealthySec window.
func (a *Agent) begin(ctx context.Context, act Action) {
	if act.Effective == nil {
		return
	}
	rec := a.records[act.Unit]
	rec.Applied = act.Effective
	a.records[act.Unit] = rec
	if act.Policy.State != StateStarted || act.Policy.HealthySec == 0 {
		a.markGood(act.Unit, act.Effective)
		a.releaseSlot(ctx, act.Unit)
		return
	}
	a.health[act.Unit] = healthWait{
		key: act.ContentKey, effective: act.Effective, policy: act.Policy, op: act.Kind.String(), scope: act.Scope, hash: act.Hash,
		until: time.Now().Add(time.Duration(act.Policy.HealthySec) * time.Second),
	}
}

// rollback puts failed units back on their last good version (Rollback=yes),
// with one daemon-reload for all of them, and remembers the failed content so
// it is not retried until the registry changes.
func (a *Agent) rollback(ctx context.Context, fails []failure, desired map[string]*DesiredUnit) {
	type restore struct {
		failure
		good map[string]string
	}
	var restores []restore
	for _, f := range fails {
		rec := a.records[f.unit]
		rec.Failed, rec.FailReason = f.key, f.reason
		a.records[f.unit] = rec
		a.releaseSlot(ctx, f.unit)
		a.halt(ctx, f.unit, f.scope, f.hash, f.reason)
		if IsInstance(f.unit) {
			// The template's new content is what failed: hold it too, so the
			// other instances are not rolled onto it.
			if t := desired[TemplateOf(f.unit)]; t != nil && t.Err == nil {
				tr := a.records[t.Name]
				tr.Failed, tr.FailReason = ContentKey(t), f.reason
				a.records[t.Name] = tr
			}
		}
		act := Action{Unit: f.unit, ContentKey: f.key, Kind: KindRestart}
		switch {
		case !f.policy.Rollback:
			a.recordAs(act, "failed", "failed", errors.New(f.reason+"; Rollback=no: left as it is"))
			continue
		case len(rec.Good) == 0 || KeyOf(rec.Good) == f.key:
			a.recordAs(act, "failed", "failed", errors.New(f.reason+"; no earlier good version to roll back to"))
			continue
		}
		if err := a.restoreGood(f.unit, rec.Good); err != nil {
			a.recordAs(act, "rolled-back", "failed", fmt.Errorf("%s; rollback failed: %w", f.reason, err))
			continue
		}
		restores = append(restores, restore{f, rec.Good})
	}
	if len(restores) == 0 {
		return
	}
	if err := a.cfg.Systemd.Reload(ctx); err != nil {
		for _, r := range restores {
			a.recordAs(Action{Unit: r.unit, ContentKey: r.key}, "rolled-back", "failed", fmt.Errorf("%s; rollback daemon-reload failed: %w", r.reason, err))
		}
		return
	}
	for _, r := range restores {
		act := Action{Unit: r.unit, ContentKey: r.key}
		var err error
		if !r.keepRunning {
			err = a.cfg.Systemd.Restart(ctx, r.unit)
		}
		rec := a.records[r.unit]
		rec.Applied = r.good
		msg := r.reason + "; rolled back to " + short(r.good[r.unit]) + " (the previous version)"
		rec.FailReason = msg
		a.records[r.unit] = rec
		delete(a.health, r.unit)
		a.cfg.Observer.Rollback(r.unit)
		if err != nil {
			a.recordAs(act, "rolled-back", "failed", fmt.Errorf("%s; restarting the previous version failed: %w", msg, err))
			continue
		}
		a.recordAs(act, "rolled-back", "done", errors.New(msg))
	}
}

// restoreGood writes a unit's last good files back and removes its files
// that the good version did not have.
func (a *Agent) restoreGood(unit string, good map[string]string) error {
	for _, p := range slices.Sorted(maps.Keys(good)) {
		h := good[p]
		b, ok := a.cfg.Manifest.Blob(h)
		if !ok {
			cur, exists, err := a.cfg.Files.Read(p)
			if err != nil || !exists || Hash(cur) != h {
				return fmt.Errorf("previous version of %s (%s) is not kept in the state directory", p, short(h))
			}
			continue
		}
		if err := a.cfg.Manifest.Set(p, h); err != nil {
			return err
		}
		if err := a.cfg.Files.Write(p, b); err != nil {
			return err
		}
	}
	for p, h := range a.cfg.Manifest.Managed() {
		if UnitOfPath(p) == unit && h != InstanceMarker && good[p] == "" {
			if err := a.cfg.Files.Remove(p); err != nil {
				return err
			}
			if err := a.cfg.Manifest.Forget(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// persist saves changed unit records and drops blobs nothing refers to.
func (a *Agent) persist() {
	saved := a.cfg.Manifest.Units()
	changed := false
	for u, rec := range a.records {
		if !recordEqual(saved[u], rec) {
			if err := a.cfg.Manifest.SetUnit(u, rec); err != nil {
				a.log.Error("save unit record", "unit", u, "err", err)
			}
			changed = true
		}
	}
	for u := range saved {
		if _, ok := a.records[u]; !ok {
			if err := a.cfg.Manifest.SetUnit(u, UnitRecord{}); err != nil {
				a.log.Error("drop unit record", "unit", u, "err", err)
			}
			changed = true
		}
	}
	if changed {
		if err := a.cfg.Manifest.GC(); err != nil {
			a.log.Warn("clean state directory", "err", err)
		}
	}
}

func recordEqual(x, y UnitRecord) bool {
	return maps.Equal(x.Applied, y.Applied) && maps.Equal(x.Good, y.Good) && x.Failed == y.Failed && x.FailReason == y.FailReason
}

func (a *Agent) writeFiles(act Action, previous map[string][]byte) error {
	for _, w := range act.Writes {
		old, exists, err := a.cfg.Files.Read(w.Path)
		if err != nil {
			return err
		}
		if exists {
			previous[w.Path] = old
		} else {
			previous[w.Path] = nil
		}
		// Kept by hash for classification and rollback of later changes.
		if err := a.cfg.Manifest.PutBlob(w.Hash, w.Content); err != nil {
			return err
		}
		if err := a.cfg.Files.Write(w.Path, w.Content); err != nil {
			return err
		}
	}
	for _, p := range act.Removes {
		if err := a.cfg.Files.Remove(p); err != nil {
			return err
		}
		if err := a.cfg.Manifest.Forget(p); err != nil {
			return err
		}
	}
	return nil
}

func (a *Agent) restoreFiles(act Action, previous map[string][]byte) error {
	var errs []error
	for _, w := range act.Writes {
		old, ok := previous[w.Path]
		if !ok {
			continue
		}
		if old == nil {
			errs = append(errs, a.cfg.Files.Remove(w.Path), a.cfg.Manifest.Forget(w.Path))
			continue
		}
		errs = append(errs, a.cfg.Manifest.Set(w.Path, Hash(old)), a.cfg.Files.Write(w.Path, old))
	}
	return errors.Join(errs...)
}

func (a *Agent) record(act Action, result string, err error) {
	a.recordAs(act, act.Kind.String(), result, err)
}

func (a *Agent) recordAs(act Action, action, result string, err error) {
	o := outcome{action: action, result: result, contentKey: act.ContentKey}
	if err != nil {
		o.err = err.Error()
	}
	a.last[act.Unit] = o
	a.cfg.Observer.Action(act.Unit, act.Kind, result)
	log := a.log.With("unit", act.Unit, "action", action, "result", result)
	if act.Reason != "" {
		log = log.With("reason", act.Reason)
	}
	if len(act.Writes) > 0 {
		log = log.With("hash", short(act.Writes[0].Hash))
	}
	// The message names the unit and says why: in the journal it is read
	// alone (journalctl -u <unit> shows it among the unit's own lines).
	msg := func(what, detail string) string {
		if detail == "" {
			return act.Unit + ": " + what
		}
		return act.Unit + ": " + what + " — " + detail
	}
	errText := ""
	if err != nil {
		errText = err.Error()
	}
	switch {
	case err != nil && result == "blocked":
		log.Warn(msg("not applied", errText), "err", err)
	case action == "rolled-back":
		log.Error(msg("change rolled back", errText), "err", err)
	case err != nil:
		log.Error(msg(action+" failed", errText), "err", err)
	default:
		log.Info(msg(actionMessage(act.Kind), act.Reason))
	}
}

func actionMessage(k Kind) string {
	switch k {
	case KindStart:
		return "started unit"
	case KindRestart:
		return "replaced unit file, restarted in place"
	case KindReload:
		return "replaced unit file, reloaded in place"
	case KindStopStart:
		return "stopped with the old definition, replaced unit file, started"
	case KindStop:
		return "stopped unit"
	case KindUpdate:
		return "replaced unit file (daemon-reload only)"
	case KindRemove:
		return "removed unit"
	}
	return k.String()
}

// resultOf maps a job error to the status "result" word.
func resultOf(err error) string {
	var jr interface{ JobResult() string }
	if errors.As(err, &jr) {
		return jr.JobResult()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "failed"
}

// report builds every unit's status from fresh state and publishes it.
func (a *Agent) report(ctx context.Context, desired map[string]*DesiredUnit, plan []Action) error {
	managed := a.cfg.Manifest.Managed()
	units := map[string]bool{}
	for n := range desired {
		units[n] = true
	}
	for p := range managed {
		units[UnitOfPath(p)] = true
	}
	byUnit := map[string]Action{}
	for _, act := range plan {
		byUnit[act.Unit] = act
	}
	var out []Status
	for _, name := range slices.Sorted(maps.Keys(units)) {
		d := desired[name]
		act := byUnit[name]
		s := Status{Unit: name, UpdatedAt: time.Now().UTC()}
		if d != nil {
			s.DesiredHash = d.Hash()
			if d.File != nil {
				s.Source = d.File.Source
			}
		}
		if managed[name] != InstanceMarker {
			if b, exists, err := a.cfg.Files.Read(name); err == nil && exists {
				s.Hash = Hash(b)
			}
		}
		for p, h := range managed {
			if p != name && UnitOfPath(p) == name && h != InstanceMarker {
				if b, exists, err := a.cfg.Files.Read(p); err == nil && exists {
					if s.DropIns == nil {
						s.DropIns = map[string]string{}
					}
					s.DropIns[p] = Hash(b)
				}
			}
		}
		if d == nil || d.Err == nil {
			st, err := a.state(ctx, name)
			if err != nil {
				return err
			}
			s.LoadState, s.ActiveState, s.SubState = st.LoadState, st.ActiveState, st.SubState
			s.UnitResult, s.MainPID = st.Result, st.MainPID
			if d != nil && d.Policy.State == StateStarted && !IsTemplate(name) && st.ActiveState == "failed" {
				s.Error = fmt.Sprintf("unit failed (%s)", ExitDetail(st))
			}
			_, s.Verifying = a.health[name]
			if d != nil && act.Policy.OnChange == "none" && st.Active() {
				rec := a.records[name]
				s.PendingRestart = len(rec.Applied) > 0 && KeyOf(rec.Applied) != act.ContentKey
			}
		}
		if o, ok := a.last[name]; ok {
			s.Action, s.Result = o.action, o.result
			if o.err != "" && (d == nil || o.contentKey == act.ContentKey || o.contentKey == ContentKey(d)) && o.result != "done" {
				s.Error = o.err
			}
			if o.action == "rolled-back" && o.contentKey == act.ContentKey {
				s.Error = o.err
			}
		}
		if act.Kind == KindWait {
			s.Action, s.Result = "wait", "waiting"
			if act.NeedSlot {
				s.Action = "wait-slot"
			}
			if act.Err != "" {
				s.Action, s.Error = "held", act.Err
			}
		}
		if act.Kind == KindBlocked {
			if o, ok := a.last[name]; !ok || o.action != "rolled-back" {
				s.Action, s.Result = KindBlocked.String(), "blocked"
			}
			s.Error = act.Err
		}
		out = append(out, s)
	}
	a.mu.Lock()
	a.statuses = out
	if a.snap != nil {
		a.revision = a.snap.Revision
	}
	rev := a.revision
	a.mu.Unlock()
	a.cfg.Observer.Reported(rev, out)
	for u := range a.last {
		if !units[u] {
			delete(a.last, u)
		}
	}
	if a.cfg.Reporter == nil {
		return nil
	}
	if err := a.cfg.Reporter.Report(ctx, out); err != nil {
		return fmt.Errorf("report status: %w", err)
	}
	return nil
}
