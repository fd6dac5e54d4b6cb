package reconcile

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParsePolicyProbes(t *testing.T) {
	const svc = "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"
	def := Policy{State: StateStarted, OnChange: "auto", Rollback: true, Healthy: DefaultHealthy}
	with := func(p Probes) Policy { d := def; d.Probe = p; return d }
	checkPolicyCases(t, []policyCase{
		{name: "url", content: "[X-Agentd]\nHealthURL=http://127.0.0.1:8080/healthz\n",
			want: with(Probes{URL: "http://127.0.0.1:8080/healthz"})},
		{name: "https with status code", content: "[X-Agentd]\nHealthURL=https://[::1]:8443/\nHealthURLStatus=204\n",
			want: with(Probes{URL: "https://[::1]:8443/", Status: "204"})},
		{name: "status class", content: "[X-Agentd]\nHealthURL=http://x/\nHealthURLStatus=3xx\n", want: with(Probes{URL: "http://x/", Status: "3xx"})},
		{name: "tcp", content: "[X-Agentd]\nHealthTCP=127.0.0.1:5432\n", want: with(Probes{TCP: "127.0.0.1:5432"})},
		{name: "cmd runs as the service's user", content: svc + "User=www-data\nGroup=web\n[X-Agentd]\nHealthCmd=/usr/bin/check --fast\n",
			want: with(Probes{Cmd: "/usr/bin/check --fast", User: "www-data", Group: "web"})},
		{name: "user without cmd is not kept", content: svc + "User=www-data\n[X-Agentd]\nHealthTCP=:80\n", want: with(Probes{TCP: ":80"})},
		{name: "all three and timings", content: "[X-Agentd]\nHealthCmd=check\nHealthURL=http://a/\nHealthTCP=a:1\nHealthIntervalSec=500ms\nHealthTimeoutSec=2\nHealthRetries=5\n",
			want: with(Probes{Cmd: "check", URL: "http://a/", TCP: "a:1", Interval: 500 * time.Millisecond, Timeout: 2 * time.Second, Retries: 5})},
		{name: "empty resets", content: "[X-Agentd]\nHealthURL=http://a/\nHealthURL=\nHealthTCP=a:1\n", want: with(Probes{TCP: "a:1"})},
		{name: "probes with HealthySec=0", content: "[X-Agentd]\nHealthySec=0\nHealthTCP=a:1\n",
			want: Policy{State: StateStarted, OnChange: "auto", Rollback: true, Probe: Probes{TCP: "a:1"}}},

		// Bad input: refused at put time by the same parser.
		{name: "url not http", content: "[X-Agentd]\nHealthURL=ftp://a/x\n", errLike: "bad HealthURL=ftp://a/x: want an http:// or https:// URL"},
		{name: "url without scheme", content: "[X-Agentd]\nHealthURL=127.0.0.1:80/x\n", errLike: "bad HealthURL=127.0.0.1:80/x"},
		{name: "url without host", content: "[X-Agentd]\nHealthURL=http:///x\n", errLike: "the URL has no host"},
		{name: "unknown Health key", content: "[X-Agentd]\nHealthUrl=http://a/\n",
			errLike: "unknown key HealthUrl= (the health keys are HealthySec and the probes' HealthCmd, HealthURL, HealthURLStatus, HealthTCP, HealthIntervalSec, HealthTimeoutSec, HealthRetries)"},
		{name: "unknown Health key 2", content: "[X-Agentd]\nHealthCheck=/bin/true\n", errLike: "unknown key HealthCheck="},
		{name: "bad status", content: "[X-Agentd]\nHealthURL=http://a/\nHealthURLStatus=2x\n", errLike: "bad HealthURLStatus=2x: want a status code such as 200 or a class such as 2xx"},
		{name: "status out of range", content: "[X-Agentd]\nHealthURL=http://a/\nHealthURLStatus=600\n", errLike: "bad HealthURLStatus=600"},
		{name: "status without url", content: "[X-Agentd]\nHealthTCP=a:1\nHealthURLStatus=200\n", errLike: "HealthURLStatus= without HealthURL="},
		{name: "tcp without port", content: "[X-Agentd]\nHealthTCP=localhost\n", errLike: "bad HealthTCP=localhost: want host:port"},
		{name: "tcp bad port", content: "[X-Agentd]\nHealthTCP=a:99999\n", errLike: "want a port number from 1 to 65535"},
		{name: "negative interval", content: "[X-Agentd]\nHealthTCP=a:1\nHealthIntervalSec=-1\n", errLike: "bad HealthIntervalSec=-1: want a time span"},
		{name: "unparsable timeout", content: "[X-Agentd]\nHealthTCP=a:1\nHealthTimeoutSec=fast\n", errLike: "bad HealthTimeoutSec=fast: want a time span"},
		{name: "zero timeout", content: "[X-Agentd]\nHealthTCP=a:1\nHealthTimeoutSec=0\n", errLike: "bad HealthTimeoutSec=0: want a time span above 0"},
		{name: "infinite interval", content: "[X-Agentd]\nHealthTCP=a:1\nHealthIntervalSec=infinity\n", errLike: "bad HealthIntervalSec=infinity: want a finite time span"},
		{name: "retries 0", content: "[X-Agentd]\nHealthTCP=a:1\nHealthRetries=0\n", errLike: "bad HealthRetries=0: want an integer ≥ 1"},
		{name: "timing without probe", content: "[X-Agentd]\nHealthIntervalSec=2\n", errLike: "HealthIntervalSec= is set but there is no probe to time"},
		{name: "cmd unterminated quote", content: "[X-Agentd]\nHealthCmd=/bin/sh -c 'exit 1\n", errLike: "bad HealthCmd=/bin/sh -c 'exit 1: unterminated ' quote"},
		{name: "cmd relative path", content: "[X-Agentd]\nHealthCmd=./check\n", errLike: "must be an absolute path or a name found in PATH"},
		{name: "probes on a stopped unit", content: "[X-Agentd]\nState=stopped\nHealthTCP=a:1\n", errLike: "health probes need State=started"},
	})
}

