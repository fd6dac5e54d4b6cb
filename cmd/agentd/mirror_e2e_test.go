package main

// End-to-end tests of `agentd mirror`: real git repositories (git and
// ssh-keygen), a real etcd (registrytest), the mirror running in-process
// with exactly the code the command runs, and, for the first, a real
// systemd running what the mirror wrote. They need the registry's mirror
// API (registry/mirror.go).

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testport"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// mirrorProc is one `agentd mirror` running in-process.
type mirrorProc struct {
	o       *mirrorOptions
	cancel  context.CancelFunc
	done    chan error
	elected atomic.Int32
}

// startMirror runs a mirror of g's main branch into the etcd at endpoint,
// with a poll long enough that only its start, `mirror sync` and webhooks
// make it fetch; edit adjusts its options.
func startMirror(t *testing.T, endpoint string, g *gitRepo, signers string, edit func(*mirrorOptions)) *mirrorProc {
	t.Helper()
	o := &mirrorOptions{
		repo: g.url(), branch: "main", allowedSigners: signers, name: "default", cacheDir: t.TempDir(),
		poll: time.Hour, verify: "all", threshold: percentValue(0.2), logLevel: "debug", leaseTTL: 5 * time.Second,
		logOut: t.Output(),
	}
	o.ef.endpoints = []string{endpoint}
	o.ef.prefix = registry.DefaultPrefix
	o.ef.timeout = 5 * time.Second
	if edit != nil {
		edit(o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &mirrorProc{o: o, cancel: cancel, done: make(chan error, 1)}
	prev := o.onElected
	o.onElected = func() {
		p.elected.Add(1)
		if prev != nil {
			prev()
		}
	}
	go func() { p.done <- runMirror(ctx, o) }()
	t.Cleanup(func() { p.stop(t) })
	return p
}

func (p *mirrorProc) stop(t *testing.T) {
	t.Helper()
	p.cancel()
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("mirror: %v", err)
		}
		p.done <- nil
	case <-time.After(15 * time.Second):
		t.Error("mirror did not stop within 15s")
	}
}

// mirrorCLI runs an agentd command line against the etcd at endpoint.
func mirrorCLI(t *testing.T, endpoint string, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	root := newRoot()
	root.SetArgs(append(args, "--etcd-endpoints", endpoint))
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.Execute()
	if err != nil {
		fmt.Fprintln(&out, "error:", err)
	}
	t.Logf("$ agentd %s\n%s", strings.Join(args, " "), out.String())
	code := 0
	if err != nil {
		code = exitError
		var ce *codeError
		if asCode(err, &ce) {
			code = ce.code
		}
	}
	return out.String(), code
}

// waitMirror waits until the mirror's state in reg satisfies cond.
func waitMirror(t *testing.T, reg *registry.Client, what string, cond func(registry.MirrorState) bool) registry.MirrorState {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, ok, err := reg.MirrorState(context.Background(), "default")
		if err == nil && ok && cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s: state %+v (refused %+v), %v", what, s, s.Refused, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func atCommit(c string) func(registry.MirrorState) bool {
	return func(s registry.MirrorState) bool { return s.Commit == c }
}

func refusedCommit(c string) func(registry.MirrorState) bool {
	return func(s registry.MirrorState) bool { return s.Refused != nil && s.Refused.Commit == c }
}

// From an empty repository to a host running the unit: a signed commit of
// hosts/h1/hello.service reaches h1's agent, which starts it.
func TestMirrorE2ESignedCommitRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startAgent()
	g := newGitRepo(t)
	key, line := g.key("alice@example.com")
	g.write("hosts/h1/hello.service", helloV1)
	c1 := g.commit(key, "hello on h1")
	startMirror(t, e.endpoint, g, g.signers(line), nil)
	st := waitMirror(t, e.reg, "the commit is mirrored", atCommit(c1))
	if !strings.HasPrefix(st.Signer, "alice@example.com") || st.Author != "Alice <alice@example.com>" || st.Subject != "hello on h1" {
		t.Errorf("state %+v", st)
	}
	eventually(t, "h1 runs hello.service", func() bool {
		s, ok := e.status("hello.service")
		return ok && s.Hash == reconcile.Hash([]byte(helloV1)) && s.ActiveState == "active"
	})
	if pid := e.h.MainPID(t, "hello.service"); pid == 0 {
		t.Fatal("hello.service has no MainPID")
	}
	out, code := mirrorCLI(t, e.endpoint, "mirror", "status")
	if code != 0 || !strings.Contains(out, c1[:12]) || !strings.Contains(out, "alice@example.com") {
		t.Fatalf("mirror status: exit %d\n%s", code, out)
	}
}

