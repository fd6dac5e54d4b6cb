package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A host with --allowed-signers checks the keys of the selector groups it
// joins as it checks its own groups': a signed put to a selector its
// labels match runs; an unsigned one is refused, the running unit kept.
func TestSignedSelectorPut(t *testing.T) {
	e := &signedEnv{env: newEnv(t)}
	dir := t.TempDir()
	e.alice, e.mallory = newSSHKey(t, dir, "alice@example.com"), newSSHKey(t, dir, "mallory")
	e.allowed = filepath.Join(dir, "allowed_signers")
	if err := os.WriteFile(e.allowed, []byte(e.alice.line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) {
		o.allowedSigners = e.allowed
		o.labels = []string{"role=web"}
	})
	put := func(content string, flags ...string) (string, int) {
		return e.cli(append([]string{"unit", "put", e.writeUnit("hello.service", content), "--selector", "role=web", "--wait", "--timeout", "20s"}, flags...)...)
	}
	if out, code := put(helloV1, "--sign-key", e.alice.file); code != 0 {
		t.Fatalf("signed put --selector: exit %d\n%s", code, out)
	}
	st, ok := e.status("hello.service")
	if !ok || st.ActiveState != "active" || st.Error != "" {
		t.Fatalf("after the signed put: %+v, want it active", st)
	}
	if out, code := put(helloV2); code == 0 || !strings.Contains(out, "unsigned") {
		t.Errorf("unsigned put --selector: exit %d, want it refused by the host as unsigned:\n%s", code, out)
	}
	if now, _ := e.status("hello.service"); now.ActiveState != "active" || now.MainPID != st.MainPID {
		t.Errorf("after the refused put: %+v, want the signed version still running (MainPID %d)", now, st.MainPID)
	}
}
