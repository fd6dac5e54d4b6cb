package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentd/agentd/reconcile"
)

func TestProgressViews(t *testing.T) {
	want := []reconcile.Expectation{{Key: "a.service", Unit: "a.service"}}
	rows := func(state reconcile.Progress) map[string]row {
		return map[string]row{"h1\x00a.service": {host: "h1", key: "a.service", state: state, detail: "x"}}
	}
	var plain bytes.Buffer
	v := newProgressView(&plain, false, []string{"h1"}, want)
	v.update(rows(reconcile.ProgressPending))
	v.update(rows(reconcile.ProgressPending)) // unchanged: no new line
	v.update(rows(reconcile.ProgressHealthy))
	if got := plain.String(); got != "h1 a.service: pending — x\nh1 a.service: healthy — x\n" {
		t.Fatalf("plain: %q", got)
	}
	var js bytes.Buffer
	v = newProgressView(&js, true, []string{"h1"}, want)
	v.update(rows(reconcile.ProgressHeld))
	var ev map[string]any
	if err := json.Unmarshal(js.Bytes(), &ev); err != nil || ev["state"] != "held" || ev["host"] != "h1" {
		t.Fatalf("json: %s", js.String())
	}
	var tty bytes.Buffer
	v = newProgressView(&tty, false, []string{"h1"}, want)
	v.tty = true
	v.update(rows(reconcile.ProgressPending))
	v.update(rows(reconcile.ProgressHealthy))
	out := tty.String()
	if !strings.Contains(out, "\x1b[3A") || !strings.Contains(out, "1/1 done") || !strings.Contains(out, "HOST") {
		t.Fatalf("tty redraw: %q", out)
	}
}

// Every flag can come from AGENTD_<FLAG>; a flag on the command line wins.
func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("AGENTD_ETCD_ENDPOINTS", "http://127.0.0.1:1")
	t.Setenv("AGENTD_ETCD_DIAL_TIMEOUT", "200ms")
	var out bytes.Buffer
	root := newRoot()
	root.SetArgs([]string{"unit", "ls"})
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("AGENTD_ETCD_ENDPOINTS not used: %v", err)
	}
	root = newRoot()
	root.SetArgs([]string{"unit", "ls", "--etcd-endpoints", "http://127.0.0.1:2"})
	root.SetOut(&out)
	root.SetErr(&out)
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "127.0.0.1:2") {
		t.Fatalf("the flag did not win over the environment: %v", err)
	}
}
