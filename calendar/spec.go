package calendar

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Spec is a parsed calendar event. Each field is a chain of components;
// a nil chain is "*". Seconds are kept in microseconds so fractions and
// repetitions like "0/0.5" are exact.
type Spec struct {
	weekdays   uint8 // bit 0 is Monday; 0 is any day
	year       chain
	month      chain
	day        chain
	endOfMonth bool // day counts back from the month's end ("~")
	hour       chain
	minute     chain
	usec       chain // second of the minute, in microseconds

	utc  bool           // " UTC" (or "@UNIXTIME"): printed as UTC
	zone string         // a tz database name, "" if none
	loc  *time.Location // UTC, the named zone, or nil: the caller's zone
}

// component is one element of a list: start, start..stop or start/repeat
// or start..stop/repeat. stop is -1 when open; repeat 0 when it does not
// repeat. A range without repetition repeats every unit.
type component struct{ start, stop, repeat int }

// chain is a field's list of components, sorted and without duplicates.
type chain []component

const (
	usecPerSec = 1_000_000
	minYear    = 1970
	maxYear    = 2199
	allDays    = 0x7f
)

// anySecond is "*" in the seconds field: it is a chain (every whole
// second), not nil, since a nil seconds chain would mean every microsecond.
var anySecond = chain{{0, -1, usecPerSec}}

// field names each chain for errors, with its range and the unit to print.
type field struct {
	name     string
	from, to int
	unit     int // 1, or usecPerSec for seconds
	width    int
}

var (
	yearField   = field{"year", minYear, maxYear, 1, 4}
	monthField  = field{"month", 1, 12, 1, 2}
	dayField    = field{"day", 1, 31, 1, 2}
	hourField   = field{"hour", 0, 23, 1, 2}
	minuteField = field{"minute", 0, 59, 1, 2}
	secondField = field{"second", 0, 60*usecPerSec - 1, usecPerSec, 2}
)

// normalize puts s in the form systemd prints and compares: all seven
// weekdays are none, "~" without a day is "-", two-digit years are
// widened, and each chain is sorted with duplicates dropped and every
// range cut down to its last repetition.
func (s *Spec) normalize() {
	if s.weekdays&allDays == allDays {
		s.weekdays = 0
	}
	if s.day == nil {
		s.endOfMonth = false
	}
	for i := range s.year {
		s.year[i].start = widenYear(s.year[i].start)
		s.year[i].stop = widenYear(s.year[i].stop)
	}
	for _, c := range []*chain{&s.year, &s.month, &s.day, &s.hour, &s.minute, &s.usec} {
		c.normalize()
	}
}

// widenYear turns 26 into 2026 and 99 into 1999, as systemd does.
func widenYear(y int) int {
	switch {
	case y >= 0 && y < 70:
		return y + 2000
	case y >= 70 && y < 100:
		return y + 1900
	}
	return y
}

func (c *chain) normalize() {
	for i := range *c {
		p := &(*c)[i]
		if p.stop > p.start && p.repeat > 0 {
			p.stop -= (p.stop - p.start) % p.repeat
		}
		// "1..1" and "1..2/5" happen once: they are plain values.
		if p.stop == p.start {
			p.stop, p.repeat = -1, 0
		}
	}
	slices.SortFunc(*c, func(a, b component) int {
		return cmp.Or(cmp.Compare(a.start, b.start), cmp.Compare(a.stop, b.stop), cmp.Compare(a.repeat, b.repeat))
	})
	*c = slices.Compact(*c)
}

// validate refuses what systemd refuses after normalizing: values out of
// range, repetitions that cannot happen once, empty ranges. Days counted
// from the month's end may go back 28 days at most, so that each exists
// in every month.
func (s *Spec) validate() error {
	days := dayField
	if s.endOfMonth {
		days.to -= 3
	}
	for _, f := range []struct {
		c chain
		f field
	}{{s.year, yearField}, {s.month, monthField}, {s.day, days}, {s.hour, hourField}, {s.minute, minuteField}, {s.usec, secondField}} {
		if err := f.c.validate(f.f, f.f == days && s.endOfMonth); err != nil {
			return err
		}
	}
	return nil
}

