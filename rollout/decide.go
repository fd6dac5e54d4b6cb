package rollout

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// Phase is where a rollout stands: the coordinator computes it from the
// record and every host's progress and writes it into the Summary, where
// the CLI, `rollout status` and each host read it.
type Phase struct {
	State State `json:"state"`
	// Wave is the open wave (the first with a host not yet done), from 0.
	Wave   int    `json:"wave"`
	Reason string `json:"reason,omitempty"`
}

// SampleSize is how many hosts a summary names per state, and how many
// offenders it lists: a message names at most this many and counts the
// rest.
const SampleSize = 10

// Summary is one rollout at a glance, at <prefix>/rollouts/summary/<group>/<id>:
// a count per host state that adds up to the host total, the first hosts
// of each state and the first offenders with their reasons. Only the
// coordinator writes it, when something in it moves.
type Summary struct {
	ID     string            `json:"id"`
	Phase  Phase             `json:"phase"`
	Waves  int               `json:"waves"`
	Total  int               `json:"total"`
	Counts map[HostState]int `json:"counts"`
	// Admitted counts the hosts let take the change (all states but
	// pending, and the pending ones admitted whose agent has not started).
	Admitted int `json:"admitted"`
	// Hosts are the first SampleSize hosts in each state, in rollout order.
	Hosts map[HostState][]string `json:"hosts,omitempty"`
	// Offenders are the first SampleSize hosts that failed, or that hold
	// the rollout up past its progress deadline, with why.
	Offenders   []Offender `json:"offenders,omitempty"`
	Coordinator string     `json:"coordinator,omitempty"`
	At          time.Time  `json:"at"`
}

// Offender is one host that failed or holds a rollout up.
type Offender struct {
	Host   string    `json:"host"`
	Wave   int       `json:"wave"` // from 0
	State  HostState `json:"state"`
	Since  time.Time `json:"since,omitzero"`
	Reason string    `json:"reason,omitempty"`
}

// HoldingStates are the states of a host that has the change, is taking
// it, or is going back from it.
var HoldingStates = []HostState{HostApplying, HostSoaking, HostHealthy, HostFailed, HostReverting}

// Holding counts the hosts in HoldingStates.
func (s *Summary) Holding() int {
	n := 0
	for _, st := range HoldingStates {
		n += s.countOf(st)
	}
	return n
}

// HoldingHosts names the first of them.
func (s *Summary) HoldingHosts() []string { return s.sample(HoldingStates...) }

// sample is the first SampleSize hosts in states (rollout order is kept
// within a state only).
func (s *Summary) sample(states ...HostState) []string {
	if s == nil {
		return nil
	}
	var out []string
	for _, st := range states {
		out = append(out, s.Hosts[st]...)
	}
	return out[:min(len(out), SampleSize)]
}

// Named is the first hosts in states, as a message says them: at most
// SampleSize names, then how many more.
func (s *Summary) Named(states ...HostState) string {
	n := 0
	for _, st := range states {
		n += s.countOf(st)
	}
	return NameHosts(s.sample(states...), n)
}

func (s *Summary) countOf(st HostState) int {
	if s == nil {
		return 0
	}
	return s.Counts[st]
}

// NameHosts is "h1, h2, h3" or "h1, …, h10 and 990 more" for total hosts
// of which names are the first.
func NameHosts(names []string, total int) string {
	names = names[:min(len(names), SampleSize)]
	s := strings.Join(names, ", ")
	if more := total - len(names); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

// same says a and b say the same but for when they were written.
func (a *Summary) same(b *Summary) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := *a, *b
	x.At, y.At = time.Time{}, time.Time{}
	return reflect.DeepEqual(x, y)
}

// overwrittenReason is why a rollout whose keys a plain put wrote again
// is superseded (Record.Overwritten), said by the coordinator's end and by
// a reader before it is written.
const overwrittenReason = "its keys were written again since, without a rollout"

