package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/crypto/ssh"

	"github.com/agentd/agentd/internal/citest"
	"github.com/agentd/agentd/internal/testlog"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// sshTool is the path of an OpenSSH tool (ssh-keygen, ssh-agent,
// ssh-add): the test fails under CI=true without it (.ci/run installs
// openssh-client) and is skipped elsewhere.
func sshTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		citest.Unavailable(t, "%s (openssh-client): %v", name, err)
	}
	return p
}

// sshKey is an ed25519 key made by ssh-keygen: its private key file and
// its allowed_signers line for principal.
type sshKey struct {
	file, fingerprint, line string
}

func newSSHKey(t testing.TB, dir, principal string) sshKey {
	t.Helper()
	file := filepath.Join(dir, principal+"_ed25519")
	if out, err := exec.Command(sshTool(t, "ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", principal, "-f", file).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	pub, err := os.ReadFile(file + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	k, _, _, _, err := ssh.ParseAuthorizedKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return sshKey{file: file, fingerprint: ssh.FingerprintSHA256(k), line: principal + ` namespaces="agentd" ` + strings.TrimSpace(string(pub))}
}

// signedEnv is an env whose agent runs with --allowed-signers naming
// alice; mallory's key is not in it.
type signedEnv struct {
	*env
	alice, mallory sshKey
	allowed        string
	log            *testlog.Buffer
	raw            *clientv3.Client
}

func newSignedEnv(t *testing.T) *signedEnv {
	t.Helper()
	e := &signedEnv{env: newEnv(t), log: &testlog.Buffer{}}
	dir := t.TempDir()
	e.alice, e.mallory = newSSHKey(t, dir, "alice@example.com"), newSSHKey(t, dir, "mallory")
	e.allowed = filepath.Join(dir, "allowed_signers")
	if err := os.WriteFile(e.allowed, []byte("# who may change units\n"+e.alice.line+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	raw := registrytest.RawClient(t, e.endpoint)
	e.raw = raw
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) {
		o.allowedSigners = e.allowed
		o.logOut = io.MultiWriter(t.Output(), e.log)
	})
	return e
}

// putSigned stores content under name with --wait and the flags given,
// and returns the exit code and output.
func (e *signedEnv) putWith(name, content string, flags ...string) (string, int) {
	e.t.Helper()
	return e.cli(append([]string{"unit", "put", e.writeUnit(name, content), "--host", e.host, "--wait", "--timeout", "20s"}, flags...)...)
}

func (e *signedEnv) get(key string) []byte {
	e.t.Helper()
	resp, err := e.raw.Get(e.t.Context(), key)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	return resp.Kvs[0].Value
}

// refusedWith waits until unit's status error starts with prefix.
func (e *signedEnv) refusedWith(t *testing.T, unit, prefix string) reconcile.Status {
	t.Helper()
	var st reconcile.Status
	eventually(t, unit+" refused with "+prefix, func() bool {
		st, _ = e.status(unit)
		return strings.HasPrefix(st.Error, prefix)
	})
	return st
}

const (
	helloKey    = "/agentd/hosts/h1/units/hello.service"
	helloSigKey = "/agentd/hosts/h1/signatures/hello.service"
)

// With --allowed-signers a host applies a change only when an allowed
// signer signed it: an unsigned put, a put signed by an unknown key, an
// old signed version put back and a removal without a signature are all
// refused, the running unit kept (same MainPID, same file); a signed put,
// a signed revert to an older version and a signed removal are applied.
// What agentd signs is what ssh-keygen -Y verify accepts.
func TestSignedChanges(t *testing.T) {
	e := newSignedEnv(t)
	signed := []string{"--sign-key", e.alice.file}

	// A signed put is applied.
	if out, code := e.putWith("hello.service", helloV1, signed...); code != 0 {
		t.Fatalf("signed put: exit %d\n%s", code, out)
	}
	pid := e.h.MainPID(t, "hello.service")
	v1Value, v1Sig := e.get(helloKey), e.get(helloSigKey)
	if !strings.Contains(e.log.String(), "signed change accepted: "+helloKey+" signed by "+e.alice.fingerprint+" (alice@example.com)") {
		t.Errorf("the journal does not name the signer of the change:\n%s", e.log.String())
	}
	// ssh-keygen -Y verify accepts the stored signature over the
	// documented message.
	var rec reconcile.SignatureRecord
	if err := json.Unmarshal(v1Sig, &rec); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sigFile := filepath.Join(dir, "hello.sig")
	os.WriteFile(sigFile, []byte(rec.Signature), 0o600)
	msg := "agentd signed change v1\nkey " + helloKey + "\ntarget hosts/h1\ncontent sha256:" + reconcile.Hash([]byte(helloV1)) +
		"\nsequence " + strconv.FormatUint(rec.Seq, 10) + "\nrevert no\n"
	verify := exec.Command(sshTool(t, "ssh-keygen"), "-Y", "verify", "-f", e.allowed, "-I", "alice@example.com", "-n", "agentd", "-s", sigFile)
	verify.Stdin = strings.NewReader(msg)
	if out, err := verify.CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen -Y verify refused what agentd signed: %v\n%s", err, out)
	}

	kept := func(step string) {
		t.Helper()
		if got := e.h.MainPID(t, "hello.service"); got != pid {
			t.Fatalf("%s: MainPID %d → %d: the running unit was touched", step, pid, got)
		}
		if got, _ := e.readLocal("hello.service"); got != helloV1 && got != helloV2 {
			t.Fatalf("%s: file on disk %q", step, got)
		}
	}

	// Unsigned: refused, --wait says so (exit 3), the old version runs.
	out, code := e.putWith("hello.service", helloV2)
	if code != exitFailed || !strings.Contains(out, "refused: unsigned") {
		t.Fatalf("unsigned put: exit %d, want %d\n%s", code, exitFailed, out)
	}
	st := e.refusedWith(t, "hello.service", "refused: unsigned: "+helloKey)
	if st.Action != reconcile.ActionBlocked || st.Hash != reconcile.Hash([]byte(helloV1)) || st.DesiredHash != reconcile.Hash([]byte(helloV2)) {
		t.Errorf("status after an unsigned put: %+v", st)
	}
	kept("unsigned put")

	// Signed by a key that is not allowed: a bad signature, naming the key.
	if _, code := e.putWith("hello.service", helloV2, "--sign-key", e.mallory.file); code != exitFailed {
		t.Fatalf("put signed by mallory: exit %d", code)
	}
	st = e.refusedWith(t, "hello.service", "refused: bad signature: "+helloKey+": signed by "+e.mallory.fingerprint)
	kept("put by an unknown key")

	// Content changed under a valid signature (etcdctl put of the key
	// alone): a bad signature, "signed for other content".
	if out, code := e.putWith("hello.service", helloV2, signed...); code != 0 {
		t.Fatalf("signed put of v2: exit %d\n%s", code, out)
	}
	pid = e.h.MainPID(t, "hello.service")
	if _, err := e.raw.Put(t.Context(), helloKey, helloV1+"# edited behind agentd's back\n"); err != nil {
		t.Fatal(err)
	}
	e.refusedWith(t, "hello.service", "refused: bad signature: "+helloKey+": signed by "+e.alice.fingerprint+" (alice@example.com): signed for other content")
	kept("content edited under a signature")

	// Replay: v1 and its signature, as stored at the first put, written
	// back together.
	if _, err := e.raw.Txn(t.Context()).Then(clientv3.OpPut(helloKey, string(v1Value)), clientv3.OpPut(helloSigKey, string(v1Sig))).Commit(); err != nil {
		t.Fatal(err)
	}
	e.refusedWith(t, "hello.service", "refused: replayed: "+helloKey)
	kept("replay")
	if got, _ := e.readLocal("hello.service"); got != helloV2 {
		t.Fatalf("after the replay the file is %q, want v2", got)
	}
	// ... also by the agent started again: the sequence numbers accepted
	// are kept in the state directory.
	e.agent.stop(t)
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) {
		o.allowedSigners = e.allowed
		o.logOut = io.MultiWriter(t.Output(), e.log)
	})
	e.refusedWith(t, "hello.service", "refused: replayed: "+helloKey)
	kept("replay, after a restart")

	// A signed revert to v1 (older than what runs; its old signature was
	// just refused as replayed) is applied. (The registry holds v1 already,
	// from the replay: put v2 back signed first, as an operator would.)
	if out, code := e.putWith("hello.service", helloV2, signed...); code != 0 {
		t.Fatalf("signed put of v2 again: exit %d\n%s", code, out)
	}
	kept("v2 put back signed")
	v1Rev := e.history("hello.service").Versions[0].Revision
	if out, code := e.cli("unit", "revert", "hello.service", "--host", e.host, "--to", strconv.FormatInt(v1Rev, 10), "--wait", "--timeout", "20s", "--sign-key", e.alice.file); code != 0 {
		t.Fatalf("signed revert: exit %d\n%s", code, out)
	}
	if got, _ := e.readLocal("hello.service"); got != helloV1 {
		t.Fatalf("after the signed revert the file is %q", got)
	}
	if e.h.MainPID(t, "hello.service") == pid {
		t.Fatal("the signed revert did not restart the unit")
	}
	if s, _ := e.status("hello.service"); s.Error != "" {
		t.Fatalf("status after the signed revert: %+v", s)
	}
	pid = e.h.MainPID(t, "hello.service")

	// A removal without a signature (etcdctl del) is refused.
	if _, err := e.raw.Delete(t.Context(), helloKey); err != nil {
		t.Fatal(err)
	}
	e.refusedWith(t, "hello.service", "refused: bad signature: "+helloKey)
	kept("unsigned removal")
	if _, err := e.raw.Delete(t.Context(), helloSigKey); err != nil {
		t.Fatal(err)
	}
	e.refusedWith(t, "hello.service", "refused: unsigned: "+helloKey+": removed from the registry without a signed removal")
	kept("unsigned removal without a record")

	// Put back signed, edited signed, then a signed removal: stopped and removed.
	if out, code := e.putWith("hello.service", helloV1, signed...); code != 0 {
		t.Fatalf("signed put back: exit %d\n%s", code, out)
	}
	// unit edit signs too.
	t.Setenv("VISUAL", "")
	t.Setenv("EDITOR", editorScript(t, dir, `sed -i 's/sleep 1001/sleep 1002/' "$1"`))
	if out, code := e.cli("unit", "edit", "hello.service", "--host", e.host, "--yes", "--timeout", "20s", "--sign-key", e.alice.file); code != 0 {
		t.Fatalf("signed edit: exit %d\n%s", code, out)
	}
	if got, _ := e.readLocal("hello.service"); got != helloV2 {
		t.Fatalf("after the signed edit the file is %q", got)
	}
	if out, code := e.cli("unit", "rm", "hello.service", "--host", e.host, "--wait", "--timeout", "20s", "--sign-key", e.alice.file); code != 0 {
		t.Fatalf("signed rm: exit %d\n%s", code, out)
	}
	if _, ok := e.readLocal("hello.service"); ok {
		t.Fatal("hello.service still on disk after a signed removal")
	}
}

