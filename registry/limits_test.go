package registry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// bigUnits is n unit files of size bytes each, a.service, b.service, …
func bigUnits(n, size int) map[string][]byte {
	units := map[string][]byte{}
	for i := range n {
		head := fmt.Sprintf("[Service]\nExecStart=/bin/true %d\n", i)
		units[fmt.Sprintf("u%03d.service", i)] = []byte(head + strings.Repeat("#", size-len(head)))
	}
	return units
}

// assertNothingStored fails t if anything was written under the prefix of
// c: unit keys or their history.
func assertNothingStored(t *testing.T, c *Client) {
	t.Helper()
	resp, err := c.cli.Get(ctxT(t), c.prefix+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		t.Errorf("stored %s, want nothing", kv.Key)
	}
}

// The case: six units of 250 KB. With their history copies the
// transaction is 3.1 MB, over etcd's 1.5 MiB.
func TestLimitRequestBytesRefusedBeforeSending(t *testing.T) {
	c := NewTestClient(t, StartTestEtcd(t).Endpoint())
	_, err := c.Put(ctxT(t), Target{Host: "h1"}, bigUnits(6, 250<<10))
	var le *LimitError
	if !errors.As(err, &le) || !errors.Is(err, ErrTooLarge) || le.Limit != LimitRequest || le.Server {
		t.Fatalf("Put = %v, want a LimitError on the request size, found before sending", err)
	}
	want := "this put to hosts/h1 is 3.1 MB (6 keys, each with a copy in its history); the registry takes at most 1.5 MiB in one request (etcd's --max-request-bytes): split it, or raise the server's limit; nothing stored"
	if err.Error() != want {
		t.Errorf("message:\n got %s\nwant %s", err, want)
	}
	assertNothingStored(t, c)

	// Just under the limit is stored: the check measures what etcd measures.
	under := bigUnits(3, 250<<10)
	if _, err := c.Put(ctxT(t), Target{Host: "h1"}, under); err != nil {
		t.Fatalf("a put of 1.5 MB: %v", err)
	}
	if n := requestBytes(writeTxnFor(c, under).txn); n > MaxRequestBytes || n < 3*2*250<<10 {
		t.Errorf("measured %d bytes for 3 × 250 KiB twice", n)
	}
}

// writeTxnFor is a rough put of units (keys and their history copies) for
// measuring.
func writeTxnFor(c *Client, units map[string][]byte) writeTxn {
	w := writeTxn{op: "put", target: Target{Host: "h1"}, keys: len(units)}
	for u, v := range units {
		w.ops = append(w.ops, clientv3.OpPut(c.targetUnits(w.target)+u, string(v)), clientv3.OpPut(c.historyKey(w.target, u, 1), string(v)))
	}
	return w
}

func TestLimitTxnOpsRefusedBeforeSending(t *testing.T) {
	c := NewTestClient(t, StartTestEtcd(t).Endpoint())
	_, err := c.Put(ctxT(t), Target{Group: "web"}, bigUnits(600, 100))
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != LimitOps || le.Server {
		t.Fatalf("Put = %v, want a LimitError on the operations", err)
	}
	want := "this put to groups/web is 1200 operations in one transaction (600 keys, each with its history record); the registry takes at most 1024 (etcd's --max-txn-ops): split it, or raise the server's limit; nothing stored"
	if err.Error() != want {
		t.Errorf("message:\n got %s\nwant %s", err, want)
	}
	assertNothingStored(t, c)
}

func TestLimitValueRefusedBeforeSending(t *testing.T) {
	c := NewTestClient(t, StartTestEtcd(t).Endpoint())
	_, err := c.Put(ctxT(t), Target{Host: "h1"}, bigUnits(1, 300_000))
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != LimitValue {
		t.Fatalf("Put = %v, want a LimitError on the value", err)
	}
	want := "u000.service is 300.0 kB; the registry takes at most 256 KiB in one value: make it smaller (agentd's limit for a unit file); nothing stored"
	if err.Error() != want {
		t.Errorf("message:\n got %s\nwant %s", err, want)
	}
	assertNothingStored(t, c)
}

