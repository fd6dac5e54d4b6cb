package reconcile

import (
	"fmt"
	"slices"
	"strings"
)

// Kind is what the agent does to one unit in one pass.
type Kind int

const (
	KindNone    Kind = iota // converged: nothing to do
	KindStart               // start a unit that should run (files written first, if any)
	KindRestart             // content changed under a running unit: restart it in place
	KindStop                // the unit should not run (State=stopped) but does
	KindUpdate              // content changed; the unit needs no job (stopped, present, template)
	KindRemove              // gone from the registry: stop, disable, remove its files
	KindBlocked             // cannot be applied; Action.Err says why. Nothing is touched.
)

var kindNames = [...]string{"none", "start", "restart", "stop", "update", "remove", "blocked"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// InstanceMarker is the manifest "hash" of a template instance the agent
// started from an empty-valued key: it owns the running instance, not a file.
const InstanceMarker = "instance"

// Action is the plan for one unit.
type Action struct {
	Unit    string
	Kind    Kind
	Reason  string        // for humans: why this kind
	Writes  []DesiredFile // files to (re)write, in path order
	Removes []string      // managed paths to delete
	Enable  bool          // enable per [Install] after writing
	Disable bool          // disable before removing the unit file
	// Instance marks an empty-valued instance key: the agent records that it
	// owns the running instance (InstanceMarker) instead of writing a file.
	Instance bool
	Err      string // set for KindBlocked
	// ContentKey identifies the desired content; a refusal by systemd is
	// remembered against it so the same bad content is not retried.
	ContentKey string
}

// Changes reports whether the action touches files (and so needs a daemon-reload).
func (a Action) Changes() bool { return len(a.Writes) > 0 || len(a.Removes) > 0 }

// LocalFile is what the unit directory holds at one path.
type LocalFile struct {
	Exists bool
	Hash   string
	Err    string // not a regular file, unreadable, ...
}

// Current is everything Plan needs to know about the host.
type Current struct {
	Files   map[string]LocalFile // every desired or managed path
	Managed map[string]string    // the manifest: path -> hash (or InstanceMarker)
	Units   map[string]UnitState // every desired or managed unit
	// Refused maps a unit to the content key systemd refused to load and why.
	Refused map[string]Refusal
	// Started maps a unit to the content key this agent process last
	// started or restarted it with. systemd forgets that a unit ran once it
	// unloads it (an unreferenced unit is unloaded when stopped), so this is
	// what keeps an operator's stop from being undone on the next pass.
	Started map[string]string
}

// Refusal remembers content systemd would not load.
type Refusal struct {
	ContentKey string
	Reason     string
}

// ContentKey is a stable identity for all of a unit's desired files.
func ContentKey(u *DesiredUnit) string {
	if u.Instance {
		return InstanceMarker
	}
	var b strings.Builder
	for _, f := range u.Files() {
		b.WriteString(f.Path)
		b.WriteByte('=')
		b.WriteString(f.Hash)
		b.WriteByte(';')
	}
	return b.String()
}

// UnitOfPath returns the unit a managed path belongs to.
func UnitOfPath(path string) string {
	if u, _, ok := strings.Cut(path, ".d/"); ok {
		return u
	}
	return path
}

// Plan computes one action per unit from desired and current state. It is
// pure: no I/O, no clock, deterministic order (sorted by unit name). Units
// neither desired nor managed do not appear: the agent does not touch them.
func Plan(desired map[string]*DesiredUnit, cur Current) []Action {
	managedBy := map[string][]string{} // unit -> managed paths
	for p := range cur.Managed {
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
	var out []Action
	for _, name := range sortedKeys(names) {
		paths := managedBy[name]
		slices.Sort(paths)
		a := planUnit(name, desired[name], paths, desired, cur)
		out = append(out, a)
	}
	// A template's new content must reach its running instances.
	changedTemplates := map[string]bool{}
	for _, a := range out {
		if IsTemplate(a.Unit) && a.Changes() && a.Kind != KindBlocked {
			changedTemplates[a.Unit] = true
		}
	}
	for i, a := range out {
		if a.Kind == KindNone && IsInstance(a.Unit) && changedTemplates[TemplateOf(a.Unit)] && cur.Units[a.Unit].Active() {
			out[i].Kind = KindRestart
			out[i].Reason = "template " + TemplateOf(a.Unit) + " changed"
		}
	}
	return out
}

func planUnit(name string, d *DesiredUnit, managed []string, desired map[string]*DesiredUnit, cur Current) Action {
	st := cur.Units[name]
	a := Action{Unit: name}
	if d == nil {
		a.Kind = KindRemove
		a.Reason = "removed from the registry"
		for _, p := range managed {
			if cur.Managed[p] == InstanceMarker {
				continue // no file: the agent owns only the running instance
			}
			a.Removes = append(a.Removes, p)
			if p == name {
				a.Disable = true
			}
		}
		return a
	}
	if d.Err != nil {
		return blocked(a, d.Err.Error())
	}
	a.ContentKey = ContentKey(d)

	// Ownership first: never overwrite what is not ours.
	isManaged := map[string]bool{}
	for _, p := range managed {
		isManaged[p] = true
	}
	for _, f := range d.Files() {
		lf := cur.Files[f.Path]
		if lf.Err != "" {
			return blocked(a, fmt.Sprintf("%s: %s", f.Path, lf.Err))
		}
		if lf.Exists && !isManaged[f.Path] {
			return blocked(a, fmt.Sprintf("unmanaged file: %s exists and agentd did not write it; not overwriting (move it away to let agentd manage it)", f.Path))
		}
		if !lf.Exists || lf.Hash != f.Hash {
			a.Writes = append(a.Writes, f)
		}
	}
	wanted := map[string]bool{}
	for _, f := range d.Files() {
		wanted[f.Path] = true
	}
	for _, p := range managed {
		if !wanted[p] && cur.Managed[p] != InstanceMarker {
			a.Removes = append(a.Removes, p)
		}
	}
	changed := a.Changes()
	if r, ok := cur.Refused[name]; ok && r.ContentKey == a.ContentKey {
		return blocked(a, r.Reason)
	}

	p := d.Policy
	if d.Instance {
		a.Instance = true
		if t := desired[TemplateOf(name)]; t != nil && t.Err == nil && t.File != nil {
			tp, err := ParsePolicy(t.File.Content)
			if err == nil {
				p = tp
			}
		}
	}
	describe := func() string {
		if !changed {
			return ""
		}
		var parts []string
		for _, f := range a.Writes {
			old := cur.Files[f.Path]
			if old.Exists {
				parts = append(parts, fmt.Sprintf("%s changed (%s → %s)", f.Path, short(old.Hash), short(f.Hash)))
			} else {
				parts = append(parts, fmt.Sprintf("%s new (%s)", f.Path, short(f.Hash)))
			}
		}
		for _, r := range a.Removes {
			parts = append(parts, r+" removed")
		}
		return strings.Join(parts, ", ")
	}
	a.Enable = changed && p.Enable && p.HasInstall

	switch {
	case IsTemplate(name) || p.State == StatePresent:
		if changed {
			a.Kind, a.Reason = KindUpdate, describe()+"; State=present: not started or stopped"
		}
	case p.State == StateStopped:
		switch {
		case st.Active():
			a.Kind, a.Reason = KindStop, "State=stopped and the unit is "+st.ActiveState
			if changed {
				a.Reason = describe() + "; " + a.Reason
			}
		case changed:
			a.Kind, a.Reason = KindUpdate, describe()+"; State=stopped"
		}
	default: // StateStarted
		switch {
		case changed && st.Active():
			a.Kind, a.Reason = KindRestart, describe()+"; unit is "+st.ActiveState
		case changed:
			a.Kind, a.Reason = KindStart, describe()
		case d.Instance && !isManaged[name]:
			a.Kind, a.Reason = KindStart, "new instance of "+TemplateOf(name)
		case !st.Active() && !st.Ran && st.LoadState == "loaded" && cur.Started[name] != a.ContentKey:
			// Not run since the manager started (a boot, or the agent was
			// away): start it. A unit that ran and stopped or failed is left
			// as it is — an operator's stop is respected, and a crash is
			// systemd's Restart= to handle; both show in status.
			a.Kind, a.Reason = KindStart, "not started since the manager started"
		}
	}
	return a
}

func blocked(a Action, why string) Action {
	a.Kind = KindBlocked
	a.Err = why
	a.Writes, a.Removes, a.Enable, a.Disable = nil, nil, false, false
	return a
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
