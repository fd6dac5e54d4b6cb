package reconcile

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// Phase is where a rollout stands, computed from its record and every
// host's progress: the same answer for each agent, the CLI and `rollout
// status`, so nobody has to write "wave 2 opened".
type Phase struct {
	State RolloutState
	// Wave is the open wave (the first with a host not yet done).
	Wave   int
	Reason string
	// End is set when the rollout reached an end nobody has written yet
	// (done, or failed): the first to see it writes it.
	End *RolloutEnd
}

// Phase says where r stands at now, given each host's progress.
func (r *Rollout) Phase(progress map[string]*HostProgress, now time.Time) Phase {
	if r.End != nil {
		return Phase{State: r.End.State, Wave: r.openWave(progress), Reason: r.End.Reason}
	}
	for _, h := range r.Hosts {
		if p := progress[h]; p != nil && p.State == HostFailed {
			reason := fmt.Sprintf("%s failed the change: %s", h, p.Reason)
			return Phase{State: RolloutFailed, Wave: r.Wave(h), Reason: reason, End: &RolloutEnd{State: RolloutFailed, Reason: reason, At: now}}
		}
	}
	w := r.openWave(progress)
	if w == len(r.WaveEnds) {
		return Phase{State: RolloutDone, Wave: w - 1, End: &RolloutEnd{State: RolloutDone, At: now}}
	}
	if d := r.Strategy.ProgressDeadline; d > 0 && !r.Paused {
		if last := r.lastProgress(progress); now.Sub(last) > d {
			reason := fmt.Sprintf("no host became healthy for %s (--progress-deadline), since %s", d, last.UTC().Format(time.DateTime))
			return Phase{State: RolloutFailed, Wave: w, Reason: reason, End: &RolloutEnd{State: RolloutFailed, Reason: reason, At: now}}
		}
	}
	switch {
	case r.Paused:
		return Phase{State: RolloutPaused, Wave: w, Reason: r.PauseReason}
	case w > 0 && r.Strategy.PauseAfterCanary && !r.Promoted:
		return Phase{State: RolloutWaitingPromote, Wave: w, Reason: "the canary is healthy: `agentd rollout promote " + r.ID + "` sends the change on"}
	case w > 0 && r.Strategy.GateCmd != "" && r.Gated < w:
		return Phase{State: RolloutWaitingGate, Wave: w, Reason: "waiting for the gate command before wave " + fmt.Sprint(w+1)}
	}
	return Phase{State: RolloutRunning, Wave: w}
}

// openWave is the first wave with a host not done (len(WaveEnds) when
// every host is).
func (r *Rollout) openWave(progress map[string]*HostProgress) int {
	for w := range r.WaveEnds {
		for _, h := range r.WaveHosts(w) {
			if p := progress[h]; p == nil || p.State != HostHealthy {
				return w
			}
		}
	}
	return len(r.WaveEnds)
}

// lastProgress is when the rollout last moved: started, resumed or
// promoted, or a host became healthy.
func (r *Rollout) lastProgress(progress map[string]*HostProgress) time.Time {
	last := r.CreatedAt
	if r.ResumedAt.After(last) {
		last = r.ResumedAt
	}
	for _, h := range r.Hosts {
		if p := progress[h]; p != nil && p.HealthyAt.After(last) {
			last = p.HealthyAt
		}
	}
	return last
}

// busy counts the hosts taking the change and not done with it.
func (r *Rollout) busy(progress map[string]*HostProgress) int {
	n := 0
	for _, h := range r.Hosts {
		if p := progress[h]; p != nil && (p.State == HostApplying || p.State == HostSoaking || p.State == HostReverting) {
			n++
		}
	}
	return n
}

// RolloutWrite is what one host's agent writes to a rollout after looking
// at it: its own progress, and at most one write to the record.
type RolloutWrite struct {
	Progress *HostProgress // this host's new progress; nil: unchanged
	End      *RolloutEnd   // ends the rollout (first writer wins)
	Pause    string        // pauses it, with this reason
}

