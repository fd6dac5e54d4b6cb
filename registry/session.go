package registry

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentd/agentd/reconcile"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxTxnOps keeps Report's transactions well under etcd's default limit of
// 128 operations per transaction.
const maxTxnOps = 64

var errLeaseLost = errors.New("lease lost: the membership key no longer carries it")

// Session is an agent's lease-bound presence in the registry: its
// membership record at <p>/agents/<host> and its statuses at
// <p>/status/<host>/. When the lease is lost (etcd away longer than the
// TTL, or the lease revoked), a goroutine owned by the Session — and Report
// itself — creates a new lease, re-puts the membership and re-publishes the
// last reported statuses. Safe for concurrent use.
type Session struct {
	c      *Client
	member reconcile.Member
	ttl    int // seconds

	mu   sync.Mutex
	sess *leaseKeeper       // nil when lost and not yet re-created
	want []reconcile.Status // by unit, one each (statusesByUnit); never modified
	// published is what etcd holds under this host's status prefix, by
	// unit: nil map = not read yet; a zero entry = a key of unknown content
	// (left by an earlier lease, or written by someone else).
	published map[string]pubEntry
	// wantPass is the pass record to publish with s.want (Acted 0: none
	// handed in yet); pubPass what etcd holds of it (zero: unknown or
	// absent, put again by the next sync).
	wantPass reconcile.Pass
	pubPass  pubPass
	closed   bool
	// stopping is set by Close before it waits for the Session's
	// goroutines: no new ones start after that (see goBackground).
	stopping bool
	// lastStamp makes lock request stamps unique within the Session (see
	// Acquire).
	lastStamp time.Time

	bg   context.Context // the Session's own; cancelled by Close
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// Join announces the agent: it grants a lease of ttl (default 15 s, rounded
// up to whole seconds), keeps it alive, and puts m at <p>/agents/<m.Host>
// bound to it. It fails with ErrHostTaken when a live agent with a
// different MachineID holds the host name. An earlier record with the same
// MachineID (this machine's agent before a restart) is taken over and its
// lease revoked, which also removes the statuses it left behind.
func (c *Client) Join(ctx context.Context, m reconcile.Member, ttl time.Duration) (*Session, error) {
	if err := ValidateName("host", m.Host); err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	if ttl <= 0 {
		ttl = defaultSessionTTL
	}
	m.PassRecords = true // Publish writes them
	s := &Session{c: c, member: m, ttl: int((ttl + time.Second - 1) / time.Second)}
	if err := s.establishLocked(ctx); err != nil {
		return nil, err
	}
	s.bg, s.stop = context.WithCancel(context.Background())
	s.wg.Go(func() { s.keep(s.bg) })
	s.wg.Go(func() { s.renewMember(s.bg) })
	return s, nil
}

// renewMember keeps the host's member record (members.go) saying when its
// agent was last seen: at once, then every memberRefresh until ctx (the
// Session's own) is done. The record is worth a warning, never the agent:
// an etcd role made before it existed may not let the agent write it.
func (s *Session) renewMember(ctx context.Context) {
	// Jittered (±10 %): 10,000 agents restarted together do not rewrite
	// their member records in step.
	t := time.NewTimer(reconcile.Jitter(memberRefresh))
	defer t.Stop()
	warned := false
	for {
		err := s.c.putMember(ctx, s.memberNow())
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !warned:
			s.c.log.Warn("member record not written: a host whose agent is down is then not counted as a member of its groups", "host", s.member.Host, "err", err)
			warned = true
		case err == nil:
			warned = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			t.Reset(reconcile.Jitter(memberRefresh))
		}
	}
}

// Client is the registry client the Session was joined through.
func (s *Session) Client() *Client { return s.c }

// Lease returns the current lease ID (0 while the lease is lost), for keys
// that must live and die with this agent.
func (s *Session) Lease() clientv3.LeaseID {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess == nil {
		return clientv3.NoLease
	}
	return s.sess.Lease()
}

