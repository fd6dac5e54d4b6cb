package reconcile

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// KeyOf is a stable identity for a set of files (path -> hash).
func KeyOf(files map[string]string) string {
	switch len(files) {
	case 0:
		return ""
	case 1: // most units: no sort, one allocation (it runs per unit per pass)
		for p, h := range files {
			return p + "=" + h + ";"
		}
	}
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(files)) {
		b.WriteString(p)
		b.WriteByte('=')
		b.WriteString(files[p])
		b.WriteByte(';')
	}
	return b.String()
}

// ContentKey is a stable identity for all of a unit's desired files.
func ContentKey(u *DesiredUnit) string {
	if u.Instance && len(u.DropIns) == 0 {
		return instanceKey
	}
	return KeyOf(fileHashes(u.VersionFiles()))
}

func fileHashes(fs []DesiredFile) map[string]string {
	m := map[string]string{}
	for _, f := range fs {
		m[f.Path] = f.Shown()
	}
	return m
}

// UnitOfPath returns the unit a managed path belongs to.
func UnitOfPath(path string) string {
	if u, _, ok := ConfigDest(path); ok {
		return u
	}
	if u, _, ok := strings.Cut(path, ".d/"); ok {
		return u
	}
	return path
}

// Plan computes one action per unit from desired and current state. It is
// pure: no I/O, no clock, deterministic order (sorted by unit name). Units
// neither desired nor managed nor remembered do not appear: the agent does
// not touch them.
func Plan(desired map[string]*DesiredUnit, cur Current) []Action {
	managedBy := map[string][]string{} // unit -> managed paths
	for p := range cur.Memory.Managed {
		u := UnitOfPath(p)
		managedBy[u] = append(managedBy[u], p)
	}
	names := map[string]bool{}
	for n := range desired {
		names[n] = true
	}
	for n := range managedBy {
		names[n] = true
	}
	for n := range cur.Memory.Records {
		names[n] = true
	}
	var out []Action
	rolling := map[string]bool{} // templates with an instance mid-update
	for n := range cur.Memory.Verifying {
		if IsInstance(n) {
			rolling[TemplateOf(n)] = true
		}
	}
	for n, j := range cur.Memory.Jobs {
		if IsInstance(n) && j.Job != JobStop {
			rolling[TemplateOf(n)] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		paths := managedBy[name]
		slices.Sort(paths)
		a := planUnit(name, desired[name], paths, desired, cur)
		// Instances of one template are disrupted one at a time, each
		// healthy (HealthySec) before the next: never all down at once.
		if IsInstance(name) && a.Kind.Disruptive() {
			t := TemplateOf(name)
			if rolling[t] {
				a = waiting(a, WaitRolling, "waiting for the rolling update of "+t+": one instance at a time ("+a.Reason+")")
			}
			rolling[t] = true
		}
		// MaxUnavailable: the disruptive part waits for a slot shared by
		// every host of the group (nothing is written before it either).
		// Instances share their template's slot, and a template's new files
		// wait for it too while instances run: the template set is the unit
		// of rollout.
		if (a.Kind.Disruptive() || templateChangeDisrupts(a, cur)) && a.Policy.SlotLimit > 0 && a.Scope != "" && cur.Fleet.Slots[SlotKey(name)] == "" {
			a = waiting(a, WaitSlot, fmt.Sprintf("waiting for a rollout slot (%s) to %s", a.Bucket.budget(a.Policy.SlotLimit, a.Scope), a.Reason))
		}
		out = append(out, a)
	}
	holdReaders(out, desired, cur)
	orderSocketServices(out, desired)
	return out
}

// orderSocketServices makes the job of a service wait for its socket's
// start or restart in the same plan: systemd refuses to start a socket
// whose service runs, and a socket's restart stops its service first.
func orderSocketServices(plan []Action, desired map[string]*DesiredUnit) {
	byUnit := make(map[string]int, len(plan))
	for i, a := range plan {
		byUnit[a.Unit] = i
	}
	for _, s := range plan {
		if !strings.HasSuffix(s.Unit, ".socket") || (s.Steps.Job != JobStart && s.Steps.Job != JobRestart) {
			continue
		}
		if i, ok := byUnit[socketService(s.Unit, desired[s.Unit])]; ok && plan[i].Steps.Job != JobNone {
			plan[i].Steps.After = s.Unit
			plan[i].Reason += "; after " + s.Unit + "'s " + s.Steps.Job.String() + " (systemd starts no socket whose service runs)"
		}
	}
}

// SlotKey is what a MaxUnavailable slot and a halt are keyed by: the unit,
// or for an instance its template — a template's instances roll out as one.
func SlotKey(unit string) string {
	if IsInstance(unit) {
		return TemplateOf(unit)
	}
	return unit
}

// templateChangeDisrupts: the action writes a template's files while some of
// its instances run; they will be restarted onto the new set.
func templateChangeDisrupts(a Action, cur Current) bool {
	if !IsTemplate(a.Unit) || !a.Changes() {
		return false
	}
	for u, st := range cur.Host.Units {
		if IsInstance(u) && TemplateOf(u) == a.Unit && st.Active() {
			return true
		}
	}
	return false
}

// SlotNeed is a MaxUnavailable slot this host needs now.
type SlotNeed struct {
	Scope  string
	Bucket Bucket // MaxUnavailableBy=: the label bucket of Scope's semaphore
	Hash   string
	Limit  int
}

// SlotsNeeded is level-triggered slot accounting: the slots (by SlotKey)
// this host needs after this plan — for a disruptive step planned or
// waiting for its slot, a job in flight, a unit inside HealthySec or whose
// change awaits its confirmation (ConfirmSec=). Every
// other slot it holds or queues for is given back. Pure.
func SlotsNeeded(plan []Action, cur Current) map[string]SlotNeed {
	need := map[string]SlotNeed{}
	for _, a := range plan {
		if a.Policy.SlotLimit <= 0 || a.Scope == "" {
			continue
		}
		_, inflight := cur.Memory.Jobs[a.Unit]
		confirming := cur.Memory.Records[a.Unit].Confirming != "" // ConfirmSec=: not done until confirmed
		if a.Gate.On == WaitSlot || a.Kind.Disruptive() || inflight || cur.Memory.Verifying[a.Unit] || confirming {
			need[SlotKey(a.Unit)] = SlotNeed{Scope: a.Scope, Bucket: a.Bucket, Hash: a.Hash, Limit: a.Policy.SlotLimit}
		}
	}
	return need
}

// ReloadNeeded says whether the plan owes a daemon-reload before its jobs:
// files or enablement change, an earlier pass was cut off before its
// reload, or systemd itself says a unit about to get a job has a newer file
// on disk than it loaded (NeedDaemonReload). Pure.
func ReloadNeeded(plan []Action, cur Current) (bool, string) {
	if cur.Memory.Intent.Reload {
		return true, "a daemon-reload owed by an interrupted pass"
	}
	for _, a := range plan {
		if a.changesUnitFiles() || a.Steps.Enable || a.Steps.Disable {
			return true, "unit files changed"
		}
	}
	for _, a := range plan {
		if a.Steps.Job != JobNone && cur.Host.Units[a.Unit].NeedDaemonReload {
			return true, a.Unit + " has NeedDaemonReload=yes"
		}
	}
	return false, ""
}
