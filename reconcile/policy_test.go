package reconcile

import (
	"strings"
	"testing"
	"time"
)

const policySvc = "[Unit]\nDescription=hello\n[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"

// longLine is a line go-systemd's parser refuses (over 2048 bytes) and
// systemd loads; commentInContinuation is the other such input.
var (
	longLine              = "Environment=BIG=" + strings.Repeat("x", 3000) + "\n"
	commentInContinuation = "ExecStart=/bin/sleep \\\n# the duration\n  1000\n"
)

// policyCase is one row of a ParsePolicy table: the policy it gives, or an
// error of the [X-Agentd] section containing errLike.
type policyCase struct {
	name    string
	content string
	want    Policy
	errLike string // "" for no error
}

func checkPolicyCases(t *testing.T, cases []policyCase) {
	t.Helper()
	for _, tc := range cases {
		p, err := ParsePolicy([]byte(tc.content))
		if tc.errLike != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errLike) || !strings.HasPrefix(err.Error(), "[X-Agentd]") {
				t.Errorf("%s: %+v %v, want an error with %q", tc.name, p, err, tc.errLike)
			}
			continue
		}
		if err != nil || p != tc.want {
			t.Errorf("%s: %+v %v\n want %+v", tc.name, p, err, tc.want)
		}
	}
}