// establishLocked grants a new lease, starts keeping it alive and claims
// the membership key with it. Caller holds s.mu (or owns s exclusively).
func (s *Session) establishLocked(ctx context.Context) error {
	c := s.c
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	g, err := c.cli.Grant(rctx, int64(s.ttl))
	if err != nil {
		return fmt.Errorf("join %s: grant lease: %w", s.member.Host, err)
	}
	sess := keepLease(c.cli, g.ID, s.ttl)
	if err := c.claim(rctx, s.member, g.ID); err != nil {
		sess.Orphan()
		c.revokeQuietly(g.ID)
		return fmt.Errorf("join %s: %w", s.member.Host, err)
	}
	s.sess = sess
	s.published = nil
	s.pubPass = pubPass{}
	return nil
}

// revokeQuietly revokes a lease we are abandoning; if etcd cannot be
// reached the lease simply expires after its TTL.
func (c *Client) revokeQuietly(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := c.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		c.log.Debug("revoke abandoned lease", "lease", fmt.Sprintf("%x", int64(id)), "err", err)
	}
}

// claim puts the membership record bound to lease unless a live agent
// with another machine ID holds it.
func (c *Client) claim(ctx context.Context, m reconcile.Member, lease clientv3.LeaseID) error {
	key := c.agentKey(m.Host)
	val, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode member: %w", err)
	}
	put := clientv3.OpPut(key, string(val), clientv3.WithLease(lease))
	for range 5 {
		resp, err := c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(put).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return fmt.Errorf("put %s: %w", key, err)
		}
		if resp.Succeeded {
			return nil
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			continue // deleted in between
		}
		kv := kvs[0]
		var old reconcile.Member
		oldLease := clientv3.LeaseID(kv.Lease)
		agentLease := oldLease != clientv3.NoLease && oldLease != lease
		if agentLease {
			if err := json.Unmarshal(kv.Value, &old); err != nil {
				// No agent writes that: not a live agent, whatever lease
				// the key carries. Take it over, but leave that lease
				// (and whatever else it holds) alone.
				c.log.Warn("registry key "+key+": value is not a membership record; taking it over",
					"key", key, "lease", fmt.Sprintf("%x", kv.Lease), "err", err)
				agentLease = false
			} else if old.MachineID != m.MachineID {
				return fmt.Errorf("%w: %s is held by machine ID %q (lease %x, started %s); stop that agent or choose another --host",
					ErrHostTaken, key, old.MachineID, kv.Lease, old.StartedAt.Format(time.RFC3339))
			}
		}
		// Ours, a leftover of this machine's previous run, or a key
		// without a lease (not a live agent): take it over.
		resp, err = c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(put).Commit()
		if err != nil {
			return fmt.Errorf("put %s: %w", key, err)
		}
		if !resp.Succeeded {
			continue
		}
		if agentLease {
			// The previous run is gone: drop what it left under its lease
			// (statuses, semaphore slots) instead of waiting for the TTL.
			if _, err := c.cli.Revoke(ctx, oldLease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
				c.log.Warn("revoke the previous agent's lease", "key", key, "lease", fmt.Sprintf("%x", kv.Lease), "err", err)
			}
		}
		return nil
	}
	return fmt.Errorf("put %s: key keeps changing; retry", key)
}

// Report is Publish without a pass record: the one etcd holds, if any,
// stays as it is.
func (s *Session) Report(ctx context.Context, statuses []reconcile.Status) error {
	return s.Publish(ctx, 0, statuses)
}

// Publish publishes the complete set of statuses of this host, computed
// by a pass that acted on registry revision acted (0: not known; the pass
// record is left as it is). The pass record goes in the transaction that
// writes the last of the statuses, so a reader never sees a revision
// acted on beside statuses older than that pass. It puts
// those that changed (ignoring UpdatedAt) and deletes the status keys of
// units not in the set, all bound to the lease. If the lease was lost it
// first creates a new one, re-puts the membership and re-publishes
// everything. On error (etcd unreachable, ErrHostTaken) the set is kept:
// the next successful Report, or the Session's own recovery, publishes it.
// The Session keeps statuses: they must not be modified afterwards (the
// agent hands in a new list each time).
func (s *Session) Publish(ctx context.Context, acted int64, statuses []reconcile.Status) error {
	var errs []error
	for _, st := range statuses {
		if err := validStatusUnit(st.Unit); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	want := statusesByUnit(statuses)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrSessionClosed
	}
	s.want = want
	if acted != 0 && acted != s.wantPass.Acted {
		s.wantPass = reconcile.Pass{Acted: acted, At: time.Now().UTC()}
	}
	return s.publishLocked(ctx)
}