// startSmallEtcd runs an etcd whose limits are lower than agentd's: a
// cluster set up by hand with etcd's defaults, or stricter.
func startSmallEtcd(t *testing.T, maxRequestBytes uint) *Client {
	t.Helper()
	ec := embed.NewConfig()
	ec.Dir = t.TempDir()
	u, _ := url.Parse("http://127.0.0.1:0")
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*u}, []url.URL{*u}
	ec.ListenPeerUrls = nil
	p, _ := url.Parse(placeholderPeerURL)
	ec.AdvertisePeerUrls = []url.URL{*p}
	ec.InitialCluster = ec.InitialClusterFromName(ec.Name)
	ec.TickMs, ec.ElectionMs, ec.UnsafeNoFsync = 10, 100, true
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	ec.MaxRequestBytes = maxRequestBytes // MaxTxnOps: etcd's default, 128
	e, err := embed.StartEtcd(ec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(15 * time.Second):
		t.Fatal("etcd not ready in 15s")
	}
	return NewTestClient(t, "http://"+e.Clients[0].Addr().String())
}

// A server whose limits are lower than agentd's refuses what agentd let
// through: its error is said in the same words, and nothing is stored.
func TestLimitLowerOnTheServerSaidPlainly(t *testing.T) {
	c := startSmallEtcd(t, 100<<10)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		units map[string][]byte
		limit Limit
		says  string
	}{
		// etcd's own check: "etcdserver: request is too large".
		{"over --max-request-bytes", bigUnits(3, 50<<10), LimitRequest,
			"this put to hosts/h1 is 308.4 kB (3 keys, each with a copy in its history); etcd refused it as too large for one request: its --max-request-bytes is lower than the 1.5 MiB agentd allows: split it, or raise the server's limit; nothing stored"},
		// gRPC's, before etcd sees it (the server receives at most
		// --max-request-bytes + 512 KiB): ResourceExhausted.
		{"over the server's gRPC limit", bigUnits(3, 200<<10), LimitRequest, "etcd refused it as too large for one request"},
		{"over --max-txn-ops", bigUnits(100, 100), LimitOps,
			"this put to hosts/h1 is 200 operations in one transaction (100 keys, each with its history record); etcd refused it: its --max-txn-ops is lower than the 1024 agentd needs: split it, or raise the server's limit; nothing stored"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Put(ctx, Target{Host: "h1"}, tc.units)
			var le *LimitError
			if !errors.As(err, &le) || le.Limit != tc.limit || !le.Server {
				t.Fatalf("Put = %v, want a LimitError from the server", err)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("message:\n got %s\nwant %s", err, tc.says)
			}
			assertNothingStored(t, c)
		})
	}
}

func TestRemoveRefusesToLeaveDropInsWithoutTheirUnit(t *testing.T) {
	c := NewTestClient(t, StartTestEtcd(t).Endpoint())
	ctx := ctxT(t)
	h1 := Target{Host: "h1"}
	if _, err := c.Put(ctx, h1, map[string][]byte{
		"dd.service": []byte("[Service]\nExecStart=/bin/true\n"), "dd.service.d/x.conf": []byte("[Service]\n"),
		"dd.service.d/y.conf": []byte("[Unit]\n"), "other.service": []byte("[Service]\nExecStart=/bin/true\n"),
		"dd.socket.d/z.conf": []byte("[Unit]\n"),
	}); err != nil {
		t.Fatal(err)
	}
	keys := func() string {
		ls, err := c.List(ctx, &h1)
		if err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, l := range ls {
			ks = append(ks, l.Unit)
		}
		return strings.Join(ks, " ")
	}
	all := keys()

	_, err := c.Remove(ctx, h1, []string{"dd.service", "dd.service.d/x.conf", "other.service"}, OnlyWholeUnits())
	var de *DropInsError
	if !errors.As(err, &de) || !errors.Is(err, ErrDropInsStay) {
		t.Fatalf("Remove of a unit with a drop-in left = %v, want a DropInsError", err)
	}
	if want := "drop-ins or config files in the registry for hosts/h1 would stay without their unit: dd.service has dd.service.d/y.conf; nothing removed"; err.Error() != want {
		t.Errorf("message:\n got %s\nwant %s", err, want)
	}
	if got := keys(); got != all {
		t.Errorf("keys after the refusal: %s, want %s", got, all)
	}

	// A drop-in alone may go: its unit stays.
	if _, err := c.Remove(ctx, h1, []string{"dd.service.d/y.conf"}, OnlyWholeUnits()); err != nil {
		t.Fatal(err)
	}
	// Named together they go together.
	if _, err := c.Remove(ctx, h1, []string{"dd.service", "dd.service.d/x.conf"}, OnlyWholeUnits()); err != nil {
		t.Fatal(err)
	}
	if got, want := keys(), "dd.socket.d/z.conf other.service"; got != want {
		t.Errorf("keys = %s, want %s", got, want)
	}
}

