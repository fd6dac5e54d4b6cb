package main

import (
	"runtime/debug"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// bigPass is how long a pass must have taken for the memory it used to be
// given back at once.
const bigPass = time.Second

// memoryReturner gives the heap a big pass used back to the OS when it
// ends. A first sync or a burst of 1,000 units decodes a lot of D-Bus
// replies; the runtime would return that memory only over minutes, so an
// idle agent stayed at twice the RSS it needs. A forced GC costs ~10 ms,
// once after a pass that took a second or more.
type memoryReturner struct{ reconcile.NopObserver }

func (memoryReturner) Pass(d time.Duration, _ error) {
	if d >= bigPass {
		debug.FreeOSMemory()
	}
}
