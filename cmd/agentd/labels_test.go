package main

import (
	"encoding/json"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentd/agentd/internal/citest"
	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/registry/registrytest"
)

// Issue 38, item 1: agents publish labels, given and read off the host;
// `agentd hosts --selector` lists exactly the hosts that match.
func TestHostsSelectorPicksLabelledAgents(t *testing.T) {
	t.Parallel() // its own systemds and etcd: waits on them, not the CPU
	endpoint := registrytest.StartEtcd(t).Endpoint()
	reg := registrytest.NewClient(t, endpoint)
	agents := map[string]*env{}
	for _, a := range []struct {
		host   string
		groups []string
		labels []string
	}{
		{"h1", []string{"web"}, []string{"env=prod", "rack=r12"}},
		{"h2", []string{"db"}, []string{"env=prod", "rack=r13", "example.com/tier=db"}},
		{"h3", []string{"web"}, []string{"env=staging", "rack=r12", "drain="}},
	} {
		e := &env{t: t, h: systemdtest.Start(t), endpoint: endpoint, reg: reg, host: a.host, groups: a.groups, quiet: true}
		e.startAgentOn([]string{endpoint}, func(o *runOptions) { o.labels = a.labels })
		agents[a.host] = e
	}
	e := agents["h1"]

	osID, osVersion := osReleaseField(t, "ID"), osReleaseField(t, "VERSION_ID")
	arch := map[string]string{"386": "i386"}[runtime.GOARCH]
	if arch == "" {
		arch = runtime.GOARCH
	}
	hosts := func(args ...string) []hostRow {
		t.Helper()
		out, code := e.cli(append([]string{"hosts", "--json"}, args...)...)
		var rows []hostRow
		if code != 0 || json.Unmarshal([]byte(out), &rows) != nil {
			t.Fatalf("hosts --json %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
		return rows
	}
	names := func(rows []hostRow) string {
		var hs []string
		for _, r := range rows {
			hs = append(hs, r.Host)
		}
		return strings.Join(hs, " ")
	}
	// An agent joins the registry once it runs: wait for the three.
	eventually(t, "the three agents joined", func() bool {
		known, err := reg.KnownHosts(t.Context())
		return err == nil && len(known) == 3
	})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "h1 h2 h3"},
		{[]string{"--selector", "env=prod"}, "h1 h2"},
		{[]string{"--selector", "env == prod , rack=r12"}, "h1"},
		{[]string{"--selector", "rack in (r12, r13),env!=prod"}, "h3"},
		{[]string{"--selector", "env notin (staging),!example.com/tier"}, "h1"},
		{[]string{"--selector", "drain"}, "h3"},
		{[]string{"--selector", "!drain,example.com/tier"}, "h2"},
		{[]string{"--selector", "zone"}, ""},
		{[]string{"--group", "web", "--selector", "env=prod"}, "h1"},
		{[]string{"--group", "db", "--selector", "rack=r12"}, ""},
		// The facts: every agent runs on this machine.
		{[]string{"--selector", "arch=" + arch + ",hostname in (" + hostname(t) + "),systemd.version"}, "h1 h2 h3"},
		{[]string{"--selector", "os.id=" + osID + ",os.version_id=" + osVersion}, "h1 h2 h3"},
		{[]string{"--selector", "arch notin (" + arch + ")"}, ""},
	} {
		if got := names(hosts(tc.args...)); got != tc.want {
			t.Errorf("hosts %s lists %q, want %q", strings.Join(tc.args, " "), got, tc.want)
		}
	}

	// --json carries every label, the facts included.
	rows := hosts("--selector", "rack=r13")
	if len(rows) != 1 {
		t.Fatalf("hosts --selector rack=r13: %d rows", len(rows))
	}
	l := rows[0].Labels
	if l["env"] != "prod" || l["rack"] != "r13" || l["example.com/tier"] != "db" || l["arch"] != arch || l["hostname"] != hostname(t) ||
		l["os.id"] != osID || l["os.version_id"] != osVersion {
		t.Fatalf("labels of h2 = %v", l)
	}
	if v, err := strconv.Atoi(l["systemd.version"]); err != nil || v < 200 {
		t.Fatalf("systemd.version = %q, want the manager's version", l["systemd.version"])
	}
	if len(l) != 8 {
		t.Fatalf("labels of h2 = %v: want its 3 given labels and 5 facts", l)
	}

	// The table: given labels first, then the facts, shortened.
	out, code := e.cli("hosts", "--selector", "env=prod")
	if code != 0 || !strings.Contains(out, "2 hosts") || !strings.Contains(out, "LABELS") ||
		!regexpLine(out, `h1\s+live\s+web\s+env=prod,rack=r12,arch=`+arch+`,\S* \+\d\s`) {
		t.Fatalf("hosts --selector env=prod:\n%s", out)
	}

	// A host that is down is judged by its last record.
	agents["h3"].agent.stop(t)
	if out, code := e.cli("hosts", "--selector", "env=staging"); code != 0 || !regexpLine(out, `h3\s+down, last seen`) {
		t.Fatalf("hosts --selector env=staging with h3 down:\n%s", out)
	}

	// A bad selector is a usage error naming the bad text and where it is.
	for _, bad := range []struct{ sel, want string }{
		{"env in prod", `at 8, "prod": want "(" after in`},
		{"env=prod,", "at 10 (the end): want a requirement after"},
		{"Env=pr:od", `"pr:od"`},
	} {
		out, code := e.cli("hosts", "--selector", bad.sel)
		if code != exitUsage || !strings.Contains(out, bad.want) || !strings.Contains(out, "--selector") {
			t.Errorf("hosts --selector %q: exit %d, want %d and %q\n%s", bad.sel, code, exitUsage, bad.want, out)
		}
	}
}

