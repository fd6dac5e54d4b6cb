package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Issue 9, item 2: a template version and its drop-ins are one set. A bad
// drop-in on a template fails the first host's first instance: that host
// puts the whole set back (the drop-in is gone, every instance runs the old
// set), halts the group, and no other host writes the bad set.
func TestTemplateSetRollsBackAndHalts(t *testing.T) {
	t.Parallel() // waits on HealthySec, not the CPU
	f := newFleet(t, 2, "")
	e := f.hosts[0]
	tmpl := "[Service]\nType=exec\nEnvironment=V=1\nExecStart=/bin/sleep 1000\n[X-Agentd]\nMaxUnavailable=1\nHealthySec=1\n"
	if out, code := e.cli("unit", "put", e.writeUnit("w@.service", tmpl), "--instance", "w@1.service", "--instance", "w@2.service",
		"--group", "web", "--wait", "--timeout", "60s"); code != 0 {
		t.Fatalf("put v1: exit %d\n%s", code, out)
	}
	pids := map[string]uint32{}
	for _, h := range f.hosts {
		for _, i := range []string{"w@1.service", "w@2.service"} {
			pids[h.host+i] = h.h.MainPID(t, i)
		}
	}

	bad := "[Service]\nEnvironment=V=2\nExecStartPre=/bin/false\n"
	out, code := e.cli("unit", "put", e.writeUnit("w@.service.d/bad.conf", bad), "--group", "web", "--wait", "--timeout", "60s")
	if code != exitFailed {
		t.Fatalf("put of the bad drop-in: exit %d, want %d\n%s", code, exitFailed, out)
	}
	// The rollback finishes with the restart of the instance that failed.
	eventually(t, "every instance active again", func() bool {
		for _, h := range f.hosts {
			for _, i := range []string{"w@1.service", "w@2.service"} {
				if h.h.ActiveState(t, i) != "active" {
					return false
				}
			}
		}
		return true
	})
	failed := ""
	for _, h := range f.hosts {
		_, wrote := os.Stat(filepath.Join(h.h.UnitDir, "w@.service.d", "bad.conf"))
		if wrote == nil {
			t.Errorf("%s still has the bad drop-in on disk", h.host)
		}
		for _, i := range []string{"w@1.service", "w@2.service"} {
			if got := h.h.ActiveState(t, i); got != "active" {
				t.Errorf("%s %s is %s, want active on the old set", h.host, i, got)
			}
			pid := h.h.MainPID(t, i)
			env, _ := os.ReadFile(filepath.Join("/proc", itoa(pid), "environ"))
			if !strings.Contains(string(env), "V=1\x00") {
				t.Errorf("%s %s (pid %d) does not run the old set: environ lacks V=1", h.host, i, pid)
			}
			if pid != pids[h.host+i] {
				failed = h.host
			}
		}
	}
	if failed == "" {
		t.Fatal("no host tried the bad set (no instance restarted)")
	}
	for _, h := range f.hosts {
		if h.host == failed {
			continue
		}
		for _, i := range []string{"w@1.service", "w@2.service"} {
			if pid := h.h.MainPID(t, i); pid != pids[h.host+i] {
				t.Errorf("%s restarted %s although the rollout was halted", h.host, i)
			}
		}
		if s, _ := h.status("w@.service"); s.Action != "held" {
			t.Errorf("%s: template status action %q, want held", h.host, s.Action)
		}
	}
	if !strings.Contains(out, "held") {
		t.Errorf("--wait output does not show the held host:\n%s", out)
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
