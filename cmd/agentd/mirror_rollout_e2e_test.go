package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentd/agentd/rollout"
)

// verdictSink is a --notify-url: it answers 500 to the first POST, then
// 200, and keeps each verdict it took.
type verdictSink struct {
	mu       sync.Mutex
	posts    int
	verdicts []commitVerdict
	srv      *httptest.Server
}

func newVerdictSink(t *testing.T) *verdictSink {
	s := &verdictSink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.posts++
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("notify: %s with Content-Type %q", r.Method, r.Header.Get("Content-Type"))
		}
		if s.posts == 1 {
			http.Error(w, "not now", http.StatusInternalServerError)
			return
		}
		var v commitVerdict
		if err := json.Unmarshal(b, &v); err != nil {
			t.Errorf("notify: %v: %s", err, b)
		}
		t.Logf("notify: %s", b)
		s.verdicts = append(s.verdicts, v)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// verdict waits for the verdict of commit.
func (s *verdictSink) verdict(t *testing.T, commit string, within time.Duration) commitVerdict {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s.mu.Lock()
		i := slices.IndexFunc(s.verdicts, func(v commitVerdict) bool { return v.Commit == commit })
		var v commitVerdict
		if i >= 0 {
			v = s.verdicts[i]
		}
		s.mu.Unlock()
		if i >= 0 {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("no verdict for %s within %v", short(commit), within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A commit to a group with groups/web/rollout.toml is a rollout: three
// hosts take it wave by wave (2, then 3), `mirror status` shows it, and
// --notify-url hears "done" once it ended. The commit before, without a
// rollout, is "applied" at once; its POST is retried after a 500.
func TestMirrorE2EGroupRollout(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 3, "")
	sink := newVerdictSink(t)
	g := newGitRepo(t)
	key, line := g.key("alice@example.com")
	policy := "HealthySec=0.5"
	v1 := f.unit("/bin/sleep 1000", policy)
	g.write("groups/web/app.service", v1)
	c1 := g.commit(key, "app on web")
	startMirror(t, f.endpoint, g, g.signers(line), func(o *mirrorOptions) { o.notifyURL = sink.srv.URL })
	waitMirror(t, f.reg, "the first commit is mirrored", atCommit(c1))
	if v := sink.verdict(t, c1, 20*time.Second); v.Verdict != verdictApplied || len(v.Rollouts) != 0 ||
		v.Mirror != "default" || v.Repo != g.url() || v.Branch != "main" || v.Subject != "app on web" ||
		!strings.HasPrefix(v.Signer, "alice@example.com") || v.At.IsZero() {
		t.Errorf("verdict of the first commit %+v: want applied, no rollouts", v)
	}
	f.waitRolledOut(v1, 30*time.Second)
	clearEvents(f)

	v2 := f.unit("/bin/sleep 1001", policy)
	g.write("groups/web/app.service", v2)
	g.write("groups/web/rollout.toml", "# staged\nwaves = [\"50%\", \"100%\"]\nsoak = \"0s\"\n")
	c2 := g.commit(key, "app v2, in waves")
	if out, code := mirrorCLI(t, f.endpoint, "mirror", "sync"); code != 0 {
		t.Fatalf("mirror sync: exit %d\n%s", code, out)
	}
	st := waitMirror(t, f.reg, "the second commit is mirrored", atCommit(c2))
	if len(st.Rollouts) != 1 || st.Rollouts[0].Group != "web" {
		t.Fatalf("state's rollouts %+v: want one of group web", st.Rollouts)
	}
	id := st.Rollouts[0].ID
	out, code := mirrorCLI(t, f.endpoint, "mirror", "status")
	if code != 0 || !strings.Contains(out, "rollouts:    "+id+" (group web): ") {
		t.Errorf("mirror status: exit %d, want rollout %s\n%s", code, id, out)
	}
	v := f.waitRollout(id, 60*time.Second, "done", func(v rollout.View, ph rollout.Phase) bool { return ph.State.Ended() })
	r := v.Record
	if v.Phase().State != rollout.Done || !slices.Equal(r.WaveEnds, []int{2, 3}) || !slices.Equal(r.Hosts, []string{"h1", "h2", "h3"}) {
		t.Fatalf("rollout %s: %s, waves %v of %v; want done, [2 3] of h1..h3", id, describeRollout(v), r.WaveEnds, r.Hosts)
	}
	if !strings.HasPrefix(r.By, "git "+c2[:12]) || r.Reason != "app v2, in waves" {
		t.Errorf("rollout by %q, reason %q", r.By, r.Reason)
	}
	f.waitRolledOut(v2, 30*time.Second)
	checkWaveOrder(t, r, f.readEvents(), 0.5, 0)

	got := sink.verdict(t, c2, 20*time.Second)
	want := []verdictRollout{{ID: id, Group: "web", Phase: "done"}}
	if got.Verdict != verdictDone || !slices.EqualFunc(got.Rollouts, want, func(a, b verdictRollout) bool {
		return a.ID == b.ID && a.Group == b.Group && a.Phase == b.Phase
	}) {
		t.Errorf("verdict of the second commit %+v: want done with %+v", got, want)
	}
	out, _ = mirrorCLI(t, f.endpoint, "mirror", "status", "--json")
	var ms mirrorStatus
	if err := json.Unmarshal([]byte(out), &ms); err != nil || len(ms.Rollouts) != 1 || ms.Rollouts[0].Phase != "done" || ms.Rollouts[0].Wave != 2 {
		t.Errorf("mirror status --json: rollouts %+v (%v)", ms.Rollouts, err)
	}
}