func TestRemoveRecursive(t *testing.T) {
	c := NewTestClient(t, StartTestEtcd(t).Endpoint())
	ctx := ctxT(t)
	web := Target{Group: "web"}
	if _, err := c.Put(ctx, web, map[string][]byte{
		"dd.service": []byte("[Service]\nExecStart=/bin/true\n"), "dd.service.d/x.conf": []byte("[Service]\n"),
		"dd.service.d/y.conf": []byte("[Unit]\n"), "ee.service.d/z.conf": []byte("[Unit]\n"), "keep.service": []byte("[Service]\nExecStart=/bin/true\n"),
	}); err != nil {
		t.Fatal(err)
	}
	rev, removed, err := c.RemoveRecursive(ctx, web, []string{"dd.service"}, StoredBy("op@box"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(removed, " "), "dd.service dd.service.d/x.conf dd.service.d/y.conf"; got != want {
		t.Errorf("removed %s, want %s", got, want)
	}
	// One transaction: each key's history has its removal at one revision.
	for _, k := range removed {
		h, err := c.History(ctx, web, k)
		if err != nil {
			t.Fatal(err)
		}
		if h.Exists || len(h.Versions) != 2 || !h.Versions[1].Removed || h.Versions[1].Revision != rev {
			t.Errorf("history of %s: %+v, want its removal at revision %d", k, h, rev)
		}
	}
	// A unit whose own key is gone, with a drop-in left: the drop-in goes.
	if _, removed, err = c.RemoveRecursive(ctx, web, []string{"ee.service"}); err != nil || strings.Join(removed, " ") != "ee.service.d/z.conf" {
		t.Errorf("RemoveRecursive(ee.service) = %v, %v; want its drop-in removed", removed, err)
	}
	// Nothing of it at all: not found, nothing removed.
	if _, _, err := c.RemoveRecursive(ctx, web, []string{"keep.service", "nope.service"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("RemoveRecursive of a missing unit = %v, want ErrNotFound", err)
	}
	if _, err := c.Get(ctx, web, "keep.service"); err != nil {
		t.Errorf("keep.service: %v", err)
	}
}

// A drop-in put between Remove's read and its transaction is not left
// behind: the transaction's guard fails, Remove reads again and judges the
// new drop-in like the others.
func TestRemoveSeesADropInPutMeanwhile(t *testing.T) {
	c := NewTestClient(t, StartTestEtcd(t).Endpoint())
	ctx := ctxT(t)
	h1 := Target{Host: "h1"}
	put := func(units map[string][]byte) {
		t.Helper()
		if _, err := c.Put(ctx, h1, units); err != nil {
			t.Fatal(err)
		}
	}
	racePut := func(key string) {
		once := true
		c.testAfterKeysRead = func() {
			if once {
				once = false
				if _, err := c.cli.Put(ctx, c.targetUnits(h1)+key, "[Service]\n"); err != nil {
					t.Error(err)
				}
			}
		}
	}
	put(map[string][]byte{"dd.service": []byte("[Service]\nExecStart=/bin/true\n")})
	racePut("dd.service.d/late.conf")
	_, err := c.Remove(ctx, h1, []string{"dd.service"}, OnlyWholeUnits())
	if want := "dd.service has dd.service.d/late.conf"; !errors.Is(err, ErrDropInsStay) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Remove with a drop-in put meanwhile = %v, want it refused naming %s", err, want)
	}
	if _, err := c.Get(ctx, h1, "dd.service"); err != nil {
		t.Fatalf("dd.service after the refusal: %v", err)
	}

	racePut("dd.service.d/later.conf")
	_, removed, err := c.RemoveRecursive(ctx, h1, []string{"dd.service"})
	if got, want := strings.Join(removed, " "), "dd.service dd.service.d/late.conf dd.service.d/later.conf"; err != nil || got != want {
		t.Fatalf("RemoveRecursive with a drop-in put meanwhile = %s, %v; want %s", got, err, want)
	}
	if ls, err := c.List(ctx, &h1); err != nil || len(ls) != 0 {
		t.Errorf("left: %+v, %v", ls, err)
	}
}
