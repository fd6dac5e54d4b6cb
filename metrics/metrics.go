// Package metrics exposes what the agent does as Prometheus metrics.
//
// Metrics implements reconcile.Observer (the loop calls it after every
// action and pass) and has setters for what only the wiring knows (etcd and
// D-Bus connection state, snapshots received from the registry watch). It
// registers on a registry of its own, never on prometheus' default one:
// importing etcd's server registers etcd's metrics there.
//
// Every method is safe for concurrent use and never blocks.
package metrics

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agentd/agentd/internal/httpserve"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/rollout"
)

// Convergence of one unit, from its status.
const (
	Converged = "converged" // the local files are the registry's and nothing is in progress
	Pending   = "pending"   // content or state still changing (new content, removal, activating)
	Failed    = "failed"    // the status carries an error (failed job, refused or blocked unit, unit failed)
)

// Classify says whether a unit's status is converged, pending or failed:
// reconcile.StandingOf, the one rule `agentd hosts` and --wait use too.
func Classify(st reconcile.Status) string { return reconcile.StandingOf(st).String() }

// Count tallies statuses by Classify.
func Count(st []reconcile.Status) (converged, pending, failed int) {
	for _, s := range st {
		switch Classify(s) {
		case Converged:
			converged++
		case Pending:
			pending++
		default:
			failed++
		}
	}
	return converged, pending, failed
}

// Metrics is the agent's metric set. Create it with New.
type Metrics struct {
	reconcile.NopObserver // forward compatibility: new Observer methods are no-ops until handled here

	reg *prometheus.Registry

	actions       *prometheus.CounterVec
	passDuration  prometheus.Histogram
	passes        *prometheus.CounterVec
	units         *prometheus.GaugeVec
	activeStates  *prometheus.GaugeVec
	revision      prometheus.Gauge
	received      prometheus.Gauge
	revisionLag   prometheus.Gauge
	etcdUp        prometheus.Gauge
	systemdUp     prometheus.Gauge
	drift         prometheus.Counter
	rollbacks     prometheus.Counter
	cpRollbacks   prometheus.Counter
	heartbeat     prometheus.Gauge
	lastGoodPass  prometheus.Gauge
	snapshotsRecv prometheus.Counter
	probeFailures *prometheus.CounterVec
	probeUp       *prometheus.GaugeVec
	reloadTime    prometheus.Histogram
	reloads       *prometheus.CounterVec
	slotsHeld     *prometheus.GaugeVec
	slotsWaiting  *prometheus.GaugeVec
	halts         *prometheus.GaugeVec
	rollouts      *prometheus.GaugeVec
	rolloutSteps  *prometheus.CounterVec
	fleetLock     *prometheus.CounterVec

	mu               sync.Mutex
	applied, newest  int64
	seenActiveStates map[string]bool
	seenHaltGroups   map[string]bool
}

