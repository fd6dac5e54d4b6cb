package registry

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/rollout"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// History: the versions of a unit key that Put and Remove keep.
//
// Every Put and Remove also writes, in the same transaction, one version
// record per key it changes:
//
//	<p>/history/hosts/<host>/units/<key>/<seq>
//	<p>/history/groups/<group>/units/<key>/<seq>
//
// <key> is the unit key suffix ("hello.service", "hello.service.d/x.conf")
// and <seq> a 20-digit zero-padded sequence number, one more than the
// newest kept record of that key. The value is JSON (historyRecord):
// content (a string; contentBase64 instead when it is not UTF-8), hash,
// size, user, etcdUser, reason, signer, time, removed. The same transaction deletes the records
// beyond the newest Keep of that key (one range delete), so a key keeps at
// most Keep versions whatever etcd compaction does: they are live keys.
//
// The revision of a version is the etcd revision of the transaction that
// wrote it, which is the record's CreateRevision (etcd gives every
// operation of a transaction the same revision, and a record is never
// rewritten) — the revision `unit put` prints and `unit ls` shows as the
// key's ModRevision. It cannot be part of the key, because the revision
// of a transaction is only known once it committed; hence <seq>.
//
// Order and no lost records: the writer reads the key's ModRevision and
// its records, then commits guarded by "ModRevision(key) is still what I
// read". Every Put and Remove changes the key's ModRevision, so a writer
// that lost a race fails its guard and starts over from a fresh read: the
// writes of one key are serialized, <seq> grows with the revision, and no
// two writers pick one <seq>.
//
// The history lives outside hosts/ and groups/, so the agents' watch and
// read (<p>/hosts/<h>/units/, <p>/groups/<g>/units/) never see it, and an
// agent's least-privilege role grants nothing under it.

// DefaultKeep is how many versions of each key are kept when the writer
// does not say (KeepVersions).
const DefaultKeep = 10

// WriteOption adjusts Put and Remove.
type WriteOption func(*writeOptions)

type writeOptions struct {
	by       string
	reason   string // WithReason
	override string // Overriding
	signedBy string // SignedBy
	// etcdUser is who etcd runs the write as (Client.EtcdUser), filled by
	// the write itself.
	etcdUser string
	keep     int
	now      func() time.Time
	expect   map[string]int64
	// wholeUnits: Remove refuses to leave drop-ins without their unit
	// (OnlyWholeUnits).
	wholeUnits bool
	// rollout stages a group put (WithRollout); supersede ends a running
	// rollout of the same keys instead of refusing.
	rollout   *rollout.Record
	supersede bool
	// ended, shared by the writes of one transaction (a mirrored
	// commit's), are the rollouts one of them supersedes already
	// (endOnce, mirror_rollouts.go).
	ended map[string]bool
	// signer signs each key written (SignWith); revert says the write is
	// a revert (Reverting).
	signer ChangeSigner
	revert bool
	// force writes to a target a mirror owns (Force); mirror says the
	// write is the mirror's own (ApplyCommit), which guards the owners
	// itself (mirror.go).
	force  bool
	mirror bool
}

func newWriteOptions(opts []WriteOption) writeOptions {
	o := writeOptions{keep: DefaultKeep, now: time.Now}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// StoredBy records who stores the version (the CLI passes "user@host").
func StoredBy(who string) WriteOption { return func(o *writeOptions) { o.by = who } }

// WithReason records why the version is stored (the CLI's --reason, like
// Kubernetes' change-cause). It must pass ValidateReason, else the write
// fails (ErrInvalid) and nothing is stored.
func WithReason(why string) WriteOption { return func(o *writeOptions) { o.reason = why } }

// Overriding records, in each version the write keeps, what the writer
// passed over to make it (`--now`: the target's maintenance window).
func Overriding(what string) WriteOption { return func(o *writeOptions) { o.override = what } }

// SignedBy records who signed the change (the signature work, issue 26
// item 1, fills it from the verified key; it is not verified here).
func SignedBy(signer string) WriteOption { return func(o *writeOptions) { o.signedBy = signer } }

// MaxReasonBytes is the longest reason a write takes (WithReason).
const MaxReasonBytes = 1024

// ValidateReason checks a reason given with a write: valid UTF-8, at most
// MaxReasonBytes, one line with no control characters (it is shown in a
// table and in the journal).
func ValidateReason(why string) error {
	switch {
	case !utf8.ValidString(why):
		return fmt.Errorf("%w: reason is not valid UTF-8", ErrInvalid)
	case len(why) > MaxReasonBytes:
		return fmt.Errorf("%w: reason is %d bytes long, more than %d: say it shorter (a ticket or URL)", ErrInvalid, len(why), MaxReasonBytes)
	}
	for i, r := range why {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: reason has a control character (%U) at byte %d: give one line of text", ErrInvalid, r, i)
		}
	}
	return nil
}

