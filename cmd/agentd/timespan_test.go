package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// HealthySec= takes systemd's time spans; what the parser refuses, `unit
// put` refuses before writing, naming the value, and stores nothing — a
// unit file or a drop-in, alone or beside good files in one put.
func TestPutTimespans(t *testing.T) {
	t.Parallel()
	e := newRegistryEnv(t)
	dir := t.TempDir()
	write := func(name, healthy string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		content := "[Service]\nExecStart=/bin/sleep 1000\n[X-Agentd]\nHealthySec=" + healthy + "\n"
		if strings.HasSuffix(name, ".conf") {
			content = "[X-Agentd]\nHealthySec=" + healthy + "\n"
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ok := write("ok.service", "1min 30s")
	for _, tc := range []struct{ file, value, says string }{
		{"bad.service", "5x", `bad HealthySec=5x: want a time span`},
		{"bad.service", "1,5", `bad HealthySec=1,5: want a time span`},
		{"bad.service", "-1", `bad HealthySec=-1: want a time span`},
		{"bad.service", "infinity", `bad HealthySec=infinity: a unit would never count as healthy`},
		{"bad.service.d/10-health.conf", "ten seconds", `bad HealthySec=ten seconds: want a time span`},
	} {
		out, code := e.cli("unit", "put", ok, write(tc.file, tc.value), "--host", "h1")
		if code != exitUsage || !strings.Contains(out, tc.says) || !strings.Contains(out, tc.file) {
			t.Errorf("put with HealthySec=%s: exit %d, want %d and a message with %q naming %s:\n%s", tc.value, code, exitUsage, tc.says, tc.file, out)
		}
		if listed, err := e.reg.List(context.Background(), nil); err != nil || len(listed) != 0 {
			t.Fatalf("after a refused put the registry holds %v (%v), want nothing", listed, err)
		}
		os.RemoveAll(filepath.Join(dir, "bad.service.d"))
	}
	for _, v := range []string{"2s", "500ms", "1.5", "1min 30s", "0", "1h"} {
		if out, code := e.cli("unit", "put", write("good.service", v), "--host", "h1"); code != 0 {
			t.Errorf("put with HealthySec=%s: exit %d\n%s", v, code, out)
		}
	}
}