func TestParsePolicyTable(t *testing.T) {
	def := Policy{State: StateStarted, OnChange: "auto", Rollback: true, Healthy: 5 * time.Second}
	healthy := func(d time.Duration) Policy { p := def; p.Healthy = d; return p }
	confirm := func(d time.Duration) Policy { p := def; p.Confirm = d; return p }
	withInstall := def
	withInstall.HasInstall, withInstall.Enable = true, true
	checkPolicyCases(t, []policyCase{
		{name: "empty", content: "", want: def},
		{name: "no policy", content: policySvc, want: def},
		{name: "install with a key", content: policySvc + "[Install]\nWantedBy=default.target\n", want: withInstall},
		{name: "install with an empty key", content: policySvc + "[Install]\nWantedBy=\n", want: withInstall},
		{name: "install without keys", content: policySvc + "[Install]\n# nothing\n", want: def},
		{name: "install last and empty", content: "[Install]\n[Service]\nExecStart=/bin/true\n", want: def},
		{name: "present does not enable", content: policySvc + "[Install]\nWantedBy=default.target\n[X-Agentd]\nState=present\n",
			want: Policy{State: StatePresent, OnChange: "auto", Rollback: true, Healthy: 5 * time.Second, HasInstall: true}},
		{name: "stopped does not enable", content: policySvc + "[Install]\nWantedBy=default.target\n[X-Agentd]\nState=stopped\n",
			want: Policy{State: StateStopped, OnChange: "auto", Rollback: true, Healthy: 5 * time.Second, HasInstall: true}},
		{name: "enable without install", content: policySvc + "[X-Agentd]\nEnable=yes\n",
			want: Policy{State: StateStarted, Enable: true, OnChange: "auto", Rollback: true, Healthy: 5 * time.Second}},
		{name: "explicit", content: "[X-Agentd]\n# comment\n; other comment\nState = stopped\nEnable=no\nOnChange=reload\nRollback=no\nHealthySec=2\nMaxUnavailable=3\n",
			want: Policy{State: StateStopped, OnChange: "reload", Healthy: 2 * time.Second, SlotLimit: 3}},
		{name: "booleans", content: "[X-Agentd]\nEnable=TRUE\nRollback=off\n",
			want: Policy{State: StateStarted, Enable: true, OnChange: "auto", Healthy: 5 * time.Second}},
		{name: "CRLF", content: "[Install]\r\nWantedBy=multi-user.target\r\n[X-Agentd]\r\nOnChange=none\r\nHealthySec=0\r\n",
			want: Policy{State: StateStarted, Enable: true, OnChange: "none", Rollback: true, Healthy: 0 * time.Second, HasInstall: true}},
		{name: "continued value", content: "[X-Agentd]\nOnChange=\\\n  reload-or-restart\n",
			want: Policy{State: StateStarted, OnChange: "reload-or-restart", Rollback: true, Healthy: 5 * time.Second}},
		{name: "last key wins", content: "[X-Agentd]\nHealthySec=1\n[X-Agentd]\nHealthySec=9\n",
			want: Policy{State: StateStarted, OnChange: "auto", Rollback: true, Healthy: 9 * time.Second}},
		{name: "other X- section ignored", content: policySvc + "[X-Other]\nFoo=bar\n", want: def},
		{name: "keys are case-sensitive", content: "[X-Agentd]\nstate=stopped\n", errLike: "unknown key state="},

		{name: "bad State", content: "[X-Agentd]\nState=run\n", errLike: "bad State=run"},
		{name: "bad Enable", content: "[X-Agentd]\nEnable=maybe\n", errLike: "not a boolean"},
		{name: "bad Rollback", content: "[X-Agentd]\nRollback=sometimes\n", errLike: "not a boolean"},
		{name: "bad OnChange", content: "[X-Agentd]\nOnChange=bounce\n", errLike: "bad OnChange=bounce"},
		{name: "negative HealthySec", content: "[X-Agentd]\nHealthySec=-1\n", errLike: "bad HealthySec=-1"},
		{name: "HealthySec 2s", content: "[X-Agentd]\nHealthySec=2s\n", want: healthy(2 * time.Second)},
		{name: "HealthySec 500ms", content: "[X-Agentd]\nHealthySec=500ms\n", want: healthy(500 * time.Millisecond)},
		{name: "HealthySec 1.5", content: "[X-Agentd]\nHealthySec=1.5\n", want: healthy(1500 * time.Millisecond)},
		{name: "HealthySec 1min 30s", content: "[X-Agentd]\nHealthySec=1min 30s\n", want: healthy(90 * time.Second)},
		{name: "HealthySec 1h", content: "[X-Agentd]\nHealthySec = 1h \n", want: healthy(time.Hour)},
		{name: "HealthySec infinity", content: "[X-Agentd]\nHealthySec=infinity\n", errLike: "bad HealthySec=infinity: a unit would never count as healthy"},
		{name: "HealthySec bad unit", content: "[X-Agentd]\nHealthySec=5x\n", errLike: `bad HealthySec=5x: want a time span such as 30s`},
		{name: "HealthySec empty", content: "[X-Agentd]\nHealthySec=\n", errLike: "bad HealthySec=: want a time span"},
		{name: "HealthySec 1,5", content: "[X-Agentd]\nHealthySec=1,5\n", errLike: "bad HealthySec=1,5"},
		{name: "ConfirmSec 2s", content: "[X-Agentd]\nConfirmSec=2s\n", want: confirm(2 * time.Second)},
		{name: "ConfirmSec 1min 30s", content: "[X-Agentd]\nConfirmSec = 1min 30s\n", want: confirm(90 * time.Second)},
		{name: "ConfirmSec 30 (seconds)", content: "[X-Agentd]\nConfirmSec=30\n", want: confirm(30 * time.Second)},
		{name: "ConfirmSec 0 is off", content: "[X-Agentd]\nConfirmSec=0\n", want: def},
		{name: "ConfirmSec infinity", content: "[X-Agentd]\nConfirmSec=infinity\n", errLike: "bad ConfirmSec=infinity: give a finite span"},
		{name: "ConfirmSec bad unit", content: "[X-Agentd]\nConfirmSec=5x\n", errLike: "bad ConfirmSec=5x: want a time span"},
		{name: "ConfirmSec empty", content: "[X-Agentd]\nConfirmSec=\n", errLike: "bad ConfirmSec=: want a time span"},
		{name: "ConfirmSec on a stopped unit", content: "[X-Agentd]\nConfirmSec=5s\nState=stopped\n", errLike: "ConfirmSec= needs State=started"},
		{name: "ConfirmSec=0 on a present unit", content: "[X-Agentd]\nConfirmSec=0\nState=present\n",
			want: Policy{State: StatePresent, OnChange: "auto", Rollback: true, Healthy: 5 * time.Second}},
		{name: "MaxUnavailable 0", content: "[X-Agentd]\nMaxUnavailable=0\n", errLike: "bad MaxUnavailable=0"},
		{name: "unknown key", content: "[X-Agentd]\nFoo=1\n", errLike: "unknown key Foo="},
		{name: "all errors listed", content: "[X-Agentd]\nStat=stopped\nOnChange=bounce\n", errLike: "unknown key Stat= (known: State, Enable, OnChange, Rollback, HealthySec, ConfirmSec, MaxUnavailable, MaxUnavailableBy, RestartTriggers, ReloadTriggers, HealthCmd, HealthURL, HealthURLStatus, HealthTCP, HealthIntervalSec, HealthTimeoutSec, HealthRetries); bad OnChange=bounce"},

		// go-systemd refuses these; systemd loads them.
		{name: "long line, no policy", content: policySvc + longLine, want: def},
		{name: "long line, install", content: policySvc + longLine + "[Install]\nWantedBy=default.target\n", want: withInstall},
		{name: "long line, install comment only", content: policySvc + longLine + "[Install]\n# WantedBy=default.target\n\n[Socket]\nA=b\n", want: def},
		{name: "comment in continuation, no policy", content: "[Service]\n" + commentInContinuation, want: def},
		{name: "comment in continuation, install", content: "[Service]\n" + commentInContinuation + "[Install]\r\n  WantedBy=default.target\r\n", want: withInstall},
		{name: "line without =, no policy", content: policySvc + "oops\n", want: def},
		{name: "x-agentd mentioned in a comment only", content: policySvc + "# [X-Agentd]\n" + longLine, want: def},
		{name: "long line, policy", content: policySvc + longLine + "[X-Agentd]\nState=stopped\n", errLike: "[X-Agentd]: the section could not be read: the unit file parser stopped with \"line too long (max 2048 bytes)\""},
		{name: "long line in the policy section", content: "[X-Agentd]\nState=stopped\n" + longLine, errLike: "could not be read"},
		{name: "comment in continuation, policy", content: "[X-Agentd]\nState=stopped\n[Service]\n" + commentInContinuation, errLike: "could not be read"},
		{name: "indented policy header", content: policySvc + commentInContinuation + "  [X-Agentd]  \nState=stopped\n", errLike: "could not be read"},
	})
}