// IsZero says there is nothing to write.
func (w RolloutWrite) IsZero() bool { return w.Progress == nil && w.End == nil && w.Pause == "" }

// RolloutStep decides what host writes to r at now. entries are the
// host's registry entries as stored, runs the same with the rollouts
// applied (Overlay: what the host should run now), statuses its units'
// statuses as it last published them. Pure.
func RolloutStep(r *Rollout, host string, progress map[string]*HostProgress, entries, runs []Entry, statuses map[string]Status, now time.Time) RolloutWrite {
	var out RolloutWrite
	if r.Superseded(entries) {
		return out
	}
	ph := r.Phase(progress, now)
	if ph.End != nil && r.End == nil {
		out.End = ph.End
	}
	mine := progress[host]
	if r.Wave(host) < 0 {
		return out
	}
	st := HostPending
	if mine != nil {
		st = mine.State
	}
	set := func(s HostState, reason string) {
		p := HostProgress{State: s, Since: now, Reason: reason}
		if mine != nil {
			p.HealthyAt, p.Restarts = mine.HealthyAt, mine.Restarts
		}
		if s == HostHealthy {
			p.HealthyAt = now
		}
		if s == HostApplying {
			p.Restarts = restartsOf(r, statuses)
		}
		out.Progress = &p
	}
	revert := (r.End != nil || ph.End != nil) && r.reverts(ph)
	switch {
	case revert && mine.Took():
		set(HostReverting, "the rollout "+string(ph.State)+": going back to the previous version")
	case st == HostReverting:
		if done, _ := r.judge(statuses, runs, true); done {
			set(HostReverted, "")
		}
	case st == HostPending:
		if ph.State == RolloutRunning && ph.End == nil && r.Wave(host) <= ph.Wave && r.hasRoom(progress) {
			set(HostApplying, fmt.Sprintf("wave %d of %d", r.Wave(host)+1, len(r.WaveEnds)))
		}
	case st == HostApplying || st == HostSoaking:
		done, failed := r.judge(statuses, runs, false)
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
			if why := r.restartedTooOften(mine, statuses); why != "" && !r.Paused && out.Pause == "" {
				out.Pause = host + ": " + why
			}
		}
	}
	return out
}

// reverts says the hosts that took the change go back: the rollout failed
// with AutoRevert, or was aborted with --revert.
func (r *Rollout) reverts(ph Phase) bool {
	if r.Abort != nil {
		return r.Abort.Revert
	}
	return ph.State == RolloutFailed && r.Strategy.AutoRevert
}

// hasRoom says one more host may start taking the change
// (MaxUnavailable of the rollout's hosts; no bound when unset).
func (r *Rollout) hasRoom(progress map[string]*HostProgress) bool {
	if r.Strategy.MaxUnavailable.IsZero() {
		return true
	}
	return r.busy(progress) < max(1, r.Strategy.MaxUnavailable.Of(len(r.Hosts)))
}

