package reconcile

import (
	"fmt"
	"maps"
	"slices"
)

// What a host would do with a unit, as a preview (`unit put --dry-run`,
// `unit edit`) says it.
const (
	DoNothing   = "nothing"
	DoStart     = "start"
	DoRestart   = "restart"
	DoReload    = "reload"
	DoUpdate    = "daemon-reload only"
	DoWrite     = "config files only" // written, no daemon-reload, no job
	DoStopStart = "stop-start"
	DoStop      = "stop"
	DoHeld      = "held"
	DoBlocked   = "blocked"
	DoNoAgent   = "no live agent"
)

// HostView is what the registry says about one live host: every unit key
// meant for it with its groups' halts (as its agent reads them), the
// statuses it publishes, and the facts it publishes (nil when it
// publishes none: an agent older than them, or one that has not finished
// its first pass). Labels are the labels it publishes (Member.Labels):
// a MaxUnavailableBy= slot is named by its bucket.
type HostView struct {
	Host     string
	Snapshot Snapshot
	Statuses map[string]Status
	Facts    *Facts
	Labels   map[string]string
}

// Put is a change to preview: unit keys (key suffix → content; empty for
// an instance) written to one scope of the registry.
type Put struct {
	Scope Scope
	Group string // set when Scope is ScopeGroup
	Units map[string][]byte
	// Halts are the halts of the host's groups once the put is stored:
	// putting new content clears the halt of the version that failed.
	Halts []Halt
}

// Prediction is what one host would do with one unit.
type Prediction struct {
	Host   string `json:"host"`
	Unit   string `json:"unit"`
	Do     string `json:"do"`
	Reason string `json:"reason,omitempty"`
}

// Refuses says the host would not apply the unit: a file agentd did not
// write is in the way, the content is refused, ...; Reason says why.
func (p Prediction) Refuses() bool { return p.Do == DoBlocked }

