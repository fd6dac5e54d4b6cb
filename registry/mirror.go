package registry

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/rollout"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Mirrors: git as the source of truth (`agentd mirror`, issue 35).
//
// A mirror copies one branch of one git repository into the registry, one
// commit per registry revision. Its keys:
//
//	<p>/mirror/<name>/state        JSON MirrorState: the last commit mirrored, the last one refused
//	<p>/mirror/<name>/election/    the election of its leader among its replicas (concurrency.Election, lease-bound)
//	<p>/mirror/<name>/sync         JSON SyncRequest: a one-shot request to sync now, consumed (deleted) by the leader
//	<p>/mirror/owners/<target>     JSON {name,url,branch}: the mirror that owns the target ("groups/web", "hosts/h1")
//	<p>/mirror/holds/<name>        JSON {commit,parent,targets}: a commit over etcd's limits being written (mirror_chunks.go); agents read it
//
// A target is owned while the tree of the last mirrored commit holds it.
// Put and Remove (and so `unit revert`) refuse to write to an owned target
// (an error wrapping ErrMirrored, a *MirroredError) unless Force is given:
// the forced write is recorded in the key's history as drift from git, and
// the mirror's next commit puts git's content back. The refusal reads the
// owner key and guards the write on it, so a mirror taking the target in
// between makes the write read again.
//
// ApplyCommit writes one commit in one transaction: the keys of every
// target it changes, each with its history record (who: the commit and its
// signer; why: its subject), the owners and the state, guarded by the
// state's commit being the commit's parent (ErrMirrorMoved otherwise: a
// reset, or another replica), by the keys being unchanged since read, and
// by the leader's election key when the caller leads (ErrNotLeader).
//
// The mirror runs with an operator's credentials (it writes every target
// it owns and their history); agents read and write nothing under
// <p>/mirror/ (AgentPermissions grants nothing there) but the holds,
// which they read. An operator role
// that may Put needs read access to <p>/mirror/owners/.

var (
	// ErrMirrorMoved: ApplyCommit found the mirror's state at another
	// commit than the commit's parent (reset, or written by another
	// replica). Nothing was written: read the state again.
	ErrMirrorMoved = errors.New("the mirror's state moved")
	// ErrNotLeader: the write was guarded by a MirrorLeader whose
	// leadership is lost. Nothing was written.
	ErrNotLeader = errors.New("no longer the mirror's leader")
	// ErrMirrored is wrapped by a MirroredError: a write to a target a
	// mirror owns, without Force. Nothing was written.
	ErrMirrored = errors.New("owned by a git mirror")
)

// MirrorState is what the registry keeps of a mirror: the last commit it
// mirrored and the last it refused.
type MirrorState struct {
	Name, URL, Branch string
	Commit            string    // last mirrored commit (40 hex), "" before the first
	Signer            string    // its signer, as "principal SHA256:…"
	Author            string    // "Name <email>"
	Subject           string    // its subject; for a reset, "reset by <who> to <sha12>"
	At                time.Time // when it was written
	// Revision is the registry revision of the write of Commit (filled on
	// read; kept when only Refused changes since).
	Revision int64          `json:",omitempty"`
	Refused  *MirrorRefusal `json:",omitempty"` // the last refused commit, cleared by the next good one
	// Rollouts are the rollouts Commit started (mirror_rollouts.go).
	Rollouts []MirrorRollout `json:",omitempty"`
}

// MirrorRefusal is a commit the mirror refused (unsigned, not a
// fast-forward, not rendered, over the mass-delete guard, …).
type MirrorRefusal struct {
	Commit, Author, Reason string
	At                     time.Time
}

// MirroredError: a write to a target owned by a mirror, without Force.
type MirroredError struct {
	Target              Target
	Mirror, URL, Branch string
}

func (e *MirroredError) Error() string {
	return fmt.Sprintf("owned by mirror %q (%s %s): change it in git, or --force (recorded as drift; the next commit puts git's content back)",
		e.Mirror, e.URL, e.Branch)
}

func (e *MirroredError) Unwrap() error { return ErrMirrored }

