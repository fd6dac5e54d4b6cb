package calendar

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Next returns the first elapse strictly after after, in the spec's zone,
// or in after's zone if the spec names none (as systemd uses the local
// zone). false means the event never elapses again (a past year, or a
// date like *-02-30), or that systemd would give up on it (errLoop).
//
// It searches wall-clock times field by field, from the year down, as
// systemd does, and resolves the DST edge cases the same way:
//   - a time that does not exist (skipped at spring forward) is moved
//     forward across the gap and the search goes on from there, so
//     "02:30" does not elapse that day and "hourly" elapses at 03:00;
//   - a time that happens twice (fall back) elapses once, at its first
//     occurrence after after.
func (s *Spec) Next(after time.Time) (time.Time, bool) {
	t, err := s.next(after)
	return t, err == nil
}

var (
	errNever = errors.New("never elapses again")
	errLoop  = fmt.Errorf("no elapse found in %d steps (systemd gives up too)", maxIterations)
)

// maxIterations is systemd's safety valve (MAX_CALENDAR_ITERATIONS): a
// search that restarts this often fails, and systemd then does not start
// the timer. Giving up at the same step keeps the answers the same.
const maxIterations = 1000

func (s *Spec) next(after time.Time) (time.Time, error) {
	loc := s.loc
	if loc == nil {
		loc = after.Location()
	}
	t := after.Truncate(time.Microsecond).Add(time.Microsecond)
	if t.Unix() < 0 {
		t = time.Unix(0, 0)
	}
	c := civilOf(t.In(loc))
	var hint *dstHint
restart:
	for range maxIterations {
		c = exist(c, loc, hint)
		hint = nil
		for l := range levels {
			v, ok := s.match(l, c)
			if !ok {
				if l == yearLevel {
					return time.Time{}, errNever
				}
				c.bump(l - 1)
				continue restart
			}
			if v > *c.field(l) {
				*c.field(l) = v
				c.resetBelow(l)
			}
			r, h := settle(&c, loc)
			switch {
			case l == yearLevel && r != settled:
				return time.Time{}, errNever
			case r == outOfBounds:
				c.bump(l - 1)
				continue restart
			case r == moved:
				hint = h
				continue restart
			}
			if l == dayLevel && !s.onWeekday(c) {
				c.bump(dayLevel)
				continue restart
			}
		}
		for _, u := range instants(c, loc) {
			if e := time.Unix(u, int64(c.usec%usecPerSec)*1000).In(loc); e.After(after) {
				return e, nil
			}
		}
		return time.Time{}, errNever
	}
	return time.Time{}, errLoop
}

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

// dstHint is whether daylight saving time was in force, and the offset,
// where settle last moved the search. systemd's search keeps that flag
// (tm_isdst) on the wall clock it moves to, even when that clock is on
// the other side of a DST change, and the next mktime then reads the
// clock with the stale offset: "*-1/5-04" from December moves to month
// 16, that is April, then back to January with April's summer time, an
// hour before midnight, in December again, and so on until systemd gives
// up. Keeping the same flag gives the same answers.
type dstHint struct {
	dst    bool
	offset int64
}

// exist normalizes c as mktime does: overflowing fields carry; a wall
// clock in a gap moves forward by the gap's length; and a wall clock on
// the other side of a DST change from hint is read with hint's offset.
func exist(c civil, loc *time.Location, hint *dstHint) civil {
	c = c.carry()
	if loc == time.UTC {
		return c
	}
	u := c.asUTC()
	ins := instants(c, loc)
	if hint != nil && len(ins) > 0 && !slices.ContainsFunc(ins, func(i int64) bool { return time.Unix(i, 0).In(loc).IsDST() == hint.dst }) {
		return civilAt(u-hint.offset, c.usec%usecPerSec, loc)
	}
	if len(ins) > 0 {
		return c
	}
	before := slices.Min(offsets(u, loc)) // the offset before a forward jump
	return civilAt(u-before, c.usec%usecPerSec, loc)
}

// civilAt is the wall clock in loc at Unix second u plus usec.
func civilAt(u int64, usec int, loc *time.Location) civil {
	n := civilOf(time.Unix(u, 0).In(loc))
	n.usec += usec
	return n
}

const (
	outOfBounds = iota
	moved
	settled
)

// settle checks that the search's current wall clock exists and is in
// range. If it had to be normalized, c moves there with the field below
// the largest changed one reset (day 32 of March becomes April 1, not
// April 2, which would skip April 1) and the search restarts, reading c
// with the returned hint; a year past the last or a move backwards is
// outOfBounds.
func settle(c *civil, loc *time.Location) (int, *dstHint) {
	if c.year > maxYear {
		return outOfBounds, nil
	}
	n := exist(*c, loc, nil)
	for l := range levels {
		old, now := *c.field(l), *n.field(l)
		if now == old {
			continue
		}
		if now < old {
			return outOfBounds, nil
		}
		var hint *dstHint
		if ins := instants(n, loc); len(ins) > 0 && loc != time.UTC {
			t := time.Unix(ins[0], 0).In(loc)
			_, off := t.Zone()
			hint = &dstHint{t.IsDST(), int64(off)}
		}
		if l+1 < levels {
			m := n
			m.resetBelow(l)
			*n.field(l + 1) = *m.field(l + 1)
		}
		*c = n
		return moved, hint
	}
	return settled, nil
}

// match is the first value of level l's chain at or after c's.
func (s *Spec) match(l int, c civil) (int, bool) {
	switch l {
	case yearLevel:
		return s.year.next(c.year)
	case monthLevel:
		return s.month.next(c.month)
	case dayLevel:
		if s.endOfMonth {
			return s.day.fromEnd(daysIn(c.year, c.month)).next(c.day)
		}
		return s.day.next(c.day)
	case hourLevel:
		return s.hour.next(c.hour)
	case minuteLevel:
		return s.minute.next(c.minute)
	}
	return s.usec.next(c.usec)
}

// next is the least value in the chain at or after v; nil matches all.
// It may be past the field's range, which the caller's settle carries.
func (ch chain) next(v int) (int, bool) {
	if ch == nil {
		return v, true
	}
	best, ok := 0, false
	for _, p := range ch {
		k := p.start
		if k < v {
			if p.repeat == 0 {
				continue
			}
			k += p.repeat * ((v - p.start + p.repeat - 1) / p.repeat)
			if p.stop >= 0 && k > p.stop {
				continue
			}
		}
		if !ok || k < best {
			best, ok = k, true
		}
	}
	return best, ok
}

// fromEnd turns days counted back from the end of a month of n days into
// days of the month. A repetition still counts forward ("~07/2" is the
// 7th, 5th, 3rd and last day from the end), as in systemd.
func (ch chain) fromEnd(n int) chain {
	out := make(chain, len(ch))
	for i, p := range ch {
		out[i] = component{n + 1 - p.start, -1, p.repeat}
		if p.stop >= 0 {
			out[i].start, out[i].stop = n+1-p.stop, n+1-p.start
		}
	}
	return out
}

func daysIn(year, month int) int {
	return time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

func (s *Spec) onWeekday(c civil) bool {
	if s.weekdays == 0 {
		return true
	}
	wd := time.Date(c.year, time.Month(c.month), c.day, 0, 0, 0, 0, time.UTC).Weekday()
	return s.weekdays&(1<<((int(wd)+6)%7)) != 0
}
