package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"golang.org/x/crypto/ssh"

	"github.com/agentd/agentd/calendar"
	"github.com/agentd/agentd/internal/citest"
	"github.com/agentd/agentd/mirror"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/rollout"
	"github.com/agentd/agentd/sshsig"
)

// gitRepo is a real git repository made with the git binary, its commits
// signed through git's gpg.format=ssh with keys made by ssh-keygen: what an
// operator's checkout makes. The mirror reads it over file://.
type gitRepo struct {
	t    testing.TB
	dir  string // scratch: keys, the allowed signers
	path string // the work tree
	env  []string
}

func newGitRepo(t testing.TB) *gitRepo {
	t.Helper()
	for _, tool := range []string{"git", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			citest.Unavailable(t, "%s not installed (Debian: git, openssh-client)", tool)
		}
	}
	dir := t.TempDir()
	g := &gitRepo{t: t, dir: dir, path: filepath.Join(dir, "work")}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "GIT_") && !strings.HasPrefix(e, "HOME=") && !strings.HasPrefix(e, "SSH_AUTH_SOCK=") {
			g.env = append(g.env, e)
		}
	}
	g.env = append(g.env, "HOME="+dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=Alice", "GIT_AUTHOR_EMAIL=alice@example.com",
		"GIT_COMMITTER_NAME=Alice", "GIT_COMMITTER_EMAIL=alice@example.com")
	g.run(dir, "git", "init", "-q", "-b", "main", g.path)
	return g
}

func (g *gitRepo) url() string { return "file://" + g.path }

func (g *gitRepo) run(dir, name string, args ...string) string {
	g.t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = g.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		g.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func (g *gitRepo) git(args ...string) string {
	g.t.Helper()
	return g.run(g.path, "git", args...)
}

// key makes an ed25519 key pair with ssh-keygen and returns the private
// key's path and its allowed_signers line for principal.
// mirrorScene is what the mirror's end-to-end tests begin with: an etcd
// (its endpoint and a client), and a git repository with alice's signing
// key (the private key's file and its allowed_signers line).
func mirrorScene(t *testing.T) (endpoint string, reg *registry.Client, g *gitRepo, key, line string) {
	t.Helper()
	endpoint = registrytest.StartEtcd(t).Endpoint()
	reg = registrytest.NewClient(t, endpoint)
	g = newGitRepo(t)
	key, line = g.key("alice@example.com")
	return endpoint, reg, g, key, line
}

func (g *gitRepo) key(principal string) (priv, line string) {
	g.t.Helper()
	priv = filepath.Join(g.dir, principal)
	g.run(g.dir, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", principal, "-f", priv)
	b, err := os.ReadFile(priv + ".pub")
	if err != nil {
		g.t.Fatal(err)
	}
	return priv, principal + ` namespaces="git" ` + strings.TrimSpace(string(b))
}

// signers writes an allowed_signers file of lines and returns its path.
func (g *gitRepo) signers(lines ...string) string {
	g.t.Helper()
	p := filepath.Join(g.dir, "allowed_signers")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		g.t.Fatal(err)
	}
	return p
}

func (g *gitRepo) write(path, content string) {
	g.t.Helper()
	p := filepath.Join(g.path, path)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		g.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		g.t.Fatal(err)
	}
}

func (g *gitRepo) rm(path string) {
	g.t.Helper()
	if err := os.RemoveAll(filepath.Join(g.path, path)); err != nil {
		g.t.Fatal(err)
	}
}

// commit commits everything, signed with the private key at key (""
// unsigned), and returns the commit's SHA.
func (g *gitRepo) commit(key, msg string) string {
	g.t.Helper()
	g.git("add", "-A")
	args := []string{"-c", "gpg.format=ssh"}
	if key != "" {
		args = append(args, "-c", "user.signingkey="+key, "commit", "-q", "-S")
	} else {
		args = append(args, "commit", "-q", "--no-gpg-sign")
	}
	g.git(append(args, "--allow-empty", "-m", msg)...)
	return g.git("rev-parse", "HEAD")
}

// fakeMirrorStore is the registry's side of one mirror as the loop sees
// it, with the contract the registry keeps: ApplyCommit applies only on
// top of the state's commit (else ErrMirrorMoved). It records each write.
type fakeMirrorStore struct {
	state   registry.MirrorState
	tree    map[registry.Target]map[string][]byte
	applied []registry.MirrorCommit
	refused []registry.MirrorRefusal
	rev     int64
	failGet error // MirrorState and MirrorTree fail with it
}

