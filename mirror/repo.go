package mirror

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/transport"
)

// remoteName is the remote of the bare clone: the one repository it mirrors.
const remoteName = "origin"

// ErrNotFastForward is wrapped by a NotFastForwardError: the branch was
// rewritten (force push, reset) and its tip no longer descends from the
// commit last mirrored. The mirror refuses it whole: a rewrite would drop
// changes the registry's history holds as applied, and nobody's signature
// says which side is right.
var ErrNotFastForward = errors.New("not a fast-forward")

// NotFastForwardError names both commits of a refused move of the branch.
type NotFastForwardError struct {
	Last, Tip plumbing.Hash
	Why       string // "" or a detail ("last is not in the repository")
}

func (e *NotFastForwardError) Error() string {
	s := fmt.Sprintf("%s → %s is %s: %s does not descend from %s, the commit last mirrored (was the branch force-pushed or reset?)",
		short(e.Last), short(e.Tip), ErrNotFastForward, short(e.Tip), short(e.Last))
	if e.Why != "" {
		s += ": " + e.Why
	}
	return s
}

func (e *NotFastForwardError) Unwrap() error { return ErrNotFastForward }

// Repo is a bare clone of one branch of one repository, kept in a directory
// so that each fetch brings only what is new. Not safe for concurrent use.
type Repo struct {
	url, branch string
	git         *git.Repository
	auth        transport.AuthMethod

	// known caches the ancestors of one commit (the last one mirrored):
	// NewCommits needs them to exclude what is old, and the next call
	// usually asks from the tip this one reached.
	known struct {
		of  plumbing.Hash
		set map[plumbing.Hash]struct{}
	}
}

// Option configures Open.
type Option func(*Repo)

// WithAuth sets how to authenticate to the remote (go-git's ssh or http
// auth methods). Without it go-git's defaults apply: for ssh, the
// ssh-agent and ~/.ssh/known_hosts.
func WithAuth(a transport.AuthMethod) Option { return func(r *Repo) { r.auth = a } }

// Open opens the bare clone in dir, or clones url's branch into it when dir
// holds no repository yet (an empty or missing directory). A dir that
// mirrors another URL is refused: its objects and its remote-tracking ref
// belong to that one. Open does not fetch an existing clone; Fetch does.
func Open(ctx context.Context, url, branch, dir string, opts ...Option) (*Repo, error) {
	if branch == "" {
		return nil, errors.New("mirror: empty branch name")
	}
	ref := plumbing.NewBranchReferenceName(branch)
	if err := ref.Validate(); err != nil {
		return nil, fmt.Errorf("mirror: branch %q: %w", branch, err)
	}
	r := &Repo{url: url, branch: branch}
	for _, o := range opts {
		o(r)
	}
	gr, err := git.PlainOpen(dir)
	switch {
	case errors.Is(err, git.ErrRepositoryNotExists):
		gr, err = git.PlainCloneContext(ctx, dir, true, &git.CloneOptions{
			URL: url, Auth: r.auth, RemoteName: remoteName,
			ReferenceName: ref, SingleBranch: true, Tags: git.NoTags,
		})
		if err != nil {
			return nil, fmt.Errorf("mirror: clone %s (branch %s) into %s: %w", url, branch, dir, err)
		}
	case err != nil:
		return nil, fmt.Errorf("mirror: open %s: %w", dir, err)
	default:
		rem, err := gr.Remote(remoteName)
		if err != nil {
			return nil, fmt.Errorf("mirror: %s: %w (not a clone agentd made: remove it)", dir, err)
		}
		if urls := rem.Config().URLs; !slices.Equal(urls, []string{url}) {
			return nil, fmt.Errorf("mirror: %s mirrors %v, not %s: use another directory, or remove it", dir, urls, url)
		}
	}
	r.git = gr
	return r, nil
}

// tracking is where the clone keeps the remote branch's tip.
func (r *Repo) tracking() plumbing.ReferenceName {
	return plumbing.NewRemoteReferenceName(remoteName, r.branch)
}

// Fetch brings the branch's new commits and returns its tip. The refspec
// forces the remote-tracking ref: a rewritten branch must be seen, so that
// NewCommits can refuse it by name, not hidden by a failed fetch.
func (r *Repo) Fetch(ctx context.Context) (plumbing.Hash, error) {
	spec := config.RefSpec(fmt.Sprintf("+%s:%s", plumbing.NewBranchReferenceName(r.branch), r.tracking()))
	err := r.git.FetchContext(ctx, &git.FetchOptions{
		RemoteName: remoteName, RefSpecs: []config.RefSpec{spec},
		Auth: r.auth, Tags: git.NoTags, Force: true,
	})
	if err != nil && !errors.Is(err, git.NoErrAlreadyUpToDate) {
		return plumbing.ZeroHash, fmt.Errorf("fetch %s (branch %s): %w", r.url, r.branch, err)
	}
	ref, err := r.git.Reference(r.tracking(), true)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("fetch %s: branch %s: %w", r.url, r.branch, err)
	}
	return ref.Hash(), nil
}

