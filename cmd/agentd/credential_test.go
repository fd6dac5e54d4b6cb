package main

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/citest"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/secret"
)

// recipientOf waits for host's agent to publish its recipient
// (publishedRecipient).
func recipientOf(t *testing.T, reg *registry.Client, host string) string {
	t.Helper()
	var r string
	waitFor(t, nil, 30*time.Second, host+" publishes its recipient", func() bool {
		r = publishedRecipient(t, reg, host)
		return r != ""
	})
	return r
}

// noPlaintextUnder fails t when a file below dir holds plaintext.
func noPlaintextUnder(t *testing.T, dir string, plaintext []byte) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, plaintext) {
			t.Errorf("%s holds the plaintext", p)
		}
		return nil
	})
}

// A secret put as a systemd credential: the host decrypts it with its
// identity, has systemd-creds encrypt it (the host key here), and writes
// that. The unit reads the plaintext through LoadCredentialEncrypted=;
// nothing on the host's disk holds it (the credential, the state
// directory, the unit directory). The same secret again is not a change.
func TestSecretAsSystemdCredential(t *testing.T) {
	t.Parallel() // waits on systemd, not the CPU
	if _, err := exec.LookPath("systemd-creds"); err != nil {
		citest.Unavailable(t, "systemd-creds not found (systemd 250 or later)")
	}
	e := newEnv(t)
	root := filepath.Join(e.h.Dir, "credstore")
	if err := os.MkdirAll(root, 0o700); err != nil {
		t.Fatal(err)
	}
	// The harness runs a user manager: the agent says so, as --user does.
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) { o.fileRoots, o.user = []string{root}, true })
	to := recipientOf(t, e.reg, e.host)

	plaintext := []byte("s3cr3t-" + filepath.Base(e.h.Dir))
	ct, err := secret.Encrypt(plaintext, []string{to})
	if err != nil {
		t.Fatal(err)
	}
	dest, out := filepath.Join(root, "db"), filepath.Join(e.h.Dir, "seen")
	value := reconcile.ConfigFile{Mode: 0o600, Owner: "root:root", Secret: true, To: []string{e.host}, Credential: "db", Content: ct}.Encode()
	unit := "[Service]\nType=exec\nLoadCredentialEncrypted=db:" + dest + "\n" +
		"ExecStart=/bin/sh -c 'cat \"$CREDENTIALS_DIRECTORY/db\" > " + out + "; exec /bin/sleep 1000'\n" +
		"[X-Agentd]\nHealthySec=0\nRestartTriggers=" + dest + "\n"
	key := reconcile.ConfigKey("cred.service", dest)
	if _, err := e.reg.Put(context.Background(), registry.Target{Host: e.host}, map[string][]byte{"cred.service": []byte(unit), key: value}); err != nil {
		t.Fatal(err)
	}
	if v := systemdVersion(t); v < userCredsSince {
		// This user manager cannot load encrypted credentials: the host
		// says so in the unit's status and writes nothing.
		waitFor(t, nil, 30*time.Second, "cred.service's status says the manager is too old", func() bool {
			s, ok := e.status("cred.service")
			return ok && strings.Contains(s.Error, "cannot load encrypted credentials") && s.Action == reconcile.ActionBlocked
		})
		if _, err := os.Stat(dest); !os.IsNotExist(err) {
			t.Errorf("%s was written on a manager that cannot load it: %v", dest, err)
		}
		if st := e.h.ActiveState(t, "cred.service"); st == "active" {
			t.Errorf("cred.service is %s", st)
		}
		t.Logf("systemd %d: a user manager loads encrypted credentials from systemd %d on; the booted container test runs one (TestSystemSecretAsCredential)", v, userCredsSince)
		return
	}
	waitFor(t, nil, 30*time.Second, "cred.service read its credential", func() bool {
		b, _ := os.ReadFile(out)
		return bytes.Equal(b, plaintext)
	})
	waitFor(t, nil, 30*time.Second, "the status shows the ciphertext's hash", func() bool {
		s, ok := e.status("cred.service")
		return ok && s.DropIns[key] == reconcile.Hash(value) && s.Error == ""
	})
	onDisk, err := os.ReadFile(dest)
	if err != nil || bytes.Contains(onDisk, plaintext) || bytes.Contains(onDisk, ct) {
		t.Fatalf("%s: %v; want systemd's credential, not the plaintext nor the age file", dest, err)
	}
	for _, dir := range []string{root, e.h.StateDir, e.h.UnitDir} {
		noPlaintextUnder(t, dir, plaintext) // a credential's blob is the credential
	}
}

// systemdVersion is the version of the systemd the harness runs.
func systemdVersion(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("systemctl", "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	if _, err := fmt.Sscanf(string(out), "systemd %d", &v); err != nil {
		t.Fatalf("systemctl --version: %q: %v", out, err)
	}
	return v
}
