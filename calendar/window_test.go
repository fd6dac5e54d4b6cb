package calendar

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func mustWindow(t testing.TB, s string) Window {
	t.Helper()
	w, err := ParseWindow(s)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func at(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestParseWindow checks both spellings, the normalized text, and that
// it reads back to itself.
func TestParseWindow(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Tue 02:00-04:00 Europe/Berlin", "Tue *-*-* 02:00:00 Europe/Berlin for 2h"},
		{"Mon..Fri 22:00-06:00 UTC", "Mon..Fri *-*-* 22:00:00 UTC for 8h"},
		{"Mon..Fri 22:00-06:00", "Mon..Fri *-*-* 22:00:00 UTC for 8h"},
		{"2026-12-24 10:00-12:30:15 America/New_York", "2026-12-24 10:00:00 America/New_York for 2h 30min 15s"},
		{"02:00:30-02:00", "*-*-* 02:00:30 UTC for 23h 59min 30s"},
		{"Sat *-*-01 00:00 Europe/Berlin for 4h", "Sat *-*-01 00:00:00 Europe/Berlin for 4h"},
		{"daily for 30min", "*-*-* 00:00:00 UTC for 30min"},
		{"  weekly for 1h 30min  ", "Mon *-*-* 00:00:00 UTC for 1h 30min"},
		{"Sun 00:00 for 6d 23h", "Sun *-*-* 00:00:00 UTC for 6d 23h"},
		{"2020-01-01 for 7d", "2020-01-01 00:00:00 UTC for 1w"},
	} {
		w, err := ParseWindow(c.in)
		if err != nil {
			t.Errorf("ParseWindow(%q): %v", c.in, err)
			continue
		}
		if w.String() != c.want {
			t.Errorf("ParseWindow(%q) = %q, want %q", c.in, w, c.want)
		}
		back, err := ParseWindow(w.String())
		if err != nil || back.String() != w.String() || back.Length != w.Length || back.Zone.String() != w.Zone.String() {
			t.Errorf("ParseWindow(%q) = %q, %v; does not read back", w, back, err)
		}
	}
}

func TestParseWindowErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Tue 02:00", `window "Tue 02:00": expected "CALENDAR-HH:MM [ZONE]" or "CALENDAR for DURATION"`},
		{"Tue 02:00-24:00", `expected "CALENDAR-HH:MM [ZONE]"`},
		{"Tue 02:00-04:0", `expected "CALENDAR-HH:MM [ZONE]"`},
		{"Tue 02:00-04:00:0", `expected "CALENDAR-HH:MM [ZONE]"`},
		{"daily-04:00", `expected "CALENDAR-HH:MM [ZONE]"`},
		{"Tue 02:00-04:00 right/UTC", `leap-second time zones`},
		{"Tue 25:00-04:00", `calendar "Tue 25:00": hour 25 out of range (0-23)`},
		{"*-*-* 02,03:00-04:00", `"*-*-* 02,03:00" has more than one time of day: write "*-*-* 02,03:00 for DURATION"`},
		{"hourly for 2h", `length 2h is not shorter than the 1h between two openings`},
		{"02:00-02:00", `length 1d is not shorter than the 1d between two openings`},
		{"daily for 0", `the length must be more than zero`},
		{"2030-01-01 for 8d", `length 1w 1d is over 1w`},
		{"daily for infinity", `infinite length`},
		{"daily for 2h Europe/Berlin", `(the time zone goes before "for")`},
		{"daily for 2x", `time span "2x": unknown unit`},
		{"Tue 02:00-04:00 Mars/Olympus", `time zone "Mars/Olympus"`},
		{"today for 1h", `calendar "today"`},
	} {
		_, err := ParseWindow(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseWindow(%q) = %v, want an error with %q", c.in, err, c.want)
		}
	}
}

