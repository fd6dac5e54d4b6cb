package reconcile

import (
	"errors"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// timespanCases are the spans ParseTimespan is checked on, each against
// its value here and against systemd-analyze timespan. want < 0 means
// refused; tooLong marks what systemd takes and a time.Duration cannot hold.
var timespanCases = []struct {
	in      string
	want    time.Duration
	tooLong bool
}{
	{in: "0", want: 0},
	{in: "5", want: 5 * time.Second},
	{in: "2s", want: 2 * time.Second},
	{in: "500ms", want: 500 * time.Millisecond},
	{in: "1.5", want: 1500 * time.Millisecond},
	{in: ".5", want: 500 * time.Millisecond},
	{in: "1min 30s", want: 90 * time.Second},
	{in: "1min30s", want: 90 * time.Second},
	{in: "1m30", want: 90 * time.Second},
	{in: "1m 30", want: 90 * time.Second},
	{in: "1h", want: time.Hour},
	{in: "2d", want: 48 * time.Hour},
	{in: "1w", want: 7 * 24 * time.Hour},
	{in: "1M", want: 2629800 * time.Second},
	{in: "1y", want: 31557600 * time.Second},
	{in: "3us", want: 3 * time.Microsecond},
	{in: "3usec", want: 3 * time.Microsecond},
	{in: "3µs", want: 3 * time.Microsecond},
	{in: "3μs", want: 3 * time.Microsecond},
	{in: "7msec", want: 7 * time.Millisecond},
	{in: "2 minutes", want: 2 * time.Minute},
	{in: "2minute", want: 2 * time.Minute},
	{in: "1 hour 2 min 3 sec", want: time.Hour + 2*time.Minute + 3*time.Second},
	{in: "1hr", want: time.Hour},
	{in: "2 seconds", want: 2 * time.Second},
	{in: "1 day", want: 24 * time.Hour},
	{in: " 5s ", want: 5 * time.Second},
	{in: "\t5\n", want: 5 * time.Second},
	{in: "5 s", want: 5 * time.Second},
	{in: "+5", want: 5 * time.Second},
	{in: "0.5h", want: 30 * time.Minute},
	{in: "1.5ms", want: 1500 * time.Microsecond},
	{in: "1.0000009", want: time.Second},  // below a microsecond: dropped, as systemd drops it
	{in: "1.9us", want: time.Microsecond}, // idem
	{in: "12.34 .56", want: 12900 * time.Millisecond},
	{in: "12.34s.56", want: 12900 * time.Millisecond},
	{in: "1s1s1s", want: 3 * time.Second},
	{in: "007", want: 7 * time.Second},
	{in: "1h0m0s", want: time.Hour}, // Go's Duration.String()
	{in: "1m30s", want: 90 * time.Second},
	{in: "292y", want: 292 * 31557600 * time.Second},
	{in: "1000y", want: -1, tooLong: true},
	{in: "99999999999999999999", want: -1}, // over strtoll's range: systemd refuses it too

	{in: "", want: -1},
	{in: "   ", want: -1},
	{in: "-1", want: -1},
	{in: "-0", want: -1},
	{in: "x", want: -1},
	{in: "5x", want: -1},
	{in: "5 x", want: -1},
	{in: "5sx", want: -1},
	{in: "3.", want: -1},
	{in: "3.s", want: -1},
	{in: "3. 1", want: -1},
	{in: ".", want: -1},
	{in: "+.5", want: -1},
	{in: "+ 5", want: -1},
	{in: "12.34.56", want: -1},
	{in: "1,5", want: -1},
	{in: "0x10", want: -1},
	{in: "5S", want: -1},
	{in: "five", want: -1},
	{in: "infinityx", want: -1},
	{in: "infinity 5", want: -1},
	{in: "5 infinity", want: -1},
}

func TestParseTimespan(t *testing.T) {
	for _, tc := range timespanCases {
		got, err := ParseTimespan(tc.in)
		switch {
		case tc.want < 0:
			if err == nil || errors.Is(err, ErrInfinity) || !strings.Contains(err.Error(), strconv.Quote(tc.in)) {
				t.Errorf("ParseTimespan(%q) = %v, %v; want an error naming the value", tc.in, got, err)
			}
		case err != nil || got != tc.want:
			t.Errorf("ParseTimespan(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"infinity", " infinity ", "infinity\n"} {
		if _, err := ParseTimespan(in); !errors.Is(err, ErrInfinity) {
			t.Errorf("ParseTimespan(%q): %v, want ErrInfinity", in, err)
		}
	}
	// What the agent prints (Duration.String) reads back as the same span.
	for _, d := range []time.Duration{0, time.Microsecond, 1500 * time.Microsecond, 90 * time.Second, 25*time.Hour + time.Second, 1500 * time.Millisecond} {
		if got, err := ParseTimespan(d.String()); err != nil || got != d {
			t.Errorf("ParseTimespan(%q) = %v, %v; want %v", d.String(), got, err, d)
		}
	}
}

// TestParseTimespanAgreesWithSystemd runs systemd-analyze timespan on every
// case: the parser takes what systemd takes, with the same value in
// microseconds, and refuses what systemd refuses. Without systemd-analyze
// it skips, unless CI=true (systemdTool).
func TestParseTimespanAgreesWithSystemd(t *testing.T) {
	bin := systemdTool(t, "systemd-analyze")
	usecLine := regexp.MustCompile(`(?m)^\s*μs: (\d+)$`)
	cases := append(timespanCases[:len(timespanCases):len(timespanCases)], struct {
		in      string
		want    time.Duration
		tooLong bool
	}{in: "infinity", want: -2})
	for _, tc := range cases {
		out, err := exec.Command(bin, "timespan", "--", tc.in).CombinedOutput()
		systemdTakes := err == nil
		var systemdUsec uint64
		if systemdTakes {
			m := usecLine.FindSubmatch(out)
			if m == nil {
				t.Fatalf("systemd-analyze timespan %q: no μs line in %q", tc.in, out)
			}
			systemdUsec, _ = strconv.ParseUint(string(m[1]), 10, 64)
		}
		got, perr := ParseTimespan(tc.in)
		switch {
		case tc.in == "infinity":
			if !systemdTakes || !errors.Is(perr, ErrInfinity) {
				t.Errorf("%q: systemd takes it: %v (%s); ours: %v", tc.in, systemdTakes, out, perr)
			}
		case tc.tooLong:
			if !systemdTakes || perr == nil || !strings.Contains(perr.Error(), "too long") {
				t.Errorf("%q: systemd takes it: %v (%s); ours %v, %v, want too long", tc.in, systemdTakes, out, got, perr)
			}
		case systemdTakes != (perr == nil):
			t.Errorf("%q: systemd takes it: %v (%s); ours: %v, %v", tc.in, systemdTakes, strings.TrimSpace(string(out)), got, perr)
		case systemdTakes && uint64(got/time.Microsecond) != systemdUsec:
			t.Errorf("%q: systemd reads %d µs, ours %v", tc.in, systemdUsec, got)
		}
	}
}
