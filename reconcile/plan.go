package reconcile

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Kind is what the agent does to one unit in one pass.
type Kind int

const (
	KindNone      Kind = iota // converged: nothing to do
	KindStart                 // start a unit that should run (files written first, if any)
	KindRestart               // restart in place (files written first)
	KindReload                // ExecReload (or remount) in place; the main PID stays
	KindStopStart             // stop with the OLD definition, then write, then start
	KindStop                  // the unit should not run (State=stopped) but does
	KindUpdate                // write files and daemon-reload only; the unit keeps running untouched
	KindRemove                // gone from the registry: stop, disable, remove its files
	KindWait                  // a disruptive change waits its turn (rolling update of a template)
	KindBlocked               // cannot be applied; Action.Err says why. Nothing is touched.
)

var kindNames = [...]string{"none", "start", "restart", "reload", "stop-start", "stop", "update", "remove", "wait", "blocked"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Disruptive reports whether the action interrupts the running unit.
func (k Kind) Disruptive() bool {
	return k == KindRestart || k == KindStopStart || k == KindStop
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
	Disable bool          // disable before removing or rewriting the unit file
	// AlsoStop lists units to stop before a restart (a socket's service).
	AlsoStop []string
	// Instance marks an empty-valued instance key: the agent records that it
	// owns the running instance (InstanceMarker) instead of writing a file.
	Instance bool
	Err      string // set for KindBlocked
	// ContentKey identifies the desired content (the unit's files, and its
	// template's for an instance); refusals and failures are remembered
	// against it so the same bad content is not retried.
	ContentKey string
	// Effective is path -> hash of every file the running unit will be on
	// once the action is done: recorded as UnitRecord.Applied.
	Effective map[string]string
	// Policy is the unit's policy (the template's for an instance).
	Policy Policy
	// Change is the classification that chose Kind, when one was made.
	Change *Change
	// Scope is the registry target the content came from when it is a
	// group ("groups/web"): MaxUnavailable slots and halts are per scope.
	Scope string
	// Hash is the desired unit file hash (the template's for an instance).
	Hash string
	// NeedSlot marks a KindWait that waits for a MaxUnavailable slot.
	NeedSlot bool
}

// Changes reports whether the action touches files (and so needs a daemon-reload).
func (a Action) Changes() bool { return len(a.Writes) > 0 || len(a.Removes) > 0 }

// LocalFile is what the unit directory holds at one path.
type LocalFile struct {
	Exists  bool
	Hash    string
	Content []byte
	Err     string // not a regular file, unreadable, ...
}

// UnitRecord is what the agent remembers about a unit across restarts
// (persisted in the state directory).
type UnitRecord struct {
	// Applied is path -> hash of the files the running unit was last
	// started, restarted or reloaded with (or judged current without one).
	Applied map[string]string `json:"applied,omitempty"`
	// Good is the last version that was healthy: what a rollback restores.
	Good map[string]string `json:"good,omitempty"`
	// Failed is the content key that failed and was rolled back (or could
	// not start); it is not retried until the registry content changes.
	Failed     string `json:"failed,omitempty"`
	FailReason string `json:"failReason,omitempty"`
}

// Current is everything Plan needs to know about the host.
type Current struct {
	Files   map[string]LocalFile // every desired or managed path
	Managed map[string]string    // the manifest: path -> hash (or InstanceMarker)
	Units   map[string]UnitState // every desired or managed unit
	Records map[string]UnitRecord
	// Blobs holds content by hash for the files of Applied records, so a
	// change can be classified against what the unit actually runs.
	Blobs map[string][]byte
	// Refused maps a unit to the content key systemd refused to load and why.
	Refused map[string]Refusal
	// Started maps a unit to the content key this agent process last
	// started or restarted it with. systemd forgets that a unit ran once it
	// unloads it (an unreferenced unit is unloaded when stopped), so this is
	// what keeps an operator's stop from being undone on the next pass.
	Started map[string]string
	// Verifying lists units inside their HealthySec window after a (re)start.
	Verifying map[string]bool
	// Slots maps a unit to the hash for which this host holds its
	// MaxUnavailable slot.
	Slots map[string]string
	// Halts are the halted rollouts of this host's groups, by unit.
	Halts map[string]Halt
}

// Refusal remembers content systemd would not load.
type Refusal struct {
	ContentKey string
	Reason     string
}

// KeyOf is a stable identity for a set of files (path -> hash).
func KeyOf(files map[string]string) string {
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
		return InstanceMarker
	}
	return KeyOf(fileHashes(u.Files()))
}

