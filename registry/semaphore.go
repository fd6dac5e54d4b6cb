package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/selector"
)

// The MaxUnavailable= semaphore: a counting semaphore per (scope, bucket,
// unit) whose slots are held by agents, bound to their leases, with no
// central controller.
//
// Key layout:
//
//	<p>/locks/<scope>/<pool>/<host>   JSON Holder {host, hash, requestedAt, acquiredAt}
//
// <scope> is the registry target the unit came from, "groups/<group>" or
// "hosts/<host>"; <pool> names the semaphore within it (PoolName): the
// unit name (no drop-ins) for the semaphore of the whole scope, or, for a
// unit with [X-Agentd] MaxUnavailableBy=KEY, one per label value,
// "<unit>,<KEY>=<value>" — "<unit>,<KEY>=" for the hosts without the label
// (reconcile.Bucket) — with a "/" of KEY spelled "%2F"; <host> the agent
// that holds or waits for a slot. Every key is bound to the lease of that
// agent's Session, so it disappears when the agent dies (lease expiry, at
// most the TTL after its last keep-alive) or leaves (Close revokes the
// lease). An agent has at most one key per (scope, unit).
//
// The keys of one (scope, unit), ordered by CreateRevision, form a FIFO
// queue: a key holds a slot once fewer than limit keys were created before
// it. A key's creation revision is fixed for its lifetime (puts to an
// existing key keep it) and every new key gets a higher one, so the number
// of keys ahead of a key only ever decreases: once a key is among the
// first limit it stays there until it is deleted. Hence, at every
// revision, at most limit keys are marked held (acquiredAt set): an agent
// marks its key only after it saw fewer than limit keys ahead of it, and
// only if the key is still exactly as it wrote it (same ModRevision, so
// still bound to its lease and in the same place).
//
// Waiting: a waiter reads, at one revision R, its own key and the keys
// created before it (the "ahead" set), then watches the queue's prefix
// from R+1 and drops each deleted key from that set; keys created later
// never count, so the set is exact at every revision without re-reading
// and it proceeds as soon as fewer than limit remain. Each release costs
// every waiter one watch event but no request (the herd etcd's
// concurrency.Mutex avoids by watching only its predecessor, which is not
// correct for limit > 1: holders release in any order). On compaction or
// a closed watch it re-reads. Etcd says nothing on a watch while it is
// unreachable, so the waiter also reads its key every 2 s.
//
// A holder cut off from etcd loses its slot when its lease expires at
// etcd, about when its Session notices the loss (network delay apart).
// Before each disruptive step a holder asks Holding, and does not start
// the step unless the answer is a definite yes.
//
// A key without a lease, or whose value does not decode, still takes its
// place in the queue: it is an operator's to remove (etcdctl del).

// defaultLockProbe is how often Acquire checks, while waiting, that etcd is
// reachable and its key still there (one linearizable read).
const defaultLockProbe = 2 * time.Second

// ErrSlotLost is returned (wrapped) by Acquire when the lease its key is
// bound to was lost (expired, revoked, or being re-created after etcd was
// away), or its key was deleted or taken over by another Acquire.
var ErrSlotLost = errors.New("semaphore slot lost")

// Holder is the value of a semaphore key: an agent holding, or waiting
// for, a slot.
type Holder struct {
	Host string `json:"host"`
	// Hash is the unit content the holder is applying (for display).
	Hash string `json:"hash"`
	// RequestedAt is when the Acquire call that wrote the key began; it
	// also tells one Acquire call's key from another's.
	RequestedAt time.Time `json:"requestedAt"`
	// AcquiredAt is when the slot was granted; zero while waiting.
	AcquiredAt time.Time `json:"acquiredAt,omitzero"`
	// FleetLockID is set on a slot taken for a reboot through the
	// FleetLock server (LockReboot): the FleetLock client's id. Empty on
	// an agent's own slot.
	FleetLockID string `json:"fleetLockID,omitempty"`
}

// Waiting reports whether h is queued and does not hold a slot yet.
func (h Holder) Waiting() bool { return h.AcquiredAt.IsZero() }

