package mirror

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/agentd/agentd/sshsig"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
)

func TestSignedCommitVerifies(t *testing.T) {
	w := newWork(t)
	key, pub := w.key("alice")
	w.write("hosts/web1/hello.service", "[Service]\nExecStart=/bin/true\n", false)
	c1 := w.commit(key, "hello")
	r, tip := w.mirror()
	if tip != c1 {
		t.Fatalf("tip %s, want %s", tip, c1)
	}
	commits, err := r.NewCommits(plumbing.ZeroHash, tip)
	if err != nil {
		t.Fatal(err)
	}
	good, stop := VerifyRange(commits, signers(t, `alice@example.com namespaces="git" `+pub))
	if stop != nil {
		t.Fatalf("refused: %v", stop)
	}
	if len(good) != 1 || good[0].Commit.Hash != c1 || good[0].Signer.Principals != "alice@example.com" {
		t.Fatalf("good = %+v", good)
	}
	// Nothing new since: no commit, no error.
	if cs, err := r.NewCommits(c1, tip); err != nil || len(cs) != 0 {
		t.Fatalf("NewCommits(tip, tip) = %v, %v", cs, err)
	}
}

func TestUnsignedCommitStopsTheRange(t *testing.T) {
	w := newWork(t)
	key, pub := w.key("alice")
	c1 := w.commit(key, "one")
	c2 := w.commit("", "two, unsigned")
	c3 := w.commit(key, "three")
	r, tip := w.mirror()
	commits, err := r.NewCommits(plumbing.ZeroHash, tip)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hashes(commits), []plumbing.Hash{c1, c2, c3}; !slices.Equal(got, want) {
		t.Fatalf("NewCommits = %v, want %v (oldest first)", got, want)
	}
	good, stop := VerifyRange(commits, signers(t, "alice@example.com "+pub))
	if got := verifiedHashes(good); !slices.Equal(got, []plumbing.Hash{c1}) {
		t.Errorf("good = %v, want only %s", got, c1)
	}
	if stop == nil || stop.Commit != c2 || !errors.Is(stop, ErrUnsigned) {
		t.Fatalf("stop = %v, want %s unsigned", stop, c2)
	}
	for _, want := range []string{c2.String()[:12], "Alice <alice@example.com>", "not signed"} {
		if !strings.Contains(stop.Error(), want) {
			t.Errorf("refusal %q does not say %q", stop, want)
		}
	}
}

func TestKeyNotAllowed(t *testing.T) {
	w := newWork(t)
	_, alice := w.key("alice")
	mallory, _ := w.key("mallory")
	c := w.commit(mallory, "from someone else")
	r, tip := w.mirror()
	commits, err := r.NewCommits(plumbing.ZeroHash, tip)
	if err != nil {
		t.Fatal(err)
	}
	good, stop := VerifyRange(commits, signers(t, "alice@example.com "+alice))
	if len(good) != 0 || stop == nil || stop.Commit != c || !errors.Is(stop, sshsig.ErrUnknownKey) {
		t.Fatalf("good %v, stop %v: want %s refused as not an allowed signer", good, stop, c)
	}
	if !strings.Contains(stop.Error(), "SHA256:") {
		t.Errorf("refusal %q does not name the key", stop)
	}
}

// A key retired with valid-before: its commits from before stay good, a
// commit it signs after is refused, judged at the committer time.
func TestExpiredKey(t *testing.T) {
	w := newWork(t)
	key, pub := w.key("alice")
	old := w.commit(key, "before the key was retired", "GIT_COMMITTER_DATE=2019-06-01T12:00:00Z")
	late := w.commit(key, "after", "GIT_COMMITTER_DATE=2021-06-01T12:00:00Z")
	r, tip := w.mirror()
	commits, err := r.NewCommits(plumbing.ZeroHash, tip)
	if err != nil {
		t.Fatal(err)
	}
	good, stop := VerifyRange(commits, signers(t, `alice@example.com valid-before="20200101Z" `+pub))
	if got := verifiedHashes(good); !slices.Equal(got, []plumbing.Hash{old}) {
		t.Errorf("good = %v, want %s", got, old)
	}
	if stop == nil || stop.Commit != late || !errors.Is(stop, sshsig.ErrNotAllowed) || !strings.Contains(stop.Error(), "expired") {
		t.Fatalf("stop = %v, want %s refused: key expired", stop, late)
	}
}

