package calendar

import (
	"errors"
	"fmt"
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
//   - a time that happens twice (fall back) elapses once: at the
//     occurrence on the side of the change the search is on (from before
//     the change, the first), which is glibc's choice (see mktime).
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
	t = t.In(loc)
	_, off := t.Zone()
	m := &mktime{loc: loc, guess: int64(off), hint: &dstHint{t.IsDST(), int64(off)}}
	c := civilOf(t)
restart:
	for range maxIterations {
		c, _ = m.normalize(c, m.hint)
		m.hint = nil
		for l := range levels {
			v, ok := s.match(l, c, m)
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
			switch r := m.settle(&c); {
			case l == yearLevel && r != settled:
				return time.Time{}, errNever
			case r == outOfBounds:
				c.bump(l - 1)
				continue restart
			case r == moved:
				continue restart
			}
			if l == dayLevel && !s.onWeekday(c, m) {
				c.bump(dayLevel)
				continue restart
			}
		}
		_, u := m.normalize(c, nil)
		if e := time.Unix(u, int64(c.usec%usecPerSec)*1000).In(loc); e.After(after) {
			return e, nil
		}
		// glibc's choice of a repeated wall clock fell before after;
		// systemd would return it, but an elapse must move forward.
		for _, u := range instants(c, loc) {
			if e := time.Unix(u, int64(c.usec%usecPerSec)*1000).In(loc); e.After(after) {
				return e, nil
			}
		}
		return time.Time{}, errNever
	}
	return time.Time{}, errLoop
}

// match is the first value of level l's chain at or after c's.
func (s *Spec) match(l int, c civil, m *mktime) (int, bool) {
	switch l {
	case yearLevel:
		return s.year.next(c.year)
	case monthLevel:
		return s.month.next(c.month)
	case dayLevel:
		if s.endOfMonth {
			s.day.touchEnds(c, m)
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

// touchEnds makes the mktime calls systemd makes to find the days from
// the month's end (two for each element: its start and its stop, -1 for
// none, which lands in the next month). Only their effect on glibc's
// guess of the offset matters: it decides which of a repeated wall clock
// the search takes later on ("*-*~07 02:50 Europe/Berlin" on 2026-10-25,
// searched from 02:10 CEST, elapses at 02:50 CET, as in systemd).
func (ch chain) touchEnds(c civil, m *mktime) {
	for _, p := range ch {
		for _, k := range [2]int{p.start, p.stop} {
			d := c
			d.month, d.day = c.month+1, 1-k
			m.normalize(d, nil)
		}
	}
}

func daysIn(year, month int) int {
	return time.Date(year, time.Month(month)+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

func (s *Spec) onWeekday(c civil, m *mktime) bool {
	if s.weekdays == 0 {
		return true
	}
	m.normalize(c, nil) // as systemd, for its effect on the guess
	wd := time.Date(c.year, time.Month(c.month), c.day, 0, 0, 0, 0, time.UTC).Weekday()
	return s.weekdays&(1<<((int(wd)+6)%7)) != 0
}