// Acquire takes one of limit slots of the semaphore (scope, unit) for this
// Session's host. It blocks until the slot is held or until ctx ends, in
// FIFO order of arrival. scope is the registry target the unit came from,
// "groups/<group>" or "hosts/<host>" (Target.String()); hash is recorded
// for display (Holders). All agents sharing (scope, unit) must use the same
// limit for it to be a bound.
//
// Acquire returns only after etcd has recorded the slot as held by this
// host under the Session's current lease. It fails — and holds nothing —
// when ctx ends (the error wraps ctx.Err()), when etcd cannot be reached
// (checked every 2 s while waiting, each check bounded by the request
// timeout of 5 s), or with ErrSlotLost when the lease is lost or the key
// deleted or taken over while waiting. On failure its key is removed; if
// etcd cannot be reached for that, the Session keeps trying in the
// background (until the lease changes or the Session closes) and the key
// goes with the lease at the latest.
//
// Calling Acquire again for a (scope, unit) this host already holds or
// waits for (a retried call, or a key left by this host's previous run)
// reuses the key and its place in the queue: a host never takes two
// slots. The new call supersedes the old one: the old call's release does
// nothing, and an old call still waiting fails with ErrSlotLost.
//
// The slot is held as long as the key lives: release deletes it
// (idempotent; a release after a later Acquire of the same key, or after
// the lease was lost, does nothing). If release cannot reach etcd it
// returns an error and the Session keeps trying in the background.
//
// A slot lives and dies with the Session's lease. When the lease is lost
// and the Session creates a new one, the keys bound to the old lease —
// held slots and queue positions — are gone (or go when etcd expires that
// lease): they are no longer this Session's, Holding reports false, and
// the next Acquire starts over (taking over a key not expired yet, in its
// place). Before each disruptive step, a holder checks Holding.
//
// bucket is the label bucket of a unit with MaxUnavailableBy= (this host's
// value of the label): each bucket is a semaphore of its own, with its own
// limit slots; the zero Bucket is the semaphore of the whole scope.
func (s *Session) Acquire(ctx context.Context, scope string, bucket reconcile.Bucket, unit, hash string, limit int) (release func(context.Context) error, err error) {
	if err := validLock(scope, bucket, unit); err != nil {
		return nil, fmt.Errorf("acquire: %w", err)
	}
	if limit < 1 {
		return nil, fmt.Errorf("acquire %s %s: %w limit %d: want at least 1", scope, PoolName(unit, bucket), ErrInvalid, limit)
	}
	c := s.c
	pool := PoolName(unit, bucket)
	key := c.lockKey(scope, pool, s.member.Host)
	lease, lost, err := s.liveLease()
	if err != nil {
		return nil, fmt.Errorf("acquire %s: %w", key, err)
	}
	l := &lock{
		c: c, s: s, key: key, dir: c.lockDir(scope, pool), lease: lease,
		val: Holder{Host: s.member.Host, Hash: hash, RequestedAt: s.stamp()},
	}
	if err := l.acquire(ctx, limit, lost); err != nil {
		l.abandon(ctx)
		return nil, fmt.Errorf("acquire %s: %w", key, err)
	}
	return l.release, nil
}

