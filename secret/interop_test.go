package secret

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentd/agentd/internal/citest"
)

// ageTool is the path of the age command line tool (Debian package age),
// or the test is Unavailable.
func ageTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		citest.Unavailable(t, "%s not found (Debian package age): %v", name, err)
	}
	return p
}

func run(t *testing.T, stdin []byte, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

// TestAgeTool: the age tool reads what Encrypt writes, with the identity
// file LoadOrCreate writes or the SSH key LoadSSH reads, and Decrypt reads
// what the tool writes (age -r … -a).
func TestAgeTool(t *testing.T) {
	t.Parallel()
	age := ageTool(t, "age")
	keygen := ageTool(t, "age-keygen")

	stateDir := t.TempDir()
	x, err := LoadOrCreate(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	xFile := filepath.Join(stateDir, IdentityFile)
	if got := strings.TrimSpace(string(run(t, nil, keygen, "-y", xFile))); got != x.Recipient() {
		t.Errorf("age-keygen -y %s: %s, want %s", xFile, got, x.Recipient())
	}
	sshFile := writeSSHKey(t, t.TempDir())
	s, err := LoadSSH(sshFile)
	if err != nil {
		t.Fatal(err)
	}

	for name, tc := range map[string]struct {
		id   *Identity
		file string
	}{"x25519": {x, xFile}, "ssh-ed25519": {s, sshFile}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			plain := []byte("from " + name + "\n")
			ct, err := Encrypt(plain, []string{tc.id.Recipient()})
			if err != nil {
				t.Fatal(err)
			}
			if got := run(t, ct, age, "-d", "-i", tc.file); !bytes.Equal(got, plain) {
				t.Errorf("age -d of Encrypt's output: %q, want %q", got, plain)
			}

			ct = run(t, plain, age, "-r", tc.id.Recipient(), "-a")
			if !IsArmored(ct) {
				t.Fatalf("age -a wrote no armor:\n%s", ct)
			}
			got, err := tc.id.Decrypt(ct)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, plain) {
				t.Errorf("Decrypt of age -r -a's output: %q, want %q", got, plain)
			}
		})
	}
}

// TestAgeToolIdentity: Decrypt works with an identity file age-keygen made
// and LoadOrCreate loads as it is.
func TestAgeToolIdentity(t *testing.T) {
	t.Parallel()
	keygen := ageTool(t, "age-keygen")
	dir := t.TempDir()
	path := filepath.Join(dir, IdentityFile)
	run(t, nil, keygen, "-o", path)
	if err := os.Chmod(path, 0o600); err != nil { // age-keygen -o makes it 0600; be sure
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	id, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(before), "# public key: "+id.Recipient()+"\n") {
		t.Errorf("recipient %s is not the one age-keygen wrote:\n%s", id.Recipient(), before)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
		t.Error("LoadOrCreate rewrote age-keygen's file")
	}
}