// An unsigned commit between two signed ones: the first is mirrored, the
// mirror stops before the unsigned one, and status names it.
func TestMirrorE2EUnsignedStops(t *testing.T) {
	t.Parallel()
	endpoint, reg, g, key, line := mirrorScene(t)
	g.write("hosts/h1/a.service", helloV1)
	c1 := g.commit(key, "one")
	g.write("hosts/h1/b.service", helloV1)
	c2 := g.commit("", "two, unsigned")
	g.write("hosts/h1/c.service", helloV1)
	g.commit(key, "three")
	startMirror(t, endpoint, g, g.signers(line), nil)
	st := waitMirror(t, reg, "the unsigned commit is refused", refusedCommit(c2))
	if st.Commit != c1 || st.Refused.Author != "Alice <alice@example.com>" || !strings.Contains(st.Refused.Reason, "not signed") {
		t.Fatalf("state %+v, refused %+v", st, st.Refused)
	}
	ctx := context.Background()
	if _, err := reg.Get(ctx, h1, "a.service"); err != nil {
		t.Errorf("a.service (the signed commit before): %v", err)
	}
	for _, k := range []string{"b.service", "c.service"} {
		if _, err := reg.Get(ctx, h1, k); err == nil {
			t.Errorf("%s is in the registry: written from the refused commit or after it", k)
		}
	}
	out, code := mirrorCLI(t, endpoint, "mirror", "status")
	for _, want := range []string{c2[:12], "Alice <alice@example.com>", "not signed", c1[:12]} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("mirror status (exit %d) does not say %q:\n%s", code, want, out)
		}
	}
}

// A force push is refused; `mirror reset --to` names where to go on from.
func TestMirrorE2EForcePushAndReset(t *testing.T) {
	t.Parallel()
	endpoint, reg, g, key, line := mirrorScene(t)
	for i := range 5 {
		g.write(fmt.Sprintf("hosts/h1/u%d.service", i), helloV1)
	}
	c1 := g.commit(key, "one")
	g.write("hosts/h1/a.service", helloV1)
	c2 := g.commit(key, "two")
	startMirror(t, endpoint, g, g.signers(line), nil)
	waitMirror(t, reg, "two mirrored", atCommit(c2))
	g.git("reset", "-q", "--hard", c1)
	g.write("hosts/h1/b.service", helloV1)
	c3 := g.commit(key, "three, rewritten")
	if out, code := mirrorCLI(t, endpoint, "mirror", "sync"); code != 0 {
		t.Fatalf("mirror sync: exit %d\n%s", code, out)
	}
	st := waitMirror(t, reg, "the force push is refused", refusedCommit(c3))
	if st.Commit != c2 || !strings.Contains(st.Refused.Reason, "not a fast-forward") {
		t.Fatalf("state %+v, refused %+v", st, st.Refused)
	}
	out, code := mirrorCLI(t, endpoint, "mirror", "reset", "--to", c1)
	if code != 0 || !strings.Contains(out, c1) || !strings.Contains(out, c2[:12]) {
		t.Fatalf("mirror reset: exit %d\n%s", code, out)
	}
	waitMirror(t, reg, "the rewritten branch is mirrored", atCommit(c3))
	ctx := context.Background()
	if _, err := reg.Get(ctx, h1, "a.service"); err == nil {
		t.Error("a.service (of the dropped commit) is still in the registry")
	}
	if _, err := reg.Get(ctx, h1, "b.service"); err != nil {
		t.Errorf("b.service: %v", err)
	}
}

