package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/term"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/sshsig"
	"github.com/agentd/agentd/unitdir"
)

// Signed changes: the writer's side (--sign-key on put, rm, revert, edit)
// and the agent's (--allowed-signers). What is signed and checked is
// reconcile's (trust.go); the signature format is sshsig's.

// sshAgentKey is the --sign-key value that signs with a key of the
// running ssh-agent ($SSH_AUTH_SOCK).
const sshAgentKey = "ssh-agent"

// signKey holds --sign-key and --sign-key-id, and the signer they load
// before the command runs.
type signKey struct {
	path, id string
	signer   *changeSigner
	conn     io.Closer // the ssh-agent connection
}

// bindSign adds --sign-key and --sign-key-id to a command that writes unit
// keys; the key is loaded (a passphrase asked, the ssh-agent reached)
// before the command does anything, and writeOptions signs with it.
func bindSign(cmd *cobra.Command) {
	s := &signKey{}
	cmd.Flags().Var((*signKeyFlag)(s), "sign-key", `sign the change (OpenSSH signature, namespace "agentd") with this OpenSSH private key file, or with a key of the running ssh-agent ("ssh-agent": $SSH_AUTH_SOCK); hosts run with --allowed-signers apply only signed changes`)
	cmd.Flags().StringVar(&s.id, "sign-key-id", "", "with --sign-key ssh-agent: the fingerprint (SHA256:…, as ssh-add -l shows it) of the key to sign with (default: the agent's first key)")
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if prev != nil {
			if err := prev(c, args); err != nil {
				return err
			}
		}
		return s.load(c.ErrOrStderr())
	}
	prevPost := cmd.PostRun
	cmd.PostRun = func(c *cobra.Command, args []string) {
		if prevPost != nil {
			prevPost(c, args)
		}
		if s.conn != nil {
			s.conn.Close()
		}
	}
}

// signKeyFlag is --sign-key's pflag.Value: writeOptions finds the loaded
// signer through it.
type signKeyFlag signKey

func (f *signKeyFlag) String() string     { return f.path }
func (f *signKeyFlag) Set(v string) error { f.path = v; return nil }
func (f *signKeyFlag) Type() string       { return "FILE|ssh-agent" }

// signOption is the registry option that signs with the command's
// --sign-key, if it has one and it was given.
func signOption(cmd *cobra.Command) (registry.WriteOption, bool) {
	f := cmd.Flags().Lookup("sign-key")
	if f == nil {
		return nil, false
	}
	s, ok := f.Value.(*signKeyFlag)
	if !ok || s.signer == nil {
		return nil, false
	}
	return registry.SignWith(s.signer), true
}

func (s *signKey) load(prompt io.Writer) error {
	switch {
	case s.path == "" && s.id != "":
		return withCode(exitUsage, errors.New("--sign-key-id needs --sign-key ssh-agent"))
	case s.path == "":
		return nil
	case s.path == sshAgentKey:
		return s.loadAgent()
	}
	b, err := os.ReadFile(s.path)
	if err != nil {
		return withCode(exitUsage, fmt.Errorf("--sign-key: %w", err))
	}
	signer, err := ssh.ParsePrivateKey(b)
	var missing *ssh.PassphraseMissingError
	if errors.As(err, &missing) {
		if !term.IsTerminal(int(os.Stdin.Fd())) {
			return withCode(exitUsage, fmt.Errorf("--sign-key %s is protected by a passphrase and there is no terminal to ask it on: add it to ssh-agent (ssh-add %s) and use --sign-key ssh-agent", s.path, s.path))
		}
		fmt.Fprintf(prompt, "Enter passphrase for %s: ", s.path)
		pass, rerr := term.ReadPassword(int(os.Stdin.Fd()))
		fmt.Fprintln(prompt)
		if rerr != nil {
			return fmt.Errorf("--sign-key %s: read the passphrase: %w", s.path, rerr)
		}
		signer, err = ssh.ParsePrivateKeyWithPassphrase(b, pass)
	}
	if err != nil {
		return withCode(exitUsage, fmt.Errorf("--sign-key %s: not a usable OpenSSH private key: %w", s.path, err))
	}
	if s.id != "" && !sameFingerprint(ssh.FingerprintSHA256(signer.PublicKey()), s.id) {
		return withCode(exitUsage, fmt.Errorf("--sign-key-id %s: %s is key %s", s.id, s.path, ssh.FingerprintSHA256(signer.PublicKey())))
	}
	s.signer = &changeSigner{s: signer}
	return nil
}

