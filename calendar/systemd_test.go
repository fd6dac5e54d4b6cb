package calendar

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/citest"
)

// agreementValid are expressions systemd accepts, chosen for the edges:
// DST gaps and overlaps (Europe/Berlin, America/New_York, a midnight
// change in America/Santiago, Lord Howe's half hour), month ends, leap
// days, "~", repetitions, two-digit years, fractions, @UNIXTIME.
var agreementValid = []string{
	"Tue 02:00", "Mon..Fri 22:00", "Mon-Fri 22:00 utc", "mon,wed..fri 8:30", "Sat,Sun", "tuesday",
	"Mon..Sun 12:00", "daily", "hourly", "minutely", "weekly", "monthly", "quarterly", "semiannually",
	"yearly", "anually", "DAILY Europe/Berlin", "bi-annually UTC",
	"*-*-* 02:30 Europe/Berlin", "*-*-* 02:*:00 Europe/Berlin", "hourly Europe/Berlin", "*:30 Europe/Berlin",
	"Sun *-*-* 01:30 America/New_York", "*-*-* 02:30 America/New_York", "hourly America/New_York",
	"*-*-* 01:59:59 America/New_York", "*-*-* 00:00 America/Santiago", "*:30 America/Santiago",
	"*:15,45 Australia/Lord_Howe", "*-*-* 02:00 Antarctica/Troll", "*-*-* 12:00 Pacific/Apia",
	"2026-03-29 02:30 Europe/Berlin", "2026-10-25 02:30 Europe/Berlin", "Tue 02:00 Europe/Berlin",
	"*-*-* 00/5:00", "*:0/7", "*:*:*", "*:*:00..59/30", "*-*-* *:*:1.5/0.25", "*-*-* 01:02:03.1234567",
	"*-*-31", "*-02-29 12:00", "*-02~01", "*-*~01", "*-*~03 23:00 Asia/Kolkata", "*-*~28", "*-*~05/3",
	"*-*~01..07/2", "Mon *-05~07/1", "Fri *-*-13", "Sat *-*-01 00:00 Europe/Berlin", "Sat *-*-01..07 00:00",
	"2026..2030/2-1-1", "99..05-1-1", "2027-*-* 12:00", "26-6-15 9:00", "*-1..3,10-1 0:0", "5,3,1:00",
	"1..1:00", "1..2/5:00", "@1700000000", "@1900000000", "Mon @1900000000", "daily Etc/GMT+5", "daily GMT",
	"Mon,Mon", "mon..sun", "2026-*~*", strings.Repeat("1,", 240) + "1:00", "*~1", "*-*-1/10 4:00", "*-12~5,22", "*-12~5,10,22", "*-12~1,23/1", "*:1..1", "*:*:5..5/2", "*:*:5.5..6.4/1",
	"*:*:5..6.2/0.5", "*-*~07 02:50 Europe/Berlin", "*-*~07 *:29/21 Europe/Berlin", "*-*~07 *:*:* Europe/Berlin", "01/5-04..07/4,7..16/4 America/New_York", "Tue 09-1/4,03/6 19:14,46 Australia/Lord_Howe",
}

// agreementInvalid are expressions systemd refuses.
var agreementInvalid = []string{
	"Tue 25:00", "today", "now", "", " 12:00", "12:00 ", "Wed..Mon", "Mon..", "Mon-", "Mon.Fri",
	"Mon-Fri-Sat", "Mon..Wed-Fri", "*/2", "*-*-* *:*/15", "*:50/10", "*-*~29", "*-*~03/5", "2..1:00",
	"0/0:00", "1969-1-1", "2200-1-1", "*-13-01", "*-*-32", "00:00:60", "00:00:01.", "daily Local",
	"Europe/Berlin", "daily Foo/Bar", "2026-01-01T12:00", "@1700000000 12:00", "Mond", "12", "*-~1",
	"*~02..01", "Mon 12", "0..59/30:0", "*,5:00", "Mon,,Tue", "UTC", " UTC", "daily  UTC",
	"1:2:3.5.5", "@-5", "99999999999999999999:00", "*-*-* 4294967296:00",
	"Mon 2027~1", "*-12~5,26", "*-12~5,10,23", "*-12~1,2,3,4,5,6,7,8,9",
	"*:*:5..5", "*:*:34..34.5", "*:*:34.5..35", strings.Repeat("1,", 241) + "1:00",
}

