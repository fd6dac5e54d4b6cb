package calendar

import (
	"reflect"
	"testing"
	"time"
)

// sameSpec compares two specs field by field, and their zones by name
// (each Parse loads its own *time.Location).
func sameSpec(a, b *Spec) bool {
	x, y := *a, *b
	x.loc, y.loc = nil, nil
	return reflect.DeepEqual(x, y) && (a.loc == nil) == (b.loc == nil) && (a.loc == nil || a.loc.String() == b.loc.String())
}

// FuzzParse checks that Parse never panics, that the normalized form
// reads back to the same Spec, and that Next ends, moves forward and
// agrees between the two.
func FuzzParse(f *testing.F) {
	for _, s := range append(append([]string{}, agreementValid...), agreementInvalid...) {
		f.Add(s)
	}
	base := time.Date(2026, 10, 25, 0, 30, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := Parse(s)
		if err != nil {
			return
		}
		again, err := Parse(spec.String())
		if err != nil {
			t.Fatalf("Parse(%q) = %q, which does not parse: %v", s, spec, err)
		}
		if !sameSpec(spec, again) {
			t.Fatalf("Parse(%q) = %q = %#v, which parses to %#v", s, spec, *spec, *again)
		}
		next, ok := spec.Next(base)
		if ok && !next.After(base) {
			t.Fatalf("%q: Next(%v) = %v, not after", s, base, next)
		}
		if n2, ok2 := again.Next(base); ok2 != ok || !n2.Equal(next) {
			t.Fatalf("%q: Next = %v %v, of the normalized form %v %v", s, next, ok, n2, ok2)
		}
	})
}

// FuzzParseWindow checks that ParseWindow never panics, that String reads
// back to the same window, and that Open answers consistently.
func FuzzParseWindow(f *testing.F) {
	for _, s := range []string{"Tue 02:00-04:00 Europe/Berlin", "Mon..Fri 22:00-06:00 UTC", "daily for 30min",
		"Sat *-*-01 00:00 Europe/Berlin for 4h", "2020-01-01 for 1h", "*-*-* 02,03:00-04:00", "hourly for 2h"} {
		f.Add(s)
	}
	at := time.Date(2026, 3, 29, 0, 30, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		w, err := ParseWindow(s)
		if err != nil {
			return
		}
		again, err := ParseWindow(w.String())
		if err != nil || again.String() != w.String() || again.Length != w.Length || !sameSpec(w.Start, again.Start) {
			t.Fatalf("ParseWindow(%q) = %q, which reads back as %q, %v", s, w, again, err)
		}
		open, opens, closes := w.Open(at)
		switch {
		case open && (opens.After(at) || !closes.After(at)):
			t.Fatalf("%q open at %v, from %v to %v", s, at, opens, closes)
		case !open && !opens.IsZero() && (!opens.After(at) || closes.Sub(opens) != w.Length):
			t.Fatalf("%q closed at %v, next %v to %v", s, at, opens, closes)
		}
	})
}
