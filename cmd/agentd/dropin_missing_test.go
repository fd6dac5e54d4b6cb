package main

import (
	"context"
	"strings"
	"testing"
)

// A drop-in put for a unit this host does not have is written, and its
// status says why nothing came of it, naming the unit: --wait exits 3 with
// that error (it once reported "loadState: not-found" and nothing else).
// Once a unit file of that name arrives, the drop-in applies and the error
// is gone.
func TestDropInForAUnitTheHostLacksIsAnError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startAgent()
	dropIn := e.writeUnit("nounit.service.d/x.conf", "[Service]\nEnvironment=X=1\n")
	out, code := e.cli("unit", "put", dropIn, "--host", e.host, "--wait", "--timeout", "30s")
	if code != exitFailed || !strings.Contains(out, "nounit.service is not on this host (systemd: not-found)") {
		t.Fatalf("put of a drop-in for a unit the host lacks: exit %d, want %d naming nounit.service\n%s", code, exitFailed, out)
	}
	if got, _ := e.readLocal("nounit.service.d/x.conf"); got != "[Service]\nEnvironment=X=1\n" {
		t.Errorf("the drop-in was not written: %q", got)
	}
	if s := e.h.ActiveState(t, "nounit.service"); s != "inactive" {
		t.Errorf("nounit.service is %s", s)
	}

	unit := e.writeUnit("nounit.service", "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n"+fast)
	if out, code := e.cli("unit", "put", unit, "--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("put of the unit file: exit %d\n%s", code, out)
	}
	if pid := e.h.MainPID(t, "nounit.service"); !environHas(pid, "X=1") {
		t.Errorf("nounit.service (MainPID %d) runs without its drop-in's X=1", pid)
	}
	if sts, err := e.reg.Statuses(context.Background(), e.host); err != nil || sts["nounit.service"].Error != "" {
		t.Errorf("status after the unit arrived: %+v %v, want no error", sts["nounit.service"], err)
	}
}
