package main

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/transport"
	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/spf13/pflag"

	"github.com/agentd/agentd/mirror"
)

// How `agentd mirror` authenticates to the remote: an ssh key with host
// key checking (always on), or an https token read from a file. The flags
// are checked with the others (mirrorOptions.check), before anything
// reaches the network; what they make is a mirror.WithAuth option.
//
// Secrets never come from argv (ps shows it to every user) and never reach
// a log line or an error: an error names the file, not what it holds, and
// go-git's auth methods print a masked password.

// defaultHTTPSUser is --https-user's default: GitHub, GitLab, Gitea and
// Bitbucket take a token as the password of any user name.
const defaultHTTPSUser = "git"

// mirrorAuthFlags are the auth flags of `agentd mirror`.
type mirrorAuthFlags struct {
	sshKey         string // --ssh-key: a private key file (unencrypted: a deploy key)
	sshKnownHosts  string // --ssh-known-hosts: the known_hosts file to check the server against
	httpsTokenFile string // --https-token-file: a file holding the token
	httpsUser      string // --https-user: the basic auth user name with the token
}

func (a *mirrorAuthFlags) bind(fs *pflag.FlagSet) {
	fs.StringVar(&a.sshKey, "ssh-key", "", "private key file for an ssh:// or git@host:path --repo (default: the ssh-agent at $SSH_AUTH_SOCK)")
	fs.StringVar(&a.sshKnownHosts, "ssh-known-hosts", "", "known_hosts file the ssh server's host key is checked against (default ~/.ssh/known_hosts; never skipped)")
	fs.StringVar(&a.httpsTokenFile, "https-token-file", "", "file holding a token for an https:// --repo, sent as the basic auth password (never give it on the command line)")
	fs.StringVar(&a.httpsUser, "https-user", defaultHTTPSUser, "basic auth user name sent with --https-token-file's token")
}

// remoteKind is how a --repo URL is reached: "ssh" (ssh:// and scp-like
// git@host:path), "https", "http", "file", "git".
func remoteKind(url string) (kind string, ep *transport.Endpoint, err error) {
	ep, err = transport.NewEndpoint(url)
	if err != nil {
		return "", nil, err
	}
	return ep.Protocol, ep, nil
}

// options is what the auth flags make for mirror.Open: WithAuth(method),
// or nothing for a URL that needs no auth method of ours.
func (a *mirrorAuthFlags) options(url, home string) ([]mirror.Option, error) {
	m, err := a.method(url, home)
	if err != nil || m == nil {
		return nil, err
	}
	return []mirror.Option{mirror.WithAuth(m)}, nil
}

// method checks the auth flags against the --repo URL and makes the auth
// method that reaches it (nil for none). home is where ~/.ssh/known_hosts
// is looked for. Every error is a usage error (exit 2) and names a flag or
// a file, never a secret.
func (a *mirrorAuthFlags) method(url, home string) (transport.AuthMethod, error) {
	usage := func(format string, args ...any) (transport.AuthMethod, error) {
		return nil, withCode(exitUsage, fmt.Errorf("mirror: "+format, args...))
	}
	kind, ep, err := remoteKind(url)
	if err != nil {
		return usage("--repo %q: %v", url, err)
	}
	if ep.Password != "" {
		return usage("--repo: the URL holds a password, which ps, the logs and the registry would show: give the token in --https-token-file")
	}
	user := cmp.Or(a.httpsUser, defaultHTTPSUser)
	sshFlags := a.sshKey != "" || a.sshKnownHosts != ""
	httpsFlags := a.httpsTokenFile != "" || user != defaultHTTPSUser
	switch {
	case sshFlags && httpsFlags:
		return usage("--ssh-key/--ssh-known-hosts and --https-token-file/--https-user do not go together: one --repo is reached one way")
	case sshFlags && kind != "ssh":
		return usage("--ssh-key and --ssh-known-hosts are for an ssh --repo (ssh://… or git@host:path), not %s://", kind)
	case httpsFlags && kind == "http":
		return usage("--https-token-file: --repo is plain http://, which would send the token in the clear: use https://")
	case httpsFlags && kind != "https":
		return usage("--https-token-file and --https-user are for an https:// --repo, not %s://", kind)
	case a.httpsTokenFile == "" && user != defaultHTTPSUser:
		return usage("--https-user goes with --https-token-file (the user name is sent with the token)")
	}
	switch kind {
	case "ssh":
		m, err := a.sshAuth(ep, home)
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("mirror: %w", err))
		}
		return m, nil
	case "https":
		if a.httpsTokenFile == "" {
			return nil, nil // a public repository, or a URL the remote lets in
		}
		token, err := readTokenFile(a.httpsTokenFile)
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("mirror: %w", err))
		}
		return &githttp.BasicAuth{Username: user, Password: token}, nil
	}
	return nil, nil
}

