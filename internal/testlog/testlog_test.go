package testlog

import (
	"strings"
	"sync"
	"testing"
)

// Concurrent writes all land, whole, and String reads them while writers
// still write (run with -race to check the locking).
func TestBufferConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if _, err := b.Write([]byte("line\n")); err != nil {
					t.Error(err)
				}
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := strings.Count(b.String(), "line\n"); got != 800 {
		t.Fatalf("%d lines, want 800", got)
	}
	if len(b.String()) != 800*len("line\n") {
		t.Fatalf("torn writes: %d bytes", len(b.String()))
	}
}
