package calendar

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// maxComponents is how long a list may be: systemd refuses a 242nd
// element, to bound its recursion.
const maxComponents = 241

// Parse reads a calendar event as systemd 252 does (systemd.time(7)): it
// accepts and refuses the same text. Errors name the text and what is
// wrong with it, e.g. `calendar "Tue 25:00": hour 25 out of range (0-23)`.
func Parse(s string) (*Spec, error) {
	spec, err := parse(s)
	if err != nil {
		return nil, fmt.Errorf("calendar %q: %w", s, err)
	}
	return spec, nil
}

func parse(s string) (*Spec, error) {
	spec := &Spec{}
	rest, zone, loc, zoneErr := splitZone(s)
	switch {
	case errors.Is(zoneErr, errRightZone):
		return nil, zoneErr
	case zone == "UTC":
		spec.utc, spec.loc = true, time.UTC
	case zone != "":
		spec.zone, spec.loc = zone, loc
	}
	if rest == "" {
		return nil, errors.New("empty")
	}
	if !spec.shorthand(rest) {
		p := &parser{s: rest}
		if err := p.all(spec); err != nil {
			if zoneErr != nil {
				return nil, zoneErr
			}
			return nil, err
		}
	}
	spec.normalize()
	if err := spec.validate(); err != nil {
		return nil, err
	}
	return spec, nil
}

// shorthand sets spec from a named schedule ("daily") and reports whether
// s was one. Fields left nil are "*".
func (spec *Spec) shorthand(s string) bool {
	zero := chain{{0, -1, 0}}
	one := func(v ...int) chain {
		c := make(chain, len(v))
		for i, x := range v {
			c[i] = component{x, -1, 0}
		}
		return c
	}
	var names []string // fields set, from the seconds up
	switch {
	case equalFold(s, "minutely"):
		names = []string{"s"}
	case equalFold(s, "hourly"):
		names = []string{"s", "m"}
	case equalFold(s, "daily"):
		names = []string{"s", "m", "h"}
	case equalFold(s, "weekly"):
		names, spec.weekdays = []string{"s", "m", "h"}, 1
	case equalFold(s, "monthly"):
		names = []string{"s", "m", "h", "d"}
	case equalFold(s, "quarterly"):
		names, spec.month = []string{"s", "m", "h", "d"}, one(1, 4, 7, 10)
	case equalFold(s, "semiannually"), equalFold(s, "semi-annually"), equalFold(s, "biannually"), equalFold(s, "bi-annually"):
		names, spec.month = []string{"s", "m", "h", "d"}, one(1, 7)
	case equalFold(s, "yearly"), equalFold(s, "annually"), equalFold(s, "anually"):
		names, spec.month = []string{"s", "m", "h", "d"}, one(1)
	default:
		return false
	}
	for _, n := range names {
		switch n {
		case "s":
			spec.usec = zero
		case "m":
			spec.minute = zero
		case "h":
			spec.hour = zero
		case "d":
			spec.day = one(1)
		}
	}
	return true
}

// parser reads [WEEKDAYS] [DATE] [TIME] from s at pos.
type parser struct {
	s   string
	pos int
}

func (p *parser) rest() string { return p.s[p.pos:] }
func (p *parser) peek() byte {
	if p.pos < len(p.s) {
		return p.s[p.pos]
	}
	return 0
}
func (p *parser) skipSpaces() {
	for p.peek() == ' ' {
		p.pos++
	}
}

// errAt names the text where parsing stopped.
func (p *parser) errAt(what string) error {
	r := p.rest()
	if r == "" {
		return fmt.Errorf("%s at the end", what)
	}
	if len(r) > 24 {
		r = r[:24] + "…"
	}
	return fmt.Errorf("%s at %q", what, r)
}

func (p *parser) all(spec *Spec) error {
	if err := p.weekdays(spec); err != nil {
		return err
	}
	done, err := p.date(spec)
	if err != nil {
		return err
	}
	if !done {
		if err := p.time(spec); err != nil {
			return err
		}
	}
	if p.rest() != "" {
		return p.errAt("unexpected text")
	}
	return nil
}

// dayNames is in the order systemd tries them: the long name before the
// short one, so "Monday" is one word, not "Mon" followed by "day".
var dayNames = []struct {
	name string
	nr   int
}{
	{"Monday", 0}, {"Mon", 0}, {"Tuesday", 1}, {"Tue", 1}, {"Wednesday", 2}, {"Wed", 2},
	{"Thursday", 3}, {"Thu", 3}, {"Friday", 4}, {"Fri", 4}, {"Saturday", 5}, {"Sat", 5},
	{"Sunday", 6}, {"Sun", 6},
}