// A drop-in's User= is whom HealthCmd= runs as, as systemd would run the
// service.
func TestDesireProbeUserFromDropIns(t *testing.T) {
	u := Desire(Snapshot{Entries: []Entry{
		{Unit: "web.service", Value: []byte("[Service]\nExecStart=/bin/web\nUser=a\n[X-Agentd]\nHealthCmd=check\n")},
		{Unit: "web.service.d/user.conf", Value: []byte("[Service]\nUser=b\nGroup=g\n")},
	}})["web.service"]
	if u.Err != nil || u.Policy.Probe.User != "b" || u.Policy.Probe.Group != "g" {
		t.Fatalf("policy %+v, err %v: want User=b Group=g from the drop-in", u.Policy.Probe, u.Err)
	}
}

func TestSplitCommand(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		errLike string
	}{
		{in: "/bin/true", want: []string{"/bin/true"}},
		{in: "  curl  -fsS\thttp://x/ ", want: []string{"curl", "-fsS", "http://x/"}},
		{in: `/bin/sh -c 'test -f /run/x && exit 0'`, want: []string{"/bin/sh", "-c", "test -f /run/x && exit 0"}},
		{in: `/bin/echo "a b" 'c"d' e\ f`, want: []string{"/bin/echo", "a b", `c"d`, "e f"}},
		{in: `/bin/echo ""`, want: []string{"/bin/echo", ""}},
		{in: `/bin/echo a"b c"d`, want: []string{"/bin/echo", "ab cd"}},
		{in: `/bin/printf 'x\ty'`, want: []string{"/bin/printf", "x\ty"}},
		{in: `/bin/echo $HOME | cat`, want: []string{"/bin/echo", "$HOME", "|", "cat"}}, // no shell
		{in: "", errLike: "empty command line"},
		{in: "   ", errLike: "empty command line"},
		{in: `/bin/sh -c "x`, errLike: `unterminated " quote`},
		{in: `/bin/echo \`, errLike: "ends with a backslash"},
		{in: `bin/check`, errLike: "must be an absolute path"},
	} {
		got, err := SplitCommand(tc.in)
		if tc.errLike != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errLike) {
				t.Errorf("%q: %q %v, want error %q", tc.in, got, err, tc.errLike)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q %v, want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestStatusWanted(t *testing.T) {
	for _, tc := range []struct {
		code int
		want string
		ok   bool
	}{
		{200, "", true}, {204, "", true}, {299, "", true}, {301, "", false}, {500, "", false}, {199, "", false},
		{200, "2xx", true}, {503, "5xx", true}, {503, "5XX", true}, {404, "4xx", true}, {404, "5xx", false},
		{204, "204", true}, {200, "204", false}, {0, "2xx", false},
	} {
		if got := StatusWanted(tc.code, tc.want); got != tc.ok {
			t.Errorf("StatusWanted(%d, %q) = %v", tc.code, tc.want, got)
		}
	}
}

func TestExpandSpecifiers(t *testing.T) {
	for _, tc := range []struct{ in, unit, want, errLike string }{
		{in: "www-data", unit: "web.service", want: "www-data"},
		{in: "app-%i", unit: "app@blue.service", want: "app-blue"},
		{in: "%p", unit: "app@blue.service", want: "app"},
		{in: "%p", unit: "web.service", want: "web"},
		{in: "%n", unit: "web.service", want: "web.service"},
		{in: "100%%", unit: "web.service", want: "100%"},
		{in: "%u", unit: "web.service", errLike: "does not expand the specifier %u"},
		{in: "x%", unit: "web.service", errLike: "ends with %"},
	} {
		got, err := expandSpecifiers(tc.in, tc.unit)
		if tc.errLike != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errLike) {
				t.Errorf("%q on %s: %q %v, want error %q", tc.in, tc.unit, got, err, tc.errLike)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q on %s: %q %v, want %q", tc.in, tc.unit, got, err, tc.want)
		}
	}
}

func TestProbeStateAfterAndText(t *testing.T) {
	pass := CheckResult{Check: ProbeCheck{ProbeURL, "http://a/"}, OK: true, Text: "HealthURL http://a/: 200"}
	fail := CheckResult{Check: ProbeCheck{ProbeURL, "http://a/"}, Text: "HealthURL http://a/: 500 (want 2xx)"}
	tcp := CheckResult{Check: ProbeCheck{ProbeTCP, "a:1"}, OK: true, Text: "HealthTCP a:1: connected"}
	var s ProbeState
	if s.Text(3) != "" || s.Passing() || s.Failing(3) {
		t.Fatalf("before any round: %+v %q", s, s.Text(3))
	}
	steps := []struct {
		round   []CheckResult
		text    string
		passing bool
		failing bool
	}{
		{[]CheckResult{fail}, "HealthURL http://a/: 500 (want 2xx), 1 failure in a row (HealthRetries=3)", false, false},
		{[]CheckResult{fail}, "HealthURL http://a/: 500 (want 2xx), 2 failures in a row (HealthRetries=3)", false, false},
		{[]CheckResult{pass, tcp}, "HealthURL http://a/: 200; HealthTCP a:1: connected", true, false},
		{[]CheckResult{fail}, "HealthURL http://a/: 500 (want 2xx), 1 failure in a row (HealthRetries=3)", false, false},
		{[]CheckResult{fail}, "HealthURL http://a/: 500 (want 2xx), 2 failures in a row (HealthRetries=3)", false, false},
		{[]CheckResult{fail}, "HealthURL http://a/: 500 (want 2xx), 3 failures in a row (HealthRetries=3)", false, true},
		// Counted up to HealthRetries: the text stops changing.
		{[]CheckResult{fail}, "HealthURL http://a/: 500 (want 2xx), 3 failures in a row (HealthRetries=3)", false, true},
		{[]CheckResult{pass}, "HealthURL http://a/: 200", true, false},
	}
	for i, st := range steps {
		s = s.after(st.round)
		if got := s.Text(3); got != st.text || s.Passing() != st.passing || s.Failing(3) != st.failing {
			t.Errorf("round %d: %q passing=%v failing=%v, want %q %v %v", i+1, got, s.Passing(), s.Failing(3), st.text, st.passing, st.failing)
		}
	}
}

// fakeProber answers from fields; Command hangs until ctx ends when hang.
type fakeProber struct {
	code int
	err  error
	hang bool
}

func (f fakeProber) Command(ctx context.Context, c ProbeCommand) error {
	if f.hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return f.err
}
func (f fakeProber) HTTP(context.Context, string) (int, error) { return f.code, f.err }
func (f fakeProber) TCP(context.Context, string) error         { return f.err }

func TestProbeRound(t *testing.T) {
	refused := errors.New("connect: connection refused")
	for _, tc := range []struct {
		name   string
		spec   Probes
		prober fakeProber
		want   []string // each check's text, "+" prefixed when it passed
	}{
		{"url passes", Probes{URL: "http://a/"}, fakeProber{code: 200}, []string{"+HealthURL http://a/: 200"}},
		{"url 500", Probes{URL: "http://a/"}, fakeProber{code: 500}, []string{"HealthURL http://a/: 500 (want 2xx)"}},
		{"url wants 204", Probes{URL: "http://a/", Status: "204"}, fakeProber{code: 200}, []string{"HealthURL http://a/: 200 (want 204)"}},
		{"url refused", Probes{URL: "http://a/"}, fakeProber{err: refused}, []string{"HealthURL http://a/: connect: connection refused"}},
		{"tcp", Probes{TCP: "a:1"}, fakeProber{}, []string{"+HealthTCP a:1: connected"}},
		{"cmd exit 1", Probes{Cmd: "/bin/check"}, fakeProber{err: errors.New("exit status 1: not ready")}, []string{"HealthCmd /bin/check: exit status 1: not ready"}},
		{"cmd hangs", Probes{Cmd: "/bin/sleep 100", Timeout: 20 * time.Millisecond}, fakeProber{hang: true},
			[]string{"HealthCmd /bin/sleep 100: no answer within HealthTimeoutSec=20ms"}},
		{"cmd bad user specifier", Probes{Cmd: "/bin/true", User: "%u"}, fakeProber{},
			[]string{`HealthCmd /bin/true: "%u": the agent does not expand the specifier %u (only %i, %n, %p and %%)`}},
		{"stops at the first failure", Probes{Cmd: "/bin/check", URL: "http://a/", TCP: "a:1"}, fakeProber{code: 200, err: refused},
			[]string{"HealthCmd /bin/check: connect: connection refused"}},
		{"all pass, in order", Probes{Cmd: "/bin/check", URL: "http://a/", TCP: "a:1"}, fakeProber{code: 200},
			[]string{"+HealthCmd /bin/check: exit 0", "+HealthURL http://a/: 200", "+HealthTCP a:1: connected"}},
	} {
		var got []string
		for _, r := range probeRound(context.Background(), tc.prober, "web.service", tc.spec) {
			s := r.Text
			if r.OK {
				s = "+" + s
			}
			got = append(got, s)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q\n want %q", tc.name, got, tc.want)
		}
	}
}

// The probes a unit runs are those of the version it runs: the desired
// one's policy once it runs it, else the old version's own files (after a
// rollback, or while a change waits).
func TestProbeSpecOf(t *testing.T) {
	withURL := []byte("[Service]\nExecStart=/bin/web\n[X-Agentd]\nHealthURL=http://a/old\n")
	plain := []byte("[Service]\nExecStart=/bin/web\n")
	cmdTmpl := []byte("[Service]\nExecStart=/bin/web %i\nUser=app-%i\n[X-Agentd]\nHealthCmd=check\n")
	newPolicy := Policy{State: StateStarted, Probe: Probes{URL: "http://a/new"}}
	act := Action{Unit: "web.service", ContentKey: "web.service=new;", Policy: newPolicy}
	blobs := map[string][]byte{"old": withURL, "plain": plain, "tmpl": cmdTmpl}
	for _, tc := range []struct {
		name    string
		act     Action
		applied map[string]string
		want    Probes
		key     string
	}{
		{"nothing runs", act, nil, Probes{}, ""},
		{"runs the desired version", act, map[string]string{"web.service": "new"}, newPolicy.Probe, "web.service=new;"},
		{"runs an older version with probes", act, map[string]string{"web.service": "old"}, Probes{URL: "http://a/old"}, "web.service=old;"},
		{"runs an older version without", act, map[string]string{"web.service": "plain"}, Probes{}, "web.service=plain;"},
		{"an older version not kept", act, map[string]string{"web.service": "gone"}, Probes{}, "web.service=gone;"},
		{"an instance runs its template's", Action{Unit: "app@1.service", ContentKey: "x"}, map[string]string{"app@.service": "tmpl"},
			Probes{Cmd: "check", User: "app-%i"}, "app@.service=tmpl;"},
	} {
		got, key := probeSpecOf(tc.act, tc.applied, blobs)
		if got != tc.want || key != tc.key {
			t.Errorf("%s: %+v %q, want %+v %q", tc.name, got, key, tc.want, tc.key)
		}
	}
}
