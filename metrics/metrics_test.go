package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentd/agentd/reconcile"
)

var _ reconcile.Observer = (*Metrics)(nil)

func TestClassify(t *testing.T) {
	for name, tc := range map[string]struct {
		st   reconcile.Status
		want string
	}{
		"running the registry's content":    {reconcile.Status{Hash: "a", DesiredHash: "a", ActiveState: "active"}, Converged},
		"stopped on purpose":                {reconcile.Status{Hash: "a", DesiredHash: "a", ActiveState: "inactive"}, Converged},
		"template instance (no file)":       {reconcile.Status{ActiveState: "active"}, Converged},
		"new content not written yet":       {reconcile.Status{Hash: "a", DesiredHash: "b", ActiveState: "active"}, Pending},
		"removal in progress":               {reconcile.Status{Hash: "a", ActiveState: "active"}, Pending},
		"verifying its health":              {reconcile.Status{Hash: "a", DesiredHash: "a", ActiveState: "active", Verifying: true}, Pending},
		"starting":                          {reconcile.Status{Hash: "a", DesiredHash: "a", ActiveState: "activating"}, Pending},
		"failed start":                      {reconcile.Status{Hash: "a", DesiredHash: "a", ActiveState: "failed", Error: "start failed"}, Failed},
		"blocked (unmanaged file) wins":     {reconcile.Status{Hash: "x", DesiredHash: "b", Error: "unmanaged file"}, Failed},
		"refused by systemd, old file kept": {reconcile.Status{Hash: "a", DesiredHash: "b", Error: "refused"}, Failed},
	} {
		t.Run(name, func(t *testing.T) {
			if got := Classify(tc.st); got != tc.want {
				t.Errorf("Classify = %s, want %s", got, tc.want)
			}
		})
	}
}

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestObserverMetrics(t *testing.T) {
	m := New("v1.2.3")
	m.Action("a.service", reconcile.KindRestart, "done")
	m.Action("b.service", reconcile.KindRestart, "done")
	m.Action("c.service", reconcile.KindStart, "failed")
	m.Pass(30*time.Millisecond, nil)
	m.Pass(2*time.Second, errors.New("daemon-reload: boom"))
	m.SnapshotReceived(40)
	m.SnapshotReceived(42)
	m.Reported(40, []reconcile.Status{
		{Unit: "a.service", Hash: "h", DesiredHash: "h", ActiveState: "active"},
		{Unit: "b.service", Hash: "h", DesiredHash: "h2", ActiveState: "active"},
		{Unit: "c.service", Hash: "h", DesiredHash: "h", ActiveState: "failed", Error: "start failed"},
	})
	m.Drift("a.service")
	m.Rollback("b.service")
	m.Rollback("d.service")
	m.ControlPlaneRollback("d.service")
	m.Heartbeat()
	m.SetEtcdConnected(false)
	m.SetSystemdConnected(true)

	out := scrape(t, m)
	for _, want := range []string{
		`agentd_build_info{version="v1.2.3"} 1`,
		`agentd_actions_total{kind="restart",result="done"} 2`,
		`agentd_actions_total{kind="start",result="failed"} 1`,
		`agentd_reconcile_duration_seconds_count 2`,
		`agentd_reconcile_duration_seconds_bucket{le="0.05"} 1`,
		`agentd_reconcile_passes_total{result="ok"} 1`,
		`agentd_reconcile_passes_total{result="error"} 1`,
		`agentd_units{state="converged"} 1`,
		`agentd_units{state="pending"} 1`,
		`agentd_units{state="failed"} 1`,
		`agentd_units_by_active_state{active_state="active"} 2`,
		`agentd_units_by_active_state{active_state="failed"} 1`,
		`agentd_registry_revision 40`,
		`agentd_registry_received_revision 42`,
		`agentd_registry_revision_lag 2`,
		`agentd_etcd_connected 0`,
		`agentd_systemd_connected 1`,
		`agentd_drift_events_total 1`,
		`agentd_rollbacks_total 2`,
		`agentd_control_plane_rollbacks_total 1`,
		`agentd_registry_snapshots_total 2`,
		"agentd_loop_heartbeat_timestamp_seconds 1.",
		"go_goroutines ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	// Caught up, and a state that disappeared reads 0 instead of going stale.
	m.Reported(42, []reconcile.Status{{Unit: "a.service", Hash: "h", DesiredHash: "h", ActiveState: "active"}})
	out = scrape(t, m)
	for _, want := range []string{
		`agentd_registry_revision_lag 0`,
		`agentd_units_by_active_state{active_state="failed"} 0`,
		`agentd_units{state="failed"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// The reload, slot, halt and FleetLock metrics: the agent's groups exist
// at 0 before anything happens in them, and a group's halts go back to 0.
func TestFleetMetrics(t *testing.T) {
	m := New("dev")
	m.SetGroups([]string{"web", "all"})
	m.FleetLockServing()
	out := scrape(t, m)
	for _, want := range []string{
		`agentd_slots_held{group="all"} 0`, `agentd_slots_waiting{group="web"} 0`, `agentd_rollout_halts{group="web"} 0`,
		`agentd_daemon_reloads_total{result="error"} 0`, `agentd_fleetlock_requests_total{endpoint="pre-reboot",result="ok"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	m.DaemonReload(30*time.Millisecond, nil)
	m.DaemonReload(2*time.Second, errors.New("daemon-reload: boom"))
	m.SlotWaiting("web", 1)
	m.SlotWaiting("web", -1)
	m.SlotHeld("web", 1)
	m.Halts([]reconcile.Halt{{Scope: "groups/web", Unit: "a.service"}, {Scope: "groups/web", Unit: "b.service"}})
	m.FleetLockRequest("pre-reboot", "failed_lock_semaphore_full")
	out = scrape(t, m)
	for _, want := range []string{
		`agentd_daemon_reload_duration_seconds_count 2`, `agentd_daemon_reload_duration_seconds_bucket{le="0.05"} 1`,
		`agentd_daemon_reloads_total{result="ok"} 1`, `agentd_daemon_reloads_total{result="error"} 1`,
		`agentd_slots_waiting{group="web"} 0`, `agentd_slots_held{group="web"} 1`, `agentd_rollout_halts{group="web"} 2`,
		`agentd_fleetlock_requests_total{endpoint="pre-reboot",result="failed_lock_semaphore_full"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	m.Halts(nil)
	if out := scrape(t, m); !strings.Contains(out, `agentd_rollout_halts{group="web"} 0`) {
		t.Errorf("a group's halts, cleared, do not read 0:\n%s", grepMetric(out, "agentd_rollout_halts"))
	}
}

func grepMetric(out, name string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, name) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// The agent's metrics live on their own registry: etcd's server registers
// its metrics on the default one, and nothing of ours may collide there.
func TestOwnRegistry(t *testing.T) {
	m := New("dev")
	m.Action("a.service", reconcile.KindStart, "done")
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "agentd_") {
			t.Errorf("%s registered on the default registry", mf.GetName())
		}
	}
	// Two agents in one process (tests) must not collide either.
	New("dev")
}

func TestServe(t *testing.T) {
	m := New("dev")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Serve(ctx, ln) }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "agentd_build_info") {
		t.Fatalf("GET /metrics: %d\n%s", resp.StatusCode, b)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

// Health probes: failures counted by unit and kind, the last result as a
// gauge; a unit without probes any more leaves no series behind.
func TestProbeMetrics(t *testing.T) {
	m := New("dev")
	m.Probe("web.service", "url", false)
	m.Probe("web.service", "url", false)
	m.Probe("web.service", "cmd", true)
	m.Probe("db.service", "tcp", true)
	out := scrape(t, m)
	for _, want := range []string{
		`agentd_health_probe_failures_total{kind="url",unit="web.service"} 2`,
		`agentd_health_probe_up{kind="url",unit="web.service"} 0`,
		`agentd_health_probe_up{kind="cmd",unit="web.service"} 1`,
		`agentd_health_probe_up{kind="tcp",unit="db.service"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	m.ProbesGone("web.service")
	out = scrape(t, m)
	if strings.Contains(out, `unit="web.service"`) || !strings.Contains(out, `unit="db.service"`) {
		t.Errorf("after ProbesGone(web.service):\n%s", out)
	}
}