// A commit deleting 90 % of the keys is held until `mirror sync
// --allow-mass-delete`.
func TestMirrorE2EMassDeleteHeld(t *testing.T) {
	t.Parallel()
	endpoint, reg, g, key, line := mirrorScene(t)
	for i := range 10 {
		g.write(fmt.Sprintf("hosts/h1/u%d.service", i), helloV1)
	}
	c1 := g.commit(key, "ten")
	startMirror(t, endpoint, g, g.signers(line), nil)
	waitMirror(t, reg, "ten mirrored", atCommit(c1))
	for i := range 9 {
		g.rm(fmt.Sprintf("hosts/h1/u%d.service", i))
	}
	c2 := g.commit(key, "delete nine")
	mirrorCLI(t, endpoint, "mirror", "sync")
	st := waitMirror(t, reg, "the mass delete is held", refusedCommit(c2))
	if st.Commit != c1 || !strings.Contains(st.Refused.Reason, "--allow-mass-delete") {
		t.Fatalf("state %+v, refused %+v", st, st.Refused)
	}
	if tree, err := reg.MirrorTree(context.Background(), "default"); err != nil || len(tree[h1]) != 10 {
		t.Fatalf("mirrored keys while held: %d, %v", len(tree[h1]), err)
	}
	if out, code := mirrorCLI(t, endpoint, "mirror", "sync", "--allow-mass-delete"); code != 0 {
		t.Fatalf("mirror sync --allow-mass-delete: exit %d\n%s", code, out)
	}
	waitMirror(t, reg, "the mass delete is applied", atCommit(c2))
	if tree, err := reg.MirrorTree(context.Background(), "default"); err != nil || len(tree[h1]) != 1 {
		t.Fatalf("mirrored keys after: %v, %v", tree, err)
	}
}

// Two mirrors of one name: one is elected and writes; when it stops, the
// other takes over.
func TestMirrorE2ETwoMirrorsOneWrites(t *testing.T) {
	t.Parallel()
	endpoint, reg, g, key, line := mirrorScene(t)
	g.write("hosts/h1/a.service", helloV1)
	c1 := g.commit(key, "one")
	signers := g.signers(line)
	a := startMirror(t, endpoint, g, signers, func(o *mirrorOptions) { o.id = "a" })
	b := startMirror(t, endpoint, g, signers, func(o *mirrorOptions) { o.id = "b" })
	waitMirror(t, reg, "one mirrored", atCommit(c1))
	time.Sleep(500 * time.Millisecond) // time for a wrong second election to show
	if n := a.elected.Load() + b.elected.Load(); n != 1 {
		t.Fatalf("%d elected, want 1", n)
	}
	leader, standby := a, b
	if b.elected.Load() == 1 {
		leader, standby = b, a
	}
	leader.stop(t)
	g.write("hosts/h1/b.service", helloV1)
	c2 := g.commit(key, "two")
	eventually(t, "the standby is elected", func() bool { return standby.elected.Load() == 1 })
	mirrorCLI(t, endpoint, "mirror", "sync")
	waitMirror(t, reg, "the standby mirrors", atCommit(c2))
}

// The webhook: a wrong HMAC is 401 and fetches nothing; the right one,
// or GitLab's token, fetches at once.
func TestMirrorE2EWebhook(t *testing.T) {
	t.Parallel()
	endpoint, reg, g, key, line := mirrorScene(t)
	g.write("hosts/h1/a.service", helloV1)
	c1 := g.commit(key, "one")
	secretFile := filepath.Join(g.dir, "secret")
	g.write("../secret", "s3cret\n")
	addr := "127.0.0.1:" + strconv.Itoa(testport.Restartable(t))
	p := startMirror(t, endpoint, g, g.signers(line), func(o *mirrorOptions) {
		o.webhookListen, o.webhookSecretFile = addr, secretFile
	})
	waitMirror(t, reg, "one mirrored", atCommit(c1))
	fetchFile := filepath.Join(p.o.cacheDir, "default", "fetch.json")
	before, _, _ := readFetchStatus(fetchFile)

	post := func(body string, headers ...string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+addr+"/hook", strings.NewReader(body))
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	sign := func(key, body string) string {
		mac := hmac.New(sha256.New, []byte(key))
		mac.Write([]byte(body))
		return "sha256=" + hex.EncodeToString(mac.Sum(nil))
	}
	g.write("hosts/h1/b.service", helloV1)
	c2 := g.commit(key, "two")
	body := `{"ref":"refs/heads/main"}`
	if code := post(body, "X-Hub-Signature-256", sign("wrong", body), "X-GitHub-Event", "push"); code != 401 {
		t.Fatalf("wrong HMAC: %d, want 401", code)
	}
	if code := post(strings.Repeat("x", maxWebhookBody+1), "X-Hub-Signature-256", sign("s3cret", "")); code != 413 {
		t.Fatalf("huge body: %d, want 413", code)
	}
	time.Sleep(500 * time.Millisecond)
	if after, _, _ := readFetchStatus(fetchFile); !after.At.Equal(before.At) {
		t.Fatalf("a refused webhook fetched: %v → %v", before.At, after.At)
	}
	if st, _, _ := reg.MirrorState(context.Background(), "default"); st.Commit != c1 {
		t.Fatalf("a refused webhook mirrored %s", st.Commit)
	}
	if code := post(body, "X-Hub-Signature-256", sign("s3cret", body), "X-GitHub-Event", "push"); code != 202 {
		t.Fatalf("right HMAC: %d, want 202", code)
	}
	waitMirror(t, reg, "the webhook's fetch mirrors two", atCommit(c2))
	g.write("hosts/h1/c.service", helloV1)
	c3 := g.commit(key, "three")
	if code := post(body, "X-Gitlab-Token", "s3cret", "X-Gitlab-Event", "Push Hook"); code != 202 {
		t.Fatalf("GitLab token: %d, want 202", code)
	}
	waitMirror(t, reg, "the GitLab webhook's fetch mirrors three", atCommit(c3))
}