// Force makes Put and Remove write to a target a mirror owns (see
// MirroredError): the history record's reason says it was forced over the
// mirror, as drift from git.
func Force() WriteOption { return func(o *writeOptions) { o.force = true } }

// mirrorOwner is the JSON value of an owner key.
type mirrorOwner struct {
	Name   string `json:"name"`
	URL    string `json:"url"`
	Branch string `json:"branch"`
}

func (c *Client) mirrorRoot() string                { return c.prefix + "/mirror/" }
func (c *Client) mirrorStateKey(name string) string { return c.mirrorRoot() + name + "/state" }
func (c *Client) mirrorElection(name string) string { return c.mirrorRoot() + name + "/election" }
func (c *Client) mirrorSyncKey(name string) string  { return c.mirrorRoot() + name + "/sync" }
func (c *Client) ownersRoot() string                { return c.mirrorRoot() + "owners/" }
func (c *Client) ownerKey(t Target) string          { return c.ownersRoot() + t.String() }

// ownerTarget is the target of an owner key; ok is false for another key.
func (c *Client) ownerTarget(key string) (Target, bool) {
	rest, ok := strings.CutPrefix(key, c.ownersRoot())
	if !ok {
		return Target{}, false
	}
	var t Target
	if h, ok := strings.CutPrefix(rest, "hosts/"); ok {
		t.Host = h
	} else if g, ok := strings.CutPrefix(rest, "groups/"); ok {
		t.Group = g
	}
	return t, t.Validate() == nil
}

// validMirrorName checks a mirror's name: a key segment like a group's,
// other than "owners" and "holds".
func validMirrorName(name string) error {
	if err := ValidateName("mirror", name); err != nil {
		return err
	}
	if name == "owners" || name == "holds" {
		return fmt.Errorf("%w mirror name %q: reserved", ErrInvalid, name)
	}
	return nil
}

// validCommit checks a full commit ID: 40 lower-case hex digits.
func validCommit(what, sha string) error {
	if _, err := hex.DecodeString(sha); err != nil || len(sha) != 40 || strings.ToLower(sha) != sha {
		return fmt.Errorf("%w %s %q: not a full commit ID (40 lower-case hex digits)", ErrInvalid, what, sha)
	}
	return nil
}

func short(sha string) string { return sha[:min(12, len(sha))] }

// oneLine makes s a valid reason (ValidateReason): valid UTF-8, control
// characters as spaces, at most MaxReasonBytes.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	for len(s) > MaxReasonBytes {
		_, n := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-n]
	}
	return s
}

// guardOwner refuses a write to a target a mirror owns, unless forced
// (then the reason records the drift), and guards the write on the owner
// key as read. A write by the mirror itself is ApplyCommit's, which
// guards the owners itself.
func (w *writeTxn) guardOwner(ctx context.Context) error {
	if w.o.mirror {
		return nil
	}
	key := w.c.ownerKey(w.target)
	resp, err := w.c.cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("read %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		w.guard(clientv3.Compare(clientv3.ModRevision(key), "=", 0))
		return nil
	}
	kv := resp.Kvs[0]
	var own mirrorOwner
	if err := json.Unmarshal(kv.Value, &own); err != nil {
		return fmt.Errorf("read %s: not an owner record: %w", key, err)
	}
	w.guard(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision))
	if !w.o.force {
		return &MirroredError{Target: w.target, Mirror: own.Name, URL: own.URL, Branch: own.Branch}
	}
	drift := fmt.Sprintf("forced over mirror %s (%s): drift from git", own.Name, own.URL)
	if w.o.reason != "" {
		drift = w.o.reason + "; " + drift
	}
	w.o.reason = oneLine(drift)
	return nil
}