// Holding reports whether this host holds a slot of (scope, bucket, unit) now: its
// key exists, marked held, bound to the Session's current, live lease
// (read from etcd, linearizable). It is false after the lease was lost,
// even once the Session has a new one. An error means etcd could not be
// asked; a caller must not assume it holds the slot then.
func (s *Session) Holding(ctx context.Context, scope string, bucket reconcile.Bucket, unit string) (bool, error) {
	if err := validLock(scope, bucket, unit); err != nil {
		return false, fmt.Errorf("holding: %w", err)
	}
	key := s.c.lockKey(scope, PoolName(unit, bucket), s.member.Host)
	lease, _, err := s.liveLease()
	if err != nil {
		return false, nil // lost or closed: whatever the old lease held is gone
	}
	rctx, cancel := s.c.reqCtx(ctx)
	defer cancel()
	resp, err := s.c.cli.Get(rctx, key)
	if err != nil {
		return false, fmt.Errorf("holding %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 || clientv3.LeaseID(resp.Kvs[0].Lease) != lease {
		return false, nil
	}
	var h Holder
	if err := json.Unmarshal(resp.Kvs[0].Value, &h); err != nil {
		return false, nil
	}
	return !h.Waiting(), nil
}

// Holders returns the agents holding or waiting for a slot of (scope,
// bucket, unit), in queue order: with limit N, the first N hold a slot or are
// about to (Holder.Waiting tells which have marked it). Host is taken from
// the key. A value that does not decode is returned with only Host set,
// and a warning: it still takes its place in the queue.
func (c *Client) Holders(ctx context.Context, scope string, bucket reconcile.Bucket, unit string) ([]Holder, error) {
	if err := validLock(scope, bucket, unit); err != nil {
		return nil, fmt.Errorf("holders: %w", err)
	}
	dir := c.lockDir(scope, PoolName(unit, bucket))
	resp, err := c.cli.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	out := make([]Holder, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var h Holder
		if err := json.Unmarshal(kv.Value, &h); err != nil {
			c.log.Warn("registry key "+string(kv.Key)+": value is not a semaphore holder; it still takes its place in the queue (delete it if no agent wrote it)",
				"key", string(kv.Key), "err", err)
			h = Holder{}
		}
		h.Host = strings.TrimPrefix(string(kv.Key), dir)
		out = append(out, h)
	}
	return out, nil
}

// validLock checks a semaphore's scope ("groups/<g>" or "hosts/<h>"),
// bucket (validBucket) and unit (a unit name, not a drop-in; or a group's
// RebootPool).
func validLock(scope string, bucket reconcile.Bucket, unit string) error {
	if err := validBucket(bucket); err != nil {
		return err
	}
	kind, name, _ := strings.Cut(scope, "/")
	switch kind {
	case "groups":
		if err := ValidateName("group", name); err != nil {
			return err
		}
	case "hosts":
		if err := ValidateName("host", name); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w semaphore scope %q: want \"groups/<group>\" or \"hosts/<host>\"", ErrInvalid, scope)
	}
	if strings.Contains(unit, "/") {
		return fmt.Errorf("%w semaphore unit %q: a unit name, not a drop-in", ErrInvalid, unit)
	}
	if unit == RebootPool && kind == "groups" {
		return nil
	}
	return ValidateUnit(unit)
}

// validBucket checks a MaxUnavailableBy= bucket: the zero Bucket, or a
// label key and a value (empty: the hosts without the label) by the rules
// of the labels agents publish (selector.Validate). Those rules keep every
// character PoolName leaves as it is out of a key and a value but "/" in a
// key's prefix, which it spells "%2F": the pool stays one key segment and
// tells unit, key and value apart (unit names have no "," or "=", keys no
// "=" or "%", values none of them).
func validBucket(b reconcile.Bucket) error {
	if b.Key == "" {
		if b.Value != "" {
			return fmt.Errorf("%w semaphore bucket: value %q without a label key", ErrInvalid, b.Value)
		}
		return nil
	}
	if err := selector.Validate(b.Key, b.Value); err != nil {
		return fmt.Errorf("%w semaphore bucket (MaxUnavailableBy=): %w", ErrInvalid, err)
	}
	return nil
}

// PoolName is the key segment of the semaphore of unit (or RebootPool) in
// bucket, below <p>/locks/<scope>/: the unit for the zero Bucket,
// "<unit>,<key>=<value>" for a bucket ("<unit>,<key>=" for the hosts
// without the label), a "/" of the key spelled "%2F":
//
//	hello.service                      the whole group
//	hello.service,rack=r1              the hosts with rack=r1
//	hello.service,rack=                the hosts without a rack label
//	reboot,topology.example.com%2Fzone=a
//
// The one rule naming a semaphore's keys (ParsePool reads it back); the
// bucket must be valid (validBucket).
func PoolName(unit string, b reconcile.Bucket) string {
	if b.Key == "" {
		return unit
	}
	return unit + "," + strings.ReplaceAll(b.Key, "/", "%2F") + "=" + b.Value
}

