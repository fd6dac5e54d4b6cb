package timespan

import (
	"testing"
	"time"
)

// TestFormat checks that Format writes systemd's style and that Parse
// reads every output back to the same span. (Parse itself is checked
// against systemd-analyze through reconcile's ParseTimespan tests.)
func TestFormat(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0"},
		{-time.Hour, "0"},
		{time.Nanosecond, "0"},
		{time.Microsecond, "1us"},
		{1500 * time.Millisecond, "1s 500ms"},
		{30 * time.Minute, "30min"},
		{90 * time.Minute, "1h 30min"},
		{4 * time.Hour, "4h"},
		{36 * time.Hour, "1d 12h"},
		{7 * 24 * time.Hour, "1w"},
		{8*24*time.Hour + time.Second, "1w 1d 1s"},
	} {
		if got := Format(c.d); got != c.want {
			t.Errorf("Format(%v) = %q, want %q", c.d, got, c.want)
		}
		if c.d < time.Microsecond {
			continue
		}
		back, err := Parse(c.want)
		if err != nil || back != c.d.Truncate(time.Microsecond) {
			t.Errorf("Parse(%q) = %v, %v; want %v", c.want, back, err, c.d)
		}
	}
}
