package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/internal/citest"
	"github.com/agentd/agentd/internal/systemdtest"
	"github.com/agentd/agentd/internal/testlog"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
	"github.com/agentd/agentd/secret"
)

// secretUnit runs with its secret written beside it; it never reads it,
// so a host that cannot decrypt is judged by its status alone.
const secretUnit = "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n[X-Agentd]\nHealthySec=0\n"

// nsHost is one host of a group under test: `agentd run` as its own
// process, in a mount namespace of its own where the one DEST directory
// of the group's secret (shared) is a bind mount of the host's own root —
// each host writes "the same path" into its own directory, as real hosts
// do, and the test reads each one's file from outside.
type nsHost struct {
	host string
	h    *systemdtest.Harness
	root string // what the agent sees as shared
	log  *testlog.Buffer
	cmd  *exec.Cmd
	done chan struct{}
}

func startNSHost(t *testing.T, bin, endpoint, shared, host string) *nsHost {
	t.Helper()
	h := systemdtest.Start(t)
	n := &nsHost{host: host, h: h, root: filepath.Join(h.Dir, "own-root"), log: &testlog.Buffer{}, done: make(chan struct{})}
	if err := os.MkdirAll(n.root, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"-m", "--propagation", "private", "sh", "-c", `mount --bind "$1" "$2" && shift 2 && exec "$@"`, "sh", n.root, shared,
		bin, "run", "--user", "--host", host, "--group", "web", "--etcd-endpoints", endpoint,
		"--unit-dir", h.UnitDir, "--state-dir", h.StateDir, "--debug-socket", filepath.Join(h.Dir, "agentd.sock"),
		"--lease-ttl", "2s", "--log-level", "debug", "--file-root", shared}
	n.cmd = exec.Command("unshare", args...)
	n.cmd.Env = childEnv("DBUS_SESSION_BUS_ADDRESS=" + h.BusAddress)
	n.cmd.Stdout = io.MultiWriter(t.Output(), n.log)
	n.cmd.Stderr = n.cmd.Stdout
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { n.cmd.Wait(); close(n.done) }()
	t.Cleanup(func() {
		n.cmd.Process.Signal(syscall.SIGKILL)
		<-n.done
	})
	return n
}

// joined waits until every host's agent is live and publishes a recipient.
func joined(t *testing.T, reg *registry.Client, hosts ...string) {
	t.Helper()
	eventually(t, strings.Join(hosts, ", ")+" joined with a recipient", func() bool {
		known, err := reg.KnownHosts(context.Background())
		if err != nil {
			return false
		}
		n := 0
		for _, k := range known {
			if slices.Contains(hosts, k.Host) && k.Live && k.Recipient != "" {
				n++
			}
		}
		return n == len(hosts)
	})
}

// secretCLI runs the CLI with the pins in pins and the registry at
// e.endpoint (cli adds it only for the commands it knows).
func secretCLI(e *env, pins string, args ...string) (string, int) {
	e.t.Helper()
	if args[0] == "secrets" {
		args = append(args, "--etcd-endpoints", e.endpoint)
	}
	if pins != "" {
		args = append(args, "--known-recipients", pins)
	}
	return e.cli(args...)
}

// plaintext is a secret no other test writes: a random token in a line.
func plaintext(t *testing.T) (content, token string) {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	token = "s3cret-" + hex.EncodeToString(b)
	return "password=" + token + "\n", token
}

// noPlaintext fails when any key or value of the registry, any of logs or
// any command line of pids (and this process's: the CLI runs in it) holds
// token.
func noPlaintext(t *testing.T, endpoint, token string, logs map[string][]byte, pids ...int) {
	t.Helper()
	resp, err := registrytest.RawClient(t, endpoint).Get(context.Background(), "", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if bytes.Contains(kv.Key, []byte(token)) || bytes.Contains(kv.Value, []byte(token)) {
			t.Errorf("the registry holds the plaintext at %s", kv.Key)
		}
	}
	for name, b := range logs {
		if len(b) == 0 {
			t.Errorf("%s is empty: nothing searched", name)
		}
		if bytes.Contains(b, []byte(token)) {
			t.Errorf("%s holds the plaintext", name)
		}
	}
	lines := []string{"/proc/self/cmdline"}
	for _, pid := range pids {
		lines = append(lines, "/proc/"+strconv.Itoa(pid)+"/cmdline")
	}
	for _, p := range lines {
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 || bytes.Contains(b, []byte(token)) {
			t.Errorf("%s holds the plaintext, or could not be read (%d bytes, %v)", p, len(b), err)
		}
	}
	t.Logf("searched %d registry keys, %d logs and %d command lines: no plaintext", len(resp.Kvs), len(logs), len(lines))
}