func fileHashes(fs []DesiredFile) map[string]string {
	m := map[string]string{}
	for _, f := range fs {
		m[f.Path] = f.Hash
	}
	return m
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
	rolling := map[string]bool{} // templates with an instance mid-update
	for n := range cur.Verifying {
		if IsInstance(n) {
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
				a.Kind, a.Reason = KindWait, "waiting for the rolling update of "+t+": one instance at a time ("+a.Reason+")"
				a.Writes, a.Removes = nil, nil
			}
			rolling[t] = true
		}
		// MaxUnavailable: the disruptive part waits for a slot shared by
		// every host of the group (nothing is written before it either).
		if a.Kind.Disruptive() && a.Policy.MaxUnavailable > 0 && a.Scope != "" && cur.Slots[name] == "" {
			a.Kind, a.NeedSlot = KindWait, true
			a.Reason = fmt.Sprintf("waiting for a rollout slot (MaxUnavailable=%d in %s) to %s", a.Policy.MaxUnavailable, a.Scope, a.Reason)
			a.Writes, a.Removes, a.Enable, a.Disable = nil, nil, false, false
		}
		out = append(out, a)
	}
	return out
}

func planUnit(name string, d *DesiredUnit, managed []string, desired map[string]*DesiredUnit, cur Current) Action {
	st := cur.Units[name]
	rec := cur.Records[name]
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

	// What the unit runs on once converged: its own files, and for an
	// instance its template's (unless the template's change was rolled back).
	effective := fileHashes(d.Files())
	p := d.Policy
	if IsInstance(name) {
		a.Instance = d.Instance
		if t := desired[TemplateOf(name)]; t != nil && t.Err == nil {
			tkey := ContentKey(t)
			if tr := cur.Records[t.Name]; tr.Failed == tkey || cur.Refused[t.Name].ContentKey == tkey {
				if len(tr.Applied) > 0 {
					maps.Copy(effective, tr.Applied)
				}
			} else {
				maps.Copy(effective, fileHashes(t.Files()))
			}
			if d.File == nil {
				p = t.Policy // an instance key carries no policy: its template's applies
				p.Enable = false
			}
		}
	}
	a.Policy = p
	a.Scope = scopeOf(d, desired)
	a.Hash = d.Hash()
	if d.File == nil && IsInstance(name) {
		if t := desired[TemplateOf(name)]; t != nil {
			a.Hash = t.Hash()
		}
	}
	a.Effective = effective
	a.ContentKey = KeyOf(effective)
	if d.Instance && len(effective) == 0 {
		a.ContentKey = InstanceMarker
	}
	changed := a.Changes()
	if r, ok := cur.Refused[name]; ok && r.ContentKey == a.ContentKey {
		return blocked(a, r.Reason)
	}
	if rec.Failed != "" && rec.Failed == a.ContentKey {
		return blocked(a, rec.FailReason+"; not retried until the registry content changes")
	}
	applied := KeyOf(rec.Applied)
	// stale: the running unit is known to run other content than desired.
	stale := len(rec.Applied) > 0 && applied != a.ContentKey
	// A halted rollout: another host of the group failed this version.
	if h, ok := cur.Halts[name]; ok && a.Scope != "" && h.Scope == a.Scope && h.Hash == a.Hash && (changed || stale) {
		a.Kind, a.Err = KindWait, fmt.Sprintf("held: the rollout of %s is halted: %s failed it: %s", short(h.Hash), h.Host, h.Reason)
		a.Reason = a.Err
		a.Writes, a.Removes, a.Effective = nil, nil, nil
		return a
	}
	a.Enable = changed && p.Enable && p.HasInstall

	if IsTemplate(name) || p.State == StatePresent {
		if changed {
			a.Kind, a.Reason = KindUpdate, describe(a, cur)+"; State=present: not started or stopped"
		}
		return a
	}
	if p.State == StateStopped {
		switch {
		case st.Active():
			a.Kind, a.Reason = KindStop, "State=stopped and the unit is "+st.ActiveState
			if changed {
				a.Reason = describe(a, cur) + "; " + a.Reason
			}
		case changed:
			a.Kind, a.Reason = KindUpdate, describe(a, cur)+"; State=stopped"
		}
		return a
	}

	// State=started.
	if !st.Active() {
		switch {
		case changed || (stale && cur.Started[name] != a.ContentKey):
			a.Kind, a.Reason = KindStart, describe(a, cur)
			if !changed {
				a.Reason = "content changed while the unit was stopped"
			}
		case d.Instance && !isManaged[name]:
			a.Kind, a.Reason = KindStart, "new instance of "+TemplateOf(name)
		case !st.Ran && st.LoadState == "loaded" && cur.Started[name] != a.ContentKey:
			// Not run since the manager started (a boot, or the agent was
			// away): start it. A unit that ran and stopped or failed is left
			// as it is — an operator's stop is respected, and a crash is
			// systemd's Restart= to handle; both show in status.
			a.Kind, a.Reason = KindStart, "not started since the manager started"
		}
		return a
	}
	if !changed && !stale {
		return a
	}

	// An active unit whose content changes: the least disruption that is correct.
	oldFiles, newFiles := filesForClassify(name, rec, effective, d, desired, cur)
	c := Classify(name, oldFiles, newFiles)
	a.Change = &c
	what := describe(a, cur)
	if what == "" {
		what = "running an older version"
	}
	switch p.OnChange {
	case "restart":
		a.Kind, a.Reason = restartKind(name), what+"; OnChange=restart"
	case "reload":
		a.Kind, a.Reason = KindReload, what+"; OnChange=reload"
	case "reload-or-restart":
		if st.CanReload {
			a.Kind, a.Reason = KindReload, what+"; OnChange=reload-or-restart: the unit can reload"
		} else {
			a.Kind, a.Reason = KindRestart, what+"; OnChange=reload-or-restart: the unit cannot reload"
		}
	case "stop-start":
		a.Kind, a.Reason = KindStopStart, what+"; OnChange=stop-start"
	case "none":
		if changed {
			a.Kind, a.Reason = KindUpdate, what+"; OnChange=none: restart pending"
		}
		a.Effective = nil // the unit keeps running the old content
	default:
		a.Kind, a.Reason = autoKind(name, c)
		if c.Kind == ChangeInstall && p.HasInstall && p.Enable {
			a.Enable, a.Disable = true, true
		}
		if a.Kind == KindUpdate && !changed {
			a.Kind = KindNone // nothing to write: just record that it runs current content
		}
		a.Reason = what + "; " + a.Reason
	}
	if a.Kind == KindRestart && strings.HasSuffix(name, ".socket") {
		a.AlsoStop = []string{socketService(name, d)}
	}
	return a
}

