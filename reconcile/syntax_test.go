package reconcile

import (
	"errors"
	"github.com/agentd/agentd/internal/citest"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// syntaxCases are files systemd reads as written (ok) or not (bad: the
// line of the first problem and a part of its message). Each bad case was
// checked against systemd 252's own parser (systemd-analyze verify), which
// warns about, or refuses, the same line.
var syntaxCases = []struct {
	name    string
	unit    string
	content string
	line    int    // 0: accepted
	why     string // part of the first problem's message
}{
	// Accepted: what real unit files and drop-ins contain.
	{name: "plain service", unit: "a.service", content: "[Unit]\nDescription=a\n[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"},
	{name: "comments and blank lines", unit: "a.service", content: "# top\n; also\n\n[Service]\n  # indented\nExecStart=/bin/true\n\n\t; tab\n"},
	{name: "comment before the first header", unit: "a.service", content: "# SPDX-License-Identifier: MIT\n[Service]\nExecStart=/bin/true\n"},
	{name: "continuation", unit: "a.service", content: "[Service]\nExecStart=/bin/a \\\n    --b \\\n  --c\nType=exec\n"},
	{name: "comment inside a continuation", unit: "a.service", content: "[Service]\nExecStart=/bin/a \\\n# the flag\n  --b\n"},
	{name: "continuation at end of file", unit: "a.socket", content: "[Socket]\nService=web.service \\"},
	{name: "escaped backslash is not a continuation", unit: "a.service", content: "[Service]\nEnvironment=A=\\\\\nType=exec\n"},
	{name: "X- section with anything", unit: "a.service", content: "[Service]\nExecStart=/bin/true\n[X-Anything]\nno equals here\n=x\nweird key!=1\n"},
	{name: "X-Agentd policy", unit: "a.service", content: "[Service]\nExecStart=/bin/true\n[X-Agentd]\nHealthySec=0\nOnChange=restart\n"},
	{name: "X- key in a known section", unit: "a.service", content: "[Service]\nX-Reload-Triggers=Environment\nX-Owner team=web\n"},
	{name: "CRLF", unit: "a.service", content: "[Unit]\r\nDescription=a\r\n[Service]\r\nExecStart=/bin/true\r\n"},
	{name: "old Mac line ends", unit: "a.service", content: "[Service]\rExecStart=/bin/true\r"},
	{name: "line over 2048 bytes", unit: "a.service", content: "[Service]\nEnvironment=A=" + strings.Repeat("x", 5000) + "\n"},
	{name: "byte order mark", unit: "a.service", content: "\uFEFF[Service]\nExecStart=/bin/true\n"},
	{name: "spaces around = and key", unit: "a.service", content: "[Service]\n  ExecStart = /bin/true  \n"},
	{name: "value with = and brackets", unit: "a.service", content: "[Service]\nEnvironment=A=[x]\nExecStart=/bin/sh -c '[ -e /x ]'\n"},
	{name: "continued line starting with [", unit: "a.service", content: "[Service]\nExecStart=/bin/echo \\\n[not a header]\n"},
	{name: "drop-in of a timer", unit: "a.timer", content: "[Timer]\nOnCalendar=daily\n"},
	{name: "target has [Target]", unit: "a.target", content: "[Unit]\nDescription=t\n[Target]\n[Install]\nWantedBy=multi-user.target\n"},
	{name: "mount", unit: "data.mount", content: "[Mount]\nWhat=/dev/sdb1\nWhere=/data\nOptions=noatime\n"},
	{name: "slice", unit: "a.slice", content: "[Slice]\nCPUWeight=100\n"},
	{name: "path", unit: "a.path", content: "[Path]\nPathExists=/a\n"},
	{name: "empty file", unit: "a.service", content: ""},
	{name: "only comments", unit: "a.service", content: "# nothing\n"},
	{name: "instance drop-in", unit: "a@1.service", content: "[Service]\nEnvironment=I=1\n"},
	{name: "empty assignment resets", unit: "a.service", content: "[Service]\nExecStart=\nExecStart=/bin/b\n"},

	// Refused: a broken section header (systemd refuses the file).
	{name: "header without ]", unit: "a.service", content: "[Service\nExecStart=/bin/true\n", line: 1, why: `does not end in "]"`},
	{name: "garbage after ]", unit: "a.service", content: "[Service]x\nExecStart=/bin/true\n", line: 1, why: `does not end in "]"`},
	{name: "comment after ]", unit: "a.service", content: "[Unit]\nDescription=a\n[Service] # main\nExecStart=/bin/true\n", line: 3, why: `does not end in "]"`},
	{name: "lone [", unit: "a.service", content: "[Service]\nType=exec\n[\n", line: 3, why: `does not end in "]"`},
	{name: "quote in header", unit: "a.service", content: "[Ser\"vice]\nA=1\n", line: 1, why: "character '\"'"},
	{name: "tab in header", unit: "a.service", content: "[Ser\tvice]\nA=1\n", line: 1, why: `character '\t'`},
	{name: "broken header in a drop-in, CRLF", unit: "a.service", content: "# limits\r\n[Service\r\nLimitNOFILE=65536\r\n", line: 2, why: `does not end in "]"`},

	// Refused: a section systemd ignores with all its lines.
	{name: "empty section name", unit: "a.service", content: "[]\nA=1\n", line: 1, why: "no section []"},
	{name: "lower case section", unit: "a.service", content: "[service]\nExecStart=/bin/true\n", line: 1, why: "no section [service]"},
	{name: "spaces inside brackets", unit: "a.service", content: "[ Service ]\nExecStart=/bin/true\n", line: 1, why: "no section [ Service ]"},
	{name: "typo", unit: "a.service", content: "[Unit]\nDescription=a\n[Servcie]\nExecStart=/bin/true\n", line: 3, why: "no section [Servcie]"},
	{name: "another type's section", unit: "a.timer", content: "[Timer]\nOnCalendar=daily\n[Service]\nExecReload=/bin/true\n", line: 3, why: "no section [Service]"},

	// Refused: lines systemd drops.
	{name: "assignment before any header", unit: "a.service", content: "ExecStart=/bin/true\n[Service]\nType=exec\n", line: 1, why: "before the first section header"},
	{name: "drop-in without a header", unit: "a.service", content: "Environment=A=1\n", line: 1, why: "before the first section header"},
	{name: "line without =", unit: "a.service", content: "[Service]\nExecStart=/bin/true\noops\n", line: 3, why: `no "="`},
	{name: "line without = after CRLF lines", unit: "a.service", content: "[Service]\r\n\r\nType=exec\r\nExecStart /bin/true\r\n", line: 4, why: `no "="`},
	{name: "nothing before =", unit: "a.service", content: "[Service]\n=/bin/true\n", line: 2, why: "no key name"},
	{name: "space in key", unit: "a.service", content: "[Service]\nExec Start=/bin/true\n", line: 2, why: `key "Exec Start"`},
	{name: "dash in key", unit: "a.service", content: "[Unit]\nWanted-By=x.target\n", line: 2, why: `key "Wanted-By"`},
	{name: "lower-case x- key", unit: "a.service", content: "[Service]\nx-owner=web\n", line: 2, why: `key "x-owner"`},
	{name: ".include is gone", unit: "a.service", content: "[Service]\n.include /etc/x.conf\n", line: 2, why: `no "="`},
	{name: "continued line without =", unit: "a.service", content: "[Service]\nType=exec\nfoo \\\nbar\n", line: 3, why: `no "="`},
	{name: "line without = in X-Agentd", unit: "a.service", content: "[Service]\nExecStart=/bin/true\n[X-Agentd]\nHealthySec 0\n", line: 4, why: "agentd cannot read its policy"},
	{name: "line numbers after a \\n\\r end", unit: "a.service", content: "[Service]\n\rType=exec\noops\n", line: 3, why: `no "="`},
}

func TestCheckSyntax(t *testing.T) {
	for _, tc := range syntaxCases {
		err := CheckSyntax(tc.unit, []byte(tc.content))
		if tc.line == 0 {
			if err != nil {
				t.Errorf("%s: refused: %v", tc.name, err)
			}
			continue
		}
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("%s: accepted (err %v), want line %d refused", tc.name, err, tc.line)
			continue
		}
		p := se.Problems[0]
		if p.Line != tc.line || !strings.Contains(p.Why, tc.why) {
			t.Errorf("%s: first problem %s, want line %d: …%s…", tc.name, p, tc.line, tc.why)
		}
		if !strings.Contains(err.Error(), "line") {
			t.Errorf("%s: message does not name the line: %v", tc.name, err)
		}
	}
}

