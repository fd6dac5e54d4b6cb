package main

import (
	"runtime"
	"testing"
	"time"
)

// The memory a burst of passes used goes back to the OS once the loop has
// been quiet for quietFor, not while passes keep coming.
func TestMemoryReturnedWhenQuiet(t *testing.T) {
	m := &memoryReturner{}
	t.Cleanup(m.Stop)
	released := func() uint64 {
		var s runtime.MemStats
		runtime.ReadMemStats(&s)
		return s.HeapReleased
	}
	garbage := func() {
		for range 64 {
			b := make([]byte, 1<<20) // 64 MiB in all, ≥ returnAfter
			b[0] = 1
			runtime.KeepAlive(b)
		}
	}
	garbage()
	start := time.Now()
	m.Pass(0, nil)
	// Passes every quietFor/4 postpone the return.
	for time.Since(start) < 2*quietFor {
		time.Sleep(quietFor / 4)
		m.mu.Lock()
		r := m.returned
		m.mu.Unlock()
		if r != 0 {
			t.Fatalf("memory returned %v after the first pass while passes kept coming", time.Since(start))
		}
		m.Pass(0, nil)
	}
	before := released()
	deadline := time.Now().Add(5 * quietFor)
	for {
		m.mu.Lock()
		r := m.returned
		m.mu.Unlock()
		if r != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("memory not returned %v after the last pass", 5*quietFor)
		}
		time.Sleep(quietFor / 10)
	}
	time.Sleep(100 * time.Millisecond) // FreeOSMemory runs after returned is set
	if after := released(); after <= before {
		t.Errorf("HeapReleased %d → %d: nothing given back", before, after)
	}
	// Without new allocation a quiet spell returns nothing more.
	m.Pass(0, nil)
	m.mu.Lock()
	pending := m.timer.Stop()
	m.mu.Unlock()
	if pending {
		t.Error("a pass with little allocated since the last return scheduled another")
	}
}
