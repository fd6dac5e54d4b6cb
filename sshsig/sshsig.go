// Package sshsig signs and verifies messages in OpenSSH's signature format
// (PROTOCOL.sshsig: what `ssh-keygen -Y sign` writes and `ssh-keygen -Y
// verify` checks), and reads ssh-keygen's allowed_signers files
// (ssh-keygen(1), ALLOWED SIGNERS).
//
// A signature is the armored blob
//
//	-----BEGIN SSH SIGNATURE-----
//	base64("SSHSIG" uint32(1) string(publickey) string(namespace)
//	       string(reserved) string(hash_algorithm) string(signature))
//	-----END SSH SIGNATURE-----
//
// whose signature is made by publickey over
//
//	"SSHSIG" string(namespace) string(reserved) string(hash_algorithm)
//	string(H(message))
//
// with H sha512 (what Sign uses, and ssh-keygen's default) or sha256. The
// namespace keeps a signature made for one purpose (here "agentd") from
// being accepted for another ("git", "file").
//
// Everything here is pure computation and safe for concurrent use.
package sshsig

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strings"

	"golang.org/x/crypto/ssh"
)

const (
	magic      = "SSHSIG"
	version    = 1
	armorBegin = "-----BEGIN SSH SIGNATURE-----"
	armorEnd   = "-----END SSH SIGNATURE-----"
	// HashSHA512 is the hash Sign uses (ssh-keygen's default).
	HashSHA512 = "sha512"
	// HashSHA256 is the other hash a signature may use.
	HashSHA256 = "sha256"
)

var (
	// ErrMalformed: the signature is not a well-formed SSH signature
	// (truncated, not armored, not base64, a wrong magic or version).
	ErrMalformed = errors.New("malformed SSH signature")
	// ErrNamespace: the signature was made for another namespace.
	ErrNamespace = errors.New("signature made for another namespace")
	// ErrInvalid: the signature does not verify: the message (or the
	// signature) is not the one that was signed.
	ErrInvalid = errors.New("signature does not match the message")
)

// Signature is a decoded SSH signature.
type Signature struct {
	PublicKey ssh.PublicKey
	Namespace string
	HashAlg   string
	Sig       *ssh.Signature
}

// wire is the signature blob, field for field.
type wire struct {
	Magic     [6]byte
	Version   uint32
	PublicKey []byte
	Namespace string
	Reserved  string
	HashAlg   string
	Signature []byte
}

// signedData is what the key signs.
type signedData struct {
	Magic     [6]byte
	Namespace string
	Reserved  string
	HashAlg   string
	Hash      []byte
}

func hasher(alg string) (hash.Hash, error) {
	switch alg {
	case HashSHA512:
		return sha512.New(), nil
	case HashSHA256:
		return sha256.New(), nil
	}
	return nil, fmt.Errorf("%w: hash algorithm %q (want sha512 or sha256)", ErrMalformed, alg)
}

func toSign(namespace, alg string, msg []byte) ([]byte, error) {
	h, err := hasher(alg)
	if err != nil {
		return nil, err
	}
	h.Write(msg)
	d := signedData{Namespace: namespace, HashAlg: alg, Hash: h.Sum(nil)}
	copy(d.Magic[:], magic)
	return ssh.Marshal(d), nil
}

// Sign signs msg for namespace with s (sha512) and returns the armored
// signature, as `ssh-keygen -Y sign -n namespace` writes it. An RSA key
// signs with rsa-sha2-512 (OpenSSH refuses SHA-1 signatures).
func Sign(s ssh.Signer, namespace string, msg []byte) ([]byte, error) {
	if namespace == "" {
		return nil, errors.New("sshsig: empty namespace")
	}
	data, err := toSign(namespace, HashSHA512, msg)
	if err != nil {
		return nil, err
	}
	var sig *ssh.Signature
	if as, ok := s.(ssh.AlgorithmSigner); ok && s.PublicKey().Type() == ssh.KeyAlgoRSA {
		sig, err = as.SignWithAlgorithm(rand.Reader, data, ssh.KeyAlgoRSASHA512)
	} else if s.PublicKey().Type() == ssh.KeyAlgoRSA {
		return nil, errors.New("sshsig: this RSA signer cannot make rsa-sha2-512 signatures")
	} else {
		sig, err = s.Sign(rand.Reader, data)
	}
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	w := wire{Version: version, PublicKey: s.PublicKey().Marshal(), Namespace: namespace, HashAlg: HashSHA512, Signature: ssh.Marshal(sig)}
	copy(w.Magic[:], magic)
	return armor(ssh.Marshal(w)), nil
}

