package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/secret"
)

// The agent SIGKILLed at many moments while it writes a secret (before,
// during and after the decryption and the rename): no temp file of the
// plaintext is left once the next agent has started, the file ends
// byte-exact at mode 0600, and no file under the file root or the unit
// directory holds any other version's plaintext.
func TestKilledWhileWritingASecretLeavesNoPlaintext(t *testing.T) {
	buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()  // waits on timers, not the CPU
	s := newCrashScene(t, "secret-crash")
	root := filepath.Join(s.h.Dir, "secrets")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	a := s.agent("--file-root", root)
	to := recipientOf(t, s.reg, s.host)
	dest := filepath.Join(root, "db.env")
	unit := "[Unit]\nStartLimitIntervalSec=0\n[Service]\nType=exec\nEnvironmentFile=" + dest + "\nExecStart=/bin/sleep 1000\n" + fast +
		"[X-Agentd]\nRestartTriggers=" + dest + "\n"
	key := reconcile.ConfigKey("db.service", dest)
	var last []byte
	for i, offset := range []time.Duration{0, time.Millisecond, 3 * time.Millisecond, 6 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond} {
		plaintext := []byte(fmt.Sprintf("PASSWORD=v%d-%s\n", i, strings.Repeat("x", 2000)))
		ct, err := secret.Encrypt(plaintext, []string{to})
		if err != nil {
			t.Fatal(err)
		}
		value := reconcile.ConfigFile{Mode: 0o600, Owner: "root:root", Secret: true, To: []string{s.host}, Content: ct}.Encode()
		if _, err := s.reg.Put(context.Background(), registry.Target{Host: s.host}, map[string][]byte{"db.service": []byte(unit), key: value}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(offset)
		if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-a.done
		a = s.agent("--file-root", root)
		waitFor(t, a, 30*time.Second, fmt.Sprintf("v%d of the secret in place after a SIGKILL %s after its put", i, offset), func() bool {
			st, err := s.reg.Statuses(context.Background(), s.host)
			return err == nil && st["db.service"].DropIns[key] == reconcile.Hash(value) && st["db.service"].Error == ""
		})
		b, err := os.ReadFile(dest)
		fi, serr := os.Stat(dest)
		if err != nil || serr != nil || !bytes.Equal(b, plaintext) || fi.Mode().Perm() != 0o600 {
			t.Fatalf("after a SIGKILL %s after the put: %s holds %d bytes (want %d), mode %v: %v %v", offset, dest, len(b), len(plaintext), fi.Mode(), err, serr)
		}
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			if strings.Contains(e.Name(), ".agentd-") {
				t.Errorf("a temp file %s is left in the file root after the restart", e.Name())
			}
		}
		// The state directory (0700) keeps the versions a rollback puts
		// back, secrets too; nowhere else holds an older one.
		if last != nil {
			for _, dir := range []string{root, s.h.UnitDir} {
				noPlaintextUnder(t, dir, last[:len(last)-1])
			}
		}
		last = plaintext
	}
}

// A secret whose ciphertext changed by one byte (in etcd, behind the CLI's
// back) is refused: the unit's status says it cannot be decrypted, the
// file keeps the version it had, and the unit keeps its MainPID.
func TestTamperedSecretKeepsTheRunningVersion(t *testing.T) {
	t.Parallel() // waits on systemd, not the CPU
	e := newEnv(t)
	root := filepath.Join(e.h.Dir, "secrets")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) { o.fileRoots = []string{root} })
	to := recipientOf(t, e.reg, e.host)
	dest := filepath.Join(root, "db.env")
	unit := "[Service]\nType=exec\nEnvironmentFile=" + dest + "\nExecStart=/bin/sleep 1000\n[X-Agentd]\nHealthySec=0\nRestartTriggers=" + dest + "\n"
	key := reconcile.ConfigKey("db.service", dest)
	put := func(value []byte) {
		t.Helper()
		if _, err := e.reg.Put(context.Background(), registry.Target{Host: e.host}, map[string][]byte{"db.service": []byte(unit), key: value}); err != nil {
			t.Fatal(err)
		}
	}
	seal := func(plaintext string) []byte {
		ct, err := secret.Encrypt([]byte(plaintext), []string{to})
		if err != nil {
			t.Fatal(err)
		}
		return reconcile.ConfigFile{Mode: 0o600, Owner: "root:root", Secret: true, To: []string{e.host}, Content: ct}.Encode()
	}
	v1 := seal("PASSWORD=one\n")
	put(v1)
	waitFor(t, nil, 30*time.Second, "v1 runs", func() bool { return environHas(e.h.MainPID(t, "db.service"), "PASSWORD=one") })
	pid := e.h.MainPID(t, "db.service")

	bad := seal("PASSWORD=two\n")
	body := bytes.Index(bad, []byte("\n-----END")) - 10 // a byte of the armoured body, not of its frame
	bad[body] ^= 'A' ^ 'B'
	if bad[body] == '\n' || bad[body] == '-' {
		bad[body] = 'C'
	}
	put(bad)
	waitFor(t, nil, 30*time.Second, "db.service's status refuses the damaged secret", func() bool {
		s, ok := e.status("db.service")
		return ok && strings.Contains(s.Error, key+": cannot decrypt")
	})
	if b, _ := os.ReadFile(dest); string(b) != "PASSWORD=one\n" {
		t.Errorf("%s holds %q after the damaged put, want v1 kept", dest, b)
	}
	if p := e.h.MainPID(t, "db.service"); p != pid {
		t.Errorf("db.service MainPID %d → %d after a damaged secret", pid, p)
	}
}
