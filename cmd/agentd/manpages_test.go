package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// `agentd man-pages DIR` writes agentd(8) and a page for every visible
// subcommand, saying what --help says: AGENTD_<FLAG> intact, the exit
// codes one per line.
func TestManPages(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("SOURCE_DATE_EPOCH", "1764806400") // 2025-12-04
	root := newRoot()
	root.SetArgs([]string{"man-pages", dir})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if !c.IsAvailableCommand() && c.HasParent() {
			return
		}
		want[strings.ReplaceAll(c.CommandPath(), " ", "-")+".8"] = true
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, e := range entries {
		got[e.Name()] = true
		if !want[e.Name()] {
			t.Errorf("unexpected page %s", e.Name())
		}
	}
	for name := range want {
		if !got[name] {
			t.Errorf("no page %s", name)
		}
	}
	for _, name := range []string{"agentd-man-pages.8", "agentd-help.8"} {
		if got[name] {
			t.Errorf("page %s of a hidden command", name)
		}
	}
	for _, name := range []string{"agentd.8", "agentd-unit-put.8", "agentd-run.8"} {
		if !got[name] {
			t.Fatalf("no %s among %v", name, got)
		}
	}

	page := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	top := page("agentd.8")
	for _, s := range []string{
		`.TH "AGENTD" "8" "Dec 2025" "agentd ` + version + `"`,
		"agentd - Redeploy systemd units",
		`AGENTD_<FLAG>, upper case with "-" as "_"`,
		".EX\n  0  success\n  1  error",
		"agentd-unit(8)",
	} {
		if !strings.Contains(top, s) {
			t.Errorf("agentd.8 lacks %q:\n%s", s, top)
		}
	}
	if put := page("agentd-unit-put.8"); !strings.Contains(put, `.TH "AGENTD-UNIT-PUT" "8"`) || !strings.Contains(put, "agentd-unit-put - ") {
		t.Errorf("agentd-unit-put.8: want its own title and name:\n%s", put)
	}
	if run := page("agentd-run.8"); !strings.Contains(run, "--etcd-endpoints") || !strings.Contains(run, "AGENTD_ETCD_PASSWORD") {
		t.Errorf("agentd-run.8 lacks its flags:\n%s", run)
	}
}

func TestEscapeMarkdown(t *testing.T) {
	for in, want := range map[string]string{
		"AGENTD_<FLAG>":       `AGENTD\_\<FLAG\>`,
		"a *b* [c](d) `e` #f": "a \\*b\\* \\[c\\](d) \\`e\\` \\#f",
		"- not a list":        `\- not a list`,
		"  + not a list":      `  \+ not a list`,
		"12. not a list":      `12\. not a list`,
		"12.5 s":              "12.5 s",
		"--wait":              "--wait",
	} {
		if got := escapeMarkdown(in); got != want {
			t.Errorf("escapeMarkdown(%q) = %q, want %q", in, got, want)
		}
	}
}
