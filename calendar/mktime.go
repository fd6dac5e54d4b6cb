package calendar

import (
	"slices"
	"time"
)

// civil is a wall-clock time as the search moves it: a field may run past
// its range until normalized. usec is the microsecond of the minute.
type civil struct{ year, month, day, hour, minute, usec int }

const (
	yearLevel = iota
	monthLevel
	dayLevel
	hourLevel
	minuteLevel
	usecLevel
	levels
)

func civilOf(t time.Time) civil {
	return civil{t.Year(), int(t.Month()), t.Day(), t.Hour(), t.Minute(), t.Second()*usecPerSec + t.Nanosecond()/1000}
}

func (c *civil) field(l int) *int {
	return [...]*int{&c.year, &c.month, &c.day, &c.hour, &c.minute, &c.usec}[l]
}

// resetBelow sets the fields below level l to their first value.
func (c *civil) resetBelow(l int) {
	for k := l + 1; k < levels; k++ {
		*c.field(k) = 0
		if k == monthLevel || k == dayLevel {
			*c.field(k) = 1
		}
	}
}

// bump moves to the start of the next value of level l.
func (c *civil) bump(l int) {
	*c.field(l)++
	c.resetBelow(l)
}

// carry normalizes overflowing fields (hour 25, day 32) into the next
// larger ones, as mktime does.
func (c civil) carry() civil {
	return civilOf(time.Date(c.year, time.Month(c.month), c.day, c.hour, c.minute,
		c.usec/usecPerSec, c.usec%usecPerSec*1000, time.UTC))
}

// asUTC is the wall clock's whole seconds read as if it were UTC.
func (c civil) asUTC() int64 {
	return time.Date(c.year, time.Month(c.month), c.day, c.hour, c.minute, c.usec/usecPerSec, 0, time.UTC).Unix()
}

// offsets are the UTC offsets that a wall clock reading u (as UTC) may
// have: those in force half a day either side and at u. Real zones do not
// change twice within a day.
func offsets(u int64, loc *time.Location) []int64 {
	var offs []int64
	for _, x := range [...]int64{u - 14*3600, u, u + 14*3600} {
		_, o := time.Unix(x, 0).In(loc).Zone()
		if !slices.Contains(offs, int64(o)) {
			offs = append(offs, int64(o))
		}
	}
	return offs
}

// instants are the Unix seconds, ascending, whose wall clock in loc reads
// c: none in a gap (spring forward), two in an overlap (fall back).
func instants(c civil, loc *time.Location) []int64 {
	u := c.asUTC()
	if loc == time.UTC {
		return []int64{u}
	}
	var ins []int64
	for _, o := range offsets(u, loc) {
		if _, got := time.Unix(u-o, 0).In(loc).Zone(); int64(got) == o {
			ins = append(ins, u-o)
		}
	}
	slices.Sort(ins)
	return ins
}

// mktime turns wall clocks into instants as glibc's mktime does inside
// systemd's search, so that the search ends where systemd's ends. Three
// things of glibc's carry over from call to call, and decide the DST edge
// cases:
//   - guess: the offset of the last call. A wall clock that happens twice
//     (fall back) is read with it if it is one of the two, so a search
//     that starts in the first pass stays there, and one that starts in
//     the second stays there; calls on other days (systemd's end-of-month
//     and weekday checks) move it.
//   - a wall clock that does not exist (spring forward) moves forward by
//     the gap, as glibc does (also where the DST flag is inverted, as
//     in Europe/Dublin).
//   - hint: the DST flag (tm_isdst) systemd's search keeps on a wall clock
//     it moved to (see settle).
type mktime struct {
	loc   *time.Location
	guess int64
	hint  *dstHint
}

// dstHint is whether daylight saving time was in force, and the offset,
// where settle last moved the search. systemd keeps that flag (tm_isdst)
// on the wall clock it moves to, even when that clock is on the other
// side of a DST change, and the next mktime then reads the clock with the
// stale offset: "*-1/5-04" from December moves to month 16, that is
// April, then back to January with April's summer time, an hour before
// midnight, in December again, and so on until systemd gives up.
type dstHint struct {
	dst    bool
	offset int64
}

// normalize is one mktime call: c with overflowing fields carried, read
// in the zone (with the DST flag of hint, if any), as the wall clock it
// becomes and its instant (whole seconds).
func (m *mktime) normalize(c civil, hint *dstHint) (civil, int64) {
	c = c.carry()
	u := c.asUTC()
	if m.loc == time.UTC {
		return c, u
	}
	isDST := func(i int64) bool { return time.Unix(i, 0).In(m.loc).IsDST() }
	pick := int64(0)
	switch ins := instants(c, m.loc); {
	case len(ins) == 0: // a gap: read with the offset before it, which moves forward
		pick = u - slices.Min(offsets(u, m.loc))
	case hint != nil && !slices.ContainsFunc(ins, func(i int64) bool { return isDST(i) == hint.dst }):
		pick = u - hint.offset // the stale flag: read with its offset
	case hint != nil:
		pick = ins[slices.IndexFunc(ins, func(i int64) bool { return isDST(i) == hint.dst })]
	default:
		pick = ins[0]
		for _, i := range ins {
			if u-i == m.guess {
				pick = i
			}
		}
	}
	m.guess = u - pick
	n := civilOf(time.Unix(pick, 0).In(m.loc))
	n.usec += c.usec % usecPerSec
	return n, pick
}

const (
	outOfBounds = iota
	moved
	settled
)

// settle checks that the search's current wall clock exists and is in
// range. If it had to be normalized, c moves there with the field below
// the largest changed one reset (day 32 of March becomes April 1, not
// April 2, which would skip April 1), the next normalize reads it with
// the moved-to DST flag (m.hint), and the search restarts. A year past the
// last, or a move backwards, is outOfBounds.
func (m *mktime) settle(c *civil) int {
	if c.year > maxYear {
		return outOfBounds
	}
	n, u := m.normalize(*c, nil)
	for l := range levels {
		old, now := *c.field(l), *n.field(l)
		if now == old {
			continue
		}
		if now < old {
			return outOfBounds
		}
		if m.loc != time.UTC {
			t := time.Unix(u, 0).In(m.loc)
			_, off := t.Zone()
			m.hint = &dstHint{t.IsDST(), int64(off)}
		}
		if l+1 < levels {
			r := n
			r.resetBelow(l)
			*n.field(l + 1) = *r.field(l + 1)
		}
		*c = n
		return moved
	}
	return settled
}
