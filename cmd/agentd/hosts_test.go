package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/registry/registrytest"
)

// garbageEnv is an etcd, a registry client, a raw etcd client to write
// what no agent would, and one host's session standing in for its agent
// (no systemd needed).
type garbageEnv struct {
	endpoint string
	reg      *registry.Client
	raw      *clientv3.Client
	sess     *registry.Session
}

func newGarbageEnv(t *testing.T) *garbageEnv {
	t.Helper()
	e := registrytest.StartEtcd(t)
	reg := registrytest.NewClient(t, e.Endpoint())
	raw := registrytest.RawClient(t, e.Endpoint())
	s, err := reg.Join(t.Context(), reconcile.Member{Host: "h1", MachineID: "m1", Groups: []string{"all"}}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &garbageEnv{endpoint: e.Endpoint(), reg: reg, raw: raw, sess: s}
}

func (g *garbageEnv) put(t *testing.T, key, value string) {
	t.Helper()
	if _, err := g.raw.Put(t.Context(), key, value); err != nil {
		t.Fatal(err)
	}
}

// run runs an agentd command line against the env's etcd.
func (g *garbageEnv) run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	root := newRoot()
	root.SetArgs(append(args, "--etcd-endpoints", g.endpoint))
	root.SetOut(&out)
	root.SetErr(&errb)
	err := root.ExecuteContext(t.Context())
	if err != nil {
		code = exitError
		var ce *codeError
		if asCode(err, &ce) {
			code = ce.code
		}
		errb.WriteString("error: " + err.Error() + "\n")
	}
	t.Logf("$ agentd %s → %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
	return out.String(), errb.String(), code
}

// `agentd hosts` lists the live agents whatever else sits under agents/
// and status/, and names every key it skipped on stderr.
func TestHostsSkipsGarbage(t *testing.T) {
	t.Parallel()
	g := newGarbageEnv(t)
	if err := g.sess.Report(t.Context(), []reconcile.Status{{Unit: "a.service", Hash: "x", DesiredHash: "x", ActiveState: "active"}}); err != nil {
		t.Fatal(err)
	}
	bad := []string{"/agentd/agents/hbad", "/agentd/agents/a/b", "/agentd/status/h1/x.service"}
	for _, k := range bad {
		g.put(t, k, "{not json")
	}
	out, stderr, code := g.run(t, "hosts", "--json")
	var rows []struct {
		reconcile.Member
		Converged, Pending, Failed int
	}
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 1 || rows[0].Host != "h1" || rows[0].Converged != 1 {
		t.Fatalf("hosts --json with garbage: exit %d\n%s", code, out)
	}
	for _, k := range bad {
		if !strings.Contains(stderr, "agentd: warning: skipping registry key "+k+":") {
			t.Errorf("stderr does not name %s:\n%s", k, stderr)
		}
	}
	if out, _, code := g.run(t, "hosts"); code != 0 || !strings.Contains(out, "1/0/0") {
		t.Fatalf("hosts with garbage: exit %d\n%s", code, out)
	}
}

// `agentd unit put --wait` is not thrown off by garbage at the status key
// it waits on, before or during the wait.
func TestPutWaitSkipsGarbageStatus(t *testing.T) {
	t.Parallel()
	g := newGarbageEnv(t)
	content := "[Service]\nExecStart=/bin/true\n"
	file := filepath.Join(t.TempDir(), "hello.service")
	if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	g.put(t, "/agentd/status/h1/hello.service", "{not json")
	g.put(t, "/agentd/status/h1/other.service", "{not json")

	// The stand-in agent: once the unit is stored, more garbage at its
	// status key, then the real status.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	agent := make(chan error, 1)
	go func() {
		var rev int64 // the revision the stand-in acts on, as an agent's pass would
		for {
			if _, r, err := g.reg.GetRevision(ctx, registry.Target{Host: "h1"}, "hello.service"); err == nil {
				rev = r
				break
			}
			select {
			case <-ctx.Done():
				agent <- ctx.Err()
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		time.Sleep(200 * time.Millisecond)
		if _, err := g.raw.Put(ctx, "/agentd/status/h1/hello.service", "still not json"); err != nil {
			agent <- err
			return
		}
		time.Sleep(200 * time.Millisecond)
		h := reconcile.Hash([]byte(content))
		agent <- g.sess.Publish(ctx, rev, []reconcile.Status{{Unit: "hello.service", Hash: h, DesiredHash: h,
			ActiveState: "active", SubState: "running", Health: "healthy", Action: "start", Result: "done"}})
	}()
	_, _, code := g.run(t, "unit", "put", file, "--host", "h1", "--wait", "--timeout", "20s")
	if err := <-agent; err != nil {
		t.Fatalf("stand-in agent: %v", err)
	}
	if code != 0 {
		t.Fatalf("unit put --wait with garbage statuses: exit %d, want 0", code)
	}
}
