package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"
	"golang.org/x/crypto/ssh"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/secret"
)

// rekey's --identity takes an age identity file (age-keygen's or an
// agent's identity.age) or an SSH ed25519 key; it decrypts what was
// encrypted to it, says ErrNotRecipient for anything else, and refuses a
// key file others may read.
func TestSecretAdminIdentity(t *testing.T) {
	dir := t.TempDir()
	x, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	keygen := filepath.Join(dir, "admin.txt")
	write := func(p string, b []byte, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	write(keygen, []byte("# created: 2026-01-01T00:00:00Z\n# public key: "+x.Recipient().String()+"\n"+x.String()+"\n"), 0o600)
	agentDir := t.TempDir()
	agentID, err := secret.LoadOrCreate(agentDir)
	if err != nil {
		t.Fatal(err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "admin")
	if err != nil {
		t.Fatal(err)
	}
	sshKey := filepath.Join(dir, "id_ed25519")
	write(sshKey, pem.EncodeToMemory(block), 0o600)
	sshPub, _ := ssh.NewPublicKey(priv.Public())

	for name, tc := range map[string]struct{ path, recipient string }{
		"age-keygen":   {keygen, x.Recipient().String()},
		"identity.age": {filepath.Join(agentDir, secret.IdentityFile), agentID.Recipient()},
		"ssh-ed25519":  {sshKey, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub)))},
	} {
		id, err := loadAdminIdentity(tc.path)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if id.recipient != tc.recipient {
			t.Errorf("%s: recipient %q, want %q", name, id.recipient, tc.recipient)
		}
		ct, err := secret.Encrypt([]byte("pw\n"), []string{id.recipient})
		if err != nil {
			t.Fatal(err)
		}
		if p, err := id.decrypt(ct); err != nil || string(p) != "pw\n" {
			t.Errorf("%s: decrypt its own: %q, %v", name, p, err)
		}
		other, _ := secret.Encrypt([]byte("pw\n"), []string{agentIDOther(t)})
		if _, err := id.decrypt(other); !errors.Is(err, secret.ErrNotRecipient) {
			t.Errorf("%s: decrypt another's: %v, want ErrNotRecipient", name, err)
		}
	}

	write(keygen, []byte(x.String()+"\n"), 0o640)
	var me *secret.ModeError
	if _, err := loadAdminIdentity(keygen); !errors.As(err, &me) {
		t.Errorf("a group-readable identity: %v, want a ModeError", err)
	}
	write(keygen, []byte("not a key\n"), 0o600)
	if _, err := loadAdminIdentity(keygen); err == nil || !strings.Contains(err.Error(), "AGE-SECRET-KEY-1") {
		t.Errorf("neither age nor ssh: %v, want an error naming both forms", err)
	}
}

func agentIDOther(t *testing.T) string {
	t.Helper()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	return id.Recipient().String()
}

// unit cat shows a secret's header and whom it is for, not its armour;
// any other value as it is.
func TestSecretCatValue(t *testing.T) {
	ct, err := secret.Encrypt([]byte("pw\n"), []string{agentIDOther(t)})
	if err != nil {
		t.Fatal(err)
	}
	v := reconcile.ConfigFile{Mode: 0o600, Secret: true, To: []string{"h1", "h2"}, Content: ct}.Encode()
	got := string(catValue("app.service.files/etc/app/pw", v))
	want := "#agentd-file mode=0600 owner=root:root secret=age to=h1,h2\n(age-encrypted to h1, h2; ciphertext sha256 " + short(reconcile.Hash(ct)) + ")\n"
	if got != want {
		t.Errorf("cat of a secret:\n%s\nwant\n%s", got, want)
	}
	plain := reconcile.ConfigFile{Mode: 0o644, Content: []byte("x=1\n")}.Encode()
	if got := catValue("app.service.files/etc/app/x", plain); !bytes.Equal(got, plain) {
		t.Errorf("cat of a plain config file: %q", got)
	}
	if got := catValue("app.service", []byte("[Service]\n")); string(got) != "[Service]\n" {
		t.Errorf("cat of a unit file: %q", got)
	}
}

// A group's hosts are its members live or down; a host must have joined
// unless its recipient comes from a file.
func TestSecretTargetHosts(t *testing.T) {
	known := []registry.KnownHost{
		{Member: reconcile.Member{Host: "a", Groups: []string{"web", "all"}}},
		{Member: reconcile.Member{Host: "b", Groups: []string{"db"}}},
		{Member: reconcile.Member{Host: "c", Groups: []string{"web"}}, Live: true},
	}
	for _, tc := range []struct {
		tg       registry.Target
		fromFile bool
		want     string // hosts, or the error's text
	}{
		{registry.Target{Group: "web"}, false, "a,c"},
		{registry.Target{Group: "none"}, false, "group none has no members"},
		{registry.Target{Host: "b"}, false, "b"},
		{registry.Target{Host: "z"}, false, "no agent has joined as z: no key to encrypt to"},
		{registry.Target{Host: "z"}, true, "z"},
	} {
		hosts, err := targetHosts(tc.tg, known, tc.fromFile)
		got := strings.Join(hosts, ",")
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("targetHosts(%v, file %v) = %q, want %q", tc.tg, tc.fromFile, got, tc.want)
		}
	}
}
