package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// systemdCreds makes systemd credentials of secrets (reconcile.Credentials)
// with systemd-creds: TPM2 where present, else the host key in
// /var/lib/systemd/credential.secret. The plaintext goes in on stdin and
// the credential comes out on stdout: never a file, never an argument.
type systemdCreds struct {
	// user and version: the manager the credentials are for. A user
	// manager loads encrypted credentials from systemd 256 on only.
	user    bool
	version int
	// withKey is systemd-creds' --with-key (--credential-key).
	withKey string

	mu sync.Mutex
	// made keeps the credential last made of each (name, plaintext):
	// the desired units are built again now and then (a check, another
	// key's change), and the same secret must make the same file.
	made map[[32]byte][]byte
}

// userCredsSince is the first systemd whose user managers decrypt
// credentials (systemd-creds --user).
const userCredsSince = 256

// credsTimeout bounds one systemd-creds call (a TPM2 may be slow, never
// this slow).
const credsTimeout = 10 * time.Second

// Seal returns the credential in path when it holds plaintext already (a
// credential is encrypted anew each time: a new one for the same secret
// would be a change, and restart its unit), else a new one.
func (c *systemdCreds) Seal(ctx context.Context, name, path string, plaintext []byte) ([]byte, error) {
	if c.user && c.version < userCredsSince {
		return nil, fmt.Errorf("this user manager's systemd (%d) cannot load encrypted credentials (LoadCredentialEncrypted= in a user unit takes systemd %d or later): nothing written", c.version, userCredsSince)
	}
	ctx, cancel := context.WithTimeout(ctx, credsTimeout)
	defer cancel()
	id := sha256.Sum256(append([]byte(name+"\x00"), plaintext...))
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, err := os.ReadFile(path); err == nil {
		if bytes.Equal(cur, c.made[id]) {
			return cur, nil
		}
		if got, err := runCreds(ctx, nil, "decrypt", "--name="+name, path, "-"); err == nil && bytes.Equal(got, plaintext) {
			c.keep(id, cur)
			return cur, nil
		}
	}
	if made, ok := c.made[id]; ok {
		return made, nil
	}
	key := c.withKey
	if key == "" {
		key = "auto"
	}
	made, err := runCreds(ctx, plaintext, "encrypt", "--name="+name, "--with-key="+key, "-", "-")
	if err != nil {
		return nil, err
	}
	c.keep(id, made)
	return made, nil
}

// keep remembers the credential of id; the table stays small (a host
// has a few credentials), and is cleared rather than grown past that.
func (c *systemdCreds) keep(id [32]byte, cred []byte) {
	if c.made == nil || len(c.made) > 1024 {
		c.made = map[[32]byte][]byte{}
	}
	c.made[id] = cred
}

// runCreds runs systemd-creds with args and stdin, returning its stdout.
func runCreds(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "systemd-creds", args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, errors.New("systemd-creds not found: this host's systemd is too old for credentials (systemd 250 or later)")
		}
		return nil, fmt.Errorf("systemd-creds %s: %w: %s", args[0], err, lastLine(errOut.String()))
	}
	return out.Bytes(), nil
}

// lastLine is the last non-empty line of s: systemd-creds says why last.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
