package fleetlock

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// zincati is a FleetLock client that speaks exactly as Zincati does
// (src/fleet_lock/mod.rs, and the protocol's documentation): a POST of the
// body serde_json::to_string_pretty writes, the header
// "fleet-lock-protocol: true", no Content-Type; 200 is success, anything
// else a rejection whose {"kind", "value"} it decodes, or, when that
// fails, the kind it makes up itself ("generic_http_<code>").
type zincati struct {
	base      string // the configured base_url, e.g. http://127.0.0.1:9190/
	id, group string
}

type answer struct {
	Status int
	Kind   string `json:"kind"`
	Value  string `json:"value"`
}

func (z zincati) body() string {
	return fmt.Sprintf("{\n  \"client_params\": {\n    \"id\": %q,\n    \"group\": %q\n  }\n}", z.id, z.group)
}

// call POSTs to endpoint ("v1/pre-reboot", joined to the base URL the way
// Zincati's Url::join does it) and returns nil on 200.
func (z zincati) call(t *testing.T, endpoint string) *answer {
	t.Helper()
	return post(t, strings.TrimSuffix(z.base, "/")+"/"+endpoint, z.body(), map[string]string{"fleet-lock-protocol": "true"}, http.MethodPost)
}

func (z zincati) preReboot(t *testing.T) *answer   { t.Helper(); return z.call(t, "v1/pre-reboot") }
func (z zincati) steadyState(t *testing.T) *answer { t.Helper(); return z.call(t, "v1/steady-state") }

func post(t *testing.T, url, body string, header map[string]string, method string) *answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	r := &answer{Status: resp.StatusCode}
	if json.Unmarshal(b, r) != nil || r.Kind == "" || r.Value == "" {
		r.Kind, r.Value = fmt.Sprintf("generic_http_%d", resp.StatusCode), "(unknown server error)"
	}
	return r
}

// lockEnv is an etcd with group keys, a FleetLock server on it, and a raw
// client to look at the slot keys.
type lockEnv struct {
	endpoint string
	reg      *registry.Client
	raw      *clientv3.Client
	base     string
}

func newLockEnv(t *testing.T, ttl time.Duration, groups ...string) *lockEnv {
	t.Helper()
	e := registrytest.StartEtcd(t)
	reg := registrytest.NewClient(t, e.Endpoint())
	raw := registrytest.RawClient(t, e.Endpoint())
	srv := httptest.NewServer(Handler(Config{
		Slots: reg, TTL: ttl, Groups: groups,
		Log: slog.New(slog.NewTextHandler(t.Output(), nil)),
	}))
	t.Cleanup(srv.Close)
	return &lockEnv{endpoint: e.Endpoint(), reg: reg, raw: raw, base: srv.URL + "/"}
}

func (e *lockEnv) put(t *testing.T, group string, units map[string]string) {
	t.Helper()
	m := map[string][]byte{}
	for k, v := range units {
		m[k] = []byte(v)
	}
	if _, err := e.reg.Put(t.Context(), registry.Target{Group: group}, m); err != nil {
		t.Fatal(err)
	}
}

