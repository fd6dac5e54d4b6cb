package registry

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

func TestValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		t  Target
		ok bool
	}{
		{Target{Host: "h1"}, true},
		{Target{Group: "web-1.prod_x"}, true},
		{Target{}, false},
		{Target{Host: "h1", Group: "web"}, false},
		{Target{Host: "a/b"}, false},
		{Target{Host: ".."}, false},
		{Target{Host: "a..b"}, false},
		{Target{Host: "."}, false},
		{Target{Group: "we b"}, false},
		{Target{Group: "wéb"}, false},
		{Target{Host: strings.Repeat("h", 254)}, false},
	} {
		err := tc.t.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("%+v.Validate() = %v, want ok=%v", tc.t, err, tc.ok)
		}
	}
	for _, tc := range []struct {
		unit string
		ok   bool
	}{
		{"hello.service", true},
		{"hello@.service", true},
		{"hello@1.service", true},
		{`dev-disk-by\x2duuid.mount`, true},
		{"hello.service.d/10-env.conf", true},
		{"hello@.service.d/override.conf", true},
		{"service.d/all.conf", false}, // type-wide drop-ins would reach reserved units
		{"hello", false},
		{"README.md", false},
		{"", false},
		{"../x.service", false},
		{"a/b.service", false},
		{"hello.service.d/x.txt", false},
		{"hello.service.d/.conf", false},
		{"hello.service.d/a/b.conf", false},
		{"hello.service.d/../x.conf", false},
		{"hello.d/x.conf", false},
		{"he llo.service", false},
	} {
		err := ValidateUnit(tc.unit)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("ValidateUnit(%q) = %v, want ok=%v", tc.unit, err, tc.ok)
		}
	}
}

func TestDialUnreachable(t *testing.T) {
	t.Parallel()
	start := time.Now()
	_, err := Dial(context.Background(), Config{
		Endpoints:   []string{"http://127.0.0.1:" + strconv.Itoa(freePort(t))},
		DialTimeout: 300 * time.Millisecond,
	})
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("Dial to a closed port: %v, want an 'unreachable' error", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Dial took %s with a 300 ms timeout", d)
	}
	t.Logf("%v", err)

	if _, err := Dial(context.Background(), Config{Endpoints: []string{"https://127.0.0.1:1"}, CertFile: "c.pem"}); err == nil ||
		!strings.Contains(err.Error(), "key") {
		t.Errorf("Dial with a certificate but no key: %v", err)
	}
	if _, err := Dial(context.Background(), Config{}); err == nil {
		t.Error("Dial without endpoints succeeded")
	}
}