func (f *fakeMirrorStore) MirrorState(_ context.Context, name string) (registry.MirrorState, bool, error) {
	if f.failGet != nil {
		return registry.MirrorState{}, false, f.failGet
	}
	return f.state, f.state.Name != "", nil
}

func (f *fakeMirrorStore) MirrorTree(context.Context, string) (map[registry.Target]map[string][]byte, error) {
	if f.failGet != nil {
		return nil, f.failGet
	}
	out := map[registry.Target]map[string][]byte{}
	for t, ks := range f.tree {
		out[t] = map[string][]byte{}
		for k, v := range ks {
			out[t][k] = v
		}
	}
	return out, nil
}

func (f *fakeMirrorStore) ApplyCommit(_ context.Context, mc registry.MirrorCommit) (int64, error) {
	if mc.Parent != f.state.Commit {
		return 0, fmt.Errorf("parent %s, state %s: %w", mc.Parent, f.state.Commit, registry.ErrMirrorMoved)
	}
	if f.tree == nil {
		f.tree = map[registry.Target]map[string][]byte{}
	}
	for t, ks := range mc.Puts {
		if f.tree[t] == nil {
			f.tree[t] = map[string][]byte{}
		}
		for k, v := range ks {
			f.tree[t][k] = v
		}
	}
	for t, ks := range mc.Deletes {
		for _, k := range ks {
			delete(f.tree[t], k)
		}
		if len(f.tree[t]) == 0 {
			delete(f.tree, t)
		}
	}
	f.rev++
	f.applied = append(f.applied, mc)
	f.state = registry.MirrorState{Name: mc.Name, URL: mc.URL, Branch: mc.Branch, Commit: mc.Commit, Signer: mc.Signer,
		Author: mc.Author, Subject: mc.Subject, Revision: f.rev}
	return f.rev, nil
}

func (f *fakeMirrorStore) KnownHosts(context.Context) ([]registry.KnownHost, error) { return nil, nil }

func (f *fakeMirrorStore) Window(context.Context, string) (calendar.Window, bool, error) {
	return calendar.Window{}, false, nil
}

func (f *fakeMirrorStore) List(context.Context, *registry.Target) ([]registry.Listed, error) {
	return nil, nil
}

func (f *fakeMirrorStore) Rollout(_ context.Context, id string, _ bool) (rollout.View, error) {
	return rollout.View{}, fmt.Errorf("%w: %s", registry.ErrNoRollout, id)
}

func (f *fakeMirrorStore) RefuseCommit(_ context.Context, name string, r registry.MirrorRefusal) error {
	f.refused = append(f.refused, r)
	f.state.Refused = &r
	if f.state.Name == "" {
		f.state.Name = name
	}
	return nil
}

func (f *fakeMirrorStore) commits() []string {
	var out []string
	for _, mc := range f.applied {
		out = append(out, mc.Commit)
	}
	return out
}

// newTestLoop is a mirror loop of g's main branch over store, its clone
// in a temporary directory.
func newTestLoop(t *testing.T, g *gitRepo, store mirrorStore, signers string) *mirrorLoop {
	t.Helper()
	as, err := sshsig.LoadAllowedSigners(signers)
	if err != nil {
		t.Fatal(err)
	}
	return &mirrorLoop{
		cfg: mirrorConfig{name: "default", url: g.url(), branch: "main", dir: filepath.Join(t.TempDir(), "default"),
			threshold: mirror.DefaultDeleteThreshold, signers: as},
		store: store, log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
		met: newMirrorMetrics("default"), now: time.Now,
	}
}

const mirrorHello = "[Unit]\nDescription=hello\n[Service]\nExecStart=/bin/sleep 1000\n"

var h1 = registry.Target{Host: "h1"}