// Commit reads one commit of the clone.
func (r *Repo) Commit(h plumbing.Hash) (*object.Commit, error) {
	c, err := r.git.CommitObject(h)
	if err != nil {
		return nil, fmt.Errorf("commit %s: %w", short(h), err)
	}
	return c, nil
}

// NewCommits lists every commit reachable from tip and not from last,
// oldest first (parents before children; a merge's first parent's line
// before the branch it merges), so that each can be verified and applied
// in order. last is the commit last mirrored; the zero hash means none yet
// (the whole history is new). tip must descend from last, else the error
// wraps ErrNotFastForward; tip == last is no new commit.
func (r *Repo) NewCommits(last, tip plumbing.Hash) ([]*object.Commit, error) {
	if tip.IsZero() {
		return nil, errors.New("new commits: no tip")
	}
	if last == tip {
		return nil, nil
	}
	var old map[plumbing.Hash]struct{}
	if !last.IsZero() {
		var err error
		if old, err = r.ancestors(last); errors.Is(err, plumbing.ErrObjectNotFound) {
			return nil, &NotFastForwardError{Last: last, Tip: tip, Why: short(last) + " is not in the repository"}
		} else if err != nil {
			return nil, err
		}
	}
	tc, err := r.Commit(tip)
	if err != nil {
		return nil, err
	}
	// Depth-first, post-order, without recursion (histories are long):
	// a commit is listed once all its new parents are.
	type frame struct {
		c    *object.Commit
		next int
	}
	var order []*object.Commit
	seen := map[plumbing.Hash]bool{tip: true}
	reached := last.IsZero()
	stack := []frame{{c: tc}}
	for len(stack) > 0 {
		f := &stack[len(stack)-1]
		if f.next == len(f.c.ParentHashes) {
			order = append(order, f.c)
			stack = stack[:len(stack)-1]
			continue
		}
		p := f.c.ParentHashes[f.next]
		f.next++
		if p == last {
			reached = true
		}
		if _, ok := old[p]; ok || seen[p] {
			continue
		}
		seen[p] = true
		pc, err := r.Commit(p)
		if err != nil {
			return nil, err
		}
		stack = append(stack, frame{c: pc})
	}
	if !reached {
		return nil, &NotFastForwardError{Last: last, Tip: tip}
	}
	// The ancestors of tip are those of last and the new ones: the next
	// call, from tip, starts from there.
	if old == nil {
		old = map[plumbing.Hash]struct{}{}
	}
	for _, c := range order {
		old[c.Hash] = struct{}{}
	}
	r.known.of, r.known.set = tip, old
	return order, nil
}

// ancestors is the set of commits reachable from h, h included. It walks
// the whole history once and is then cached for h: the walk from a new tip
// must stop at every old commit, not only at h (a merge can bring a branch
// that forked before h).
func (r *Repo) ancestors(h plumbing.Hash) (map[plumbing.Hash]struct{}, error) {
	if r.known.of == h && r.known.set != nil {
		return copySet(r.known.set), nil
	}
	set := map[plumbing.Hash]struct{}{h: {}}
	todo := []plumbing.Hash{h}
	for len(todo) > 0 {
		n := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		c, err := r.git.CommitObject(n)
		if err != nil {
			return nil, fmt.Errorf("commit %s: %w", short(n), err)
		}
		for _, p := range c.ParentHashes {
			if _, ok := set[p]; !ok {
				set[p] = struct{}{}
				todo = append(todo, p)
			}
		}
	}
	r.known.of, r.known.set = h, set
	return copySet(set), nil
}

// copySet copies a set: NewCommits extends the copy it is given.
func copySet(s map[plumbing.Hash]struct{}) map[plumbing.Hash]struct{} {
	c := make(map[plumbing.Hash]struct{}, len(s)+64)
	for k := range s {
		c[k] = struct{}{}
	}
	return c
}

// FastForward checks that tip descends from last (or is last), as
// NewCommits does, without listing the commits between: for --verify=tip.
// The zero last (nothing mirrored yet) accepts any tip.
func (r *Repo) FastForward(last, tip plumbing.Hash) error {
	if last.IsZero() || last == tip {
		return nil
	}
	lc, err := r.git.CommitObject(last)
	if errors.Is(err, plumbing.ErrObjectNotFound) {
		return &NotFastForwardError{Last: last, Tip: tip, Why: short(last) + " is not in the repository"}
	} else if err != nil {
		return fmt.Errorf("commit %s: %w", short(last), err)
	}
	tc, err := r.Commit(tip)
	if err != nil {
		return err
	}
	ok, err := lc.IsAncestor(tc)
	if err != nil {
		return fmt.Errorf("is %s an ancestor of %s: %w", short(last), short(tip), err)
	}
	if !ok {
		return &NotFastForwardError{Last: last, Tip: tip}
	}
	return nil
}

// short is a commit's SHA as people quote it: 12 hex digits.
func short(h plumbing.Hash) string { return h.String()[:12] }