// ParsePool reads a pool segment written by PoolName: the unit (or
// RebootPool) and the bucket. ok is false for a segment PoolName does not
// write for a valid bucket.
func ParsePool(seg string) (unit string, b reconcile.Bucket, ok bool) {
	unit, label, found := strings.Cut(seg, ",")
	if !found {
		return seg, reconcile.Bucket{}, seg != ""
	}
	key, value, found := strings.Cut(label, "=")
	if !found || unit == "" || strings.Contains(key, "/") {
		return "", reconcile.Bucket{}, false
	}
	b = reconcile.Bucket{Key: strings.ReplaceAll(key, "%2F", "/"), Value: value}
	if validBucket(b) != nil || b.Key == "" {
		return "", reconcile.Bucket{}, false
	}
	return unit, b, true
}

// lockDir is "<p>/locks/<scope>/<pool>/" (pool: PoolName); lockKey
// appends the holder.
func (c *Client) lockDir(scope, pool string) string {
	return c.prefix + "/locks/" + scope + "/" + pool + "/"
}

func (c *Client) lockKey(scope, pool, host string) string {
	return c.lockDir(scope, pool) + host
}

// liveLease returns the Session's current lease and a channel closed when
// it is lost; an error (wrapping ErrSlotLost or ErrSessionClosed) when
// there is no live lease.
func (s *Session) liveLease() (clientv3.LeaseID, <-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.stopping {
		return clientv3.NoLease, nil, ErrSessionClosed
	}
	if !s.alive() {
		return clientv3.NoLease, nil, fmt.Errorf("%w: the agent's lease is lost and being re-created", ErrSlotLost)
	}
	return s.sess.Lease(), s.sess.Done(), nil
}

// stamp returns the current time, strictly later than any earlier stamp
// of this Session: it identifies one Acquire call's key.
func (s *Session) stamp() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := time.Now().UTC()
	if !t.After(s.lastStamp) {
		t = s.lastStamp.Add(time.Nanosecond)
	}
	s.lastStamp = t
	return t
}

// goBackground runs f on a goroutine owned by the Session, with the
// Session's context; it does nothing once Close has begun.
func (s *Session) goBackground(f func(ctx context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.stopping {
		return
	}
	s.wg.Go(func() { f(s.bg) })
}

// lock is one Acquire call's key (or one key of a reboot slot, which has
// no Session: see reboot.go).
type lock struct {
	c     *Client
	s     *Session // nil for a reboot slot's key
	key   string   // <dir><host>
	dir   string   // <p>/locks/<scope>/<unit>/
	lease clientv3.LeaseID
	val   Holder // as last written, AcquiredAt zero until granted

	create int64 // the key's CreateRevision: its place in the queue
	mod    int64 // the ModRevision of our last write

	bgOnce sync.Once
}

// acquire enqueues the key, waits until fewer than limit keys are ahead of
// it, and marks it held.
func (l *lock) acquire(ctx context.Context, limit int, lost <-chan struct{}) error {
	if err := l.enqueue(ctx); err != nil {
		return err
	}
	for {
		ahead, rev, err := l.readAhead(ctx)
		if err != nil {
			return err
		}
		if len(ahead) >= limit {
			reread, err := l.wait(ctx, ahead, rev, limit, lost)
			if err != nil {
				return err
			}
			if reread {
				continue
			}
		}
		return l.grant(ctx)
	}
}

// enqueue creates the key, or rewrites this host's existing one (keeping
// its CreateRevision, hence its place), bound to our lease.
func (l *lock) enqueue(ctx context.Context) error {
	c := l.c
	val, err := json.Marshal(l.val)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	put := clientv3.OpPut(l.key, string(val), clientv3.WithLease(l.lease))
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	for range 5 {
		resp, err := c.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", 0)).
			Then(put).Else(clientv3.OpGet(l.key)).Commit()
		if err != nil {
			return writeError("create", err)
		}
		if resp.Succeeded {
			l.create, l.mod = resp.Header.Revision, resp.Header.Revision
			return nil
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			continue // deleted in between
		}
		// This host's key: an earlier call's, or a previous run's whose
		// lease is not gone yet. Take it over where it stands.
		old := kvs[0]
		resp, err = c.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(l.key), "=", old.ModRevision)).
			Then(put).Commit()
		if err != nil {
			return writeError("take over", err)
		}
		if resp.Succeeded {
			l.create, l.mod = old.CreateRevision, resp.Header.Revision
			return nil
		}
	}
	return errors.New("create: key keeps changing; retry")
}