// resolveWriteOptions is newWriteOptions for a write that is about to be
// sent: the reason checked, and the etcd user the client runs as filled in.
func (c *Client) resolveWriteOptions(ctx context.Context, opts []WriteOption) (writeOptions, error) {
	o := newWriteOptions(opts)
	if err := ValidateReason(o.reason); err != nil {
		return o, err
	}
	var err error
	o.etcdUser, err = c.EtcdUser(ctx)
	return o, err
}

// KeepVersions sets how many versions of each written key are kept,
// the new one included (n < 1 means DefaultKeep).
func KeepVersions(n int) WriteOption {
	return func(o *writeOptions) {
		if n >= 1 {
			o.keep = n
		}
	}
}

// IfModRevision makes the write conditional: unit (a key suffix being
// written) must still have ModRevision rev (0: must not exist), else
// nothing is written and the error is a *ConflictError (wrapping
// ErrConflict). Repeatable.
func IfModRevision(unit string, rev int64) WriteOption {
	return func(o *writeOptions) {
		if o.expect == nil {
			o.expect = map[string]int64{}
		}
		o.expect[unit] = rev
	}
}

// withClock sets the clock used for version times (tests).
func withClock(now func() time.Time) WriteOption { return func(o *writeOptions) { o.now = now } }

// Version is one kept version of a unit key.
type Version struct {
	Revision int64     `json:"revision"` // etcd revision of the put or removal
	Time     time.Time `json:"time"`     // the writer's clock
	Hash     string    `json:"hash"`     // SHA-256 of Content; "" for a removal
	Size     int       `json:"size"`
	User     string    `json:"user"` // who stored it: "user@host"; "" if not given
	// EtcdUser is the etcd user the write ran as, when etcd's
	// authentication was on ("" when off). Like User, the writer says it:
	// etcd checked that user's permissions for the write, nobody checks
	// the record (a signature does: Signer).
	EtcdUser string `json:"etcdUser"`
	Reason   string `json:"reason"` // why: the writer's --reason; "" if not given
	// Signer is who signed the change (issue 26 item 1); "" when unsigned.
	Signer string `json:"signer,omitempty"`
	// Override is what the writer passed over to make it: "--now:
	// outside the window …" for a change made at once to a group with a
	// maintenance window.
	Override string `json:"override,omitempty"`
	Removed  bool   `json:"removed"`
	Content  []byte `json:"-"`
}

// History is what the registry keeps of one unit key: what it holds now
// and its kept versions, read at one revision.
type History struct {
	Target      Target
	Unit        string
	Key         string // full unit key
	Exists      bool   // the unit key exists now
	Current     []byte // its value now
	ModRevision int64  // its ModRevision now (0: absent)
	Versions    []Version
}

// historyRecord is the JSON value of a history key.
type historyRecord struct {
	Content       string    `json:"content,omitempty"`
	ContentBase64 []byte    `json:"contentBase64,omitempty"`
	Hash          string    `json:"hash"`
	Size          int       `json:"size"`
	User          string    `json:"user"`
	EtcdUser      string    `json:"etcdUser,omitempty"`
	Reason        string    `json:"reason,omitempty"`
	Signer        string    `json:"signer,omitempty"`   // SignedBy (issue 26 item 1)
	Override      string    `json:"override,omitempty"` // Overriding
	Time          time.Time `json:"time"`
	Removed       bool      `json:"removed,omitempty"`
}

func (c *Client) historyRoot() string { return c.prefix + "/history/" }

func (c *Client) historyUnits(t Target) string { return c.historyRoot() + t.String() + "/units/" }

func (c *Client) historyDir(t Target, unit string) string { return c.historyUnits(t) + unit + "/" }

func (c *Client) historyKey(t Target, unit string, seq int64) string {
	return c.historyDir(t, unit) + fmt.Sprintf("%020d", seq)
}

// keyState is what a write reads of one key before it commits.
type keyState struct {
	modRev int64   // 0: absent
	seqs   []int64 // kept history records, ascending
	// sigRev is the ModRevision of the key's signature record (0: none)
	// and sigSeq its sequence number.
	sigRev int64
	sigSeq uint64
}

