package reconcile

import (
	"time"

	"github.com/agentd/agentd/internal/timespan"
)

// ErrInfinity is returned by ParseTimespan for "infinity": the span is
// valid systemd syntax, and the caller decides whether it means something.
var ErrInfinity = timespan.ErrInfinity

// ParseTimespan reads a time span as systemd reads every *Sec= setting;
// see timespan.Parse, the one parser of spans, which lives in a leaf
// package so that the calendar package can share it without importing
// the domain.
func ParseTimespan(s string) (time.Duration, error) {
	return timespan.Parse(s)
}
