package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// Issue 29, case 4, on a real systemd: `unit rm dd.service` while its
// drop-in stays in the registry. The CLI refuses and nothing changes. When
// the registry ends up with the drop-in alone all the same (the unit's key
// deleted under it, as a put of the drop-in racing an rm would leave it),
// the agent stops the unit and deletes its file, keeps the drop-in, and
// never tries to restart a unit without its file: no "Unit dd.service not
// found", no rollback that puts the removed file back. `rm --recursive
// --wait` then removes the drop-in too and exits 0.
func TestRmOfAUnitWhoseDropInStays(t *testing.T) {
	t.Parallel() // its own systemd and etcd: waits on them, not the CPU
	e := newEnv(t)
	logs := judgeStartAgent(e)
	const (
		dd    = "dd.service"
		ddX   = "dd.service.d/x.conf"
		unitV = "[Service]\nType=exec\nExecStart=/bin/sleep 1003\n" + fast
		drop  = "[Service]\nEnvironment=DD=1\n"
	)
	out, code := judgePut(e, true, dd, unitV, ddX, drop)
	if code != 0 {
		t.Fatalf("put: exit %d\n%s", code, out)
	}
	pid := e.h.MainPID(t, dd)
	if pid == 0 {
		t.Fatalf("dd.service not running after put --wait: %s", e.h.ActiveState(t, dd))
	}

	// The CLI refuses and names the drop-in; nothing changes.
	out, code = e.cli("unit", "rm", dd, "--host", e.host, "--wait", "--timeout", "10s")
	if code != exitUsage || !strings.Contains(out, "dd.service has dd.service.d/x.conf") || !strings.Contains(out, "--recursive") {
		t.Fatalf("rm of a unit with a drop-in left: exit %d, want %d naming the drop-in\n%s", code, exitUsage, out)
	}
	if b, err := e.reg.Get(context.Background(), registry.Target{Host: e.host}, dd); err != nil || string(b) != unitV {
		t.Fatalf("dd.service in the registry after the refusal: %q, %v", b, err)
	}
	time.Sleep(300 * time.Millisecond) // a pass the refusal could have caused
	if p := e.h.MainPID(t, dd); p != pid {
		t.Fatalf("dd.service MainPID %d → %d after a refused rm", pid, p)
	}

	// The registry with the drop-in alone, written straight into etcd.
	cli := registrytest.RawClient(t, e.endpoint)
	if _, err := cli.Delete(context.Background(), registry.DefaultPrefix+"/hosts/"+e.host+"/units/"+dd); err != nil {
		t.Fatal(err)
	}
	unitFile := filepath.Join(e.h.UnitDir, dd)
	judgeWithin(t, 15*time.Second, "dd.service stopped and its file gone", func() bool {
		_, err := os.Stat(unitFile)
		return os.IsNotExist(err) && e.h.ActiveState(t, dd) != "active"
	})
	time.Sleep(500 * time.Millisecond) // what a pass more would do
	if _, err := os.Stat(unitFile); !os.IsNotExist(err) {
		t.Errorf("dd.service's file is back (a rollback?): %v", err)
	}
	if st := e.h.ActiveState(t, dd); st != "inactive" {
		t.Errorf("dd.service is %s, want inactive", st)
	}
	if got, ok := e.readLocal(ddX); !ok || got != drop {
		t.Errorf("the drop-in on disk: %q, %v; want it kept", got, ok)
	}
	if s, ok := e.status(dd); ok && (s.Error != "" || strings.Contains(string(s.Action), "rollback") || strings.Contains(string(s.Action), "rolled")) {
		t.Errorf("status of dd.service: %+v; want no error, no rollback", s)
	}
	for _, bad := range []string{"not found", "rolling back", "rolled-back"} {
		if strings.Contains(logs.String(), bad) {
			t.Errorf("the agent's log says %q:\n%s", bad, logs.String())
		}
	}

	// rm --recursive --wait of the unit: its drop-in goes, exit 0.
	start := time.Now()
	out, code = e.cli("unit", "rm", dd, "--recursive", "--host", e.host, "--wait", "--timeout", "30s")
	if code != 0 {
		t.Fatalf("rm --recursive --wait: exit %d\n%s", code, out)
	}
	t.Logf("rm --recursive --wait: exit 0 after %v", time.Since(start).Round(10*time.Millisecond))
	if !strings.Contains(out, "removed hosts/h1/units/dd.service.d/x.conf") {
		t.Errorf("output does not name the drop-in removed:\n%s", out)
	}
	if _, ok := e.readLocal(ddX); ok {
		t.Error("the drop-in is still on disk after rm --recursive --wait")
	}
	if st := e.h.ActiveState(t, dd); st == "active" {
		t.Errorf("dd.service is %s", st)
	}
}