// The loop against a fake registry: what it writes, per commit, and what
// it refuses. The same scenarios run end to end against etcd in
// mirror_e2e_test.go.
func TestMirrorLoopSignedUnsignedSigned(t *testing.T) {
	g := newGitRepo(t)
	key, line := g.key("alice@example.com")
	g.write("hosts/h1/hello.service", mirrorHello)
	g.write("README.md", "not the registry's\n")
	c1 := g.commit(key, "hello")
	store := &fakeMirrorStore{}
	m := newTestLoop(t, g, store, g.signers(line))
	ctx := context.Background()
	if err := m.syncOnce(ctx, nil, false); err != nil {
		t.Fatal(err)
	}
	if got := store.commits(); !slices.Equal(got, []string{c1}) {
		t.Fatalf("applied %v, want %s", got, c1)
	}
	mc := store.applied[0]
	if mc.Parent != "" || string(mc.Puts[h1]["hello.service"]) != mirrorHello || len(mc.Puts) != 1 ||
		!slices.Equal(mc.Owned, []registry.Target{h1}) || mc.Subject != "hello" ||
		mc.Author != "Alice <alice@example.com>" || !strings.HasPrefix(mc.Signer, "alice@example.com SHA256:") {
		t.Fatalf("first commit written as %+v", mc)
	}
	// Nothing new: no write.
	if err := m.syncOnce(ctx, nil, false); err != nil || len(store.applied) != 1 || len(store.refused) != 0 {
		t.Fatalf("a round with nothing new: %v, %d writes, %d refusals", err, len(store.applied), len(store.refused))
	}

	g.write("hosts/h1/a.service", mirrorHello)
	c2 := g.commit(key, "two")
	g.write("hosts/h1/b.service", mirrorHello)
	c3 := g.commit("", "three, unsigned")
	g.write("hosts/h1/c.service", mirrorHello)
	g.commit(key, "four, signed but after the unsigned one")
	if err := m.syncOnce(ctx, nil, false); err != nil {
		t.Fatal(err)
	}
	if got := store.commits(); !slices.Equal(got, []string{c1, c2}) {
		t.Fatalf("applied %v, want %s then %s and nothing after", got, c1, c2)
	}
	if store.applied[1].Parent != c1 || len(store.applied[1].Puts[h1]) != 1 || store.applied[1].Puts[h1]["a.service"] == nil {
		t.Fatalf("second commit written as %+v: want a.service alone on top of %s", store.applied[1], c1)
	}
	if len(store.refused) != 1 || store.refused[0].Commit != c3 || store.refused[0].Author != "Alice <alice@example.com>" ||
		!strings.Contains(store.refused[0].Reason, "not signed") {
		t.Fatalf("refusals %+v, want %s unsigned", store.refused, c3)
	}
	// The next round refuses it again, but does not write the same refusal twice.
	if err := m.syncOnce(ctx, nil, false); err != nil || len(store.refused) != 1 || len(store.applied) != 2 {
		t.Fatalf("next round: %v, %d refusals, %d writes", err, len(store.refused), len(store.applied))
	}
}

func TestMirrorLoopMassDeleteHeld(t *testing.T) {
	g := newGitRepo(t)
	key, line := g.key("alice@example.com")
	for i := range 10 {
		g.write(fmt.Sprintf("hosts/h1/u%d.service", i), mirrorHello)
	}
	g.commit(key, "ten units")
	store := &fakeMirrorStore{}
	m := newTestLoop(t, g, store, g.signers(line))
	ctx := context.Background()
	if err := m.syncOnce(ctx, nil, false); err != nil || len(store.applied) != 1 {
		t.Fatalf("first round: %v, %d writes", err, len(store.applied))
	}
	for i := range 9 {
		g.rm(fmt.Sprintf("hosts/h1/u%d.service", i))
	}
	c2 := g.commit(key, "delete 90%")
	if err := m.syncOnce(ctx, nil, false); err != nil {
		t.Fatal(err)
	}
	if len(store.applied) != 1 || len(store.refused) != 1 || store.refused[0].Commit != c2 ||
		!strings.Contains(store.refused[0].Reason, "mass delete") || !strings.Contains(store.refused[0].Reason, "--allow-mass-delete") {
		t.Fatalf("a 90%% delete: writes %v, refusals %+v: want it held", store.commits(), store.refused)
	}
	if err := m.syncOnce(ctx, nil, true); err != nil {
		t.Fatal(err)
	}
	if got := store.commits(); len(got) != 2 || got[1] != c2 || len(store.tree[h1]) != 1 {
		t.Fatalf("with --allow-mass-delete: writes %v, tree %v", got, store.tree)
	}
	// Emptying the tree is refused even when mass deletes are allowed.
	g.rm("hosts")
	c3 := g.commit(key, "delete everything")
	if err := m.syncOnce(ctx, nil, true); err != nil {
		t.Fatal(err)
	}
	if len(store.applied) != 2 || store.refused[len(store.refused)-1].Commit != c3 {
		t.Fatalf("an empty tree: writes %v, refusals %+v", store.commits(), store.refused)
	}
}

