package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/internal/testport"
	"github.com/agentd/agentd/reconcile"
)

const (
	semScope = "groups/web"
	semUnit  = "hello.service"
)

// agent simulates one agentd: its own etcd client and Session.
func agent(t *testing.T, endpoint, host string) (*Client, *Session) {
	t.Helper()
	c := NewTestClient(t, endpoint)
	return c, mustJoin(t, c, member(host, "m-"+host))
}

type acquired struct {
	release func(context.Context) error
	err     error
	at      time.Time
}

// acquireAsync runs Acquire in the background; the result arrives on the
// channel.
func acquireAsync(ctx context.Context, s *Session, limit int) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		rel, err := s.Acquire(ctx, semScope, reconcile.Bucket{}, semUnit, "hash-1", limit)
		ch <- acquired{rel, err, time.Now()}
	}()
	return ch
}

func mustAcquire(t *testing.T, s *Session, limit int) func(context.Context) error {
	t.Helper()
	rel, err := s.Acquire(ctxT(t), semScope, reconcile.Bucket{}, semUnit, "hash-1", limit)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", s.member.Host, err)
	}
	return rel
}

func mustRelease(t *testing.T, rel func(context.Context) error) {
	t.Helper()
	if err := rel(ctxT(t)); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// holders renders the queue as "host" (held) and "host?" (waiting).
func holders(t *testing.T, c *Client) []string {
	t.Helper()
	hs, err := c.Holders(ctxT(t), semScope, reconcile.Bucket{}, semUnit)
	if err != nil {
		t.Fatalf("Holders: %v", err)
	}
	var out []string
	for _, h := range hs {
		if h.Waiting() {
			out = append(out, h.Host+"?")
		} else {
			out = append(out, h.Host)
		}
	}
	return out
}

func waitHolders(t *testing.T, c *Client, timeout time.Duration, want ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := holders(t, c)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Holders = %v, want %v", got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func notYet(t *testing.T, ch <-chan acquired, d time.Duration, who string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: Acquire returned (err %v) while it should wait", who, r.err)
	case <-time.After(d):
	}
}

func waitAcquired(t *testing.T, ch <-chan acquired, timeout time.Duration, who string) acquired {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: Acquire: %v", who, r.err)
		}
		return r
	case <-time.After(timeout):
		t.Fatalf("%s: Acquire still waiting after %s", who, timeout)
	}
	panic("unreachable")
}

func waitFailed(t *testing.T, ch <-chan acquired, timeout time.Duration, who string) error {
	t.Helper()
	select {
	case r := <-ch:
		if r.err == nil {
			t.Fatalf("%s: Acquire succeeded, want an error", who)
		}
		if r.release != nil {
			t.Errorf("%s: Acquire returned a release func with its error", who)
		}
		return r.err
	case <-time.After(timeout):
		t.Fatalf("%s: Acquire still waiting after %s, want an error", who, timeout)
	}
	panic("unreachable")
}

type span struct {
	host    string
	in, out time.Time
}

