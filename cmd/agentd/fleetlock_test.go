package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// fleetLockCall is a FleetLock client's request as Zincati sends it (the
// protocol's pretty-printed body, the header, no Content-Type): the status
// and, for a failure, the error's kind and value.
func fleetLockCall(t *testing.T, addr, endpoint, id, group string) (status int, kind, value string) {
	t.Helper()
	body := fmt.Sprintf("{\n  \"client_params\": {\n    \"id\": %q,\n    \"group\": %q\n  }\n}", id, group)
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/"+endpoint, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("fleet-lock-protocol", "true")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("FleetLock %s: %v", endpoint, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct{ Kind, Value string }
	_ = json.Unmarshal(b, &e)
	t.Logf("FleetLock %s id=%s group=%s → %d %s", endpoint, id, group, resp.StatusCode, b)
	return resp.StatusCode, e.Kind, e.Value
}

// waitJoined waits until e's agent has joined the registry: a group put
// --wait before that finds no member to wait for.
func waitJoined(t *testing.T, e *env) {
	t.Helper()
	eventually(t, e.host+" joined the registry", func() bool {
		ms, err := e.reg.Members(t.Context())
		return err == nil && slices.ContainsFunc(ms, func(m reconcile.Member) bool { return m.Host == e.host })
	})
}

// A reboot and an agent's restart draw from one budget: while a FleetLock
// client holds its reboot slot, the agent's restart of a MaxUnavailable=1
// unit of the group waits (the old version keeps running, `agentd locks`
// says who it waits for, agentd_slots_waiting counts it) and proceeds once
// the client says steady-state; while the agent holds the unit's slot
// (verifying the new version), a pre-reboot is refused, naming it.
func TestFleetLockHoldsAgentRestart(t *testing.T) {
	t.Parallel() // waits on jobs and HealthySec, not the CPU
	e := newEnv(t)
	e.groups = []string{"web"}
	flAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	metricsAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) {
		o.fleetLockAddr, o.fleetLockTTL, o.metricsAddr = flAddr, time.Hour, metricsAddr
	})
	waitJoined(t, e)
	unit := func(n int, healthy string) string {
		return fmt.Sprintf("[Service]\nType=exec\nExecStart=/bin/sleep %d\n[X-Agentd]\nMaxUnavailable=1\nHealthySec=%s\n", 1000+n, healthy)
	}
	put := func(content string, wait bool) {
		t.Helper()
		args := []string{"unit", "put", e.writeUnit("app.service", content), "--group", "web"}
		if wait {
			args = append(args, "--wait", "--timeout", "30s")
		}
		if out, code := e.cli(args...); code != 0 {
			t.Fatalf("unit put: exit %d\n%s", code, out)
		}
	}
	waitStatus := func(what string, cond func(reconcile.Status) bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			if s, ok := e.status("app.service"); ok && cond(s) {
				return
			}
			if time.Now().After(deadline) {
				s, _ := e.status("app.service")
				t.Fatalf("%s: status %+v\n%s", what, s, e.h.Log())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	const id = "e0f3745b108f471cbd4883c6fbed8cdd"

	put(unit(1, "0"), true) // a first start disrupts nothing: no slot
	pid1 := e.h.MainPID(t, "app.service")

	if status, kind, _ := fleetLockCall(t, flAddr, "pre-reboot", id, "web"); status != http.StatusOK {
		t.Fatalf("pre-reboot: %d %s", status, kind)
	}
	put(unit(2, "0"), false)
	waitStatus("the agent waits for app.service's slot", func(s reconcile.Status) bool { return s.Action == reconcile.ActionWaitSlot })
	time.Sleep(500 * time.Millisecond) // and keeps waiting
	if pid := e.h.MainPID(t, "app.service"); pid != pid1 {
		t.Fatalf("app.service restarted (MainPID %d → %d) while a reboot held its only slot", pid1, pid)
	}
	out, code := e.cli("locks", "--group", "web", "--json")
	var rep locksReport
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("locks --json: exit %d\n%s", code, out)
	}
	var sawReboot, sawWait bool
	for _, s := range rep.Slots {
		switch {
		case s.Unit == "app.service" && s.Holder == "fleetlock:"+id:
			sawReboot = s.State == "held" && s.For == "reboot" && s.TTLSeconds > 3500
		case s.Unit == "app.service" && s.Holder == "h1":
			sawWait = s.State == "waiting" && strings.HasSuffix(s.Why, "taken by fleetlock:"+id)
		}
	}
	if !sawReboot || !sawWait {
		t.Errorf("locks --json does not show the reboot holding app.service and h1 waiting for it:\n%s", out)
	}
	if m := agentMetrics(t, metricsAddr); !strings.Contains(m, `agentd_slots_waiting{group="web"} 1`) {
		t.Errorf("metrics while h1 waits:\n%s", grepLines(m, "agentd_slots_"))
	}

	if status, kind, _ := fleetLockCall(t, flAddr, "steady-state", id, "web"); status != http.StatusOK {
		t.Fatalf("steady-state: %d %s", status, kind)
	}
	v2 := reconcile.Hash([]byte(unit(2, "0")))
	waitStatus("app.service restarted onto v2 after steady-state", func(s reconcile.Status) bool {
		return s.Hash == v2 && s.ActiveState == "active" && !s.Verifying && s.MainPID != pid1
	})

	// The other way round: the agent holds the slot while it verifies v3
	// (HealthySec=2), and a reboot is refused meanwhile.
	put(unit(3, "2"), false)
	waitStatus("app.service verifying v3", func(s reconcile.Status) bool { return s.Verifying && s.Hash == reconcile.Hash([]byte(unit(3, "2"))) })
	status, kind, value := fleetLockCall(t, flAddr, "pre-reboot", id, "web")
	if status != http.StatusConflict || kind != "failed_lock_semaphore_full" || !strings.Contains(value, "app.service has MaxUnavailable=1, taken by h1") {
		t.Fatalf("pre-reboot while h1 verifies: %d %s %s", status, kind, value)
	}
	waitStatus("v3 healthy", func(s reconcile.Status) bool { return !s.Verifying && s.Health == "healthy" })
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, kind, _ = fleetLockCall(t, flAddr, "pre-reboot", id, "web")
		if status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pre-reboot after h1 finished: %d %s", status, kind)
		}
		time.Sleep(100 * time.Millisecond) // the agent gives its slot back at the end of the pass
	}
	if status, kind, _ = fleetLockCall(t, flAddr, "steady-state", id, "web"); status != http.StatusOK {
		t.Fatalf("steady-state: %d %s", status, kind)
	}
	m := agentMetrics(t, metricsAddr)
	for _, want := range []string{
		`agentd_slots_held{group="web"} 0`, `agentd_slots_waiting{group="web"} 0`,
		`agentd_fleetlock_requests_total{endpoint="pre-reboot",result="failed_lock_semaphore_full"} 1`,
		`agentd_fleetlock_requests_total{endpoint="steady-state",result="ok"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(m, "agentd_slots_")+"\n"+grepLines(m, "agentd_fleetlock"))
		}
	}
}