func TestCheckSyntaxMessage(t *testing.T) {
	err := CheckSyntax("a.service", []byte("[Service\na b\n[Service]\nx\ny\nz\nw\n"))
	want := `line 1 "[Service": invalid section header: it does not end in "]"; systemd refuses to load the file; ` +
		`line 4 "x": no "="; systemd ignores the line; line 5 "y": no "="; systemd ignores the line; and 2 more`
	if err == nil || err.Error() != want {
		t.Fatalf("message:\n got %v\nwant %s", err, want)
	}
	long := CheckSyntax("a.service", []byte("[Service]\nfoo \\\nbar"))
	if long == nil || !strings.HasPrefix(long.Error(), `lines 2-3 "foo  bar": no "="`) {
		t.Fatalf("continued line: %v", long)
	}
	cut := CheckSyntax("a.service", []byte("[Service]\n"+strings.Repeat("é", 100)+"\n")).Error()
	if !strings.Contains(cut, "…") || len(cut) > 200 {
		t.Fatalf("long line not cut: %s", cut)
	}
}

// TestDesireBlocksBadSyntax: a unit file or drop-in systemd would not read
// as written blocks its unit in Desire, like any value refused before it
// reaches the disk (nothing written, nothing restarted), with an error
// naming the file and the line; the other units are untouched.
func TestDesireBlocksBadSyntax(t *testing.T) {
	good := []byte("[Service]\nExecStart=/bin/true\n")
	units := Desire(Snapshot{Entries: []Entry{
		{Unit: "a.service", Value: good},
		{Unit: "a.service.d/limits.conf", Value: []byte("# more files\n[Service\nLimitNOFILE=65536\n")},
		{Unit: "b.service", Value: []byte("[Unit]\nDescription=b\n[Service]\nExecStart=/bin/true\nRestart always\n")},
		{Unit: "c.service", Value: good},
	}})
	a := units["a.service"]
	if a == nil || a.Err == nil || !strings.Contains(a.Err.Error(), "a.service.d/limits.conf: line 2") ||
		!strings.Contains(a.Err.Error(), "invalid section header") {
		t.Fatalf("a.service (broken drop-in header): %+v", a)
	}
	if b := units["b.service"]; b == nil || b.Err == nil || !strings.Contains(b.Err.Error(), `b.service: line 5 "Restart always": no "="`) {
		t.Fatalf("b.service (line without =): %+v", b)
	}
	if c := units["c.service"]; c == nil || c.Err != nil || c.File == nil {
		t.Fatalf("c.service blocked with its neighbours: %+v", c)
	}

	// Blocked means no action but a status error: nothing written,
	// nothing restarted, whatever runs now.
	// a.service runs the unit file alone; the drop-in must not reach it.
	running := UnitState{LoadState: "loaded", ActiveState: "active", SubState: "running", MainPID: 42}
	cur := Current{
		Host: HostFacts{
			Files: map[string]LocalFile{"a.service": {Exists: true, Hash: Hash(good), Content: good}},
			Units: map[string]UnitState{"a.service": running},
		},
		Memory: Memory{
			Managed: map[string]Owned{"a.service": {Hash: Hash(good)}},
			Records: map[string]UnitRecord{"a.service": {Applied: map[string]string{"a.service": Hash(good)}}},
		},
	}
	seen := 0
	for _, act := range Plan(units, cur) {
		if act.Unit != "a.service" && act.Unit != "b.service" {
			continue
		}
		seen++
		if act.Kind != KindBlocked || len(act.Steps.Writes) > 0 || len(act.Steps.Removes) > 0 || act.Steps.Job != JobNone || !strings.Contains(act.Err, "line") {
			t.Errorf("%s: %+v, want blocked with the line in its error, nothing written or started", act.Unit, act)
		}
	}
	if seen != 2 {
		t.Errorf("%d actions for a.service and b.service, want 2", seen)
	}
}

