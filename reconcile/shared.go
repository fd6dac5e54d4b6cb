package reconcile

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// A config file that several units read (a TLS certificate, an environment
// file) has one writer: the unit whose set holds its key. Another unit's
// RestartTriggers= or ReloadTriggers= may name it: the file then belongs
// to that unit's version too (DesiredUnit.Reads), so one change of it
// writes it once and restarts or reloads every unit whose trigger names
// it, in one pass. Two keys that would write one path are a conflict: the
// later one (by key revision) is blocked, naming the first.

func hasConfigFiles(u *DesiredUnit) bool {
	for p := range u.DropIns {
		if IsConfigPath(p) {
			return true
		}
	}
	return false
}

// triggersOf is every path p's RestartTriggers= and ReloadTriggers= name.
func triggersOf(p Policy) []string {
	if p.RestartTriggers == "" && p.ReloadTriggers == "" {
		return nil
	}
	return append(strings.Fields(p.RestartTriggers), strings.Fields(p.ReloadTriggers)...)
}

// writer is a unit whose own set holds a config file, and that file.
type writer struct {
	unit string
	file DesiredFile
}

// firstWriter of several is the one whose key came first (lowest
// revision; by unit name when equal): it keeps the path.
func firstWriter(ws []writer) writer {
	return slices.MinFunc(ws, func(x, y writer) int {
		return cmp.Or(cmp.Compare(x.file.Revision, y.file.Revision), strings.Compare(x.unit, y.unit))
	})
}

// linkUnit is u with what it reads of other units' sets (Reads), or
// blocked: when a config file of its set is a path an earlier key of
// another unit writes, or when a trigger names a path no unit's set
// holds. u itself when there is nothing to link.
func linkUnit(u *DesiredUnit, writers map[string][]writer) *DesiredUnit {
	var reads map[string]DesiredFile
	var err error
	for _, p := range slices.Sorted(maps.Keys(u.DropIns)) {
		_, dest, ok := ConfigDest(p)
		if !ok {
			continue
		}
		if first := firstWriter(writers[dest]); first.unit != u.Name {
			err = fmt.Errorf("%s: %s is written by %s already (revision %d): a path has one writer; name it in %s's RestartTriggers= or ReloadTriggers= instead of putting it again",
				p, dest, first.file.Path, first.file.Revision, u.Name)
			break
		}
	}
	for _, t := range []struct{ key, paths string }{{"RestartTriggers", u.Policy.RestartTriggers}, {"ReloadTriggers", u.Policy.ReloadTriggers}} {
		for _, dest := range strings.Fields(t.paths) {
			if err != nil {
				break
			}
			if _, own := u.DropIns[ConfigKey(u.Name, dest)]; own {
				continue
			}
			ws := writers[dest]
			if len(ws) == 0 {
				err = fmt.Errorf("[X-Agentd] %s= names %s, which is not a file of %s's set nor of another unit's on this host (put it with the unit: agentd unit put --file %s=SRC)", t.key, dest, u.Name, dest)
				break
			}
			if reads == nil {
				reads = map[string]DesiredFile{}
			}
			w := firstWriter(ws)
			reads[w.file.Path] = w.file
		}
	}
	if err == nil && reads == nil {
		return u
	}
	linked := *u
	if err != nil {
		linked.Err, linked.Reads = err, nil
	} else {
		linked.Reads = reads
	}
	return &linked
}

// holdReaders makes a unit that would restart or reload onto a file of
// another unit's set (Reads) wait while that file is neither on disk at
// the version it wants nor written by this plan: the writer may be held
// (a rollout slot, a halt), and a reader that ran before the file was in
// place would count as running it.
func holdReaders(plan []Action, desired map[string]*DesiredUnit, cur Current) {
	written := map[string]string{}
	for _, a := range plan {
		for _, w := range a.Steps.Writes {
			written[w.Path] = w.Shown()
		}
	}
	for i, a := range plan {
		if a.Steps.Job == JobNone || a.Steps.Job == JobStop {
			continue
		}
		for _, p := range slices.Sorted(maps.Keys(a.Record.Effective)) {
			h := a.Record.Effective[p]
			if !readsOnly(a.Unit, p) || written[p] == h {
				continue
			}
			if w := desired[UnitOfPath(p)]; w != nil {
				if f, ok := w.DropIns[p]; ok && f.Shown() == h && cur.Host.Files[p].Exists && cur.Host.Files[p].Hash == f.Hash {
					continue
				}
			}
			_, dest, _ := ConfigDest(p)
			plan[i] = waiting(a, WaitWriter, fmt.Sprintf("waiting for %s to write %s (%s) before it can %s", UnitOfPath(p), dest, short(h), a.Reason))
			break
		}
	}
}

// readsOnly says path is a config file of another unit's set that unit
// reads (Reads): its rollback or removal never writes or deletes it, the
// file's own unit does.
func readsOnly(unit, path string) bool {
	owner := UnitOfPath(path)
	return IsConfigPath(path) && owner != unit && !(IsInstance(unit) && owner == TemplateOf(unit))
}

// PathWriters is the put-time form of the one-writer rule: of keys (key
// suffixes of one target), the config files that write a path another key
// writes too, by path. Empty when every path has one writer.
func PathWriters(keys []string) map[string][]string {
	byDest := map[string][]string{}
	for _, k := range keys {
		if _, dest, ok := ConfigDest(k); ok {
			byDest[dest] = append(byDest[dest], k)
		}
	}
	for dest, ks := range byDest {
		if len(ks) < 2 {
			delete(byDest, dest)
		} else {
			slices.Sort(ks)
		}
	}
	return byDest
}
