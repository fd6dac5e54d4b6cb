package mirror

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/agentd/agentd/sshsig"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"golang.org/x/crypto/ssh"
)

// BenchmarkVerify1000Commits is the cost of a push of 1,000 commits: list
// them (NewCommits) and verify each signature (VerifyRange), from a bare
// repository on disk as the mirror keeps it. The commits are written with
// go-git and signed with sshsig.Sign, as git with gpg.format=ssh signs
// them (the tests against the git binary show the two agree).
func BenchmarkVerify1000Commits(b *testing.B) {
	const n = 1000
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		b.Fatal(err)
	}
	as := signers(b, "alice@example.com "+string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	gr, err := git.PlainInit(b.TempDir(), true)
	if err != nil {
		b.Fatal(err)
	}
	store := func(o interface {
		Encode(plumbing.EncodedObject) error
	}) plumbing.Hash {
		eo := gr.Storer.NewEncodedObject()
		if err := o.Encode(eo); err != nil {
			b.Fatal(err)
		}
		h, err := gr.Storer.SetEncodedObject(eo)
		if err != nil {
			b.Fatal(err)
		}
		return h
	}
	var parent plumbing.Hash
	when := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		blob := gr.Storer.NewEncodedObject()
		blob.SetType(plumbing.BlobObject)
		wr, _ := blob.Writer()
		fmt.Fprintf(wr, "[Service]\nExecStart=/bin/echo %d\n", i)
		wr.Close()
		bh, err := gr.Storer.SetEncodedObject(blob)
		if err != nil {
			b.Fatal(err)
		}
		web1 := store(&object.Tree{Entries: []object.TreeEntry{{Name: "hello.service", Mode: filemode.Regular, Hash: bh}}})
		hosts := store(&object.Tree{Entries: []object.TreeEntry{{Name: "web1", Mode: filemode.Dir, Hash: web1}}})
		root := store(&object.Tree{Entries: []object.TreeEntry{{Name: "hosts", Mode: filemode.Dir, Hash: hosts}}})
		sig := object.Signature{Name: "Alice", Email: "alice@example.com", When: when.Add(time.Duration(i) * time.Minute)}
		c := &object.Commit{Author: sig, Committer: sig, TreeHash: root, Message: fmt.Sprintf("change %d\n", i)}
		if !parent.IsZero() {
			c.ParentHashes = []plumbing.Hash{parent}
		}
		msg, err := payload(c)
		if err != nil {
			b.Fatal(err)
		}
		armored, err := sshsig.Sign(signer, Namespace, msg)
		if err != nil {
			b.Fatal(err)
		}
		c.PGPSignature = string(armored)
		parent = store(c)
	}
	r := &Repo{git: gr, branch: "main"}
	b.ResetTimer()
	for b.Loop() {
		r.known.of, r.known.set = plumbing.ZeroHash, nil
		cs, err := r.NewCommits(plumbing.ZeroHash, parent)
		if err != nil {
			b.Fatal(err)
		}
		good, stop := VerifyRange(cs, as)
		if stop != nil || len(good) != n {
			b.Fatalf("%d good, stop %v", len(good), stop)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/commit")
}