// Decision is what a group's coordinator does for one rollout.
type Decision struct {
	// Admit are the hosts let take the change now, in rollout order.
	Admit []string
	// End ends the rollout (written into its record).
	End *End
	// Summary is what its summary should say.
	Summary Summary
	// Due is when to look again for time alone (the progress deadline);
	// zero: not before news.
	Due time.Time
	// Gate is the wave (from 0) whose gate the coordinator runs now
	// (GateURL, GateProm); -1: none.
	Gate int
	// Join are live agents of the group that are not among the rollout's
	// hosts (they joined since it started): they go into its last wave.
	Join []string
}

// GroupView is what a coordinator knows of one rollout: every host's
// progress and which hosts it admitted, and the group's keys now.
type GroupView struct {
	Progress map[string]*Progress
	Admitted map[string]bool
	Entries  []reconcile.Entry
	// Follows is what the coordinator read of the rollout this one
	// follows (--after; nil: not read).
	Follows *Followed
	// Live are the hosts of the group with a live agent, by the group's
	// coordinator election, where each agent stands on its lease (nil:
	// not known; then no host counts as down).
	Live map[string]bool
}

// down says host has no live agent, as far as g knows.
func (g GroupView) down(host string) bool { return g.Live != nil && !g.Live[host] }

// Decide is the coordinator's one decision about r at now. Pure. It ends
// the rollout when a host failed (naming it), when every host is healthy,
// when the progress deadline passed (naming each host that holds it up,
// with the state its agent last reported), or when a later write took its
// keys; otherwise, while it runs (not paused, not waiting for promote or a
// gate), it admits the next hosts of the open waves, as many as
// --max-unavailable leaves room for. A host is admitted once: an
// admission is a key that stays.
func Decide(r *Record, g GroupView, coordinator string, now time.Time) Decision {
	d := Decision{Gate: -1}
	end := r.End
	if end == nil && r.Overwritten(g.Entries) {
		end = &End{State: Superseded, Reason: overwrittenReason, At: now}
		d.End = end
	}
	w := r.openWave(g)
	var ph Phase
	var offenders []Offender
	switch {
	case end != nil:
		ph = Phase{State: end.State, Wave: min(w, len(r.WaveEnds)-1), Reason: end.Reason}
		if end.Wave > 0 {
			ph.Wave = end.Wave - 1 // the hosts going back since do not move it
		}
		// The same offenders as the pass that ended it, for as long as
		// they are: the hosts that failed it, or, for a failure, the
		// admitted hosts that never became healthy (what the progress
		// deadline named), and the hosts that could not go back.
		offenders, _ = r.failed(g.Progress)
		if end.State == Failed {
			stuck, _ := r.stuck(g, now)
			offenders = append(offenders, stuck...)
		}
		offenders = append(offenders, r.revertFailed(g.Progress)...)
		offenders = offenders[:min(len(offenders), SampleSize)]
	default:
		ph, offenders, d.Due = r.phase(g, w, now)
		if ph.State.Ended() {
			d.End = &End{State: ph.State, Reason: ph.Reason, At: now, Wave: ph.Wave + 1}
		}
	}
	if ph.State == Running {
		d.Admit = r.admit(g, w)
	}
	if ph.State == WaitingGate && r.Strategy.CoordinatorGate() {
		d.Gate = ph.Wave
	}
	if end == nil && d.End == nil {
		d.Join = r.joiners(g.Progress)
	}
	d.Summary = r.summarize(g, ph, offenders, d.Admit, coordinator, now)
	return d
}