// The fallback paths exist because go-systemd fails where systemd does not;
// if a new go-systemd version reads these, the fallback tests above no
// longer cover anything.
func TestUnitOptionsRefusesWhatSystemdLoads(t *testing.T) {
	for name, content := range map[string]string{
		"long line":               "[Service]\n" + longLine,
		"comment in continuation": "[Service]\n" + commentInContinuation,
		"line without =":          "[Service]\noops\n",
	} {
		if _, err := unitOptions([]byte(content)); err == nil {
			t.Errorf("%s: parsed, want go-systemd's error", name)
		}
	}
}

func TestIniEntries(t *testing.T) {
	got := func(content string) string {
		var b strings.Builder
		for _, e := range iniEntries([]byte(content)) {
			b.WriteString("[" + e.sec + "]" + e.key + "=" + e.val + "|")
		}
		return b.String()
	}
	for _, tc := range []struct{ name, content, want string }{
		{"empty", "", ""},
		{"plain", "[Unit]\nDescription = hi there \n\n# c\n; c\n[Socket]\nListenStream=80\nService=web.service\n",
			"[Unit]Description=hi there|[Socket]ListenStream=80|[Socket]Service=web.service|"},
		{"repeated and reset", "[Service]\nExecStart=\nExecStart=/bin/a\n", "[Service]ExecStart=|[Service]ExecStart=/bin/a|"},
		{"continuation joined as systemd does", "[Service]\nExecStart=/bin/a \\\n    --b \\\n  --c\nType=exec\n",
			"[Service]ExecStart=/bin/a  --b  --c|[Service]Type=exec|"},
		{"comment ends a continuation", "[Service]\nExecStart=/bin/a \\\n#c\nType=exec\n", "[Service]ExecStart=/bin/a|[Service]Type=exec|"},
		{"backslash at end of file", "[Socket]\nService=web.service \\", "[Socket]Service=web.service|"},
		{"CRLF", "[Socket]\r\nService=web.service\r\n", "[Socket]Service=web.service|"},
		{"before a section", "Service=x.service\n[Socket]\nService=y.service\n", "[Socket]Service=y.service|"},
		// On a parse failure, what was read before it.
		{"long line", "[Socket]\nService=web.service\n" + longLine, "[Socket]Service=web.service|"},
	} {
		if g := got(tc.content); g != tc.want {
			t.Errorf("%s: %q\n want %q", tc.name, g, tc.want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy([]byte(svc))
	if err != nil || p.State != StateStarted || p.Enable || !p.Rollback || p.Healthy != 5*time.Second || p.OnChange != "auto" {
		t.Fatalf("defaults: %+v %v", p, err)
	}
	p, _ = ParsePolicy([]byte(svc + "[Install]\nWantedBy=default.target\n"))
	if !p.Enable || !p.HasInstall {
		t.Fatalf("enable default with [Install]: %+v", p)
	}
	p, _ = ParsePolicy([]byte(svc + "[Install]\nWantedBy=default.target\n[X-Agentd]\nState=present\n"))
	if p.Enable {
		t.Fatalf("State=present must not enable by default: %+v", p)
	}
	p, err = ParsePolicy([]byte("[X-Agentd]\n# comment\nState = stopped\nEnable=no\nOnChange=reload\nRollback=no\nHealthySec=2\nMaxUnavailable=3\n"))
	if err != nil || p.State != StateStopped || p.Enable || p.OnChange != "reload" || p.Rollback || p.Healthy != 2*time.Second || p.SlotLimit != 3 {
		t.Fatalf("explicit: %+v %v", p, err)
	}
	for _, bad := range []string{"State=run", "Enable=maybe", "OnChange=bounce", "HealthySec=-1", "MaxUnavailable=0", "Foo=1"} {
		if _, err := ParsePolicy([]byte("[X-Agentd]\n" + bad + "\n")); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
