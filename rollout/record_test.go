package rollout

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// Contents of a.service before and after the fixture's change.
const (
	oldContent = "[Service]\nExecStart=/bin/old\n"
	newContent = "[Service]\nExecStart=/bin/new\n"
)

// t0 is when the fixture's rollout was created.
var t0 = time.Unix(1000, 0)

// pct is n% of the hosts.
func pct(n int) Count { return Count{N: n, Percent: true} }

// hostNames are h1..hn.
func hostNames(n int) []string {
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("h%d", i+1)
	}
	return hosts
}

// fixture is a rollout r1 of a.service in group web from oldContent to
// newContent on hosts h1..hn, staged by s (MaxRestarts off unless s sets
// it), and the group's keys as the rollout's put left them.
func fixture(s Strategy, n int) (*Record, []reconcile.Entry) {
	old := oldContent
	next := []byte(newContent)
	if s.MaxRestarts == 0 {
		s.MaxRestarts = -1
	}
	hosts := hostNames(n)
	r := &Record{
		ID: "r1", Group: "web", Hosts: hosts, Strategy: s, WaveEnds: s.WaveEnds(len(hosts)),
		Units:     map[string]Unit{"a.service": {From: &old, FromRevision: 3, ToHash: reconcile.Hash(next)}},
		Revision:  9,
		CreatedAt: t0,
	}
	return r, []reconcile.Entry{{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service", Value: next, ModRevision: 9}}
}

// overwritten are the fixture's keys written again since, without a
// rollout.
func overwritten() []reconcile.Entry {
	return []reconcile.Entry{{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service", Value: []byte("[Service]\nExecStart=/bin/other\n"), ModRevision: 12}}
}

func TestParseCount(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Count
		err  string
	}{
		{"1", Count{N: 1}, ""},
		{" 3 ", Count{N: 3}, ""},
		{"10%", Count{N: 10, Percent: true}, ""},
		{"100%", Count{N: 100, Percent: true}, ""},
		{"0", Count{}, "at least 1"},
		{"0%", Count{}, "at least 1"},
		{"150%", Count{}, "at most 100%"},
		{"-2", Count{}, "at least 1"},
		{"two", Count{}, "want a number"},
		{"", Count{}, "want a number"},
	} {
		got, err := ParseCount("--canary", tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--canary") {
				t.Errorf("ParseCount(%q) = %v, %v; want error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseCount(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestCountOf(t *testing.T) {
	for _, tc := range []struct {
		c     Count
		total int
		want  int
	}{
		{Count{N: 3}, 10, 3},
		{Count{N: 30}, 10, 10},
		{pct(10), 5, 1}, // rounds up, never 0
		{pct(50), 5, 3},
		{pct(100), 7, 7},
		{pct(10), 1000, 100},
	} {
		if got := tc.c.Of(tc.total); got != tc.want {
			t.Errorf("%v.Of(%d) = %d, want %d", tc.c, tc.total, got, tc.want)
		}
	}
}

func TestWaveEnds(t *testing.T) {
	for _, tc := range []struct {
		s     Strategy
		total int
		want  []int
	}{
		{Strategy{}, 5, []int{5}},
		{Strategy{Canary: Count{N: 1}}, 5, []int{1, 5}},
		{Strategy{Waves: []Count{{N: 1}, pct(50), pct(100)}}, 5, []int{1, 3, 5}},
		{Strategy{Canary: Count{N: 1}, Waves: []Count{pct(10), pct(100)}}, 5, []int{1, 5}}, // 10% of 5 is 1: no new host
		{Strategy{Waves: []Count{pct(10)}}, 1000, []int{100, 1000}},
		{Strategy{Canary: Count{N: 10}}, 3, []int{3}},
	} {
		if got := tc.s.WaveEnds(tc.total); !slices.Equal(got, tc.want) {
			t.Errorf("%+v.WaveEnds(%d) = %v, want %v", tc.s, tc.total, got, tc.want)
		}
	}
}

func TestStrategyValidate(t *testing.T) {
	for _, tc := range []struct {
		s   Strategy
		err string
	}{
		{Strategy{Waves: []Count{pct(50), pct(10)}, MaxRestarts: -1}, "each must be larger"},
		{Strategy{Soak: -time.Second, MaxRestarts: -1}, "--soak"},
		{Strategy{ProgressDeadline: -time.Second, MaxRestarts: -1}, "--progress-deadline"},
		{Strategy{Soak: 10 * time.Second, ProgressDeadline: 5 * time.Second, MaxRestarts: -1}, "not longer than --soak"},
		{Strategy{PauseAfterCanary: true, MaxRestarts: -1}, "needs --canary"},
		{Strategy{MaxRestarts: -2}, "--max-restarts"},
		{Strategy{Canary: Count{N: 1}, Waves: []Count{{N: 2}, pct(50)}, MaxRestarts: -1}, ""},
		{Strategy{Canary: Count{N: 1}, PauseAfterCanary: true, Soak: time.Second, ProgressDeadline: time.Minute}, ""},
		{Strategy{WavesBy: "rack", MaxRestarts: -1}, ""},
		{Strategy{WavesBy: "zone", WavesByOrder: []string{"a", "b"}, SuccessThreshold: 90, MaxRestarts: -1}, ""},
		{Strategy{WavesBy: "rack", Waves: []Count{pct(50)}, MaxRestarts: -1}, "go without --waves and --canary"},
		{Strategy{WavesBy: "rack", Canary: Count{N: 1}, MaxRestarts: -1}, "go without --waves and --canary"},
		{Strategy{WavesBy: "ra ck", MaxRestarts: -1}, `label key "ra ck"`},
		{Strategy{WavesBy: "zone", WavesByOrder: []string{"a", "a"}, MaxRestarts: -1}, `"a" listed twice`},
		{Strategy{WavesByOrder: []string{"a"}, MaxRestarts: -1}, "values without a label key"},
		{Strategy{SuccessThreshold: 101, MaxRestarts: -1}, "--success-threshold 101%"},
		{Strategy{SuccessThreshold: -1, MaxRestarts: -1}, "--success-threshold -1%"},
		{Strategy{BudgetBy: "rack", MaxUnavailable: Count{N: 1}, MaxRestarts: -1}, ""},
		{Strategy{BudgetBy: "rack", MaxRestarts: -1}, "--budget-by rack needs --max-unavailable"},
		{Strategy{BudgetBy: "ra ck", MaxUnavailable: Count{N: 1}, MaxRestarts: -1}, `--budget-by "ra ck"`},
	} {
		err := tc.s.Validate()
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v.Validate() = %v, want %q", tc.s, err, tc.err)
		}
	}
}

func TestRecordWaves(t *testing.T) {
	r, _ := fixture(Strategy{Canary: Count{N: 1}, Waves: []Count{pct(50)}}, 5)
	if !slices.Equal(r.WaveEnds, []int{1, 3, 5}) {
		t.Fatalf("wave ends %v", r.WaveEnds)
	}
	for host, want := range map[string]int{"h1": 0, "h2": 1, "h3": 1, "h4": 2, "h5": 2, "h9": -1} {
		if got := r.Wave(host); got != want {
			t.Errorf("Wave(%s) = %d, want %d", host, got, want)
		}
	}
	for w, want := range [][]string{{"h1"}, {"h2", "h3"}, {"h4", "h5"}} {
		if got := r.WaveHosts(w); !slices.Equal(got, want) {
			t.Errorf("WaveHosts(%d) = %v, want %v", w, got, want)
		}
	}
}

func TestRecordReverts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		revert bool
		abort  *Abort
		end    State
		want   bool
	}{
		{name: "running", revert: true},
		{name: "failed with auto-revert", revert: true, end: Failed, want: true},
		{name: "failed without auto-revert", end: Failed},
		{name: "done with auto-revert", revert: true, end: Done},
		{name: "superseded with auto-revert", revert: true, end: Superseded},
		{name: "aborted with revert", abort: &Abort{Revert: true}, end: Aborted, want: true},
		{name: "aborted without revert, auto-revert on", revert: true, abort: &Abort{}, end: Aborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := fixture(Strategy{Canary: Count{N: 1}, AutoRevert: tc.revert}, 5)
			r.Abort = tc.abort
			if tc.end != "" {
				r.End = &End{State: tc.end}
			}
			if got := r.Reverts(); got != tc.want {
				t.Errorf("Reverts() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRecordGoverns(t *testing.T) {
	r, entries := fixture(Strategy{Canary: Count{N: 1}}, 5)
	if r.Overwritten(entries) || !r.Governs(entries) {
		t.Errorf("the rollout's own keys: overwritten %v, governs %v", r.Overwritten(entries), r.Governs(entries))
	}
	if !r.Overwritten(overwritten()) || r.Governs(overwritten()) {
		t.Error("a later write does not supersede the rollout")
	}
	if !r.Overwritten(nil) {
		t.Error("a removed key does not supersede the rollout")
	}
	// Another group's key of the same name is not the rollout's.
	other := append(slices.Clone(entries), reconcile.Entry{Scope: reconcile.ScopeGroup, Group: "db", Unit: "a.service", Value: []byte("x")})
	if r.Overwritten(other) {
		t.Error("another group's key supersedes the rollout")
	}
	r.End = &End{State: Done}
	if r.Governs(entries) {
		t.Error("a done rollout still governs its keys")
	}
	r.End = &End{State: Aborted}
	if !r.Governs(entries) {
		t.Error("an aborted rollout no longer governs its keys")
	}
}

func TestOverlay(t *testing.T) {
	r, entries := fixture(Strategy{Canary: Count{N: 1}}, 5)
	mine := func(s HostState) map[string]*Progress { return map[string]*Progress{"r1": {State: s}} }
	for _, tc := range []struct {
		host string
		mine map[string]*Progress
		want string
	}{
		{"h1", mine(HostApplying), newContent},
		{"h1", mine(HostSoaking), newContent},
		{"h1", mine(HostHealthy), newContent},
		{"h1", mine(HostFailed), newContent},
		{"h1", mine(HostReverting), oldContent},
		{"h1", mine(HostReverted), oldContent},
		{"h2", nil, oldContent},
		{"h9", nil, oldContent}, // joined after the start: keeps the previous content until the coordinator adds it, or the rollout is done
	} {
		got := Overlay(entries, tc.host, []*Record{r}, tc.mine)
		if len(got) != 1 || string(got[0].Value) != tc.want {
			t.Errorf("%s with %v runs %+v, want %q", tc.host, tc.mine["r1"].StateOf(), got, tc.want)
			continue
		}
		if tc.want == oldContent && got[0].ModRevision != 3 {
			t.Errorf("%s runs the previous content at revision %d, want 3", tc.host, got[0].ModRevision)
		}
	}
	if string(entries[0].Value) != newContent {
		t.Fatalf("Overlay changed its input: %q", entries[0].Value)
	}
	// A put over the rollout's write supersedes it.
	other := overwritten()
	if got := Overlay(other, "h2", []*Record{r}, nil); string(got[0].Value) != string(other[0].Value) {
		t.Errorf("superseded rollout still overlays: %q", got[0].Value)
	}
	// A new unit: hosts that did not take it do not have it.
	r.Units["b.service"] = Unit{ToHash: reconcile.Hash([]byte("b"))}
	withB := append(slices.Clone(entries), reconcile.Entry{Scope: reconcile.ScopeGroup, Group: "web", Unit: "b.service", Value: []byte("b")})
	if got := Overlay(withB, "h2", []*Record{r}, nil); len(got) != 1 || got[0].Unit != "a.service" {
		t.Errorf("h2 sees %v", got)
	}
	// A removed unit: hosts that did not take the removal keep it.
	r2, _ := fixture(Strategy{Canary: Count{N: 1}}, 5)
	old := oldContent
	r2.Units = map[string]Unit{"a.service": {From: &old, FromRevision: 3}}
	if got := Overlay(nil, "h2", []*Record{r2}, nil); len(got) != 1 || string(got[0].Value) != oldContent {
		t.Errorf("h2 lost a unit whose removal it did not take: %v", got)
	}
	r.End = &End{State: Done}
	if got := Overlay(withB, "h2", []*Record{r}, nil); len(got) != 2 {
		t.Errorf("a done rollout still overlays: %v", got)
	}
}

// A rollout that follows an aborted one: the hosts it has not reached keep
// what they run (the version before the aborted change, or the aborted
// change where they kept it), not what the keys held when it started.
func TestOverlayFollowsAnAbortedOne(t *testing.T) {
	a, entries := fixture(Strategy{Canary: Count{N: 1}}, 5)
	v1 := *a.Units["a.service"].From
	v2 := string(entries[0].Value)
	a.Abort = &Abort{}
	a.End = &End{State: Aborted}
	v3 := []byte("[Service]\nExecStart=/bin/v3\n")
	b := &Record{ID: "r2", Group: "web", Hosts: a.Hosts, WaveEnds: []int{1, 5}, After: a.ID,
		Units: map[string]Unit{"a.service": {From: &v2, FromRevision: 9, ToHash: reconcile.Hash(v3)}}}
	now := []reconcile.Entry{{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service", Value: v3, ModRevision: 12}}
	mine := map[string]map[string]*Progress{
		"h1": {"r1": {State: HostReverted}},
		"h2": {"r1": {State: HostHealthy}},
		"h3": {"r2": {State: HostApplying}},
	}
	for host, want := range map[string]string{"h1": v1, "h2": v2, "h3": string(v3), "h4": v1, "h9": v1} { // h9 joined since: the last good content
		got := Overlay(now, host, []*Record{a, b}, mine[host])
		if string(got[0].Value) != want {
			t.Errorf("%s runs %q, want %q", host, got[0].Value, want)
		}
	}
	// Had the first one ended done, every host would have had its change.
	a.Abort, a.End = nil, &End{State: Done}
	if got := Overlay(now, "h4", []*Record{a, b}, nil); string(got[0].Value) != v2 {
		t.Errorf("after a done rollout h4 runs %q, want %q", got[0].Value, v2)
	}
}

// A group key written after the rollouts are known complete is held at
// what the host ran: its rollout's record may not have arrived yet.
func TestHoldUnconfirmed(t *testing.T) {
	prev := []reconcile.Entry{{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service", Value: []byte("v1"), ModRevision: 5}}
	now := []reconcile.Entry{
		{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service", Value: []byte("v2"), ModRevision: 9},
		{Scope: reconcile.ScopeGroup, Group: "web", Unit: "b.service", Value: []byte("b"), ModRevision: 9},
		{Scope: reconcile.ScopeHost, Unit: "c.service", Value: []byte("c"), ModRevision: 9},
	}
	got, held := HoldUnconfirmed(now, prev, 8)
	if !held || len(got) != 2 || got[0].Unit != "c.service" || string(got[1].Value) != "v1" {
		t.Fatalf("held %v: %+v", held, got)
	}
	if got, held := HoldUnconfirmed(now, prev, 9); held || len(got) != 3 {
		t.Fatalf("confirmed: held %v, %+v", held, got)
	}
	if got, held := HoldUnconfirmed(now, prev, 0); held || len(got) != 3 {
		t.Fatalf("unknown: held %v, %+v", held, got)
	}
}

func TestNameHosts(t *testing.T) {
	for _, tc := range []struct {
		names []string
		total int
		want  string
	}{
		{nil, 0, ""},
		{[]string{"h1"}, 1, "h1"},
		{[]string{"h1", "h2", "h3"}, 3, "h1, h2, h3"},
		{[]string{"h1", "h2"}, 5, "h1, h2 and 3 more"},
		{hostNames(12), 1000, strings.Join(hostNames(SampleSize), ", ") + " and 990 more"},
	} {
		if got := NameHosts(tc.names, tc.total); got != tc.want {
			t.Errorf("NameHosts(%v, %d) = %q, want %q", tc.names, tc.total, got, tc.want)
		}
	}
}

func TestSummaryNamed(t *testing.T) {
	s := &Summary{
		Counts: map[HostState]int{HostHealthy: 3, HostApplying: 12, HostFailed: 1},
		Hosts: map[HostState][]string{
			HostHealthy:  {"h1", "h2", "h3"},
			HostApplying: hostNames(SampleSize + 3)[3:], // h4..h13 of 12
			HostFailed:   {"h20"},
		},
	}
	for _, tc := range []struct {
		states []HostState
		want   string
	}{
		{[]HostState{HostHealthy}, "h1, h2, h3"},
		{[]HostState{HostFailed}, "h20"},
		{[]HostState{HostSoaking}, ""},
		{[]HostState{HostApplying}, strings.Join(hostNames(SampleSize + 3)[3:], ", ") + " and 2 more"},
		{[]HostState{HostFailed, HostHealthy}, "h20, h1, h2, h3"},
		{[]HostState{HostHealthy, HostApplying}, strings.Join(hostNames(SampleSize), ", ") + " and 5 more"},
	} {
		if got := s.Named(tc.states...); got != tc.want {
			t.Errorf("Named(%v) = %q, want %q", tc.states, got, tc.want)
		}
	}
	var none *Summary
	if got := none.Named(HostHealthy); got != "" {
		t.Errorf("a nil summary names %q", got)
	}
	if got := s.Holding(); got != 16 {
		t.Errorf("Holding() = %d, want 16", got)
	}
	if got := s.HoldingHosts(); len(got) != SampleSize || got[0] != "h4" {
		t.Errorf("HoldingHosts() = %v", got)
	}
}

func TestViewPhase(t *testing.T) {
	running := &Summary{Phase: Phase{State: Running, Wave: 1}}
	for _, tc := range []struct {
		name    string
		edit    func(r *Record)
		summary *Summary
		entries []reconcile.Entry // nil: the rollout's own
		want    State
		reason  string
		wave    int
	}{
		{name: "no summary yet: starting", want: Starting, reason: "no coordinator"},
		{name: "running, by the summary", summary: running, want: Running, wave: 1},
		{name: "waiting for promote, by the summary", summary: &Summary{Phase: Phase{State: WaitingPromote, Wave: 1, Reason: "promote"}}, want: WaitingPromote, reason: "promote", wave: 1},
		{name: "paused in the record before the summary says so", edit: func(r *Record) { r.Paused, r.PauseReason = true, "by ops" }, summary: running, want: Paused, reason: "by ops", wave: 1},
		{name: "paused, no summary yet", edit: func(r *Record) { r.Paused = true }, want: Paused},
		{name: "resumed since the summary said paused", summary: &Summary{Phase: Phase{State: Paused, Wave: 1}}, want: Running, wave: 1},
		{name: "ended: the end written", edit: func(r *Record) { r.End = &End{State: Failed, Reason: "h2 failed"} }, summary: running, want: Failed, reason: "h2 failed", wave: 1},
		{name: "ended beats paused", edit: func(r *Record) { r.Paused, r.End = true, &End{State: Aborted} }, want: Aborted},
		{name: "overwritten: superseded before any end is written", summary: running, entries: overwritten(), want: Superseded, reason: "written again", wave: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, entries := fixture(Strategy{Canary: Count{N: 1}}, 5)
			if tc.edit != nil {
				tc.edit(r)
			}
			if tc.entries != nil {
				entries = tc.entries
			}
			ph := View{Record: r, Summary: tc.summary, Entries: entries}.Phase()
			if ph.State != tc.want || ph.Wave != tc.wave || !strings.Contains(ph.Reason, tc.reason) {
				t.Errorf("Phase() = %+v, want %s in wave %d with %q", ph, tc.want, tc.wave, tc.reason)
			}
		})
	}
}

func TestViewSettled(t *testing.T) {
	end := t0.Add(time.Minute)
	holding := func(n int, at time.Time, st State) *Summary {
		return &Summary{Phase: Phase{State: st}, Counts: map[HostState]int{HostReverting: n, HostReverted: 1}, At: at}
	}
	for _, tc := range []struct {
		name    string
		revert  bool
		end     *End
		summary *Summary
		want    bool
	}{
		{name: "running", summary: &Summary{Phase: Phase{State: Running}}},
		{name: "done", end: &End{State: Done, At: end}, want: true},
		{name: "failed, no revert", end: &End{State: Failed, At: end}, want: true},
		{name: "failed, reverting, no summary since", revert: true, end: &End{State: Failed, At: end}},
		{name: "failed, reverting, summary from before the end", revert: true, end: &End{State: Failed, At: end}, summary: holding(0, end.Add(-time.Second), Running)},
		{name: "failed, reverting, a host still holds it", revert: true, end: &End{State: Failed, At: end}, summary: holding(1, end.Add(time.Second), Failed)},
		{name: "failed, reverted everywhere", revert: true, end: &End{State: Failed, At: end}, summary: holding(0, end.Add(time.Second), Failed), want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, entries := fixture(Strategy{Canary: Count{N: 1}, AutoRevert: tc.revert}, 5)
			r.End = tc.end
			if got := (View{Record: r, Summary: tc.summary, Entries: entries}).Settled(); got != tc.want {
				t.Errorf("Settled() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestParseWavesBy(t *testing.T) {
	for _, tc := range []struct {
		in    string
		key   string
		order []string
		err   string
	}{
		{in: "rack", key: "rack"},
		{in: "zone=a,b,c", key: "zone", order: []string{"a", "b", "c"}},
		{in: " zone = a , b ", key: "zone", order: []string{"a", "b"}},
		{in: "zone=", err: "an empty value"},
		{in: "zone=a,,b", err: "an empty value"},
		{in: "=a", err: "want a label key"},
		{in: "  ", err: "want a label key"},
		{in: "ra ck", err: `label key "ra ck"`},
		{in: "zone=a b", err: `value "a b"`},
		{in: "zone=a,a", err: `"a" listed twice`},
	} {
		key, order, err := ParseWavesBy("--waves-by", tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--waves-by") {
				t.Errorf("ParseWavesBy(%q) = %v, want an error saying %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || key != tc.key || !slices.Equal(order, tc.order) {
			t.Errorf("ParseWavesBy(%q) = %q, %q, %v; want %q, %q", tc.in, key, order, err, tc.key, tc.order)
		}
	}
}

func TestParseThreshold(t *testing.T) {
	for in, want := range map[string]int{"90%": 90, "100%": 100, "1%": 1, " 50 ": 50, "0%": 0, "101%": 0, "-5%": 0, "x": 0, "": 0} {
		got, err := ParseThreshold("--success-threshold", in)
		if got != want || (err == nil) != (want > 0) {
			t.Errorf("ParseThreshold(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestByLabel(t *testing.T) {
	labels := map[string]map[string]string{
		"a1": {"rack": "r2"}, "a2": {"rack": "r1"}, "a3": {"rack": "r2"}, "a4": {"rack": "r1"},
		"a5": {}, "a6": {"rack": "r3"},
	}
	hosts := []string{"a1", "a2", "a3", "a4", "a5", "a6", "a7"} // a7: no labels known
	for _, tc := range []struct {
		name      string
		s         Strategy
		order     []string
		ends      []int
		names     []string
		unlabeled []string
	}{
		{
			name: "sorted values, the unlabeled last", s: Strategy{WavesBy: "rack"},
			order: []string{"a2", "a4", "a1", "a3", "a6", "a5", "a7"}, ends: []int{2, 4, 5, 7},
			names: []string{"rack=r1", "rack=r2", "rack=r3", "(no rack)"}, unlabeled: []string{"a5", "a7"},
		},
		{
			name: "listed values in their order, the unlisted with the unlabeled", s: Strategy{WavesBy: "rack", WavesByOrder: []string{"r2", "r1"}},
			order: []string{"a1", "a3", "a2", "a4", "a5", "a6", "a7"}, ends: []int{2, 4, 7},
			names: []string{"rack=r2", "rack=r1", "(no rack)"}, unlabeled: []string{"a5", "a6", "a7"},
		},
		{
			name: "a listed value no host has makes no wave", s: Strategy{WavesBy: "rack", WavesByOrder: []string{"r9", "r1", "r2", "r3"}},
			order: []string{"a2", "a4", "a1", "a3", "a6", "a5", "a7"}, ends: []int{2, 4, 5, 7},
			names: []string{"rack=r1", "rack=r2", "rack=r3", "(no rack)"}, unlabeled: []string{"a5", "a7"},
		},
		{
			name: "nobody has the label: one wave", s: Strategy{WavesBy: "zone"},
			order: []string{"a1", "a2", "a3", "a4", "a5", "a6", "a7"}, ends: []int{7},
			names: []string{"(no zone)"}, unlabeled: hosts,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			order, ends, names, unlabeled := tc.s.ByLabel(slices.Clone(hosts), labels)
			if !slices.Equal(order, tc.order) || !slices.Equal(ends, tc.ends) || !slices.Equal(names, tc.names) || !slices.Equal(unlabeled, tc.unlabeled) {
				t.Errorf("ByLabel = %v %v %v %v\nwant %v %v %v %v", order, ends, names, unlabeled, tc.order, tc.ends, tc.names, tc.unlabeled)
			}
		})
	}
}

// Buckets sorts hosts by the budget label: a bucket per value met, in
// the hosts' order, the hosts without the label sharing one; a joiner
// (past the buckets) has none the record knows.
func TestBuckets(t *testing.T) {
	s := Strategy{BudgetBy: "rack", MaxUnavailable: Count{N: 1}}
	labels := map[string]map[string]string{"h1": {"rack": "r2"}, "h2": {"rack": "r1"}, "h3": {"rack": "r2"}, "h4": {}}
	of, names := s.Buckets([]string{"h1", "h2", "h3", "h4", "h5"}, labels)
	if !slices.Equal(of, []int{0, 1, 0, 2, 2}) || !slices.Equal(names, []string{"rack=r2", "rack=r1", "(no rack)"}) {
		t.Fatalf("Buckets = %v %v", of, names)
	}
	r := &Record{Strategy: s, Hosts: []string{"h1", "h2", "h3", "h4", "h5", "h6"}, Buckets: of, BucketNames: names}
	for h, want := range map[string]string{"h2": "rack=r1", "h5": "(no rack)", "h6": "(rack not known: joined since the start)"} {
		if got := r.BucketName(h); got != want {
			t.Errorf("BucketName(%s) = %q, want %q", h, got, want)
		}
	}
	if of, names := (Strategy{}).Buckets([]string{"h1"}, labels); of != nil || names != nil {
		t.Errorf("no --budget-by: Buckets = %v %v, want none", of, names)
	}
}
