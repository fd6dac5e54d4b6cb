package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testport"
)

// driftTotal is agentd_drift_events_total as the agent at addr serves it
// (what an alert on drift reads); -1 when it does not answer.
func driftTotal(addr string) float64 {
	m := scrapeMetrics("http://" + addr)
	v, ok := m["agentd_drift_events_total"]
	if !ok {
		return -1
	}
	return v
}

// metricsFlag gives an agent a metrics address of its own.
func metricsFlag(t *testing.T) (flag, addr string) {
	addr = "127.0.0.1:" + strconv.Itoa(testport.Restartable(t))
	return "--metrics-addr=" + addr, addr
}

// Killed after it claimed the path and before it wrote the file, the agent
// left v1 on disk while its manifest owns the path at v2's hash. The next
// agent finishes the write: the file is not a change made behind its back,
// and drift is not counted (it was: an alert on drift fired falsely).
func TestCrashBetweenClaimAndWriteIsNotDrift(t *testing.T) {
	buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()  // waits on timers, not the CPU
	s := newCrashScene(t, "claim-crash")
	v1, v2 := crashUnit(s.events, "1", false), crashUnit(s.events, "2", false)
	a1 := s.agent()
	s.installV1(a1, v1)
	a1.stop(t)
	killedAt := s.killAtPause("claimed", v2)
	if got, _ := os.ReadFile(filepath.Join(s.h.UnitDir, changedUnit)); string(got) != v1 {
		t.Fatalf("killed at the claim: %s on disk is not v1: %q", changedUnit, got)
	}
	flag, addr := metricsFlag(t)
	a2 := s.agent(flag)
	s.assertResumed(a2, v2, killedAt)
	if n := driftTotal(addr); n != 0 {
		t.Errorf("agentd_drift_events_total = %v after finishing an interrupted write, want 0", n)
	}
}

// The agent SIGKILLed at many moments after a put (before, during and
// after its write): each time, the next agent converges on the put and
// counts no drift.
func TestKilledAfterAPutAtManyOffsetsCountsNoDrift(t *testing.T) {
	buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()  // waits on timers, not the CPU
	s := newCrashScene(t, "offsets")
	flag, addr := metricsFlag(t)
	a := s.agent(flag)
	s.installV1(a, crashUnit(s.events, "1", false))
	for i, offset := range []time.Duration{0, time.Millisecond, 3 * time.Millisecond, 5 * time.Millisecond,
		8 * time.Millisecond, 12 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond} {
		v := crashUnit(s.events, strconv.Itoa(i+2), false)
		s.put(map[string]string{changedUnit: v})
		time.Sleep(offset)
		if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-a.done
		a = s.agent(flag)
		waitFor(t, a, 30*time.Second, fmt.Sprintf("v%d converged after a SIGKILL %s after its put", i+2, offset), func() bool {
			return s.converged(changedUnit, v)
		})
		if n := driftTotal(addr); n != 0 {
			t.Fatalf("SIGKILL %s after the put: agentd_drift_events_total = %v, want 0", offset, n)
		}
	}
}