// Preview says what host v would do with each unit put touches (for a
// template, its registry instances too). It is pure, and it runs the
// agent's own planner, Plan: the registry content the host sees now
// (Desire; a host key overrides a group key) stands for what the files
// agentd owns on the host hold and its units run, the host's facts for
// what else its unit directory holds and what it will not apply again,
// its statuses for what systemd says, and the registry after the put for
// what it should run.
//
// What it cannot know, and assumes:
//   - The files the agent owns hold what the statuses report (else the
//     registry's current content), and the units run it unless the status
//     says otherwise (held, not reloadable, OnChange=none); content the
//     registry no longer has is classified against nothing.
//   - systemd's state beyond the status: its activeState, subState,
//     loadState and job are used; whether a unit is enabled, whether a
//     stopped unit ran since boot, NeedDaemonReload and the state of a unit
//     agentd has no status for (one it only adds drop-ins to) are not. A
//     unit without a status is taken as not loaded, inactive.
//   - Whether systemd will load new content: a refusal is known once the
//     host has met it (its facts), not before.
//   - MaxUnavailable= slots: a disruptive step is shown as it will run,
//     with the slot it waits for named (with MaxUnavailableBy=, its
//     bucket by the host's published labels); when it gets it depends on
//     the other hosts.
//   - Health: a new version that fails is rolled back, which no preview
//     can tell.
func Preview(v HostView, put Put) []Prediction {
	old := Desire(v.Snapshot)
	next := v.Snapshot
	next.Entries = slices.Clone(v.Snapshot.Entries)
	overridden := map[string]bool{} // unit -> a host key hides the group's new key
	for _, k := range slices.Sorted(maps.Keys(put.Units)) {
		unit := keyUnit(k)
		i := slices.IndexFunc(next.Entries, func(e Entry) bool {
			return e.Scope == put.Scope && e.Group == put.Group && e.Unit == k
		})
		if i >= 0 {
			next.Entries[i].Value = put.Units[k]
		} else {
			next.Entries = append(next.Entries, Entry{Scope: put.Scope, Group: put.Group, Unit: k, Value: put.Units[k]})
		}
		if put.Scope == ScopeGroup && slices.ContainsFunc(v.Snapshot.Entries, func(e Entry) bool {
			return e.Scope == ScopeHost && e.Unit == k
		}) {
			overridden[unit] = true
		}
	}
	next.Halts = put.Halts
	desired := Desire(next)
	cur := hostCurrent(old, desired, v.Statuses, next.Halts, v.Facts)
	cur.Fleet.Labels = v.Labels
	actions := map[string]Action{}
	for _, a := range Plan(desired, cur) {
		actions[a.Unit] = a
	}

	// The units touched, in order: a template's instances after it.
	var touched []string
	for k := range put.Units {
		if unit := keyUnit(k); !slices.Contains(touched, unit) {
			touched = append(touched, unit)
		}
	}
	slices.Sort(touched)
	var order []string
	for _, u := range touched {
		order = append(order, u)
		if IsTemplate(u) {
			for _, n := range slices.Sorted(maps.Keys(desired)) {
				if IsInstance(n) && TemplateOf(n) == u && !slices.Contains(touched, n) {
					order = append(order, n)
				}
			}
		}
	}
	// Instances restarted one at a time: how many, for "i of n".
	rolling := map[string][]string{}
	for _, u := range order {
		if a := actions[u]; IsInstance(u) && (a.Kind.Disruptive() || isRollingWait(a)) {
			t := TemplateOf(u)
			rolling[t] = append(rolling[t], u)
		}
	}

	var out []Prediction
	for _, u := range order {
		p := Prediction{Host: v.Host, Unit: u}
		a, ok := actions[u]
		switch {
		case !ok:
			p.Do, p.Reason = DoNothing, "not meant for this host"
		default:
			p.Do, p.Reason = Describe(a)
			// A put that changes nothing of the unit says so; what the
			// host still does with it (it holds it, refuses it, ...) is
			// the answer whether or not the put changes the content.
			if p.Do == DoNothing && sameContent(u, old, desired) {
				p.Do, p.Reason = DoNothing, "content unchanged"
				if overridden[u] {
					p.Reason = "the host's own key " + "hosts/" + v.Host + "/units/" + u + " overrides the group's"
				}
			}
		}
		if ok && IsInstance(u) && p.Do != DoNothing {
			if peers := rolling[TemplateOf(u)]; len(peers) > 1 && slices.Contains(peers, u) {
				p.Reason = fmt.Sprintf("instance %d of %d, one at a time, each healthy for HealthySec=%v before the next; %s",
					slices.Index(peers, u)+1, len(peers), a.Policy.Healthy, p.Reason)
			}
		}
		if ok && a.Policy.SlotLimit > 0 && a.Scope != "" && (a.Kind.Disruptive() || isRollingWait(a)) {
			p.Reason += " (after a rollout slot: " + a.Bucket.budget(a.Policy.SlotLimit, a.Scope) + ")"
		}
		if st, ok := v.Statuses[u]; ok && p.Do != DoNothing && p.Do != DoBlocked && p.Do != DoHeld && st.Hash != st.DesiredHash && !IsInstance(u) {
			p.Reason += " (the host has not converged on the registry's current content; what its file holds now is compared against nothing)"
		}
		out = append(out, p)
	}
	return out
}

// isRollingWait: an instance that waits for the one before it.
func isRollingWait(a Action) bool {
	return a.Kind == KindWait && a.Gate.On == WaitRolling
}

// Describe says a planned action as a preview prints it: what the host
// would do (a Do word) and why.
func Describe(a Action) (do, reason string) {
	switch a.Kind {
	case KindStart:
		return DoStart, a.Reason
	case KindRestart:
		return DoRestart, a.Reason
	case KindReload:
		return DoReload, a.Reason
	case KindStopStart:
		return DoStopStart, a.Reason
	case KindStop:
		return DoStop, a.Reason
	case KindBlocked:
		return DoBlocked, a.Err
	case KindUpdate:
		if a.Err != "" {
			return DoBlocked, a.Err + " (the files are written and loaded; the unit keeps running the old version)"
		}
		if IsTemplate(a.Unit) {
			return DoUpdate, "a template is installed, never started; its running instances restart onto it as listed"
		}
		if a.Steps.Enable && a.Steps.Disable {
			return DoUpdate, a.Reason + " (re-enabled)"
		}
		if !a.changesUnitFiles() {
			return DoWrite, a.Reason
		}
		return DoUpdate, a.Reason
	case KindWait:
		switch {
		case a.Gate.On == WaitHeld:
			why, _ := cutHeld(a.Reason)
			return DoHeld, why
		case isRollingWait(a):
			if a.Policy.OnChange == "stop-start" {
				return DoStopStart, a.Reason
			}
			return DoRestart, a.Reason
		}
		return string(ActionWait), a.Reason
	case KindNone:
		if a.Reason == "" {
			return DoNothing, "already runs this content"
		}
		return DoNothing, a.Reason
	}
	return a.Kind.String(), a.Reason
}