// statusesByUnit returns st sorted by unit with one status per unit (of
// several, the last). The agent's list is that already and is kept as it
// is, not copied into a map: at 1,000 units the copy was 0.4 MiB of the
// idle agent's heap.
func statusesByUnit(st []reconcile.Status) []reconcile.Status {
	return reconcile.SortedUnique(st, func(x, y reconcile.Status) int { return strings.Compare(x.Unit, y.Unit) })
}

// wants says whether unit is in s.want.
func (s *Session) wants(unit string) bool {
	_, found := slices.BinarySearchFunc(s.want, unit, func(st reconcile.Status, u string) int { return strings.Compare(st.Unit, u) })
	return found
}

func validStatusUnit(unit string) error {
	if unit == "" || strings.Contains(unit, "..") || strings.HasPrefix(unit, "/") || strings.HasSuffix(unit, "/") {
		return fmt.Errorf("%w status unit %q", ErrInvalid, unit)
	}
	return nil
}

func (s *Session) alive() bool {
	if s.sess == nil {
		return false
	}
	select {
	case <-s.sess.Done():
		return false
	default:
		return true
	}
}

// publishLocked makes etcd hold s.want under a live lease.
func (s *Session) publishLocked(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		if !s.alive() {
			if s.sess != nil {
				s.sess.Orphan()
				s.sess = nil
			}
			if err := s.establishLocked(ctx); err != nil {
				return err
			}
		}
		err := s.syncLocked(ctx)
		if attempt == 0 && (errors.Is(err, errLeaseLost) || errors.Is(err, rpctypes.ErrLeaseNotFound)) {
			// Revoked or expired while the keep-alive had not noticed yet.
			s.sess.Orphan()
			s.sess = nil
			continue
		}
		return err
	}
}

// compareForm is the SHA-256 of a status encoded without UpdatedAt: two
// statuses that differ only in time are not re-published. A digest, not
// the encoding: kept for every published status (0.4 MiB of the idle
// agent's heap at 1,000 units as JSON).
func compareForm(st reconcile.Status) (string, error) {
	st.UpdatedAt = time.Time{}
	b, err := json.Marshal(st)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return string(sum[:]), nil
}

// pubEntry is what a Session knows etcd holds at one of its status keys:
// the status's compareForm ("": content unknown) and the revision the
// Session put it at.
type pubEntry struct {
	form string
	rev  int64
	// st is the status form was made from: the same status handed in
	// again (the agent keeps the statuses of units a pass did not look
	// at, UpdatedAt and all) is known unchanged without encoding it.
	st reconcile.Status
}

// pubPass is what a Session knows etcd holds of its pass record: the
// record and the revision it was put at (zero: unknown or absent).
type pubPass struct {
	pass reconcile.Pass
	rev  int64
}

// syncRounds bounds how many transactions one Report spends chasing keys
// someone else keeps writing under the host's status prefix; what is left
// is fixed by the next Report.
const syncRounds = 3