// TestOpen checks Open at and around the edges of openings: on the
// opening instant (open), on the closing one (closed), across midnight
// and DST changes, and openings that overlap.
func TestOpen(t *testing.T) {
	for _, c := range []struct {
		name, window, at string
		open             bool
		opens, closes    string // "" is zero
	}{
		{"before", "Tue 02:00-04:00 Europe/Berlin", "2026-12-08T00:59:59Z", false, "2026-12-08T01:00:00Z", "2026-12-08T03:00:00Z"},
		{"at the opening", "Tue 02:00-04:00 Europe/Berlin", "2026-12-08T01:00:00Z", true, "2026-12-08T01:00:00Z", "2026-12-08T03:00:00Z"},
		{"just before closing", "Tue 02:00-04:00 Europe/Berlin", "2026-12-08T02:59:59.999Z", true, "2026-12-08T01:00:00Z", "2026-12-08T03:00:00Z"},
		{"at the closing", "Tue 02:00-04:00 Europe/Berlin", "2026-12-08T03:00:00Z", false, "2026-12-15T01:00:00Z", "2026-12-15T03:00:00Z"},
		{"summer time", "Tue 02:00-04:00 Europe/Berlin", "2026-07-07T00:30:00Z", true, "2026-07-07T00:00:00Z", "2026-07-07T02:00:00Z"},
		{"past midnight", "Mon..Fri 22:00-06:00 UTC", "2026-12-12T03:00:00Z", true, "2026-12-11T22:00:00Z", "2026-12-12T06:00:00Z"},
		{"weekend", "Mon..Fri 22:00-06:00 UTC", "2026-12-13T23:00:00Z", false, "2026-12-14T22:00:00Z", "2026-12-15T06:00:00Z"},
		{"over fall back: 3 h elapsed", "*-*-* 01:00 Europe/Berlin for 3h", "2026-10-25T01:30:00Z", true, "2026-10-24T23:00:00Z", "2026-10-25T02:00:00Z"},
		{"over spring forward", "*-*-* 01:30 Europe/Berlin for 2h", "2026-03-29T02:00:00Z", true, "2026-03-29T00:30:00Z", "2026-03-29T02:30:00Z"},
		{"start in the gap: none that day", "*-*-* 02:30 Europe/Berlin for 1h", "2026-03-29T01:00:00Z", false, "2026-03-30T00:30:00Z", "2026-03-30T01:30:00Z"},
		{"openings overlap at spring forward", "*-*-* 01,03:00 Europe/Berlin for 90min", "2026-03-29T00:30:00Z", true, "2026-03-29T00:00:00Z", "2026-03-29T02:30:00Z"},
		{"and not on other days", "*-*-* 01,03:00 Europe/Berlin for 90min", "2026-03-30T00:00:00Z", true, "2026-03-29T23:00:00Z", "2026-03-30T00:30:00Z"},
		{"never again", "2020-01-01 for 1h", "2026-01-01T00:00:00Z", false, "", ""},
		{"the last one", "2030-01-01 00:00 Asia/Tokyo for 1h", "2029-12-31T15:30:00Z", true, "2029-12-31T15:00:00Z", "2029-12-31T16:00:00Z"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := mustWindow(t, c.window)
			open, opens, closes := w.Open(at(t, c.at))
			show := func(v time.Time) string {
				if v.IsZero() {
					return ""
				}
				return v.UTC().Format(time.RFC3339)
			}
			if open != c.open || show(opens) != c.opens || show(closes) != c.closes {
				t.Errorf("Open(%s) = %v %s %s, want %v %s %s", c.at, open, show(opens), show(closes), c.open, c.opens, c.closes)
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	for _, c := range []struct{ window, at, want string }{
		{"Tue 02:00-04:00 Europe/Berlin", "2026-12-07T21:48:00Z", "Tue 02:00 CET (in 3 h 12 min)"},
		{"Tue 02:00-04:00 Europe/Berlin", "2026-12-08T01:30:00Z", "open until 04:00 CET"},
		{"Tue 02:00-04:00 Europe/Berlin", "2026-12-08T00:59:30Z", "Tue 02:00 CET (in 30 s)"},
		{"Tue 02:00-04:00 Europe/Berlin", "2026-12-08T00:15:00Z", "Tue 02:00 CET (in 45 min)"},
		{"Tue 02:00-04:00 Europe/Berlin", "2026-12-08T03:00:00Z", "Tue 02:00 CET (in 6 d 22 h)"},
		{"Mon..Fri 22:00-06:00 UTC", "2026-12-11T23:00:00Z", "open until Sat 06:00 UTC"},
		{"Tue 02:00-04:00 Europe/Berlin", "2026-07-06T23:00:00Z", "Tue 02:00 CEST (in 1 h)"},
		{"monthly for 1h", "2026-12-06T00:00:00Z", "Fri 2027-01-01 00:00 UTC (in 26 d)"},
		{"Fri 22:00-06:00 America/New_York", "2026-12-12T04:00:00Z", "open until Sat 06:00 EST"},
		{"Fri 22:00-06:00 America/New_York", "2026-12-12T06:00:00Z", "open until 06:00 EST"},
		{"Fri 22:00-06:00:30 America/New_York", "2026-12-12T04:00:00Z", "open until Sat 06:00:30 EST"},
		{"Fri 12:00 for 2d", "2026-12-11T13:00:00Z", "open until Sun 12:00 UTC"},
		{"2020-01-01 for 1h", "2026-12-06T00:00:00Z", "never opens again"},
	} {
		if got := mustWindow(t, c.window).Describe(at(t, c.at)); got != c.want {
			t.Errorf("%q.Describe(%s) = %q, want %q", c.window, c.at, got, c.want)
		}
	}
}

// TestZeroWindow checks that the zero Window is no window: never open,
// and empty text.
func TestZeroWindow(t *testing.T) {
	var w Window
	if !w.IsZero() || w.String() != "" || w.Describe(time.Now()) != "no window" {
		t.Errorf("zero Window: IsZero %v, String %q, Describe %q", w.IsZero(), w, w.Describe(time.Now()))
	}
	if open, opens, closes := w.Open(time.Now()); open || !opens.IsZero() || !closes.IsZero() {
		t.Errorf("zero Window.Open = %v %v %v", open, opens, closes)
	}
	if mustWindow(t, "daily for 1h").IsZero() {
		t.Error("a parsed window IsZero")
	}
}

// TestWindowJSON checks that a window is stored as its text in a record,
// and read back; the zero Window is "".
func TestWindowJSON(t *testing.T) {
	type record struct {
		Window Window `json:"window"`
		None   Window `json:"none"`
	}
	in := record{Window: mustWindow(t, "Tue 02:00-04:00 Europe/Berlin")}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"window":"Tue *-*-* 02:00:00 Europe/Berlin for 2h","none":""}`; string(b) != want {
		t.Errorf("Marshal = %s, want %s", b, want)
	}
	var out record
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.Window.String() != in.Window.String() || out.Window.Length != 2*time.Hour || !out.None.IsZero() {
		t.Errorf("Unmarshal = %+v", out)
	}
	when := at(t, "2026-12-08T01:30:00Z")
	if a, b := in.Window.Describe(when), out.Window.Describe(when); a != b {
		t.Errorf("read back: %q, before: %q", b, a)
	}
	if err := json.Unmarshal([]byte(`{"window":"Tue 25:00 for 1h"}`), &out); err == nil || !strings.Contains(err.Error(), "hour 25") {
		t.Errorf("Unmarshal of a bad window = %v", err)
	}
}

// BenchmarkWindowOpen measures Open, which a coordinator calls in each
// decision, on a window in a zone with DST at instants over a year.
func BenchmarkWindowOpen(b *testing.B) {
	w := mustWindow(b, "Mon..Fri 22:00-06:00 Europe/Berlin")
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		w.Open(start.Add(time.Duration(i%8760) * time.Hour))
		i++
	}
}