func TestUnitsRoundTrip(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	h1, web := Target{Host: "h1"}, Target{Group: "web"}

	rev, err := c.Put(ctx, web, map[string][]byte{"a.service": []byte("A"), "a.service.d/x.conf": []byte("X"), "t@1.service": nil})
	if err != nil {
		t.Fatal(err)
	}
	// One transaction: all three keys carry the returned revision.
	all, err := c.List(ctx, &web)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 {
		t.Fatalf("List(web) = %+v", all)
	}
	for _, l := range all {
		if l.ModRevision != rev || l.Group != "web" || l.Host != "" || !strings.HasPrefix(l.Key, "/agentd/groups/web/units/") {
			t.Errorf("listed %+v, want group web at revision %d", l, rev)
		}
	}
	mustPut(t, c, h1, "a.service", "H")
	mustPut(t, c, Target{Host: "h0"}, "z.service", "Z")
	// A key outside the layout is ignored.
	if _, err := c.cli.Put(ctx, "/agentd/hosts/h1/notes", "x"); err != nil {
		t.Fatal(err)
	}

	got, err := c.List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range got {
		names = append(names, l.Target.String()+":"+l.Unit+"="+string(l.Value))
	}
	want := []string{"hosts/h0:z.service=Z", "hosts/h1:a.service=H", "groups/web:a.service=A", "groups/web:a.service.d/x.conf=X", "groups/web:t@1.service="}
	if !slices.Equal(names, want) {
		t.Errorf("List(nil) = %v, want %v", names, want)
	}

	v, err := c.Get(ctx, web, "a.service.d/x.conf")
	if err != nil || string(v) != "X" {
		t.Errorf("Get = %q, %v", v, err)
	}
	if _, err := c.Get(ctx, h1, "nope.service"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of a missing unit: %v, want ErrNotFound", err)
	}

	// Remove is all or nothing and names what is missing.
	_, err = c.Remove(ctx, web, []string{"a.service", "nope.service", "gone.service"})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "gone.service, nope.service") {
		t.Errorf("Remove with missing units: %v", err)
	}
	if _, err := c.Get(ctx, web, "a.service"); err != nil {
		t.Errorf("a failed Remove removed a.service: %v", err)
	}
	if _, err := c.Remove(ctx, web, []string{"a.service", "a.service.d/x.conf"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.List(ctx, &web); len(got) != 1 || got[0].Unit != "t@1.service" {
		t.Errorf("List(web) after Remove = %+v", got)
	}

	// Validation errors.
	for name, err := range map[string]error{
		"put no target": func() error { _, err := c.Put(ctx, Target{}, map[string][]byte{"a.service": nil}); return err }(),
		"put both": func() error {
			_, err := c.Put(ctx, Target{Host: "h", Group: "g"}, map[string][]byte{"a.service": nil})
			return err
		}(),
		"put no units":   func() error { _, err := c.Put(ctx, h1, nil); return err }(),
		"put bad unit":   func() error { _, err := c.Put(ctx, h1, map[string][]byte{"../x.service": nil}); return err }(),
		"remove no unit": func() error { _, err := c.Remove(ctx, h1, nil); return err }(),
		"list bad":       func() error { _, err := c.List(ctx, &Target{Group: "a/b"}); return err }(),
		"get bad":        func() error { _, err := c.Get(ctx, Target{Host: "h/1"}, "a.service"); return err }(),
		"statuses bad":   func() error { _, err := c.Statuses(ctx, ""); return err }(),
		"watch bad":      c.Watch(ctx, "h1", []string{"x y"}, func(Snapshot) {}),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestWatchStatuses(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	ctx := ctxT(t)
	s1 := mustJoin(t, c, member("h1", "m1"))
	s2 := mustJoin(t, c, member("h2", "m2"))
	s3 := mustJoin(t, c, member("h3", "m3"))
	if err := s1.Report(ctx, []reconcile.Status{{Unit: "a.service", Hash: "old"}}); err != nil {
		t.Fatal(err)
	}

	type call = map[string]map[string]reconcile.Status
	calls := make(chan call, 100)
	done := make(chan error, 1)
	go func() {
		done <- c.WatchStatuses(ctx, []string{"h1", "h2"}, func(m call) bool {
			calls <- m
			return m["h1"]["a.service"].Hash == "new" && m["h2"]["a.service"].Hash == "new"
		})
	}()
	next := func() call {
		t.Helper()
		select {
		case m := <-calls:
			return m
		case <-time.After(5 * time.Second):
			t.Fatal("no WatchStatuses callback")
			return nil
		}
	}
	first := next()
	if len(first) != 2 || first["h1"]["a.service"].Hash != "old" || first["h2"] == nil || len(first["h2"]) != 0 {
		t.Fatalf("first call = %+v", first)
	}
	// A host not asked for: no call.
	if err := s3.Report(ctx, []reconcile.Status{{Unit: "a.service", Hash: "new"}}); err != nil {
		t.Fatal(err)
	}
	if err := s1.Report(ctx, []reconcile.Status{{Unit: "a.service", Hash: "new"}}); err != nil {
		t.Fatal(err)
	}
	m := next()
	if _, ok := m["h3"]; ok || m["h1"]["a.service"].Hash != "new" {
		t.Fatalf("second call = %+v", m)
	}
	if err := s2.Report(ctx, []reconcile.Status{{Unit: "a.service", Hash: "new"}}); err != nil {
		t.Fatal(err)
	}
	m = next()
	if m["h2"]["a.service"].Hash != "new" {
		t.Fatalf("third call = %+v", m)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WatchStatuses = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WatchStatuses did not return after fn returned true")
	}

	// Statuses disappear with the session: a watcher sees the delete.
	ctx2, cancel := context.WithCancel(ctx)
	defer cancel()
	gone := make(chan error, 1)
	go func() {
		gone <- c.WatchStatuses(ctx2, []string{"h1"}, func(m call) bool { return len(m["h1"]) == 0 })
	}()
	s1.Close()
	select {
	case err := <-gone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WatchStatuses did not see h1's statuses go")
	}
	cancel()
	if err := c.WatchStatuses(ctx2, []string{"h2"}, func(call) bool { return false }); !errors.Is(err, context.Canceled) {
		t.Errorf("WatchStatuses with a cancelled ctx: %v", err)
	}
}
