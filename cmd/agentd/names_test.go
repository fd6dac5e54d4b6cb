package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testlog"
	"github.com/agentd/agentd/reconcile"
)

// Names that systemd-escape makes go the whole way, as spelled: put
// --wait, the file on disk, systemd's view, the status in etcd and in
// `agentd status`, history, revert --wait, the metrics, the log lines
// (whose "unit" attribute is the journal's OBJECT_SYSTEMD_UNIT=) and rm
// --wait. On main the host refused them ("invalid path").
func TestEscapedNamesRoundTrip(t *testing.T) {
	t.Parallel() // waits on jobs, not the CPU
	e := newEnv(t)
	logs := &testlog.Buffer{}
	metricsAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) {
		o.logOut = io.MultiWriter(t.Output(), logs)
		o.metricsAddr = metricsAddr
	})

	const (
		plain    = `foo\x2dbar.service`     // systemd-escape --suffix service foo-bar
		template = "esc@.service"           //
		instance = `esc@b\x2dc.service`     // systemd-escape --template esc@.service b-c
		solo     = `solo@x\x2dy.service`    // an instance file, no template beside it
		dropIn   = plain + ".d/10-env.conf" // a drop-in of an escaped name
	)
	v1 := "[Service]\nType=exec\nExecStart=/bin/sleep 1001\n" + fast
	v2 := "[Service]\nType=exec\nExecStart=/bin/sleep 1002\n" + fast
	tmpl := "[Service]\nType=exec\nEnvironment=INST=%I RAW=%i\nExecStart=/bin/sleep 1003\n" + fast
	soloV := "[Service]\nType=exec\nEnvironment=INST=%I\nExecStart=/bin/sleep 1004\n" + fast

	e.put(plain, v1)
	e.put(dropIn, "[Service]\nEnvironment=DROPIN=yes\n")
	if out, code := e.cli("unit", "put", e.writeUnit(template, tmpl), "--instance", instance,
		"--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("put %s --instance %s: exit %d\n%s\n%s", template, instance, code, out, e.h.Log())
	}
	e.put(solo, soloV)

	// systemd's view, over D-Bus: running, and the instances unescaped as
	// instances of their template (%I) — or of none, for the instance file.
	for name, env := range map[string][]string{
		plain:    {"DROPIN=yes"},
		instance: {"INST=b-c", `RAW=b\x2dc`},
		solo:     {"INST=x-y"},
	} {
		if st := e.h.ActiveState(t, name); st != "active" {
			t.Errorf("%s: ActiveState %s, want active", name, st)
		}
		got, _ := e.h.Prop(t, name, "Environment").([]string)
		for _, kv := range env {
			if !slices.Contains(got, kv) {
				t.Errorf("%s: Environment %q, want %s in it", name, got, kv)
			}
		}
	}
	if got, _ := e.readLocal(plain); got != v1 {
		t.Errorf("%s on disk: %q", plain, got)
	}
	if _, ok := e.readLocal(instance); ok {
		t.Errorf("%s: a file written for an instance key", instance)
	}

	// The status in etcd, under the name as spelled (an instance key has
	// no file of its own: it runs its template's).
	for name, content := range map[string]string{plain: v1, instance: tmpl, solo: soloV} {
		s, ok := e.status(name)
		hash := s.Hash
		if name == instance {
			hash = s.RunsHash
		}
		if !ok || hash != reconcile.Hash([]byte(content)) || s.DesiredHash != s.Hash || s.ActiveState != "active" || s.Result != "done" {
			t.Errorf("status of %s in etcd: %+v (found %v)", name, s, ok)
		}
	}
	// `agentd status` from the agent.
	out, code := e.cli("status", "--json", "--debug-socket", e.agent.opts.debugSocket)
	var st struct{ Units []reconcile.Status }
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status --json: exit %d\n%s", code, out)
	}
	var names []string
	for _, u := range st.Units {
		names = append(names, u.Unit)
	}
	for _, name := range []string{plain, instance, solo} {
		if !slices.Contains(names, name) {
			t.Errorf("agentd status lists %q, not %s", names, name)
		}
	}

	// A new version, then history and revert --wait, all by the escaped name.
	pid1 := e.h.MainPID(t, plain)
	e.put(plain, v2)
	h := e.history(plain)
	if len(h.Versions) != 2 || h.Versions[0].Hash != reconcile.Hash([]byte(v1)) || !h.Versions[1].Current {
		t.Fatalf("history of %s: %+v", plain, h)
	}
	if out, code := e.cli("unit", "revert", plain, "--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("revert %s --wait: exit %d\n%s", plain, code, out)
	}
	if got, _ := e.readLocal(plain); got != v1 {
		t.Errorf("%s on disk after the revert: %q, want v1", plain, got)
	}
	if pid := e.h.MainPID(t, plain); pid == 0 || pid == pid1 || e.h.ActiveState(t, plain) != "active" {
		t.Errorf("%s after the revert: MainPID %d (v1 ran as %d), %s", plain, pid, pid1, e.h.ActiveState(t, plain))
	}
	if s, _ := e.status(plain); s.Hash != reconcile.Hash([]byte(v1)) || s.ActiveState != "active" {
		t.Errorf("status of %s after the revert: %+v", plain, s)
	}

	// The metrics count them as converged (the metrics carry no unit
	// label), and no unit failed.
	metrics := agentMetrics(t, metricsAddr)
	if !regexp.MustCompile(`(?m)^agentd_units\{state="converged"\} [3-9]`).MatchString(metrics) ||
		!strings.Contains(metrics, `agentd_units{state="failed"} 0`) {
		t.Errorf("metrics:\n%s", grepLines(metrics, "agentd_units{"))
	}
	// The log lines about each unit carry its name as spelled in "unit".
	for _, name := range []string{plain, instance, solo} {
		if !strings.Contains(logs.String(), "unit="+name+" ") && !strings.Contains(logs.String(), "unit="+strconv.Quote(name)) {
			t.Errorf("no log line with unit=%s", name)
		}
	}

	// rm --wait: stopped, its files gone, its status gone.
	if out, code := e.cli("unit", "rm", plain, dropIn, "--host", e.host, "--wait", "--timeout", "30s"); code != 0 {
		t.Fatalf("rm %s --wait: exit %d\n%s", plain, code, out)
	}
	if _, ok := e.readLocal(plain); ok {
		t.Errorf("%s still on disk", plain)
	}
	if _, ok := e.readLocal(dropIn); ok {
		t.Errorf("%s still on disk", dropIn)
	}
	if st := e.h.ActiveState(t, plain); st != "inactive" {
		t.Errorf("%s after rm: %s", plain, st)
	}
	if _, ok := e.status(plain); ok {
		t.Errorf("status of %s still in etcd", plain)
	}
}

// agentMetrics GETs /metrics from the agent, waiting up to 10s for an answer.
func agentMetrics(t *testing.T, addr string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				return string(b)
			}
			err = fmt.Errorf("status %s: %v", resp.Status, rerr)
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrape %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