func TestMirrorLoopForcePushRefused(t *testing.T) {
	g := newGitRepo(t)
	key, line := g.key("alice@example.com")
	for i := range 5 { // the rewrite deletes 1 of 6 keys: under the threshold
		g.write(fmt.Sprintf("hosts/h1/u%d.service", i), mirrorHello)
	}
	c1 := g.commit(key, "one")
	g.write("hosts/h1/a.service", mirrorHello)
	c2 := g.commit(key, "two")
	store := &fakeMirrorStore{}
	m := newTestLoop(t, g, store, g.signers(line))
	ctx := context.Background()
	if err := m.syncOnce(ctx, nil, false); err != nil || !slices.Equal(store.commits(), []string{c1, c2}) {
		t.Fatalf("first round: %v, %v", err, store.commits())
	}
	g.git("reset", "-q", "--hard", c1)
	g.write("hosts/h1/b.service", mirrorHello)
	c3 := g.commit(key, "three, rewritten")
	if err := m.syncOnce(ctx, nil, false); err != nil {
		t.Fatal(err)
	}
	if len(store.applied) != 2 || len(store.refused) != 1 || store.refused[0].Commit != c3 ||
		!strings.Contains(store.refused[0].Reason, "not a fast-forward") || !strings.Contains(store.refused[0].Reason, "mirror reset") {
		t.Fatalf("after a force push: writes %v, refusals %+v", store.commits(), store.refused)
	}
	// What `mirror reset --to c1` does to the state: the loop goes on from c1,
	// diffing against the keys mirrored (c2's).
	store.state.Commit, store.state.Refused = c1, nil
	if err := m.syncOnce(ctx, nil, false); err != nil {
		t.Fatal(err)
	}
	last := store.applied[len(store.applied)-1]
	if last.Commit != c3 || last.Parent != c1 || !slices.Equal(last.Deletes[h1], []string{"a.service"}) || last.Puts[h1]["b.service"] == nil {
		t.Fatalf("after the reset: %+v", last)
	}
}

// A fetch that fails, a registry that does not answer, a tree that does
// not render: nothing is written (never "delete everything").
func TestMirrorLoopNoChangeOnErrors(t *testing.T) {
	g := newGitRepo(t)
	key, line := g.key("alice@example.com")
	g.write("hosts/h1/hello.service", mirrorHello)
	g.commit(key, "one")
	store := &fakeMirrorStore{}
	m := newTestLoop(t, g, store, g.signers(line))
	ctx := context.Background()
	if err := m.syncOnce(ctx, nil, false); err != nil {
		t.Fatal(err)
	}
	store.failGet = errors.New("etcd down")
	g.write("hosts/h1/a.service", mirrorHello)
	g.commit(key, "two")
	if err := m.syncOnce(ctx, nil, false); err == nil || len(store.applied) != 1 {
		t.Fatalf("registry down: %v, %d writes", err, len(store.applied))
	}
	store.failGet = nil
	m.cfg.url = "file://" + filepath.Join(g.dir, "missing")
	m.repo = nil
	m.cfg.dir = filepath.Join(t.TempDir(), "other")
	if err := m.syncOnce(ctx, nil, false); err == nil || len(store.applied) != 1 {
		t.Fatalf("fetch failed: %v, %d writes", err, len(store.applied))
	}
	st, ok, err := readFetchStatus(m.cfg.fetchFile())
	if err != nil || !ok || st.OK || st.Error == "" {
		t.Fatalf("fetch status %+v, %v, %v: want the failure recorded", st, ok, err)
	}
}

func TestMirrorLoopRenderRefused(t *testing.T) {
	g := newGitRepo(t)
	key, line := g.key("alice@example.com")
	g.write("hosts/h1/hello.service", mirrorHello)
	c1 := g.commit(key, "one")
	g.write("hosts/h1/bad name!.service", mirrorHello)
	c2 := g.commit(key, "a bad unit name")
	store := &fakeMirrorStore{}
	m := newTestLoop(t, g, store, g.signers(line))
	if err := m.syncOnce(context.Background(), nil, false); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(store.commits(), []string{c1}) || len(store.refused) != 1 || store.refused[0].Commit != c2 ||
		!strings.Contains(store.refused[0].Reason, "bad name!.service") {
		t.Fatalf("writes %v, refusals %+v", store.commits(), store.refused)
	}
}

