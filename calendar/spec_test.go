package calendar

import (
	"strings"
	"testing"
	"time"
)

// TestParseNormalized checks normalized forms, the text systemd-analyze
// prints (the agreement test checks them against the tool itself; these
// stay meaningful where it is missing).
func TestParseNormalized(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Tue 02:00", "Tue *-*-* 02:00:00"},
		{"mon-fri 22:00 utc", "Mon..Fri *-*-* 22:00:00 UTC"},
		{"Mon,Tue,Thu..Sat", "Mon,Tue,Thu..Sat *-*-* 00:00:00"},
		{"Sun,Sat,Fri,Thu,Wed,Tue,Mon", "*-*-* 00:00:00"},
		{"daily Europe/Berlin", "*-*-* 00:00:00 Europe/Berlin"},
		{"weekly", "Mon *-*-* 00:00:00"},
		{"quarterly", "*-01,04,07,10-01 00:00:00"},
		{"Semi-Annually", "*-01,07-01 00:00:00"},
		{"minutely", "*-*-* *:*:00"},
		{"26-6-15 9:00", "2026-06-15 09:00:00"},
		{"99..05-1-1", "1999..2005-01-01 00:00:00"},
		{"*-*~05/3", "*-*~05/3 00:00:00"},
		{"2026-*~*", "2026-*-* 00:00:00"},
		{"*:*:00..59/30", "*-*-* *:*:00..30/30"},
		{"1..2/5:00", "*-*-* 01:00:00"},
		{"5,3,1,3:00", "*-*-* 01,03,05:00:00"},
		{"*:*:1.5/0.25", "*-*-* *:*:01.500000/0.250000"},
		{"1:2:3.1234565", "*-*-* 01:02:03.123457"},
		{"@1700000000", "2023-11-14 22:13:20 UTC"},
		{"Mon @1700000000 Europe/Berlin", "Mon 2023-11-14 22:13:20 UTC"},
		{"*-*-* 12:00 Etc/GMT+5", "*-*-* 12:00:00 Etc/GMT+5"},
	} {
		s, err := Parse(c.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		if got := s.String(); got != c.want {
			t.Errorf("Parse(%q).String() = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestParseErrors checks that every refusal names the text and what is
// wrong with it.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Tue 25:00", `calendar "Tue 25:00": hour 25 out of range (0-23)`},
		{"", `calendar "": empty`},
		{" UTC", `calendar " UTC": empty`},
		{"today", `expected a number at "today"`},
		{"Wed..Mon", `weekday range ends before Wed at "Mon"`},
		{"Mon..", `weekday range without an end at the end`},
		{"Mon.Fri", `expected ".." at ".Fri"`},
		{"Mon..Tue..Wed", `weekday range cannot go on at "..Wed"`},
		{"Mond", `bad weekday at "Mond"`},
		{"*/2", `expected "-" or "~" in the date at "/2"`},
		{"*:50/10", `minute 50/10 never repeats (above 59)`},
		{"*-*~29", `day ~29 out of range (~1-~28)`},
		{"*-*~03/5", `day ~3/~5 repeats past the end of the month`},
		{"*-*~05,26", `day ~26 out of range (~1-~25)`},
		{"*-*~05,10,23", `day ~23 out of range (~1-~22)`},
		{"2..1:00", `hour range 2..1 is empty`},
		{"*:*:5..5.5", `seconds range 5..5.500000 is shorter than its 1 s step (add /STEP)`},
		{"0/0:00", `repetition /0 at ":00"`},
		{"0/24:00", `hour repetition /24 too large (at most 23)`},
		{"1969-1-1", `year 1969 out of range (1970-2199)`},
		{"*-13-01", `month 13 out of range (1-12)`},
		{"00:00:60", `second 60 out of range (0-59.999999)`},
		{"00:00:01.", `expected a digit after the decimal point at the end`},
		{"12", `expected ":" after the hour at the end`},
		{"12:00 ", `expected ":" after the minute at " "`},
		{"Mon 2027~1", `month 2027 out of range`},
		{"*-*-1~2", `unexpected text after the date at "~2"`},
		{"*~1-2", `"~" may only come before the day at "-2"`},
		{"@1700000000 12:00", `unexpected text at " 12:00"`},
		{"@99999999999", `year after 2199`},
		{"99999999999999999999:00", `number too large at "99999999999999999999:00"`},
		{"daily Foo/Bar", `time zone "Foo/Bar": unknown time zone Foo/Bar`},
		{"daily right/UTC", `time zone "right/UTC": leap-second time zones (right/…) are not supported`},
		{"daily Local", `expected a number at "daily Local"`},
		{strings.Repeat("1,", 241) + "1:00", `more than 241 elements in a list`},
	} {
		_, err := Parse(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", c.in, err, c.want)
		}
	}
}

// TestNext checks elapses where the rules matter, independent of the
// machine: the DST rules, month ends, the year limit, the default zone.
func TestNext(t *testing.T) {
	berlin, _ := time.LoadLocation("Europe/Berlin")
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		name, spec, after, want string // want "" is never
		in                      *time.Location
	}{
		{"skipped at spring forward", "*-*-* 02:30 Europe/Berlin", "2026-03-28T12:00:00Z", "2026-03-30T00:30:00Z", nil},
		{"hourly across the gap", "hourly Europe/Berlin", "2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z", nil},
		{"first of a repeated time", "*-*-* 02:30 Europe/Berlin", "2026-10-24T12:00:00Z", "2026-10-25T00:30:00Z", nil},
		{"once a repeated time", "*-*-* 02:30 Europe/Berlin", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z", nil},
		{"second pass of a repeated hour", "*-*-* 02:30 Europe/Berlin", "2026-10-25T01:10:00Z", "2026-10-25T01:30:00Z", nil},
		{"strictly after", "daily", "2026-12-07T00:00:00Z", "2026-12-08T00:00:00Z", time.UTC},
		{"a nanosecond before", "daily", "2026-12-06T23:59:59.999999999Z", "2026-12-07T00:00:00Z", time.UTC},
		{"last day of February", "*-02~01", "2028-01-01T00:00:00Z", "2028-02-29T00:00:00Z", time.UTC},
		{"last Monday of May", "Mon *-05~07/1", "2026-01-01T00:00:00Z", "2026-05-25T00:00:00Z", time.UTC},
		{"the caller's zone", "02:00", "2026-12-06T12:00:00Z", "2026-12-07T01:00:00Z", berlin},
		{"past year", "2020-01-01", "2026-01-01T00:00:00Z", "", time.UTC},
		{"never a date", "*-02-30", "2026-01-01T00:00:00Z", "", time.UTC},
		{"the last year", "2199-12-31 23:59:59", "2199-12-31T23:59:58Z", "2199-12-31T23:59:59Z", time.UTC},
		{"sub-second", "*:*:0/0.5", "2026-01-01T00:00:00.2Z", "2026-01-01T00:00:00.5Z", time.UTC},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse(c.spec)
			if err != nil {
				t.Fatal(err)
			}
			after := utc(c.after)
			if c.in != nil {
				after = after.In(c.in)
			}
			got, ok := s.Next(after)
			switch {
			case c.want == "" && ok:
				t.Errorf("Next = %v, want never", got.UTC())
			case c.want != "" && (!ok || !got.Equal(utc(c.want))):
				t.Errorf("Next = %v %v, want %s", got.UTC(), ok, c.want)
			}
		})
	}
}

// TestZoneOverridesCaller checks that a spec with a zone ignores the
// caller's zone and answers in its own.
func TestZoneOverridesCaller(t *testing.T) {
	s, err := Parse("daily Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	ny, _ := time.LoadLocation("America/New_York")
	got, _ := s.Next(time.Date(2026, 1, 1, 0, 0, 0, 0, ny))
	if want := time.Date(2026, 1, 1, 18, 30, 0, 0, time.UTC); !got.Equal(want) || got.Location().String() != "Asia/Kolkata" {
		t.Errorf("Next = %v, want %v in Asia/Kolkata", got, want)
	}
}
