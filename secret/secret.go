// Package secret encrypts small secrets so that only the hosts they are
// meant for can read them, with age (filippo.io/age): the registry holds
// only ciphertext, and each agent decrypts with an identity that never
// leaves its machine — its own X25519 identity kept in the state directory
// (LoadOrCreate), or the host's SSH ed25519 key (LoadSSH, agenix's model).
//
// Ciphertext is ASCII-armored ("-----BEGIN AGE ENCRYPTED FILE-----"), so it
// is UTF-8 text without NUL, as registry values must be, and the age
// command line tool reads and writes the same thing (age -d / age -r -a).
//
// For the CLI, Pins keeps each host's recipient on first use and reports a
// changed one, as ssh's known_hosts does; LoadRecipientsFile reads an
// operator-kept list of hosts' recipients instead.
//
// The package is a pure library: no logging, no global state. Identity is
// safe for concurrent use; Pins is not.
package secret

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"filippo.io/age"
	"filippo.io/age/agessh"
	"filippo.io/age/armor"
	"golang.org/x/crypto/ssh"
)

// MaxPlaintext bounds a secret's plaintext. Secrets are keys, passwords and
// small config files; the registry holds every secret of every host in
// memory on every agent, so a large file is not a secret's job. Encrypt
// refuses more, and Decrypt reads no more.
const MaxPlaintext = 64 << 10

// ErrNotRecipient: the ciphertext is well formed but was not encrypted to
// this identity (age does not name recipients, so it cannot say to whom).
var ErrNotRecipient = errors.New("not encrypted to this identity")

// ErrCorrupt: the ciphertext is not an age file, or it was damaged or
// tampered with (a bad armor, header, MAC or payload). No plaintext is
// returned.
var ErrCorrupt = errors.New("corrupt or not an age ciphertext")

// IsArmored reports whether b starts, after leading whitespace, with the
// age armor's first line.
func IsArmored(b []byte) bool {
	return bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte(armor.Header))
}

// ParseRecipient parses an age X25519 recipient ("age1…") or an SSH ed25519
// public key ("ssh-ed25519 AAAA… [comment]", as in a .pub file or
// ssh-keyscan's output without the host). Other SSH key types are refused:
// a host key for this is ed25519, and age's ssh-rsa stanza is large and
// slow.
func ParseRecipient(s string) (age.Recipient, error) {
	r, _, err := parseRecipient(s)
	return r, err
}

// parseRecipient returns the recipient and its canonical text: the age1
// string, or "ssh-ed25519 AAAA…" without a comment.
func parseRecipient(s string) (age.Recipient, string, error) {
	s = strings.TrimSpace(s)
	switch {
	case strings.HasPrefix(s, "age1"):
		r, err := age.ParseX25519Recipient(s)
		if err != nil {
			return nil, "", fmt.Errorf("recipient %q: %w", s, err)
		}
		return r, r.String(), nil
	case strings.HasPrefix(s, "ssh-ed25519 "):
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(s))
		if err != nil {
			return nil, "", fmt.Errorf("recipient %q: %w", s, err)
		}
		r, err := agessh.NewEd25519Recipient(pub)
		if err != nil {
			return nil, "", fmt.Errorf("recipient %q: %w", s, err)
		}
		return r, sshText(pub), nil
	case strings.HasPrefix(s, "ssh-"), strings.HasPrefix(s, "ecdsa-"):
		kind, _, _ := strings.Cut(s, " ")
		return nil, "", fmt.Errorf("recipient %q: SSH key type %s is not supported: use an ssh-ed25519 key or an age1 recipient", s, kind)
	default:
		return nil, "", fmt.Errorf("recipient %q: neither an age1 X25519 recipient nor an ssh-ed25519 public key", s)
	}
}

// sshText is the authorized_keys form of pub without comment or newline.
func sshText(pub ssh.PublicKey) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
}

// Encrypt encrypts plaintext to every recipient (each one can decrypt it
// alone) and returns the armored ciphertext. Recipients are parsed with
// ParseRecipient; at least one is required, and one given twice (even with
// a different SSH comment) is used once. A plaintext over MaxPlaintext is
// refused.
func Encrypt(plaintext []byte, recipients []string) ([]byte, error) {
	if len(plaintext) > MaxPlaintext {
		return nil, fmt.Errorf("encrypt: secret is %d bytes, over the limit of %d", len(plaintext), MaxPlaintext)
	}
	if len(recipients) == 0 {
		return nil, errors.New("encrypt: no recipients: a secret must be readable by at least one host")
	}
	seen := make(map[string]bool, len(recipients))
	var rs []age.Recipient
	for _, s := range recipients {
		r, canon, err := parseRecipient(s)
		if err != nil {
			return nil, fmt.Errorf("encrypt: %w", err)
		}
		if seen[canon] {
			continue
		}
		seen[canon] = true
		rs = append(rs, r)
	}
	var buf bytes.Buffer
	aw := armor.NewWriter(&buf)
	w, err := age.Encrypt(aw, rs...)
	if err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}
	// Writes to a bytes.Buffer do not fail; Close finishes the last chunk
	// and the armor.
	if _, err := w.Write(plaintext); err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}
	if err := aw.Close(); err != nil {
		return nil, fmt.Errorf("encrypt: %w", err)
	}
	return buf.Bytes(), nil
}

// decrypt decrypts an armored (or binary) age ciphertext with id, whose
// recipient text names it in errors.
func decrypt(ciphertext []byte, id age.Identity, recipient string) ([]byte, error) {
	var src io.Reader = bytes.NewReader(ciphertext)
	if IsArmored(ciphertext) {
		src = armor.NewReader(src)
	}
	r, err := age.Decrypt(src, id)
	if err != nil {
		var noMatch *age.NoIdentityMatchError
		if errors.As(err, &noMatch) {
			return nil, fmt.Errorf("decrypt: %w (%s)", ErrNotRecipient, recipient)
		}
		return nil, fmt.Errorf("decrypt: %w: %v", ErrCorrupt, err)
	}
	// The payload is authenticated chunk by chunk as it is read: read it
	// all before returning any of it.
	plaintext, err := io.ReadAll(io.LimitReader(r, MaxPlaintext+1))
	if err != nil {
		return nil, fmt.Errorf("decrypt: %w: %v", ErrCorrupt, err)
	}
	if len(plaintext) > MaxPlaintext {
		return nil, fmt.Errorf("decrypt: secret is over the limit of %d bytes", MaxPlaintext)
	}
	return plaintext, nil
}