// MirrorOwner says which mirror owns t, if any.
func (c *Client) MirrorOwner(ctx context.Context, t Target) (name, url string, ok bool, err error) {
	if err := t.Validate(); err != nil {
		return "", "", false, fmt.Errorf("mirror owner: %w", err)
	}
	key := c.ownerKey(t)
	resp, err := c.cli.Get(ctx, key)
	if err != nil {
		return "", "", false, fmt.Errorf("read %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return "", "", false, nil
	}
	var own mirrorOwner
	if err := json.Unmarshal(resp.Kvs[0].Value, &own); err != nil {
		return "", "", false, fmt.Errorf("read %s: not an owner record: %w", key, err)
	}
	return own.Name, own.URL, true, nil
}

// MirrorState reads the state of mirror name; ok is false when it has
// none (never mirrored, refused or reset).
func (c *Client) MirrorState(ctx context.Context, name string) (MirrorState, bool, error) {
	if err := validMirrorName(name); err != nil {
		return MirrorState{}, false, err
	}
	st, modRev, err := c.readMirrorState(ctx, name)
	return st, modRev != 0, err
}

// readMirrorState reads the state of mirror name and its ModRevision
// (0: absent; the state then has Name only).
func (c *Client) readMirrorState(ctx context.Context, name string) (MirrorState, int64, error) {
	key := c.mirrorStateKey(name)
	resp, err := c.cli.Get(ctx, key)
	if err != nil {
		return MirrorState{}, 0, fmt.Errorf("read %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return MirrorState{Name: name}, 0, nil
	}
	return decodeMirrorState(resp.Kvs[0])
}

func decodeMirrorState(kv *mvccpb.KeyValue) (MirrorState, int64, error) {
	var st MirrorState
	if err := json.Unmarshal(kv.Value, &st); err != nil {
		return MirrorState{}, 0, fmt.Errorf("read %s: not a mirror state: %w", kv.Key, err)
	}
	if st.Revision == 0 {
		st.Revision = kv.ModRevision
	}
	return st, kv.ModRevision, nil
}

// updateMirrorState changes the state of mirror name with change, as
// read, and writes it back unless it changed in between (then it reads
// again).
func (c *Client) updateMirrorState(ctx context.Context, name string, change func(*MirrorState)) error {
	key := c.mirrorStateKey(name)
	for range 10 {
		st, modRev, err := c.readMirrorState(ctx, name)
		if err != nil {
			return err
		}
		change(&st)
		b, err := json.Marshal(st)
		if err != nil {
			return err
		}
		resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, string(b))).Commit()
		if err != nil {
			return fmt.Errorf("write %s: %w", key, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("write %s: it keeps changing; nothing written, retry", key)
}

// RefuseCommit records r as the last commit mirror name refused (r.At
// defaults to now). The state is created, with Name only, when there is
// none; the rest of it stays.
func (c *Client) RefuseCommit(ctx context.Context, name string, r MirrorRefusal) error {
	if err := validMirrorName(name); err != nil {
		return err
	}
	if r.At.IsZero() {
		r.At = time.Now()
	}
	r.At = r.At.UTC()
	return c.updateMirrorState(ctx, name, func(st *MirrorState) {
		// Revision was filled on read: kept, it stays the revision of
		// the commit's write, not of this one.
		st.Refused = &r
	})
}

// ResetMirror sets the commit mirror name holds to to (a full commit ID),
// so that its next fetch mirrors the commits after it; who did it is
// recorded in the state (Subject "reset by <who> to <sha12>", Author who).
// Nothing else changes: the registry's units stay as they are until the
// next commit is mirrored. A leader's ApplyCommit based on the commit
// before fails with ErrMirrorMoved.
func (c *Client) ResetMirror(ctx context.Context, name, to, who string) error {
	if err := validMirrorName(name); err != nil {
		return err
	}
	if err := validCommit("commit", to); err != nil {
		return fmt.Errorf("reset mirror %s: %w", name, err)
	}
	return c.updateMirrorState(ctx, name, func(st *MirrorState) {
		st.Commit, st.Signer, st.Author = to, "", oneLine(who)
		st.Subject = oneLine(fmt.Sprintf("reset by %s to %s", who, short(to)))
		st.At, st.Revision = time.Now().UTC(), 0 // the revision of this write, on read
		st.Rollouts = nil
	})
}

// MirrorTree returns the unit keys (key suffix → value) of every target
// mirror name owns now, by target (an owned target without keys maps to
// an empty map), read at one revision.
func (c *Client) MirrorTree(ctx context.Context, name string) (map[Target]map[string][]byte, error) {
	if err := validMirrorName(name); err != nil {
		return nil, err
	}
	resp, err := c.cli.Get(ctx, c.ownersRoot(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", c.ownersRoot(), err)
	}
	tree := map[Target]map[string][]byte{}
	for _, kv := range resp.Kvs {
		var own mirrorOwner
		t, ok := c.ownerTarget(string(kv.Key))
		if ok && json.Unmarshal(kv.Value, &own) == nil && own.Name == name {
			tree[t] = map[string][]byte{}
		}
	}
	owned := slices.SortedFunc(maps.Keys(tree), compareTargets)
	for chunk := range slices.Chunk(owned, maxTxnOps) {
		ops := make([]clientv3.Op, len(chunk))
		for i, t := range chunk {
			ops[i] = clientv3.OpGet(c.targetUnits(t), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision))
		}
		r, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("read the targets of mirror %s: %w", name, err)
		}
		for i, t := range chunk {
			for _, kv := range r.Responses[i].GetResponseRange().GetKvs() {
				tree[t][strings.TrimPrefix(string(kv.Key), c.targetUnits(t))] = kv.Value
			}
		}
	}
	return tree, nil
}

func compareTargets(a, b Target) int { return strings.Compare(a.String(), b.String()) }

// MirrorCommit is one commit for ApplyCommit.
type MirrorCommit struct {
	Name, URL, Branch string
	// Parent is the commit the state must hold now ("" for the first):
	// the write is refused (ErrMirrorMoved) otherwise.
	Parent                          string
	Commit, Signer, Author, Subject string
	Puts                            map[Target]map[string][]byte
	Deletes                         map[Target][]string
	// Owned is every target the commit's tree holds: their ownership is
	// recorded or kept; the owners (of this mirror) of the other targets
	// are removed.
	Owned []Target
	// Leader, when set, guards the write: ErrNotLeader when its
	// leadership is lost.
	Leader *MirrorLeader
	// Rollouts, by group, stage the commit's writes to those groups as
	// rollouts (mirror_rollouts.go); a group not in it is written at once.
	Rollouts map[string]*rollout.Record
}

// who is the history record's "who" of the commit's keys.
func (mc MirrorCommit) who() string {
	who := fmt.Sprintf("git %s %s", short(mc.Commit), mc.Author)
	if mc.Signer != "" {
		who += ", signed by " + mc.Signer
	}
	return oneLine(who)
}

// names it in errors: "mirror default: commit 0123456789ab".
func (mc MirrorCommit) String() string {
	return fmt.Sprintf("mirror %s: commit %s", mc.Name, short(mc.Commit))
}

func (mc MirrorCommit) validate() error {
	if err := validMirrorName(mc.Name); err != nil {
		return err
	}
	if err := validCommit("commit", mc.Commit); err != nil {
		return fmt.Errorf("mirror %s: %w", mc.Name, err)
	}
	if mc.Parent != "" {
		if err := validCommit("parent", mc.Parent); err != nil {
			return fmt.Errorf("%s: %w", mc, err)
		}
	}
	for _, t := range mc.Owned {
		if err := t.Validate(); err != nil {
			return fmt.Errorf("%s: owned: %w", mc, err)
		}
	}
	if err := mc.validateRollouts(); err != nil {
		return err
	}
	for t, dels := range mc.Deletes {
		for _, d := range dels {
			if _, ok := mc.Puts[t][d]; ok {
				return fmt.Errorf("%s: %w: %s%s both put and deleted", mc, ErrInvalid, t, "/"+d)
			}
		}
	}
	return nil
}

// ApplyCommit writes one commit of a mirror in ONE etcd transaction and
// returns its revision: the puts and deletes of every target (a delete of
// a key already absent is left out), one history record per key (who:
// "git <sha12> <Author>, signed by <Signer>", why: the subject), the
// group halts the new content clears (as Put and Remove do), the owners
// (mc.Owned) and the state (Refused cleared). It is guarded by the state
// holding mc.Parent (else ErrMirrorMoved), by mc.Leader when set (else
// ErrNotLeader), and by the keys and owners being unchanged since read
// (then it reads again). A target another mirror owns is refused
// (ErrMirrored). An empty commit (no puts, no deletes) still moves the
// state.
//
// A commit over etcd's limits (MaxTxnOps, MaxRequestBytes, or the
// server's own when lower) is written in chunks behind a hold that keeps
// the hosts it covers where they were until its last transaction
// (mirror_chunks.go); a hold left by a mirror that stopped is taken over
// and finished. A small commit still goes in one transaction, and removes
// a hold left there.
func (c *Client) ApplyCommit(ctx context.Context, mc MirrorCommit) (int64, error) {
	if err := mc.validate(); err != nil {
		return 0, err
	}
	o, err := c.resolveWriteOptions(ctx, []WriteOption{StoredBy(mc.who()), WithReason(oneLine(mc.Subject))})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", mc, err)
	}
	o.mirror = true
	for range 10 {
		x, keys, err := c.commitTxn(ctx, mc, o)
		if err != nil {
			return 0, err
		}
		what := LimitError{Op: "put", Keys: keys, Write: fmt.Sprintf("commit %s (%q) of mirror %s", short(mc.Commit), oneLine(mc.Subject), mc.Name)}
		if checkTxnLimits(x, what) != nil {
			return c.applyChunked(ctx, mc, o) // mirror_chunks.go
		}
		resp, err := x.commit(ctx, c.cli)
		if err != nil {
			if serverLimit(err, x, what) != nil {
				return c.applyChunked(ctx, mc, o)
			}
			return 0, fmt.Errorf("%s: %w", mc, err)
		}
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		// The state, the leader, a key, an owner or a halt changed in
		// between: read again (the next read says which).
	}
	return 0, fmt.Errorf("%s: its keys keep changing; nothing written, retry", mc)
}

// commitTxn composes the transaction of ApplyCommit from what the
// registry holds now, and counts the unit keys it writes.
func (c *Client) commitTxn(ctx context.Context, mc MirrorCommit, o writeOptions) (*txn, int, error) {
	x := &txn{}
	next, err := c.guardMirrorState(ctx, x, mc, o.now().UTC())
	if err != nil {
		return nil, 0, err
	}
	all := maps.Clone(mc.Puts)
	if all == nil {
		all = map[Target]map[string][]byte{}
	}
	for t := range mc.Deletes {
		if _, ok := all[t]; !ok {
			all[t] = nil
		}
	}
	keys, written := 0, map[Target]bool{}
	for _, t := range slices.SortedFunc(maps.Keys(all), compareTargets) {
		ws, err := c.commitTarget(ctx, t, mc.Puts[t], mc.Deletes[t], mc.optionsFor(t, o))
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", mc, err)
		}
		next.Rollouts = append(next.Rollouts, stagedRollouts(ws)...)
		for _, w := range ws {
			x.guard(w.ifs...)
			x.then(w.ops...)
			keys += w.keys
			written[t] = true
		}
	}
	if err := c.guardOwners(ctx, x, mc, written); err != nil {
		return nil, 0, err
	}
	if err := c.putMirrorState(x, next); err != nil {
		return nil, 0, err
	}
	return x, keys, nil
}

