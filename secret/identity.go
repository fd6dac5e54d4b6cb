package secret

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"filippo.io/age"
	"filippo.io/age/agessh"
	"golang.org/x/crypto/ssh"
)

// IdentityFile is the name of the agent's own identity in its state
// directory.
const IdentityFile = "identity.age"

// Identity is a host's private key for secrets: what decrypts a secret
// encrypted to Recipient(). Safe for concurrent use.
type Identity struct {
	id        age.Identity
	recipient string
}

// Recipient is the public text others encrypt to: "age1…" for an X25519
// identity, "ssh-ed25519 AAAA…" (no comment) for an SSH host key.
func (i *Identity) Recipient() string { return i.recipient }

// Decrypt decrypts an armored age ciphertext (binary age is accepted too).
// A ciphertext for other recipients only is an error wrapping
// ErrNotRecipient; a damaged, tampered or foreign one wraps ErrCorrupt, and
// no plaintext is returned.
func (i *Identity) Decrypt(armored []byte) ([]byte, error) {
	return decrypt(armored, i.id, i.recipient)
}

// LoadOrCreate returns the X25519 identity in stateDir/identity.age,
// creating it at first use. The file is age-keygen's format (a "# created:"
// and a "# public key:" comment, then the AGE-SECRET-KEY-1… line), so the
// age tool reads it as is (age -d -i). It is created mode 0600 and never
// rewritten: a second agent starting at the same moment loads the first
// one's identity rather than replacing it. stateDir must exist (the agent's
// state directory, private already). An identity file that group or others
// may read is refused, as ssh refuses such a private key: a secret it
// protects may have been read already, and the operator must know.
func LoadOrCreate(stateDir string) (*Identity, error) {
	path := filepath.Join(stateDir, IdentityFile)
	id, err := loadX25519(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return id, err
	}
	if _, err := os.Stat(stateDir); err != nil {
		return nil, fmt.Errorf("identity: state directory: %w", err)
	}
	x, err := age.GenerateX25519Identity()
	if err != nil {
		return nil, fmt.Errorf("identity: generate: %w", err)
	}
	content := fmt.Sprintf("# created: %s\n# public key: %s\n%s\n",
		time.Now().Format(time.RFC3339), x.Recipient(), x)
	if err := createOnce(path, []byte(content), 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) { // another process made it first
			return loadX25519(path)
		}
		return nil, fmt.Errorf("identity: %w", err)
	}
	return &Identity{id: x, recipient: x.Recipient().String()}, nil
}

// loadX25519 reads an age identity file holding one X25519 identity. A
// missing file is an error wrapping fs.ErrNotExist.
func loadX25519(path string) (*Identity, error) {
	b, err := readPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	ids, err := age.ParseIdentities(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("identity %s: %w", path, err)
	}
	if len(ids) != 1 {
		return nil, fmt.Errorf("identity %s: holds %d identities, want one", path, len(ids))
	}
	x, ok := ids[0].(*age.X25519Identity)
	if !ok {
		return nil, fmt.Errorf("identity %s: not an X25519 identity (AGE-SECRET-KEY-1…)", path)
	}
	return &Identity{id: x, recipient: x.Recipient().String()}, nil
}

// LoadSSH returns the identity of an SSH ed25519 private key, such as the
// host key /etc/ssh/ssh_host_ed25519_key: secrets are then encrypted to the
// host's public key as ssh-keyscan shows it, with no key of agentd's own to
// distribute (agenix's model). Only an unencrypted ed25519 key will do (an
// agent has no one to ask for a passphrase), and, as for LoadOrCreate, one
// that group or others may read is refused.
func LoadSSH(path string) (*Identity, error) {
	b, err := readPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("ssh identity: %w", err)
	}
	raw, err := ssh.ParseRawPrivateKey(b)
	if err != nil {
		var missing *ssh.PassphraseMissingError
		if errors.As(err, &missing) {
			return nil, fmt.Errorf("ssh identity %s: the key is passphrase-protected: the agent needs an unencrypted key", path)
		}
		return nil, fmt.Errorf("ssh identity %s: %w", path, err)
	}
	var key ed25519.PrivateKey
	switch k := raw.(type) {
	case ed25519.PrivateKey:
		key = k
	case *ed25519.PrivateKey:
		key = *k
	default:
		return nil, fmt.Errorf("ssh identity %s: a %T, not an ed25519 key: only ssh-ed25519 keys are supported", path, raw)
	}
	id, err := agessh.NewEd25519Identity(key)
	if err != nil {
		return nil, fmt.Errorf("ssh identity %s: %w", path, err)
	}
	pub, err := ssh.NewPublicKey(key.Public())
	if err != nil {
		return nil, fmt.Errorf("ssh identity %s: %w", path, err)
	}
	return &Identity{id: id, recipient: sshText(pub)}, nil
}

// ModeError: a private key file that group or others may access.
type ModeError struct {
	Path string
	Mode fs.FileMode // its permission bits
}

func (e *ModeError) Error() string {
	return fmt.Sprintf("%s is mode %04o: other users may read this private key; make it 0600 (chmod 600 %s)", e.Path, e.Mode, e.Path)
}

// readPrivate reads a regular file (symlinks followed) that only its owner
// may access; otherwise a *ModeError. The mode is taken from the open file,
// so it is the one of what is read.
func readPrivate(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, &ModeError{Path: path, Mode: perm}
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxKeyFile {
		return nil, fmt.Errorf("%s is over %d bytes: not a key file", path, maxKeyFile)
	}
	return b, nil
}

// maxKeyFile bounds what readPrivate reads: an identity or SSH key file is
// a few hundred bytes.
const maxKeyFile = 64 << 10