// readKeys reads, at one revision (returned), the ModRevision of every
// unit key of t in names, the sequence numbers of their history records
// (keys only) and their signature records. With dropIns, every drop-in
// and config file in the registry of a unit in names ("<unit>.d/…",
// "<unit>.files/…") is read too, named or not.
func (c *Client) readKeys(ctx context.Context, t Target, names []string, dropIns bool) (map[string]*keyState, int64, error) {
	units, hist := c.targetUnits(t), c.historyUnits(t)
	sigs := c.signatureRoot(t)
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(units, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(hist, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(sigs, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", units, err)
	}
	st := make(map[string]*keyState, len(names))
	for _, n := range names {
		st[n] = &keyState{}
	}
	for _, kv := range resp.Responses[0].GetResponseRange().GetKvs() {
		u := strings.TrimPrefix(string(kv.Key), units)
		if _, ok := st[u]; !ok && dropIns {
			if owner := reconcile.UnitOfPath(u); owner != u && slices.Contains(names, owner) {
				st[u] = &keyState{}
			}
		}
		if s, ok := st[u]; ok {
			s.modRev = kv.ModRevision
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		rest := strings.TrimPrefix(string(kv.Key), hist)
		i := strings.LastIndexByte(rest, '/')
		if i < 0 {
			continue
		}
		s, ok := st[rest[:i]]
		if !ok {
			continue
		}
		if seq, err := strconv.ParseInt(rest[i+1:], 10, 64); err == nil && seq > 0 {
			s.seqs = append(s.seqs, seq)
		}
	}
	for _, kv := range resp.Responses[2].GetResponseRange().GetKvs() {
		if s, ok := st[strings.TrimPrefix(string(kv.Key), sigs)]; ok {
			var r reconcile.SignatureRecord
			_ = json.Unmarshal(kv.Value, &r) // a record that does not decode counts as sequence 0
			s.sigRev, s.sigSeq = kv.ModRevision, r.Seq
		}
	}
	for _, s := range st {
		slices.Sort(s.seqs)
	}
	return st, resp.Header.Revision, nil
}

// recordHistory adds, for each key written, the record of its new version
// (w.values[key], or a removal) and the deletion of its records beyond
// the newest o.keep, the new one included.
func (w *writeTxn) recordHistory() error {
	c, t, o := w.c, w.target, w.o
	now := o.now().UTC()
	for _, u := range w.names {
		s := w.st[u]
		rec := historyRecord{User: o.by, EtcdUser: o.etcdUser, Reason: o.reason, Signer: o.signedBy, Override: o.override, Time: now, Removed: w.removal()}
		if o.signer != nil && rec.Signer == "" {
			rec.Signer = o.signer.Fingerprint() // the key that signs this write (SignWith)
		}
		if !w.removal() {
			v := w.values[u]
			rec.Hash, rec.Size = reconcile.Hash(v), len(v)
			if utf8.Valid(v) {
				rec.Content = string(v)
			} else {
				rec.ContentBase64 = v
			}
		}
		b, err := json.Marshal(rec)
		if err != nil {
			return fmt.Errorf("encode history of %s: %w", u, err)
		}
		next := int64(1)
		if n := len(s.seqs); n > 0 {
			next = s.seqs[n-1] + 1
		}
		w.then(clientv3.OpPut(c.historyKey(t, u, next), string(b)))
		// Keep the newest o.keep-1 old records and the new one.
		if old := len(s.seqs) - (o.keep - 1); old > 0 {
			firstKept := next
			if o.keep > 1 {
				firstKept = s.seqs[old]
			}
			w.then(clientv3.OpDelete(c.historyDir(t, u), clientv3.WithRange(c.historyKey(t, u, firstKept))))
		}
	}
	return nil
}

// History returns what the registry holds for the unit key suffix unit of
// t and its kept versions, oldest first. A record that does not decode is
// skipped with a warning. No versions and no key is not an error: the
// History is empty.
func (c *Client) History(ctx context.Context, t Target, unit string) (History, error) {
	if err := t.Validate(); err != nil {
		return History{}, fmt.Errorf("history: %w", err)
	}
	if err := ValidateUnit(unit); err != nil {
		return History{}, fmt.Errorf("history: %w", err)
	}
	key, dir := c.targetUnits(t)+unit, c.historyDir(t, unit)
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(key),
		clientv3.OpGet(dir, clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return History{}, fmt.Errorf("read history of %s: %w", key, err)
	}
	h := History{Target: t, Unit: unit, Key: key}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		h.Exists, h.Current, h.ModRevision = true, kvs[0].Value, kvs[0].ModRevision
	}
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		if strings.Contains(strings.TrimPrefix(string(kv.Key), dir), "/") {
			continue // not a record of this key
		}
		var rec historyRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			c.skipKey(kv.Key, "value is not a version record", err)
			continue
		}
		v := Version{Revision: kv.CreateRevision, Time: rec.Time, User: rec.User, EtcdUser: rec.EtcdUser, Reason: rec.Reason, Signer: rec.Signer, Override: rec.Override, Removed: rec.Removed}
		if !rec.Removed {
			v.Content = []byte(rec.Content)
			if rec.ContentBase64 != nil {
				v.Content = rec.ContentBase64
			}
			v.Hash, v.Size = reconcile.Hash(v.Content), len(v.Content)
		}
		h.Versions = append(h.Versions, v)
	}
	slices.SortFunc(h.Versions, func(a, b Version) int { return cmp.Compare(a.Revision, b.Revision) })
	return h, nil
}