// writeError wraps a failed write; a write bound to a lease etcd no longer
// has means the slot is lost.
func writeError(what string, err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("%s: %w: lease expired or revoked", what, ErrSlotLost)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// readAhead reads, at one revision, our key and the keys created before
// it. It fails with ErrSlotLost when our key is no longer ours.
func (l *lock) readAhead(ctx context.Context) (ahead map[string]bool, rev int64, err error) {
	c := l.c
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Txn(rctx).Then(
		clientv3.OpGet(l.key),
		clientv3.OpGet(l.dir, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(l.create-1)),
	).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("read queue: %w", err)
	}
	if err := l.check(resp.Responses[0].GetResponseRange().GetKvs()); err != nil {
		return nil, 0, err
	}
	ahead = map[string]bool{}
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		ahead[string(kv.Key)] = true
	}
	return ahead, resp.Header.Revision, nil
}

// check verifies that kvs (a read of our key) is our last write.
func (l *lock) check(kvs []*mvccpb.KeyValue) error {
	switch {
	case len(kvs) == 0:
		return fmt.Errorf("%w: key deleted (lease expired or revoked, or removed by hand)", ErrSlotLost)
	case kvs[0].ModRevision != l.mod:
		return fmt.Errorf("%w: key rewritten (a later Acquire for the same unit took it over)", ErrSlotLost)
	}
	return nil
}

// wait watches the queue from rev+1 until fewer than limit of the keys in
// ahead remain. Keys created after ours never count, so deletions of keys
// in ahead are all it takes; no read per event is needed. reread asks the
// caller to read the queue again (history compacted, watch closed).
func (l *lock) wait(ctx context.Context, ahead map[string]bool, rev int64, limit int, lost <-chan struct{}) (reread bool, err error) {
	c := l.c
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	wch := l.watchQueue(wctx, &wg, rev)
	probe := time.NewTicker(c.lockProbe)
	defer probe.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-lost:
			return false, fmt.Errorf("%w: the agent's lease was lost while waiting", ErrSlotLost)
		case <-probe.C:
			// The watch says nothing while etcd is away: ask.
			if err := l.probe(ctx); err != nil {
				return false, err
			}
		case wr, ok := <-wch:
			if !ok || wr.CompactRevision != 0 {
				if ctx.Err() != nil {
					return false, ctx.Err()
				}
				return true, nil
			}
			if err := wr.Err(); err != nil {
				return false, fmt.Errorf("watch %s: %w", l.dir, err)
			}
			for _, ev := range wr.Events {
				k := string(ev.Kv.Key)
				switch {
				case k == l.key:
					kvs := []*mvccpb.KeyValue{ev.Kv}
					if ev.Type == clientv3.EventTypeDelete {
						kvs = nil
					}
					if err := l.check(kvs); err != nil {
						return false, err
					}
				case ev.Type == clientv3.EventTypeDelete:
					delete(ahead, k)
				}
			}
			if len(ahead) < limit {
				return false, nil
			}
		}
	}
}

