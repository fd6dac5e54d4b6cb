package reconcile

import (
	"fmt"
	"maps"
	"time"
)

// statusInput is everything a unit's status is made of, gathered by the
// loop (statusBuilder.status): the plan's action for the unit, the results (its job
// in flight, the last outcome), what the ledger remembers of it, and what
// the disk and systemd say of it.
type statusInput struct {
	Unit    string
	Desired *DesiredUnit // nil: the registry does not want it
	Action  Action       // the pass's action for it (zero: none)

	// Observed.
	Hash    string            // of its unit file on disk ("" none, or an instance)
	DropIns map[string]string // its managed drop-ins on disk: path -> hash
	State   *UnitState        // what systemd says; nil for a name systemd does not know

	// Results.
	Job  *Action  // the action whose job is in flight, nil when none
	Last *outcome // the last thing done to it, nil when nothing is remembered

	// What the ledger remembers.
	Record     UnitRecord
	Verifying  bool   // inside HealthySec
	Confirming bool   // awaiting its confirmation (ConfirmSec=)
	EnableErr  string // the last failed enable/disable, until one succeeds

	// Probes are the health probes of the version it runs (none: no
	// probes), Probe where they stand.
	Probes Probes
	Probe  ProbeState

	Now time.Time // UpdatedAt
}

// unitStatus is a unit's status. Pure: the one place that says what a
// status reports of plan, results, ledger and observation.
func unitStatus(in statusInput) Status {
	name, d, act := in.Unit, in.Desired, in.Action
	s := Status{Unit: name, UpdatedAt: in.Now, Hash: in.Hash, DropIns: sealDropIns(in.DropIns, d)}
	if d != nil {
		s.DesiredHash = d.Hash()
		if d.File != nil {
			s.Source = d.File.Source
		}
	}
	if d != nil && d.File != nil && s.Hash == s.DesiredHash {
		s.Revision = d.File.Revision
	}
	if in.State != nil {
		st := *in.State
		s.LoadState, s.ActiveState, s.SubState = st.LoadState, st.ActiveState, st.SubState
		s.UnitResult, s.MainPID, s.NRestarts = st.Result, st.MainPID, st.NRestarts
		if d != nil && d.Err == nil && d.Policy.State == StateStarted && !IsTemplate(name) && st.ActiveState == "failed" && !in.Verifying && in.Job == nil {
			// While a job runs or the unit is verifying, the verdict
			// comes when the loop takes the job's result: a job that
			// failed a moment ago is not yet rolled back.
			s.Error = fmt.Sprintf("unit failed (%s)", ExitDetail(st))
		}
		if d != nil && d.Err == nil && d.File == nil && !d.Instance && len(d.DropIns) > 0 && st.LoadState == "not-found" {
			// Written, and nothing to apply them to: say so, naming the
			// unit, rather than report a quiet not-found.
			s.Error = fmt.Sprintf("%s is not on this host (systemd: not-found): its drop-ins are written and apply to nothing until a unit file named %s is installed", name, name)
		}
		s.Health = healthWord(name, in.Record, in.Verifying, st, act.ContentKey)
		s.Verifying = in.Verifying
		s.Confirming = in.Confirming
		if in.Probes.Any() {
			n := in.Probes.FailAfter()
			s.Probe = in.Probe.Text(n)
			if in.Probe.Failing(n) && s.Health == HealthHealthy {
				// After its window: the version passed it, so it is not
				// rolled back; the status says it is unhealthy now.
				s.Health = HealthUnhealthy
				s.Error = "health probe failing: " + s.Probe + " (after the version passed its HealthySec window: not rolled back)"
			}
		}
		if d != nil && act.Policy.OnChange == "none" && st.Active() {
			s.PendingRestart = len(in.Record.Applied) > 0 && KeyOf(in.Record.Applied) != act.ContentKey
		}
	}
	if in.Job != nil {
		s.Job = in.Job.Steps.Job.String()
	}
	if IsInstance(name) {
		s.RunsHash = in.Record.Applied[TemplateOf(name)]
	}
	if in.EnableErr != "" && s.Error == "" {
		s.Error = in.EnableErr
	}
	if o := in.Last; o != nil {
		s.Action, s.Result = o.action, o.result
		if o.err != "" && (d == nil || o.contentKey == act.ContentKey || o.contentKey == ContentKey(d)) && o.result != ResultDone {
			s.Error = o.err
		}
		if o.action == ActionRolledBack && o.contentKey == act.ContentKey {
			s.Error = o.err
		}
	}
	if j := in.Job; j != nil {
		s.Action, s.Result = j.Kind.Word(), ResultRunning
		if j.Kind == KindRollback {
			s.Action = ActionRollingBack // rolled back once the job is done
		}
	} else if act.Kind == KindWait {
		s.Action, s.Result = ActionWait, ResultWaiting
		switch act.Gate.On {
		case WaitSlot:
			s.Action, s.SlotBucket = ActionWaitSlot, act.Bucket.String()
		case WaitHeld:
			s.Action, s.Error = ActionHeld, act.Err
		}
	}
	if act.Kind == KindBlocked {
		if o := in.Last; o == nil || o.action != ActionRolledBack {
			s.Action, s.Result = ActionBlocked, ResultBlocked
		}
		s.Error = act.Err
	}
	return s
}

// healthWord is the agent's verdict on the version a unit runs, for status:
// rec is its record, want the content the plan wants it to run.
func healthWord(name string, rec UnitRecord, verifying bool, st UnitState, want string) HealthWord {
	if verifying {
		return HealthVerifying
	}
	if len(rec.Applied) == 0 || IsTemplate(name) {
		return "" // no verdict on the version it should run yet
	}
	applied := KeyOf(rec.Applied)
	if want != "" && applied != want {
		return ""
	}
	if rec.Failed != "" && rec.Failed == applied {
		return HealthUnhealthy
	}
	ranToCompletion := st.Type == "oneshot" && st.ActiveState == "inactive" && st.Result == "success"
	if maps.Equal(rec.Good, rec.Applied) && (st.Active() || ranToCompletion) {
		return HealthHealthy
	}
	return ""
}

// secretDiffers stands in a status for the hash of a secret file on disk
// that is not the one wanted (drift, a write not done yet): that hash is
// never published.
const secretDiffers = "secret-differs"

// sealDropIns is what a status says of the files of a unit's set on disk
// (path → hash): for a secret in place, the ciphertext's hash, the one
// --wait looks for; for a secret that differs, secretDiffers.
func sealDropIns(onDisk map[string]string, d *DesiredUnit) map[string]string {
	if d == nil || len(onDisk) == 0 {
		return onDisk
	}
	var out map[string]string
	for p, f := range d.DropIns {
		h, ok := onDisk[p]
		if f.Sealed == "" || !ok {
			continue
		}
		if out == nil {
			out = maps.Clone(onDisk)
		}
		if h == f.Hash {
			out[p] = f.Sealed
		} else {
			out[p] = secretDiffers
		}
	}
	if out == nil {
		return onDisk
	}
	return out
}
