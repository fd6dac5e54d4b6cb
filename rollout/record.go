// Package rollout stages one write to a group's unit keys across the
// group's hosts: a canary, then waves, each host healthy for a soak before
// the next wave opens, with pause, promote, gates, abort and auto-revert.
//
// The put writes the keys as it always did (history, revert and --dry-run
// see one write) and, in the same transaction, a Record that holds the
// content the keys had before. A host that has not taken the change keeps
// that content (Overlay). One coordinator per group, elected in etcd among
// the group's agents, reads every host's progress, admits hosts wave by
// wave (a key per host), ends the rollout and keeps one Summary of it
// (Decide). Each host's participant watches only the records, its own
// admissions and its own progress, takes the change when admitted, and
// records how it went (Step). So the work of a host per wave is O(1)
// whatever the group's size, and a rollout goes on while any agent of the
// group runs, with or without the CLI that started it.
//
// Decide, Step and Overlay are pure; Coordinator and Participant are the
// loops that feed them and write what they decide through small ports the
// registry implements.
package rollout

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentd/agentd/calendar"
	"github.com/agentd/agentd/reconcile"
)

// Count is a number of hosts: N, or N% of the rollout's hosts.
type Count struct {
	N       int  `json:"n"`
	Percent bool `json:"percent,omitempty"`
}

func (c Count) String() string {
	if c.Percent {
		return strconv.Itoa(c.N) + "%"
	}
	return strconv.Itoa(c.N)
}

// IsZero says c was not given.
func (c Count) IsZero() bool { return c.N == 0 }

// ParseCount reads "N" or "N%": a whole number of hosts (at least 1) or a
// percentage of them (1 to 100).
func ParseCount(what, s string) (Count, error) {
	t := strings.TrimSpace(s)
	pct := strings.HasSuffix(t, "%")
	n, err := strconv.Atoi(strings.TrimSuffix(t, "%"))
	switch {
	case err != nil:
		return Count{}, fmt.Errorf("%s %q: want a number of hosts (3) or a percentage of them (10%%)", what, s)
	case n < 1:
		return Count{}, fmt.Errorf("%s %q: want at least 1 host (a stage of no host would never end)", what, s)
	case pct && n > 100:
		return Count{}, fmt.Errorf("%s %q: a percentage is at most 100%%", what, s)
	}
	return Count{N: n, Percent: pct}, nil
}

// Of is how many of total hosts c is: a percentage rounds up (10% of 5 is
// 1, never 0), and never more than total.
func (c Count) Of(total int) int {
	n := c.N
	if c.Percent {
		n = (c.N*total + 99) / 100
	}
	return min(n, total)
}

// Strategy is how a rollout stages a change: a canary first, then waves
// (cumulative, as Ansible's serial), each host healthy for Soak before it
// counts. The zero Strategy is not a rollout (the change goes to every
// host at once, bounded only by MaxUnavailable= in the unit).
type Strategy struct {
	Canary Count   `json:"canary,omitzero"`
	Waves  []Count `json:"waves,omitempty"`
	// MaxUnavailable bounds how many hosts take the change at once.
	MaxUnavailable Count `json:"maxUnavailable,omitzero"`
	// Soak is how long a host stays healthy before it counts as done
	// (Nomad's min_healthy_time), beyond the unit's HealthySec=.
	Soak time.Duration `json:"soak,omitempty"`
	// ProgressDeadline fails the rollout when no host became healthy for
	// this long (paused time does not count).
	ProgressDeadline time.Duration `json:"progressDeadline,omitempty"`
	PauseAfterCanary bool          `json:"pauseAfterCanary,omitempty"`
	// AutoRevert puts the hosts that took the change back on the previous
	// content when the rollout fails.
	AutoRevert bool `json:"autoRevert,omitempty"`
	// MaxRestarts pauses the rollout when a host's unit restarted more
	// than this many times (Restart=) since it took the change; -1: off.
	MaxRestarts int `json:"maxRestarts"`
	// GateCmd is run by the CLI before each wave after the first; the
	// wave opens when it exits 0 (Record.Gated).
	GateCmd string `json:"gateCmd,omitempty"`
	// GateTimeout bounds one run of a gate (0: DefaultGateTimeout); a
	// gate that runs longer fails, its processes killed.
	GateTimeout time.Duration `json:"gateTimeout,omitempty"`
	// GateURL and GateProm (a PromQL expression that must hold, asked of
	// PromURL) are gates the coordinator itself evaluates before each
	// wave after the first: no command has to follow the rollout.
	GateURL  string `json:"gateURL,omitempty"`
	GateProm string `json:"gateProm,omitempty"`
	PromURL  string `json:"promURL,omitempty"`
	// WavesBy cuts the hosts into waves by the value of this label
	// instead of by count (Canary and Waves unset): one value per wave,
	// in WavesByOrder when given, else sorted; the hosts without the
	// label, or with a value not listed, go in a last wave of their own.
	WavesBy      string   `json:"wavesBy,omitempty"`
	WavesByOrder []string `json:"wavesByOrder,omitempty"`
	// SuccessThreshold, a percentage (1 to 100; 0: unset, all), lets a
	// wave count as done when that share of its hosts is healthy and
	// every other host of the wave failed: the rollout goes on, naming
	// them, instead of failing on the first failure.
	SuccessThreshold int `json:"successThreshold,omitempty"`
	// BudgetBy makes MaxUnavailable a budget per value of this label
	// (budget.go): at most that many hosts of each value take the
	// change at once.
	BudgetBy string `json:"budgetBy,omitempty"`
	// Follows is the rollout this one waits for: it admits no host until
	// that one has ended done (--after).
	Follows *Ref `json:"follows,omitempty"`
	// Window is when the rollout admits hosts (--window, or its group's
	// window): outside it none is admitted, the ones admitted go on.
	Window *calendar.Window `json:"window,omitempty"`
}

