package reconcile

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Verdict is what the agent concludes about a unit after a job on it.
type Verdict int

const (
	// VerdictPending: not known yet — inside HealthySec, or still on its way up.
	VerdictPending Verdict = iota
	// VerdictHealthy: the new version runs as systemd means it to.
	VerdictHealthy
	// VerdictUnhealthy: systemd says the new version did not take.
	VerdictUnhealthy
	// VerdictUnknown: nothing can be concluded about the content (the job
	// was canceled, or its outcome is unknown and the unit is not running
	// either way). The unit is observed again; never rolled back on this.
	VerdictUnknown
)

var verdictNames = [...]string{"pending", "healthy", "unhealthy", "unknown"}

func (v Verdict) String() string { return verdictNames[v] }

// JobOutcome is how a job the agent ran ended, as far as it knows.
type JobOutcome int

const (
	JobDone     JobOutcome = iota // systemd finished the job with "done"
	JobFailed                     // systemd finished it with failed, dependency, timeout, ...
	JobUnknown                    // the agent's wait ran out, or the bus went away
	JobCanceled                   // replaced by a newer job (the agent's or an operator's)
)

// OutcomeOf maps a job error to its outcome.
func OutcomeOf(err error) JobOutcome {
	var jr interface{ JobResult() string }
	switch {
	case err == nil:
		return JobDone
	case errors.Is(err, ErrOutcomeUnknown):
		return JobUnknown
	case errors.As(err, &jr) && jr.JobResult() == "canceled":
		return JobCanceled
	}
	return JobFailed
}

// HealthInput is everything Health judges from.
type HealthInput struct {
	Unit    string        // its type comes from the suffix
	Healthy time.Duration // HealthySec=
	Op      string        // the action that ran the job, for messages (start, restart, reload)
	Job     JobOutcome
	JobErr  string    // the job's error text when it did not finish "done"
	Base    UnitState // read right after the job ended: the baseline
	Now     UnitState
	Elapsed time.Duration // since the job ended
	// Probes are the unit's health probes (none: systemd's view alone);
	// Probe is where they stand, counting only rounds run since the job
	// ended while systemd said active.
	Probes Probes
	Probe  ProbeState
}

