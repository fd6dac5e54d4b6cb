package calendar

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentd/agentd/internal/timespan"
)

// MaxLength is the longest window: a week, the longest period an operator
// plausibly means ("Sun 00:00 for 7d" is open always, which is no window).
const MaxLength = 7 * 24 * time.Hour

// Window is a calendar event plus a length: open from each elapse for
// Length. Zone is the event's zone, UTC if the text named none. The zero
// Window is "no window" (IsZero); it is never open.
type Window struct {
	Start  *Spec
	Length time.Duration
	Zone   *time.Location
	text   string // String(), built once at parse time
}

// ParseWindow reads "CALENDAR-HH:MM[:SS] [ZONE]" or "CALENDAR for
// DURATION" (see the package doc). The calendar part is read by Parse, so
// systemd-analyze calendar takes it; the window refuses lengths of zero,
// over MaxLength, or not shorter than the gap between two elapses.
func ParseWindow(s string) (Window, error) {
	w, err := parseWindow(strings.TrimSpace(s))
	if err != nil {
		return Window{}, fmt.Errorf("window %q: %w", s, err)
	}
	return w, nil
}

func parseWindow(s string) (Window, error) {
	var spec *Spec
	var length time.Duration
	if cal, span, ok := cutLast(s, " for "); ok {
		var err error
		if spec, err = Parse(cal); err != nil {
			return Window{}, err
		}
		length, err = timespan.Parse(span)
		switch {
		case errors.Is(err, timespan.ErrInfinity):
			return Window{}, errors.New("a window of infinite length is no window")
		case err != nil:
			if _, zone, _, _ := splitZone(span); zone != "" {
				return Window{}, fmt.Errorf("%w (the time zone goes before \"for\")", err)
			}
			return Window{}, err
		}
	} else {
		var err error
		if spec, length, err = parseEnd(s); err != nil {
			return Window{}, err
		}
	}
	if spec.loc == nil {
		spec.utc, spec.loc = true, time.UTC
	}
	switch {
	case length <= 0:
		return Window{}, errors.New("the length must be more than zero")
	case length > MaxLength:
		return Window{}, fmt.Errorf("length %s is over %s", timespan.Format(length), timespan.Format(MaxLength))
	}
	if gap, ok := spec.shortestGap(); ok && length >= gap {
		return Window{}, fmt.Errorf("length %s is not shorter than the %s between two openings: the window would never close",
			timespan.Format(length), timespan.Format(gap))
	}
	return Window{Start: spec, Length: length, Zone: spec.loc, text: spec.String() + " for " + timespan.Format(length)}, nil
}

// parseEnd reads "CALENDAR-HH:MM[:SS] [ZONE]": the calendar must name one
// time of day; an end at or before it is on the next day.
func parseEnd(s string) (*Spec, time.Duration, error) {
	rest, zone, _, err := splitZone(s)
	i := strings.LastIndexByte(rest, '-')
	end, ok := time.Duration(0), false
	if i > 0 && rest[i-1] >= '0' && rest[i-1] <= '9' {
		end, ok = clockTime(rest[i+1:])
	}
	if !ok {
		if err != nil { // "… Mars/Olympus": say what is wrong with the zone
			return nil, 0, err
		}
		return nil, 0, errors.New(`expected "CALENDAR-HH:MM [ZONE]" or "CALENDAR for DURATION"`)
	}
	cal := rest[:i]
	if zone != "" {
		cal += " " + zone
	}
	spec, err := Parse(cal)
	if err != nil {
		return nil, 0, err
	}
	start, ok := spec.timeOfDay()
	if !ok {
		return nil, 0, fmt.Errorf("%q has more than one time of day: write \"%s for DURATION\"", cal, cal)
	}
	length := end - start
	if length <= 0 {
		length += 24 * time.Hour
	}
	return spec, length, nil
}

// clockTime reads HH:MM[:SS] (hour 0-23) as a time of day.
func clockTime(s string) (time.Duration, bool) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, false
	}
	units, limits := []time.Duration{time.Hour, time.Minute, time.Second}, []int{23, 59, 59}
	var d time.Duration
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || p[0] == '+' || p[0] == '-' || len(p) > 2 || (i > 0 && len(p) != 2) || n > limits[i] {
			return 0, false
		}
		d += time.Duration(n) * units[i]
	}
	return d, true
}

// timeOfDay is the one time of day the spec names, if it names one.
func (s *Spec) timeOfDay() (time.Duration, bool) {
	one := func(c chain) (int, bool) {
		if len(c) != 1 || c[0].stop >= 0 || c[0].repeat != 0 {
			return 0, false
		}
		return c[0].start, true
	}
	h, okH := one(s.hour)
	m, okM := one(s.minute)
	us, okS := one(s.usec)
	return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(us)*time.Microsecond, okH && okM && okS
}