// autoKind is OnChange=auto: the unit type and the classification decide.
func autoKind(name string, c Change) (Kind, string) {
	typ := name[strings.LastIndexByte(name, '.')+1:]
	switch c.Kind {
	case ChangeNone, ChangeCosmetic:
		return KindUpdate, "no effect on the running unit: daemon-reload only (" + c.Reason() + ")"
	case ChangeInstall:
		return KindUpdate, "[Install] only: daemon-reload and re-enable"
	}
	switch typ {
	case "slice":
		return KindUpdate, "a slice applies its settings on daemon-reload"
	case "target":
		return KindStart, "a target is started, never restarted"
	case "mount":
		if c.Kind == ChangeMountOpts {
			return KindReload, "only Options= changed: remount"
		}
		return KindRestart, c.Reason() + ": remount from scratch"
	case "service":
		if c.Kind == ChangeReload {
			return KindReload, c.Reason() + ": reload"
		}
		return KindRestart, c.Reason() + ": restart"
	case "socket":
		return KindRestart, c.Reason() + ": stop the socket and its service, start the socket"
	}
	return KindRestart, c.Reason() + ": restart"
}

func restartKind(name string) Kind {
	if strings.HasSuffix(name, ".target") {
		return KindStart
	}
	return KindRestart
}

