package control

import "testing"

func TestUnifiedDiff(t *testing.T) {
	a := "[Unit]\nDescription=x\n[Service]\nExecStart=/bin/a\nType=exec\n"
	b := "[Unit]\nDescription=x\n[Service]\nExecStart=/bin/b\nType=exec\n"
	want := "--- registry\n+++ local\n@@ -1,5 +1,5 @@\n [Unit]\n Description=x\n [Service]\n-ExecStart=/bin/a\n+ExecStart=/bin/b\n Type=exec\n"
	if got := UnifiedDiff("registry", "local", a, b); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	if got := UnifiedDiff("a", "b", a, a); got != "" {
		t.Fatalf("equal inputs: %q", got)
	}
	if got := UnifiedDiff("a", "b", "", "x\n"); got != "--- a\n+++ b\n@@ -0,0 +1,1 @@\n+x\n" && got != "--- a\n+++ b\n@@ -1,0 +1,1 @@\n+x\n" {
		t.Fatalf("from empty: %q", got)
	}
}
