package calendar

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/citest"
)

// TestAgreesWithSystemdRandom compares Parse, String and Next with
// systemd-analyze on expressions drawn at random (from a fixed seed, so a
// failure repeats) from the whole grammar, in and out of range, to find
// the cases a hand-made list misses.
func TestAgreesWithSystemdRandom(t *testing.T) {
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		citest.Unavailable(t, "systemd-analyze not found: %v", err)
	}
	n := 400
	if testing.Short() {
		n = 60
	}
	r := rand.New(rand.NewPCG(38, 5))
	dst := []string{"2026-03-29T00:30:00Z", "2026-10-25T00:45:00Z", "2026-11-01T05:30:00Z", "2026-03-08T06:30:00Z"}
	for i := range n {
		expr := randomExpr(r)
		bases := []string{
			time.Unix(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix()+r.Int64N(3*365*86400), 0).UTC().Format(time.RFC3339),
			dst[i%len(dst)],
		}
		t.Run(fmt.Sprintf("%d/%q", i, expr), func(t *testing.T) {
			t.Parallel()
			s, err := Parse(expr)
			for _, base := range bases {
				want := analyze(t, tool, expr, base)
				if want.ok != (err == nil) {
					t.Fatalf("systemd ok=%v %s %s; Parse: %v", want.ok, want.normalized, want.err, err)
				}
				if !want.ok {
					return
				}
				agree(t, s, want, base)
			}
		})
	}
}

// randomExpr draws [WEEKDAYS] [DATE] [TIME] [ZONE] or a shorthand, with
// values a little past each field's range now and then.
func randomExpr(r *rand.Rand) string {
	var parts []string
	if r.IntN(3) == 0 {
		parts = append(parts, randomWeekdays(r))
	}
	switch r.IntN(5) {
	case 1:
		parts = append(parts, randomField(r, 1, 12, 0)+"-"+randomField(r, 1, 31, 0))
	case 2:
		parts = append(parts, randomField(r, 2024, 2031, 0)+"-"+randomField(r, 1, 12, 0)+"-"+randomField(r, 1, 31, 0))
	case 3:
		parts = append(parts, randomField(r, 24, 31, 0)+"-"+randomField(r, 1, 12, 0)+"~"+randomField(r, 1, 29, 0))
	case 4:
		parts = append(parts, "*-"+randomField(r, 1, 12, 0)+"~"+randomField(r, 1, 8, 0))
	}
	switch r.IntN(5) {
	case 1, 2:
		parts = append(parts, randomField(r, 0, 23, 0)+":"+randomField(r, 0, 59, 0))
	case 3:
		parts = append(parts, randomField(r, 0, 23, 0)+":"+randomField(r, 0, 59, 0)+":"+randomField(r, 0, 59, 0.3))
	case 4:
		shorthands := []string{"minutely", "Hourly", "daily", "weekly", "monthly", "quarterly", "semi-annually", "yearly", "now"}
		parts = []string{shorthands[r.IntN(len(shorthands))]}
	}
	if r.IntN(40) == 0 {
		parts = []string{fmt.Sprintf("@%d", r.Int64N(8e9))}
	}
	// Not Europe/Dublin: on its spring-forward day systemd's answers
	// follow glibc's mktime search in ways Next does not reproduce (see
	// the package doc).
	zones := []string{"", "", "UTC", "utc", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago",
		"Asia/Kolkata", "America/Havana", "Pacific/Chatham", "Africa/Casablanca"}
	if z := zones[r.IntN(len(zones))]; z != "" {
		parts = append(parts, z)
	}
	return strings.Join(parts, " ")
}

func randomWeekdays(r *rand.Rand) string {
	names := []string{"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}
	long := []string{"monday", "TUESDAY", "Wednesday", "thursday", "Friday", "saturday", "Sunday"}
	name := func() string {
		i := r.IntN(7)
		if r.IntN(3) == 0 {
			return long[i]
		}
		return names[i]
	}
	var items []string
	for range 1 + r.IntN(3) {
		switch r.IntN(4) {
		case 0:
			items = append(items, name()+".."+name())
		case 1:
			items = append(items, name()+"-"+name())
		default:
			items = append(items, name())
		}
	}
	return strings.Join(items, ",")
}

// randomField draws "*" or a list of values, ranges and repetitions
// around lo..hi; frac > 0 adds fractions to some values (seconds).
func randomField(r *rand.Rand, lo, hi int, frac float64) string {
	if r.IntN(4) == 0 {
		return "*"
	}
	value := func() string {
		v := lo - 1 + r.IntN(hi-lo+3)
		if v < 0 {
			v = 0
		}
		s := fmt.Sprint(v)
		if r.IntN(2) == 0 && v < 10 {
			s = "0" + s
		}
		if frac > 0 && r.Float64() < frac {
			s += []string{".5", ".25", ".125", ".0000005"}[r.IntN(4)]
		}
		return s
	}
	var items []string
	for range 1 + r.IntN(2) {
		switch r.IntN(5) {
		case 0:
			items = append(items, value()+".."+value())
		case 1:
			items = append(items, value()+"/"+fmt.Sprint(1+r.IntN(max(2, (hi-lo)/2))))
		case 2:
			items = append(items, value()+".."+value()+"/"+fmt.Sprint(1+r.IntN(5)))
		default:
			items = append(items, value())
		}
	}
	return strings.Join(items, ",")
}
