package rollout

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// Write is what one host's participant writes after looking at a rollout:
// its own progress, and at most a pause of the record.
type Write struct {
	Progress *Progress // this host's new progress; nil: unchanged
	Pause    string    // pauses the rollout, with this reason
}

// IsZero says there is nothing to write.
func (w Write) IsZero() bool { return w.Progress == nil && w.Pause == "" }

// HostInput is what a host knows when it steps a rollout: nothing of the
// other hosts.
type HostInput struct {
	Host string
	// Mine is the host's progress (nil: pending); Admitted says the
	// coordinator let it take the change.
	Mine     *Progress
	Admitted bool
	// Entries are the host's registry entries as stored; Runs the same
	// with the rollouts applied (Overlay: what the host should run now);
	// Statuses its units' statuses as it last published them.
	Entries, Runs []reconcile.Entry
	Statuses      map[string]reconcile.Status
}

// Step decides what in.Host writes to r at now. Pure. The host takes the
// change once admitted (the coordinator opened its wave and had room for
// it under --max-unavailable), judges it by the one judgement of converged
// (Expectation.Assess), soaks it, and goes back when the record says the
// rollout reverts.
func Step(r *Record, in HostInput, now time.Time) Write {
	var out Write
	if r.Wave(in.Host) < 0 {
		// Not one of its hosts: this host joined the group since the
		// start. It keeps the previous content (Overlay) and says it is
		// here, once, so the coordinator adds it to the last wave.
		if r.End == nil && in.Mine == nil && !r.Overwritten(in.Entries) {
			out.Progress = &Progress{State: HostPending, Since: now, Reason: "joined the group after the rollout started"}
		}
		return out
	}
	if r.Overwritten(in.Entries) {
		return leftOverwritten(r, in, now)
	}
	mine := in.Mine
	set := func(s HostState, reason string) {
		p := Progress{State: s, Since: now, Reason: reason}
		if mine != nil {
			p.HealthyAt, p.Restarts = mine.HealthyAt, mine.Restarts
		}
		if s == HostHealthy {
			p.HealthyAt = now
		}
		if s == HostApplying {
			p.Restarts = restartsOf(r, in.Statuses)
		}
		out.Progress = &p
	}
	st := mine.StateOf()
	switch {
	case r.Reverts() && mine.Took():
		set(HostReverting, "the rollout "+r.endWord()+": going back to the previous version")
	case st == HostReverting || st == HostRevertFailed:
		// A host that could not go back is looked at still: when it does
		// after all (an operator fixed what failed), it says so.
		switch done, failed := r.judge(in.Statuses, in.Runs, true); {
		case done:
			set(HostReverted, "")
		case failed != "" && st == HostReverting:
			set(HostRevertFailed, "could not go back: "+failed)
		}
	case st == HostPending:
		if in.Admitted && r.End == nil && r.Abort == nil {
			set(HostApplying, fmt.Sprintf("wave %d of %d", r.Wave(in.Host)+1, len(r.WaveEnds)))
		}
	case st == HostApplying || st == HostSoaking:
		done, failed := r.judge(in.Statuses, in.Runs, false)
		switch {
		case failed != "":
			set(HostFailed, failed)
		case !done:
			if st == HostSoaking {
				set(HostApplying, "not healthy any more: waiting for it again")
			}
		case st == HostApplying && r.Strategy.Soak > 0:
			set(HostSoaking, "")
		case st == HostApplying || now.Sub(mine.Since) >= r.Strategy.Soak:
			set(HostHealthy, "")
		}
		if out.Progress == nil || out.Progress.State != HostFailed {
			if why := r.restartedTooOften(mine, in.Statuses); why != "" && !r.Paused && r.End == nil {
				out.Pause = in.Host + ": " + why
			}
		}
	}
	return out
}

// leftOverwritten is what a host writes to r once a later write took its
// keys: nothing, but for a host that was to go back from the change (r
// reverts, and the host took it or is going back). It runs what the keys
// give it now, not r's previous content, so once it runs that healthy it
// has left the change and says so (reverted). Else its progress would
// hold the change for ever, and r, ended, would never settle: a put
// --wait or rollout status --watch following it would time out saying
// the host still goes back.
func leftOverwritten(r *Record, in HostInput, now time.Time) Write {
	mine := in.Mine
	if !r.Reverts() || !(mine.Took() || mine.StateOf() == HostReverting) {
		return Write{}
	}
	if done, _ := r.judge(in.Statuses, in.Runs, true); !done {
		return Write{}
	}
	return Write{Progress: &Progress{State: HostReverted, Since: now, HealthyAt: mine.HealthyAt, Restarts: mine.Restarts,
		Reason: "its keys were written again since: it left the change for what they give it now"}}
}

// endWord is how the rollout ended, in a word ("aborted" for an abort
// whose end is not written yet).
func (r *Record) endWord() string {
	if r.End != nil {
		return string(r.End.State)
	}
	return string(Aborted)
}

// SoakDue is when a host soaking r counts as done for time alone (zero:
// it is not soaking): its participant looks again then.
func SoakDue(r *Record, mine *Progress) time.Time {
	if mine == nil || mine.State != HostSoaking {
		return time.Time{}
	}
	return mine.Since.Add(r.Strategy.Soak)
}

// judge says whether this host runs what it should (runs: the rollout's
// change when it takes it, what it ran before when it went back) healthy,
// or why it failed the change (taking it only), by the one judgement of
// converged (Expectation.Assess) on its statuses.
func (r *Record) judge(statuses map[string]reconcile.Status, runs []reconcile.Entry, back bool) (done bool, failed string) {
	now := map[string][]byte{}
	for _, e := range runs {
		if e.Scope == reconcile.ScopeGroup && e.Group == r.Group {
			now[e.Unit] = e.Value
		}
	}
	rep := reconcile.HostReport{Statuses: statuses}
	done = true
	for _, key := range slices.Sorted(maps.Keys(r.Units)) {
		content, present := now[key]
		e, err := reconcile.Expect(key, content, !present, 0)
		if err != nil {
			return false, err.Error()
		}
		p, why := e.Assess(rep, func() bool { return true })
		switch {
		case p == reconcile.ProgressFailed && back:
			// Going back, a unit that fails the previous content (or
			// refuses it) cannot go back.
			return false, key + ": " + why
		case p == reconcile.ProgressFailed || p == reconcile.ProgressRolledBack:
			if !back {
				return false, key + ": " + why
			}
			done = false
		case !p.Success():
			done = false
		}
	}
	return done, ""
}

// restartedTooOften says why the host's units restarted more than
// MaxRestarts times since it took the change ("" if not).
func (r *Record) restartedTooOften(mine *Progress, statuses map[string]reconcile.Status) string {
	if r.Strategy.MaxRestarts < 0 || mine == nil {
		return ""
	}
	for u, n := range restartsOf(r, statuses) {
		if d := int(n) - int(mine.Restarts[u]); d > r.Strategy.MaxRestarts {
			return fmt.Sprintf("%s restarted %d times since it took the change (--max-restarts %d)", u, d, r.Strategy.MaxRestarts)
		}
	}
	return ""
}

func restartsOf(r *Record, statuses map[string]reconcile.Status) map[string]uint32 {
	out := map[string]uint32{}
	for key := range r.Units {
		_, unit, err := reconcile.ParseKey(key)
		if err != nil {
			continue
		}
		if st, ok := statuses[unit]; ok {
			out[unit] = st.NRestarts
		}
	}
	return out
}