// syncLocked makes the host's status prefix hold exactly s.want: it puts
// what changed and deletes every other key there — statuses of units no
// longer reported, and keys written by anyone else (garbage, a unit this
// host does not report, one of its own statuses overwritten). The last
// transaction of each round also lists the prefix (keys only), so a
// foreign key is seen in the same transaction and removed by the next
// round.
func (s *Session) syncLocked(ctx context.Context) error {
	c := s.c
	root := c.hostStatus(s.member.Host)
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	if s.published == nil {
		// After a new lease, every wanted status is put again; keys
		// left by an earlier lease that are no longer wanted go.
		resp, err := c.cli.Get(rctx, root, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return fmt.Errorf("report: list %s: %w", root, err)
		}
		s.published = map[string]pubEntry{}
		for _, kv := range resp.Kvs {
			u := strings.TrimPrefix(string(kv.Key), root)
			if u == reconcile.PassKey {
				// Not a status: an earlier lease's pass record is
				// written over by this one's (pubPass is unknown), not
				// deleted in the same transaction as that put.
				continue
			}
			s.published[u] = pubEntry{}
		}
		s.pubPass = pubPass{}
	}
	lease := s.sess.Lease()
	for round := range syncRounds {
		changes, err := s.changesLocked(root, lease)
		if err != nil {
			return err
		}
		if round > 0 && len(changes) == 0 {
			return nil
		}
		if err := s.commitLocked(rctx, root, lease, changes); err != nil {
			return err
		}
	}
	return nil
}

// statusChange is one operation of a Report: a put (form set) or a delete.
type statusChange struct {
	unit string
	op   clientv3.Op
	form string // "" for a delete
	st   reconcile.Status
	pass bool // the put of the pass record
}

// changesLocked lists the puts and deletes that turn s.published into
// s.want.
func (s *Session) changesLocked(root string, lease clientv3.LeaseID) ([]statusChange, error) {
	var changes []statusChange
	for _, st := range s.want {
		u := st.Unit
		old := s.published[u]
		if old.form != "" && reflect.DeepEqual(old.st, st) {
			continue
		}
		form, err := compareForm(st)
		if err != nil {
			return nil, fmt.Errorf("report: encode status of %s: %w", u, err)
		}
		if old.form != "" && old.form == form {
			continue
		}
		val, err := json.Marshal(st)
		if err != nil {
			return nil, fmt.Errorf("report: encode status of %s: %w", u, err)
		}
		changes = append(changes, statusChange{unit: u, op: clientv3.OpPut(root+u, string(val), clientv3.WithLease(lease)), form: form, st: st})
	}
	for u := range s.published {
		if !s.wants(u) {
			changes = append(changes, statusChange{unit: u, op: clientv3.OpDelete(root + u)})
		}
	}
	// In unit order: a large report is cut into transactions the same way
	// every time.
	slices.SortFunc(changes, func(x, y statusChange) int { return strings.Compare(x.unit, y.unit) })
	// The pass record last: it lands in the transaction that completes
	// the statuses it vouches for.
	if s.wantPass.Acted != 0 && (s.pubPass.rev == 0 || s.pubPass.pass != s.wantPass) {
		val, err := json.Marshal(s.wantPass)
		if err != nil {
			return nil, fmt.Errorf("report: encode pass record: %w", err)
		}
		changes = append(changes, statusChange{unit: reconcile.PassKey, op: clientv3.OpPut(root+reconcile.PassKey, string(val), clientv3.WithLease(lease)), pass: true})
	}
	return changes, nil
}

// commitLocked applies changes in transactions of at most maxTxnOps
// operations (at least one transaction, which lists the prefix).
func (s *Session) commitLocked(ctx context.Context, root string, lease clientv3.LeaseID, changes []statusChange) error {
	c := s.c
	// Every transaction is guarded by the membership key still carrying
	// our lease: that detects a lease revoked or expired before the
	// keep-alive noticed, and a host name taken over, even when there is
	// nothing to write (a read-only round trip then).
	guard := clientv3.Compare(clientv3.LeaseValue(c.agentKey(s.member.Host)), "=", lease)
	for first := true; first || len(changes) > 0; first = false {
		chunk := changes[:min(len(changes), maxTxnOps)]
		changes = changes[len(chunk):]
		last := len(changes) == 0
		ops := make([]clientv3.Op, 0, len(chunk)+1)
		for _, ch := range chunk {
			ops = append(ops, ch.op)
		}
		if last {
			ops = append(ops, clientv3.OpGet(root, clientv3.WithPrefix(), clientv3.WithKeysOnly()))
		}
		resp, err := c.cli.Txn(ctx).If(guard).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("report: put %s*: %w", root, err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("report %s: %w", s.member.Host, errLeaseLost)
		}
		for _, ch := range chunk {
			if ch.pass {
				s.pubPass = pubPass{s.wantPass, resp.Header.Revision}
				continue
			}
			if ch.form != "" {
				s.published[ch.unit] = pubEntry{ch.form, resp.Header.Revision, ch.st}
			} else {
				delete(s.published, ch.unit)
			}
		}
		if last {
			s.notePublishedLocked(root, resp.Responses[len(chunk)].GetResponseRange().GetKvs())
		}
	}
	return nil
}