// weekdays reads an optional list of weekdays and ranges ("Mon..Fri",
// "Sat,Sun", "Mon-Wed"), and the spaces after it.
func (p *parser) weekdays(spec *Spec) error {
	open := -1 // the start of a range waiting for its end
	for first := true; ; first = false {
		nr, n := -1, 0
		for _, d := range dayNames {
			if len(p.rest()) >= len(d.name) && equalFold(p.rest()[:len(d.name)], d.name) {
				nr, n = d.nr, len(d.name)
				break
			}
		}
		if nr < 0 {
			if first {
				return nil // no weekdays: a date or time follows
			}
			return p.errAt("expected a weekday")
		}
		if r := p.rest()[n:]; r != "" && !strings.ContainsRune("-., ", rune(r[0])) {
			return p.errAt("bad weekday")
		}
		spec.weekdays |= 1 << nr
		if open >= 0 {
			if open > nr {
				return p.errAt(fmt.Sprintf("weekday range ends before %s", weekdayNames[open]))
			}
			for d := open + 1; d < nr; d++ {
				spec.weekdays |= 1 << d
			}
		}
		p.pos += n
		switch p.peek() {
		case 0:
			return nil
		case ' ':
			p.skipSpaces()
			return nil
		case '.', '-': // "-" is systemd's older spelling of ".."
			sep := p.rest()[:1]
			if sep == "." {
				sep = ".."
			}
			if open >= 0 {
				return p.errAt("a weekday range cannot go on")
			}
			if !strings.HasPrefix(p.rest(), sep) {
				return p.errAt(`expected ".."`)
			}
			open = nr
			p.pos += len(sep)
		case ',':
			open = -1
			p.pos++
		}
		if c := p.peek(); c == 0 || c == ' ' {
			if open >= 0 {
				return p.errAt("weekday range without an end")
			}
			p.skipSpaces()
			return nil
		}
	}
}

// date reads [YEAR-]MONTH-DAY or @UNIXTIME, and the spaces after it. It
// reads nothing if what comes is a time. done reports an @UNIXTIME, after
// which no time may follow.
func (p *parser) date(spec *Spec) (done bool, err error) {
	if p.peek() == 0 {
		return false, nil
	}
	if p.peek() == '@' {
		p.pos++
		return true, p.unixTime(spec)
	}
	start := p.pos
	first, err := p.chain(false)
	if err != nil {
		return false, err
	}
	if c := p.peek(); c == 0 || c == ':' {
		p.pos = start // a time, not a date
		return false, nil
	}
	if err := p.dateSep(spec); err != nil {
		return false, err
	}
	second, err := p.chain(false)
	if err != nil {
		return false, err
	}
	if c := p.peek(); c == 0 || c == ' ' {
		p.skipSpaces()
		spec.month, spec.day = first, second
		return false, nil
	}
	if spec.endOfMonth {
		return false, p.errAt(`"~" may only come before the day`)
	}
	if err := p.dateSep(spec); err != nil {
		return false, err
	}
	third, err := p.chain(false)
	if err != nil {
		return false, err
	}
	if c := p.peek(); c != 0 && c != ' ' {
		return false, p.errAt("unexpected text after the date")
	}
	p.skipSpaces()
	spec.year, spec.month, spec.day = first, second, third
	return false, nil
}

func (p *parser) dateSep(spec *Spec) error {
	switch p.peek() {
	case '~':
		spec.endOfMonth = true
	case '-':
	default:
		return p.errAt(`expected "-" or "~" in the date`)
	}
	p.pos++
	return nil
}

// unixTime reads the seconds after "@" as strtoul would (leading blanks,
// a sign) and fixes every field to that instant in UTC.
func (p *parser) unixTime(spec *Spec) error {
	for p.peek() != 0 && strings.IndexByte(" \t\n\v\f\r", p.peek()) >= 0 {
		p.pos++
	}
	neg := p.peek() == '-'
	if c := p.peek(); c == '+' || c == '-' {
		p.pos++
	}
	if c := p.peek(); c < '0' || c > '9' {
		return p.errAt("expected seconds after @")
	}
	v, err := p.number()
	if err != nil {
		return err
	}
	if neg && v != 0 {
		return fmt.Errorf("year before %d", minYear)
	}
	if v > uint64(time.Date(maxYear+1, 1, 1, 0, 0, 0, 0, time.UTC).Unix()) {
		return fmt.Errorf("@%d: year after %d", v, maxYear)
	}
	t := time.Unix(int64(v), 0).UTC()
	one := func(v int) chain { return chain{{v, -1, 0}} }
	spec.year, spec.month, spec.day = one(t.Year()), one(int(t.Month())), one(t.Day())
	spec.hour, spec.minute, spec.usec = one(t.Hour()), one(t.Minute()), one(t.Second()*usecPerSec)
	spec.utc, spec.zone, spec.loc = true, "", time.UTC
	return nil
}

