package main

import (
	"runtime"
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
	// changes keep coming the runtime keeps its memory and its CPUs.
	quietFor = time.Second
)

// quietSpell makes the runtime idle when the loop is: once no pass has run
// for a second it gives the memory passes used back to the OS and, in a
// process that is the agent's alone, runs on one CPU with no collection on
// the runtime's two-minute timer; the next pass gets all of it back before
// it starts.
//
// Memory: without it the runtime returns freed memory only gradually, over
// minutes, from a background scavenger that wakes every few milliseconds
// while there is any to return: measured, an idle agent then cost 0.2–0.4
// ms of CPU per second (the scavenger's madvise calls) and held 48 MiB at
// 1,000 units where its live heap is 7 MiB. One forced GC (a few ms at
// 1,000 units) after each quiet spell that follows ≥ 8 MiB of allocation
// ends both.
//
// One CPU: the idle agent's one regular work is the lease renewal, one
// message out and one in every 7.5 s. With two Ps the runtime hands that
// message between threads (a second thread is woken to look for work, the
// monitor thread polls while either runs): measured side by side, four
// processes each way, 0.106–0.160 ms of CPU per second with two Ps and
// 0.064–0.089 with one. A pass, a burst's jobs and a first sync use both.
//
// No timed GC: the runtime collects when the heap has grown by GOGC
// percent, and also every two minutes whatever it grew. An idle agent
// allocates ~25 KiB a minute (at 1,000 units also 2–3 MiB per registry
// resync, every 5 minutes), so nearly every collection of its is the
// timer's: it marks the whole live heap, and the scavenger then returns
// what it freed a little at a time, waking the process. While quiet the
// collector is switched off and a memory limit set where GOGC would have
// collected (the footprint after the quiet spell's GC plus the live heap,
// at least 4 MiB): it still collects when the heap grows that far, never
// on the timer. Measured side by side, 240 s idle, three pairs: 1 unit
// 0.20–0.32 → 0.15–0.29 ms of CPU per second, 1,000 units 0.46–0.48 →
// 0.14–0.44, wake-ups 1.4–3.1 → 0.8–2.4 per second.
//
// Neither with the embedded etcd: it serves other clients (the CLI, other
// hosts' agents) whether or not this agent's loop is busy. Nor in a
// process the agent shares (tests): GOMAXPROCS and the GC settings are the
// whole process's. An operator's GOGC=off is left alone.
//
// Observer methods run on the loop's goroutine; the quiet spell's work runs
// on a timer's.
type quietSpell struct {
	reconcile.NopObserver
	busyProcs int  // GOMAXPROCS while passes run: what the process started with
	own       bool // the runtime is the agent's alone: one P and no timed GC when quiet

	mu       sync.Mutex
	timer    *time.Timer
	passes   uint64 // passes started; a quiet spell is one with no new pass
	hushed   bool   // on one P, with the collector switched off
	busyGC   int    // GOGC while passes run (saved while hushed)
	busyMem  int64  // the memory limit while passes run (saved while hushed)
	returned uint64 // heap bytes allocated when memory was last returned
	stopped  bool
}

// newQuietSpell returns a quiet spell that also hushes the runtime (one
// CPU, no timed GC) if own is set.
func newQuietSpell(own bool) *quietSpell {
	return &quietSpell{busyProcs: runtime.GOMAXPROCS(0), own: own}
}

func (q *quietSpell) PassStart() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.passes++
	q.wake()
}

func (q *quietSpell) Pass(time.Duration, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stopped {
		return
	}
	passes := q.passes
	if q.timer != nil {
		q.timer.Stop()
	}
	q.timer = time.AfterFunc(quietFor, func() { q.quiet(passes) })
}

// quiet ends a second with no pass since the passes'th.
func (q *quietSpell) quiet(passes uint64) {
	q.mu.Lock()
	if q.stopped || q.passes != passes { // stopped, or a pass started since
		q.mu.Unlock()
		return
	}
	allocated := heapAllocated()
	give := allocated-q.returned >= returnAfter
	if give {
		q.returned = allocated
	}
	q.mu.Unlock()
	if give {
		debug.FreeOSMemory()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.stopped && q.passes == passes && q.own {
		q.hush()
	}
}

// hush puts the runtime on one P and switches the collector off with a
// memory limit where GOGC would have collected.
func (q *quietSpell) hush() {
	if q.hushed {
		return
	}
	if q.busyProcs > 1 {
		runtime.GOMAXPROCS(1)
	}
	footprint, live := memoryNow()
	limit := int64(footprint + max(live, 4<<20))
	q.busyMem = debug.SetMemoryLimit(-1) // -1 reads it
	debug.SetMemoryLimit(min(q.busyMem, limit))
	q.busyGC = debug.SetGCPercent(-1)
	if q.busyGC < 0 { // the operator's GOGC=off: the limit stays theirs
		debug.SetMemoryLimit(q.busyMem)
	}
	q.hushed = true
}

// wake undoes hush.
func (q *quietSpell) wake() {
	if !q.hushed {
		return
	}
	debug.SetGCPercent(q.busyGC)
	debug.SetMemoryLimit(q.busyMem)
	runtime.GOMAXPROCS(q.busyProcs)
	q.hushed = false
}

// Stop cancels a pending quiet spell and gives the runtime back what it
// had in passes; the observer methods do nothing after it.
func (q *quietSpell) Stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stopped = true
	if q.timer != nil {
		q.timer.Stop()
	}
	q.wake()
}

// memoryNow is what the runtime's memory limit counts (everything the Go
// runtime has mapped and not given back) and the heap's live bytes as of
// the last GC.
func memoryNow() (footprint, live uint64) {
	s := []metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return v(0) - v(1), v(2)
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
