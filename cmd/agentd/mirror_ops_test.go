package main

// Operations of `agentd mirror` (issue 35): its auth flags, its metrics
// for the contrib rules and dashboard, and its robustness: a replayed
// webhook, a mirror SIGKILLed in the middle of a round.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	githttp "github.com/go-git/go-git/v5/plumbing/transport/http"
	gitssh "github.com/go-git/go-git/v5/plumbing/transport/ssh"
	"github.com/spf13/pflag"
	"golang.org/x/crypto/ssh"

	"github.com/agentd/agentd/internal/testport"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// authFiles are the files the auth flag tests point at.
type authFiles struct {
	key, badKey, knownHosts, token, emptyToken, twoLineToken, missing, dir string
	signers                                                                string // an allowed_signers file
}

const testToken = "ghp_s3cretTOKENnotForLogs0123456789"

func writeAuthFiles(t *testing.T) authFiles {
	t.Helper()
	dir := t.TempDir()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "deploy key")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	f := authFiles{
		key: filepath.Join(dir, "id_ed25519"), badKey: filepath.Join(dir, "not-a-key"),
		knownHosts: filepath.Join(dir, "known_hosts"), token: filepath.Join(dir, "token"),
		emptyToken: filepath.Join(dir, "empty"), twoLineToken: filepath.Join(dir, "two-lines"),
		missing: filepath.Join(dir, "missing"), dir: dir, signers: filepath.Join(dir, "allowed_signers"),
	}
	for path, content := range map[string]string{
		f.key:          string(pem.EncodeToMemory(block)),
		f.badKey:       "not a key\n",
		f.knownHosts:   "git.example.com " + string(ssh.MarshalAuthorizedKey(signer.PublicKey())),
		f.token:        testToken + "\n",
		f.emptyToken:   "\n",
		f.twoLineToken: testToken + "\nmore\n",
		f.signers:      "alice@example.com " + string(ssh.MarshalAuthorizedKey(signer.PublicKey())),
	} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// The auth flags against the --repo URL: each bad combination is a usage
