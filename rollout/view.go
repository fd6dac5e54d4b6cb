package rollout

import (
	"strconv"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// View is one rollout as a reader sees it (the CLI, `rollout status`,
// `put --wait`): its record, its summary and the group's keys, read at one
// revision. It never needs every host's progress: Progress is filled only
// when a command asks for each host's line.
type View struct {
	Record *Record
	// Summary is nil until a coordinator has looked at the rollout.
	Summary *Summary
	// Entries are the group's unit keys now (to tell a superseded rollout).
	Entries []reconcile.Entry
	// Coordinator is the host that coordinates the group now ("": none).
	Coordinator string
	// GateRunner is who runs the rollout's gate command now ("": no
	// command does).
	GateRunner string
	// Progress is every host's progress, when asked for (else nil).
	Progress map[string]*Progress
	Revision int64
	// Now is the time the view is read at (zero: the clock's now), for
	// what a phase says of time (a window's opening).
	Now time.Time
}

func (v View) now() time.Time {
	if v.Now.IsZero() {
		return time.Now()
	}
	return v.Now
}

// Phase is where the rollout stands: its end when one is written (or its
// keys were written again since: superseded), else what the coordinator
// last summarized, with the record's pause (written by the CLI) taken at
// once.
func (v View) Phase() Phase {
	r, s := v.Record, v.Summary
	wave := 0
	if s != nil {
		wave = s.Phase.Wave
	}
	switch {
	case r.End != nil:
		if r.End.Wave > 0 {
			wave = r.End.Wave - 1
		}
		return Phase{State: r.End.State, Wave: wave, Reason: r.End.Reason}
	case r.Overwritten(v.Entries):
		return Phase{State: Superseded, Wave: wave, Reason: overwrittenReason}
	case r.Paused:
		return Phase{State: Paused, Wave: wave, Reason: r.PauseReason}
	case s == nil:
		return Phase{State: Starting, Reason: "no coordinator has looked at it yet"}
	case s.Phase.State == Paused, // resumed since the summary
		s.Phase.State == WaitingPromote && r.Promoted,     // promoted since
		s.Phase.State == WaitingGate && r.Gated >= wave,   // its gate passed since
		s.Phase.State == WaitingWindow && r.OutsideWindow: // promoted outside its window since
		return Phase{State: Running, Wave: wave}
	case s.Phase.State == WaitingWindow && r.Strategy.Window != nil:
		// Said as of now: "in 3 h 12 min" from the summary's time would be stale.
		return Phase{State: WaitingWindow, Wave: wave, Reason: WindowReason(*r.Strategy.Window, v.now())}
	case s.Phase.State == WaitingGate && r.Strategy.GateCmd != "" && v.GateRunner == "":
		return Phase{State: WaitingGate, Wave: wave, Reason: "waiting for the gate command before wave " + strconv.Itoa(wave+1) +
			"; no command is running it: `agentd rollout resume " + r.ID + "` runs it here, `agentd rollout promote " + r.ID + "` skips it"}
	}
	return s.Phase
}

// Settled says following the rollout can stop: it ended and, when it
// reverts, no host holds the change any more (by the summary written
// after its end).
func (v View) Settled() bool {
	ph := v.Phase()
	if !ph.State.Ended() {
		return false
	}
	if v.Record.Reverts() {
		s := v.Summary
		return s != nil && s.Phase.State.Ended() && s.Holding() == 0
	}
	return true
}

// HostState is host's state (pending when its progress was not read or
// not written).
func (v View) HostState(host string) (HostState, string, time.Time) {
	p := v.Progress[host]
	if p == nil {
		return HostPending, "", time.Time{}
	}
	return p.State, p.Reason, p.Since
}

// Count is how many hosts are in state, by the summary.
func (v View) Count(st HostState) int { return v.Summary.countOf(st) }

// HostView is what a host's registry watch delivers of its groups'
// rollouts: the records, and its own progress and admissions. No other
// host's progress reaches it.
type HostView struct {
	// Records are the rollouts of the host's groups that did not end done
	// (a failed or aborted one still says who keeps the previous content),
	// sorted by ID.
	Records []*Record
	// Mine is this host's progress, Admitted its admissions, by rollout ID.
	Mine     map[string]*Progress
	Admitted map[string]bool
	// KnownUpTo is how far the records are known complete: a group key
	// written after it may belong to a rollout whose record has not
	// arrived yet (HoldUnconfirmed).
	KnownUpTo int64
}
