package sshsig

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"github.com/agentd/agentd/internal/citest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// sshKeygen is the path of ssh-keygen: the test fails under CI=true
// without it (.ci/run installs openssh-client) and is skipped elsewhere.
func sshKeygen(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("ssh-keygen")
	if err != nil {
		citest.Unavailable(t, "ssh-keygen (openssh-client): %v", err)
	}
	return p
}

// newKey makes a key pair of typ with ssh-keygen in dir and returns its
// private key file and signer.
func newKey(t testing.TB, dir, typ string) (string, ssh.Signer) {
	t.Helper()
	path := filepath.Join(dir, "id_"+typ)
	args := []string{"-q", "-t", typ, "-N", "", "-C", typ + "@test", "-f", path}
	if typ == "rsa" {
		args = append(args, "-b", "2048")
	}
	if out, err := exec.Command(sshKeygen(t), args...).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		t.Fatal(err)
	}
	return path, s
}

func allowedLine(principal, options string, k ssh.PublicKey) string {
	line := principal + " "
	if options != "" {
		line += options + " "
	}
	return line + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}

func writeFile(t testing.TB, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const msg = "agentd signed change v1\nkey /agentd/hosts/h1/units/hello.service\n"

// What Sign makes, ssh-keygen -Y verify accepts (for each key type), and
// what ssh-keygen -Y sign makes, Verify accepts.
func TestInteropWithSSHKeygen(t *testing.T) {
	keygen := sshKeygen(t)
	dir := t.TempDir()
	msgFile := writeFile(t, filepath.Join(dir, "msg"), msg)
	for _, typ := range []string{"ed25519", "ecdsa", "rsa"} {
		t.Run(typ, func(t *testing.T) {
			keyFile, s := newKey(t, dir, typ)
			allowed := writeFile(t, filepath.Join(dir, "allowed_"+typ), allowedLine("alice@example.com", `namespaces="agentd"`, s.PublicKey())+"\n")

			armored, err := Sign(s, "agentd", []byte(msg))
			if err != nil {
				t.Fatal(err)
			}
			sigFile := writeFile(t, filepath.Join(dir, "ours_"+typ+".sig"), string(armored))
			cmd := exec.Command(keygen, "-Y", "verify", "-f", allowed, "-I", "alice@example.com", "-n", "agentd", "-s", sigFile)
			cmd.Stdin = strings.NewReader(msg)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("ssh-keygen -Y verify refused agentd's signature: %v\n%s\n%s", err, out, armored)
			}
			// ... and it refuses it over another message.
			cmd = exec.Command(keygen, "-Y", "verify", "-f", allowed, "-I", "alice@example.com", "-n", "agentd", "-s", sigFile)
			cmd.Stdin = strings.NewReader(msg + "x")
			if out, err := cmd.CombinedOutput(); err == nil {
				t.Fatalf("ssh-keygen -Y verify accepted agentd's signature over another message:\n%s", out)
			}

			if out, err := exec.Command(keygen, "-Y", "sign", "-f", keyFile, "-n", "agentd", msgFile).CombinedOutput(); err != nil {
				t.Fatalf("ssh-keygen -Y sign: %v\n%s", err, out)
			}
			theirs, err := os.ReadFile(msgFile + ".sig")
			if err != nil {
				t.Fatal(err)
			}
			os.Remove(msgFile + ".sig")
			as, err := LoadAllowedSigners(allowed)
			if err != nil {
				t.Fatal(err)
			}
			who, err := as.Verify(theirs, "agentd", []byte(msg), time.Now())
			if err != nil {
				t.Fatalf("Verify refused ssh-keygen's signature: %v\n%s", err, theirs)
			}
			if who.Fingerprint != ssh.FingerprintSHA256(s.PublicKey()) || who.Principals != "alice@example.com" {
				t.Errorf("signer %+v", who)
			}
			// ssh-keygen's armor and ours are the same layout.
			if a, b := strings.Count(string(armored), "\n"), strings.Count(string(theirs), "\n"); a != b {
				t.Errorf("armor: ours has %d lines, ssh-keygen's %d\n%s\n%s", a, b, armored, theirs)
			}
		})
	}
}