// Ref names a rollout of another group (or the same one), as --after
// resolved it; Said is what the operator wrote (a group, a selector or a
// rollout ID).
type Ref struct {
	Group string `json:"group"`
	ID    string `json:"id"`
	Said  string `json:"said,omitempty"`
}

func (f Ref) String() string {
	s := f.Group + "/" + f.ID
	if f.Said != "" && f.Said != f.Group && f.Said != f.ID {
		s += " (" + f.Said + ")"
	}
	return s
}

// ParseThreshold reads --success-threshold: "N%" (or "N"), 1 to 100.
func ParseThreshold(what, s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(s), "%"))
	if err != nil || n < 1 || n > 100 {
		return 0, fmt.Errorf("%s %q: want a percentage of a wave's hosts above 0 and at most 100 (90%%)", what, s)
	}
	return n, nil
}

// ParseWavesBy reads --waves-by: KEY, or KEY=v1,v2,… for the waves'
// order.
func ParseWavesBy(what, s string) (key string, order []string, err error) {
	k, vs, listed := strings.Cut(strings.TrimSpace(s), "=")
	key = strings.TrimSpace(k)
	if listed {
		for v := range strings.SplitSeq(vs, ",") {
			order = append(order, strings.TrimSpace(v))
		}
	}
	what += " " + strconv.Quote(s)
	if key == "" {
		return "", nil, fmt.Errorf("%s: want a label key (KEY or KEY=v1,v2,…)", what)
	}
	if err := (Strategy{WavesBy: key, WavesByOrder: order}).validateWavesBy(what); err != nil {
		return "", nil, err
	}
	return key, order, nil
}

// validateWavesBy checks the label key and the listed values.
func (s Strategy) validateWavesBy(what string) error {
	if s.WavesBy == "" {
		if len(s.WavesByOrder) > 0 {
			return fmt.Errorf("%s: values without a label key", what)
		}
		return nil
	}
	if !validLabelPart(s.WavesBy) {
		return fmt.Errorf("%s: label key %q: want letters, digits, '.', '_', '-' or '/'", what, s.WavesBy)
	}
	seen := map[string]bool{}
	for _, v := range s.WavesByOrder {
		switch {
		case v == "":
			return fmt.Errorf("%s: an empty value (want KEY or KEY=v1,v2,…)", what)
		case !validLabelPart(v):
			return fmt.Errorf("%s: value %q: want letters, digits, '.', '_', '-' or '/'", what, v)
		case seen[v]:
			return fmt.Errorf("%s: value %q listed twice", what, v)
		}
		seen[v] = true
	}
	return nil
}

func validLabelPart(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-/", c)) {
			return false
		}
	}
	return true
}

// DefaultGateTimeout is --gate-timeout's default.
const DefaultGateTimeout = 5 * time.Minute

