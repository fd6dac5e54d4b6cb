package systemd_test

import (
	"testing"
	"time"

	"github.com/agentd/agentd/internal/systemdtest"
)

// A crash loop read as fast as the agent can: in auto-restart a service has
// no main process, so a sample that says auto-restart with a MainPID mixes
// two moments (the Unit interface read before the next start, the Service
// interface after it; seen in CI). The agent's read never returns one; the
// one read of it (not read again when the unit moved) is counted beside
// it: each torn one must be seen to have moved.
func TestReadStateIsNotTorn(t *testing.T) {
	h := systemdtest.Start(t)
	m := open(t, h)
	ctx := testContext(t)
	writeUnit(t, h, "loop.service", "[Unit]\nStartLimitIntervalSec=0\n"+
		"[Service]\nType=exec\nExecStart=/bin/false\nRestart=always\nRestartSec=20ms\n")
	reload(t, m)
	// Its start job may fail (/bin/false can exit before systemd saw the
	// exec succeed: "exit-code"; seen in CI); Restart=always loops it all
	// the same, which is what the test reads: wait for the loop.
	if err := m.Start(ctx, "loop.service"); err != nil {
		t.Logf("start loop.service: %v; Restart=always loops it on", err)
	}
	defer stop(t, m, "loop.service")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s, err := m.StateSkippingFileState(ctx, "loop.service")
		if err != nil {
			t.Fatal(err)
		}
		if s.NRestarts > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("loop.service does not crash-loop: %+v", s)
		}
	}
	var samples, torn, tornUnchecked, moved int
	for end := time.Now().Add(time.Second); time.Now().Before(end); samples++ {
		s, err := m.StateSkippingFileState(ctx, "loop.service")
		if err != nil {
			t.Fatal(err)
		}
		if s.SubState == "auto-restart" && s.MainPID != 0 {
			torn++
			t.Errorf("torn sample: %+v", s)
		}
		u, mv, err := m.ReadStateOnce(ctx, "loop.service", true)
		if err != nil {
			t.Fatal(err)
		}
		if u.SubState == "auto-restart" && u.MainPID != 0 {
			tornUnchecked++
			if !mv {
				t.Errorf("a torn read the check missed: %+v", u)
			}
		}
		if mv {
			moved++
		}
	}
	t.Logf("%d samples of a crash loop (RestartSec=20ms): torn %d with the check, %d without it; %d reads without it saw the unit move under them", samples, torn, tornUnchecked, moved)
	if samples < 50 {
		t.Errorf("only %d samples in 1 s", samples)
	}
}

// The check costs one more batch of two properties per read of a unit with
// a type interface: the agent's read beside the one without the check, on
// a running service, in one run.
func BenchmarkReadState(b *testing.B) {
	h := systemdtest.Start(b)
	m := open(b, h)
	ctx := testContext(b)
	writeUnit(b, h, "run.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n")
	reload(b, m)
	if err := m.Start(ctx, "run.service"); err != nil {
		b.Fatal(err)
	}
	b.Run("without-check", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := m.ReadStateOnce(ctx, "run.service", false); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("checked", func(b *testing.B) {
		for b.Loop() {
			if _, err := m.StateSkippingFileState(ctx, "run.service"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