// socketService is the service a socket activates: Service= or the same name.
func socketService(name string, d *DesiredUnit) string {
	if d != nil && d.File != nil {
		for _, kv := range iniEntries(d.File.Content) {
			if kv.sec == "Socket" && kv.key == "Service" && kv.val != "" {
				return kv.val
			}
		}
	}
	return strings.TrimSuffix(name, ".socket") + ".service"
}

// filesForClassify returns the old (what the unit runs) and new (desired)
// file sets. Old comes from the Applied record's blobs, falling back to
// what is on disk now.
func filesForClassify(name string, rec UnitRecord, effective map[string]string, d *DesiredUnit, desired map[string]*DesiredUnit, cur Current) (old, new []File) {
	content := func(path, hash string) ([]byte, bool) {
		if b, ok := cur.Blobs[hash]; ok {
			return b, true
		}
		if lf := cur.Files[path]; lf.Exists && lf.Hash == hash {
			return lf.Content, true
		}
		return nil, false
	}
	oldMap := rec.Applied
	if len(oldMap) == 0 {
		oldMap = map[string]string{}
		for p := range effective {
			if lf := cur.Files[p]; lf.Exists {
				oldMap[p] = lf.Hash
			}
		}
	}
	for _, p := range sortUnitFirst(oldMap) {
		b, ok := content(p, oldMap[p])
		if !ok { // unknown old content: compare against nothing → restart
			old = nil
			break
		}
		old = append(old, File{p, b})
	}
	byPath := map[string][]byte{}
	for _, f := range d.Files() {
		byPath[f.Path] = f.Content
	}
	if t := desired[TemplateOf(name)]; IsInstance(name) && t != nil {
		for _, f := range t.Files() {
			byPath[f.Path] = f.Content
		}
	}
	for _, p := range sortUnitFirst(effective) {
		if b, ok := byPath[p]; ok {
			new = append(new, File{p, b})
		} else if b, ok := content(p, effective[p]); ok {
			new = append(new, File{p, b})
		}
	}
	return old, new
}

// sortUnitFirst orders paths as systemd applies them: unit files before
// drop-ins, drop-ins by name.
func sortUnitFirst(m map[string]string) []string {
	ps := slices.Sorted(maps.Keys(m))
	slices.SortStableFunc(ps, func(a, b string) int {
		ad, bd := strings.Contains(a, ".d/"), strings.Contains(b, ".d/")
		switch {
		case ad == bd:
			if ad {
				return strings.Compare(a[strings.LastIndexByte(a, '/'):], b[strings.LastIndexByte(b, '/'):])
			}
			return 0
		case ad:
			return 1
		}
		return -1
	})
	return ps
}

func describe(a Action, cur Current) string {
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

func blocked(a Action, why string) Action {
	a.Kind = KindBlocked
	a.Err = why
	a.Writes, a.Removes, a.Enable, a.Disable, a.Effective = nil, nil, false, false, nil
	return a
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