// Gated says a gate stands before each wave after the first.
func (s Strategy) Gated() bool { return s.GateCmd != "" || s.GateURL != "" || s.GateProm != "" }

// CoordinatorGate says the coordinator runs the gate (a URL or a PromQL
// expression); else a command following the rollout runs GateCmd.
func (s Strategy) CoordinatorGate() bool {
	return s.GateCmd == "" && (s.GateURL != "" || s.GateProm != "")
}

// GateTimeoutOr is GateTimeout, or the default.
func (s Strategy) GateTimeoutOr() time.Duration {
	if s.GateTimeout > 0 {
		return s.GateTimeout
	}
	return DefaultGateTimeout
}

// IsRollout says the strategy stages the change (any option given).
func (s Strategy) IsRollout() bool {
	return !s.Canary.IsZero() || len(s.Waves) > 0 || !s.MaxUnavailable.IsZero() || s.Soak > 0 ||
		s.ProgressDeadline > 0 || s.PauseAfterCanary || s.AutoRevert || s.MaxRestarts >= 0 || s.Gated() ||
		s.WavesBy != "" || s.SuccessThreshold > 0 || s.BudgetBy != "" || s.Follows != nil || s.Window != nil
}

// Validate refuses a strategy that could not be run as written.
func (s Strategy) Validate() error {
	var errs []error
	for i := 1; i < len(s.Waves); i++ {
		prev, w := s.Waves[i-1], s.Waves[i]
		if prev.Percent == w.Percent && w.N <= prev.N {
			errs = append(errs, fmt.Errorf("--waves %s: the waves are cumulative (how many hosts have the change after each), so each must be larger than the one before (%s after %s)", joinCounts(s.Waves), w, prev))
			break
		}
	}
	if s.Soak < 0 {
		errs = append(errs, fmt.Errorf("--soak %s: want a duration of 0 or more", s.Soak))
	}
	if s.ProgressDeadline < 0 {
		errs = append(errs, fmt.Errorf("--progress-deadline %s: want a duration of 0 (none) or more", s.ProgressDeadline))
	}
	if s.ProgressDeadline > 0 && s.ProgressDeadline <= s.Soak {
		errs = append(errs, fmt.Errorf("--progress-deadline %s is not longer than --soak %s: no host could become healthy in time", s.ProgressDeadline, s.Soak))
	}
	if s.PauseAfterCanary && s.Canary.IsZero() {
		errs = append(errs, errors.New("--pause-after-canary needs --canary"))
	}
	if s.MaxRestarts < -1 {
		errs = append(errs, fmt.Errorf("--max-restarts %d: want 0 or more", s.MaxRestarts))
	}
	if n := btoi(s.GateCmd != "") + btoi(s.GateURL != "") + btoi(s.GateProm != ""); n > 1 {
		errs = append(errs, errors.New("--gate-cmd, --gate-url and --gate-prom: one gate per rollout"))
	}
	if (s.GateProm != "") != (s.PromURL != "") {
		errs = append(errs, errors.New("--gate-prom needs --prom-url (and --prom-url goes with --gate-prom)"))
	}
	for flag, u := range map[string]string{"--gate-url": s.GateURL, "--prom-url": s.PromURL} {
		if u != "" && !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			errs = append(errs, fmt.Errorf("%s %q: want an http:// or https:// URL", flag, u))
		}
	}
	if s.WavesBy != "" || len(s.WavesByOrder) > 0 {
		what := "--waves-by " + s.WavesBy
		if len(s.WavesByOrder) > 0 {
			what += "=" + strings.Join(s.WavesByOrder, ",")
		}
		if err := s.validateWavesBy(what); err != nil {
			errs = append(errs, err)
		}
		if len(s.Waves) > 0 || !s.Canary.IsZero() {
			errs = append(errs, fmt.Errorf("%s: waves by label go without --waves and --canary (one wave per value: list the canary's value first)", what))
		}
		if s.PauseAfterCanary {
			errs = append(errs, fmt.Errorf("%s: --pause-after-canary needs --canary, which waves by label go without", what))
		}
	}
	if s.BudgetBy != "" {
		if !validLabelPart(s.BudgetBy) {
			errs = append(errs, fmt.Errorf("--budget-by %q: want a label key (letters, digits, '.', '_', '-' or '/')", s.BudgetBy))
		}
		if s.MaxUnavailable.IsZero() {
			errs = append(errs, fmt.Errorf("--budget-by %s needs --max-unavailable N (how many hosts of each %s may take the change at once)", s.BudgetBy, s.BudgetBy))
		}
	}
	if s.SuccessThreshold < 0 || s.SuccessThreshold > 100 {
		errs = append(errs, fmt.Errorf("--success-threshold %d%%: want a percentage above 0 and at most 100", s.SuccessThreshold))
	}
	if s.GateTimeout < 0 {
		errs = append(errs, fmt.Errorf("--gate-timeout %s: want a duration of 0 (the default, %s) or more", s.GateTimeout, DefaultGateTimeout))
	}
	return errors.Join(errs...)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func joinCounts(cs []Count) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = c.String()
	}
	return strings.Join(s, ",")
}

