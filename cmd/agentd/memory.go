package main

import (
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/agentd/agentd/reconcile"
)

const (
	// returnAfter is how much the heap must have allocated since memory
	// was last given back before the next quiet spell gives it back again.
	returnAfter = 8 << 20
	// quietFor is how long the loop must have run no pass first: while
	// changes keep coming the runtime keeps its memory for them.
	quietFor = time.Second
)

// memoryReturner gives the memory passes used back to the OS once the loop
// has been quiet for a second. Without it the runtime returns freed memory
// only gradually, over minutes, from a background scavenger that wakes
// every few milliseconds while there is any to return: measured, an idle
// agent then cost 0.2–0.4 ms of CPU per second (the scavenger's madvise
// calls) and held 48 MiB at 1,000 units where its live heap is 7 MiB. One
// forced GC (a few ms at 1,000 units) after each quiet spell that follows
// ≥ 8 MiB of allocation ends both. Observer methods run on the loop's
// goroutine; the return itself runs on a timer's.
type memoryReturner struct {
	reconcile.NopObserver
	mu       sync.Mutex
	timer    *time.Timer
	returned uint64 // heap bytes allocated when memory was last returned
	stopped  bool
}

func (m *memoryReturner) Pass(time.Duration, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped || heapAllocated()-m.returned < returnAfter {
		return
	}
	if m.timer == nil {
		m.timer = time.AfterFunc(quietFor, m.giveBack)
	} else {
		m.timer.Reset(quietFor) // a pass since: wait for quiet again
	}
}

func (m *memoryReturner) giveBack() {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return
	}
	m.returned = heapAllocated()
	m.mu.Unlock()
	debug.FreeOSMemory()
}

// Stop cancels a pending return; Pass does nothing after it.
func (m *memoryReturner) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stopped = true
	if m.timer != nil {
		m.timer.Stop()
	}
}

// heapAllocated is the bytes the heap has allocated since the process
// started (cumulative; a cheap read, no stop-the-world).
func heapAllocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
