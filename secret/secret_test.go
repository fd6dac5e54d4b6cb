package secret

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
	"unicode/utf8"

	"golang.org/x/crypto/ssh"
)

// newX25519 is a fresh agent identity in its own state directory.
func newX25519(t testing.TB) *Identity {
	t.Helper()
	id, err := LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// writeSSHKey writes a new unencrypted OpenSSH ed25519 private key, mode
// 0600, as ssh-keygen would, and returns its path.
func writeSSHKey(t testing.TB, dir string) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "root@test")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ssh_host_ed25519_key")
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newSSH(t testing.TB) *Identity {
	t.Helper()
	id, err := LoadSSH(writeSSHKey(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for name, id := range map[string]*Identity{"x25519": newX25519(t), "ssh-ed25519": newSSH(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			plain := []byte("password=hunter2\n")
			ct, err := Encrypt(plain, []string{id.Recipient()})
			if err != nil {
				t.Fatal(err)
			}
			if !IsArmored(ct) || !strings.HasPrefix(string(ct), "-----BEGIN AGE ENCRYPTED FILE-----\n") {
				t.Errorf("ciphertext is not armored:\n%s", ct)
			}
			if !utf8.Valid(ct) || bytes.IndexByte(ct, 0) >= 0 {
				t.Error("ciphertext is not UTF-8 text without NUL")
			}
			got, err := id.Decrypt(ct)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, plain) {
				t.Errorf("decrypted %q, want %q", got, plain)
			}
		})
	}
}

func TestRecipientText(t *testing.T) {
	t.Parallel()
	if r := newX25519(t).Recipient(); !strings.HasPrefix(r, "age1") {
		t.Errorf("X25519 recipient %q, want age1…", r)
	}
	r := newSSH(t).Recipient()
	if f := strings.Fields(r); len(f) != 2 || f[0] != "ssh-ed25519" || !strings.HasPrefix(f[1], "AAAA") {
		t.Errorf("SSH recipient %q, want \"ssh-ed25519 AAAA…\" without comment", r)
	}
	if _, err := ParseRecipient(r + " root@host"); err != nil {
		t.Errorf("SSH recipient with a comment: %v", err)
	}
}

func TestSeveralRecipients(t *testing.T) {
	t.Parallel()
	a, b, c := newX25519(t), newSSH(t), newX25519(t)
	plain := []byte("shared")
	// b twice, once with a comment: used once.
	ct, err := Encrypt(plain, []string{a.Recipient(), b.Recipient(), b.Recipient() + " root@b"})
	if err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]*Identity{"a": a, "b": b} {
		got, err := id.Decrypt(ct)
		if err != nil || !bytes.Equal(got, plain) {
			t.Errorf("recipient %s: %q, %v", name, got, err)
		}
	}
	got, err := c.Decrypt(ct)
	if !errors.Is(err, ErrNotRecipient) || errors.Is(err, ErrCorrupt) || got != nil {
		t.Errorf("non-recipient: %q, %v; want ErrNotRecipient", got, err)
	}
	if !strings.Contains(err.Error(), c.Recipient()) {
		t.Errorf("error %q does not name the identity's recipient", err)
	}
}

func TestDuplicatesRemoved(t *testing.T) {
	t.Parallel()
	a := newX25519(t)
	once, err := Encrypt([]byte("x"), []string{a.Recipient()})
	if err != nil {
		t.Fatal(err)
	}
	twice, err := Encrypt([]byte("x"), []string{a.Recipient(), " " + a.Recipient()})
	if err != nil {
		t.Fatal(err)
	}
	if len(once) != len(twice) {
		t.Errorf("a recipient given twice: %d bytes, once: %d bytes; want one stanza", len(twice), len(once))
	}
}

// TestTampered changes one byte of the payload (the body after the
// header): the MAC fails and no plaintext comes out.
func TestTampered(t *testing.T) {
	t.Parallel()
	id := newX25519(t)
	ct, err := Encrypt(bytes.Repeat([]byte("s"), 100), []string{id.Recipient()})
	if err != nil {
		t.Fatal(err)
	}
	// The armored body's last base64 line is in the payload, after the
	// header's MAC line. Change one character of it to another base64
	// character that still decodes.
	lines := strings.Split(strings.TrimSuffix(string(ct), "\n"), "\n")
	last := []byte(lines[len(lines)-2])
	if last[0] == 'A' {
		last[0] = 'B'
	} else {
		last[0] = 'A'
	}
	lines[len(lines)-2] = string(last)
	bad := []byte(strings.Join(lines, "\n") + "\n")
	got, err := id.Decrypt(bad)
	if !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNotRecipient) || got != nil {
		t.Errorf("tampered: %q, %v; want ErrCorrupt and no plaintext", got, err)
	}
	for name, in := range map[string][]byte{
		"not age":    []byte("hello"),
		"truncated":  ct[:len(ct)/2],
		"bad armor":  []byte(strings.Replace(string(ct), "-----END", "-----XND", 1)),
		"empty":      nil,
		"only armor": []byte("-----BEGIN AGE ENCRYPTED FILE-----\n-----END AGE ENCRYPTED FILE-----\n"),
	} {
		if got, err := id.Decrypt(in); !errors.Is(err, ErrCorrupt) || got != nil {
			t.Errorf("%s: %q, %v; want ErrCorrupt", name, got, err)
		}
	}
}

func TestEncryptRefuses(t *testing.T) {
	t.Parallel()
	a := newX25519(t).Recipient()
	for name, tc := range map[string]struct {
		plain      []byte
		recipients []string
		want       string
	}{
		"no recipients":  {[]byte("x"), nil, "no recipients"},
		"too large":      {make([]byte, MaxPlaintext+1), []string{a}, "over the limit"},
		"garbage":        {[]byte("x"), []string{a, "hello"}, "neither an age1"},
		"bad age1":       {[]byte("x"), []string{"age1qqqq"}, "age1qqqq"},
		"ssh-rsa":        {[]byte("x"), []string{"ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ"}, "ssh-rsa is not supported"},
		"bad ssh base64": {[]byte("x"), []string{"ssh-ed25519 !!!"}, "ssh-ed25519 !!!"},
	} {
		if _, err := Encrypt(tc.plain, tc.recipients); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, tc.want)
		}
	}
	if _, err := Encrypt(make([]byte, MaxPlaintext), []string{a}); err != nil {
		t.Errorf("exactly MaxPlaintext: %v", err)
	}
	if _, err := Encrypt(nil, []string{a}); err != nil {
		t.Errorf("empty secret: %v", err)
	}
}

func TestIsArmored(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		"-----BEGIN AGE ENCRYPTED FILE-----\n":     true,
		"\n  -----BEGIN AGE ENCRYPTED FILE-----\n": true,
		"age-encryption.org/v1\n":                  false,
		"":                                         false,
		"-----BEGIN SSH SIGNATURE-----\n":          false,
	} {
		if got := IsArmored([]byte(in)); got != want {
			t.Errorf("IsArmored(%q) = %v", in, got)
		}
	}
}

func BenchmarkDecrypt(b *testing.B) {
	id := newX25519(b)
	plain := make([]byte, 1<<10)
	if _, err := rand.Read(plain); err != nil {
		b.Fatal(err)
	}
	ct, err := Encrypt(plain, []string{id.Recipient()})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := id.Decrypt(ct); err != nil {
			b.Fatal(err)
		}
	}
}