// New creates the metric set on a fresh registry, with the Go runtime and
// process collectors, and agentd_build_info{version}.
func New(version string) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentd_actions_total",
			Help: "Actions executed on units, by kind (start, restart, stop, update, remove, blocked, ...) and result (done, failed, timeout, refused, blocked, ...).",
		}, []string{"kind", "result"}),
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "agentd_reconcile_duration_seconds",
			Help:    "Duration of reconcile passes (observe, plan, apply, report).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentd_reconcile_passes_total",
			Help: "Reconcile passes, by result (ok, error). A pass that failed is retried with backoff.",
		}, []string{"result"}),
		units: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentd_units",
			Help: "Units the agent manages or is asked to run, by convergence state (converged, pending, failed), as of the last pass.",
		}, []string{"state"}),
		activeStates: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentd_units_by_active_state",
			Help: "Units the agent manages, by systemd ActiveState (active, inactive, failed, activating, ...), as of the last pass.",
		}, []string{"active_state"}),
		revision: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentd_registry_revision",
			Help: "etcd revision of the registry snapshot the last pass applied.",
		}),
		received: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentd_registry_received_revision",
			Help: "etcd revision of the newest registry snapshot the watch delivered.",
		}),
		revisionLag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentd_registry_revision_lag",
			Help: "agentd_registry_received_revision - agentd_registry_revision: how far the loop is behind the registry watch, in etcd revisions (0 when caught up).",
		}),
		etcdUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentd_etcd_connected",
			Help: "1 when the last exchange with the registry (join, snapshot, status report) succeeded, else 0.",
		}),
		systemdUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentd_systemd_connected",
			Help: "1 when the last D-Bus call to systemd (unit state read) succeeded, else 0.",
		}),
		drift: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentd_drift_events_total",
			Help: "Managed files found changed behind the agent's back.",
		}),
		rollbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentd_rollbacks_total",
			Help: "Changes rolled back on this host.",
		}),
		cpRollbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentd_control_plane_rollbacks_total",
			Help: "Changes rolled back on this host because the agent could not reach the registry (renew its lease, read and write) within the unit's ConfirmSec= (also counted in agentd_rollbacks_total).",
		}),
		heartbeat: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentd_loop_heartbeat_timestamp_seconds",
			Help: "Unix time of the reconcile loop's last heartbeat; a stale value means a wedged loop.",
		}),
		lastGoodPass: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "agentd_last_successful_pass_timestamp_seconds",
			Help: "Unix time of the last reconcile pass that succeeded.",
		}),
		snapshotsRecv: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentd_registry_snapshots_total",
			Help: "Registry snapshots delivered by the watch (each change batch, each resync).",
		}),
		probeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentd_health_probe_failures_total",
			Help: "Failed health probe checks ([X-Agentd] HealthCmd=, HealthURL=, HealthTCP=), by unit and kind (cmd, url, tcp).",
		}, []string{"unit", "kind"}),
		probeUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentd_health_probe_up",
			Help: "1 when the unit's last health probe check of this kind (cmd, url, tcp) passed, 0 when it failed; gone when the unit has no probes.",
		}, []string{"unit", "kind"}),
		reloadTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "agentd_daemon_reload_duration_seconds",
			Help:    "Duration of the daemon-reloads the agent ran (one per batch of file changes), failed ones included.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentd_daemon_reloads_total",
			Help: "daemon-reloads the agent ran, by result (ok, error). A failed one fails its pass, and the next pass runs it again first.",
		}, []string{"result"}),
		slotsHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentd_slots_held",
			Help: "MaxUnavailable= slots this agent holds, by group (a slot per unit, or per template, being restarted or verified).",
		}, []string{"group"}),
		slotsWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentd_slots_waiting",
			Help: "MaxUnavailable= slots this agent waits for, by group (`agentd locks` says who holds them).",
		}, []string{"group"}),
		halts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentd_rollout_halts",
			Help: "Halted rollouts of this agent's groups (a host failed a version; the group holds it until new content is put), by group, as of the last registry snapshot.",
		}, []string{"group"}),
		rollouts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentd_rollouts_in_flight",
			Help: "Rollouts of this agent's groups that have not ended (running, paused, or waiting for promote or a gate), by group, as of the last registry snapshot.",
		}, []string{"group"}),
		rolloutSteps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentd_rollout_steps_total",
			Help: "This host's steps in rollouts, by the state it recorded (applying, soaking, healthy, failed, reverting, reverted).",
		}, []string{"state"}),
		fleetLock: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentd_fleetlock_requests_total",
			Help: "Requests to the FleetLock server (--fleetlock-listen), by endpoint (pre-reboot, steady-state, other) and result (ok, or the protocol error kind, e.g. failed_lock_semaphore_full).",
		}, []string{"endpoint", "result"}),
		seenActiveStates: map[string]bool{},
	}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "agentd_build_info",
		Help: "Always 1; the agent's version in a label.",
	}, []string{"version"})
	build.WithLabelValues(version).Set(1)
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		build, m.actions, m.passDuration, m.passes, m.units, m.activeStates,
		m.revision, m.received, m.revisionLag, m.etcdUp, m.systemdUp,
		m.drift, m.rollbacks, m.cpRollbacks, m.heartbeat, m.lastGoodPass, m.snapshotsRecv,
		m.probeFailures, m.probeUp,
		m.reloadTime, m.reloads, m.slotsHeld, m.slotsWaiting, m.halts, m.fleetLock, m.rollouts, m.rolloutSteps,
	)
	for _, s := range []string{Converged, Pending, Failed} {
		m.units.WithLabelValues(s)
	}
	for _, r := range []string{"ok", "error"} {
		m.passes.WithLabelValues(r)
		m.reloads.WithLabelValues(r)
	}
	return m
}

// SetGroups makes the per-group series of the agent's groups exist (at 0),
// so that a query or an alert on them sees the group before anything
// happens in it.
func (m *Metrics) SetGroups(groups []string) {
	for _, g := range groups {
		m.slotsHeld.WithLabelValues(g)
		m.slotsWaiting.WithLabelValues(g)
		m.halts.WithLabelValues(g)
		m.rollouts.WithLabelValues(g)
	}
	for _, st := range []rollout.HostState{rollout.HostApplying, rollout.HostSoaking, rollout.HostHealthy, rollout.HostFailed, rollout.HostReverting, rollout.HostReverted} {
		m.rolloutSteps.WithLabelValues(string(st))
	}
}

// RolloutsInFlight sets agentd_rollouts_in_flight: each group's count.
func (m *Metrics) RolloutsInFlight(byGroup map[string]int) {
	for g, n := range byGroup {
		m.rollouts.WithLabelValues(g).Set(float64(n))
	}
}

// RolloutStep counts a step this host recorded in a rollout.
func (m *Metrics) RolloutStep(state rollout.HostState) {
	m.rolloutSteps.WithLabelValues(string(state)).Inc()
}

// DaemonReload records a daemon-reload's duration and result.
func (m *Metrics) DaemonReload(d time.Duration, err error) {
	m.reloadTime.Observe(d.Seconds())
	if err != nil {
		m.reloads.WithLabelValues("error").Inc()
		return
	}
	m.reloads.WithLabelValues("ok").Inc()
}