// Every way a signature can be wrong is refused with its own error.
func TestVerifyRefuses(t *testing.T) {
	dir := t.TempDir()
	_, alice := newKey(t, dir, "ed25519")
	_, mallory := newKey(t, filepath.Join(mkdir(t, dir, "m")), "ed25519")
	_, old := newKey(t, filepath.Join(mkdir(t, dir, "o")), "ecdsa")
	_, gitOnly := newKey(t, filepath.Join(mkdir(t, dir, "g")), "rsa")
	as, err := ParseAllowedSigners("allowed", strings.NewReader(strings.Join([]string{
		"# operators",
		allowedLine("alice", `namespaces="agentd"`, alice.PublicKey()),
		allowedLine("old", `valid-before="20200101Z"`, old.PublicKey()),
		allowedLine("git", `namespaces="git,file"`, gitOnly.PublicKey()),
	}, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	sign := func(s ssh.Signer, ns, m string) []byte {
		b, err := Sign(s, ns, []byte(m))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := sign(alice, "agentd", msg)
	if who, err := as.Verify(good, "agentd", []byte(msg), now); err != nil || who.Principals != "alice" || who.Line != 2 {
		t.Fatalf("good signature: %+v %v", who, err)
	}
	for _, c := range []struct {
		name string
		sig  []byte
		want error
	}{
		{"other message", sign(alice, "agentd", msg+"x"), ErrInvalid},
		{"unknown key", sign(mallory, "agentd", msg), ErrUnknownKey},
		{"wrong namespace", sign(alice, "git", msg), ErrNamespace},
		{"key not for this namespace", sign(gitOnly, "agentd", msg), ErrNotAllowed},
		{"expired key", sign(old, "agentd", msg), ErrNotAllowed},
		{"truncated", good[:len(good)/2], ErrMalformed},
		{"truncated body", []byte(string(good[:60]) + "\n-----END SSH SIGNATURE-----\n"), ErrMalformed},
		{"not armored", []byte("hello"), ErrMalformed},
		{"empty", nil, ErrMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			who, err := as.Verify(c.sig, "agentd", []byte(msg), now)
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
			if c.want != ErrMalformed && who.Fingerprint == "" {
				t.Errorf("the refusal does not name the key: %+v", who)
			}
		})
	}
}

func mkdir(t *testing.T, parent, name string) string {
	t.Helper()
	p := filepath.Join(parent, name)
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// A malformed allowed_signers file is refused, naming the line.
func TestParseAllowedSignersErrors(t *testing.T) {
	dir := t.TempDir()
	_, k := newKey(t, dir, "ed25519")
	key := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k.PublicKey())))
	for _, c := range []struct {
		name, file, want string
	}{
		{"principals only", "# c\nalice\n", "allowed:2: "},
		{"no key", "\n\nalice namespaces=\"agentd\"\n", "allowed:3: invalid key or options"},
		{"bad base64", "alice ssh-ed25519 AAAA!!!\n", "allowed:1: invalid key"},
		{"unknown option", "alice frobnicate " + key + "\n", "allowed:1: "},
		{"bad time", "alice valid-before=\"2020\" " + key + "\n", "allowed:1: option valid-before"},
		{"cert-authority", "alice cert-authority " + key + "\n", "allowed:1: cert-authority"},
		{"unterminated quote", "\"alice " + key + "\n", "allowed:1: unterminated"},
		{"second line bad", "alice " + key + "\nbob ssh-ed25519\n", "allowed:2: "},
		{"empty", "# nobody\n\n", "no signer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseAllowedSigners("allowed", strings.NewReader(c.file))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want it to contain %q", err, c.want)
			}
		})
	}
	if _, err := LoadAllowedSigners(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("missing file: %v", err)
	}
	// What ssh-keygen accepts parses: quoted principals, several
	// options, a comment.
	as, err := ParseAllowedSigners("allowed", strings.NewReader(
		`"alice,bob" namespaces="agentd,file",valid-after="20200101",valid-before="21000101120000Z" `+key+" a comment\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := as.Entries[0]
	if e.Principals != "alice,bob" || e.Namespaces != "agentd,file" || e.ValidAfter.Year() != 2020 || e.ValidBefore.Year() != 2100 {
		t.Fatalf("parsed %+v", e)
	}
}

func TestMatchList(t *testing.T) {
	for _, c := range []struct {
		s, list string
		want    bool
	}{
		{"agentd", "agentd", true},
		{"agentd", "git,agentd", true},
		{"agentd", "age*", true},
		{"agentd", "agent?", true},
		{"agentd", "*,!agentd", false},
		{"agentd", "git", false},
		{"agentd", "agentd?", false},
	} {
		if got := matchList(c.s, c.list); got != c.want {
			t.Errorf("matchList(%q, %q) = %v", c.s, c.list, got)
		}
	}
}

// BenchmarkVerify is the cost of checking one change's signature (parse
// the armor, find the key, verify an ed25519 sha512 SSHSIG) beside a
// baseline measured in the same run: hashing a 1 KiB unit file
// with SHA-256, which the agent does for every change anyway.
func BenchmarkVerify(b *testing.B) {
	dir := b.TempDir()
	unit := bytes.Repeat([]byte("ExecStart=/usr/bin/sleep infinity\n"), 30)
	for _, typ := range []string{"ed25519", "ecdsa", "rsa"} {
		_, s := newKey(b, dir, typ)
		as, err := ParseAllowedSigners("allowed", strings.NewReader(allowedLine("alice", `namespaces="agentd"`, s.PublicKey())))
		if err != nil {
			b.Fatal(err)
		}
		sig, err := Sign(s, "agentd", []byte(msg))
		if err != nil {
			b.Fatal(err)
		}
		now := time.Now()
		b.Run("verify/"+typ, func(b *testing.B) {
			for b.Loop() {
				if _, err := as.Verify(sig, "agentd", []byte(msg), now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("baseline/sha256-1KiB", func(b *testing.B) {
		for b.Loop() {
			sha256.Sum256(unit)
		}
	})
}