// judge says whether this host runs what it should (runs: the rollout's
// change when it takes it, what it ran before when it went back) healthy,
// or why it failed the change (taking it only), by the one judgement of
// converged (Expectation.Judge) on its statuses.
func (r *Rollout) judge(statuses map[string]Status, runs []Entry, back bool) (done bool, failed string) {
	now := map[string][]byte{}
	for _, e := range runs {
		if e.Scope == ScopeGroup && e.Group == r.Group {
			now[e.Unit] = e.Value
		}
	}
	rep := HostReport{Statuses: statuses}
	done = true
	for _, key := range slices.Sorted(maps.Keys(r.Units)) {
		content, present := now[key]
		e, err := Expect(key, content, !present, 0)
		if err != nil {
			return false, err.Error()
		}
		p, why := e.Judge(rep, func() bool { return true })
		switch {
		case p == ProgressFailed || p == ProgressRolledBack:
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
func (r *Rollout) restartedTooOften(mine *HostProgress, statuses map[string]Status) string {
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

func restartsOf(r *Rollout, statuses map[string]Status) map[string]uint32 {
	out := map[string]uint32{}
	for key := range r.Units {
		_, unit, err := ParseKey(key)
		if err != nil {
			continue
		}
		if st, ok := statuses[unit]; ok {
			out[unit] = st.NRestarts
		}
	}
	return out
}

// Overlay returns the entries host runs under the rollouts: where a
// rollout governs its keys (they hold what it wrote) and host has not
// taken its change (or went back), each key holds what host ran before it:
// the rollout's From, or, when the rollout followed another that did not
// finish (After: aborted, failed, or superseded while running), what that
// one gives host, and so on back. So a host reverted from an aborted
// change, or not yet in it, keeps what it runs when the next rollout
// starts. Entries no rollout touches are shared.
func Overlay(entries []Entry, host string, rollouts []*Rollout, progress map[string]map[string]*HostProgress) []Entry {
	byID := make(map[string]*Rollout, len(rollouts))
	for _, r := range rollouts {
		byID[r.ID] = r
	}
	var out []Entry
	for _, r := range rollouts {
		if !r.Governs(entries) || r.Wave(host) < 0 || progress[r.ID][host].Took() {
			continue
		}
		if out == nil {
			out = slices.Clone(entries)
		}
		out = r.previous(out, func(key string) (from *string, rev int64) {
			cur := r
			for {
				ru := cur.Units[key]
				from, rev = ru.From, ru.FromRevision
				next := byID[cur.After]
				if next == nil || (next.End != nil && next.End.State == RolloutDone) || next.Wave(host) < 0 {
					return from, rev
				}
				if _, ok := next.Units[key]; !ok {
					return from, rev
				}
				if progress[next.ID][host].Took() {
					return from, rev // host runs next's change: cur's From
				}
				cur = next
			}
		})
	}
	if out == nil {
		return entries
	}
	return out
}

// previous puts r's keys back to what host ran before it (prev).
func (r *Rollout) previous(entries []Entry, prev func(key string) (*string, int64)) []Entry {
	seen := map[string]bool{}
	out := entries[:0]
	for _, e := range entries {
		if _, ok := r.Units[e.Unit]; !ok || e.Scope != ScopeGroup || e.Group != r.Group {
			out = append(out, e)
			continue
		}
		seen[e.Unit] = true
		if from, rev := prev(e.Unit); from != nil {
			e.Value, e.ModRevision = []byte(*from), rev
			out = append(out, e)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(r.Units)) {
		if from, rev := prev(key); !seen[key] && from != nil {
			out = append(out, Entry{Scope: ScopeGroup, Group: r.Group, Unit: key, Value: []byte(*from), ModRevision: rev})
		}
	}
	slices.SortFunc(out, CompareEntries)
	return out
}

// HoldUnconfirmed keeps each group key written after upTo (the revision up
// to which the rollouts are known complete) as it was in prev: such a key
// may be staged by a rollout whose record has not arrived yet, and a host
// outside its first wave must not run it meanwhile. A key that was not in
// prev stays out. upTo 0 (not known, e.g. a saved snapshot) holds nothing.
// A removal cannot be dated (the key is gone): it is not held. It says
// whether it held anything: the snapshot then speaks for upTo only.
func HoldUnconfirmed(entries, prev []Entry, upTo int64) ([]Entry, bool) {
	if upTo <= 0 {
		return entries, false
	}
	held := false
	for _, e := range entries {
		if e.Scope == ScopeGroup && e.ModRevision > upTo {
			held = true
			break
		}
	}
	if !held {
		return entries, false
	}
	was := make(map[[2]string]Entry, len(prev))
	for _, e := range prev {
		if e.Scope == ScopeGroup {
			was[[2]string{e.Group, e.Unit}] = e
		}
	}
	out := make([]Entry, 0, len(entries))
	for _, e := range entries {
		if e.Scope == ScopeGroup && e.ModRevision > upTo {
			if old, ok := was[[2]string{e.Group, e.Unit}]; ok {
				out = append(out, old)
			}
			continue
		}
		out = append(out, e)
	}
	slices.SortFunc(out, CompareEntries)
	return out, true
}