// slots returns every slot key under locks/, as "<group>/<pool>/<holder>"
// (a waiting one with a "?"), sorted.
func (e *lockEnv) slots(t *testing.T) []string {
	t.Helper()
	resp, err := e.raw.Get(t.Context(), registry.DefaultPrefix+"/locks/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		k := strings.TrimPrefix(string(kv.Key), registry.DefaultPrefix+"/locks/groups/")
		var h registry.Holder
		if json.Unmarshal(kv.Value, &h) != nil || h.Waiting() {
			k += "?"
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func mustOK(t *testing.T, what string, r *answer) {
	t.Helper()
	if r != nil {
		t.Fatalf("%s: %d %s: %s", what, r.Status, r.Kind, r.Value)
	}
}

func unitWith(policy string) string {
	return "[Service]\nExecStart=/bin/true\n[X-Agentd]\n" + policy + "\n"
}

// A reboot takes one slot of every MaxUnavailable= queue of its group (a
// template's for its instances) and of the group's reboot pool, whose
// limit is the smallest MaxUnavailable=; pre-reboot and steady-state are
// idempotent; a second reboot is refused while the first holds, with the
// protocol's error and no slot taken; an agent queued before the reboot
// goes first, and one queued after it waits for steady-state.
func TestPreRebootAndSteadyState(t *testing.T) {
	t.Parallel()
	e := newLockEnv(t, time.Hour, "web", "all")
	e.put(t, "web", map[string]string{
		"app.service":    unitWith("MaxUnavailable=1"),
		"db.service":     unitWith("MaxUnavailable=2"),
		"w@.service":     unitWith("MaxUnavailable=3"),
		"w@1.service":    "",
		"plain.service":  unitWith("HealthySec=1"),
		"broken.service": unitWith("MaxUnavailable=zero"), // blocked on the agents: no slot either
	})
	a := zincati{base: e.base, id: "c988d2509fdf4cdcbed39037c56406fb", group: "web"}
	b := zincati{base: e.base, id: "e0f3745b108f471cbd4883c6fbed8cdd", group: "web"}

	mustOK(t, "pre-reboot a", a.preReboot(t))
	want := []string{
		"web/app.service/fleetlock:" + a.id, "web/db.service/fleetlock:" + a.id,
		"web/reboot/fleetlock:" + a.id, "web/w@.service/fleetlock:" + a.id,
	}
	if got := e.slots(t); !slices.Equal(got, want) {
		t.Fatalf("slots after pre-reboot a:\n got %q\nwant %q", got, want)
	}
	resp, _ := e.raw.Get(t.Context(), registry.DefaultPrefix+"/locks/groups/web/reboot/fleetlock:"+a.id)
	lease := resp.Kvs[0].Lease
	if ttl, err := e.raw.TimeToLive(t.Context(), clientv3.LeaseID(lease)); err != nil || ttl.GrantedTTL != 3600 {
		t.Errorf("lease of a's slots: %+v, %v; want a TTL of 3600 s", ttl, err)
	}
	mustOK(t, "pre-reboot a again", a.preReboot(t))
	if got := e.slots(t); !slices.Equal(got, want) {
		t.Fatalf("slots after a second pre-reboot a: %q", got)
	}
	resp, _ = e.raw.Get(t.Context(), registry.DefaultPrefix+"/locks/groups/web/", clientv3.WithPrefix())
	for _, kv := range resp.Kvs {
		if kv.Lease != lease {
			t.Errorf("%s: lease %x, want a's one lease %x", kv.Key, kv.Lease, lease)
		}
	}

	// b: the reboot pool's limit is the smallest MaxUnavailable=, 1.
	r := b.preReboot(t)
	if r == nil || r.Status != http.StatusConflict || r.Kind != KindSemaphoreFull || !strings.Contains(r.Value, "fleetlock:"+a.id) {
		t.Fatalf("pre-reboot b while a holds: %+v, want 409 %s naming a", r, KindSemaphoreFull)
	}
	mustOK(t, "steady-state b (holds nothing)", b.steadyState(t))
	if got := e.slots(t); !slices.Equal(got, want) {
		t.Fatalf("slots after b's refused pre-reboot and steady-state: %q", got)
	}

	// An agent's restart of app.service (MaxUnavailable=1) waits for a's
	// steady-state.
	reg2 := registrytest.NewClient(t, e.endpoint)
	h1, err := reg2.Join(t.Context(), reconcile.Member{Host: "h1", MachineID: "m1", Groups: []string{"web"}}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h1.Close() })
	got := make(chan error, 1)
	var release func(context.Context) error
	go func() {
		var err error
		release, err = h1.Acquire(t.Context(), "groups/web", reconcile.Bucket{}, "app.service", "hash-2", 1)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("h1 got app.service's slot while a's reboot holds it (err %v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	mustOK(t, "steady-state a", a.steadyState(t))
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("h1 did not get app.service's slot after a's steady-state")
	}
	if ttl, _ := e.raw.TimeToLive(t.Context(), clientv3.LeaseID(lease)); ttl.TTL != -1 {
		t.Errorf("a's lease after steady-state: TTL %d, want it revoked", ttl.TTL)
	}
	mustOK(t, "steady-state a again", a.steadyState(t))

	// Now h1 holds app.service's only slot: a reboot waits for it.
	r = b.preReboot(t)
	if r == nil || r.Kind != KindSemaphoreFull || !strings.Contains(r.Value, "app.service has MaxUnavailable=1, taken by h1") {
		t.Fatalf("pre-reboot b while h1 restarts app.service: %+v", r)
	}
	if got := e.slots(t); !slices.Equal(got, []string{"web/app.service/h1"}) {
		t.Fatalf("slots after b's refused pre-reboot: %q, want h1's only", got)
	}
	if err := release(t.Context()); err != nil {
		t.Fatal(err)
	}
	mustOK(t, "pre-reboot b", b.preReboot(t))
	mustOK(t, "steady-state b", b.steadyState(t))
	if got := e.slots(t); len(got) != 0 {
		t.Fatalf("slots left: %q", got)
	}

	// A group whose units set no MaxUnavailable=: one reboot at a time.
	c := zincati{base: e.base, id: "node-c", group: "all"}
	d := zincati{base: e.base, id: "node-d", group: "all"}
	mustOK(t, "pre-reboot c in all", c.preReboot(t))
	if r := d.preReboot(t); r == nil || r.Kind != KindSemaphoreFull {
		t.Fatalf("pre-reboot d in all while c holds: %+v", r)
	}
	mustOK(t, "steady-state c", c.steadyState(t))
	mustOK(t, "pre-reboot d", d.preReboot(t))
	if got := e.slots(t); !slices.Equal(got, []string{"all/reboot/fleetlock:node-d"}) {
		t.Fatalf("slots: %q", got)
	}
}

// Requests the protocol refuses get its error — a JSON {kind, value} with
// a 4xx status, which Zincati decodes (never its generic_http_<code>) —
// and take no slot.
func TestRefusedRequestsTakeNoSlot(t *testing.T) {
	t.Parallel()
	e := newLockEnv(t, time.Hour, "web", "a.b-c")
	good := `{"client_params": {"id": "n1", "group": "web"}}`
	body := func(id, group string) string {
		b, _ := json.Marshal(Request{ClientParams: &ClientParams{ID: id, Group: group}})
		return string(b)
	}
	header := map[string]string{"fleet-lock-protocol": "true"}
	for _, tc := range []struct {
		name, method, path, body string
		header                   map[string]string
		status                   int
		kind                     string
	}{
		{"no header", "POST", PreRebootPath, good, nil, 400, KindMissingHeader},
		{"header false", "POST", PreRebootPath, good, map[string]string{"fleet-lock-protocol": "false"}, 400, KindMissingHeader},
		{"header yes", "POST", PreRebootPath, good, map[string]string{"fleet-lock-protocol": "yes"}, 400, KindMissingHeader},
		{"GET", "GET", PreRebootPath, good, header, 405, KindMethodNotAllowed},
		{"PUT steady-state", "PUT", SteadyStatePath, good, header, 405, KindMethodNotAllowed},
		{"other path", "POST", "/v1/reboot", good, header, 404, KindNotFound},
		{"v2", "POST", "/v2/pre-reboot", good, header, 404, KindNotFound},
		{"not JSON", "POST", PreRebootPath, "id=n1&group=web", header, 400, KindMalformed},
		{"empty body", "POST", PreRebootPath, "", header, 400, KindMalformed},
		{"truncated JSON", "POST", PreRebootPath, good[:20], header, 400, KindMalformed},
		{"trailing garbage", "POST", PreRebootPath, good + "}", header, 400, KindMalformed},
		{"an array", "POST", PreRebootPath, "[]", header, 400, KindMalformed},
		{"no client_params", "POST", PreRebootPath, `{"id": "n1", "group": "web"}`, header, 400, KindMalformed},
		{"client_params null", "POST", PreRebootPath, `{"client_params": null}`, header, 400, KindMalformed},
		{"id a number", "POST", PreRebootPath, `{"client_params": {"id": 7, "group": "web"}}`, header, 400, KindMalformed},
		{"over 64 KiB", "POST", PreRebootPath, good + strings.Repeat(" ", MaxBody), header, 413, KindBodyTooLarge},
		{"empty id", "POST", PreRebootPath, body("", "web"), header, 400, KindInvalidID},
		{"no id", "POST", PreRebootPath, `{"client_params": {"group": "web"}}`, header, 400, KindInvalidID},
		{"id with a slash", "POST", PreRebootPath, body("a/../h1", "web"), header, 400, KindInvalidID},
		{"id with a colon", "POST", PreRebootPath, body("fleetlock:x", "web"), header, 400, KindInvalidID},
		{"id of 254 characters", "POST", PreRebootPath, body(strings.Repeat("a", 254), "web"), header, 400, KindInvalidID},
		{"empty group", "POST", PreRebootPath, body("n1", ""), header, 400, KindInvalidGroup},
		{"no group", "POST", PreRebootPath, `{"client_params": {"id": "n1"}}`, header, 400, KindInvalidGroup},
		{"group with an underscore", "POST", PreRebootPath, body("n1", "web_1"), header, 400, KindInvalidGroup},
		{"group with a slash", "POST", PreRebootPath, body("n1", "web/x"), header, 400, KindInvalidGroup},
		{"group with ..", "POST", PreRebootPath, body("n1", "a..b"), header, 400, KindInvalidGroup},
		{"group not the agent's", "POST", PreRebootPath, body("n1", "default"), header, 403, KindUnknownGroup},
		{"steady-state, no header", "POST", SteadyStatePath, good, nil, 400, KindMissingHeader},
		{"steady-state, bad group", "POST", SteadyStatePath, body("n1", "web_1"), header, 400, KindInvalidGroup},
		{"steady-state, empty id", "POST", SteadyStatePath, body("", "web"), header, 400, KindInvalidID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, strings.TrimSuffix(e.base, "/")+tc.path, tc.body, tc.header, tc.method)
			if r == nil || r.Status != tc.status || r.Kind != tc.kind {
				t.Fatalf("%s %s: %+v, want %d %s", tc.method, tc.path, r, tc.status, tc.kind)
			}
			if got := e.slots(t); len(got) != 0 {
				t.Fatalf("slots taken: %q", got)
			}
		})
	}
	// The limits are the body's, not the JSON's: a body of exactly 64 KiB
	// is read, and a group the protocol allows with dots and dashes is one.
	padded := good + strings.Repeat(" ", MaxBody-len(good))
	mustOK(t, "a body of 64 KiB", post(t, e.base+"v1/pre-reboot", padded, header, "POST"))
	mustOK(t, "pre-reboot in a.b-c", zincati{base: e.base, id: "n2", group: "a.b-c"}.preReboot(t))
	if got := e.slots(t); !slices.Equal(got, []string{"a.b-c/reboot/fleetlock:n2", "web/reboot/fleetlock:n1"}) {
		t.Fatalf("slots: %q", got)
	}
}

// A holder that never says steady-state is freed when its lease's TTL
// runs out; another pre-reboot of the same id before then starts the TTL
// again.
func TestRebootSlotExpires(t *testing.T) {
	t.Parallel()
	e := newLockEnv(t, 2*time.Second, "web")
	a := zincati{base: e.base, id: "node-a", group: "web"}
	b := zincati{base: e.base, id: "node-b", group: "web"}
	mustOK(t, "pre-reboot a", a.preReboot(t))
	time.Sleep(1200 * time.Millisecond)
	mustOK(t, "pre-reboot a again (renews)", a.preReboot(t))
	time.Sleep(1200 * time.Millisecond) // 2.4 s after the first: held only thanks to the renewal
	if got := e.slots(t); !slices.Equal(got, []string{"web/reboot/fleetlock:node-a"}) {
		t.Fatalf("slots 1.2 s after a renewal with a TTL of 2 s: %q", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(e.slots(t)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("a's slot not freed by its TTL: %q", e.slots(t))
		}
		time.Sleep(100 * time.Millisecond)
	}
	mustOK(t, "pre-reboot b once a's TTL ran out", b.preReboot(t))
}

// Concurrent pre-reboots never take more than the budget, and those
// refused leave nothing behind.
func TestConcurrentPreReboots(t *testing.T) {
	t.Parallel()
	e := newLockEnv(t, time.Hour, "web")
	e.put(t, "web", map[string]string{"app.service": unitWith("MaxUnavailable=2"), "db.service": unitWith("MaxUnavailable=2")})
	for round := range 3 {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var won []string
		for i := range 6 {
			z := zincati{base: e.base, id: fmt.Sprintf("r%d-n%d", round, i), group: "web"}
			wg.Go(func() {
				if z.preReboot(t) == nil {
					mu.Lock()
					won = append(won, z.id)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(won) > 2 {
			t.Fatalf("round %d: %d reboots granted at once with MaxUnavailable=2: %q", round, len(won), won)
		}
		var want []string
		for _, id := range won {
			want = append(want, "web/app.service/fleetlock:"+id, "web/db.service/fleetlock:"+id, "web/reboot/fleetlock:"+id)
		}
		slices.Sort(want)
		if got := e.slots(t); !slices.Equal(got, want) {
			t.Fatalf("round %d: slots %q, want those of the granted %q only", round, got, want)
		}
		for _, id := range won {
			mustOK(t, "steady-state", zincati{base: e.base, id: id, group: "web"}.steadyState(t))
		}
	}
}
