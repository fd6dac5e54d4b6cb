// Applying a change to a running unit: the kind of job (restart, reload,
// stop-start, none) a content change asks for, the files to classify it
// by, and the words that describe it.

package reconcile

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// planChange picks the least disruption for an active unit whose content
// changes.
func planChange(a *Action, st UnitState, changed bool, rec UnitRecord, d *DesiredUnit, desired map[string]*DesiredUnit, cur Current) {
	name, p := a.Unit, a.Policy
	oldFiles, newFiles := filesForClassify(name, rec, a.Record.Effective, d, desired, cur)
	if len(rec.Applied) == 0 && cur.Memory.Intent.Jobs[name] == a.ContentKey {
		// An interrupted pass wrote these files; what the unit runs is
		// unknown: compare against nothing, i.e. restart.
		oldFiles = nil
	}
	c := Classify(name, oldFiles, newFiles)
	a.Change = &c
	what := describe(*a, rec, cur)
	canReload := CanReload(name, newFiles)
	switch p.OnChange {
	case "restart":
		a.Kind, a.Reason = restartKind(name), what+"; OnChange=restart"
	case "reload":
		if canReload {
			a.Kind, a.Reason = KindReload, what+"; OnChange=reload"
		} else {
			// Never a silent restart: write the files, keep the unit on its
			// old version, and say so.
			a.Kind, a.Reason = KindUpdate, what+"; OnChange=reload"
			a.Err = fmt.Sprintf("reload %s: the new version cannot reload (no ExecReload=); not restarting it silently — use OnChange=reload-or-restart or restart", name)
			a.Record.Effective = nil
		}
	case "reload-or-restart":
		if canReload {
			a.Kind, a.Reason = KindReload, what+"; OnChange=reload-or-restart: the unit can reload"
		} else {
			a.Kind, a.Reason = KindRestart, what+"; OnChange=reload-or-restart: the unit cannot reload"
		}
	case "stop-start":
		a.Kind, a.Reason = KindStopStart, what+"; OnChange=stop-start: stopping with the old definition first"
		// The new files are written once the old version is down (next pass).
		a.Steps.Writes, a.Steps.Removes, a.Steps.Enable, a.Steps.Disable, a.Record.Effective = nil, nil, false, false, nil
		a.Steps.Job = JobStop
		return
	case "none":
		if changed {
			a.Kind, a.Reason = KindUpdate, what+"; OnChange=none: restart pending"
		}
		a.Record.Effective = nil // the unit keeps running the old content
	default:
		a.Kind, a.Reason = autoKind(name, c)
		if a.Kind == KindReload && !canReload {
			a.Kind, a.Reason = KindRestart, c.Reason()+": the new version cannot reload, restart"
		}
		if c.Kind == ChangeInstall && a.Own == OwnFile && p.HasInstall && p.Enable {
			a.Steps.Enable, a.Steps.Disable = true, true
		}
		if a.Kind == KindUpdate && !changed {
			a.Kind = KindNone // nothing to write: just record that it runs current content
		}
		if a.Kind == KindUpdate && !a.changesUnitFiles() {
			a.Reason = "config files only, no daemon-reload, no job (" + c.Reason() + ")"
		}
		a.Reason = what + "; " + a.Reason
	}
	a.Steps.Job = jobOf(a.Kind)
	if a.Kind == KindRestart && strings.HasSuffix(name, ".socket") {
		if svc := socketService(name, d); svc != "" {
			a.Steps.AlsoStop = []string{svc}
		}
	}
}

// planForeign applies drop-ins on a unit the agent did not install: it is
// never started, stopped, enabled or disabled; an active one gets the change
// like any other (restart, reload or nothing, as the change needs).
//
// A unit systemd does not have (LoadState not-found: no unit file in any
// of its directories — unlike a vendor unit in /usr/lib, which is loaded)
// gets its drop-ins written and no job: starting, restarting or reloading
// it could only end in "Unit … not found".
func planForeign(a *Action, st UnitState, changed, stale bool, rec UnitRecord, d *DesiredUnit, desired map[string]*DesiredUnit, cur Current) {
	a.Steps.Enable, a.Steps.Disable = false, false
	switch {
	case st.LoadState == "not-found":
		a.Record.Effective = nil // it runs none of them: nothing to record or adopt
		if changed {
			a.Kind, a.Reason = KindUpdate, describe(*a, rec, cur)+"; drop-ins on "+a.Unit+", which systemd does not have (not-found): written, no job"
		}
	case st.Active() && (changed || stale):
		p := a.Policy
		note := " (drop-ins on a unit agentd did not install)"
		if p.OnChange == "stop-start" {
			a.Policy.OnChange = "restart" // never stop a unit that is not ours
			note = " (OnChange=stop-start becomes a restart: the unit is not agentd's, it is never stopped)"
		}
		planChange(a, st, changed, rec, d, desired, cur)
		a.Policy = p
		a.Reason += note
	case changed:
		a.Kind, a.Reason = KindUpdate, describe(*a, rec, cur)+"; drop-ins on a unit agentd did not install, which is "+st.ActiveState+": not started"
	}
}

func jobOf(k Kind) Job {
	switch k {
	case KindStart:
		return JobStart
	case KindRestart:
		return JobRestart
	case KindReload:
		return JobReload
	case KindStop, KindStopStart:
		return JobStop
	}
	return JobNone
}