// guardMirrorState checks that the state holds mc.Parent and, with
// mc.Leader, that it still leads; adds the guards that they still hold at
// commit, and returns the new state (putMirrorState writes it).
func (c *Client) guardMirrorState(ctx context.Context, x *txn, mc MirrorCommit, now time.Time) (MirrorState, error) {
	key := c.mirrorStateKey(mc.Name)
	ops := []clientv3.Op{clientv3.OpGet(key)}
	if mc.Leader != nil {
		ops = append(ops, clientv3.OpGet(mc.Leader.key))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return MirrorState{}, fmt.Errorf("%s: read %s: %w", mc, key, err)
	}
	st, modRev := MirrorState{}, int64(0)
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		if st, modRev, err = decodeMirrorState(kvs[0]); err != nil {
			return MirrorState{}, fmt.Errorf("%s: %w", mc, err)
		}
	}
	if mc.Leader != nil {
		kvs := resp.Responses[1].GetResponseRange().GetKvs()
		if len(kvs) == 0 || kvs[0].CreateRevision != mc.Leader.rev {
			return MirrorState{}, fmt.Errorf("%s: %w (%s); nothing written", mc, ErrNotLeader, mc.Leader.id)
		}
		x.guard(mc.Leader.Guard())
	}
	if st.Commit != mc.Parent {
		held := st.Commit
		if held == "" {
			held = "no commit"
		}
		return MirrorState{}, fmt.Errorf("%s: %w: the registry holds %s, the commit's parent is %s; nothing written", mc, ErrMirrorMoved, held, cmp.Or(mc.Parent, "none"))
	}
	x.guard(clientv3.Compare(clientv3.ModRevision(key), "=", modRev))
	if err := c.guardHold(ctx, x, mc); err != nil { // mirror_chunks.go
		return MirrorState{}, err
	}
	return MirrorState{Name: mc.Name, URL: mc.URL, Branch: mc.Branch, Commit: mc.Commit, Signer: mc.Signer,
		Author: mc.Author, Subject: mc.Subject, At: now}, nil
}