// agreementBases are the base times, in UTC: ordinary, just before and
// inside DST changes, at a leap day, before Santiago's midnight change.
var agreementBases = []string{
	"2026-12-06T21:00:00Z", "2026-03-28T12:00:00Z", "2026-10-24T12:00:00Z", "2026-10-25T01:10:00Z",
	"2026-03-07T12:00:00Z", "2026-10-31T12:00:00Z", "2028-02-27T23:59:59Z", "2026-09-05T12:00:00Z",
	"2026-11-01T06:10:00Z", "2026-03-29T00:59:59Z", "2026-10-25T00:10:00Z",
}

// TestAgreesWithSystemd runs systemd-analyze calendar on every
// expression and base time, and checks that Parse accepts and refuses
// the same, that String is the normalized form, and that Next gives the
// same five elapses (to the second, as systemd prints them).
func TestAgreesWithSystemd(t *testing.T) {
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		citest.Unavailable(t, "systemd-analyze not found: %v", err)
	}
	for _, expr := range agreementInvalid {
		t.Run(fmt.Sprintf("refused/%q", expr), func(t *testing.T) {
			t.Parallel()
			got := analyze(t, tool, expr, agreementBases[0])
			if got.ok {
				t.Errorf("systemd accepts %q (%s), the test expects a refusal", expr, got.normalized)
			}
			if s, err := Parse(expr); err == nil {
				t.Errorf("Parse(%q) = %s, systemd refuses it", expr, s)
			}
		})
	}
	for _, expr := range agreementValid {
		t.Run(fmt.Sprintf("%q", expr), func(t *testing.T) {
			t.Parallel()
			s, err := Parse(expr)
			for _, base := range agreementBases {
				want := analyze(t, tool, expr, base)
				if !want.ok {
					t.Fatalf("systemd refuses %q: %s", expr, want.err)
				}
				if err != nil {
					t.Fatalf("Parse: %v; systemd: %s", err, want.normalized)
				}
				agree(t, s, want, base)
			}
		})
	}
}

// agree checks s against what systemd-analyze said from base: the
// normalized form, and the elapses, or that both give up.
func agree(t *testing.T, s *Spec, want analysis, base string) {
	t.Helper()
	got, gaveUp := elapses(s, base)
	switch {
	case want.gaveUp != gaveUp:
		t.Errorf("from %s: systemd gives up: %v (%s); Next gives up: %v, %q", base, want.gaveUp, want.err, gaveUp, got)
	case want.gaveUp:
	case s.String() != want.normalized:
		t.Errorf("String() = %q, systemd %q", s, want.normalized)
	case strings.Join(got, "\n") != strings.Join(want.elapses, "\n"):
		t.Errorf("from %s:\n got %q\nwant %q", base, got, want.elapses)
	}
}

// elapses are the first five elapses after base (RFC 3339), as
// systemd-analyze prints them in UTC; gaveUp if the search gave up.
func elapses(s *Spec, base string) (got []string, gaveUp bool) {
	at, _ := time.Parse(time.RFC3339, base)
	for range 5 {
		next, err := s.next(at)
		if err != nil {
			if len(got) == 0 {
				got = append(got, "never") // systemd says so only first
			}
			return got, errors.Is(err, errLoop)
		}
		got = append(got, next.UTC().Format(elapseLayout))
		at = next
	}
	return got, false
}

const elapseLayout = "Mon 2006-01-02 15:04:05 UTC"

type analysis struct {
	ok         bool // parsed
	gaveUp     bool // parsed, but systemd failed to find an elapse
	err        string
	normalized string
	elapses    []string // in elapseLayout, or "never"
}

// analyze runs systemd-analyze calendar in UTC from base (RFC 3339).
func analyze(t *testing.T, tool, expr, base string) analysis {
	t.Helper()
	at, err := time.Parse(time.RFC3339, base)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tool, "calendar", "--iterations=5", fmt.Sprintf("--base-time=@%d", at.Unix()), "--", expr)
	cmd.Env = append(os.Environ(), "TZ=UTC", "LC_ALL=C")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if _, exit := err.(*exec.ExitError); !exit {
			t.Fatalf("systemd-analyze: %v", err)
		}
		msg := strings.TrimSpace(stderr.String())
		gaveUp := strings.Contains(msg, "Failed to determine next elapse")
		return analysis{ok: gaveUp, gaveUp: gaveUp, err: msg}
	}
	a := analysis{ok: true}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		key, val, _ := strings.Cut(strings.TrimSpace(sc.Text()), ": ")
		switch {
		case key == "Normalized form":
			a.normalized = val
		case key == "Next elapse" || strings.HasPrefix(key, "Iter. #"):
			a.elapses = append(a.elapses, val)
		}
	}
	return a
}