// Is reports whether v is what the key holds now: the same bytes, or
// both absent.
func (h History) Is(v Version) bool {
	if v.Removed || !h.Exists {
		return v.Removed && !h.Exists
	}
	return bytes.Equal(v.Content, h.Current)
}

// CurrentIndex is the index in Versions of the version the key holds
// now: the one written at its ModRevision or, the key being absent, the
// newest version when it is a removal. -1 when the key's present state
// was not written through Put or Remove (etcdctl), or nothing is kept.
func (h History) CurrentIndex() int {
	n := len(h.Versions)
	if n == 0 {
		return -1
	}
	if !h.Exists {
		if h.Versions[n-1].Removed {
			return n - 1
		}
		return -1
	}
	for i := n - 1; i >= 0; i-- {
		if h.Versions[i].Revision == h.ModRevision {
			return i
		}
	}
	return -1
}

// Previous is the version before the current one (CurrentIndex), or the
// newest kept version when the current state was written by other means.
// The error wraps ErrNotFound when nothing is kept or the current version
// is the oldest kept.
func (h History) Previous() (Version, error) {
	if len(h.Versions) == 0 {
		return Version{}, h.noHistory()
	}
	switch i := h.CurrentIndex(); i {
	case -1:
		return h.Versions[len(h.Versions)-1], nil
	case 0:
		return Version{}, fmt.Errorf("%s: %w: no version before the current one (revision %d) is kept; see agentd unit history", h.Key, ErrNotFound, h.Versions[0].Revision)
	default:
		return h.Versions[i-1], nil
	}
}

// PreviousGood is the newest kept version before the current one whose
// content is not known to have failed (failed says which hashes did: a
// failed rollout's change, a halted version), so that a revert after a
// failure never puts that failure back. A removal never failed.
func (h History) PreviousGood(failed func(hash string) bool) (Version, error) {
	v, err := h.Previous()
	if err != nil || v.Removed || !failed(v.Hash) {
		return v, err
	}
	end := h.CurrentIndex()
	if end < 0 {
		end = len(h.Versions)
	}
	for i := end - 1; i >= 0; i-- {
		if w := h.Versions[i]; w.Removed || !failed(w.Hash) {
			return w, nil
		}
	}
	return Version{}, fmt.Errorf("%s: %w: every kept version before the current one failed; name one with --to (agentd unit history)", h.Key, ErrNotFound)
}

// At is the kept version stored at revision rev; the error wraps
// ErrNotFound and lists the kept revisions.
func (h History) At(rev int64) (Version, error) {
	if len(h.Versions) == 0 {
		return Version{}, h.noHistory()
	}
	revs := make([]string, len(h.Versions))
	for i, v := range h.Versions {
		if v.Revision == rev {
			return v, nil
		}
		revs[i] = strconv.FormatInt(v.Revision, 10)
	}
	return Version{}, fmt.Errorf("%s: %w: no kept version at revision %d (kept: %s; see agentd unit history)", h.Key, ErrNotFound, rev, strings.Join(revs, ", "))
}

func (h History) noHistory() error {
	state := "it does not exist"
	if h.Exists {
		state = "its current value was not stored by agentd unit put/rm/revert (etcdctl?)"
	}
	return fmt.Errorf("%s: %w: no history kept (%s)", h.Key, ErrNotFound, state)
}
