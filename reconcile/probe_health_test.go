package reconcile_test

import (
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// Health with probes: systemd's view first, then the probes; healthy only
// with HealthySec over AND the last probe passed; HealthRetries failures
// in a row unhealthy, inside HealthySec or after it.
func TestHealthWithProbes(t *testing.T) {
	url := reconcile.Probes{URL: "http://127.0.0.1:8080/"}
	fail := func(n int) reconcile.ProbeState {
		return reconcile.ProbeState{Rounds: n, Failures: n, Last: "HealthURL http://127.0.0.1:8080/: 500 (want 2xx)"}
	}
	pass := reconcile.ProbeState{Rounds: 2, Last: "HealthURL http://127.0.0.1:8080/: 200"}
	probed := func(in reconcile.HealthInput, p reconcile.Probes, s reconcile.ProbeState) reconcile.HealthInput {
		in.Probes, in.Probe = p, s
		return in
	}
	tests := []struct {
		name   string
		in     reconcile.HealthInput
		want   reconcile.Verdict
		reason string
	}{
		{name: "no probe yet, inside HealthySec", in: probed(up("exec", inside), url, reconcile.ProbeState{}), want: reconcile.VerdictPending},
		{name: "no probe yet, HealthySec over: waits for one", in: probed(up("exec", after), url, reconcile.ProbeState{}), want: reconcile.VerdictPending,
			reason: "waiting for the first health probe"},
		{name: "passing inside HealthySec: still pending", in: probed(up("exec", inside), url, pass), want: reconcile.VerdictPending},
		{name: "passing and HealthySec over", in: probed(up("exec", after), url, pass), want: reconcile.VerdictHealthy,
			reason: "active for HealthySec=30s and the health probe passed (HealthURL http://127.0.0.1:8080/: 200)"},
		{name: "failing below HealthRetries after HealthySec: waits", in: probed(up("exec", after), url, fail(2)), want: reconcile.VerdictPending,
			reason: "waiting for a passing health probe (HealthURL http://127.0.0.1:8080/: 500 (want 2xx), 2 failures in a row (HealthRetries=3))"},
		{name: "HealthRetries failures inside HealthySec", in: probed(up("exec", inside), url, fail(3)), want: reconcile.VerdictUnhealthy,
			reason: "health probe failed after restart: HealthURL http://127.0.0.1:8080/: 500 (want 2xx), 3 failures in a row (HealthRetries=3)"},
		{name: "HealthRetries failures after HealthySec", in: probed(up("exec", after), url, fail(3)), want: reconcile.VerdictUnhealthy},
		{name: "HealthRetries=1", in: probed(up("exec", inside), reconcile.Probes{TCP: "a:1", Retries: 1}, fail(1)), want: reconcile.VerdictUnhealthy},
		{name: "HealthySec=0 still waits for a probe", in: func() reconcile.HealthInput {
			in := probed(up("exec", 0), url, reconcile.ProbeState{})
			in.Healthy = 0
			return in
		}(), want: reconcile.VerdictPending},
		// systemd's view comes first.
		{name: "Type=notify still activating: probes do not count", in: func() reconcile.HealthInput {
			in := probed(up("notify", after), url, pass)
			in.Now = st("activating", "start", "", typ("notify"))
			return in
		}(), want: reconcile.VerdictPending},
		{name: "crashed: systemd's verdict, whatever the probe", in: func() reconcile.HealthInput {
			in := probed(up("exec", inside), url, pass)
			in.Now = st("failed", "failed", "exit-code", typ("exec"), stamps(tEnter, tBlinkExit), status(1))
			return in
		}(), want: reconcile.VerdictUnhealthy, reason: "is now failed"},
		{name: "restarted itself: systemd's verdict", in: func() reconcile.HealthInput {
			in := probed(up("exec", after), url, pass)
			in.Now = st("active", "running", "success", typ("exec"), restarts(1), stamps(tEnter, tPrevExit))
			return in
		}(), want: reconcile.VerdictUnhealthy, reason: "restarted itself"},
		{name: "oneshot: judged by its exit, not the probes", in: probed(reconcile.HealthInput{Unit: "m.service", Healthy: 30 * time.Second, Op: "start", Job: reconcile.JobDone,
			Base: st("active", "exited", "success", typ("oneshot"), rae), Now: st("active", "exited", "success", typ("oneshot"), rae)}, url, fail(3)),
			want: reconcile.VerdictHealthy},
		{name: "socket with a probe", in: probed(other("web.socket", "active", "listening", after), reconcile.Probes{TCP: "127.0.0.1:80"},
			reconcile.ProbeState{Rounds: 1, Last: "HealthTCP 127.0.0.1:80: connected"}), want: reconcile.VerdictHealthy},
		{name: "unknown job outcome, active, probes failing", in: func() reconcile.HealthInput {
			in := probed(up("exec", inside), url, fail(3))
			in.Job, in.JobErr = reconcile.JobUnknown, errTimedOut
			return in
		}(), want: reconcile.VerdictUnhealthy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, reason := reconcile.Health(tt.in)
			if got != tt.want || !strings.Contains(reason, tt.reason) {
				t.Errorf("Health = %v %q, want %v with %q", got, reason, tt.want, tt.reason)
			}
		})
	}
}
