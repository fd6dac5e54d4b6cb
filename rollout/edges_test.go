package rollout

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/calendar"
	"github.com/agentd/agentd/reconcile"
)

// A host going back that refuses the previous content (under
// --allowed-signers: bad signature, replayed) cannot go back: it says so
// (revert-failed, named) instead of reverting forever.
func TestStepRevertRefusedEnds(t *testing.T) {
	r, entries := fixture(Strategy{Canary: Count{N: 1}, AutoRevert: true}, 3)
	r.End = &End{State: Failed, Reason: "h1 failed the change", At: t0}
	runs := Overlay(entries, "h1", []*Record{r}, map[string]*Progress{"r1": {State: HostReverting}})
	refused := failedStatuses(oldContent)
	s := refused["a.service"]
	s.Action, s.Error = reconcile.ActionWord(""), "a.service: bad signature: signed for other content"
	refused["a.service"] = s
	w := Step(r, HostInput{Host: "h1", Mine: &Progress{State: HostReverting}, Entries: entries, Runs: runs, Statuses: refused}, t0.Add(time.Second))
	if w.Progress == nil || w.Progress.State != HostRevertFailed || !strings.Contains(w.Progress.Reason, "bad signature") {
		t.Fatalf("step %+v, want revert-failed naming the refusal", w.Progress)
	}
	// The summary names it, and nothing holds the follow: settled.
	d := Decide(r, GroupView{Progress: map[string]*Progress{"h1": w.Progress}, Entries: entries}, "h2", t0.Add(2*time.Second))
	if len(d.Summary.Offenders) != 1 || d.Summary.Offenders[0].Host != "h1" || d.Summary.Holding() != 0 {
		t.Errorf("summary %+v", d.Summary)
	}
	if v := (View{Record: r, Summary: &d.Summary, Entries: entries}); !v.Settled() {
		t.Error("a rollout whose only host could not go back is not settled")
	}
}

// A signed rollout carries its way back: a host that took the change and
// goes back checks the previous content against it; a host that never
// took it keeps the records as they are.
func TestOverlaySignatures(t *testing.T) {
	r, entries := fixture(Strategy{Canary: Count{N: 1}}, 3)
	u := r.Units["a.service"]
	u.BackSig = `{"seq":2,"revert":true}`
	r.Units["a.service"] = u
	sigs := []reconcile.Entry{{Scope: reconcile.ScopeGroup, Group: "web", Unit: "a.service", Value: []byte(`{"seq":1}`), ModRevision: 9}}
	for _, tc := range []struct {
		mine *Progress
		want string
	}{
		{nil, `{"seq":1}`},
		{&Progress{State: HostApplying}, `{"seq":1}`},
		{&Progress{State: HostHealthy}, `{"seq":1}`},
		{&Progress{State: HostReverting}, u.BackSig},
		{&Progress{State: HostReverted}, u.BackSig},
	} {
		mine := map[string]*Progress{"r1": tc.mine}
		got := OverlaySignatures(sigs, entries, Overlay(entries, "h1", []*Record{r}, mine), []*Record{r}, mine)
		if len(got) != 1 || string(got[0].Value) != tc.want {
			t.Errorf("%s: %v, want %s", tc.mine.StateOf(), got, tc.want)
		}
	}
	if string(sigs[0].Value) != `{"seq":1}` {
		t.Error("OverlaySignatures changed its input")
	}
}