// phase is where a rollout with no end written stands, the hosts that
// hold it up, and when its progress deadline falls.
//
// With a success threshold, a failed host fails the rollout only when its
// wave can no longer count as done (more of its hosts failed than the
// threshold leaves room for); until then the failed hosts are the
// offenders of whatever phase it is in, and a rollout that ends done with
// some names them in its reason.
func (r *Record) phase(g GroupView, w int, now time.Time) (Phase, []Offender, time.Time) {
	failed, n := r.failed(g.Progress)
	if n > 0 {
		lost := -1
		if r.Strategy.SuccessThreshold > 0 {
			lost = r.lostWave(g)
		}
		if r.Strategy.SuccessThreshold == 0 || lost >= 0 {
			f := failed[0]
			if lost >= 0 {
				f = failed[slices.IndexFunc(failed, func(o Offender) bool { return o.Wave == lost })]
			}
			reason := fmt.Sprintf("%s failed the change: %s", f.Host, f.Reason)
			if n > 1 {
				reason += fmt.Sprintf(" (and %d more %s)", n-1, plural(n-1, "host", "hosts"))
			}
			if lost >= 0 {
				reason += fmt.Sprintf("; wave %d%s needs %d of its %d hosts healthy (--success-threshold %d%%)",
					lost+1, parenthesized(r.WaveName(lost)), r.need(lost), len(r.WaveHosts(lost)), r.Strategy.SuccessThreshold)
			}
			return Phase{State: Failed, Wave: f.Wave, Reason: reason}, failed, time.Time{}
		}
	}
	down, nd := r.downHosts(g, w)
	if w == len(r.WaveEnds) {
		ph := Phase{State: Done, Wave: w - 1}
		var parts []string
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s failed: %s", plural(n, "1 host", fmt.Sprintf("%d hosts", n)), NameHosts(hostsOf(failed), n)))
		}
		if nd > 0 {
			parts = append(parts, fmt.Sprintf("%s no live agent and did not take it: %s", plural(nd, "1 host had", fmt.Sprintf("%d hosts had", nd)), NameHosts(hostsOf(down), nd)))
		}
		if len(parts) > 0 {
			ph.Reason = strings.Join(parts, "; ") + fmt.Sprintf(" (within --success-threshold %d%%)", r.Strategy.SuccessThreshold)
		}
		return ph, append(failed, down...)[:min(len(failed)+len(down), SampleSize)], time.Time{}
	}
	ph, offenders, due := r.holding(g, w, now)
	if n+nd > 0 {
		offenders = addOffenders(addOffenders(offenders, failed), down)
	}
	return ph, offenders, due
}