// waiting turns an action into a wait on what on says: nothing is
// written, run or adopted.
func waiting(a Action, on Wait, why string) Action {
	a.Kind, a.Reason, a.Gate = KindWait, why, Gate{On: on}
	a.Steps, a.Record.Adopt = Steps{}, false
	return a
}

// CanReload says whether the new version of a unit can reload in place:
// a service with an ExecReload= (the last assignment wins; an empty one
// resets the list), a mount (remount). Judged from the files, so the plan
// is right even before the daemon-reload that loads them.
func CanReload(name string, files []File) bool {
	switch name[strings.LastIndexByte(name, '.')+1:] {
	case "mount":
		return true
	case "service":
	default:
		return false
	}
	has := false
	for _, f := range files {
		if IsConfigPath(f.Path) {
			continue
		}
		for _, kv := range iniEntries(f.Content) {
			if kv.sec == "Service" && kv.key == "ExecReload" {
				has = kv.val != ""
			}
		}
	}
	return has
}

// autoKind is OnChange=auto: the unit type and the classification decide.
func autoKind(name string, c Change) (Kind, string) {
	typ := name[strings.LastIndexByte(name, '.')+1:]
	switch c.Kind {
	case ChangeNone, ChangeCosmetic:
		return KindUpdate, "daemon-reload only (" + c.Reason() + ")"
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

// socketService is the service a socket activates: Service= or the same
// name. A Service= naming a unit the agent must never touch (the bus, its
// own unit, ...) or an invalid name yields "": that service is left alone.
func socketService(name string, d *DesiredUnit) string {
	svc := strings.TrimSuffix(name, ".socket") + ".service"
	if d != nil && d.File != nil {
		for _, kv := range iniEntries(d.File.Content) {
			if kv.sec == "Socket" && kv.key == "Service" && kv.val != "" {
				svc = kv.val
			}
		}
	}
	if ValidateUnitName(svc) != nil {
		return ""
	}
	return svc
}

// filesForClassify returns the old (what the unit runs) and new (desired)
// file sets. Old comes from the Applied record's blobs, falling back to
// what is on disk now.
func filesForClassify(name string, rec UnitRecord, effective map[string]string, d *DesiredUnit, desired map[string]*DesiredUnit, cur Current) (old, new []File) {
	content := func(path, hash string) ([]byte, bool) {
		if b, ok := cur.Memory.Blobs[hash]; ok {
			return b, true
		}
		if lf := cur.Host.Files[path]; lf.Exists && lf.Hash == hash {
			return lf.Content, true
		}
		return nil, false
	}
	oldMap := rec.Applied
	if len(oldMap) == 0 {
		oldMap = map[string]string{}
		for p := range effective {
			if lf := cur.Host.Files[p]; lf.Exists {
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
	for _, f := range d.VersionFiles() {
		byPath[f.Path] = f.Content
	}
	if t := desired[TemplateOf(name)]; IsInstance(name) && t != nil {
		for _, f := range t.Files() {
			if effective[f.Path] == f.Hash { // not the set put back after a failure (backToOld): that one is kept
				byPath[f.Path] = f.Content
			}
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

// describe says what differs: the files being written or removed, else
// (the files are already in place) how the version the unit runs differs
// from the one it should run.
func describe(a Action, rec UnitRecord, cur Current) string {
	var parts []string
	for _, f := range a.Steps.Writes {
		old := cur.Host.Files[f.Path]
		oldHash := short(old.Hash)
		if f.Sealed != "" {
			oldHash = "a secret" // the hash of what is on disk is never shown
		}
		if old.Exists {
			parts = append(parts, fmt.Sprintf("%s changed (%s → %s)", f.Path, oldHash, short(f.Shown())))
		} else {
			parts = append(parts, fmt.Sprintf("%s new (%s)", f.Path, short(f.Shown())))
		}
	}
	for _, r := range a.Steps.Removes {
		parts = append(parts, r+" removed")
	}
	if len(parts) == 0 {
		for _, p := range slices.Sorted(maps.Keys(a.Record.Effective)) {
			switch old, ok := rec.Applied[p]; {
			case !ok:
				parts = append(parts, fmt.Sprintf("%s new (%s)", p, short(a.Record.Effective[p])))
			case old != a.Record.Effective[p]:
				parts = append(parts, fmt.Sprintf("%s changed (%s → %s)", p, short(old), short(a.Record.Effective[p])))
			}
		}
		for _, p := range slices.Sorted(maps.Keys(rec.Applied)) {
			if _, ok := a.Record.Effective[p]; !ok {
				parts = append(parts, p+" removed")
			}
		}
	}
	if len(parts) == 0 {
		return "running an older version"
	}
	return strings.Join(parts, ", ")
}

func blocked(a Action, why string) Action {
	a.Kind, a.Err, a.Gate = KindBlocked, why, Gate{}
	a.Steps, a.Record.Effective, a.Record.Adopt = Steps{}, nil, false
	return a
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// ranToCompletion: a Type=oneshot unit without RemainAfterExit= whose
// current content the agent already saw run to completion (its record's
// good version). Such a unit goes back to inactive, and systemd may unload
// it and forget that it ran (Ran false): started again, it would run its
// job a second time on every restart of the agent.
func ranToCompletion(st UnitState, rec UnitRecord, key string) bool {
	return st.Type == "oneshot" && !st.RemainAfterExit && len(rec.Good) > 0 && KeyOf(rec.Good) == key
}