// SlotWaiting adds delta to the slots this agent waits for in group.
func (m *Metrics) SlotWaiting(group string, delta int) {
	m.slotsWaiting.WithLabelValues(group).Add(float64(delta))
}

// SlotHeld adds delta to the slots this agent holds in group.
func (m *Metrics) SlotHeld(group string, delta int) {
	m.slotsHeld.WithLabelValues(group).Add(float64(delta))
}

// Halts sets agentd_rollout_halts from a snapshot's halts: each group's
// count; a group seen before and without halts now reads 0.
func (m *Metrics) Halts(halts []reconcile.Halt) {
	n := map[string]int{}
	for _, h := range halts {
		n[strings.TrimPrefix(h.Scope, "groups/")]++
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seenHaltGroups == nil {
		m.seenHaltGroups = map[string]bool{}
	}
	for g := range n {
		m.seenHaltGroups[g] = true
	}
	for g := range m.seenHaltGroups {
		m.halts.WithLabelValues(g).Set(float64(n[g]))
	}
}

// FleetLockServing makes the FleetLock server's ok series exist (at 0).
func (m *Metrics) FleetLockServing() {
	m.fleetLock.WithLabelValues("pre-reboot", "ok")
	m.fleetLock.WithLabelValues("steady-state", "ok")
}

// FleetLockRequest counts a request to the FleetLock server.
func (m *Metrics) FleetLockRequest(endpoint, result string) {
	m.fleetLock.WithLabelValues(endpoint, result).Inc()
}

// Registry is the registry every metric of the agent is on.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Serve serves /metrics on ln until ctx is done, then shuts the server
// down. It returns nil after ctx is done.
func (m *Metrics) Serve(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return httpserve.Serve(ctx, srv, ln)
}

// Action counts an executed action.
func (m *Metrics) Action(_ string, kind reconcile.Kind, result string) {
	m.actions.WithLabelValues(kind.String(), result).Inc()
}

// Pass records a pass's duration and result.
func (m *Metrics) Pass(d time.Duration, err error) {
	m.passDuration.Observe(d.Seconds())
	if err != nil {
		m.passes.WithLabelValues("error").Inc()
		return
	}
	m.passes.WithLabelValues("ok").Inc()
	m.lastGoodPass.SetToCurrentTime()
}

// Reported sets the unit gauges and the applied revision from a pass.
func (m *Metrics) Reported(revision int64, st []reconcile.Status) {
	c, p, f := Count(st)
	m.units.WithLabelValues(Converged).Set(float64(c))
	m.units.WithLabelValues(Pending).Set(float64(p))
	m.units.WithLabelValues(Failed).Set(float64(f))
	byState := map[string]int{}
	for _, s := range st {
		if s.ActiveState != "" {
			byState[s.ActiveState]++
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for s := range byState {
		m.seenActiveStates[s] = true
	}
	for s := range m.seenActiveStates { // states seen before and gone now read 0, not stale
		m.activeStates.WithLabelValues(s).Set(float64(byState[s]))
	}
	m.applied = revision
	m.revision.Set(float64(revision))
	m.revisionLag.Set(float64(max(m.newest-m.applied, 0)))
}

// Heartbeat records that the loop is alive.
func (m *Metrics) Heartbeat() { m.heartbeat.SetToCurrentTime() }

// Drift counts a managed file changed behind the agent's back.
func (m *Metrics) Drift(string) { m.drift.Inc() }

// Rollback counts a rolled-back change.
func (m *Metrics) Rollback(string) { m.rollbacks.Inc() }

// ControlPlaneRollback counts a change rolled back for want of a
// confirmation by the control plane (ConfirmSec=).
func (m *Metrics) ControlPlaneRollback(string) { m.cpRollbacks.Inc() }

// Probe records a health probe check's result.
func (m *Metrics) Probe(unit, kind string, ok bool) {
	if !ok {
		m.probeFailures.WithLabelValues(unit, kind).Inc()
	}
	m.probeUp.WithLabelValues(unit, kind).Set(b2f(ok))
}

// ProbesGone drops the probe series of a unit that has no probes any more.
func (m *Metrics) ProbesGone(unit string) {
	m.probeFailures.DeletePartialMatch(prometheus.Labels{"unit": unit})
	m.probeUp.DeletePartialMatch(prometheus.Labels{"unit": unit})
}

// SnapshotReceived records a snapshot delivered by the registry watch.
func (m *Metrics) SnapshotReceived(revision int64) {
	m.snapshotsRecv.Inc()
	m.etcdUp.Set(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.newest = max(m.newest, revision)
	m.received.Set(float64(m.newest))
	m.revisionLag.Set(float64(max(m.newest-m.applied, 0)))
}

// SetEtcdConnected sets agentd_etcd_connected.
func (m *Metrics) SetEtcdConnected(up bool) { m.etcdUp.Set(b2f(up)) }

// SetSystemdConnected sets agentd_systemd_connected.
func (m *Metrics) SetSystemdConnected(up bool) { m.systemdUp.Set(b2f(up)) }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