// A commit rewritten with its signature kept (the message changed) is a
// new object whose signature no longer matches it.
func TestTamperedCommit(t *testing.T) {
	w := newWork(t)
	key, pub := w.key("alice")
	w.write("hosts/web1/hello.service", "[Service]\nExecStart=/bin/true\n", false)
	orig := w.commit(key, "harmless")
	gr, err := git.PlainOpen(w.path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := gr.CommitObject(orig)
	if err != nil {
		t.Fatal(err)
	}
	c.Message = "harmless, honest\n"
	o := gr.Storer.NewEncodedObject()
	if err := c.Encode(o); err != nil {
		t.Fatal(err)
	}
	forged, err := gr.Storer.SetEncodedObject(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Storer.SetReference(plumbing.NewHashReference("refs/heads/main", forged)); err != nil {
		t.Fatal(err)
	}
	as := signers(t, "alice@example.com "+pub)
	r, tip := w.mirror()
	if tip != forged {
		t.Fatalf("tip %s, want the forged %s", tip, forged)
	}
	fc, err := r.Commit(tip)
	if err != nil {
		t.Fatal(err)
	}
	if fc.PGPSignature == "" {
		t.Fatal("the forged commit lost its signature")
	}
	if _, err := Verify(fc, as); !errors.Is(err, sshsig.ErrInvalid) || !strings.Contains(err.Error(), short(forged)) {
		t.Fatalf("Verify(forged) = %v, want a bad signature naming %s", err, short(forged))
	}
	oc, err := gr.CommitObject(orig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(oc, as); err != nil {
		t.Fatalf("the original commit: %v", err)
	}
}

func TestForcePushIsNotAFastForward(t *testing.T) {
	w := newWork(t)
	key, _ := w.key("alice")
	c1 := w.commit(key, "one")
	c2 := w.commit(key, "two")
	r, tip := w.mirror()
	if cs, err := r.NewCommits(c1, tip); err != nil || !slices.Equal(hashes(cs), []plumbing.Hash{c2}) {
		t.Fatalf("NewCommits(c1, c2) = %v, %v", hashes(cs), err)
	}
	// The branch rewritten: c2 dropped, c3 in its place.
	w.git(nil, "reset", "-q", "--hard", c1.String())
	c3 := w.commit(key, "three, rewritten")
	tip, err := r.Fetch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if tip != c3 {
		t.Fatalf("tip %s after the rewrite, want %s", tip, c3)
	}
	_, err = r.NewCommits(c2, tip)
	if !errors.Is(err, ErrNotFastForward) || !strings.Contains(err.Error(), short(c2)) || !strings.Contains(err.Error(), short(c3)) {
		t.Fatalf("NewCommits(c2, c3) = %v, want ErrNotFastForward naming both", err)
	}
	if err := r.FastForward(c2, tip); !errors.Is(err, ErrNotFastForward) {
		t.Fatalf("FastForward(c2, c3) = %v", err)
	}
	// Reset back to an older commit: not forward either.
	w.git(nil, "reset", "-q", "--hard", c1.String())
	if tip, err = r.Fetch(context.Background()); err != nil || tip != c1 {
		t.Fatalf("fetch: %s, %v", tip, err)
	}
	if _, err := r.NewCommits(c3, c1); !errors.Is(err, ErrNotFastForward) {
		t.Fatalf("NewCommits(c3, c1) = %v, want ErrNotFastForward", err)
	}
	if err := r.FastForward(c1, c3); err != nil {
		t.Fatalf("FastForward(c1, c3) = %v", err)
	}
}

// A merge brings a branch that forked before the commit last mirrored:
// its commits are new, the fork point is not.
func TestMergeNewCommits(t *testing.T) {
	w := newWork(t)
	key, pub := w.key("alice")
	c1 := w.commit(key, "one")
	w.git(nil, "checkout", "-q", "-b", "topic")
	b1 := w.commit(key, "on the branch")
	w.git(nil, "checkout", "-q", "main")
	c2 := w.commit(key, "two")
	r, _ := w.mirror()
	w.git(nil, "-c", "gpg.format=ssh", "-c", "user.signingkey="+key, "merge", "-q", "-S", "--no-ff", "-m", "merge topic", "topic")
	m := plumbing.NewHash(w.git(nil, "rev-parse", "HEAD"))
	tip, err := r.Fetch(context.Background())
	if err != nil || tip != m {
		t.Fatalf("fetch: %s, %v", tip, err)
	}
	cs, err := r.NewCommits(c2, tip)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hashes(cs), []plumbing.Hash{b1, m}; !slices.Equal(got, want) {
		t.Fatalf("NewCommits = %v, want %v (not %s, older)", got, want, c1)
	}
	if _, stop := VerifyRange(cs, signers(t, "alice@example.com "+pub)); stop != nil {
		t.Fatal(stop)
	}
}

func TestVerifyTip(t *testing.T) {
	w := newWork(t)
	key, pub := w.key("alice")
	start := w.commit(key, "start")
	w.commit("", "unsigned, in between")
	tip := w.commit(key, "tip")
	r, _ := w.mirror()
	as := signers(t, "alice@example.com "+pub)
	v, err := r.VerifyTip(tip, start, as)
	if err != nil || v.Commit.Hash != tip {
		t.Fatalf("VerifyTip = %v, %v", v, err)
	}
	if _, err := r.VerifyTip(tip, plumbing.ZeroHash, as); err == nil {
		t.Fatal("VerifyTip without a start commit passed")
	}
	unsigned := w.commit("", "unsigned tip")
	r, _ = w.mirror()
	if _, err := r.VerifyTip(unsigned, start, as); !errors.Is(err, ErrUnsigned) {
		t.Fatalf("VerifyTip(unsigned tip) = %v", err)
	}
}

func TestOpenRefusesAnotherURL(t *testing.T) {
	w := newWork(t)
	w.commit("", "one")
	w.mirror()
	if _, err := Open(context.Background(), "file:///elsewhere", "main", w.dir+"/clone"); err == nil || !strings.Contains(err.Error(), "elsewhere") {
		t.Fatalf("Open with another URL = %v", err)
	}
}