// time reads HOUR:MINUTE[:SECOND]; nothing is 00:00:00.
func (p *parser) time(spec *Spec) error {
	zero := chain{{0, -1, 0}}
	if p.peek() == 0 {
		spec.hour, spec.minute, spec.usec = zero, zero, zero
		return nil
	}
	var err error
	if spec.hour, err = p.chain(false); err != nil {
		return err
	}
	if p.peek() != ':' {
		return p.errAt(`expected ":" after the hour`)
	}
	p.pos++
	if spec.minute, err = p.chain(false); err != nil {
		return err
	}
	if p.peek() == 0 {
		spec.usec = zero
		return nil
	}
	if p.peek() != ':' {
		return p.errAt(`expected ":" after the minute`)
	}
	p.pos++
	spec.usec, err = p.chain(true)
	return err
}

// chain reads "*" or a list of components. Seconds (usec) are read in
// microseconds and may have a fraction.
func (p *parser) chain(usec bool) (chain, error) {
	if p.peek() == '*' {
		p.pos++
		if usec {
			return chain{anySecond[0]}, nil
		}
		return nil, nil
	}
	unit := 1
	if usec {
		unit = usecPerSec
	}
	var c chain
	for {
		if len(c) == maxComponents {
			return nil, p.errAt(fmt.Sprintf("more than %d elements in a list", maxComponents))
		}
		start, err := p.decimal(usec)
		if err != nil {
			return nil, err
		}
		comp := component{start, -1, 0}
		if strings.HasPrefix(p.rest(), "..") {
			p.pos += 2
			if comp.stop, err = p.decimal(usec); err != nil {
				return nil, err
			}
			comp.repeat = unit
		}
		if p.peek() == '/' {
			p.pos++
			if comp.repeat, err = p.decimal(usec); err != nil {
				return nil, err
			}
			if comp.repeat == 0 {
				return nil, p.errAt("repetition /0")
			}
		} else if usec && comp.stop >= 0 && comp.start+unit > comp.stop {
			// As systemd: a range of seconds steps by 1 s unless told
			// otherwise, so "5..5" or "5..5.5" has no second step.
			return nil, fmt.Errorf("seconds range %s..%s is shorter than its 1 s step (add /STEP)",
				formatValue(comp.start, unit, 0, false), formatValue(comp.stop, unit, 0, false))
		}
		if c := p.peek(); c != 0 && strings.IndexByte(" ,-~:", c) < 0 {
			return nil, p.errAt("unexpected text")
		}
		c = append(c, comp)
		if p.peek() != ',' {
			return c, nil
		}
		p.pos++
	}
}

// decimal reads a number; in seconds (usec) with an optional fraction of
// which six digits count, the seventh rounding, as systemd reads it.
func (p *parser) decimal(usec bool) (int, error) {
	if c := p.peek(); c < '0' || c > '9' {
		return 0, p.errAt("expected a number")
	}
	at := p.pos
	v, err := p.number()
	if err != nil {
		return 0, err
	}
	if usec {
		if v > math.MaxUint64/usecPerSec {
			return 0, p.tooLarge(at)
		}
		v *= usecPerSec
		if strings.HasPrefix(p.rest(), ".") && !strings.HasPrefix(p.rest(), "..") {
			p.pos++
			frac, digits := 0, 0
			for ; digits < 6 && p.peek() >= '0' && p.peek() <= '9'; digits++ {
				frac = frac*10 + int(p.peek()-'0')
				p.pos++
			}
			if digits == 0 {
				return 0, p.errAt("expected a digit after the decimal point")
			}
			for ; digits < 6; digits++ {
				frac *= 10
			}
			if c := p.peek(); c >= '5' && c <= '9' {
				frac++
			}
			for p.peek() >= '0' && p.peek() <= '9' {
				p.pos++
			}
			v += uint64(frac)
		}
	}
	if v > math.MaxInt32 {
		return 0, p.tooLarge(at)
	}
	return int(v), nil
}

func (p *parser) tooLarge(at int) error {
	p.pos = at
	return p.errAt("number too large")
}

// number reads decimal digits, failing where an unsigned long overflows.
func (p *parser) number() (uint64, error) {
	at := p.pos
	var v uint64
	for p.peek() >= '0' && p.peek() <= '9' {
		d := uint64(p.peek() - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, p.tooLarge(at)
		}
		v = v*10 + d
		p.pos++
	}
	return v, nil
}

// equalFold compares ASCII letters without case, as systemd's strcaseeq
// does; strings.EqualFold would also match the Kelvin sign with "k".
func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