// hasFile says path holds content with mode 0600.
func hasFile(path, content string) bool {
	b, err := os.ReadFile(path)
	fi, err2 := os.Stat(path)
	return err == nil && err2 == nil && string(b) == content && fi.Mode().Perm() == 0o600
}

// A secret put to a group of three reaches each host byte-exact, mode
// 0600, with the registry, the agents' logs and the command lines holding
// none of it; a fourth host that joins later cannot decrypt it (its
// status says so, --wait names it, secrets ls shows it) until secrets
// rekey with the admin's key encrypts it to the group as it is now.
func TestSecretToAGroupAndAJoiner(t *testing.T) {
	citest.NeedRoot(t, "each agent sees the secret's directory through a bind mount in a mount namespace of its own")
	bin := buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()         // waits on systemd, not the CPU
	endpoint := registrytest.StartEtcd(t).Endpoint()
	reg := registrytest.NewClient(t, endpoint)
	shared := filepath.Join(t.TempDir(), "etc", "app")
	if err := os.MkdirAll(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	var hosts []*nsHost
	for _, h := range []string{"h1", "h2", "h3"} {
		hosts = append(hosts, startNSHost(t, bin, endpoint, shared, h))
	}
	joined(t, reg, "h1", "h2", "h3")
	e := &env{t: t, h: hosts[0].h, endpoint: endpoint, reg: reg, host: "h1"}
	pins := filepath.Join(t.TempDir(), "known_recipients")
	adminDir := t.TempDir()
	admin, err := secret.LoadOrCreate(adminDir)
	if err != nil {
		t.Fatal(err)
	}
	content, token := plaintext(t)
	dest := filepath.Join(shared, "db.env")
	key := reconcile.ConfigKey("app.service", dest)
	file := dest + "=" + e.writeUnit("files/db.env", content)
	unitFile := e.writeUnit("app.service", secretUnit)

	began := time.Now()
	out, code := secretCLI(e, pins, "unit", "put", unitFile, "--group", "web", "--file", file, "--secret",
		"--admin-recipient", admin.Recipient(), "--wait", "--timeout", "30s")
	took := time.Since(began)
	if code != 0 || !strings.Contains(out, "pinned h1's recipient age1") || !strings.Contains(out, "pinned h3's recipient") {
		t.Fatalf("put --secret --group web --wait: exit %d, want 0 and h1…h3 pinned\n%s", code, out)
	}
	t.Logf("put --secret --wait to 3 hosts: %v", took.Round(time.Millisecond))
	for _, n := range hosts {
		if !hasFile(filepath.Join(n.root, "db.env"), content) {
			b, _ := os.ReadFile(filepath.Join(n.root, "db.env"))
			t.Errorf("%s: its db.env holds %d bytes (want the secret's %d, byte-exact, mode 0600)", n.host, len(b), len(content))
		}
	}

	// cat and --dry-run show whom it is for, never the armour, and store
	// nothing.
	out, code = e.cli("unit", "cat", key, "--group", "web")
	if code != 0 || !regexp.MustCompile(`(?m)^#agentd-file mode=0600 owner=root:root secret=age to=h1,h2,h3\n\(age-encrypted to h1, h2, h3; ciphertext sha256 [0-9a-f]{12}\)\n$`).MatchString(out) {
		t.Errorf("unit cat %s: exit %d, want the header and whom it is encrypted to\n%s", key, code, out)
	}
	_, rev, err := reg.GetRevision(context.Background(), registry.Target{Group: "web"}, key)
	if err != nil {
		t.Fatal(err)
	}
	out, code = secretCLI(e, pins, "unit", "put", unitFile, "--group", "web", "--file", file, "--secret", "--dry-run")
	if _, rev2, _ := reg.GetRevision(context.Background(), registry.Target{Group: "web"}, key); code != 0 || !strings.Contains(out, "dry run: nothing stored") || rev2 != rev {
		t.Errorf("put --secret --dry-run: exit %d, key at revision %d → %d, want 0 and nothing stored\n%s", code, rev, rev2, out)
	}

	// A fourth member joins: it cannot decrypt what was put before it.
	hosts = append(hosts, startNSHost(t, bin, endpoint, shared, "h4"))
	joined(t, reg, "h4")
	h4 := &env{t: t, reg: reg, host: "h4"}
	eventually(t, "h4 reports that it cannot decrypt the secret", func() bool {
		s, ok := h4.status("app.service")
		return ok && strings.Contains(s.Error, "cannot decrypt") && strings.Contains(s.Error, "encrypted to h1, h2, h3")
	})
	out, code = secretCLI(e, "", "secrets", "ls", "--group", "web")
	if code != 0 || !regexp.MustCompile(`groups/web\s+\S+db\.env\s+0600\s+root:root\s+h1,h2,h3\s+h4\n`).MatchString(out) {
		t.Errorf("secrets ls --group web: exit %d, want h4 named as not a recipient\n%s", code, out)
	}
	out, code = e.cli("unit", "put", unitFile, "--group", "web", "--wait", "--timeout", "20s")
	if code != exitFailed || !strings.Contains(out, "h4") || !strings.Contains(out, "cannot decrypt") {
		t.Errorf("put --wait with h4 unable to decrypt: exit %d, want %d naming h4\n%s", code, exitFailed, out)
	}
	if fi, err := os.Stat(filepath.Join(hosts[3].root, "db.env")); err == nil {
		t.Errorf("h4 wrote a db.env it cannot have decrypted (%d bytes)", fi.Size())
	}

	// rekey with the admin's key: h4 is a recipient now, and runs it.
	out, code = secretCLI(e, pins, "secrets", "rekey", "--group", "web", "--identity", filepath.Join(adminDir, secret.IdentityFile))
	if code != 0 || !strings.Contains(out, "rekeyed groups/web/units/"+key+" to h1, h2, h3, h4") || !strings.Contains(out, "pinned h4's recipient") {
		t.Fatalf("secrets rekey --group web: exit %d\n%s", code, out)
	}
	out, code = e.cli("unit", "put", unitFile, "--group", "web", "--wait", "--timeout", "20s")
	if code != 0 {
		t.Errorf("put --wait after the rekey: exit %d, want 0\n%s", code, out)
	}
	for _, n := range hosts {
		if !hasFile(filepath.Join(n.root, "db.env"), content) {
			t.Errorf("%s: no byte-exact db.env, mode 0600, after the rekey", n.host)
		}
	}
	out, code = secretCLI(e, "", "secrets", "ls", "--group", "web", "--json")
	var rows []secretRow
	if err := json.Unmarshal([]byte(out), &rows); code != 0 || err != nil || len(rows) != 1 ||
		strings.Join(rows[0].To, ",") != "h1,h2,h3,h4" || len(rows[0].NotRecipients) != 0 {
		t.Errorf("secrets ls --json after the rekey: exit %d (%v), want one secret to h1…h4, every member a recipient\n%s", code, err, out)
	}

	logs := map[string][]byte{}
	var pids []int
	for _, n := range hosts {
		logs[n.host+"'s agent log"] = []byte(n.log.String())
		pids = append(pids, n.cmd.Process.Pid)
	}
	noPlaintext(t, endpoint, token, logs, pids...)
}

// A host whose recipient changed (its identity made anew, as after a
// reinstall) is refused by put --secret — naming it, the pinned and the
// new recipient, and how to accept it; nothing stored — until secrets
// accept pins the new one. With --accept-new=false a host never seen is
// refused too.
func TestSecretPinChangedIsRefusedUntilAccepted(t *testing.T) {
	t.Parallel() // waits on systemd, not the CPU
	e := newEnv(t)
	root := filepath.Join(e.h.Dir, "etc", "app")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	start := func() { e.startAgentOn([]string{e.endpoint}, func(o *runOptions) { o.fileRoots = []string{root} }) }
	start()
	pins := filepath.Join(t.TempDir(), "known_recipients")
	dest := filepath.Join(root, "token")
	key := reconcile.ConfigKey("app.service", dest)
	unitFile := e.writeUnit("app.service", secretUnit)
	putWith := func(pins, content string, extra ...string) (string, int) {
		args := []string{"unit", "put", unitFile, "--host", "h1", "--file", dest + "=" + e.writeUnit("files/token", content), "--secret"}
		return secretCLI(e, pins, append(args, extra...)...)
	}
	put := func(content string, extra ...string) (string, int) { return putWith(pins, content, extra...) }
	joined(t, e.reg, "h1")
	if out, code := putWith(filepath.Join(t.TempDir(), "none"), "one\n", "--accept-new=false"); code != exitUsage ||
		!strings.Contains(out, "h1's recipient age1") || !strings.Contains(out, "is not pinned yet (--accept-new=false)") {
		t.Errorf("put --secret --accept-new=false to a host never pinned: exit %d, want %d\n%s", code, exitUsage, out)
	}
	if out, code := put("one\n", "--wait", "--timeout", "20s"); code != 0 {
		t.Fatalf("put --secret --wait: exit %d\n%s", code, out)
	}
	old := publishedRecipient(t, e.reg, "h1")

	// The agent comes back with a new identity.
	e.agent.stop(t)
	if err := os.Remove(filepath.Join(e.h.StateDir, secret.IdentityFile)); err != nil {
		t.Fatal(err)
	}
	start()
	joined(t, e.reg, "h1")
	eventually(t, "h1 publishes its new recipient", func() bool { r := publishedRecipient(t, e.reg, "h1"); return r != "" && r != old })
	now := publishedRecipient(t, e.reg, "h1")
	_, rev, err := e.reg.GetRevision(context.Background(), registry.Target{Host: "h1"}, key)
	if err != nil {
		t.Fatal(err)
	}
	out, code := put("two\n", "--wait", "--timeout", "20s")
	if code != exitUsage || !strings.Contains(out, "h1's recipient changed: pinned "+old+", the registry now says "+now) ||
		!strings.Contains(out, "agentd secrets accept h1") || !strings.Contains(out, "nothing stored") {
		t.Errorf("put --secret to a host whose recipient changed: exit %d, want %d naming h1, both recipients and secrets accept\n%s", code, exitUsage, out)
	}
	if _, rev2, _ := e.reg.GetRevision(context.Background(), registry.Target{Host: "h1"}, key); rev2 != rev {
		t.Errorf("the refused put stored something: %s at revision %d → %d", key, rev, rev2)
	}

	out, code = secretCLI(e, pins, "secrets", "accept", "h1")
	if code != 0 || !strings.Contains(out, "h1: "+old+" → "+now) {
		t.Errorf("secrets accept h1: exit %d, want old → new\n%s", code, out)
	}
	if out, code := put("two\n", "--wait", "--timeout", "20s"); code != 0 {
		t.Fatalf("put --secret after accept: exit %d\n%s", code, out)
	}
	if !hasFile(dest, "two\n") {
		t.Errorf("%s is not the new secret, mode 0600", dest)
	}
}

// publishedRecipient is host's recipient as its agent publishes it ("": none).
func publishedRecipient(t *testing.T, reg *registry.Client, host string) string {
	t.Helper()
	known, err := reg.KnownHosts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range known {
		if k.Host == host && k.Live {
			return k.Recipient
		}
	}
	return ""
}

// Bad input is refused with a clear error, exit 2, before anything is
// stored (and no error carries the plaintext): a host that never joined,
// a group with no members, a member from before secrets, a secret over the
// limit, --secret without --file, a bad --admin-recipient, a host missing
// from --recipients. With --recipients FILE naming every host, the put
// encrypts to those and pins nothing.
func TestSecretBadInputStoresNothing(t *testing.T) {
	t.Parallel()
	endpoint := registrytest.StartEtcd(t).Endpoint()
	reg := registrytest.NewClient(t, endpoint)
	dir := t.TempDir()
	e := &env{t: t, endpoint: endpoint, reg: reg, host: "h1"}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// Two members that never ran here: n1 (group web) with a recipient,
	// old1 (group legacy) from before secrets.
	n1, err := secret.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	raw := registrytest.RawClient(t, endpoint)
	for host, m := range map[string]reconcile.Member{
		"n1":   {Host: "n1", Groups: []string{"web"}, Recipient: n1.Recipient()},
		"old1": {Host: "old1", Groups: []string{"legacy"}},
	} {
		b, _ := json.Marshal(m)
		if _, err := raw.Put(context.Background(), registry.DefaultPrefix+"/members/"+host, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	content, token := plaintext(t)
	unitFile := write("app.service", secretUnit)
	file := "/etc/app/db.env=" + write("db.env", content)
	big := "/etc/app/big=" + write("big", strings.Repeat("x", secret.MaxPlaintext+1))
	pins := filepath.Join(dir, "pins", "known_recipients")
	partial := write("recipients", "# ours\nh1 "+n1.Recipient()+"\n")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown host", []string{"--host", "h9", "--file", file, "--secret"}, "no agent has joined as h9: no key to encrypt to"},
		{"empty group", []string{"--group", "db", "--file", file, "--secret"}, "group db has no members"},
		{"from before secrets", []string{"--group", "legacy", "--file", file, "--secret"}, "old1 publishes no recipient: its agent is from before secrets"},
		{"over the limit", []string{"--group", "web", "--file", big, "--secret"}, "over a secret's limit of 64 KiB"},
		{"no --file", []string{"--group", "web", "--secret"}, "give the secret as --file"},
		{"bad admin", []string{"--group", "web", "--file", file, "--secret", "--admin-recipient", "age1nope"}, "--admin-recipient"},
		{"admin without --secret", []string{"--group", "web", "--file", file, "--admin-recipient", n1.Recipient()}, "only with --secret"},
		{"missing from --recipients", []string{"--group", "web", "--file", file, "--secret", "--recipients", partial}, "has no line for n1"},
	} {
		out, code := secretCLI(e, pins, append([]string{"unit", "put", unitFile}, tc.args...)...)
		if code != exitUsage || !strings.Contains(out, tc.want) || strings.Contains(out, token) {
			t.Errorf("%s: exit %d, want %d saying %q (and never the plaintext)\n%s", tc.name, code, exitUsage, tc.want, out)
		}
	}
	if ls, err := reg.List(context.Background(), nil); err != nil || len(ls) != 0 {
		t.Errorf("refused puts stored %d keys (%v)", len(ls), err)
	}

	// --recipients naming every host: encrypted to them, no pin made.
	full := write("recipients-full", "n1 "+n1.Recipient()+"\n")
	if out, code := secretCLI(e, pins, "unit", "put", unitFile, "--group", "web", "--file", file, "--secret", "--recipients", full); code != 0 {
		t.Fatalf("put --secret --recipients: exit %d\n%s", code, out)
	}
	v, err := reg.Get(context.Background(), registry.Target{Group: "web"}, reconcile.ConfigKey("app.service", "/etc/app/db.env"))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := reconcile.DecodeConfigFile(v)
	if err != nil || !cf.Secret || strings.Join(cf.To, ",") != "n1" || cf.Mode != 0o600 {
		t.Fatalf("stored %+v (%v), want a secret to n1, mode 0600", cf, err)
	}
	if p, err := n1.Decrypt(cf.Content); err != nil || string(p) != content {
		t.Errorf("n1 cannot decrypt what was put to it: %v", err)
	}
	if _, err := os.Stat(pins); err == nil {
		t.Errorf("--recipients made a pins file")
	}

	// rekey with a key the secret was not encrypted to: the key named,
	// nothing stored.
	otherDir := t.TempDir()
	if _, err := secret.LoadOrCreate(otherDir); err != nil {
		t.Fatal(err)
	}
	_, rev, _ := reg.GetRevision(context.Background(), registry.Target{Group: "web"}, reconcile.ConfigKey("app.service", "/etc/app/db.env"))
	out, code := secretCLI(e, pins, "secrets", "rekey", "--group", "web", "--identity", filepath.Join(otherDir, secret.IdentityFile))
	if _, rev2, _ := reg.GetRevision(context.Background(), registry.Target{Group: "web"}, reconcile.ConfigKey("app.service", "/etc/app/db.env")); code != exitError ||
		!strings.Contains(out, "app.service.files/etc/app/db.env: cannot decrypt with") || !strings.Contains(out, "nothing stored") || rev2 != rev {
		t.Errorf("secrets rekey with a key it was not encrypted to: exit %d, revision %d → %d, want %d naming the key, nothing stored\n%s", code, rev, rev2, exitError, out)
	}
	noPlaintext(t, endpoint, token, nil)
}

// unit edit of a secret is refused before any editor runs: it would show
// the armour, and the plaintext must not land in a temp file. (Not
// parallel: it sets $EDITOR, to an editor that would fail otherwise.)
func TestUnitEditRefusesASecret(t *testing.T) {
	t.Setenv("EDITOR", "false")
	endpoint := registrytest.StartEtcd(t).Endpoint()
	reg := registrytest.NewClient(t, endpoint)
	id, err := secret.LoadOrCreate(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ct, err := secret.Encrypt([]byte("PASSWORD=x\n"), []string{id.Recipient()})
	if err != nil {
		t.Fatal(err)
	}
	key := reconcile.ConfigKey("app.service", "/etc/app/db.env")
	web := registry.Target{Group: "web"}
	value := reconcile.ConfigFile{Mode: 0o600, Owner: "root:root", Secret: true, To: []string{"n1"}, Content: ct}.Encode()
	rev, err := reg.Put(context.Background(), web, map[string][]byte{"app.service": []byte(secretUnit), key: value})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, endpoint: endpoint, reg: reg, host: "h1"}
	out, code := e.cli("unit", "edit", key, "--group", "web", "--yes")
	_, rev2, _ := reg.GetRevision(context.Background(), web, key)
	if code != exitUsage || !strings.Contains(out, "a secret (age-encrypted to n1)") || !strings.Contains(out, "--secret; nothing stored") || rev2 != rev {
		t.Errorf("unit edit of a secret: exit %d, revision %d → %d, want %d saying it is a secret\n%s", code, rev, rev2, exitUsage, out)
	}
}
