package control

import (
	"fmt"
	"strings"

	"github.com/aymanbagabas/go-udiff/lcs"
)

// diffContext is the number of unchanged lines shown around each change.
const diffContext = 3

// UnifiedDiff renders a unified diff (3 lines of context) from a to b, in
// diff -u's format: every hunk header carries both counts, an empty side is
// numbered by the line before it, and a last line without a newline is
// followed by "\ No newline at end of file". Equal inputs give "".
//
// The edit script comes from go-udiff's Myers implementation (the one gopls
// uses), whose memory grows with the input and the number of differences,
// not with the product of the two lengths. Past a bound on the number of
// differences it settles for a correct but possibly longer diff rather
// than the shortest one.
func UnifiedDiff(aName, bName, a, b string) string {
	if a == b {
		return ""
	}
	al, bl := splitLines(a), splitLines(b)
	diffs := lcs.DiffLines(al, bl)
	if len(diffs) == 0 {
		return "" // unreachable: the lines keep their newlines, so a != b differs somewhere
	}
	var out strings.Builder
	fmt.Fprintf(&out, "--- %s\n+++ %s\n", aName, bName)
	for k := 0; k < len(diffs); {
		// A hunk takes every following change whose gap from the previous
		// one is short enough for the two contexts to touch.
		end := k + 1
		for end < len(diffs) && diffs[end].Start-diffs[end-1].End <= 2*diffContext {
			end++
		}
		first, last := diffs[k], diffs[end-1]
		aStart := max(first.Start-diffContext, 0)
		bStart := first.ReplStart - (first.Start - aStart)
		// Past the last change a and b are equal to their ends.
		aEnd := min(last.End+diffContext, len(al))
		bEnd := last.ReplEnd + (aEnd - last.End)
		aCount, bCount := aEnd-aStart, bEnd-bStart
		// An empty side is numbered by the line before it, as diff(1) does.
		if aCount > 0 {
			aStart++
		}
		if bCount > 0 {
			bStart++
		}
		fmt.Fprintf(&out, "@@ -%d,%d +%d,%d @@\n", aStart, aCount, bStart, bCount)
		from := max(first.Start-diffContext, 0)
		for _, d := range diffs[k:end] {
			writeLines(&out, ' ', al[from:d.Start])
			writeLines(&out, '-', al[d.Start:d.End])
			writeLines(&out, '+', bl[d.ReplStart:d.ReplEnd])
			from = d.End
		}
		writeLines(&out, ' ', al[from:aEnd])
		k = end
	}
	return out.String()
}

// splitLines cuts s after each newline; a last line without one is kept as
// it is, so "x" and "x\n" are different lines.
func splitLines(s string) []string {
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

func writeLines(out *strings.Builder, kind byte, lines []string) {
	for _, l := range lines {
		out.WriteByte(kind)
		out.WriteString(l)
		if !strings.HasSuffix(l, "\n") {
			out.WriteString("\n\\ No newline at end of file\n")
		}
	}
}