// putMirrorState adds the write of the new state st.
func (c *Client) putMirrorState(x *txn, st MirrorState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	x.then(clientv3.OpPut(c.mirrorStateKey(st.Name), string(b)))
	return nil
}

// commitTarget composes the writes of one target of a commit: its puts
// and its deletes (of the keys that exist), each as Put and Remove
// compose theirs.
func (c *Client) commitTarget(ctx context.Context, t Target, puts map[string][]byte, dels []string, o writeOptions) ([]*writeTxn, error) {
	putNames := slices.Sorted(maps.Keys(puts))
	names := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(putNames), dels...))))
	if len(names) == 0 {
		return nil, nil
	}
	if err := checkWrite(t, names, "write", "write to"); err != nil {
		return nil, err
	}
	if err := checkValues(t, puts); err != nil {
		return nil, fmt.Errorf("%s: %w", t, err)
	}
	st, _, err := c.readKeys(ctx, t, names, false)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t, err)
	}
	var ws []*writeTxn
	if len(putNames) > 0 {
		w := c.newWriteTxn("put", t, putNames, puts, subset(st, putNames), o)
		if err := w.compose(ctx, func(h reconcile.Halt) bool { return putClears(h, puts) }); err != nil {
			return nil, fmt.Errorf("put %s: %w", t, err)
		}
		ws = append(ws, w)
		o = o.forRemoval() // its deletes: a rollout of their own
	}
	var gone []string
	for _, d := range slices.Compact(slices.Sorted(slices.Values(dels))) {
		if st[d].modRev != 0 {
			gone = append(gone, d)
		}
	}
	if len(gone) > 0 {
		w := c.newWriteTxn("removal", t, gone, nil, subset(st, gone), o)
		clears := func(h reconcile.Halt) bool {
			return slices.ContainsFunc(gone, func(u string) bool { return partOf(u, h.Unit) })
		}
		if err := w.compose(ctx, clears); err != nil {
			return nil, fmt.Errorf("remove from %s: %w", t, err)
		}
		ws = append(ws, w)
	}
	return ws, nil
}

