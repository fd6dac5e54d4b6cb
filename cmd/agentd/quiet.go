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
// for a second it gives the memory passes used back to the OS and runs the
// process on one CPU; the next pass gets every CPU back before it starts.
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
// Not with the embedded etcd: it serves other clients (the CLI, other
// hosts' agents) whether or not this agent's loop is busy. Not in a
// process the agent shares (tests): GOMAXPROCS is the whole process's.
//
// Observer methods run on the loop's goroutine; the quiet spell's work runs
// on a timer's.
type quietSpell struct {
	reconcile.NopObserver
	busyProcs int  // GOMAXPROCS while passes run: what the process started with
	shrink    bool // one P when quiet

	mu       sync.Mutex
	timer    *time.Timer
	passes   uint64 // passes started; a quiet spell is one with no new pass
	single   bool   // running on one P
	returned uint64 // heap bytes allocated when memory was last returned
	stopped  bool
}

// newQuietSpell returns a quiet spell that also runs the process on one
// CPU if oneCPU is set.
func newQuietSpell(oneCPU bool) *quietSpell {
	n := runtime.GOMAXPROCS(0)
	return &quietSpell{busyProcs: n, shrink: oneCPU && n > 1}
}

func (q *quietSpell) PassStart() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.passes++
	if q.single {
		runtime.GOMAXPROCS(q.busyProcs)
		q.single = false
	}
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
	if q.shrink && !q.single {
		runtime.GOMAXPROCS(1)
		q.single = true
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
}

// Stop cancels a pending quiet spell and gives the process its CPUs back;
// the observer methods do nothing after it.
func (q *quietSpell) Stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.stopped = true
	if q.timer != nil {
		q.timer.Stop()
	}
	if q.single {
		runtime.GOMAXPROCS(q.busyProcs)
		q.single = false
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
