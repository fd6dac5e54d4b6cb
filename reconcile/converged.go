package reconcile

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// This file is the one judgement of "converged": whether a host runs what
// the registry asks of it, read from what the host published (its statuses
// and its pass record). `--wait`, `agentd hosts`, `agentd status` and the
// metrics all use it, so none of them can call a host done while another
// says it is not.

// Standing is where one unit's status stands on its own.
type Standing int

const (
	Converged Standing = iota
	Pending
	Failed
)

func (s Standing) String() string {
	switch s {
	case Pending:
		return "pending"
	case Failed:
		return "failed"
	}
	return "converged"
}

// StandingOf says whether a unit's status is converged, pending or
// failed: failed with an error; pending while the file on disk is not the
// registry's, a job runs, the unit is between states, inside HealthySec,
// or waiting for a slot; converged otherwise.
func StandingOf(st Status) Standing {
	switch {
	case st.Error != "":
		return Failed
	case st.DesiredHash != st.Hash, // new content not written yet, or a removal in progress
		st.Verifying,  // (re)started, inside its HealthySec window
		st.Confirming, // applied, awaiting its confirmation (ConfirmSec=)
		st.Job != "",
		st.Action == ActionWaitSlot,
		st.ActiveState == "activating" || st.ActiveState == "deactivating" || st.ActiveState == "reloading":
		return Pending
	}
	return Converged
}

// Progress is where one host is with one key a client wrote.
type Progress int

const (
	ProgressPending    Progress = iota // the host has not acted on the write yet
	ProgressNoAgent                    // no live agent on the host
	ProgressSlot                       // waiting for a MaxUnavailable= slot
	ProgressApplying                   // new file not yet in place, or the unit on its way up
	ProgressVerifying                  // running the new content, inside HealthySec
	ProgressHealthy                    // done
	ProgressRemoved                    // done (a removal)
	ProgressFailed                     // the host failed the change
	ProgressRolledBack                 // the host put the previous version back
	ProgressHeld                       // the rollout was halted by another host's failure
	ProgressSuperseded                 // the key was written again since: this write will never run
)

var progressWords = [...]string{
	ProgressPending:    "pending",
	ProgressNoAgent:    "no live agent",
	ProgressSlot:       "waiting for a slot",
	ProgressApplying:   "applying",
	ProgressVerifying:  "verifying",
	ProgressHealthy:    "healthy",
	ProgressRemoved:    "removed",
	ProgressFailed:     "failed",
	ProgressRolledBack: "rolled back",
	ProgressHeld:       "held",
	ProgressSuperseded: "superseded",
}

func (p Progress) String() string {
	if int(p) < len(progressWords) {
		return progressWords[p]
	}
	return fmt.Sprintf("Progress(%d)", int(p))
}

// Terminal says the host will not move on this write by itself.
func (p Progress) Terminal() bool {
	switch p {
	case ProgressHealthy, ProgressRemoved, ProgressFailed, ProgressRolledBack, ProgressHeld, ProgressSuperseded:
		return true
	}
	return false
}

// Success says the host runs what was written.
func (p Progress) Success() bool { return p == ProgressHealthy || p == ProgressRemoved }

// Expectation is what a client wrote to one key and waits for.
type Expectation struct {
	Key      string // the unit key: a unit name or "<unit>.d/<name>.conf"
	Unit     string // the unit Key belongs to
	Hash     string // the content's hash; "" for a removal or an instance (empty key)
	Removing bool
	State    RunState // what the content asks: started, stopped, present
	// Revision is the registry revision of the write: a host's answer
	// counts only once it has acted on this revision or a later one
	// (0: any answer counts, as before revisions were published).
	Revision int64
}

// Expect builds the Expectation of writing content to key at revision rev
// (removing: deleting key).
func Expect(key string, content []byte, removing bool, rev int64) (Expectation, error) {
	_, unit, err := ParseKey(key)
	if err != nil {
		return Expectation{}, err
	}
	e := Expectation{Key: key, Unit: unit, Removing: removing, State: StateStarted, Revision: rev}
	if len(content) > 0 {
		e.Hash = Hash(content)
	}
	if p, err := ParsePolicy(content); err == nil && key == unit {
		e.State = p.State
	}
	if IsTemplate(unit) {
		e.State = StatePresent
	}
	return e, nil
}

