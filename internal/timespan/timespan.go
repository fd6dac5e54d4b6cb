// Package timespan reads systemd time spans (systemd.time(7), "PARSING
// TIME SPANS") the way systemd reads every *Sec= setting. It is a leaf
// package with no dependencies beyond the standard library, so both the
// domain (reconcile) and the pure parsers beside it (calendar) share one
// reading of a span. Safe for concurrent use: it holds no state.
package timespan

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// ErrInfinity is returned by Parse for "infinity": the span is
// valid systemd syntax, and the caller decides whether it means something.
var ErrInfinity = errors.New("infinity")

// timespanUnits are systemd's time span suffixes in microseconds, in the
// order systemd tries them (extract_multiplier in time-util.c): the first
// prefix that matches wins, so "ms" is tried before "m" and "min" before
// "m", and what follows a suffix is the next number ("1min30s").
var timespanUnits = []struct {
	suffix string
	usec   uint64
}{
	{"seconds", 1e6}, {"second", 1e6}, {"sec", 1e6}, {"s", 1e6},
	{"minutes", 60e6}, {"minute", 60e6}, {"min", 60e6},
	{"months", 2629800e6}, {"month", 2629800e6}, {"M", 2629800e6},
	{"msec", 1e3}, {"ms", 1e3}, {"m", 60e6},
	{"hours", 3600e6}, {"hour", 3600e6}, {"hr", 3600e6}, {"h", 3600e6},
	{"days", 86400e6}, {"day", 86400e6}, {"d", 86400e6},
	{"weeks", 604800e6}, {"week", 604800e6}, {"w", 604800e6},
	{"years", 31557600e6}, {"year", 31557600e6}, {"y", 31557600e6},
	{"usec", 1}, {"us", 1}, {"μs", 1}, {"µs", 1}, // U+03BC and U+00B5
}

// maxSpanUsec is the longest span a time.Duration holds, in microseconds.
const maxSpanUsec = uint64(math.MaxInt64 / int64(time.Microsecond))

// timespanSpace is what systemd skips between the parts of a span.
const timespanSpace = " \t\n\r"

// Parse reads a time span as systemd reads every *Sec= setting
// (systemd.time(7), parse_sec in systemd's time-util.c): numbers, each with
// an optional unit ("2s", "500ms", "1min 30s", "1h", "2d", "3us", "1M"), a
// bare number being seconds; fractions ("1.5", "0.5h") down to the
// microsecond, the rest dropped as systemd drops it; parts added up.
// "infinity" returns ErrInfinity, since what it means depends on the
// setting. It is the one parser of time spans: [X-Agentd] settings take
// what systemd's own settings take, so operators can copy values between
// them. Spans longer than a time.Duration (292 years) are refused, where
// systemd would take them.
func Parse(s string) (time.Duration, error) {
	p := strings.TrimLeft(s, timespanSpace)
	if rest, ok := strings.CutPrefix(p, "infinity"); ok {
		if strings.Trim(rest, timespanSpace) != "" {
			return 0, fmt.Errorf("time span %q: text after \"infinity\"", s)
		}
		return 0, ErrInfinity
	}
	var usec uint64
	something := false
	for {
		p = strings.TrimLeft(p, timespanSpace)
		if p == "" {
			if !something {
				return 0, fmt.Errorf("time span %q: empty", s)
			}
			break
		}
		// A number as systemd reads it with strtoll: an optional "+", then
		// digits ("-0" is refused too); then an optional fraction, which
		// may stand alone (".5", not "+.5").
		num, plus := strings.CutPrefix(p, "+")
		if strings.HasPrefix(num, "-") {
			return 0, fmt.Errorf("time span %q: negative", s)
		}
		digits := len(num) - len(strings.TrimLeft(num, "0123456789"))
		whole, rest := num[:digits], num[digits:]
		var frac string
		if strings.HasPrefix(rest, ".") && !(plus && whole == "") {
			rest = rest[1:]
			n := len(rest) - len(strings.TrimLeft(rest, "0123456789"))
			frac, rest = rest[:n], rest[n:]
			if frac == "" {
				// "3.", "3.s", "3. 1": systemd wants a digit after the point.
				return 0, fmt.Errorf("time span %q: no digit after the decimal point", s)
			}
		} else if whole == "" {
			return 0, fmt.Errorf("time span %q: %q is not a number", s, clip(p))
		}
		multiplier, after, unit := uint64(1e6), strings.TrimLeft(rest, timespanSpace), false
		for _, u := range timespanUnits {
			if r, ok := strings.CutPrefix(after, u.suffix); ok {
				multiplier, after, unit = u.usec, r, true
				break
			}
		}
		if !unit && rest != "" && after == rest {
			// Neither a unit nor a space after the number: "12.34.56",
			// "5x". systemd takes "12.34 .56" and "12.34s.56".
			return 0, fmt.Errorf("time span %q: unknown unit at %q (use us, ms, s, min, h, d, w, M or y)", s, clip(rest))
		}
		p = after
		n, err := parseUint(whole)
		if err != nil || n > maxSpanUsec/multiplier {
			return 0, fmt.Errorf("time span %q: too long", s)
		}
		usec += n * multiplier
		m := multiplier / 10
		for _, d := range frac {
			usec += uint64(d-'0') * m
			m /= 10
		}
		if usec > maxSpanUsec {
			return 0, fmt.Errorf("time span %q: too long", s)
		}
		something = true
	}
	return time.Duration(usec) * time.Microsecond, nil
}

// parseUint reads decimal digits ("" is 0, as strtoll reads "."), failing
// on overflow.
func parseUint(digits string) (uint64, error) {
	var n uint64
	for _, d := range digits {
		if n > (math.MaxUint64-9)/10 {
			return 0, errors.New("overflow")
		}
		n = n*10 + uint64(d-'0')
	}
	return n, nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 20 {
		return s[:20] + "…"
	}
	return s
}

// formatUnits are the units Format writes, largest first, as systemd's
// format_timespan writes them (without months and years, which are not
// whole days and so would not read back exactly).
var formatUnits = []struct {
	suffix string
	d      time.Duration
}{
	{"w", 7 * 24 * time.Hour}, {"d", 24 * time.Hour}, {"h", time.Hour},
	{"min", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}, {"us", time.Microsecond},
}

// Format writes d as systemd writes a span ("1h 30min", "4h", "2d 12h"),
// so that what agentd prints can be pasted back into a setting: Parse
// reads it back exactly for any d that is a whole number of microseconds
// (smaller parts are dropped, as systemd keeps microseconds only). Zero
// and negative spans are "0".
func Format(d time.Duration) string {
	if d < time.Microsecond {
		return "0"
	}
	var parts []string
	for _, u := range formatUnits {
		if n := d / u.d; n > 0 {
			parts = append(parts, fmt.Sprintf("%d%s", n, u.suffix))
			d -= n * u.d
		}
	}
	return strings.Join(parts, " ")
}