// sameContent: the unit's files (its template's too, for an instance) are
// the same before and after the put.
func sameContent(u string, old, next map[string]*DesiredUnit) bool {
	var key func(m map[string]*DesiredUnit, n string) string
	key = func(m map[string]*DesiredUnit, n string) string {
		d := m[n]
		if d == nil {
			return "\x00absent"
		}
		if d.Err != nil {
			return "\x00err:" + d.Err.Error()
		}
		k := ContentKey(d)
		if IsInstance(n) {
			k += "|" + key(m, TemplateOf(n))
		}
		return k
	}
	return key(old, u) == key(next, u)
}

// hostCurrent builds the planner's view of a host from the registry's
// current content (old), the host's statuses and its facts: see Preview
// for what it assumes.
func hostCurrent(old, next map[string]*DesiredUnit, statuses map[string]Status, halts []Halt, facts *Facts) Current {
	cur := Current{
		Host: HostFacts{Files: map[string]LocalFile{}, Units: map[string]UnitState{}},
		Memory: Memory{
			Managed:   map[string]Owned{},
			Records:   map[string]UnitRecord{},
			Blobs:     map[string][]byte{},
			Refused:   map[string]Refusal{},
			Started:   map[string]string{},
			Verifying: map[string]bool{},
			Jobs:      map[string]InFlight{},
		},
		Fleet: Fleet{Slots: map[string]string{}, Halts: map[string]Halt{}},
	}
	for _, h := range halts {
		cur.Fleet.Halts[h.Unit] = h
	}
	// Files a facts-publishing host says it does not own are not its: it
	// neither wrote them nor runs what the registry holds for them.
	var unowned map[string]UnownedFile
	if facts != nil {
		unowned = facts.Unowned
	}
	previewFiles(&cur, old, statuses, unowned)
	previewRecords(&cur, old, statuses, unowned)
	if facts != nil {
		cur.Host.FileRoots = facts.FileRoots // nil (unknown) from an agent that does not publish them
		maps.Copy(cur.Memory.Refused, facts.Refused)
		for u, f := range facts.Failed {
			rec := cur.Memory.Records[u]
			rec.Failed, rec.FailReason = f.ContentKey, f.Reason
			cur.Memory.Records[u] = rec
		}
	}
	previewUnits(&cur, old, next, statuses)
	return cur
}

// previewFiles fills in the files the host has and owns: the registry's
// current content, or what its status says a file holds when the host has
// not written that (a held rollout); and the files it does not own.
func previewFiles(cur *Current, old map[string]*DesiredUnit, statuses map[string]Status, unowned map[string]UnownedFile) {
	for name, d := range old {
		if d.Err != nil {
			continue // blocked now: what the host has of it is unknown
		}
		st, hasStatus := statuses[name]
		for _, f := range d.Files() {
			if _, ok := unowned[f.Path]; ok {
				continue
			}
			if h := diskHash(st, f.Path); hasStatus && h != "" && h != f.Hash {
				// The host has not written the current content (a held
				// rollout): its status says what the file holds.
				cur.Host.Files[f.Path] = LocalFile{Exists: true, Hash: h}
				cur.Memory.Managed[f.Path] = Owned{Hash: h}
				continue
			}
			cur.Host.Files[f.Path] = LocalFile{Exists: true, Hash: f.Hash, Content: f.Content}
			cur.Memory.Managed[f.Path] = Owned{Hash: f.Hash}
			cur.Memory.Blobs[f.Hash] = f.Content
		}
		if d.Instance {
			cur.Memory.Managed[name] = Owned{Instance: true}
		}
	}
	for p, uf := range unowned {
		cur.Host.Files[p] = LocalFile{Exists: true, Hash: uf.Hash, Err: uf.Err}
	}
}