// WaveEnds turns the strategy into the cumulative number of hosts that
// have the change after each wave, for total hosts: the canary alone
// first, then each wave, the last always every host. Waves that would add
// no host (10% of 5 after a canary of 1) are dropped.
func (s Strategy) WaveEnds(total int) []int {
	var ends []int
	add := func(n int) {
		if n > 0 && (len(ends) == 0 || n > ends[len(ends)-1]) {
			ends = append(ends, n)
		}
	}
	if !s.Canary.IsZero() {
		add(s.Canary.Of(total))
	}
	for _, w := range s.Waves {
		add(w.Of(total))
	}
	add(total)
	return ends
}

// ByLabel orders hosts for a rollout by label (s.WavesBy), labels
// giving each host's labels: the hosts of each value together, the values
// in s.WavesByOrder or else sorted, the hosts without the label or with a
// value not listed last; names in each wave sorted. It returns the hosts
// in order, the cumulative wave ends and a label per wave ("rack=r1", or
// "(no rack)" for the last); unlabeled are the hosts of that last wave.
func (s Strategy) ByLabel(hosts []string, labels map[string]map[string]string) (order []string, ends []int, names []string, unlabeled []string) {
	byValue := map[string][]string{}
	for _, h := range hosts {
		v, ok := labels[h][s.WavesBy]
		if ok && (len(s.WavesByOrder) == 0 || slices.Contains(s.WavesByOrder, v)) {
			byValue[v] = append(byValue[v], h)
		} else {
			unlabeled = append(unlabeled, h)
		}
	}
	values := s.WavesByOrder
	if len(values) == 0 {
		for v := range byValue {
			values = append(values, v)
		}
		slices.Sort(values)
	}
	add := func(name string, hs []string) {
		if len(hs) == 0 {
			return
		}
		slices.Sort(hs)
		order = append(order, hs...)
		ends = append(ends, len(order))
		names = append(names, name)
	}
	for _, v := range values {
		add(s.WavesBy+"="+v, byValue[v])
	}
	add("(no "+s.WavesBy+")", unlabeled)
	return order, ends, names, unlabeled
}

// WaveName is wave w's label ("rack=r1"), "" for a rollout by count.
func (r *Record) WaveName(w int) string {
	if w < 0 || w >= len(r.WaveLabels) {
		return ""
	}
	return r.WaveLabels[w]
}