// watchQueue watches the queue from rev+1 in a goroutine of wg. clientv3's
// Watch call itself blocks while its stream is being (re)connected, and a
// cancelled watch's channel is only closed once the stream is back: the
// goroutine also gives up on wctx (and closes the channel it returns), so
// that the caller's probe runs whatever the watch does.
func (l *lock) watchQueue(wctx context.Context, wg *sync.WaitGroup, rev int64) <-chan clientv3.WatchResponse {
	wch := make(chan clientv3.WatchResponse)
	wg.Go(func() {
		defer close(wch)
		in := l.c.cli.Watch(wctx, l.dir, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for {
			select {
			case <-wctx.Done():
				return
			case wr, ok := <-in:
				if !ok {
					return
				}
				select {
				case wch <- wr:
				case <-wctx.Done():
					return
				}
			}
		}
	})
	return wch
}

// probe reads our key and checks it is our last write.
func (l *lock) probe(ctx context.Context) error {
	rctx, cancel := l.c.reqCtx(ctx)
	resp, err := l.c.cli.Get(rctx, l.key)
	cancel()
	if err != nil {
		return fmt.Errorf("check the queue: %w", err)
	}
	return l.check(resp.Kvs)
}

// grant marks the key held, provided it is still exactly our last write
// (hence still bound to our live lease, in the same place).
func (l *lock) grant(ctx context.Context) error {
	c := l.c
	v := l.val
	v.AcquiredAt = time.Now().UTC()
	val, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Txn(rctx).
		If(clientv3.Compare(clientv3.ModRevision(l.key), "=", l.mod)).
		Then(clientv3.OpPut(l.key, string(val), clientv3.WithLease(l.lease))).Commit()
	if err != nil {
		return writeError("mark held", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: key deleted or rewritten before it was marked held", ErrSlotLost)
	}
	l.val, l.mod = v, resp.Header.Revision
	return nil
}

// release deletes the key if it is still this call's.
func (l *lock) release(ctx context.Context) error {
	rctx, cancel := l.c.reqCtx(ctx)
	defer cancel()
	if err := l.drop(rctx); err != nil {
		l.dropInBackground()
		return fmt.Errorf("release %s: %w (the agent keeps trying; the key also goes with its lease)", l.key, err)
	}
	return nil
}

// abandon removes the key after a failed Acquire, even when ctx is done
// (then trying for at most a second before leaving it to the background,
// so that a shutdown is not held up by an unreachable etcd).
func (l *lock) abandon(ctx context.Context) {
	d := l.c.requestTimeout
	if ctx.Err() != nil {
		d = min(d, time.Second)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	if err := l.drop(rctx); err != nil {
		l.c.log.Debug("remove semaphore key after a failed acquire; retrying in the background", "key", l.key, "err", err)
		l.dropInBackground()
	}
}

// drop deletes the key if it is this call's: bound to our lease and
// carrying our request stamp (a later Acquire of the same key writes a new
// one). Whatever this call wrote — also a write whose outcome it did not
// learn — is recognised.
func (l *lock) drop(ctx context.Context) error {
	c := l.c
	for range 5 {
		resp, err := c.cli.Get(ctx, l.key)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		kv := resp.Kvs[0]
		var h Holder
		if clientv3.LeaseID(kv.Lease) != l.lease || json.Unmarshal(kv.Value, &h) != nil || !h.RequestedAt.Equal(l.val.RequestedAt) {
			return nil // not ours (any more)
		}
		tr, err := c.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(l.key), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(l.key)).Commit()
		if err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		if tr.Succeeded {
			return nil
		}
	}
	return errors.New("delete: key keeps changing")
}

// dropInBackground retries drop with backoff until it succeeds, the lease
// is no longer the Session's live one (the key goes with it), or the
// Session closes (which revokes the lease). A reboot slot's key has no
// Session: it goes with its lease.
func (l *lock) dropInBackground() {
	if l.s == nil {
		return
	}
	l.bgOnce.Do(func() {
		l.s.goBackground(func(ctx context.Context) {
			for fails := 0; ; fails++ {
				if sleepCtx(ctx, backoffDelay(fails)) != nil {
					return
				}
				if lease, _, err := l.s.liveLease(); err != nil || lease != l.lease {
					return
				}
				rctx, cancel := l.c.reqCtx(ctx)
				err := l.drop(rctx)
				cancel()
				if err == nil {
					return
				}
				l.c.log.Debug("remove semaphore key", "key", l.key, "err", err)
			}
		})
	})
}