func TestMirrorWebhook(t *testing.T) {
	secret := []byte("s3cret")
	sign := func(body []byte) string {
		mac := hmac.New(sha256.New, secret)
		mac.Write(body)
		return "sha256=" + hex.EncodeToString(mac.Sum(nil))
	}
	body := []byte(`{"ref":"refs/heads/main"}`)
	huge := bytes.Repeat([]byte("x"), maxWebhookBody+1)
	for _, tc := range []struct {
		name    string
		method  string
		body    []byte
		chunked bool // no Content-Length: the limit is met while reading
		headers map[string]string
		code    int
		poked   bool
	}{
		{name: "github signed", body: body, headers: map[string]string{"X-Hub-Signature-256": sign(body), "X-GitHub-Event": "push"}, code: 202, poked: true},
		{name: "github wrong hmac", body: body, headers: map[string]string{"X-Hub-Signature-256": sign([]byte("other"))}, code: 401},
		{name: "github hmac of another secret", body: body, headers: map[string]string{"X-Hub-Signature-256": "sha256=" + strings.Repeat("00", 32)}, code: 401},
		{name: "github malformed", body: body, headers: map[string]string{"X-Hub-Signature-256": "sha1=abc"}, code: 401},
		{name: "github ping", body: body, headers: map[string]string{"X-Hub-Signature-256": sign(body), "X-GitHub-Event": "ping"}, code: 200},
		{name: "gitlab token", body: body, headers: map[string]string{"X-Gitlab-Token": "s3cret", "X-Gitlab-Event": "Push Hook"}, code: 202, poked: true},
		{name: "gitlab wrong token", body: body, headers: map[string]string{"X-Gitlab-Token": "s3cre"}, code: 401},
		{name: "no signature", body: body, code: 401},
		{name: "huge body", body: huge, headers: map[string]string{"X-Hub-Signature-256": sign(huge)}, code: 413},
		{name: "huge body chunked", body: huge, chunked: true, headers: map[string]string{"X-Hub-Signature-256": sign(huge)}, code: 413},
		{name: "1 MiB exactly", body: huge[:maxWebhookBody], headers: map[string]string{"X-Hub-Signature-256": sign(huge[:maxWebhookBody])}, code: 202, poked: true},
		{name: "get", method: "GET", code: 405},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pokes atomic.Int32
			h := webhookHandler(secret, func() { pokes.Add(1) }, slog.New(slog.NewTextHandler(t.Output(), nil)))
			method := tc.method
			if method == "" {
				method = "POST"
			}
			var rd io.Reader = bytes.NewReader(tc.body)
			if tc.chunked {
				rd = io.MultiReader(rd) // hides the length from NewRequest
			}
			req := httptest.NewRequest(method, "/hook", rd)
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Errorf("status %d, want %d (%s)", rec.Code, tc.code, rec.Body)
			}
			if got := pokes.Load() == 1; got != tc.poked {
				t.Errorf("poked %d times, want a fetch: %v", pokes.Load(), tc.poked)
			}
		})
	}
}

