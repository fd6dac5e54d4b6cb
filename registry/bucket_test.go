package registry

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
)

// PoolName is the one rule naming a semaphore's queue: one key segment
// for any valid bucket, read back by ParsePool; what it never writes is
// not read as a pool.
func TestPoolName(t *testing.T) {
	for _, tc := range []struct {
		unit   string
		bucket reconcile.Bucket
		want   string
	}{
		{"app.service", reconcile.Bucket{}, "app.service"},
		{"app.service", reconcile.Bucket{Key: "rack", Value: "r1"}, "app.service,rack=r1"},
		{"app.service", reconcile.Bucket{Key: "rack"}, "app.service,rack="},
		{"w@.service", reconcile.Bucket{Key: "os.id", Value: "debian"}, "w@.service,os.id=debian"},
		{RebootPool, reconcile.Bucket{Key: "rack", Value: "R-1_a.b"}, "reboot,rack=R-1_a.b"},
		{"app.service", reconcile.Bucket{Key: "topology.example.com/zone", Value: "eu-1"}, "app.service,topology.example.com%2Fzone=eu-1"},
		{`a\x2db.service`, reconcile.Bucket{Key: "rack", Value: "r1"}, `a\x2db.service,rack=r1`},
	} {
		if err := validLock("groups/web", tc.bucket, tc.unit); err != nil {
			t.Errorf("validLock(%s, %+v): %v", tc.unit, tc.bucket, err)
		}
		got := PoolName(tc.unit, tc.bucket)
		if got != tc.want || strings.Contains(got, "/") {
			t.Errorf("PoolName(%s, %+v) = %q, want %q (one key segment)", tc.unit, tc.bucket, got, tc.want)
		}
		unit, b, ok := ParsePool(got)
		if !ok || unit != tc.unit || b != tc.bucket {
			t.Errorf("ParsePool(%q) = %q %+v %v, want %q %+v", got, unit, b, ok, tc.unit, tc.bucket)
		}
	}
	for _, seg := range []string{"", ",rack=r1", "app.service,rack", "app.service,=r1", "app.service,rack=r/1", "app.service,rack=r=1",
		"app.service,ra ck=r1", "app.service,rack=r1,zone=a", "app.service,a/b=c", "app.service,rack=-r1"} {
		if unit, b, ok := ParsePool(seg); ok {
			t.Errorf("ParsePool(%q) = %q %+v, want not a pool", seg, unit, b)
		}
	}
	// Buckets that would not make one safe segment are refused before any
	// key is written.
	for _, b := range []reconcile.Bucket{
		{Value: "r1"}, {Key: "rack", Value: "r/1"}, {Key: "rack", Value: "r1,zone=a"}, {Key: "ra=ck", Value: "r1"},
		{Key: "rack", Value: "../x"}, {Key: "rack", Value: strings.Repeat("r", 64)}, {Key: "a/b/c", Value: "x"},
	} {
		if err := validLock("groups/web", b, "app.service"); !errors.Is(err, ErrInvalid) {
			t.Errorf("validLock(%+v) = %v, want ErrInvalid", b, err)
		}
	}
}