func (c chain) validate(f field, fromEnd bool) error {
	for i, p := range c {
		if fromEnd && i > 0 {
			// systemd 252 checks each further element of a "~" list 3
			// days tighter ("*-*~05,26" is refused, "~05,25" is not);
			// refusing the same keeps `systemd-analyze calendar` the
			// judge of what agentd takes.
			f.to -= 3
		}
		show := func(v int) string { return formatValue(v, f.unit, 0, fromEnd) }
		switch {
		case p.start < f.from || p.start > f.to:
			return fmt.Errorf("%s %s out of range (%s-%s)", f.name, show(p.start), show(f.from), show(f.to))
		case p.repeat > f.to-f.from:
			return fmt.Errorf("%s repetition /%s too large (at most %s)", f.name, show(p.repeat), show(f.to-f.from))
		case p.stop >= 0 && (p.stop < f.from || p.stop > f.to):
			return fmt.Errorf("%s %s out of range (%s-%s)", f.name, show(p.stop), show(f.from), show(f.to))
		case p.stop >= 0 && p.start+p.repeat > p.stop:
			return fmt.Errorf("%s range %s..%s is empty (the end must come after the start)", f.name, show(p.start), show(p.stop))
		case p.stop < 0 && fromEnd && p.start-p.repeat < f.from:
			return fmt.Errorf("%s %s/%s repeats past the end of the month", f.name, show(p.start), show(p.repeat))
		case p.stop < 0 && !fromEnd && p.start+p.repeat > f.to:
			return fmt.Errorf("%s %s/%s never repeats (above %s)", f.name, show(p.start), show(p.repeat), show(f.to))
		}
	}
	return nil
}

// String is systemd's normalized form, as `systemd-analyze calendar`
// prints it after "Normalized form:".
func (s *Spec) String() string {
	var b strings.Builder
	if s.weekdays != 0 {
		writeWeekdays(&b, s.weekdays)
		b.WriteByte(' ')
	}
	s.year.write(&b, yearField)
	b.WriteByte('-')
	s.month.write(&b, monthField)
	if s.endOfMonth {
		b.WriteByte('~')
	} else {
		b.WriteByte('-')
	}
	s.day.write(&b, dayField)
	b.WriteByte(' ')
	s.hour.write(&b, hourField)
	b.WriteByte(':')
	s.minute.write(&b, minuteField)
	b.WriteByte(':')
	s.usec.write(&b, secondField)
	switch {
	case s.utc:
		b.WriteString(" UTC")
	case s.zone != "":
		b.WriteString(" " + s.zone)
	}
	return b.String()
}

var weekdayNames = [7]string{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}

// writeWeekdays writes runs of three or more days as "Mon..Wed", shorter
// runs as lists, as systemd does.
func writeWeekdays(b *strings.Builder, bits uint8) {
	sep := ""
	for d := 0; d < 7; {
		if bits&(1<<d) == 0 {
			d++
			continue
		}
		end := d
		for end+1 < 7 && bits&(1<<(end+1)) != 0 {
			end++
		}
		b.WriteString(sep + weekdayNames[d])
		switch {
		case end == d+1:
			b.WriteString("," + weekdayNames[end])
		case end > d+1:
			b.WriteString(".." + weekdayNames[end])
		}
		sep = ","
		d = end + 1
	}
}

func (c chain) write(b *strings.Builder, f field) {
	if c == nil || (f.unit == usecPerSec && slices.Equal(c, anySecond)) {
		b.WriteByte('*')
		return
	}
	for i, p := range c {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(formatValue(p.start, f.unit, f.width, false))
		if p.stop > 0 {
			b.WriteString(".." + formatValue(p.stop, f.unit, f.width, false))
		}
		if p.repeat > 0 && !(p.stop > 0 && p.repeat == f.unit) {
			b.WriteString("/" + formatValue(p.repeat, f.unit, 0, false))
		}
	}
}

// formatValue writes v zero-padded to width, in seconds with a six-digit
// fraction when unit is usecPerSec and v is not whole; "~" marks a day
// counted from the month's end (in errors only).
func formatValue(v, unit, width int, fromEnd bool) string {
	s := fmt.Sprintf("%0*d", width, v/unit)
	if v%unit > 0 {
		s += fmt.Sprintf(".%06d", v%unit)
	}
	if fromEnd {
		s = "~" + s
	}
	return s
}