// Health judges a unit after a job, from systemd's own properties only.
// Pure. The rules, by unit kind:
//   - A failed job is unhealthy. A canceled job says nothing about the
//     content: unknown.
//   - Type=oneshot: its start job ends "done" only once ExecStart exited 0,
//     so it is healthy at once (with or without RemainAfterExit) unless
//     systemd now says failed.
//   - Timers, paths, sockets, targets, slices, mounts: healthy once active
//     for HealthySec, whatever the units they trigger are doing.
//   - Other services: unhealthy when NRestarts grew (Restart= brought it
//     back), when it sits in auto-restart, when it left active after the
//     job (ActiveExitTimestamp moved: true even if a pass missed the blink), or when
//     it is failed or inactive; healthy when active for HealthySec.
//   - An unknown job outcome is judged by the unit's state alone: still
//     starting is pending with no deadline of the agent's own.
//   - Health probes (a unit other than a oneshot, with HealthCmd=,
//     HealthURL= or HealthTCP=) count only once systemd's view is
//     judged: only while it says active (Type=notify: after READY=1),
//     and only if it found nothing wrong. HealthRetries failures in a row
//     are unhealthy, inside HealthySec or after it; healthy needs both
//     HealthySec active and the last probe passed, so the verdict waits
//     past HealthySec for a passing probe (each probe ends within
//     HealthTimeoutSec, so it waits at most HealthRetries rounds).
func Health(in HealthInput) (Verdict, string) {
	now, base := in.Now, in.Base
	typ := in.Unit[strings.LastIndexByte(in.Unit, '.')+1:]
	within := fmt.Sprintf("within HealthySec=%v after %s", in.Healthy, orUnknown(in.Op))
	switch in.Job {
	case JobFailed:
		return VerdictUnhealthy, orUnknown(in.JobErr)
	case JobCanceled:
		return VerdictUnknown, "the " + orUnknown(in.Op) + " job of " + in.Unit + " was canceled (replaced by another job); observing the unit again"
	case JobUnknown:
		switch {
		case now.ActiveState == "failed":
			return VerdictUnhealthy, fmt.Sprintf("%s failed after %s (%s)", in.Unit, orUnknown(in.Op), ExitDetail(now))
		case typ == "service" && (now.NRestarts > base.NRestarts || now.SubState == "auto-restart"):
			// Crash-looping: judged below like any service.
		case now.ActiveState == "activating", now.ActiveState == "reloading":
			return VerdictPending, in.Unit + " is still " + now.ActiveState + "; waiting for systemd"
		case now.ActiveState != "active":
			return VerdictUnknown, fmt.Sprintf("the outcome of %s is unknown (%s) and the unit is %s", orUnknown(in.Op), orUnknown(in.JobErr), StateText(now))
		}
		// Active: judge it like a finished job from here on.
	}
	if typ == "service" && now.Type == "oneshot" {
		if now.ActiveState == "failed" {
			return VerdictUnhealthy, fmt.Sprintf("%s failed (%s)", in.Unit, ExitDetail(now))
		}
		return VerdictHealthy, "oneshot ran to completion"
	}
	if typ == "service" {
		switch {
		case now.NRestarts > base.NRestarts:
			return VerdictUnhealthy, fmt.Sprintf("%s restarted itself %d time(s) %s (%s)", in.Unit, now.NRestarts-base.NRestarts, within, ExitDetail(now))
		case now.ActiveState == "activating" && now.SubState == "auto-restart":
			return VerdictUnhealthy, fmt.Sprintf("%s is crash-looping (activating, auto-restart) %s (%s)", in.Unit, within, ExitDetail(now))
		case now.ActiveExitMono > base.ActiveExitMono:
			return VerdictUnhealthy, fmt.Sprintf("%s left active %s and is now %s (%s)", in.Unit, within, StateText(now), ExitDetail(now))
		}
	}
	switch now.ActiveState {
	case "failed", "inactive", "deactivating":
		return VerdictUnhealthy, fmt.Sprintf("%s became %s %s (%s)", in.Unit, StateText(now), within, ExitDetail(now))
	case "activating", "reloading":
		return VerdictPending, in.Unit + " is " + now.ActiveState
	case "active":
		if in.Probes.Any() && !(typ == "service" && now.Type == "oneshot") {
			return probeVerdict(in)
		}
		if in.Elapsed >= in.Healthy {
			return VerdictHealthy, fmt.Sprintf("active for HealthySec=%v", in.Healthy)
		}
		return VerdictPending, fmt.Sprintf("%s is active; verifying until HealthySec=%v is over", in.Unit, in.Healthy)
	}
	return VerdictUnknown, in.Unit + " is in an unknown state (" + StateText(now) + ")"
}

// probeVerdict judges an active unit with health probes (Health).
func probeVerdict(in HealthInput) (Verdict, string) {
	n, pr := in.Probes.FailAfter(), in.Probe
	switch {
	case pr.Failing(n):
		return VerdictUnhealthy, fmt.Sprintf("health probe failed after %s: %s", orUnknown(in.Op), pr.Text(n))
	case in.Elapsed < in.Healthy:
		return VerdictPending, fmt.Sprintf("%s is active; verifying until HealthySec=%v is over and a probe passed", in.Unit, in.Healthy)
	case pr.Passing():
		return VerdictHealthy, fmt.Sprintf("active for HealthySec=%v and the health probe passed (%s)", in.Healthy, pr.Last)
	case pr.Rounds == 0:
		return VerdictPending, fmt.Sprintf("%s is active for HealthySec=%v; waiting for the first health probe", in.Unit, in.Healthy)
	}
	return VerdictPending, fmt.Sprintf("%s is active for HealthySec=%v; waiting for a passing health probe (%s)", in.Unit, in.Healthy, pr.Text(n))
}

// StateText renders "active (running)"; never empty.
func StateText(st UnitState) string {
	s := orUnknown(st.ActiveState)
	if st.SubState != "" && st.SubState != st.ActiveState {
		s += " (" + st.SubState + ")"
	}
	return s
}

// ExitDetail renders the unit's Result and exit status.
func ExitDetail(st UnitState) string {
	d := "result: " + orUnknown(st.Result)
	if st.ExitStatus != 0 {
		d += fmt.Sprintf(", exit status %d", st.ExitStatus)
	}
	return d
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