// Record is one staged change, at <prefix>/rollouts/groups/<group>/<id>.
// The CLI writes it with the change; pause, resume, promote, abort and the
// gate write its control fields; the coordinator writes End (and a host
// Paused, when its unit restarts too often). Nothing in it moves as hosts
// progress: every agent of the group watches it, so it changes a few times
// per rollout, never per host.
type Record struct {
	ID    string `json:"id"`
	Group string `json:"group"`
	// Units are the keys the change wrote (a unit or a drop-in, as
	// Entry.Unit), with what they held before.
	Units    map[string]Unit `json:"units"`
	Revision int64           `json:"revision"` // of the put that wrote them
	Strategy Strategy        `json:"strategy"`
	// Hosts are the group's members when the rollout started, in the order
	// they take it; WaveEnds cuts them into waves.
	Hosts    []string `json:"hosts"`
	WaveEnds []int    `json:"waveEnds"`
	// WaveLabels name the waves of a rollout by label (Strategy.WavesBy),
	// one per wave: "rack=r1", or "(no rack)" for the hosts without one
	// of the values.
	WaveLabels []string `json:"waveLabels,omitempty"`
	// Buckets are, with Strategy.BudgetBy, the budget of each host of
	// Hosts (an index into BucketNames, "rack=r1"): a number per host,
	// as every agent of the group reads the record.
	Buckets     []int    `json:"buckets,omitempty"`
	BucketNames []string `json:"bucketNames,omitempty"`
	// Joined are the hosts the coordinator added to the last wave because
	// their agents joined the group after the start (also in Hosts).
	Joined    []string  `json:"joined,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	By        string    `json:"by,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	// After is the rollout of the same keys this one followed, which had
	// not finished (it ran, or ended failed or aborted): a host that has
	// not taken this change keeps what that one gives it (Overlay).
	After string `json:"after,omitempty"`

	Paused      bool      `json:"paused,omitempty"`
	PauseReason string    `json:"pauseReason,omitempty"`
	PausedAt    time.Time `json:"pausedAt,omitzero"`
	ResumedAt   time.Time `json:"resumedAt,omitzero"` // also set by promote
	Promoted    bool      `json:"promoted,omitempty"`
	// OutsideWindow: `agentd rollout promote` let it admit hosts outside
	// its window, for an emergency (by and when: PromotedBy, ResumedAt).
	OutsideWindow bool   `json:"outsideWindow,omitempty"`
	PromotedBy    string `json:"promotedBy,omitempty"`
	// Gated is the last wave (index) the gate command let open.
	Gated int    `json:"gated,omitempty"`
	Abort *Abort `json:"abort,omitempty"`
	End   *End   `json:"end,omitempty"`

	// ModRevision is the revision that last wrote the record (not
	// stored): writes to it compare it.
	ModRevision int64 `json:"-"`
}

// Unit is one key of a rollout: what it held before (From nil: it did not
// exist) and the hash it holds now ("": the change removes it).
type Unit struct {
	From         *string `json:"from"`
	FromRevision int64   `json:"fromRevision,omitempty"`
	ToHash       string  `json:"toHash"`
	// BackSig is, for a signed rollout, the signature record of the way
	// back (From, marked a revert, at a sequence above the change's),
	// signed by the put: a host that goes back runs From with it.
	BackSig string `json:"backSig,omitempty"`
	// BackSigs are, for a signed rollout that followed others (After),
	// the signed ways back to what those give a host that did not take
	// them (the From of each along the chain, where it differs from
	// this one's), at BackSig's sequence: a host goes back to what it
	// ran before, which may be older than From (Overlay).
	BackSigs []string `json:"backSigs,omitempty"`
	// FromSig is, for a signed rollout, the signature record the key had
	// before the change (signing From, at its own lower sequence): a host
	// that never ran the key and joins the group before it takes the
	// change runs From with it (OverlaySignatures), and takes the change
	// later, as its sequence is higher.
	FromSig string `json:"fromSig,omitempty"`
}

// Abort stops a rollout: no host takes it any more; with Revert the hosts
// that took it go back to the previous content.
type Abort struct {
	Revert bool      `json:"revert,omitempty"`
	At     time.Time `json:"at"`
	By     string    `json:"by,omitempty"`
}

