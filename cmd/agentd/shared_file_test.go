package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/registry"
)

// A config file two units read (one TLS certificate, one environment file)
// has one writer: a7.service puts it, b7.service names it in its
// RestartTriggers=. A change of the file writes it once and restarts both,
// with no daemon-reload. Putting the same path again with b7 is refused at
// put time, naming both keys, and nothing is stored (it used to be stored,
// and the host then blocked b7 with "unmanaged file: b7.service.files/…
// exists and agentd did not write it").
func TestConfigFileSharedByTwoUnits(t *testing.T) {
	t.Parallel() // waits on systemd, not the CPU
	e := newEnv(t)
	root := filepath.Join(e.h.Dir, "etc", "shared")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) { o.fileRoots = []string{root} })
	env := filepath.Join(root, "tls.env")
	unit := func() string {
		return "[Service]\nType=exec\nEnvironmentFile=" + env + "\nExecStart=/bin/sleep 1000\n" +
			"[X-Agentd]\nHealthySec=0\nRestartTriggers=" + env + "\n"
	}
	src := func(name, content string) string { return e.writeUnit("files/"+name, content) }
	putA := func(content string) {
		t.Helper()
		if out, code := e.cli("unit", "put", e.writeUnit("a7.service", unit()), "--file", env+"="+src(strings.TrimSpace(strings.ReplaceAll(content, "=", "-")), content),
			"--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
			t.Fatalf("put a7.service with %s: exit %d\n%s", env, code, out)
		}
	}
	putA("CERT=1\n")
	if out, code := e.cli("unit", "put", e.writeUnit("b7.service", unit()), "--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("put b7.service naming a7's file in its trigger: exit %d\n%s", code, out)
	}
	a1, b1 := e.h.MainPID(t, "a7.service"), e.h.MainPID(t, "b7.service")
	if !environHas(a1, "CERT=1") || !environHas(b1, "CERT=1") {
		t.Fatalf("a7 (MainPID %d) and b7 (MainPID %d) do not both run CERT=1", a1, b1)
	}

	// The file changes: written once, both restart onto it, no reload.
	reloads := e.h.CountReloads(t)
	before := reloads()
	putA("CERT=2\n")
	waitFor(t, nil, 30*time.Second, "b7.service restarted onto CERT=2", func() bool { return environHas(e.h.MainPID(t, "b7.service"), "CERT=2") })
	a2, b2 := e.h.MainPID(t, "a7.service"), e.h.MainPID(t, "b7.service")
	if a2 == a1 || b2 == b1 || !environHas(a2, "CERT=2") {
		t.Errorf("after the shared file changed: a7 MainPID %d → %d, b7 %d → %d; want both restarted onto CERT=2", a1, a2, b1, b2)
	}
	if n := reloads() - before; n != 0 {
		t.Errorf("the shared config file cost %d daemon-reloads, want 0", n)
	}
	if b, _ := os.ReadFile(env); string(b) != "CERT=2\n" {
		t.Errorf("%s holds %q", env, b)
	}
	// b7's own report: its restart done, healthy on the new file.
	waitFor(t, nil, 30*time.Second, "b7.service reported healthy after its restart", func() bool {
		sts, err := e.reg.Statuses(t.Context(), e.host)
		return err == nil && sts["b7.service"].Error == "" && sts["b7.service"].Health == "healthy" && sts["b7.service"].Job == ""
	})

	// The same path put again with b7: refused, naming both keys.
	out, code := e.cli("unit", "put", e.writeUnit("b7.service", unit()), "--file", env+"="+src("again", "CERT=3\n"), "--host", e.host)
	if code != exitUsage || !strings.Contains(out, "a7.service.files"+env) || !strings.Contains(out, "b7.service.files"+env) {
		t.Errorf("put of a path a7.service already writes, with b7.service: exit %d, want %d naming both keys\n%s", code, exitUsage, out)
	}
	if _, err := e.reg.Get(t.Context(), registry.Target{Host: e.host}, "b7.service.files"+env); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("the refused put stored b7.service's copy of %s", env)
	}
	if p := e.h.MainPID(t, "b7.service"); p != b2 {
		t.Errorf("the refused put restarted b7.service (MainPID %d → %d)", b2, p)
	}
}