// A bad --label is refused at start: exit 2, naming it.
func TestRunRefusesBadLabel(t *testing.T) {
	t.Parallel() // refused before anything is opened
	e := &env{t: t}
	for _, tc := range []struct {
		label, want string
	}{
		{"os.id=debian", "label os.id is the host's own fact"},
		{"hostname=web1", "label hostname is the host's own fact"},
		{"rack", `"rack": want KEY=VALUE`},
		{"my rack=r1", `label key "my rack"`},
		{"rack=r 12", `label value "r 12"`},
		{"rack=-r12", `label value "-r12"`},
		{"Example.com/rack=r1", `label key "Example.com/rack"`},
		{"rack=" + strings.Repeat("r", 64), "64 characters"},
	} {
		out, code := e.cli("run", "--label", "env=prod", "--label", tc.label, "--state-dir", t.TempDir())
		if code != exitUsage || !strings.Contains(out, tc.want) {
			t.Errorf("run --label %q: exit %d, want %d and %q\n%s", tc.label, code, exitUsage, tc.want, out)
		}
	}
	if out, code := e.cli("run", "--label", "env=prod", "--label", "env=dev"); code != exitUsage || !strings.Contains(out, "label env given twice") {
		t.Errorf("run with env given twice: exit %d\n%s", code, out)
	}
}

// AGENTD_LABEL (the environment, /etc/default/agentd) is read as --label
// is, comma-separated like AGENTD_FILE_ROOT, and checked alike.
func TestLabelFromEnvironment(t *testing.T) {
	t.Setenv(envVar("label"), "rack=r12,os.version_id=12")
	e := &env{t: t}
	if out, code := e.cli("run"); code != exitUsage || !strings.Contains(out, "AGENTD_LABEL") || !strings.Contains(out, "label os.version_id is the host's own fact") {
		t.Fatalf("run with AGENTD_LABEL=rack=r12,os.version_id=12: exit %d\n%s", code, out)
	}
	t.Setenv(envVar("label"), "rack=r12,env=prod")
	cmd := newRunCmd()
	if err := applyEnv(cmd); err != nil {
		t.Fatal(err)
	}
	if got, _ := cmd.Flags().GetStringSlice("label"); !slices.Equal(got, []string{"rack=r12", "env=prod"}) {
		t.Fatalf("--label from AGENTD_LABEL = %q", got)
	}
}

func TestOSReleaseLabels(t *testing.T) {
	got := parseOSRelease([]byte(`# comment
NAME="Debian GNU/Linux"
ID=debian
VERSION_ID="12"
ID_LIKE='rhel fedora'
PRETTY_NAME="say \"hi\" \$x"
not an assignment
`))
	want := map[string]string{"NAME": "Debian GNU/Linux", "ID": "debian", "VERSION_ID": "12", "ID_LIKE": "rhel fedora", "PRETTY_NAME": `say "hi" $x`}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("parsed %v", got)
	}
	if archName("386") != "i386" || archName("arm64") != "arm64" || archName("amd64") != "amd64" {
		t.Error("archName")
	}
}

func TestDescribeLabels(t *testing.T) {
	labels := map[string]string{"env": "prod", "rack": "r12", "arch": "amd64", "hostname": "web-01", "os.id": "debian",
		"os.version_id": "12", "systemd.version": "252"}
	for _, tc := range []struct {
		width int
		want  string
	}{
		{1000, "env=prod,rack=r12,arch=amd64,hostname=web-01,os.id=debian,os.version_id=12,systemd.version=252"},
		{48, "env=prod,rack=r12,arch=amd64,hostname=web-01 +3"},
		{20, "env=prod,rack=r12 +5"},
		{1, "env=prod +6"},
	} {
		if got := describeLabels(labels, tc.width); got != tc.want || tc.width > 20 && len(got) > tc.width {
			t.Errorf("describeLabels(width %d) = %q, want %q", tc.width, got, tc.want)
		}
	}
	if got := describeLabels(nil, 48); got != "-" {
		t.Errorf("no labels: %q", got)
	}
	if got := describeLabels(map[string]string{"a": "", "b": "1"}, 48); got != "a=,b=1" {
		t.Errorf("an empty value: %q", got)
	}
}

// osReleaseField is a field of this machine's os-release, read here
// without the agent's parser.
func osReleaseField(t *testing.T, field string) string {
	t.Helper()
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		b, err = os.ReadFile("/usr/lib/os-release")
	}
	if err != nil {
		citest.Unavailable(t, "no os-release: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+"="); ok {
			return strings.Trim(v, `"'`)
		}
	}
	citest.Unavailable(t, "os-release has no %s=", field)
	return ""
}

func hostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}