// previewRecords fills in what the host remembers of the units it reports
// on and owns: the content each runs (its record and start), whether it is
// verifying, and its job in flight.
func previewRecords(cur *Current, old map[string]*DesiredUnit, statuses map[string]Status, unowned map[string]UnownedFile) {
	notMine := map[string]bool{}
	for p := range unowned {
		notMine[UnitOfPath(p)] = true
	}
	for name, d := range old {
		st, ok := statuses[name]
		if d.Err != nil || !ok || notMine[name] {
			continue
		}
		eff, ok := previewRuns(name, d, old, st)
		if !ok {
			continue
		}
		own := OwnDropIns
		switch {
		case d.File != nil:
			own = OwnFile
		case d.Instance:
			own = OwnInstance
		}
		key := KeyOf(eff)
		if len(eff) == 0 && d.Instance {
			key = instanceKey
		}
		cur.Memory.Records[name] = UnitRecord{Applied: eff, Own: own}
		cur.Memory.Started[name] = key
		if st.Verifying {
			cur.Memory.Verifying[name] = true
		}
		if j := jobNamed(st.Job); j != JobNone {
			cur.Memory.Jobs[name] = InFlight{Job: j, ContentKey: key}
		}
	}
}

// previewRuns is the content (path -> hash) a unit runs as its status st
// tells it, against d, its registry value; ok is false for a unit in error
// whose status says nothing more of what it runs.
func previewRuns(name string, d *DesiredUnit, old map[string]*DesiredUnit, st Status) (eff map[string]string, ok bool) {
	// Runs other content than its files hold: the status says the
	// change waits (held), was not applied to the running unit (it
	// cannot reload, OnChange=none), or the file is another.
	active := st.ActiveState == "active" || st.ActiveState == "reloading" || st.ActiveState == "activating"
	other := st.PendingRestart || active && (st.Action == ActionHeld || st.Action == KindUpdate.Word() && st.Result == "failed")
	differs := false
	for _, f := range d.Files() {
		if h := diskHash(st, f.Path); h != "" && h != f.Hash {
			differs = true
		}
	}
	if st.Error != "" && !other && !differs {
		return nil, false
	}
	eff = map[string]string{}
	for _, f := range d.VersionFiles() {
		eff[f.Path] = f.Hash
		if h := diskHash(st, f.Path); h != "" && h != f.Hash {
			eff[f.Path] = h
		} else if other {
			eff[f.Path] = "unknown" // no file holds it: classified against nothing
		}
	}
	if t := old[TemplateOf(name)]; IsInstance(name) && t != nil && t.Err == nil {
		for _, f := range t.Files() {
			eff[f.Path] = f.Hash
		}
	}
	return eff, true
}

// previewUnits fills in the state of every unit before or after the put,
// as its status says (not found without one), and gives every unit after
// it its slot.
func previewUnits(cur *Current, old, next map[string]*DesiredUnit, statuses map[string]Status) {
	names := map[string]bool{}
	for n := range old {
		names[n] = true
	}
	for n := range next {
		names[n] = true
		cur.Fleet.Slots[SlotKey(n)] = "preview" // shown as it will run once it has its slot
	}
	for n := range names {
		st, ok := statuses[n]
		switch {
		case IsTemplate(n):
			cur.Host.Units[n] = UnitState{LoadState: "template", ActiveState: "inactive", SubState: "template"}
		case ok:
			load := st.LoadState
			if load == "" {
				load = "loaded"
			}
			cur.Host.Units[n] = UnitState{LoadState: load, ActiveState: st.ActiveState,
				SubState: st.SubState, Result: st.UnitResult, MainPID: st.MainPID, Ran: true}
		default:
			cur.Host.Units[n] = UnitState{LoadState: "not-found", ActiveState: "inactive", SubState: "dead"}
		}
	}
}

// diskHash is the hash of the file at path as a unit's status reports it
// ("" when it does not).
func diskHash(st Status, path string) string {
	if path == st.Unit {
		return st.Hash
	}
	return st.DropIns[path]
}

func jobNamed(s string) Job {
	for _, j := range []Job{JobStart, JobStop, JobRestart, JobReload} {
		if s == j.String() {
			return j
		}
	}
	return JobNone
}
