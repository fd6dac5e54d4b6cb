package mirror

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentd/agentd/internal/citest"
	"github.com/agentd/agentd/sshsig"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// work is a real git repository made with the git binary, its commits
// signed by ssh-keygen through git's gpg.format=ssh: what an operator's
// checkout makes, which the mirror reads over file://.
type work struct {
	t    *testing.T
	dir  string // the test's scratch directory
	path string // the work tree
	env  []string
}

func newWork(t *testing.T) *work {
	t.Helper()
	for _, tool := range []string{"git", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			citest.Unavailable(t, "%s not installed (Debian: git, openssh-client)", tool)
		}
	}
	dir := t.TempDir()
	w := &work{t: t, dir: dir, path: filepath.Join(dir, "work")}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "GIT_") && !strings.HasPrefix(e, "HOME=") && !strings.HasPrefix(e, "SSH_AUTH_SOCK=") {
			w.env = append(w.env, e)
		}
	}
	w.env = append(w.env, "HOME="+dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=Alice", "GIT_AUTHOR_EMAIL=alice@example.com",
		"GIT_COMMITTER_NAME=Alice", "GIT_COMMITTER_EMAIL=alice@example.com")
	w.run(dir, nil, "git", "init", "-q", "-b", "main", w.path)
	return w
}

func (w *work) run(dir string, env []string, name string, args ...string) string {
	w.t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(append([]string{}, w.env...), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		w.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func (w *work) git(env []string, args ...string) string {
	w.t.Helper()
	return w.run(w.path, env, "git", args...)
}

// key makes an ed25519 key pair; it returns the private key's path and
// the public key's line ("ssh-ed25519 AAAA… comment").
func (w *work) key(name string) (priv, pub string) {
	w.t.Helper()
	priv = filepath.Join(w.dir, name)
	w.run(w.dir, nil, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", priv)
	b, err := os.ReadFile(priv + ".pub")
	if err != nil {
		w.t.Fatal(err)
	}
	return priv, strings.TrimSpace(string(b))
}

// write puts content at path in the work tree (mode 0755 when exec).
func (w *work) write(path, content string, exec bool) {
	w.t.Helper()
	p := filepath.Join(w.path, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		w.t.Fatal(err)
	}
	mode := os.FileMode(0o644)
	if exec {
		mode = 0o755
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		w.t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		w.t.Fatal(err)
	}
}

// commit commits everything, signed with the private key at key (""
// unsigned), and returns the commit's hash. env adds to git's environment
// (GIT_COMMITTER_DATE).
func (w *work) commit(key, msg string, env ...string) plumbing.Hash {
	w.t.Helper()
	w.git(nil, "add", "-A")
	args := []string{"-c", "gpg.format=ssh"}
	if key != "" {
		args = append(args, "-c", "user.signingkey="+key, "commit", "-q", "-S")
	} else {
		args = append(args, "commit", "-q", "--no-gpg-sign")
	}
	w.git(env, append(args, "--allow-empty", "-m", msg)...)
	return plumbing.NewHash(w.git(nil, "rev-parse", "HEAD"))
}

// mirror opens a clone of the work repository over file:// and fetches.
func (w *work) mirror() (*Repo, plumbing.Hash) {
	w.t.Helper()
	ctx := context.Background()
	r, err := Open(ctx, "file://"+w.path, "main", filepath.Join(w.dir, "clone"))
	if err != nil {
		w.t.Fatal(err)
	}
	tip, err := r.Fetch(ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	return r, tip
}

// head is the work repository's HEAD commit, read with go-git.
func (w *work) head() *object.Commit {
	w.t.Helper()
	gr, err := git.PlainOpen(w.path)
	if err != nil {
		w.t.Fatal(err)
	}
	ref, err := gr.Head()
	if err != nil {
		w.t.Fatal(err)
	}
	c, err := gr.CommitObject(ref.Hash())
	if err != nil {
		w.t.Fatal(err)
	}
	return c
}

func signers(t testing.TB, lines ...string) *sshsig.AllowedSigners {
	t.Helper()
	as, err := sshsig.ParseAllowedSigners("allowed_signers", strings.NewReader(strings.Join(lines, "\n")+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	return as
}

func hashes(cs []*object.Commit) []plumbing.Hash {
	var hs []plumbing.Hash
	for _, c := range cs {
		hs = append(hs, c.Hash)
	}
	return hs
}

func verifiedHashes(vs []Verified) []plumbing.Hash {
	var hs []plumbing.Hash
	for _, v := range vs {
		hs = append(hs, v.Commit.Hash)
	}
	return hs
}