// End is how a rollout ended. Written once.
type End struct {
	State  State     `json:"state"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
	// SupersededBy is the rollout whose put ended this one.
	SupersededBy string `json:"supersededBy,omitempty"`
	// Wave is the wave it ended in, counted from 1 (0: not said).
	Wave int `json:"wave,omitempty"`
}

// State is a rollout's phase as a word.
type State string

const (
	Running        State = "running"
	Paused         State = "paused"
	WaitingGate    State = "waiting-gate"
	WaitingPromote State = "waiting-promote"
	// Starting: no coordinator has looked at the rollout yet.
	Starting   State = "starting"
	Done       State = "done"
	Failed     State = "failed"
	Aborted    State = "aborted"
	Superseded State = "superseded"
)

// Ended says a phase is final: no host takes the rollout any more.
func (s State) Ended() bool {
	switch s {
	case Done, Failed, Aborted, Superseded:
		return true
	}
	return false
}

// HostState is where one host is in a rollout.
type HostState string

const (
	HostPending   HostState = "pending" // not taken (no progress key)
	HostApplying  HostState = "applying"
	HostSoaking   HostState = "soaking"
	HostHealthy   HostState = "healthy"
	HostFailed    HostState = "failed"
	HostReverting HostState = "reverting"
	HostReverted  HostState = "reverted"
	// HostRevertFailed: the host could not go back (it refused the
	// previous content: an unsigned or replayed version under
	// --allowed-signers, or the previous version fails). It is named;
	// nothing waits for it.
	HostRevertFailed HostState = "revert-failed"
)

// HostStates are the host states in the order a summary counts them.
var HostStates = []HostState{HostHealthy, HostApplying, HostSoaking, HostFailed, HostReverting, HostReverted, HostRevertFailed, HostPending}

// Progress is one host's progress in one rollout, at
// <prefix>/rollouts/hosts/<host>/<id>, written by that host's agent only
// (no lease: it outlives the agent, so a restarted agent resumes its soak,
// and a host that went away never counts as done).
type Progress struct {
	State  HostState `json:"state"`
	Since  time.Time `json:"since"`
	Reason string    `json:"reason,omitempty"`
	// HealthyAt is when the host counted as done (for the progress
	// deadline, which also outlives a revert).
	HealthyAt time.Time `json:"healthyAt,omitzero"`
	// Restarts is the unit's NRestarts when the host took the change.
	Restarts map[string]uint32 `json:"restarts,omitempty"`
}

// Took says the host has the change (or is taking it): it keeps the new
// content. A host that reverts, or never took it, has the previous one.
func (p *Progress) Took() bool {
	if p == nil {
		return false
	}
	switch p.State {
	case HostApplying, HostSoaking, HostHealthy, HostFailed:
		return true
	}
	return false
}

// StateOf is p's state (pending when nil).
func (p *Progress) StateOf() HostState {
	if p == nil {
		return HostPending
	}
	return p.State
}

// Admission lets one host take a rollout's change, at
// <prefix>/rollouts/admit/<group>/<host>/<id>: written once by the
// group's coordinator, read by that host only.
type Admission struct {
	Wave int       `json:"wave"` // counted from 0
	At   time.Time `json:"at"`
	By   string    `json:"by"` // the coordinating host
}

// Wave is the index of the wave host belongs to; -1 when it is not one
// of the rollout's hosts.
func (r *Record) Wave(host string) int {
	i := slices.Index(r.Hosts, host)
	if i < 0 {
		return -1
	}
	return r.waveOf(i)
}

// waveOf is the wave of the host at index i of Hosts.
func (r *Record) waveOf(i int) int {
	for w, end := range r.WaveEnds {
		if i < end {
			return w
		}
	}
	return len(r.WaveEnds) - 1
}

// WaveHosts returns the hosts of wave w.
func (r *Record) WaveHosts(w int) []string {
	start := 0
	if w > 0 {
		start = r.WaveEnds[w-1]
	}
	return r.Hosts[start:r.WaveEnds[w]]
}

// Governs says the rollout still decides what its hosts run: the keys
// hold what it wrote (a later write supersedes it), and it did not end
// done (then every host has the change, as the keys say). entries are the
// group's current entries.
func (r *Record) Governs(entries []reconcile.Entry) bool {
	if r.End != nil && r.End.State == Done {
		return false
	}
	return !r.Overwritten(entries)
}

// Overwritten says one of the rollout's keys holds something else than
// what the rollout wrote: a later write superseded it, whether or not
// anyone has recorded that in its End yet.
func (r *Record) Overwritten(entries []reconcile.Entry) bool {
	now := map[string]string{}
	for _, e := range entries {
		if e.Scope == reconcile.ScopeGroup && e.Group == r.Group {
			if _, ok := r.Units[e.Unit]; ok {
				now[e.Unit] = reconcile.Hash(e.Value)
			}
		}
	}
	for u, ru := range r.Units {
		if now[u] != ru.ToHash {
			return true
		}
	}
	return false
}

// Reverts says the hosts that took the change go back: the rollout was
// aborted with --revert, or failed with --auto-revert. The record alone
// says it (the coordinator writes a failure into End at once), so every
// host and the CLI read the same answer.
func (r *Record) Reverts() bool {
	if r.Abort != nil {
		return r.Abort.Revert
	}
	return r.End != nil && r.End.State == Failed && r.Strategy.AutoRevert
}

// Ended says the record's rollout has an end written.
func (r *Record) Ended() bool { return r.End != nil }

// lastMoved is when the rollout last moved: started, resumed or promoted,
// or a host became healthy (latest: the latest HealthyAt seen).
func (r *Record) lastMoved(latest time.Time) time.Time {
	last := r.CreatedAt
	if r.ResumedAt.After(last) {
		last = r.ResumedAt
	}
	if latest.After(last) {
		last = latest
	}
	return last
}