// MaxUnavailableBy=: one semaphore per label value. With limit 1, a host
// of rack r1 and one of rack r2 hold at once; a second r1 host waits for
// the first; the hosts without the label share a bucket of their own.
// The keys are named by PoolName, and Slots lists each queue with its
// bucket and its limit as the group's keys say.
func TestSemaphoreBuckets(t *testing.T) {
	t.Parallel()
	e := StartTestEtcd(t)
	c := NewTestClient(t, e.Endpoint())
	unit := "[Service]\nExecStart=/bin/true\n[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=rack\n"
	if _, err := c.Put(ctxT(t), Target{Group: "web"}, map[string][]byte{"app.service": []byte(unit)}); err != nil {
		t.Fatal(err)
	}
	r1, r2, none := reconcile.Bucket{Key: "rack", Value: "r1"}, reconcile.Bucket{Key: "rack", Value: "r2"}, reconcile.Bucket{Key: "rack"}
	sessions := map[string]*Session{}
	for _, h := range []string{"h1", "h2", "h3", "h4", "h5"} {
		_, sessions[h] = agent(t, e.Endpoint(), h)
	}
	acquire := func(host string, b reconcile.Bucket) <-chan acquired {
		ch := make(chan acquired, 1)
		go func() {
			rel, err := sessions[host].Acquire(ctxT(t), semScope, b, "app.service", "hash-1", 1)
			ch <- acquired{rel, err, time.Now()}
		}()
		return ch
	}
	h1 := waitAcquired(t, acquire("h1", r1), 10*time.Second, "h1 in rack=r1")
	h2 := waitAcquired(t, acquire("h2", r2), 10*time.Second, "h2 in rack=r2 while h1 holds rack=r1's")
	h4 := waitAcquired(t, acquire("h4", none), 10*time.Second, "h4 without a rack label")
	h3 := acquire("h3", r1)
	h5 := acquire("h5", none)
	notYet(t, h3, 300*time.Millisecond, "h3 in rack=r1 while h1 holds its slot")
	notYet(t, h5, 0, "h5 without a rack label while h4 holds that bucket's slot")

	for _, tc := range []struct {
		b    reconcile.Bucket
		want []string
	}{{r1, []string{"h1", "h3"}}, {r2, []string{"h2"}}, {none, []string{"h4", "h5"}}, {reconcile.Bucket{}, nil}} {
		hs, err := c.Holders(ctxT(t), semScope, tc.b, "app.service")
		var got []string
		for _, h := range hs {
			got = append(got, h.Host)
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Holders(%s): %v %v, want %v", tc.b, got, err, tc.want)
		}
		if ok, err := sessions["h1"].Holding(ctxT(t), semScope, tc.b, "app.service"); err != nil || ok != (tc.b == r1) {
			t.Errorf("h1 Holding(%s) = %v %v", tc.b, ok, err)
		}
	}
	resp, err := c.cli.Get(ctxT(t), DefaultPrefix+"/locks/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	slices.Sort(keys)
	wantKeys := []string{
		"/agentd/locks/groups/web/app.service,rack=/h4", "/agentd/locks/groups/web/app.service,rack=/h5",
		"/agentd/locks/groups/web/app.service,rack=r1/h1", "/agentd/locks/groups/web/app.service,rack=r1/h3",
		"/agentd/locks/groups/web/app.service,rack=r2/h2",
	}
	if !slices.Equal(keys, wantKeys) {
		t.Errorf("keys:\n got %q\nwant %q", keys, wantKeys)
	}

	slots, err := c.Slots(ctxT(t), "groups/web")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, s := range slots {
		held := "held"
		if !s.Held() {
			held = "waiting behind " + strings.Join(s.Ahead, ",")
		}
		rows = append(rows, fmt.Sprintf("%s %s %s limit %d %s", s.Pool, s.Bucket, s.Holder, s.Limit, held))
	}
	wantRows := []string{
		"app.service (no rack) h4 limit 1 held", "app.service (no rack) h5 limit 1 waiting behind h4",
		"app.service rack=r1 h1 limit 1 held", "app.service rack=r1 h3 limit 1 waiting behind h1",
		"app.service rack=r2 h2 limit 1 held",
	}
	if !slices.Equal(rows, wantRows) {
		t.Errorf("Slots:\n got %q\nwant %q", rows, wantRows)
	}

	mustRelease(t, h1.release)
	waitAcquired(t, h3, 10*time.Second, "h3 once h1 gave rack=r1's slot back")
	notYet(t, h5, 200*time.Millisecond, "h5 while h4 still holds")
	mustRelease(t, h4.release)
	waitAcquired(t, h5, 10*time.Second, "h5 once h4 gave its slot back")
	mustRelease(t, h2.release)
}