// The agent refuses to start with an allowed_signers file it cannot use,
// naming the file and the line.
func TestAllowedSignersRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	k := newSSHKey(t, dir, "alice")
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	unreadable := write("unreadable", k.line+"\n")
	os.Chmod(unreadable, 0)
	for _, c := range []struct {
		name, file, want string
	}{
		{"missing", filepath.Join(dir, "nope"), "no such file"},
		{"malformed", write("bad", "# ok\n"+k.line+"\nbob ssh-ed25519 AAAA-not-a-key\n"), "bad:3: invalid key"},
		{"no signer", write("empty", "# nobody\n"), "no signer"},
		{"a directory", dir, "is a directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := &runOptions{host: "h1", groups: []string{"all"}, unitDir: t.TempDir(), stateDir: t.TempDir(), logLevel: "error",
				allowedSigners: c.file, logOut: t.Output()}
			_, err := newAgentRun(o)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--allowed-signers") {
				t.Fatalf("err %v, want it to name --allowed-signers and %q", err, c.want)
			}
		})
	}
	if os.Geteuid() != 0 { // root reads a file of mode 0 anyway
		o := &runOptions{host: "h1", groups: []string{"all"}, unitDir: t.TempDir(), stateDir: t.TempDir(), allowedSigners: unreadable, logOut: t.Output()}
		if _, err := newAgentRun(o); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Fatalf("unreadable: %v", err)
		}
	}
}