// Assess says where the host that published r is with e, and why. live
// says whether the host's agent is up; it is asked only when r has no pass
// record (an agent's statuses and pass record are bound to its lease, so
// they are missing both when it is down and when it has just started).
func (e Expectation) Assess(r HostReport, live func() bool) (Progress, string) {
	if e.Revision > 0 && r.Pass.Acted < e.Revision {
		switch {
		case r.Pass.Acted == 0 && !live():
			return ProgressNoAgent, "nothing has acted on revision " + fmt.Sprint(e.Revision)
		case r.Pass.Acted == 0:
			return ProgressPending, "the agent has not published a pass since it started"
		}
		return ProgressPending, fmt.Sprintf("the agent has acted on revision %d, not yet on %d", r.Pass.Acted, e.Revision)
	}
	// From here on the host has acted on the write (or the write's
	// revision is not known: the statuses are taken as they are).
	acted := e.Revision > 0
	st, ok := r.Statuses[e.Unit]
	if e.Removing {
		return e.assessRemoval(st, ok, acted, live)
	}
	if !ok {
		return ProgressPending, "no status from this host for " + e.Unit + " yet"
	}
	if e.Key == e.Unit && e.Hash != "" && st.DesiredHash != e.Hash {
		if acted {
			return ProgressSuperseded, superseded(st)
		}
		return ProgressPending, "the agent has not seen the new content yet"
	}
	switch st.Action {
	case ActionWaitSlot:
		if st.SlotBucket != "" {
			return ProgressSlot, "MaxUnavailable, " + st.SlotBucket
		}
		return ProgressSlot, "MaxUnavailable"
	case ActionHeld:
		return ProgressHeld, HeldReason(st)
	case ActionRollingBack:
		return ProgressApplying, "rolling back: " + st.Error
	case ActionRolledBack:
		if st.Error != "" && st.Job == "" {
			return ProgressRolledBack, st.Error
		}
	}
	if st.Error != "" {
		return ProgressFailed, DescribeFailure(st)
	}
	switch {
	case e.Key != e.Unit:
		if st.DropIns[e.Key] != e.Hash {
			return ProgressApplying, "drop-in not written yet"
		}
	case e.Hash != "" && st.Hash != e.Hash:
		return ProgressApplying, "file not replaced yet"
	}
	if IsTemplate(e.Unit) && e.Key == e.Unit && e.Hash != "" {
		return e.assessInstances(r.Statuses)
	}
	if st.Job != "" {
		return ProgressApplying, st.Job + " job running"
	}
	switch e.State {
	case StateStarted:
		switch {
		case st.Verifying && st.Probe != "":
			return ProgressVerifying, "running " + e.version(st) + ", waiting out HealthySec and for a passing health probe; last: " + st.Probe
		case st.Verifying:
			return ProgressVerifying, "running " + e.version(st) + ", waiting out HealthySec"
		case st.Confirming:
			return ProgressVerifying, "running " + e.version(st) + ", waiting for the agent to confirm it still reaches the registry (ConfirmSec=)"
		case st.Health == HealthHealthy:
			return ProgressHealthy, fmt.Sprintf("%s (%s), %s", st.ActiveState, st.SubState, e.version(st))
		case st.PendingRestart:
			return ProgressHealthy, "file in place, restart pending (OnChange=none), " + e.version(st)
		case st.ActiveState == "failed":
			return ProgressFailed, DescribeFailure(st)
		case e.Key != e.Unit && !activeWord(st.ActiveState):
			// A drop-in on a unit that does not run (a vendor unit the
			// agent never starts): in place is all there is.
			what := "drop-in"
			if IsConfigPath(e.Key) {
				what = "config file"
			}
			return ProgressHealthy, what + " in place; " + e.Unit + " is " + st.ActiveState
		}
		return ProgressApplying, st.ActiveState + " (" + st.SubState + ")"
	case StateStopped:
		if st.ActiveState == "inactive" || st.ActiveState == "failed" {
			return ProgressHealthy, "stopped, " + e.version(st)
		}
		return ProgressApplying, st.ActiveState
	}
	return ProgressHealthy, "installed, " + e.version(st)
}