// loadAgent picks the key of the running ssh-agent to sign with.
func (s *signKey) loadAgent() error {
	sock := os.Getenv("SSH_AUTH_SOCK")
	if sock == "" {
		return withCode(exitUsage, errors.New("--sign-key ssh-agent: SSH_AUTH_SOCK is not set (start ssh-agent and ssh-add your key, or give a key file)"))
	}
	conn, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return fmt.Errorf("--sign-key ssh-agent: %w", err)
	}
	signers, err := agent.NewClient(conn).Signers()
	if err != nil {
		conn.Close()
		return fmt.Errorf("--sign-key ssh-agent: list its keys: %w", err)
	}
	var have []string
	for _, sg := range signers {
		if _, cert := sg.PublicKey().(*ssh.Certificate); cert {
			continue // allowed_signers lists keys: a certificate's signature would name the certificate
		}
		fp := ssh.FingerprintSHA256(sg.PublicKey())
		if s.id == "" || sameFingerprint(fp, s.id) {
			s.signer, s.conn = &changeSigner{s: sg}, conn
			return nil
		}
		have = append(have, fp)
	}
	conn.Close()
	if len(have) == 0 {
		return withCode(exitUsage, errors.New("--sign-key ssh-agent: the agent holds no key (ssh-add one)"))
	}
	return withCode(exitUsage, fmt.Errorf("--sign-key-id %s: the ssh-agent holds no such key (it holds %s)", s.id, strings.Join(have, ", ")))
}

// sameFingerprint compares fingerprints, with or without "SHA256:".
func sameFingerprint(a, b string) bool {
	return strings.TrimPrefix(a, "SHA256:") == strings.TrimPrefix(b, "SHA256:")
}

// changeSigner signs registry writes (registry.ChangeSigner).
type changeSigner struct{ s ssh.Signer }

func (c *changeSigner) SignChange(msg []byte) ([]byte, error) {
	return sshsig.Sign(c.s, reconcile.SignatureNamespace, msg)
}

func (c *changeSigner) Fingerprint() string { return ssh.FingerprintSHA256(c.s.PublicKey()) }

// allowedSigners checks the registry's signatures for the agent
// (reconcile.Verifier) against --allowed-signers.
type allowedSigners struct{ as *sshsig.AllowedSigners }

func (a allowedSigners) VerifyChange(msg, armored []byte) (reconcile.Signer, error) {
	who, err := a.as.Verify(armored, reconcile.SignatureNamespace, msg, time.Now())
	s := reconcile.Signer{Fingerprint: who.Fingerprint, Principals: who.Principals}
	if errors.Is(err, sshsig.ErrInvalid) {
		err = fmt.Errorf("%w: %w", reconcile.ErrSignatureMismatch, err)
	}
	return s, err
}

// loadAllowedSigners reads --allowed-signers: nil without it. A missing,
// unreadable or malformed file is an error (the agent does not start),
// naming the line.
func (o *runOptions) loadAllowedSigners() (*sshsig.AllowedSigners, error) {
	if o.allowedSigners == "" {
		return nil, nil
	}
	as, err := sshsig.LoadAllowedSigners(o.allowedSigners)
	if err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("--allowed-signers: %w; the agent does not start", err))
	}
	return as, nil
}

// openTrust opens the signed versions the agent accepted before (the
// state directory) and returns the agent's signature check.
func (r *agentRun) openTrust() error {
	if r.allowed == nil {
		return nil
	}
	store, marks, err := unitdir.OpenSignedMarks(r.o.stateDir)
	if err != nil {
		return err
	}
	r.marks = store
	var who []string
	for _, e := range r.allowed.Entries {
		who = append(who, e.Principals+" "+ssh.FingerprintSHA256(e.Key))
	}
	r.log.Info("signed changes only: a change of a unit key is applied when an allowed signer signed it", "allowed_signers", r.o.allowedSigners,
		"signers", strings.Join(who, "; "), "keys_accepted_before", len(marks))
	layout := registry.New(nil, r.o.etcd.prefix) // key layout only
	r.trust = &reconcile.Trust{
		Verifier:    allowedSigners{r.allowed},
		Targets:     layout.SignedTargets(r.o.host, r.o.groups),
		GroupTarget: layout.GroupSignedTarget, // the selector groups it joins
		Marks:       marks,
		SaveMarks:   store.Save,
	}
	return nil
}