// A target the mirror owns: `unit put` to it is refused (exit 2, naming
// the mirror) unless --force.
func TestMirrorE2EDirectPutRefused(t *testing.T) {
	t.Parallel()
	endpoint, reg, g, key, line := mirrorScene(t)
	g.write("hosts/h1/a.service", helloV1)
	c1 := g.commit(key, "one")
	startMirror(t, endpoint, g, g.signers(line), nil)
	waitMirror(t, reg, "one mirrored", atCommit(c1))
	g.write("../src/x.service", helloV2)
	src := filepath.Join(g.dir, "src", "x.service")
	out, code := mirrorCLI(t, endpoint, "unit", "put", src, "--host", "h1")
	if code != exitUsage || !strings.Contains(out, `"default"`) || !strings.Contains(out, g.url()) || !strings.Contains(out, "--force") {
		t.Fatalf("unit put to a mirrored host: exit %d, want 2 naming the mirror\n%s", code, out)
	}
	if _, err := reg.Get(context.Background(), h1, "x.service"); err == nil {
		t.Fatal("the refused put was stored")
	}
	if out, code := mirrorCLI(t, endpoint, "unit", "put", src, "--host", "h1", "--force"); code != 0 {
		t.Fatalf("unit put --force: exit %d\n%s", code, out)
	}
	if _, err := reg.Get(context.Background(), h1, "x.service"); err != nil {
		t.Fatalf("put --force: %v", err)
	}
	if out, code := mirrorCLI(t, endpoint, "unit", "rm", "a.service", "--host", "h1"); code != exitUsage {
		t.Fatalf("unit rm of a mirrored key: exit %d, want 2\n%s", code, out)
	}
	// Another host is not the mirror's.
	if out, code := mirrorCLI(t, endpoint, "unit", "put", src, "--host", "h2"); code != 0 {
		t.Fatalf("unit put to an unmirrored host: exit %d\n%s", code, out)
	}
}

// The commit that takes a target over makes it what git says at once: a
// key put there by hand before the mirror owned it goes in that commit
// (under the mass-delete guard), not silently in the commit after it.
func TestMirrorE2ETakeOverRemovesHandPutKeys(t *testing.T) {
	t.Parallel()
	endpoint, reg, g, key, line := mirrorScene(t)
	hand := map[string][]byte{"hand.service": []byte(helloV2)} // one of five: 20 %, at the guard
	for i := range 4 {
		hand[fmt.Sprintf("a%d.service", i)] = []byte(helloV1)
	}
	if _, err := reg.Put(context.Background(), h1, hand); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		g.write(fmt.Sprintf("hosts/h1/a%d.service", i), helloV1)
	}
	c1 := g.commit(key, "take h1 over")
	startMirror(t, endpoint, g, g.signers(line), nil)
	waitMirror(t, reg, "the first commit mirrored", atCommit(c1))
	if _, err := reg.Get(context.Background(), h1, "hand.service"); err == nil {
		t.Error("hand.service, put by hand and not in git, is still in hosts/h1 after the commit that took h1 over")
	}
	if _, err := reg.Get(context.Background(), h1, "a0.service"); err != nil {
		t.Errorf("a0.service from git: %v", err)
	}
}