// The webhook over a real listener, as a forge reaches it.
func TestMirrorWebhookServed(t *testing.T) {
	var pokes atomic.Int32
	srv := httptest.NewServer(webhookHandler([]byte("k"), func() { pokes.Add(1) }, slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer srv.Close()
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || pokes.Load() != 0 {
		t.Fatalf("unsigned: %d, %d pokes", resp.StatusCode, pokes.Load())
	}
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("{}"))
	req.Header.Set("X-Gitlab-Token", "k")
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || pokes.Load() != 1 {
		t.Fatalf("gitlab token: %d, %d pokes", resp.StatusCode, pokes.Load())
	}
}

// Bad flags are usage errors (exit 2) before anything is dialled.
func TestMirrorFlags(t *testing.T) {
	dir := t.TempDir()
	signers := filepath.Join(dir, "allowed_signers")
	// A real key line: the file is parsed before the registry is dialled.
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(signers, append([]byte("alice@example.com "), ssh.MarshalAuthorizedKey(sshPub)...), 0o644); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret")
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(secret, []byte("s3cret\n"), 0o600)
	_ = os.WriteFile(empty, []byte("\n"), 0o600)
	sha := strings.Repeat("ab", 20)
	base := []string{"mirror", "--repo", "file:///nowhere", "--allowed-signers", signers, "--cache-dir", dir, "--etcd-endpoints", "unix:///nonexistent.sock"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no repo", []string{"mirror", "--allowed-signers", signers}, "--repo"},
		{"no signers", []string{"mirror", "--repo", "file:///x"}, "--allowed-signers"},
		{"bad signers", append(base[:3:3], "--allowed-signers", secret), "--allowed-signers"},
		{"bad verify", append(base, "--verify", "some"), "--verify"},
		{"tip without start", append(base, "--verify", "tip"), "--start"},
		{"start without tip", append(base, "--start", sha), "--start"},
		{"short start", append(base, "--verify", "tip", "--start", "abc123"), "full commit SHA"},
		{"threshold", append(base, "--mass-delete-threshold", "120%"), "threshold"},
		{"webhook without secret", append(base, "--webhook-listen", "127.0.0.1:0"), "--webhook-secret-file"},
		{"empty secret", append(base, "--webhook-listen", "127.0.0.1:0", "--webhook-secret-file", empty), "empty secret"},
		{"bad name", append(base, "--name", "Not/A/Name"), "--name"},
		{"bad branch", append(base, "--branch", "a..b"), "--branch"},
		{"poll", append(base, "--poll", "10ms"), "--poll"},
		{"relative cache", append(base, "--cache-dir", "rel"), "--cache-dir"},
		{"args", append(base, "extra"), "unknown command"},
		{"reset without to", []string{"mirror", "reset"}, "--to"},
		{"reset short sha", []string{"mirror", "reset", "--to", "abc"}, "full commit SHA"},
		{"sync bad name", []string{"mirror", "sync", "--name", "x/y"}, "--name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			root := newRoot()
			root.SetArgs(tc.args)
			root.SetOut(&out)
			root.SetErr(&out)
			err := root.Execute()
			var ce *codeError
			if err == nil || !asCode(err, &ce) || ce.code != exitUsage {
				t.Fatalf("agentd %s: %v (out %s), want exit 2", strings.Join(tc.args, " "), err, out.String())
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
		})
	}
	// Good flags pass the checks.
	o := &mirrorOptions{repo: "file:///x", branch: "main", allowedSigners: signers, name: "default", cacheDir: dir,
		poll: time.Minute, verify: "tip", start: sha, threshold: 0.2, webhookListen: ":0", webhookSecretFile: secret}
	cfg, sec, err := o.check()
	if err != nil || !cfg.verifyTip || cfg.start != plumbing.NewHash(sha) || string(sec) != "s3cret" || cfg.dir != filepath.Join(dir, "default") {
		t.Fatalf("check = %+v, %q, %v", cfg, sec, err)
	}
}

func TestMirrorPercentFlag(t *testing.T) {
	for in, want := range map[string]float64{"20%": 0.2, "5": 0.05, "0%": 0, "100%": 1, " 50 % ": -1, "-1%": -1, "abc": -1} {
		var p percentValue
		err := p.Set(in)
		if want < 0 {
			if err == nil {
				t.Errorf("Set(%q) accepted", in)
			}
			continue
		}
		if err != nil || float64(p) != want {
			t.Errorf("Set(%q) = %v, %v; want %v", in, float64(p), err, want)
		}
	}
}

// A commit's verdict is the worst of its rollouts' ends; applied without.
func TestMirrorVerdictOf(t *testing.T) {
	for _, c := range []struct {
		name   string
		phases []string
		want   string
	}{
		{"no rollouts", nil, verdictApplied},
		{"all done", []string{"done", "done"}, verdictDone},
		{"one superseded", []string{"done", "superseded"}, verdictSuperseded},
		{"one gone", []string{"superseded", phaseGone}, verdictAborted},
		{"one failed", []string{"aborted", "failed", "done"}, verdictFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			var rs []verdictRollout
			for _, p := range c.phases {
				rs = append(rs, verdictRollout{Phase: p})
			}
			if got := verdictOf(rs); got != c.want {
				t.Errorf("verdictOf(%v) = %s, want %s", c.phases, got, c.want)
			}
		})
	}
}