// notePublishedLocked compares s.published with the keys etcd lists under
// root: a key this Session did not put, or not at that revision (anyone
// else's write moves it), becomes a key of unknown content (deleted, or
// put again if wanted, by the next round); a key gone from etcd is
// forgotten.
func (s *Session) notePublishedLocked(root string, kvs []*mvccpb.KeyValue) {
	seen := make(map[string]bool, len(kvs))
	passSeen := false
	for _, kv := range kvs {
		u := strings.TrimPrefix(string(kv.Key), root)
		if u == reconcile.PassKey {
			// Ours only at the revision we put it; anyone else's write,
			// or one of an earlier lease, is put again (below).
			passSeen = s.pubPass.rev != 0 && s.pubPass.rev == kv.ModRevision
			continue
		}
		seen[u] = true
		p, ok := s.published[u]
		if ok && p.form != "" && p.rev == kv.ModRevision {
			continue
		}
		switch {
		case !ok:
			s.c.log.Warn("registry key "+string(kv.Key)+": not written by this agent; removing it",
				"key", string(kv.Key), "host", s.member.Host)
		case p.form != "":
			s.c.log.Warn("registry key "+string(kv.Key)+": overwritten by someone else; publishing this agent's status again",
				"key", string(kv.Key), "host", s.member.Host)
		}
		s.published[u] = pubEntry{}
	}
	for u := range s.published {
		if !seen[u] {
			delete(s.published, u)
		}
	}
	if !passSeen {
		s.pubPass = pubPass{}
	}
}

// keep re-creates a lost lease and re-publishes, with backoff, until ctx
// (the Session's own) is done.
func (s *Session) keep(ctx context.Context) {
	log := s.c.log.With("host", s.member.Host)
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		var done <-chan struct{}
		if s.sess != nil {
			done = s.sess.Done()
		}
		s.mu.Unlock()
		if done != nil {
			select {
			case <-ctx.Done():
				return
			case <-done:
			}
		}
		for fails := 0; ; fails++ {
			s.mu.Lock()
			var err error
			lost := !s.closed && !s.alive()
			if lost {
				if fails == 0 {
					log.Warn("registry lease lost; re-creating it")
				}
				err = s.publishLocked(ctx)
			}
			s.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				if lost {
					log.Info("registry lease re-created; membership and statuses re-published")
				}
				break
			}
			d := backoffDelay(fails)
			log.Warn("re-create registry lease", "err", err, "retry_in", d.Round(time.Millisecond))
			if sleepCtx(ctx, d) != nil {
				return
			}
		}
	}
}

// Close stops the Session and revokes its lease: the membership record, the
// statuses and any semaphore keys (held slots, queue positions) disappear
// at once.
func (s *Session) Close() error {
	s.stop()
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.sess == nil {
		return nil
	}
	s.sess.Orphan()
	lease := s.sess.Lease()
	s.sess = nil
	ctx, cancel := s.c.reqCtx(context.Background())
	defer cancel()
	// Last seen now: leaving cleanly is the last sign of life.
	if err := s.c.putMember(ctx, s.member); err != nil {
		s.c.log.Debug("member record at leave", "host", s.member.Host, "err", err)
	}
	if _, err := s.c.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("leave %s: revoke lease: %w", s.member.Host, err)
	}
	return nil
}
