package registry

import (
	"context"
	"math/rand/v2"
	"time"
)

const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 10 * time.Second
)

// backoffDelay is the wait before retry number n (0-based): exponential
// from 100 ms, capped at 10 s, with "equal jitter" (uniform in [d/2, d]).
func backoffDelay(n int) time.Duration {
	d := maxBackoff
	if n < 10 {
		d = min(minBackoff<<n, maxBackoff)
	}
	return d/2 + rand.N(d/2+1)
}

// sleepCtx waits d or until ctx is done, returning ctx.Err() in that case.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