// --sign-key ssh-agent signs with a key of the running ssh-agent, picked
// by --sign-key-id; what it stores verifies with ssh-keygen.
func TestSignKeyFromSSHAgent(t *testing.T) {
	e := newRegistryEnv(t)
	dir := t.TempDir()
	a, b := newSSHKey(t, dir, "alice"), newSSHKey(t, dir, "bob")
	sock := filepath.Join(dir, "agent.sock")
	agentCmd := exec.Command(sshTool(t, "ssh-agent"), "-D", "-a", sock)
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agentCmd.Process.Kill(); agentCmd.Wait() })
	eventually(t, "ssh-agent listening", func() bool { _, err := os.Stat(sock); return err == nil })
	t.Setenv("SSH_AUTH_SOCK", sock)
	for _, k := range []sshKey{a, b} {
		if out, err := exec.Command(sshTool(t, "ssh-add"), "-q", k.file).CombinedOutput(); err != nil {
			t.Fatalf("ssh-add: %v\n%s", err, out)
		}
	}
	e.putFile("a.service", helloV1, "--sign-key", "ssh-agent", "--sign-key-id", b.fingerprint)
	var rec reconcile.SignatureRecord
	cli := registrytest.RawClient(t, e.endpoint)
	resp, err := cli.Get(t.Context(), "/agentd/hosts/h1/signatures/a.service")
	if err != nil || len(resp.Kvs) != 1 || json.Unmarshal(resp.Kvs[0].Value, &rec) != nil {
		t.Fatalf("signature record: %v %v", resp, err)
	}
	if rec.Signer != b.fingerprint {
		t.Fatalf("signed by %s, want bob's key %s", rec.Signer, b.fingerprint)
	}
	allowed := filepath.Join(dir, "allowed")
	os.WriteFile(allowed, []byte(b.line+"\n"), 0o644)
	sigFile := filepath.Join(dir, "a.sig")
	os.WriteFile(sigFile, []byte(rec.Signature), 0o600)
	msg := reconcile.SignedChange{Key: "/agentd/hosts/h1/units/a.service", Target: "hosts/h1", Hash: reconcile.Hash([]byte(helloV1)), Seq: rec.Seq}.Message()
	verify := exec.Command(sshTool(t, "ssh-keygen"), "-Y", "verify", "-f", allowed, "-I", "bob", "-n", "agentd", "-s", sigFile)
	verify.Stdin = bytes.NewReader(msg)
	if out, err := verify.CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen -Y verify: %v\n%s", err, out)
	}
	// No such key in the agent: a usage error naming the ones it holds,
	// and nothing stored.
	bFile := filepath.Join(dir, "b.service")
	os.WriteFile(bFile, []byte(helloV1), 0o644)
	out, code := e.cli("unit", "put", bFile, "--host", e.host, "--sign-key", "ssh-agent", "--sign-key-id", "SHA256:nope")
	if code != exitUsage || !strings.Contains(out, a.fingerprint) {
		t.Fatalf("unknown --sign-key-id: exit %d\n%s", code, out)
	}
	if _, err := e.reg.Get(t.Context(), registry.Target{Host: e.host}, "b.service"); err == nil {
		t.Fatal("b.service stored although the key could not be found")
	}
}
