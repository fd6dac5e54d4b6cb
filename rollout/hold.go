package rollout

import (
	"fmt"
	"time"

	"github.com/agentd/agentd/calendar"
)

// A rollout may wait for something outside its group: another rollout's
// end before its first host (--after, Strategy.Follows), and its window
// before each admission (--window, Strategy.Window). Like a pause these
// are holds on purpose: the progress deadline does not run while it
// waits, and counts from when the wait ended.

const (
	// WaitingAfter: the rollout waits for the one it follows (--after)
	// to end done.
	WaitingAfter State = "waiting-after"
	// WaitingWindow: its window is closed; no host is admitted until it
	// opens (the hosts admitted go on).
	WaitingWindow State = "waiting-window"
)

// FollowEvery is how often a coordinator reads the rollout one of its
// rollouts waits for (it is another group's: no watch of its own group
// sees it move).
const FollowEvery = 2 * time.Second

// Followed is what a coordinator read of the rollout a rollout follows:
// its summary's phase (nil: no summary yet, no coordinator has looked at
// it), or why it could not be read.
type Followed struct {
	Phase *Phase
	// At is when the summary was written; for a done one, about when
	// that rollout ended.
	At  time.Time
	Err string
}

// Done says the followed rollout ended done.
func (f *Followed) Done() bool { return f != nil && f.Phase != nil && f.Phase.State == Done }

// begun says some host was admitted: a rollout that began waits for
// nothing outside its group any more (what it waited for ended done).
func (r *Record) begun(g GroupView) bool {
	for _, h := range r.Hosts {
		if g.Admitted[h] || g.Progress[h] != nil {
			return true
		}
	}
	return false
}

// FollowsPending says a coordinator must read what r follows: it has
// not begun and not ended.
func (r *Record) FollowsPending(g GroupView) bool {
	return r.Strategy.Follows != nil && r.End == nil && !r.begun(g)
}

// waitAfter is the phase of a rollout that waits for the one it follows,
// and false when it need not wait.
func (r *Record) waitAfter(g GroupView, w int) (Phase, bool) {
	if !r.FollowsPending(g) || g.Follows.Done() {
		return Phase{}, false
	}
	ref, f := r.Strategy.Follows, g.Follows
	reason := "waiting for rollout " + ref.String() + " to end done (--after)"
	switch {
	case f == nil:
	case f.Err != "":
		reason += ": cannot read it: " + f.Err
	case f.Phase == nil:
		reason += ": no coordinator has looked at it yet"
	case f.Phase.State.Ended():
		reason = fmt.Sprintf("rollout %s (--after) ended %s%s: this one waits for it to end done; "+
			"`agentd rollout abort %s` ends this one, or put the change again without --after", ref, f.Phase.State, prefixed(f.Phase.Reason), r.ID)
	default:
		reason += ": it is " + string(f.Phase.State) + fmt.Sprintf(", wave %d", f.Phase.Wave+1) + prefixed(f.Phase.Reason)
	}
	return Phase{State: WaitingAfter, Wave: w, Reason: reason}, true
}

// window is the window r admits hosts in; nil: none, or promoted
// outside it (`agentd rollout promote`).
func (r *Record) window() *calendar.Window {
	if w := r.Strategy.Window; w != nil && !w.IsZero() && !r.OutsideWindow {
		return w
	}
	return nil
}

// WindowReason is what a rollout waiting for win says at now (a reader
// may look between the opening and the coordinator's next pass).
func WindowReason(win calendar.Window, now time.Time) string {
	open, opens, _ := win.Open(now)
	switch {
	case open:
		return "its window is " + win.Describe(now) + ": hosts are admitted at the coordinator's next look"
	case opens.IsZero():
		return "its window (" + win.String() + ") never opens again: `agentd rollout promote` lets it go on outside it, `agentd rollout abort` ends it"
	}
	return "waiting for window " + win.Describe(now)
}

// heldUntil is when the waits outside the group ended, for the progress
// deadline (zero: none): the followed rollout's end, the window's
// opening (opened).
func (g GroupView) heldUntil(opened time.Time) time.Time {
	if g.Follows.Done() && g.Follows.At.After(opened) {
		return g.Follows.At
	}
	return opened
}