// TestCheckSyntaxAgreesWithSystemd runs every table case through systemd's
// own parser (systemd-analyze verify, which needs no running manager):
// CheckSyntax must refuse exactly the lines systemd warns about or refuses
// (reported by systemd at the last physical line of a continued line).
// [X-Agentd] lines are agentd's own rule, which systemd does not see.
func TestCheckSyntaxAgreesWithSystemd(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		citest.Unavailable(t, "systemd-analyze not found: %v", err)
	}
	// The messages of systemd's parse_line, with their line number.
	re := regexp.MustCompile(`:(\d+): (Missing '='|Missing key name|Unknown section|Invalid section header|` +
		`Bad characters in section header|Assignment outside of section|Unknown key(?: name)? '([^']*)')`)
	dir := t.TempDir()
	for _, tc := range syntaxCases {
		path := filepath.Join(dir, tc.unit)
		if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		out, _ := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
		systemdLines := map[int]string{}
		for _, m := range re.FindAllStringSubmatch(string(out), -1) {
			if key := m[3]; key != "" && (strings.HasPrefix(key, "X-") || isKeyName([]byte(key))) {
				continue // a well-formed key systemd does not know: not ours to judge
			}
			n, _ := strconv.Atoi(m[1])
			systemdLines[n] = m[2]
		}
		var ours []SyntaxProblem
		if se := (*SyntaxError)(nil); errors.As(CheckSyntax(tc.unit, []byte(tc.content)), &se) {
			ours = se.Problems
		}
		covers := func(p SyntaxProblem, n int) bool { return n >= p.Line && n <= p.EndLine+1 } // +1: at end of file
		for n, what := range systemdLines {
			if !slices.ContainsFunc(ours, func(p SyntaxProblem) bool { return covers(p, n) }) {
				t.Errorf("%s: systemd: line %d: %s; CheckSyntax: %v", tc.name, n, what, ours)
			}
		}
		for _, p := range ours {
			if strings.Contains(p.Why, "[X-Agentd]") {
				continue
			}
			if !slices.ContainsFunc(slices.Collect(maps.Keys(systemdLines)), func(n int) bool { return covers(p, n) }) {
				t.Errorf("%s: CheckSyntax: %s; systemd has nothing to say about it:\n%s", tc.name, p, out)
			}
		}
	}
}