// The coordinator's gates: a URL that answers 2xx, a PromQL expression
// that holds (a non-empty vector), and how each fails.
func TestCheckGate(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/ok":
		case "/down":
			http.Error(w, "no", http.StatusServiceUnavailable)
		case "/slow":
			select {
			case <-req.Context().Done():
			case <-time.After(5 * time.Second):
			}
		case "/api/v1/query":
			switch req.URL.Query().Get("query") {
			case "up == 1":
				w.Write([]byte(`{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"1"]}]}}`))
			case "errors > 5":
				w.Write([]byte(`{"status":"success","data":{"resultType":"vector","result":[]}}`))
			default:
				w.WriteHeader(http.StatusBadRequest)
				w.Write([]byte(`{"status":"error","error":"parse error"}`))
			}
		}
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name string
		s    Strategy
		ok   bool
		why  string
	}{
		{"a URL that answers 200 passes", Strategy{GateURL: srv.URL + "/ok"}, true, ""},
		{"a URL that answers 503 fails, saying so", Strategy{GateURL: srv.URL + "/down"}, false, "503"},
		{"a URL that does not answer within --gate-timeout fails", Strategy{GateURL: srv.URL + "/slow", GateTimeout: 200 * time.Millisecond}, false, "deadline"},
		{"an expression that holds passes", Strategy{GateProm: "up == 1", PromURL: srv.URL}, true, ""},
		{"an expression with no sample fails", Strategy{GateProm: "errors > 5", PromURL: srv.URL + "/"}, false, "does not hold"},
		{"an expression Prometheus refuses fails", Strategy{GateProm: "up ==", PromURL: srv.URL}, false, "400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, why := CheckGate(context.Background(), srv.Client(), tc.s)
			if ok != tc.ok || !strings.Contains(why, tc.why) {
				t.Errorf("CheckGate: %v %q, want %v with %q", ok, why, tc.ok, tc.why)
			}
		})
	}
}

// Decide asks the coordinator to run its own gate (and only its own)
// before a wave after the first.
func TestDecideCoordinatorGate(t *testing.T) {
	healthy := &Progress{State: HostHealthy}
	for _, tc := range []struct {
		name string
		s    Strategy
		want int
	}{
		{"--gate-url: the coordinator runs it before wave 2", Strategy{Canary: Count{N: 1}, GateURL: "http://x/"}, 1},
		{"--gate-cmd: a command runs it, not the coordinator", Strategy{Canary: Count{N: 1}, GateCmd: "true"}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, entries := fixture(tc.s, 3)
			d := Decide(r, GroupView{Progress: map[string]*Progress{"h1": healthy}, Admitted: map[string]bool{"h1": true}, Entries: entries}, "h1", t0)
			if d.Gate != tc.want || d.Summary.Phase.State != WaitingGate || len(d.Admit) != 0 {
				t.Errorf("gate %d phase %s admit %v, want gate %d, waiting-gate, nobody admitted", d.Gate, d.Summary.Phase.State, d.Admit, tc.want)
			}
		})
	}
}

// A reader's phase of a rollout waiting for its window is said as of the
// read: the countdown from the summary's time would be stale; a window
// open before the coordinator looked says so; a promote outside the
// window runs at once.
func TestViewPhaseOfAWindow(t *testing.T) {
	w, err := calendar.ParseWindow("*-*-* 01:00 UTC for 1h")
	if err != nil {
		t.Fatal(err)
	}
	r, entries := fixture(Strategy{Window: &w}, 3)
	d := Decide(r, GroupView{Entries: entries}, "h1", t0) // 00:16:40
	if d.Summary.Phase.State != WaitingWindow {
		t.Fatalf("decided %+v, want waiting-window", d.Summary.Phase)
	}
	for _, tc := range []struct {
		now  time.Time
		edit func(r *Record)
		want State
		says string
	}{
		{now: t0.Add(30 * time.Minute), want: WaitingWindow, says: "waiting for window Thu 01:00 UTC (in 13 min)"},
		{now: t0.Add(44 * time.Minute), want: WaitingWindow, says: "its window is open until 02:00 UTC: hosts are admitted at the coordinator's next look"},
		{now: t0.Add(30 * time.Minute), edit: func(r *Record) { r.OutsideWindow = true }, want: Running},
	} {
		rr := *r
		if tc.edit != nil {
			tc.edit(&rr)
		}
		ph := View{Record: &rr, Summary: &d.Summary, Entries: entries, Now: tc.now}.Phase()
		if ph.State != tc.want || !strings.Contains(ph.Reason, tc.says) {
			t.Errorf("at %s: phase %s (%s), want %s saying %q", tc.now.UTC().Format(time.TimeOnly), ph.State, ph.Reason, tc.want, tc.says)
		}
	}
}
