package control

import (
	"fmt"
	"strings"
	"testing"
)

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

func TestUnifiedDiffEdges(t *testing.T) {
	for _, c := range []struct{ name, a, b, want string }{
		{"to empty", "x\ny\n", "", "--- a\n+++ b\n@@ -1,2 +0,0 @@\n-x\n-y\n"},
		{"missing final newline", "x\ny", "x\ny\n", "--- a\n+++ b\n@@ -1,2 +1,2 @@\n x\n-y\n\\ No newline at end of file\n+y\n"},
		{"context without final newline", "x\ny", "z\ny", "--- a\n+++ b\n@@ -1,2 +1,2 @@\n-x\n+z\n y\n\\ No newline at end of file\n"},
		// Six unchanged lines between two changes: one hunk.
		{"gap of six", "0\n1\n2\n3\n4\n5\n6\n7\n", "x\n1\n2\n3\n4\n5\n6\ny\n",
			"--- a\n+++ b\n@@ -1,8 +1,8 @@\n-0\n+x\n 1\n 2\n 3\n 4\n 5\n 6\n-7\n+y\n"},
		// Seven: two hunks.
		{"gap of seven", "0\n1\n2\n3\n4\n5\n6\n7\n8\n", "x\n1\n2\n3\n4\n5\n6\n7\ny\n",
			"--- a\n+++ b\n@@ -1,4 +1,4 @@\n-0\n+x\n 1\n 2\n 3\n@@ -6,4 +6,4 @@\n 5\n 6\n 7\n-8\n+y\n"},
		{"insert in the middle", "1\n2\n3\n4\n5\n6\n7\n8\n", "1\n2\n3\n4\nnew\n5\n6\n7\n8\n",
			"--- a\n+++ b\n@@ -2,6 +2,7 @@\n 2\n 3\n 4\n+new\n 5\n 6\n 7\n"},
	} {
		if got := UnifiedDiff("a", "b", c.a, c.b); got != c.want {
			t.Errorf("%s: got:\n%s\nwant:\n%s", c.name, got, c.want)
		}
	}
}

// bigPair is two 5,000-line files that differ in four places: a changed
// line at 1000 and at 2500, line 4000 deleted, a line inserted after 4500.
func bigPair() (a, b string) {
	var ab, bb strings.Builder
	for i := 1; i <= 5000; i++ {
		line := fmt.Sprintf("Environment=LINE_%04d=some value long enough to look like a real unit line\n", i)
		ab.WriteString(line)
		switch i {
		case 1000, 2500:
			fmt.Fprintf(&bb, "Environment=LINE_%04d=changed\n", i)
		case 4000:
		case 4500:
			bb.WriteString(line)
			bb.WriteString("Environment=INSERTED=1\n")
		default:
			bb.WriteString(line)
		}
	}
	return ab.String(), bb.String()
}

func TestUnifiedDiffLargeInputs(t *testing.T) {
	a, b := bigPair()
	l := func(i int) string {
		return fmt.Sprintf("Environment=LINE_%04d=some value long enough to look like a real unit line\n", i)
	}
	ctx := func(sign string, from, to int) string {
		var s strings.Builder
		for i := from; i <= to; i++ {
			s.WriteString(sign + l(i))
		}
		return s.String()
	}
	want := "--- a\n+++ b\n" +
		"@@ -997,7 +997,7 @@\n" + ctx(" ", 997, 999) + ctx("-", 1000, 1000) + "+Environment=LINE_1000=changed\n" + ctx(" ", 1001, 1003) +
		"@@ -2497,7 +2497,7 @@\n" + ctx(" ", 2497, 2499) + ctx("-", 2500, 2500) + "+Environment=LINE_2500=changed\n" + ctx(" ", 2501, 2503) +
		"@@ -3997,7 +3997,6 @@\n" + ctx(" ", 3997, 3999) + ctx("-", 4000, 4000) + ctx(" ", 4001, 4003) +
		"@@ -4498,6 +4497,7 @@\n" + ctx(" ", 4498, 4500) + "+Environment=INSERTED=1\n" + ctx(" ", 4501, 4503)
	got := UnifiedDiff("a", "b", a, b)
	if got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	if len(got) > 4096 {
		t.Fatalf("diff of four changed lines is %d bytes", len(got))
	}
}

// BenchmarkUnifiedDiffLarge measures the memory a diff of two 5,000-line
// files costs; an n×m LCS table needs about 100 MB for it.
func BenchmarkUnifiedDiffLarge(b *testing.B) {
	x, y := bigPair()
	b.ReportAllocs()
	for b.Loop() {
		if UnifiedDiff("a", "b", x, y) == "" {
			b.Fatal("no diff")
		}
	}
}