func parenthesized(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

// need is how many hosts of wave w must be healthy for it to count as
// done: all of them, or the success threshold's share (rounded up).
func (r *Record) need(w int) int {
	n := len(r.WaveHosts(w))
	if t := r.Strategy.SuccessThreshold; t > 0 && t < 100 {
		return (n*t + 99) / 100
	}
	return n
}

// waveCounts is how many hosts of wave w are healthy, failed, and
// neither with no live agent (down).
func (r *Record) waveCounts(w int, g GroupView) (healthy, failed, down int) {
	for _, h := range r.WaveHosts(w) {
		switch g.Progress[h].StateOf() {
		case HostHealthy:
			healthy++
		case HostFailed:
			failed++
		default:
			if g.down(h) {
				down++
			}
		}
	}
	return healthy, failed, down
}

// waveDone says wave w counts as done, with a success threshold: enough
// of its hosts healthy and every other one failed or down (a down host
// counts against the threshold, and is not waited for).
func (r *Record) waveDone(w int, g GroupView) bool {
	healthy, failed, down := r.waveCounts(w, g)
	return healthy >= r.need(w) && healthy+failed+down == len(r.WaveHosts(w))
}

// lostWave is the first wave that can no longer count as done (more of
// its hosts failed than the success threshold leaves room for); -1: none.
func (r *Record) lostWave(g GroupView) int {
	for w := range r.WaveEnds {
		if _, failed, _ := r.waveCounts(w, g); failed > len(r.WaveHosts(w))-r.need(w) {
			return w
		}
	}
	return -1
}

// holding is the phase of a rollout that has not failed and is not done.
func (r *Record) holding(g GroupView, w int, now time.Time) (Phase, []Offender, time.Time) {
	// Held on purpose (a pause, another rollout to end first, the
	// canary's promote, a gate): the progress deadline does not run, as
	// the time nobody may move does not count against it.
	if r.Paused {
		return Phase{State: Paused, Wave: w, Reason: r.PauseReason}, nil, time.Time{}
	}
	if ph, wait := r.waitAfter(g, w); wait {
		return ph, nil, now.Add(FollowEvery)
	}
	var opened, closes time.Time // of the window's opening now
	if win := r.window(); win != nil {
		open, opens, ends := win.Open(now)
		if !open {
			if !opens.IsZero() {
				opens = opens.Add(time.Millisecond) // inside, to the clock's grain
			}
			return Phase{State: WaitingWindow, Wave: w, Reason: WindowReason(*win, now)}, nil, opens // zero: it never opens
		}
		opened, closes = opens, ends
	}
	switch {
	case w > 0 && r.Strategy.PauseAfterCanary && !r.Promoted:
		return Phase{State: WaitingPromote, Wave: w, Reason: "the canary is healthy: `agentd rollout promote " + r.ID + "` sends the change on"}, nil, time.Time{}
	case w > 0 && r.Strategy.Gated() && r.Gated < w:
		what := "the gate command"
		if r.Strategy.CoordinatorGate() {
			what = "the coordinator's gate (" + r.Strategy.gateName() + ")"
		}
		return Phase{State: WaitingGate, Wave: w, Reason: "waiting for " + what + " before wave " + fmt.Sprint(w+1)}, nil, time.Time{}
	}
	var due time.Time
	if d := r.Strategy.ProgressDeadline; d > 0 {
		last := r.lastMoved(latestHealthy(g.Progress))
		if h := g.heldUntil(opened); h.After(last) {
			last = h
		}
		due = last.Add(d + time.Millisecond)
		if now.Sub(last) > d {
			stuck, n := r.stuck(g, now)
			reason := fmt.Sprintf("no host became healthy for %s (--progress-deadline), since %s", d, last.UTC().Format(time.DateTime))
			if len(stuck) > 0 {
				parts := make([]string, len(stuck))
				for i, o := range stuck {
					parts[i] = o.Host + ": " + o.Reason
				}
				reason += "; holding it up: " + strings.Join(parts, "; ")
				if n > len(stuck) {
					reason += fmt.Sprintf("; and %d more", n-len(stuck))
				}
			}
			return Phase{State: Failed, Wave: w, Reason: reason}, stuck, time.Time{}
		}
	}
	if !closes.IsZero() && (due.IsZero() || closes.Before(due)) {
		due = closes // to say it waits for the next opening
	}
	return Phase{State: Running, Wave: w}, nil, due
}

// joiners are the hosts with progress in r that are not among its
// hosts, sorted: an agent that joined the group after the start says so
// with its own progress key (Step), the one key it may write, so the
// coordinator needs no read of the group's membership (which a host's
// least-privilege role does not grant).
func (r *Record) joiners(progress map[string]*Progress) []string {
	if len(progress) == 0 {
		return nil
	}
	in := make(map[string]bool, len(r.Hosts))
	for _, h := range r.Hosts {
		in[h] = true
	}
	var out []string
	for h := range progress {
		if !in[h] {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out
}

// openWave is the first wave with a host not done (len(WaveEnds) when
// every host is).
func (r *Record) openWave(g GroupView) int {
	progress := g.Progress
	if r.Strategy.SuccessThreshold > 0 {
		for w := range r.WaveEnds {
			if !r.waveDone(w, g) {
				return w
			}
		}
		return len(r.WaveEnds)
	}
	for i, h := range r.Hosts {
		if p := progress[h]; p == nil || p.State != HostHealthy {
			return r.waveOf(i)
		}
	}
	return len(r.WaveEnds)
}

// failed are the first SampleSize hosts that failed the change, in
// rollout order, and how many failed.
func (r *Record) failed(progress map[string]*Progress) ([]Offender, int) {
	var out []Offender
	n := 0
	for i, h := range r.Hosts {
		if p := progress[h]; p != nil && p.State == HostFailed {
			if n++; len(out) < SampleSize {
				out = append(out, Offender{Host: h, Wave: r.waveOf(i), State: p.State, Since: p.Since, Reason: p.Reason})
			}
		}
	}
	return out, n
}

// downHosts are the first SampleSize hosts of the waves up to w (all of
// them when w is past the last) that have no live agent and neither took
// the change healthy nor failed it, and how many there are: named in the
// summary, and with a success threshold counted as not healthy.
func (r *Record) downHosts(g GroupView, w int) ([]Offender, int) {
	if g.Live == nil {
		return nil, 0
	}
	var out []Offender
	n := 0
	for i, h := range r.Hosts[:r.WaveEnds[min(w, len(r.WaveEnds)-1)]] {
		if st := g.Progress[h].StateOf(); st != HostHealthy && st != HostFailed && g.down(h) {
			if n++; len(out) < SampleSize {
				out = append(out, Offender{Host: h, Wave: r.waveOf(i), State: st, Reason: "no live agent"})
			}
		}
	}
	return out, n
}

// addOffenders appends to list the offenders of more it does not name
// yet, up to SampleSize.
func addOffenders(list, more []Offender) []Offender {
	for _, o := range more {
		if len(list) < SampleSize && !slices.ContainsFunc(list, func(x Offender) bool { return x.Host == o.Host }) {
			list = append(list, o)
		}
	}
	return list
}

func hostsOf(os []Offender) []string {
	names := make([]string, len(os))
	for i, o := range os {
		names[i] = o.Host
	}
	return names
}

// revertFailed are the first SampleSize hosts that could not go back.
func (r *Record) revertFailed(progress map[string]*Progress) []Offender {
	var out []Offender
	for i, h := range r.Hosts {
		if p := progress[h]; p != nil && p.State == HostRevertFailed && len(out) < SampleSize {
			out = append(out, Offender{Host: h, Wave: r.waveOf(i), State: p.State, Since: p.Since, Reason: p.Reason})
		}
	}
	return out
}

// stuck are the first SampleSize admitted hosts still taking the change
// (pending, applying, soaking: never healthy on it), each with
// the state its agent last reported and for how long, and how many there
// are.
func (r *Record) stuck(g GroupView, now time.Time) ([]Offender, int) {
	var out []Offender
	n := 0
	for i, h := range r.Hosts {
		p := g.Progress[h]
		if st := p.StateOf(); !g.Admitted[h] || (st != HostPending && st != HostApplying && st != HostSoaking) {
			continue
		}
		if n++; len(out) == SampleSize {
			continue
		}
		o := Offender{Host: h, Wave: r.waveOf(i), State: p.StateOf()}
		switch {
		case p == nil && g.down(h):
			o.Reason = "admitted, but it has no live agent"
		case p == nil:
			o.Reason = "admitted, but its agent has not started taking the change (is it running?)"
		default:
			o.Since = p.Since
			o.Reason = fmt.Sprintf("%s for %s", p.State, now.Sub(p.Since).Round(time.Second))
			if p.Reason != "" {
				o.Reason += " (" + p.Reason + ")"
			}
		}
		out = append(out, o)
	}
	return out, n
}

func latestHealthy(progress map[string]*Progress) time.Time {
	var last time.Time
	for _, p := range progress {
		if p.HealthyAt.After(last) {
			last = p.HealthyAt
		}
	}
	return last
}

// summarize counts r's hosts by state (admit: the hosts being admitted
// now count as admitted).
func (r *Record) summarize(g GroupView, ph Phase, offenders []Offender, admit []string, coordinator string, now time.Time) Summary {
	s := Summary{ID: r.ID, Phase: ph, Waves: len(r.WaveEnds), Total: len(r.Hosts), Counts: map[HostState]int{},
		Hosts: map[HostState][]string{}, Offenders: offenders, Coordinator: coordinator, At: now}
	for _, h := range r.Hosts {
		st := g.Progress[h].StateOf()
		s.Counts[st]++
		if len(s.Hosts[st]) < SampleSize {
			s.Hosts[st] = append(s.Hosts[st], h)
		}
		if st != HostPending || g.Admitted[h] {
			s.Admitted++
		}
	}
	s.Admitted += len(admit)
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// GroupState is what a group's coordinator follows: the group's records,
// every host's progress and the admissions, by rollout ID then host, the
// summaries by ID, and the group's keys now.
type GroupState struct {
	Records   []*Record
	Progress  map[string]map[string]*Progress
	Admitted  map[string]map[string]bool
	Summaries map[string]*Summary
	Entries   []reconcile.Entry
	// Live are the hosts with a live agent in the group (GroupView.Live).
	Live     map[string]bool
	Revision int64
}
