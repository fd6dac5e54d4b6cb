package mirror

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/agentd/agentd/sshsig"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// Namespace is the SSHSIG namespace git signs commits in (gpg.format=ssh).
const Namespace = "git"

const sshArmorBegin = "-----BEGIN SSH SIGNATURE-----"

var (
	// ErrUnsigned: the commit has no gpgsig header.
	ErrUnsigned = errors.New("not signed (commit with git commit -S and gpg.format=ssh)")
	// ErrNotSSH: the commit is signed, but not with an SSH key (an
	// OpenPGP or X.509 signature): the allowed signers are SSH keys.
	ErrNotSSH = errors.New("not an SSH signature (sign with gpg.format=ssh)")
)

// Refusal is why a commit may not be mirrored: it names the commit, its
// author and the reason, which wraps ErrUnsigned, ErrNotSSH or one of
// sshsig's errors (ErrInvalid: a bad signature, e.g. a tampered commit;
// ErrUnknownKey; ErrNotAllowed: not for namespace "git", or not at the
// commit's time; ErrMalformed).
type Refusal struct {
	Commit plumbing.Hash
	Author string // "Name <email>"
	// Signer is the signing key as far as it is known (its fingerprint,
	// and its allowed_signers line when it has one), to say which key.
	Signer sshsig.Signer
	Err    error
}

func (r *Refusal) Error() string {
	s := fmt.Sprintf("commit %s by %s: %v", short(r.Commit), r.Author, r.Err)
	if r.Signer.Fingerprint != "" {
		s += " (key " + r.Signer.Fingerprint + ")"
	}
	return s
}

func (r *Refusal) Unwrap() error { return r.Err }

// Verified is a commit whose signature an allowed signer made.
type Verified struct {
	Commit *object.Commit
	Signer sshsig.Signer
}

// Verify checks c's signature as `git verify-commit` does with
// gpg.format=ssh: the gpgsig header must be an SSHSIG in namespace "git"
// over the commit object without that header, by a key of signers allowed
// at the commit's committer time. That time is what valid-after and
// valid-before are held against, so a retired key's old commits stay valid
// and its new ones do not. It is the committer's own claim, though: a key
// that may have leaked must be removed from the allowed signers, not only
// given a valid-before. The error is a *Refusal.
func Verify(c *object.Commit, signers *sshsig.AllowedSigners) (sshsig.Signer, error) {
	who, r := verify(c, signers)
	if r != nil {
		return who, r
	}
	return who, nil
}

func verify(c *object.Commit, signers *sshsig.AllowedSigners) (sshsig.Signer, *Refusal) {
	refuse := func(who sshsig.Signer, err error) (sshsig.Signer, *Refusal) {
		return who, &Refusal{Commit: c.Hash, Author: author(c), Signer: who, Err: err}
	}
	sig := c.PGPSignature
	if strings.TrimSpace(sig) == "" {
		return refuse(sshsig.Signer{}, ErrUnsigned)
	}
	if !strings.HasPrefix(strings.TrimSpace(sig), sshArmorBegin) {
		return refuse(sshsig.Signer{}, ErrNotSSH)
	}
	msg, err := payload(c)
	if err != nil {
		return refuse(sshsig.Signer{}, fmt.Errorf("reading the signed content: %w", err))
	}
	who, err := signers.Verify([]byte(sig), Namespace, msg, c.Committer.When)
	if err != nil {
		return refuse(who, err)
	}
	return who, nil
}

// payload is what git signs: the commit object without its signature
// headers, byte for byte as stored (go-git strips them from the raw object
// when the commit was read from one).
func payload(c *object.Commit) ([]byte, error) {
	var o plumbing.MemoryObject
	if err := c.EncodeWithoutSignature(&o); err != nil {
		return nil, err
	}
	rd, err := o.Reader()
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	return io.ReadAll(rd)
}

func author(c *object.Commit) string {
	return fmt.Sprintf("%s <%s>", c.Author.Name, c.Author.Email)
}

// VerifyRange verifies commits in order (NewCommits' order) and stops at
// the first it refuses: good is every commit before it, stop the refusal
// (nil when all are good). Nothing of the refused commit or after it is
// good, even a later commit that is signed: it builds on the refused one.
func VerifyRange(commits []*object.Commit, signers *sshsig.AllowedSigners) (good []Verified, stop *Refusal) {
	good = make([]Verified, 0, len(commits))
	for _, c := range commits {
		who, r := verify(c, signers)
		if r != nil {
			return good, r
		}
		good = append(good, Verified{Commit: c, Signer: who})
	}
	return good, nil
}

// VerifyTip is --verify=tip: only tip and start are verified, and tip must
// descend from start (or be it). start is a commit the operator names as
// trusted (the first one mirrored, or one after history nobody signed);
// the commits between are not checked, so they are not to be applied one
// by one: the caller writes the tip alone, vouched for by its signer, whose
// signature covers the history below it through its parents' hashes. Use
// it where not every commit is signed (merges made by a forge, an imported
// history); the default is VerifyRange over every new commit. Errors are a
// *Refusal, or wrap ErrNotFastForward.
func (r *Repo) VerifyTip(tip, start plumbing.Hash, signers *sshsig.AllowedSigners) (Verified, error) {
	if start.IsZero() {
		return Verified{}, errors.New("verify tip: no start commit: name a signed commit to start from")
	}
	sc, err := r.Commit(start)
	if err != nil {
		return Verified{}, fmt.Errorf("verify tip: start: %w", err)
	}
	if _, ref := verify(sc, signers); ref != nil {
		return Verified{}, ref
	}
	tc, err := r.Commit(tip)
	if err != nil {
		return Verified{}, fmt.Errorf("verify tip: %w", err)
	}
	who, ref := verify(tc, signers)
	if ref != nil {
		return Verified{}, ref
	}
	if err := r.FastForward(start, tip); err != nil {
		return Verified{}, err
	}
	return Verified{Commit: tc, Signer: who}, nil
}
