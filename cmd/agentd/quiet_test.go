package main

import (
	"runtime"
	"testing"
	"time"
)

// The memory a burst of passes used goes back to the OS once the loop has
// been quiet for quietFor, not while passes keep coming; the process then
// runs on one P until the next pass starts.
func TestQuietSpell(t *testing.T) {
	orig := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })
	q := &quietSpell{busyProcs: 2, shrink: true}
	t.Cleanup(q.Stop)
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
	returned := func() uint64 {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.returned
	}
	pass := func() {
		q.PassStart()
		if n := runtime.GOMAXPROCS(0); n != 2 {
			t.Fatalf("GOMAXPROCS %d during a pass, want 2", n)
		}
		q.Pass(0, nil)
	}
	garbage()
	start := time.Now()
	pass()
	// Passes every quietFor/4 postpone the quiet spell.
	for time.Since(start) < 2*quietFor {
		time.Sleep(quietFor / 4)
		if r := returned(); r != 0 {
			t.Fatalf("memory returned %v after the first pass while passes kept coming", time.Since(start))
		}
		if n := runtime.GOMAXPROCS(0); n != 2 {
			t.Fatalf("GOMAXPROCS %d while passes kept coming, want 2", n)
		}
		pass()
	}
	before := released()
	deadline := time.Now().Add(5 * quietFor)
	for returned() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("memory not returned %v after the last pass", 5*quietFor)
		}
		time.Sleep(quietFor / 10)
	}
	time.Sleep(100 * time.Millisecond) // FreeOSMemory runs after returned is set
	if after := released(); after <= before {
		t.Errorf("HeapReleased %d → %d: nothing given back", before, after)
	}
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Errorf("GOMAXPROCS %d after a quiet spell, want 1", n)
	}

	// A pass gets both Ps back; without new allocation its quiet spell
	// returns no memory, but runs on one P again.
	r := returned()
	pass() // checks GOMAXPROCS 2
	time.Sleep(quietFor + quietFor/2)
	if returned() != r {
		t.Error("a quiet spell with little allocated since the last return gave memory back")
	}
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Errorf("GOMAXPROCS %d after the second quiet spell, want 1", n)
	}
	q.Stop()
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Errorf("GOMAXPROCS %d after Stop, want 2", n)
	}
}

// Beside the embedded etcd, which serves other clients whatever the loop
// does, the process keeps every P.
func TestQuietSpellKeepsProcsForEmbeddedEtcd(t *testing.T) {
	orig := runtime.GOMAXPROCS(2)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })
	q := newQuietSpell(false)
	t.Cleanup(q.Stop)
	q.PassStart()
	q.Pass(0, nil)
	time.Sleep(quietFor + quietFor/2)
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Errorf("GOMAXPROCS %d after a quiet spell beside the embedded etcd, want 2", n)
	}
}
