package secret

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

func TestLoadOrCreate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, IdentityFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != 0o600 {
		t.Errorf("identity file mode %v, want 0600", fi.Mode())
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(before), "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "# created: ") ||
		lines[1] != "# public key: "+first.Recipient() || !strings.HasPrefix(lines[2], "AGE-SECRET-KEY-1") {
		t.Errorf("identity file is not age-keygen's format:\n%s", before)
	}

	second, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if second.Recipient() != first.Recipient() {
		t.Errorf("second load: recipient %s, want the first one %s", second.Recipient(), first.Recipient())
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Error("loading the identity rewrote its file")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("state directory holds %d entries, want only %s (no temp file left)", len(entries), IdentityFile)
	}
}

// TestLoadOrCreateRace: agents starting together end with one identity.
func TestLoadOrCreateRace(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var wg sync.WaitGroup
	got := make([]string, 8)
	for i := range got {
		wg.Go(func() {
			id, err := LoadOrCreate(dir)
			if err != nil {
				t.Error(err)
				return
			}
			got[i] = id.Recipient()
		})
	}
	wg.Wait()
	for _, r := range got {
		if r != got[0] {
			t.Fatalf("concurrent LoadOrCreate returned different identities: %q", got)
		}
	}
}

func TestLoadOrCreateRefusesWideMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := LoadOrCreate(dir); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, IdentityFile)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadOrCreate(dir)
	var me *ModeError
	if !errors.As(err, &me) || me.Path != path || me.Mode != 0o644 {
		t.Fatalf("0644 identity: %v, want a ModeError naming %s and 0644", err, path)
	}
	if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, "0644") {
		t.Errorf("error %q does not name the path and mode", msg)
	}
	if fi, _ := os.Stat(path); fi.Mode() != 0o644 {
		t.Errorf("mode changed to %v: the file must be left as found", fi.Mode())
	}
}

func TestLoadOrCreateErrors(t *testing.T) {
	t.Parallel()
	if _, err := LoadOrCreate(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing state directory: %v, want fs.ErrNotExist", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, IdentityFile)
	if err := os.WriteFile(path, []byte("# nothing\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(dir); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("identity file without a key: %v, want an error naming it", err)
	}
	if err := os.WriteFile(path, []byte("AGE-SECRET-KEY-1NOTAKEY\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(dir); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("malformed identity: %v, want an error naming it", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "AGE-SECRET-KEY-1NOTAKEY\n" {
		t.Error("a malformed identity file was replaced: it must be left for the operator")
	}
}

func TestLoadSSHRefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()

	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	encrypted, err := ssh.MarshalPrivateKeyWithPassphrase(priv, "", []byte("secret"))
	if err != nil {
		t.Fatal(err)
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecBlock, err := ssh.MarshalPrivateKey(ec, "")
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		content []byte
		mode    fs.FileMode
		want    string
	}{
		"passphrase": {pem.EncodeToMemory(encrypted), 0o600, "passphrase"},
		"ecdsa":      {pem.EncodeToMemory(ecBlock), 0o600, "only ssh-ed25519"},
		"garbage":    {[]byte("hello\n"), 0o600, "ssh identity"},
		"wide mode":  {nil, 0o640, "mode 0640"},
	} {
		path := filepath.Join(dir, name)
		if tc.content == nil {
			tc.content, _ = os.ReadFile(writeSSHKey(t, t.TempDir()))
		}
		if err := os.WriteFile(path, tc.content, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, tc.mode); err != nil {
			t.Fatal(err)
		}
		_, err := LoadSSH(path)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming %s and containing %q", name, err, path, tc.want)
		}
	}
}