// maxOverlap is the largest number of spans open at one instant.
func maxOverlap(spans []span) int {
	type edge struct {
		at time.Time
		d  int
	}
	var edges []edge
	for _, s := range spans {
		edges = append(edges, edge{s.in, +1}, edge{s.out, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.d - b.d // close before open at the same instant
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.d
		most = max(most, n)
	}
	return most
}

// Five agents hammer acquire → hold briefly → release; the critical
// section counts itself with an atomic counter and records its entry and
// exit times, and a sixth client watches the held keys in etcd. Neither
// may ever see more than limit holders.
func TestSemaphoreBound(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 2} {
		t.Run(fmt.Sprintf("limit=%d", limit), func(t *testing.T) {
			t.Parallel()
			e := StartTestEtcd(t)
			var agents []*Session
			for i := range 5 {
				_, s := agent(t, e.Endpoint(), fmt.Sprintf("h%d", i))
				agents = append(agents, s)
			}
			observer := NewTestClient(t, e.Endpoint())
			const runs, rounds = 3, 8
			peak := 0
			for run := range runs {
				var (
					inside, most atomic.Int32
					mu           sync.Mutex
					spans        []span
					wg           sync.WaitGroup
				)
				ctx := ctxT(t)
				stopObs := make(chan struct{})
				var obsMax, obsReads int
				var obs sync.WaitGroup
				obs.Go(func() {
					for {
						select {
						case <-stopObs:
							return
						default:
						}
						hs, err := observer.Holders(ctx, semScope, reconcile.Bucket{}, semUnit)
						if err != nil {
							t.Errorf("Holders: %v", err)
							return
						}
						held := 0
						for _, h := range hs {
							if !h.Waiting() {
								held++
							}
						}
						obsMax, obsReads = max(obsMax, held), obsReads+1
					}
				})
				start := time.Now()
				for _, s := range agents {
					wg.Go(func() {
						for range rounds {
							release, err := s.Acquire(ctx, semScope, reconcile.Bucket{}, semUnit, "hash-1", limit)
							if err != nil {
								t.Errorf("%s: Acquire: %v", s.member.Host, err)
								return
							}
							in := time.Now()
							n := inside.Add(1)
							for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
							}
							if n > int32(limit) {
								t.Errorf("%s entered with %d holders inside, limit %d", s.member.Host, n, limit)
							}
							time.Sleep(time.Millisecond + rand.N(3*time.Millisecond))
							out := time.Now()
							inside.Add(-1)
							mu.Lock()
							spans = append(spans, span{s.member.Host, in, out})
							mu.Unlock()
							if err := release(ctx); err != nil {
								t.Errorf("%s: release: %v", s.member.Host, err)
								return
							}
						}
					})
				}
				wg.Wait()
				close(stopObs)
				obs.Wait()
				overlap := maxOverlap(spans)
				t.Logf("run %d: %d acquisitions in %s; max inside %d (atomic), %d (timestamps), %d held in etcd over %d reads",
					run, len(spans), time.Since(start).Round(time.Millisecond), most.Load(), overlap, obsMax, obsReads)
				if overlap > limit || int(most.Load()) > limit || obsMax > limit {
					t.Errorf("run %d: bound %d exceeded: atomic %d, timestamps %d, etcd %d", run, limit, most.Load(), overlap, obsMax)
				}
				if len(spans) != len(agents)*rounds {
					t.Errorf("run %d: %d acquisitions, want %d", run, len(spans), len(agents)*rounds)
				}
				peak = max(peak, overlap)
				if got := holders(t, observer); len(got) != 0 {
					t.Errorf("run %d: keys left after everyone released: %v", run, got)
				}
			}
			if peak < limit {
				t.Errorf("never more than %d holders at once with limit %d: the semaphore admits too few", peak, limit)
			}
		})
	}
}

// Waiters are served in the order they queued.
func TestSemaphoreFIFO(t *testing.T) {
	t.Parallel()
	e := StartTestEtcd(t)
	c, first := agent(t, e.Endpoint(), "h0")
	rel := mustAcquire(t, first, 1)
	order := make(chan string, 4)
	var wg sync.WaitGroup
	var want []string
	queue := []string{"h0"}
	for i := 1; i <= 4; i++ {
		host := fmt.Sprintf("h%d", i)
		_, s := agent(t, e.Endpoint(), host)
		want = append(want, host)
		queue = append(queue, host+"?")
		wg.Go(func() {
			r, err := s.Acquire(ctxT(t), semScope, reconcile.Bucket{}, semUnit, "hash-1", 1)
			if err != nil {
				t.Errorf("%s: Acquire: %v", host, err)
				return
			}
			order <- host
			time.Sleep(20 * time.Millisecond)
			if err := r(ctxT(t)); err != nil {
				t.Errorf("%s: release: %v", host, err)
			}
		})
		waitHolders(t, c, 5*time.Second, queue...) // queued before the next one starts
	}
	mustRelease(t, rel)
	wg.Wait()
	close(order)
	var got []string
	for h := range order {
		got = append(got, h)
	}
	if !slices.Equal(got, want) {
		t.Errorf("served in order %v, want %v", got, want)
	}
}