// error (exit 2) naming the flag, and no error holds the token.
func TestMirrorAuthFlags(t *testing.T) {
	t.Parallel()
	f := writeAuthFiles(t)
	emptyHome := t.TempDir()
	homeWithKnown := t.TempDir()
	if err := os.MkdirAll(filepath.Join(homeWithKnown, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(homeWithKnown, ".ssh", "known_hosts"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	const (
		sshURL   = "ssh://git@git.example.com/ops/units.git"
		scpURL   = "deploy@git.example.com:ops/units.git"
		httpsURL = "https://git.example.com/ops/units.git"
	)
	for _, c := range []struct {
		name string
		url  string
		a    mirrorAuthFlags
		home string
		want string // "" ok; else a substring of the error
		user string // the auth method's user, when ok
		kind string // "ssh", "https" or "" (no auth option)
	}{
		{name: "ssh key and known hosts", url: sshURL, a: mirrorAuthFlags{sshKey: f.key, sshKnownHosts: f.knownHosts}, home: emptyHome, user: "git", kind: "ssh"},
		{name: "scp-like URL takes its user", url: scpURL, a: mirrorAuthFlags{sshKey: f.key, sshKnownHosts: f.knownHosts}, home: emptyHome, user: "deploy", kind: "ssh"},
		{name: "ssh, ~/.ssh/known_hosts", url: sshURL, a: mirrorAuthFlags{sshKey: f.key}, home: homeWithKnown, user: "git", kind: "ssh"},
		{name: "ssh without known hosts refused", url: sshURL, a: mirrorAuthFlags{sshKey: f.key}, home: emptyHome, want: "needs --ssh-known-hosts FILE"},
		{name: "ssh without a home refused", url: scpURL, a: mirrorAuthFlags{sshKey: f.key}, want: "needs --ssh-known-hosts FILE"},
		{name: "ssh known hosts missing", url: sshURL, a: mirrorAuthFlags{sshKey: f.key, sshKnownHosts: f.missing}, home: homeWithKnown, want: "--ssh-known-hosts: open " + f.missing},
		{name: "ssh known hosts a directory", url: sshURL, a: mirrorAuthFlags{sshKey: f.key, sshKnownHosts: f.dir}, want: "not a regular file"},
		{name: "ssh key missing", url: sshURL, a: mirrorAuthFlags{sshKey: f.missing, sshKnownHosts: f.knownHosts}, want: "--ssh-key: open " + f.missing},
		{name: "ssh key not a key", url: sshURL, a: mirrorAuthFlags{sshKey: f.badKey, sshKnownHosts: f.knownHosts}, want: "not an unencrypted private key"},
		{name: "ssh key on https", url: httpsURL, a: mirrorAuthFlags{sshKey: f.key}, want: "are for an ssh --repo"},
		{name: "known hosts on file://", url: "file:///srv/units", a: mirrorAuthFlags{sshKnownHosts: f.knownHosts}, want: "are for an ssh --repo"},
		{name: "ssh and https flags", url: sshURL, a: mirrorAuthFlags{sshKey: f.key, httpsTokenFile: f.token}, want: "do not go together"},
		{name: "https token", url: httpsURL, a: mirrorAuthFlags{httpsTokenFile: f.token, httpsUser: "git"}, user: "git", kind: "https"},
		{name: "https token and user", url: httpsURL, a: mirrorAuthFlags{httpsTokenFile: f.token, httpsUser: "oauth2"}, user: "oauth2", kind: "https"},
		{name: "https without a token", url: httpsURL, a: mirrorAuthFlags{httpsUser: "git"}},
		{name: "no flags, file://", url: "file:///srv/units"},
		{name: "https user without a token", url: httpsURL, a: mirrorAuthFlags{httpsUser: "oauth2"}, want: "--https-user goes with --https-token-file"},
		{name: "token over plain http", url: "http://git.example.com/ops/units.git", a: mirrorAuthFlags{httpsTokenFile: f.token}, want: "in the clear"},
		{name: "token on ssh", url: sshURL, a: mirrorAuthFlags{httpsTokenFile: f.token}, want: "are for an https:// --repo"},
		{name: "token on file://", url: "file:///srv/units", a: mirrorAuthFlags{httpsTokenFile: f.token}, want: "are for an https:// --repo"},
		{name: "token file missing", url: httpsURL, a: mirrorAuthFlags{httpsTokenFile: f.missing}, want: "--https-token-file: open " + f.missing},
		{name: "token file a directory", url: httpsURL, a: mirrorAuthFlags{httpsTokenFile: f.dir}, want: "--https-token-file: read " + f.dir},
		{name: "token file empty", url: httpsURL, a: mirrorAuthFlags{httpsTokenFile: f.emptyToken}, want: "empty"},
		{name: "token file two lines", url: httpsURL, a: mirrorAuthFlags{httpsTokenFile: f.twoLineToken}, want: "more than one line"},
		{name: "password in the URL", url: "https://git:" + testToken + "@git.example.com/ops/units.git", want: "the URL holds a password"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := c.a.method(c.url, c.home)
			if c.want != "" {
				var ce *codeError
				if err == nil || !asCode(err, &ce) || ce.code != exitUsage {
					t.Fatalf("err %v, want a usage error (exit 2) saying %q", err, c.want)
				}
				if !strings.Contains(err.Error(), c.want) {
					t.Errorf("err %q, want it to say %q", err, c.want)
				}
				if strings.Contains(err.Error(), testToken) {
					t.Errorf("the error shows the token: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.kind == "" {
				if m != nil {
					t.Fatalf("auth method %T, want none", m)
				}
				return
			}
			var user string
			switch m := m.(type) {
			case *gitssh.PublicKeys:
				if c.kind != "ssh" || m.HostKeyCallback == nil {
					t.Fatalf("ssh auth %v with HostKeyCallback %v", m, m.HostKeyCallback != nil)
				}
				user = m.User
			case *githttp.BasicAuth:
				if c.kind != "https" || m.Password != testToken {
					t.Fatalf("basic auth for %s with the wrong password (%d bytes)", c.kind, len(m.Password))
				}
				if strings.Contains(m.String(), testToken) {
					t.Errorf("the auth method prints the token: %s", m)
				}
				user = m.Username
			default:
				t.Fatalf("auth method %T", m)
			}
			if user != c.user {
				t.Errorf("user %q, want %q", user, c.user)
			}
		})
	}
}

// Bad auth flags stop `agentd mirror` with exit 2 before it reaches the
// network: the registry at the endpoint given does not exist, and a
// mirror past its flags would retry it for ever.
func TestMirrorAuthRefusedBeforeNetwork(t *testing.T) {
	t.Parallel()
	f := writeAuthFiles(t)
	base := []string{"mirror", "--allowed-signers", f.signers, "--cache-dir", t.TempDir()}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--repo", "https://git.example.com/u.git", "--https-token-file", f.missing}, "--https-token-file"},
		{[]string{"--repo", "ssh://git@git.example.com/u.git", "--ssh-key", f.key, "--ssh-known-hosts", f.missing}, "--ssh-known-hosts"},
		{[]string{"--repo", "file:///srv/u", "--ssh-key", f.key}, "--ssh-key"},
		{[]string{"--repo", "https://git.example.com/u.git", "--https-user", "x"}, "--https-user"},
	} {
		done := make(chan struct{})
		var out string
		var code int
		go func() {
			defer close(done)
			out, code = mirrorCLI(t, "http://127.0.0.1:1", append(base, c.args...)...)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("mirror %v still runs after 10s: the flags were not refused", c.args)
		}
		if code != exitUsage || !strings.Contains(out, c.want) {
			t.Errorf("mirror %v: exit %d, want 2 naming %s\n%s", c.args, code, c.want, out)
		}
	}
}

// The mirror run as its own process against an https remote that wants a
// token: the remote receives it as basic auth (git, the token), and
// neither the mirror's logs, nor its fetch status, nor `mirror status`
// show it, though every fetch fails.
func TestMirrorHTTPSTokenNeverShown(t *testing.T) {
	t.Parallel()
	bin := buildAgent(t)
	etcd := registrytest.StartEtcd(t)
	var (
		mu    sync.Mutex
		auths []string
	)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		http.Error(w, "no such repository", http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	f := writeAuthFiles(t)
	ca := filepath.Join(f.dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	g := newGitRepo(t)
	_, line := g.key("alice@example.com")
	cache := t.TempDir()
	var logs lockedBuffer
	p := startMirrorProcess(t, bin, []string{"SSL_CERT_FILE=" + ca}, &logs,
		"--repo", srv.URL+"/ops/units.git", "--allowed-signers", g.signers(line), "--https-token-file", f.token,
		"--etcd-endpoints", etcd.Endpoint(), "--cache-dir", cache, "--poll", "1s", "--log-level", "debug")
	waitFor(t, p, 20*time.Second, "the mirror fetched twice", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(auths) >= 2
	})
	p.stop(t)
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("git:"+testToken))
	mu.Lock()
	if auths[0] != want {
		t.Errorf("the remote got Authorization %q, want basic auth git:<token>", auths[0])
	}
	mu.Unlock()
	status, code := mirrorCLI(t, etcd.Endpoint(), "mirror", "status", "--cache-dir", cache)
	fetch, _ := os.ReadFile(filepath.Join(cache, "default", "fetch.json"))
	if !strings.Contains(string(fetch), `"ok": false`) {
		t.Errorf("fetch.json does not record the failed fetch:\n%s", fetch)
	}
	for what, s := range map[string]string{"the logs": logs.String(), "fetch.json": string(fetch), "mirror status": status} {
		if strings.Contains(s, testToken) || strings.Contains(s, want[len("Basic "):]) {
			t.Errorf("%s show the token:\n%s", what, s)
		}
	}
	if code != 0 && code != exitError {
		t.Errorf("mirror status: exit %d", code)
	}
	if !strings.Contains(logs.String(), "mirror round failed") {
		t.Errorf("the logs do not say that the round failed:\n%s", logs.String())
	}
}

// lockedBuffer is a bytes.Buffer a process's output is copied into while
// the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startMirrorProcess runs `agentd mirror args…` as its own process (so it
// can be SIGKILLed), with env added to the test's environment; its output
// goes to the test's and, when out is not nil, to out.
func startMirrorProcess(t *testing.T, bin string, env []string, out io.Writer, args ...string) *crashAgent {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"mirror"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	w := io.Writer(t.Output())
	if out != nil {
		w = io.MultiWriter(w, out)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &crashAgent{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(a.done) }()
	t.Cleanup(a.kill)
	t.Logf("mirror pid %d: agentd mirror %s", cmd.Process.Pid, strings.Join(args, " "))
	return a
}

// mirrorScrape runs a mirror that mirrors one commit and refuses the next
// (unsigned), in the etcd at endpoint, and returns its /metrics: every
// series the mirror exports has a sample (the refusal's reason included).
func mirrorScrape(t *testing.T, endpoint string) scrape {
	t.Helper()
	g := newGitRepo(t)
	key, line := g.key("alice@example.com")
	g.write("hosts/mirrored-host/a.service", helloV1)
	c1 := g.commit(key, "one")
	g.write("hosts/mirrored-host/b.service", helloV1)
	c2 := g.commit("", "two, unsigned")
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	startMirror(t, endpoint, g, g.signers(line), func(o *mirrorOptions) { o.metricsAddr = addr })
	reg := registrytest.NewClient(t, endpoint)
	st := waitMirror(t, reg, "the unsigned commit is refused", refusedCommit(c2))
	if st.Commit != c1 {
		t.Fatalf("mirror state %+v", st)
	}
	return parseScrape(t, agentMetrics(t, addr))
}

// fetchesOK is agentd_mirror_fetches_total{result="ok"} of a mirror's
// /metrics at addr.
func fetchesOK(t *testing.T, addr string) float64 {
	t.Helper()
	f, ok := parseScrape(t, agentMetrics(t, addr))["agentd_mirror_fetches_total"]
	if !ok {
		return 0
	}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "result" && l.GetValue() == "ok" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// etcdRevision is the etcd cluster's revision now.
func etcdRevision(t *testing.T, endpoint string) int64 {
	t.Helper()
	cli := registrytest.RawClient(t, endpoint)
	resp, err := cli.Get(context.Background(), "/agentd-test-revision-probe")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// commitsInHistory counts the versions of t's unit key the mirror's
// commit c wrote (their who says "git <sha12> …").
func commitsInHistory(t *testing.T, reg *registry.Client, target registry.Target, unit, c string) int {
	t.Helper()
	h, err := reg.History(context.Background(), target, unit)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range h.Versions {
		if strings.HasPrefix(v.User, "git "+c[:12]+" ") {
			n++
		}
	}
	return n
}

// A replayed webhook (the same signed delivery posted again) is accepted,
// fetches at most once more, and writes nothing: the registry's revision
// and the key's history are what they were.
func TestMirrorWebhookReplay(t *testing.T) {
	t.Parallel()
	endpoint, reg, g, key, line := mirrorScene(t)
	g.write("hosts/h1/a.service", helloV1)
	c1 := g.commit(key, "one")
	g.write("../secret", "s3cret\n")
	hook := "127.0.0.1:" + strconv.Itoa(testport.Restartable(t))
	metrics := "127.0.0.1:" + strconv.Itoa(freePort(t))
	startMirror(t, endpoint, g, g.signers(line), func(o *mirrorOptions) {
		o.webhookListen, o.webhookSecretFile, o.metricsAddr = hook, filepath.Join(g.dir, "secret"), metrics
	})
	waitMirror(t, reg, "one mirrored", atCommit(c1))

	body := `{"ref":"refs/heads/main","after":"x"}`
	mac := hmac.New(sha256.New, []byte("s3cret"))
	mac.Write([]byte(body))
	sig := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	deliver := func() {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+hook+"/", strings.NewReader(body))
		req.Header.Set("X-Hub-Signature-256", sig)
		req.Header.Set("X-GitHub-Event", "push")
		req.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("delivery: %d, want 202", resp.StatusCode)
		}
	}
	g.write("hosts/h1/b.service", helloV1)
	c2 := g.commit(key, "two")
	deliver()
	waitMirror(t, reg, "the delivery's fetch mirrors two", atCommit(c2))
	// The round that wrote two has fetched; nothing else triggers one
	// (the poll is an hour).
	fetches := fetchesOK(t, metrics)
	rev := etcdRevision(t, endpoint)
	if n := commitsInHistory(t, reg, h1, "b.service", c2); n != 1 {
		t.Fatalf("b.service's history holds commit two %d times before the replay", n)
	}

	deliver() // the replay
	eventually(t, "the replay's fetch", func() bool { return fetchesOK(t, metrics) >= fetches+1 })
	time.Sleep(time.Second) // time for a second fetch or a write to show
	if got := fetchesOK(t, metrics); got > fetches+1 {
		t.Errorf("the replay fetched %v times, want at most 1", got-fetches)
	}
	if got := etcdRevision(t, endpoint); got != rev {
		t.Errorf("the replay wrote to the registry: revision %d → %d", rev, got)
	}
	if n := commitsInHistory(t, reg, h1, "b.service", c2); n != 1 {
		t.Errorf("b.service's history holds commit two %d times after the replay", n)
	}
	if st, _, _ := reg.MirrorState(context.Background(), "default"); st.Commit != c2 || st.Refused != nil {
		t.Errorf("state after the replay %+v", st)
	}
}

// The mirror, as its own process, SIGKILLed in the middle of a round of
// three commits — before its second write is sent, or once it is written
// — leaves nothing partial: the registry holds whole commits only (the
// state names the last one written, and its keys are there; none of a
// later commit is). A standby, a second process, takes over when the
// lease expires and mirrors the rest; each key's history holds its
// commit once.
func TestMirrorKilledMidRound(t *testing.T) {
	t.Parallel()
	bin := buildAgent(t)
	for _, c := range []struct {
		point   string
		written int // commits in the registry when the mirror is killed
	}{
		{"before-write", 1},
		{"after-write", 2},
	} {
		t.Run(c.point, func(t *testing.T) {
			t.Parallel()
			etcd := registrytest.StartEtcd(t)
			reg := registrytest.NewClient(t, etcd.Endpoint())
			g := newGitRepo(t)
			key, line := g.key("alice@example.com")
			signers := g.signers(line)
			var commits []string
			for i := range 3 {
				g.write(fmt.Sprintf("hosts/h1/u%d.service", i), helloV1)
				if i > 0 {
					g.write(fmt.Sprintf("hosts/h1/u%d.service", i-1), helloV2) // changes a key of the commit before
				}
				commits = append(commits, g.commit(key, fmt.Sprintf("commit %d", i)))
			}
			args := func(cache string) []string {
				return []string{"--repo", g.url(), "--allowed-signers", signers, "--etcd-endpoints", etcd.Endpoint(),
					"--cache-dir", cache, "--lease-ttl", "2s", "--poll", "1h", "--log-level", "debug"}
			}
			cacheA, cacheB := t.TempDir(), t.TempDir()
			a := startMirrorProcess(t, bin, []string{mirrorPauseEnv + "=" + c.point + ":2"}, nil, args(cacheA)...)
			marker := filepath.Join(cacheA, "default", "paused-at-"+c.point)
			waitFor(t, a, 30*time.Second, "the mirror pauses at its second write", func() bool {
				_, err := os.Stat(marker)
				return err == nil
			})
			// The standby starts while the leader holds the lease.
			b := startMirrorProcess(t, bin, nil, nil, args(cacheB)...)
			a.kill()

			st, _, err := reg.MirrorState(context.Background(), "default")
			if err != nil {
				t.Fatal(err)
			}
			if want := commits[c.written-1]; st.Commit != want {
				t.Fatalf("killed at %s: the state is at %s, want commit %d (%s)", c.point, st.Commit, c.written-1, short(want))
			}
			tree, err := reg.MirrorTree(context.Background(), "default")
			if err != nil {
				t.Fatal(err)
			}
			if got := len(tree[h1]); got != c.written {
				t.Fatalf("killed at %s: %d mirrored keys, want %d (whole commits only): %v", c.point, got, c.written, tree)
			}
			for i := range c.written {
				if _, err := reg.Get(context.Background(), h1, fmt.Sprintf("u%d.service", i)); err != nil {
					t.Errorf("u%d.service of a written commit: %v", i, err)
				}
			}
			if _, err := reg.Get(context.Background(), h1, fmt.Sprintf("u%d.service", c.written)); err == nil {
				t.Errorf("u%d.service of the unwritten commit is in the registry", c.written)
			}

			// The standby is elected when the lease expires and mirrors
			// the rest (its first round as leader fetches).
			deadline := time.Now().Add(30 * time.Second)
			for {
				st, _, err := reg.MirrorState(context.Background(), "default")
				if err == nil && st.Commit == commits[2] {
					break
				}
				if b.exited() {
					t.Fatalf("the standby exited (%v)", b.cmd.ProcessState)
				}
				if time.Now().After(deadline) {
					t.Fatalf("the standby did not mirror the rest within 30s: state %+v, %v", st, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if st, _, _ := reg.MirrorState(context.Background(), "default"); st.Refused != nil {
				t.Errorf("refused after the takeover: %+v", st.Refused)
			}
			// Each key's history: one version per commit that wrote it.
			for i := range 3 {
				unit := fmt.Sprintf("u%d.service", i)
				if n := commitsInHistory(t, reg, h1, unit, commits[i]); n != 1 {
					t.Errorf("%s's history holds commit %d %d times, want once", unit, i, n)
				}
				if i < 2 {
					if n := commitsInHistory(t, reg, h1, unit, commits[i+1]); n != 1 {
						t.Errorf("%s's history holds commit %d (which changed it) %d times, want once", unit, i+1, n)
					}
				}
				h, _ := reg.History(context.Background(), h1, unit)
				if want := 2 - max(0, i-1); len(h.Versions) != want {
					t.Errorf("%s's history: %d versions, want %d", unit, len(h.Versions), want)
				}
			}
			b.stop(t)
		})
	}
}

// contrib/systemd/agentd-mirror.default (/etc/default/agentd-mirror)
// names every flag of `agentd mirror` as its AGENTD_<FLAG>, commented out,
// and nothing else but AGENTD_MIRROR_OPTS (agentd-mirror.service's extra
// arguments).
func TestMirrorDefaultsFileNamesEveryFlag(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../contrib/systemd/agentd-mirror.default")
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "AGENTD_") {
			t.Errorf("not commented out: %s", l)
		}
		if v, ok := strings.CutPrefix(l, "#AGENTD_"); ok {
			name, _, _ := strings.Cut(v, "=")
			named["AGENTD_"+name] = true
		}
	}
	flags := map[string]bool{"AGENTD_MIRROR_OPTS": true}
	newMirrorCmd().Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Name == "help" {
			return
		}
		flags[envVar(f.Name)] = true
		if !named[envVar(f.Name)] {
			t.Errorf("--%s: no #%s= in agentd-mirror.default", f.Name, envVar(f.Name))
		}
	})
	for v := range named {
		if !flags[v] {
			t.Errorf("agentd-mirror.default names %s: no flag of agentd mirror", v)
		}
	}
}

// agentd_mirror_stopped (what AgentdMirrorRefusedCommit reads) is 1 while
// the mirror stands before a refused commit and 0 once it holds the tip
// again: here after `mirror reset --to` the refused commit.
func TestMirrorStoppedGauge(t *testing.T) {
	t.Parallel()
	endpoint, reg, g, key, line := mirrorScene(t)
	g.write("hosts/h1/a.service", helloV1)
	g.commit(key, "one")
	g.write("hosts/h1/b.service", helloV1)
	c2 := g.commit("", "two, unsigned")
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	startMirror(t, endpoint, g, g.signers(line), func(o *mirrorOptions) { o.metricsAddr = addr; o.poll = time.Second })
	waitMirror(t, reg, "the unsigned commit is refused", refusedCommit(c2))
	stopped := func() float64 {
		f, ok := parseScrape(t, agentMetrics(t, addr))["agentd_mirror_stopped"]
		if !ok || len(f.GetMetric()) != 1 {
			return -1
		}
		return f.GetMetric()[0].GetGauge().GetValue()
	}
	if v := stopped(); v != 1 {
		t.Fatalf("agentd_mirror_stopped = %v before the refused commit, want 1", v)
	}
	if out, code := mirrorCLI(t, endpoint, "mirror", "reset", "--to", c2); code != 0 {
		t.Fatalf("mirror reset: exit %d\n%s", code, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for stopped() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("agentd_mirror_stopped = %v after the reset to the tip, want 0", stopped())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