// armor wraps blob as ssh-keygen does: base64 in lines of 70 characters.
func armor(blob []byte) []byte {
	enc := base64.StdEncoding.EncodeToString(blob)
	var b bytes.Buffer
	b.WriteString(armorBegin + "\n")
	for len(enc) > 70 {
		b.WriteString(enc[:70] + "\n")
		enc = enc[70:]
	}
	b.WriteString(enc + "\n" + armorEnd + "\n")
	return b.Bytes()
}

// Parse decodes an armored signature. It checks the form only: Verify
// checks that it signs a message.
func Parse(armored []byte) (*Signature, error) {
	s := strings.TrimSpace(string(armored))
	body, ok := strings.CutPrefix(s, armorBegin)
	if !ok {
		return nil, fmt.Errorf("%w: no %s line", ErrMalformed, armorBegin)
	}
	body, ok = strings.CutSuffix(body, armorEnd)
	if !ok {
		return nil, fmt.Errorf("%w: no %s line (truncated?)", ErrMalformed, armorEnd)
	}
	blob, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(body), ""))
	if err != nil {
		return nil, fmt.Errorf("%w: base64: %v", ErrMalformed, err)
	}
	var w wire
	if err := ssh.Unmarshal(blob, &w); err != nil {
		return nil, fmt.Errorf("%w: %v (truncated?)", ErrMalformed, err)
	}
	if string(w.Magic[:]) != magic {
		return nil, fmt.Errorf("%w: no SSHSIG magic", ErrMalformed)
	}
	if w.Version != version {
		return nil, fmt.Errorf("%w: version %d (want %d)", ErrMalformed, w.Version, version)
	}
	if _, err := hasher(w.HashAlg); err != nil {
		return nil, err
	}
	pub, err := ssh.ParsePublicKey(w.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("%w: public key: %v", ErrMalformed, err)
	}
	sig := new(ssh.Signature)
	if err := ssh.Unmarshal(w.Signature, sig); err != nil {
		return nil, fmt.Errorf("%w: signature: %v", ErrMalformed, err)
	}
	return &Signature{PublicKey: pub, Namespace: w.Namespace, HashAlg: w.HashAlg, Sig: sig}, nil
}

// Verify checks that s signs msg in namespace with s.PublicKey. Which keys
// to trust is the caller's (AllowedSigners.Verify).
func (s *Signature) Verify(namespace string, msg []byte) error {
	if s.Namespace != namespace {
		return fmt.Errorf("%w: %q, not %q", ErrNamespace, s.Namespace, namespace)
	}
	if s.PublicKey.Type() == ssh.KeyAlgoRSA && s.Sig.Format == ssh.KeyAlgoRSA {
		return fmt.Errorf("%w: an ssh-rsa (SHA-1) signature; OpenSSH accepts only rsa-sha2-256/512", ErrInvalid)
	}
	data, err := toSign(namespace, s.HashAlg, msg)
	if err != nil {
		return err
	}
	if err := s.PublicKey.Verify(data, s.Sig); err != nil {
		return fmt.Errorf("%w (%v)", ErrInvalid, err)
	}
	return nil
}

// Fingerprint is the key's SHA256 fingerprint as ssh-keygen -l prints it
// ("SHA256:…").
func Fingerprint(k ssh.PublicKey) string { return ssh.FingerprintSHA256(k) }