// shortestGap is the shortest time between two of the spec's elapses
// among the first few dozen from 2000 on: cheap, deterministic, and
// enough to catch "hourly for 2h" or "*-*-01,02 for 2d". false if the
// spec elapses once or never.
func (s *Spec) shortestGap() (time.Duration, bool) {
	prev, ok := s.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC))
	gap, found := time.Duration(0), false
	for range 32 {
		next, more := s.Next(prev)
		if !ok || !more {
			break
		}
		if d := next.Sub(prev); !found || d < gap {
			gap, found = d, true
		}
		prev = next
	}
	return gap, found
}

// cutLast is strings.Cut at the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	if i := strings.LastIndex(s, sep); i >= 0 {
		return s[:i], s[i+len(sep):], true
	}
	return s, "", false
}

// Open reports whether the window is open at at. If it is, opens is when
// this opening began and closes when it ends (overlapping openings, as
// around a DST change, count as one). If not, opens and closes are the
// next opening's, zero if there is none.
func (w Window) Open(at time.Time) (open bool, opens, closes time.Time) {
	if w.Start == nil {
		return false, time.Time{}, time.Time{}
	}
	// The first elapse after at-Length is the first whose opening has not
	// closed by at.
	e, ok := w.Start.Next(at.Add(-w.Length))
	if !ok {
		return false, time.Time{}, time.Time{}
	}
	if e.After(at) {
		return false, e, e.Add(w.Length)
	}
	opens, closes = e, e.Add(w.Length)
	for range 16 {
		n, ok := w.Start.Next(e)
		if !ok || n.After(closes) {
			break
		}
		e, closes = n, n.Add(w.Length)
	}
	return true, opens, closes
}

// String is the normalized window, "CALENDAR ZONE for DURATION"; it
// always names the zone and reads back through ParseWindow to the same
// window. The zero Window is "".
func (w Window) String() string { return w.text }

// IsZero reports whether w is the zero Window (no window).
func (w Window) IsZero() bool { return w.Start == nil }

// MarshalText writes String(), so a rollout record stores the window as
// the text an operator wrote (normalized).
func (w Window) MarshalText() ([]byte, error) { return []byte(w.text), nil }

// UnmarshalText reads a window with ParseWindow; empty text is the zero
// Window.
func (w *Window) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*w = Window{}
		return nil
	}
	p, err := ParseWindow(string(b))
	if err != nil {
		return err
	}
	*w = p
	return nil
}

// Describe says where the window stands at at, for a status line: "Tue
// 02:00 CET (in 3 h 12 min)" when closed, "open until 04:00 CET" when
// open, "never opens again" when it will not. Times are in the window's
// zone.
func (w Window) Describe(at time.Time) string {
	if w.Start == nil {
		return "no window"
	}
	open, opens, closes := w.Open(at)
	switch {
	case open:
		return "open until " + w.clock(closes, at, false)
	case opens.IsZero():
		return "never opens again"
	}
	return w.clock(opens, at, true) + " (in " + until(opens.Sub(at)) + ")"
}

// clock writes t in the window's zone as briefly as is clear from at:
// the time alone on the same day (unless weekday), the weekday within a
// week, else the date too; seconds only if t has some.
func (w Window) clock(t, at time.Time, weekday bool) string {
	t, at = t.In(w.Zone), at.In(w.Zone)
	layout := "15:04"
	switch {
	case t.Sub(at) >= 7*24*time.Hour:
		layout = "Mon 2006-01-02 15:04"
	case weekday || t.YearDay() != at.YearDay() || t.Year() != at.Year():
		layout = "Mon 15:04"
	}
	if t.Second() != 0 {
		layout += ":05"
	}
	return t.Format(layout + " MST")
}

// until writes a wait in the two largest units: "3 h 12 min", "2 d 4 h",
// "45 min", "20 s".
func until(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%d s", int((d+time.Second-1)/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d/time.Minute))
	case d < 24*time.Hour:
		return twoUnits(int(d/time.Hour), "h", int(d%time.Hour/time.Minute), "min")
	}
	return twoUnits(int(d/(24*time.Hour)), "d", int(d%(24*time.Hour)/time.Hour), "h")
}

func twoUnits(a int, ua string, b int, ub string) string {
	if b == 0 {
		return fmt.Sprintf("%d %s", a, ua)
	}
	return fmt.Sprintf("%d %s %d %s", a, ua, b, ub)
}