func subset(st map[string]*keyState, names []string) map[string]*keyState {
	out := make(map[string]*keyState, len(names))
	for _, n := range names {
		out[n] = st[n]
	}
	return out
}

// readOwners reads every owner record, by key, and encodes mc's own:
// what guardOwners and claimOwners compare.
func (c *Client) readOwners(ctx context.Context, mc MirrorCommit) (map[string]*mvccpb.KeyValue, []byte, error) {
	resp, err := c.cli.Get(ctx, c.ownersRoot(), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("%s: read %s: %w", mc, c.ownersRoot(), err)
	}
	cur := map[string]*mvccpb.KeyValue{}
	for _, kv := range resp.Kvs {
		cur[string(kv.Key)] = kv
	}
	b, err := json.Marshal(mirrorOwner{Name: mc.Name, URL: mc.URL, Branch: mc.Branch})
	return cur, b, err
}

// guardOwners adds the owner records of mc.Owned (written when new or
// changed) and the removal of this mirror's owners of the other targets,
// each guarded on its owner key as read. A target of mc.Owned or of
// written (the targets the commit writes keys of) that another mirror
// owns is refused.
func (c *Client) guardOwners(ctx context.Context, x *txn, mc MirrorCommit, written map[Target]bool) error {
	cur, b, err := c.readOwners(ctx, mc)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, t := range mc.Owned {
		key := c.ownerKey(t)
		if want[key] {
			continue // named twice
		}
		want[key] = true
		kv := cur[key]
		if kv == nil {
			x.guard(clientv3.Compare(clientv3.ModRevision(key), "=", 0))
			x.then(clientv3.OpPut(key, string(b)))
			continue
		}
		var own mirrorOwner
		if json.Unmarshal(kv.Value, &own) == nil && own.Name != mc.Name {
			return fmt.Errorf("%s: %s: %w", mc, t, &MirroredError{Target: t, Mirror: own.Name, URL: own.URL, Branch: own.Branch})
		}
		x.guard(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision))
		if string(kv.Value) != string(b) {
			x.then(clientv3.OpPut(key, string(b)))
		}
	}
	for _, key := range slices.Sorted(maps.Keys(cur)) {
		var own mirrorOwner
		if want[key] || json.Unmarshal(cur[key].Value, &own) != nil {
			continue
		}
		t, _ := c.ownerTarget(key)
		switch {
		case own.Name == mc.Name:
			x.guard(clientv3.Compare(clientv3.ModRevision(key), "=", cur[key].ModRevision))
			x.then(clientv3.OpDelete(key))
		case written[t]:
			// A target the commit writes but does not own (it leaves the
			// tree) that another mirror owns now.
			return fmt.Errorf("%s: %s: %w", mc, t, &MirroredError{Target: t, Mirror: own.Name, URL: own.URL, Branch: own.Branch})
		}
	}
	for t := range written {
		if key := c.ownerKey(t); cur[key] == nil && !want[key] {
			x.guard(clientv3.Compare(clientv3.ModRevision(key), "=", 0))
		}
	}
	return nil
}