// assessRemoval: a removal is done when the unit has no status (or, for a
// drop-in, the drop-in is gone from it) on a host that has acted on it.
func (e Expectation) assessRemoval(st Status, ok, acted bool, live func() bool) (Progress, string) {
	if !ok {
		if !acted && !live() {
			return ProgressNoAgent, "nothing has removed the unit yet"
		}
		return ProgressRemoved, ""
	}
	if st.Job != "" {
		return ProgressApplying, st.Job + " job running"
	}
	if e.Key != e.Unit {
		if _, still := st.DropIns[e.Key]; !still {
			return ProgressRemoved, "drop-in removed"
		}
		return ProgressApplying, "drop-in still on disk"
	}
	if acted && st.DesiredHash != "" {
		return ProgressSuperseded, superseded(st)
	}
	if acted && st.Hash == "" {
		// The unit file is gone; the unit keeps a status only for
		// drop-ins other keys still give it (another target's).
		return ProgressRemoved, "unit file removed; drop-ins of other keys stay"
	}
	if st.DesiredHash == "" && st.Error != "" {
		return ProgressFailed, st.Error
	}
	return ProgressApplying, "still installed (" + st.ActiveState + ")"
}

// superseded says what a host that acted on a write wants instead of it.
func superseded(st Status) string {
	switch {
	case st.DesiredHash == "":
		return "the registry no longer has this unit for the host"
	case strings.HasPrefix(st.Source, "host") && st.Source != "":
		return "the host's own key overrides it: it wants hash " + shortHash(st.DesiredHash)
	}
	return "a later write wants hash " + shortHash(st.DesiredHash)
}

// version names what a host runs for e: the unit file's hash, or for a
// drop-in or config file its own, for an instance (an empty key) its template's.
func (e Expectation) version(st Status) string {
	switch {
	case IsConfigPath(e.Key):
		return "config file " + shortHash(st.DropIns[e.Key])
	case e.Key != e.Unit:
		return "drop-in " + shortHash(st.DropIns[e.Key])
	case st.Hash != "":
		return "hash " + shortHash(st.Hash)
	case st.RunsHash != "":
		return "template " + shortHash(st.RunsHash)
	case IsInstance(e.Unit):
		return "an instance of " + TemplateOf(e.Unit)
	}
	return "no file of its own"
}

// assessInstances: a template's new set is in place on a host once every
// instance there runs it (its RunsHash) and is healthy; one instance
// failed or rolled back fails the host.
func (e Expectation) assessInstances(statuses map[string]Status) (Progress, string) {
	var done, waiting, failed int
	why := ""
	rolled := false
	for _, name := range slices.Sorted(maps.Keys(statuses)) {
		st := statuses[name]
		if !IsInstance(name) || TemplateOf(name) != e.Unit {
			continue
		}
		switch {
		case st.Action == ActionHeld:
			return ProgressHeld, name + ": " + HeldReason(st)
		case st.Action == ActionRolledBack || st.Error != "" && st.Action != ActionRollingBack:
			failed++
			rolled = rolled || st.Action == ActionRolledBack
			if why == "" {
				why = name + ": " + DescribeFailure(st)
			}
		case st.RunsHash == e.Hash && st.Health == HealthHealthy && !st.Verifying && st.Job == "":
			done++
		default:
			waiting++
		}
	}
	detail := fmt.Sprintf("instances: %d done, %d waiting, %d failed", done, waiting, failed)
	switch {
	case failed > 0 && rolled:
		return ProgressRolledBack, detail + "; " + why
	case failed > 0:
		return ProgressFailed, detail + "; " + why
	case waiting > 0:
		return ProgressApplying, detail
	}
	return ProgressHealthy, detail
}

// DescribeFailure says why a unit is not converged, with systemd's Result.
func DescribeFailure(st Status) string {
	msg := st.Error
	if msg == "" {
		msg = "unit " + st.ActiveState
	}
	if st.UnitResult != "" && st.UnitResult != "success" && !strings.Contains(msg, st.UnitResult) {
		msg += " (unit result: " + st.UnitResult + ")"
	}
	return msg
}

func activeWord(s string) bool { return s == "active" || s == "reloading" || s == "activating" }

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