// sshAuth is the ssh auth method for ep: --ssh-key's key or the
// ssh-agent's keys, as ep's user (default git), with the server's host
// key checked against --ssh-known-hosts or ~/.ssh/known_hosts. Without a
// known_hosts file it refuses: an unchecked host key lets whoever sits on
// the path serve any tree (the signatures still hold, but a stale or
// withheld branch would not be noticed).
func (a *mirrorAuthFlags) sshAuth(ep *transport.Endpoint, home string) (transport.AuthMethod, error) {
	known := a.sshKnownHosts
	if known == "" {
		def := filepath.Join(home, ".ssh", "known_hosts")
		if home == "" {
			return nil, errors.New("an ssh --repo needs --ssh-known-hosts FILE: there is no home directory to find ~/.ssh/known_hosts in (host keys are always checked)")
		}
		if _, err := os.Stat(def); err != nil {
			return nil, fmt.Errorf("an ssh --repo needs --ssh-known-hosts FILE, or %s: host keys are always checked (ssh-keyscan HOST >> FILE, then compare the fingerprints with the forge's)", def)
		}
		known = def
	}
	if err := readableFile(known); err != nil {
		return nil, fmt.Errorf("--ssh-known-hosts: %w", err)
	}
	cb, err := gitssh.NewKnownHostsCallback(known)
	if err != nil {
		return nil, fmt.Errorf("--ssh-known-hosts %s: %w", known, err)
	}
	user := ep.User
	if user == "" {
		user = "git"
	}
	if a.sshKey == "" {
		if os.Getenv("SSH_AUTH_SOCK") == "" {
			return nil, errors.New("an ssh --repo needs --ssh-key FILE (a deploy key), or an ssh-agent at $SSH_AUTH_SOCK")
		}
		m, err := gitssh.NewSSHAgentAuth(user)
		if err != nil {
			return nil, fmt.Errorf("the ssh-agent at $SSH_AUTH_SOCK: %w (or give --ssh-key FILE)", err)
		}
		m.HostKeyCallback = cb
		return m, nil
	}
	if err := readableFile(a.sshKey); err != nil {
		return nil, fmt.Errorf("--ssh-key: %w", err)
	}
	m, err := gitssh.NewPublicKeysFromFile(user, a.sshKey, "")
	if err != nil {
		// The error of a bad key file names no key material.
		return nil, fmt.Errorf("--ssh-key %s: not an unencrypted private key (%v): a deploy key without a passphrase, readable by the mirror only", a.sshKey, err)
	}
	m.HostKeyCallback = cb
	return m, nil
}

// readTokenFile reads --https-token-file: the token, one line (the
// trailing newline is not part of it). An empty file is refused; no error
// holds the file's content.
func readTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--https-token-file: %w", err)
	}
	tok := strings.TrimRight(string(b), "\r\n")
	switch {
	case strings.TrimSpace(tok) == "":
		return "", fmt.Errorf("--https-token-file %s: empty", path)
	case strings.ContainsAny(tok, "\r\n"):
		return "", fmt.Errorf("--https-token-file %s: more than one line (want the token alone)", path)
	}
	return tok, nil
}

// readableFile says why path is not a regular file the mirror can read.
func readableFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file", path)
	}
	return nil
}