// MirrorLeader is one replica's leadership of a mirror, won in an
// election at <p>/mirror/<name>/election/ on a lease of its own
// (concurrency.Session): the replica that lives longest leads, and the
// next one takes over when its lease is lost or it resigns.
type MirrorLeader struct {
	id   string
	sess *concurrency.Session
	el   *concurrency.Election
	// key and rev are the election key and its create revision, kept:
	// el forgets them on Resign.
	key string
	rev int64
}

// CampaignMirror blocks until the replica id leads mirror name, or ctx
// ends. Its leadership is bound to a lease of ttl (at least a second),
// kept alive until Resign or until it is lost (Done).
func (c *Client) CampaignMirror(ctx context.Context, name, id string, ttl time.Duration) (*MirrorLeader, error) {
	if err := validMirrorName(name); err != nil {
		return nil, err
	}
	if id == "" {
		return nil, fmt.Errorf("campaign for mirror %s: %w: empty replica id", name, ErrInvalid)
	}
	secs := max(int((ttl+time.Second-1)/time.Second), 1)
	sess, err := concurrency.NewSession(c.cli, concurrency.WithTTL(secs))
	if err != nil {
		return nil, fmt.Errorf("campaign for mirror %s: %w", name, err)
	}
	l := &MirrorLeader{id: id, sess: sess, el: concurrency.NewElection(sess, c.mirrorElection(name))}
	if err := l.el.Campaign(ctx, id); err != nil {
		l.close()
		return nil, fmt.Errorf("campaign for mirror %s: %w", name, err)
	}
	l.key, l.rev = l.el.Key(), l.el.Rev()
	// The election waits for the older candidates only: its own key may
	// have gone with its lease meanwhile.
	resp, err := c.cli.Get(ctx, l.key)
	switch {
	case err != nil:
		l.close()
		return nil, fmt.Errorf("campaign for mirror %s: %w", name, err)
	case len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != l.rev:
		l.close()
		return nil, fmt.Errorf("campaign for mirror %s: %w: the lease was lost while waiting", name, ErrNotLeader)
	}
	return l, nil
}

// close gives the lease back (the election key goes with it).
func (l *MirrorLeader) close() { _ = l.sess.Close() }

// ID is the leading replica's id (CampaignMirror's).
func (l *MirrorLeader) ID() string { return l.id }

