package registry

import (
	"errors"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// enableAuthFor turns etcd's authentication on through admin (no
// credentials): a root user, and each of users (name → password; "" for a
// user that authenticates with a client certificate) with a role that may
// read and write the whole default prefix.
func enableAuthFor(t *testing.T, admin *clientv3.Client, users map[string]string) {
	t.Helper()
	ctx := ctxT(t)
	steps := []func() error{
		func() error { _, err := admin.RoleAdd(ctx, "root"); return err },
		func() error { _, err := admin.UserAdd(ctx, "root", "r00t"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.RoleAdd(ctx, "writer"); return err },
		func() error {
			_, err := admin.RoleGrantPermission(ctx, "writer", DefaultPrefix+"/", clientv3.GetPrefixRangeEnd(DefaultPrefix+"/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
	}
	for name, pw := range users {
		steps = append(steps, func() error {
			if pw == "" {
				_, err := admin.UserAddWithOptions(ctx, name, "", &clientv3.UserAddOptions{NoPassword: true})
				return err
			}
			_, err := admin.UserAdd(ctx, name, pw)
			return err
		}, func() error { _, err := admin.UserGrantRole(ctx, name, "writer"); return err })
	}
	steps = append(steps, func() error { _, err := admin.AuthEnable(ctx); return err })
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
}

// Every version records who stored it (the writer's user@host), the etcd
// user the write ran as when authentication is on (none while it is off,
// whatever user name the client gave), why (WithReason) and who signed it
// (SignedBy), for puts and removals alike.
func TestHistoryRecordsWhoAndWhy(t *testing.T) {
	t.Parallel()
	e := StartTestEtcd(t)
	h1 := Target{Host: "h1"}
	alice, err := Dial(ctxT(t), Config{Endpoints: []string{e.Endpoint()}, Username: "alice", Password: "a11ce"})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	putBy(t, alice, h1, "a.service", "A1", StoredBy("alice@box"), WithReason("ticket OPS-1"))
	if _, err := alice.Remove(ctxT(t), h1, []string{"a.service"}, StoredBy("alice@box"), WithReason("retired: OPS-2")); err != nil {
		t.Fatal(err)
	}
	putBy(t, alice, h1, "a.service", "A3", SignedBy("ops@example.com"))

	enableAuthFor(t, RawTestClient(t, e.Endpoint()), map[string]string{"alice": "a11ce"})
	// A client dialled before auth was on asked etcd once, and was told
	// off; a fresh one is told on.
	alice2, err := Dial(ctxT(t), Config{Endpoints: []string{e.Endpoint()}, Username: "alice", Password: "a11ce"})
	if err != nil {
		t.Fatal(err)
	}
	defer alice2.Close()
	putBy(t, alice2, h1, "a.service", "A4", StoredBy("alice@box"), WithReason("with auth"))
	if _, err := alice2.Remove(ctxT(t), h1, []string{"a.service"}, WithReason("removed with auth")); err != nil {
		t.Fatal(err)
	}

	h := history(t, alice2, h1, "a.service")
	type who struct{ user, etcdUser, reason, signer string }
	want := []who{
		{"alice@box", "", "ticket OPS-1", ""},
		{"alice@box", "", "retired: OPS-2", ""},
		{"", "", "", "ops@example.com"},
		{"alice@box", "alice", "with auth", ""},
		{"", "alice", "removed with auth", ""},
	}
	if len(h.Versions) != len(want) {
		t.Fatalf("%d versions, want %d: %+v", len(h.Versions), len(want), h.Versions)
	}
	for i, v := range h.Versions {
		if got := (who{v.User, v.EtcdUser, v.Reason, v.Signer}); got != want[i] {
			t.Errorf("version %d: %+v, want %+v", i, got, want[i])
		}
	}
	if !h.Versions[1].Removed || !h.Versions[4].Removed {
		t.Errorf("removals not recorded as such: %+v", h.Versions)
	}
}

// Over TLS with a client certificate and no user name, the etcd user is
// the certificate's common name, which etcd runs the write as.
func TestHistoryRecordsTheCertificateUser(t *testing.T) {
	t.Parallel()
	e, certs := StartTestEtcdTLS(t)
	enableAuthFor(t, RawTestClient(t, e.Endpoint()), map[string]string{"agentd-client": ""}) // the client certificate's CN
	c, err := Dial(ctxT(t), Config{Endpoints: []string{e.TLSEndpoint()}, CAFile: certs.CA, CertFile: certs.ClientCert, KeyFile: certs.ClientKey})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	putBy(t, c, Target{Group: "web"}, "a.service", "A1", WithReason("over TLS"))
	h := history(t, c, Target{Group: "web"}, "a.service")
	if len(h.Versions) != 1 || h.Versions[0].EtcdUser != "agentd-client" || h.Versions[0].Reason != "over TLS" {
		t.Fatalf("versions %+v", h.Versions)
	}
}

// A reason that is not one short line of text is refused before anything
// is stored, by Put, CheckPut and Remove alike.
func TestBadReasonsAreRefused(t *testing.T) {
	t.Parallel()
	_, c := newTest(t)
	h1 := Target{Host: "h1"}
	putBy(t, c, h1, "a.service", "A1")
	for why, want := range map[string]string{
		"two\nlines":                  "control character (U+000A) at byte 3",
		"tab\there":                   "control character (U+0009)",
		"bell\a":                      "control character (U+0007)",
		"\xffbad":                     "not valid UTF-8",
		strings.Repeat("x", 1025):     "1025 bytes long, more than 1024",
		"esc \x1b[31mred\x1b[0m":      "control character (U+001B)",
		"nul\x00":                     "control character (U+0000)",
		"c1 control \u0085 next-line": "control character (U+0085)",
	} {
		_, err := c.Put(ctxT(t), h1, map[string][]byte{"a.service": []byte("A2")}, WithReason(why))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Put with reason %q: %v, want ErrInvalid saying %q", why, err, want)
		}
		if err := c.CheckPut(ctxT(t), h1, map[string][]byte{"a.service": []byte("A2")}, WithReason(why)); !errors.Is(err, ErrInvalid) {
			t.Errorf("CheckPut with reason %q: %v", why, err)
		}
		if _, err := c.Remove(ctxT(t), h1, []string{"a.service"}, WithReason(why)); !errors.Is(err, ErrInvalid) {
			t.Errorf("Remove with reason %q: %v", why, err)
		}
	}
	if err := ValidateReason(strings.Repeat("é", 512)); err != nil { // 1024 bytes
		t.Errorf("1024 bytes of text: %v", err)
	}
	if h := history(t, c, h1, "a.service"); len(h.Versions) != 1 || string(h.Current) != "A1" {
		t.Errorf("a refused write stored something: %+v", h)
	}
}