// A holder that dies frees its slot within its lease TTL and the next
// waiter proceeds: killed and cleaned up by the next run of its agent
// (lease revoked), or killed for good (lease expires).
func TestSemaphoreHolderDies(t *testing.T) {
	t.Parallel()
	t.Run("revoked", func(t *testing.T) {
		t.Parallel()
		e := StartTestEtcd(t)
		other := NewTestClient(t, e.Endpoint())
		_, a := agent(t, e.Endpoint(), "a")
		_, b := agent(t, e.Endpoint(), "b")
		relA := mustAcquire(t, a, 1)
		waitB := acquireAsync(ctxT(t), b, 1)
		waitHolders(t, other, 5*time.Second, "a", "b?")
		if held, err := b.Holding(ctxT(t), semScope, reconcile.Bucket{}, semUnit); err != nil || held {
			t.Errorf("waiting b: Holding = %v, %v; want false", held, err)
		}

		start := time.Now()
		oldLease := a.Lease()
		if _, err := other.cli.Revoke(ctxT(t), oldLease); err != nil {
			t.Fatal(err)
		}
		r := waitAcquired(t, waitB, 5*time.Second, "b")
		t.Logf("b got the slot %s after a's lease was revoked", r.at.Sub(start).Round(time.Millisecond))
		waitHolders(t, other, time.Second, "b")

		// a's hold is gone, also once its Session has a new lease.
		if held, err := a.Holding(ctxT(t), semScope, reconcile.Bucket{}, semUnit); err != nil || held {
			t.Errorf("a after its lease was revoked: Holding = %v, %v; want false", held, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for a.Lease() == oldLease || a.Lease() == clientv3.NoLease {
			if time.Now().After(deadline) {
				t.Fatal("a's Session did not re-create its lease")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if held, err := a.Holding(ctxT(t), semScope, reconcile.Bucket{}, semUnit); err != nil || held {
			t.Errorf("a with a new lease: Holding = %v, %v; want false", held, err)
		}
		mustRelease(t, relA) // nothing to release any more
		waitHolders(t, other, time.Second, "b")
		mustRelease(t, r.release)
		waitHolders(t, other, time.Second)
	})
	t.Run("expired", func(t *testing.T) {
		t.Parallel()
		e := StartTestEtcd(t)
		other := NewTestClient(t, e.Endpoint())
		ca := NewTestClient(t, e.Endpoint())
		// The lease outlives the cut by TTL less the age of its last
		// keep-alive (sent every TTL/2): 5 s keeps "not yet" true for the
		// first second even when a loaded machine delays keep-alives.
		const ttl = 5 * time.Second
		a, err := ca.Join(ctxT(t), member("a", "m-a"), ttl)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		_, b := agent(t, e.Endpoint(), "b")
		mustAcquire(t, a, 1)
		waitB := acquireAsync(ctxT(t), b, 1)
		waitHolders(t, other, 5*time.Second, "a", "b?")

		// SIGKILL: the connection goes, nothing is revoked.
		start := time.Now()
		ca.cli.Close()
		notYet(t, waitB, time.Second, "b while a's lease is still valid")
		r := waitAcquired(t, waitB, ttl+3*time.Second, "b")
		took := r.at.Sub(start)
		t.Logf("b got the slot %s after a's connection was cut (lease TTL %s)", took.Round(time.Millisecond), ttl)
		if took > ttl+time.Second {
			t.Errorf("slot freed %s after the holder died, want within the TTL (%s) plus etcd's 0.5 s expiry check", took, ttl)
		}
		waitHolders(t, other, time.Second, "b")
	})
}

// Etcd away while waiting: Acquire fails and holds nothing, the holder
// cannot confirm its slot; when etcd is back, the waiter's key is gone,
// the holder still holds, and the queue moves on.
func TestSemaphoreUnreachable(t *testing.T) {
	t.Parallel()
	cfg := EmbedConfig{
		Dir:       t.TempDir(),
		ClientURL: fmt.Sprintf("http://127.0.0.1:%d", testport.Restartable(t)),
		PeerURL:   "http://127.0.0.1:0",
		ForTests:  true,
		Logger:    slog.New(slog.NewTextHandler(t.Output(), nil)),
	}
	e, err := StartEmbedded(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	closeEtcd := sync.OnceFunc(e.Close)
	t.Cleanup(func() { closeEtcd() })
	fast := func(c *Client) *Client {
		c.requestTimeout, c.lockProbe = 300*time.Millisecond, 100*time.Millisecond
		return c
	}
	ca, cb := fast(NewTestClient(t, e.Endpoint())), fast(NewTestClient(t, e.Endpoint()))
	a := mustJoin(t, ca, member("a", "m-a"))
	b := mustJoin(t, cb, member("b", "m-b"))
	relA := mustAcquire(t, a, 1)
	waitB := acquireAsync(ctxT(t), b, 1)
	waitHolders(t, ca, 5*time.Second, "a", "b?")

	start := time.Now()
	closeEtcd()
	err = waitFailed(t, waitB, 3*time.Second, "b with etcd down")
	t.Logf("b's Acquire failed %s after etcd went: %v", time.Since(start).Round(time.Millisecond), err)
	if held, err := a.Holding(ctxT(t), semScope, reconcile.Bucket{}, semUnit); err == nil || held {
		t.Errorf("a with etcd down: Holding = %v, %v; want an error", held, err)
	}
	if _, err := b.Acquire(ctxT(t), semScope, reconcile.Bucket{}, semUnit, "hash-1", 1); err == nil {
		t.Errorf("Acquire with etcd down succeeded")
	}

	// etcd is back within the lease TTL: leases and a's slot survive;
	// b's abandoned key is removed in the background.
	e, err = StartEmbedded(ctxT(t), cfg)
	if err != nil {
		t.Fatalf("restart etcd: %v", err)
	}
	closeEtcd = sync.OnceFunc(e.Close)
	start = time.Now()
	waitHolders(t, NewTestClient(t, e.Endpoint()), 10*time.Second, "a")
	t.Logf("b's abandoned key removed %s after etcd restarted", time.Since(start).Round(time.Millisecond))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		// a's own connection comes back after gRPC's reconnect backoff.
		held, err := a.Holding(ctxT(t), semScope, reconcile.Bucket{}, semUnit)
		if err == nil && !held {
			t.Fatalf("a lost its slot in a short etcd outage")
		}
		if held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a after etcd returned: Holding: %v", err)
		}
	}
	waitB = acquireAsync(ctxT(t), b, 1)
	notYet(t, waitB, 200*time.Millisecond, "b behind a")
	mustRelease(t, relA)
	r := waitAcquired(t, waitB, 5*time.Second, "b after a released")
	mustRelease(t, r.release)
}

// A host never takes two slots: a retried Acquire, and one finding a key
// left by the host's previous run, reuse the key and its place.
func TestSemaphoreReacquire(t *testing.T) {
	t.Parallel()
	e := StartTestEtcd(t)
	raw := NewTestClient(t, e.Endpoint())
	_, h1 := agent(t, e.Endpoint(), "h1")
	_, h2 := agent(t, e.Endpoint(), "h2")
	_, h3 := agent(t, e.Endpoint(), "h3")
	ctx := ctxT(t)
	key := "/agentd/locks/groups/web/hello.service/h1"
	createRev := func() int64 {
		t.Helper()
		resp, err := raw.cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) == 0 {
			t.Fatalf("get %s: %v (found %d)", key, err, len(resp.Kvs))
		}
		return resp.Kvs[0].CreateRevision
	}

	rel1 := mustAcquire(t, h1, 2)
	rev := createRev()
	rel2 := mustAcquire(t, h1, 2) // retried call: returns at once
	if got := createRev(); got != rev {
		t.Errorf("re-acquire moved the key: CreateRevision %d → %d", rev, got)
	}
	waitHolders(t, raw, time.Second, "h1")
	relH2 := mustAcquire(t, h2, 2) // the second slot is still free
	waitH3 := acquireAsync(ctx, h3, 2)
	notYet(t, waitH3, 200*time.Millisecond, "h3 with both slots held")
	waitHolders(t, raw, time.Second, "h1", "h2", "h3?")

	mustRelease(t, rel1) // superseded by the second call: does nothing
	waitHolders(t, raw, time.Second, "h1", "h2", "h3?")
	mustRelease(t, rel2)
	waitAcquired(t, waitH3, 5*time.Second, "h3 after h1 released")
	mustRelease(t, rel2) // idempotent
	mustRelease(t, relH2)
	waitHolders(t, raw, time.Second, "h3")

	// h1's previous run left a held key under a lease of its own, ahead
	// of h2 in the queue; the new run takes the key over where it stands.
	g, err := raw.cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	val, _ := json.Marshal(Holder{Host: "h1", Hash: "old", RequestedAt: time.Now(), AcquiredAt: time.Now()})
	if _, err := raw.cli.Put(ctx, key, string(val), clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	rev = createRev()
	waitH2 := acquireAsync(ctx, h2, 2)
	waitHolders(t, raw, time.Second, "h3", "h1", "h2?")
	rel := mustAcquire(t, h1, 2)
	if l, _ := keyLease(t, raw, key); l != h1.Lease() {
		t.Errorf("taken-over key has lease %x, want the new run's %x", l, h1.Lease())
	}
	if got := createRev(); got != rev {
		t.Errorf("take-over moved the key: CreateRevision %d → %d", rev, got)
	}
	hs, _ := raw.Holders(ctx, semScope, reconcile.Bucket{}, semUnit)
	if len(hs) != 3 || hs[1].Hash != "hash-1" {
		t.Errorf("Holders after take-over = %+v", hs)
	}
	notYet(t, waitH2, 200*time.Millisecond, "h2 behind the taken-over key")
	mustRelease(t, rel)
	r := waitAcquired(t, waitH2, 5*time.Second, "h2 after h1 released")
	mustRelease(t, r.release)
}

// A waiter gives up cleanly: on ctx end, and when its own lease goes.
func TestSemaphoreWaiterGivesUp(t *testing.T) {
	t.Parallel()
	e := StartTestEtcd(t)
	raw := NewTestClient(t, e.Endpoint())
	_, a := agent(t, e.Endpoint(), "a")
	_, b := agent(t, e.Endpoint(), "b")
	rel := mustAcquire(t, a, 1)

	ctx, cancel := context.WithCancel(ctxT(t))
	waitB := acquireAsync(ctx, b, 1)
	waitHolders(t, raw, 5*time.Second, "a", "b?")
	cancel()
	if err := waitFailed(t, waitB, 2*time.Second, "b cancelled"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Acquire: %v, want context.Canceled", err)
	}
	waitHolders(t, raw, time.Second, "a")

	waitB = acquireAsync(ctxT(t), b, 1)
	waitHolders(t, raw, 5*time.Second, "a", "b?")
	if _, err := raw.cli.Revoke(ctxT(t), b.Lease()); err != nil {
		t.Fatal(err)
	}
	if err := waitFailed(t, waitB, 2*time.Second, "b without a lease"); !errors.Is(err, ErrSlotLost) {
		t.Errorf("Acquire whose lease was revoked: %v, want ErrSlotLost", err)
	} else {
		t.Logf("lease lost while waiting: %v", err)
	}
	mustRelease(t, rel)
	waitHolders(t, raw, time.Second)
}

func TestSemaphoreInvalid(t *testing.T) {
	t.Parallel()
	e := StartTestEtcd(t)
	c, s := agent(t, e.Endpoint(), "h1")
	for _, tc := range []struct {
		scope, unit string
		limit       int
	}{
		{"web", semUnit, 1},
		{"groups/", semUnit, 1},
		{"groups/a/b", semUnit, 1},
		{"nodes/h1", semUnit, 1},
		{semScope, "hello.service.d/x.conf", 1},
		{semScope, "hello", 1},
		{semScope, semUnit, 0},
	} {
		if _, err := s.Acquire(ctxT(t), tc.scope, reconcile.Bucket{}, tc.unit, "x", tc.limit); !errors.Is(err, ErrInvalid) {
			t.Errorf("Acquire(%q, %q, %d): %v, want ErrInvalid", tc.scope, tc.unit, tc.limit, err)
		}
		if tc.limit == 0 {
			continue
		}
		if _, err := s.Holding(ctxT(t), tc.scope, reconcile.Bucket{}, tc.unit); !errors.Is(err, ErrInvalid) {
			t.Errorf("Holding(%q, %q): %v, want ErrInvalid", tc.scope, tc.unit, err)
		}
		if _, err := c.Holders(ctxT(t), tc.scope, reconcile.Bucket{}, tc.unit); !errors.Is(err, ErrInvalid) {
			t.Errorf("Holders(%q, %q): %v, want ErrInvalid", tc.scope, tc.unit, err)
		}
	}
	// Host scopes work the same way; keys are laid out as documented.
	rel, err := s.Acquire(ctxT(t), "hosts/h1", reconcile.Bucket{}, "a@1.service", "abc", 1)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.cli.Get(ctxT(t), "/agentd/locks/hosts/h1/a@1.service/h1")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("lock key: %v, %d keys", err, len(resp.Kvs))
	}
	v := string(resp.Kvs[0].Value)
	for _, f := range []string{`"host":"h1"`, `"hash":"abc"`, `"requestedAt":`, `"acquiredAt":`} {
		if !strings.Contains(v, f) {
			t.Errorf("lock value %s lacks %s", v, f)
		}
	}
	mustRelease(t, rel)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctxT(t), semScope, reconcile.Bucket{}, semUnit, "x", 1); !errors.Is(err, ErrSessionClosed) {
		t.Errorf("Acquire after Close: %v, want ErrSessionClosed", err)
	}
}