// Done is closed when the leadership is lost: the lease expired or was
// revoked, or Resign.
func (l *MirrorLeader) Done() <-chan struct{} { return l.sess.Done() }

// Guard holds while the election key of this leadership stands.
func (l *MirrorLeader) Guard() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev)
}

// Resign ends the leadership and gives its lease back: the next replica
// takes over at once.
func (l *MirrorLeader) Resign(ctx context.Context) error {
	err := l.el.Resign(ctx)
	if cerr := l.sess.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("resign: %w", err)
	}
	return nil
}

// MirrorLeaderID is the id of the replica that leads mirror name now
// (ok false: none).
func (c *Client) MirrorLeaderID(ctx context.Context, name string) (id string, ok bool, err error) {
	if err := validMirrorName(name); err != nil {
		return "", false, err
	}
	resp, err := c.cli.Get(ctx, c.mirrorElection(name)+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", false, fmt.Errorf("read the leader of mirror %s: %w", name, err)
	}
	if len(resp.Kvs) == 0 {
		return "", false, nil
	}
	return string(resp.Kvs[0].Value), true, nil
}

// SyncRequest asks a mirror's leader to fetch and mirror now
// (`agentd mirror sync`).
type SyncRequest struct {
	AllowMassDelete bool
	By              string
	At              time.Time
}

// RequestMirrorSync leaves r for mirror name's leader (r.At defaults to
// now). A request not yet taken is replaced.
func (c *Client) RequestMirrorSync(ctx context.Context, name string, r SyncRequest) error {
	if err := validMirrorName(name); err != nil {
		return err
	}
	if r.At.IsZero() {
		r.At = time.Now()
	}
	r.At = r.At.UTC()
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	key := c.mirrorSyncKey(name)
	if _, err := c.cli.Put(ctx, key, string(b)); err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	return nil
}

// WatchMirrorSync delivers the sync requests of mirror name, each once:
// the one waiting now, then each new one. A request is taken (deleted)
// before it is delivered, so two watchers never both get it. The channel
// is closed when ctx ends; the goroutine behind it ends with ctx. Errors
// of etcd are retried with backoff (and logged).
func (c *Client) WatchMirrorSync(ctx context.Context, name string) <-chan SyncRequest {
	ch := make(chan SyncRequest)
	go func() {
		defer close(ch)
		if err := validMirrorName(name); err != nil {
			c.log.Error("watch mirror sync requests", "err", err)
			return
		}
		for n := 0; ctx.Err() == nil; n++ {
			err := c.watchSync(ctx, name, ch, func() { n = 0 })
			if ctx.Err() != nil {
				return
			}
			c.log.Warn("watch mirror sync requests", "mirror", name, "err", err)
			_ = sleepCtx(ctx, backoffDelay(n))
		}
	}()
	return ch
}

// watchSync takes the waiting request, then watches for the next ones,
// until ctx ends or the watch fails; ok is called once it watches.
func (c *Client) watchSync(ctx context.Context, name string, ch chan<- SyncRequest, ok func()) error {
	key := c.mirrorSyncKey(name)
	resp, err := c.cli.Get(ctx, key)
	if err != nil {
		return err
	}
	ok()
	if len(resp.Kvs) > 0 {
		if err := c.takeSync(ctx, resp.Kvs[0], ch); err != nil {
			return err
		}
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range c.cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return err // compacted too: read again
		}
		for _, ev := range wr.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			if err := c.takeSync(ctx, ev.Kv, ch); err != nil {
				return err
			}
		}
	}
	return errors.New("watch closed")
}

// takeSync deletes the request kv, if it is still there as it was, and
// then delivers it.
func (c *Client) takeSync(ctx context.Context, kv *mvccpb.KeyValue, ch chan<- SyncRequest) error {
	key := string(kv.Key)
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
		Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return nil // taken by another, or replaced by a newer request (the watch brings it)
	}
	var r SyncRequest
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		c.skipKey(kv.Key, "not a sync request; taken as a plain one", err)
		r = SyncRequest{}
	}
	select {
	case ch <- r:
	case <-ctx.Done():
	}
	return nil
}
