package rollout

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseCount(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Count
		err  string
	}{
		{"1", Count{N: 1}, ""},
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
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseCount(%q) = %v, %v; want error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseCount(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestWaveEnds(t *testing.T) {
	pct := func(n int) Count { return Count{N: n, Percent: true} }
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
	pct := func(n int) Count { return Count{N: n, Percent: true} }
	for _, tc := range []struct {
		s   Strategy
		err string
	}{
		{Strategy{Waves: []Count{pct(50), pct(10)}, MaxRestarts: -1}, "each must be larger"},
		{Strategy{Soak: -time.Second, MaxRestarts: -1}, "--soak"},
		{Strategy{Soak: 10 * time.Second, ProgressDeadline: 5 * time.Second, MaxRestarts: -1}, "not longer than --soak"},
		{Strategy{PauseAfterCanary: true, MaxRestarts: -1}, "needs --canary"},
		{Strategy{Canary: Count{N: 1}, Waves: []Count{{N: 2}, pct(50)}, MaxRestarts: -1}, ""},
	} {
		err := tc.s.Validate()
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v.Validate() = %v, want %q", tc.s, err, tc.err)
		}
	}
}

// rolloutFixture is a rollout of a.service from old to new content on
// hosts h1..h5 in waves 1, 3, 5.
func rolloutFixture(s Strategy) (*Rollout, []Entry) {
	old := "[Service]\nExecStart=/bin/old\n"
	next := []byte("[Service]\nExecStart=/bin/new\n")
	s.MaxRestarts = max(s.MaxRestarts, -1)
	hosts := []string{"h1", "h2", "h3", "h4", "h5"}
	r := &Rollout{
		ID: "r1", Group: "web", Hosts: hosts, Strategy: s, WaveEnds: s.WaveEnds(len(hosts)),
		Units:     map[string]RolloutUnit{"a.service": {From: &old, FromRevision: 3, ToHash: Hash(next)}},
		CreatedAt: time.Unix(1000, 0),
	}
	return r, []Entry{{Scope: ScopeGroup, Group: "web", Unit: "a.service", Value: next, ModRevision: 9}}
}

func healthyStatus(content []byte) map[string]Status {
	h := Hash(content)
	return map[string]Status{"a.service": {Unit: "a.service", Hash: h, DesiredHash: h, ActiveState: "active", SubState: "running", Health: "healthy"}}
}

func TestRolloutWavesOpenInTurn(t *testing.T) {
	r, entries := rolloutFixture(Strategy{Waves: []Count{{N: 1}, {N: 50, Percent: true}}, Soak: 3 * time.Second})
	if !slices.Equal(r.WaveEnds, []int{1, 3, 5}) {
		t.Fatalf("waves %v", r.WaveEnds)
	}
	now := time.Unix(2000, 0)
	prog := map[string]*HostProgress{}
	// Only the first wave's host takes it.
	for _, h := range r.Hosts {
		w := stepOf(r, h, prog, entries, nil, now)
		if took := w.Progress != nil; took != (h == "h1") {
			t.Fatalf("%s: step %+v", h, w)
		}
	}
	prog["h1"] = &HostProgress{State: HostApplying, Since: now}
	// Running the new version healthy: soaking, then healthy after 3 s.
	w := stepOf(r, "h1", prog, entries, healthyStatus(entries[0].Value), now)
	if w.Progress == nil || w.Progress.State != HostSoaking {
		t.Fatalf("h1 after healthy: %+v", w)
	}
	prog["h1"] = w.Progress
	if w := stepOf(r, "h1", prog, entries, healthyStatus(entries[0].Value), now.Add(2*time.Second)); w.Progress != nil {
		t.Fatalf("h1 done before its soak: %+v", w.Progress)
	}
	w = stepOf(r, "h1", prog, entries, healthyStatus(entries[0].Value), now.Add(3*time.Second))
	if w.Progress == nil || w.Progress.State != HostHealthy {
		t.Fatalf("h1 after its soak: %+v", w)
	}
	prog["h1"] = w.Progress
	if ph := r.Phase(prog, now.Add(3*time.Second)); ph.Wave != 1 || ph.State != RolloutRunning {
		t.Fatalf("phase %+v", ph)
	}
	for _, h := range r.Hosts[1:] {
		w := stepOf(r, h, prog, entries, nil, now.Add(3*time.Second))
		if took := w.Progress != nil; took != (h == "h2" || h == "h3") {
			t.Fatalf("%s in wave 2: %+v", h, w)
		}
	}
	// Paused: nobody new takes it.
	r.Paused = true
	if w := stepOf(r, "h2", prog, entries, nil, now.Add(3*time.Second)); w.Progress != nil {
		t.Fatalf("h2 took a paused rollout: %+v", w)
	}
	r.Paused = false
	for _, h := range r.Hosts[1:] {
		prog[h] = &HostProgress{State: HostHealthy, HealthyAt: now}
	}
	ph := r.Phase(prog, now)
	if ph.State != RolloutDone || ph.End == nil {
		t.Fatalf("every host healthy: %+v", ph)
	}
	if w := stepOf(r, "h4", prog, entries, nil, now); w.End == nil || w.End.State != RolloutDone {
		t.Fatalf("the end is not written: %+v", w)
	}
}

func TestRolloutFailedCanaryIsReverted(t *testing.T) {
	r, entries := rolloutFixture(Strategy{Canary: Count{N: 1}, AutoRevert: true})
	now := time.Unix(2000, 0)
	prog := map[string]*HostProgress{"h1": {State: HostApplying, Since: now}}
	failed := map[string]Status{"a.service": {Unit: "a.service", Hash: Hash(entries[0].Value), DesiredHash: Hash(entries[0].Value), ActiveState: "failed", Action: ActionRolledBack, Result: "failed", Error: "exited 1"}}
	w := stepOf(r, "h1", prog, entries, failed, now)
	if w.Progress == nil || w.Progress.State != HostFailed {
		t.Fatalf("canary: %+v", w)
	}
	prog["h1"] = w.Progress
	w = stepOf(r, "h2", prog, entries, nil, now)
	if w.Progress != nil || w.End == nil || w.End.State != RolloutFailed || !strings.Contains(w.End.Reason, "h1 failed") {
		t.Fatalf("h2 after the canary failed: %+v %+v", w.Progress, w.End)
	}
	r.End = w.End
	w = stepOf(r, "h1", prog, entries, failed, now)
	if w.Progress == nil || w.Progress.State != HostReverting {
		t.Fatalf("canary after the failure: %+v", w)
	}
	prog["h1"] = w.Progress
	// Reverting: the host gets the old content back.
	got := Overlay(entries, "h1", []*Rollout{r}, map[string]map[string]*HostProgress{"r1": prog})
	if string(got[0].Value) != *r.Units["a.service"].From || got[0].ModRevision != 3 {
		t.Fatalf("overlay for a reverting host: %q", got[0].Value)
	}
	w = stepOf(r, "h1", prog, entries, healthyStatus([]byte(*r.Units["a.service"].From)), now)
	if w.Progress == nil || w.Progress.State != HostReverted {
		t.Fatalf("canary back on the old version: %+v", w)
	}
}

func TestRolloutOverlay(t *testing.T) {
	r, entries := rolloutFixture(Strategy{Canary: Count{N: 1}})
	prog := map[string]map[string]*HostProgress{"r1": {"h1": {State: HostApplying}}}
	if got := Overlay(entries, "h1", []*Rollout{r}, prog); string(got[0].Value) != string(entries[0].Value) {
		t.Errorf("h1 took the change but runs %q", got[0].Value)
	}
	if got := Overlay(entries, "h2", []*Rollout{r}, prog); string(got[0].Value) != *r.Units["a.service"].From {
		t.Errorf("h2 did not take the change but runs %q", got[0].Value)
	}
	if got := Overlay(entries, "h9", []*Rollout{r}, prog); string(got[0].Value) != string(entries[0].Value) {
		t.Errorf("a host that joined after the start runs %q, want the new content", got[0].Value)
	}
	// A put over the rollout's write supersedes it.
	other := []Entry{{Scope: ScopeGroup, Group: "web", Unit: "a.service", Value: []byte("[Service]\nExecStart=/bin/other\n")}}
	if got := Overlay(other, "h2", []*Rollout{r}, prog); string(got[0].Value) != string(other[0].Value) {
		t.Errorf("superseded rollout still overlays: %q", got[0].Value)
	}
	// A new unit: hosts that did not take it do not have it.
	r.Units["b.service"] = RolloutUnit{ToHash: Hash([]byte("b"))}
	withB := append(slices.Clone(entries), Entry{Scope: ScopeGroup, Group: "web", Unit: "b.service", Value: []byte("b")})
	if got := Overlay(withB, "h2", []*Rollout{r}, prog); len(got) != 1 || got[0].Unit != "a.service" {
		t.Errorf("h2 sees %v", got)
	}
	r.End = &RolloutEnd{State: RolloutDone}
	if got := Overlay(withB, "h2", []*Rollout{r}, prog); len(got) != 2 {
		t.Errorf("a done rollout still overlays: %v", got)
	}
}

func TestRolloutMaxUnavailableAndDeadline(t *testing.T) {
	r, entries := rolloutFixture(Strategy{MaxUnavailable: Count{N: 2}, ProgressDeadline: time.Minute})
	now := time.Unix(1030, 0)
	prog := map[string]*HostProgress{"h1": {State: HostApplying}, "h2": {State: HostSoaking}}
	if w := stepOf(r, "h3", prog, entries, nil, now); w.Progress != nil {
		t.Fatalf("third host taken with MaxUnavailable 2: %+v", w)
	}
	prog["h2"].State = HostHealthy
	if w := stepOf(r, "h3", prog, entries, nil, now); w.Progress == nil {
		t.Fatal("h3 waits with a slot free")
	}
	ph := r.Phase(prog, time.Unix(1000+61, 0))
	if ph.State != RolloutFailed || !strings.Contains(ph.Reason, "progress-deadline") {
		t.Fatalf("after the deadline: %+v", ph)
	}
	r.Paused = true
	if ph := r.Phase(prog, time.Unix(1000+61, 0)); ph.State != RolloutPaused {
		t.Fatalf("a paused rollout ran out its deadline: %+v", ph)
	}
}

func TestRolloutPauseAfterCanaryAndMaxRestarts(t *testing.T) {
	r, entries := rolloutFixture(Strategy{Canary: Count{N: 1}, PauseAfterCanary: true, MaxRestarts: 2})
	now := time.Unix(2000, 0)
	prog := map[string]*HostProgress{"h1": {State: HostHealthy}}
	if ph := r.Phase(prog, now); ph.State != RolloutWaitingPromote {
		t.Fatalf("after the canary: %+v", ph)
	}
	if w := stepOf(r, "h2", prog, entries, nil, now); w.Progress != nil {
		t.Fatalf("h2 took it before promote: %+v", w)
	}
	r.Promoted = true
	if w := stepOf(r, "h2", prog, entries, nil, now); w.Progress == nil {
		t.Fatal("h2 waits after promote")
	}
	prog["h2"] = &HostProgress{State: HostApplying, Restarts: map[string]uint32{"a.service": 1}}
	st := map[string]Status{"a.service": {Unit: "a.service", Hash: Hash(entries[0].Value), DesiredHash: Hash(entries[0].Value), ActiveState: "activating", NRestarts: 4}}
	if w := stepOf(r, "h2", prog, entries, st, now); !strings.Contains(w.Pause, "restarted 3 times") {
		t.Fatalf("crash loop: %+v", w)
	}
}

// stepOf is RolloutStep with what the host runs under r alone.
func stepOf(r *Rollout, host string, prog map[string]*HostProgress, entries []Entry, st map[string]Status, now time.Time) RolloutWrite {
	runs := Overlay(entries, host, []*Rollout{r}, map[string]map[string]*HostProgress{r.ID: prog})
	return RolloutStep(r, host, prog, entries, runs, st, now)
}

// A rollout that follows an aborted one: the hosts it has not reached keep
// what they run (the version before the aborted change, or the aborted
// change where they kept it), not what the keys held when it started.
func TestRolloutOverlayFollowsAnAbortedOne(t *testing.T) {
	a, entries := rolloutFixture(Strategy{Canary: Count{N: 1}})
	v1 := *a.Units["a.service"].From
	v2 := string(entries[0].Value)
	a.End = &RolloutEnd{State: RolloutAborted}
	v3 := []byte("[Service]\nExecStart=/bin/v3\n")
	b := &Rollout{ID: "r2", Group: "web", Hosts: a.Hosts, WaveEnds: []int{1, 5}, After: a.ID,
		Units: map[string]RolloutUnit{"a.service": {From: &v2, FromRevision: 9, ToHash: Hash(v3)}}}
	now := []Entry{{Scope: ScopeGroup, Group: "web", Unit: "a.service", Value: v3, ModRevision: 12}}
	prog := map[string]map[string]*HostProgress{
		"r1": {"h1": {State: HostReverted}, "h2": {State: HostHealthy}},
		"r2": {"h3": {State: HostApplying}},
	}
	for host, want := range map[string]string{"h1": v1, "h2": v2, "h3": string(v3), "h4": v1, "h9": string(v3)} {
		got := Overlay(now, host, []*Rollout{a, b}, prog)
		if string(got[0].Value) != want {
			t.Errorf("%s runs %q, want %q", host, got[0].Value, want)
		}
	}
}

// A group key written after the rollouts are known complete is held at
// what the host ran: its rollout's record may not have arrived yet.
func TestHoldUnconfirmed(t *testing.T) {
	prev := []Entry{{Scope: ScopeGroup, Group: "web", Unit: "a.service", Value: []byte("v1"), ModRevision: 5}}
	now := []Entry{
		{Scope: ScopeGroup, Group: "web", Unit: "a.service", Value: []byte("v2"), ModRevision: 9},
		{Scope: ScopeGroup, Group: "web", Unit: "b.service", Value: []byte("b"), ModRevision: 9},
		{Scope: ScopeHost, Unit: "c.service", Value: []byte("c"), ModRevision: 9},
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
