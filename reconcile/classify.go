package reconcile

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// ChangeKind is what a content change means for a running unit, judged by
// comparing the parsed options of the old and new files (drop-ins included),
// never their bytes.
type ChangeKind int

const (
	ChangeNone      ChangeKind = iota // identical bytes
	ChangeCosmetic                    // no difference in effect: daemon-reload only
	ChangeInstall                     // only [Install]: daemon-reload and re-enable
	ChangeReload                      // only ExecReload= or X-Reload-Triggers= keys: reload
	ChangeMountOpts                   // a .mount whose only change is Options=: reload (remount)
	ChangeRestart                     // anything else: restart
)

var changeNames = [...]string{"none", "cosmetic", "install", "reload", "mount-options", "restart"}

func (c ChangeKind) String() string { return changeNames[c] }

// Change is the classification of one unit's content change.
type Change struct {
	Kind ChangeKind
	// Keys lists the "[Section] Key" options that differ in effect, sorted.
	Keys []string
	// Note explains a conservative choice (e.g. a file that did not parse).
	Note string
}

// Reason renders the change for status and logs.
func (c Change) Reason() string {
	switch {
	case c.Note != "":
		return c.Note
	case c.Kind == ChangeNone:
		return "no change"
	case c.Kind == ChangeCosmetic && len(c.Keys) == 0:
		return "only comments, whitespace or order changed"
	case c.Kind == ChangeCosmetic:
		return "only " + strings.Join(c.Keys, ", ") + " changed, which does not affect the running unit"
	}
	return strings.Join(c.Keys, ", ") + " changed"
}

// inertUnitKeys are [Unit] options that do not affect the running process.
var inertUnitKeys = map[string]bool{
	"Description": true, "Documentation": true, "OnFailure": true, "OnSuccess": true,
	"OnFailureJobMode": true, "OnSuccessJobMode": true, "IgnoreOnIsolate": true, "StopWhenUnneeded": true,
	"RefuseManualStart": true, "RefuseManualStop": true, "AllowIsolate": true, "CollectMode": true,
	"SourcePath": true,
}

// File is one file of a unit: the unit file or a drop-in.
type File struct {
	Path    string
	Content []byte
}

// Classify compares old and new versions of a unit (unit file first, then
// drop-ins in path order, as systemd applies them). Pure. A file the parser
// cannot read (systemd accepts a few things go-systemd does not) is
// classified as a restart: the safe choice, never a rejection.
func Classify(name string, old, new []File) Change {
	if sameFiles(old, new) {
		return Change{Kind: ChangeNone}
	}
	old, oldConf := splitConfig(old)
	new, newConf := splitConfig(new)
	oldOpts, err1 := parseOptions(old)
	newOpts, err2 := parseOptions(new)
	if err := firstErr(err1, err2); err != nil {
		return Change{Kind: ChangeRestart, Note: "could not compare options (" + err.Error() + "); restarting to be safe"}
	}
	triggers := reloadTriggers(newOpts)
	restartOn, reloadOn := fileTriggers(newOpts, "RestartTriggers"), fileTriggers(newOpts, "ReloadTriggers")
	var diff []optKey
	for _, k := range unionKeys(oldOpts, newOpts) {
		if !slices.Equal(oldOpts[k], newOpts[k]) {
			diff = append(diff, k)
		}
	}
	var effective, inert []string
	allInstall, allReload, allMountOpts := true, true, true
	for _, k := range diff {
		label := k.String()
		if k.section == "Service" && k.name == "ExecReload" && (len(resetList(oldOpts[k])) == 0) != (len(resetList(newOpts[k])) == 0) {
			// Adding or removing ExecReload= changes only what a later
			// reload does: the running process is not affected.
			inert = append(inert, label+" (added or removed)")
			continue
		}
		if strings.HasPrefix(k.section, "X-") || strings.HasPrefix(k.name, "X-") || (k.section == "Unit" && inertUnitKeys[k.name]) {
			inert = append(inert, label)
			continue
		}
		effective = append(effective, label)
		allInstall = allInstall && k.section == "Install"
		allReload = allReload && (k.name == "ExecReload" || triggers[k.name] || triggers[k.section+"."+k.name])
		allMountOpts = allMountOpts && k.section == "Mount" && k.name == "Options"
	}
	for _, dest := range changedConfig(oldConf, newConf) {
		switch {
		case restartOn[dest]:
			effective = append(effective, "file "+dest+" (RestartTriggers=)")
			allInstall, allReload, allMountOpts = false, false, false
		case reloadOn[dest]:
			effective = append(effective, "file "+dest+" (ReloadTriggers=)")
			allInstall, allMountOpts = false, false
		default:
			inert = append(inert, "file "+dest+" (no trigger names it)")
		}
	}
	switch {
	case len(effective) == 0:
		return Change{Kind: ChangeCosmetic, Keys: inert}
	case allInstall:
		return Change{Kind: ChangeInstall, Keys: effective}
	case allMountOpts && strings.HasSuffix(name, ".mount"):
		return Change{Kind: ChangeMountOpts, Keys: effective}
	case allReload:
		return Change{Kind: ChangeReload, Keys: effective}
	}
	return Change{Kind: ChangeRestart, Keys: effective}
}

// resetList applies systemd's list semantics: an empty assignment clears
// what came before.
func resetList(vals []string) []string {
	var out []string
	for _, v := range vals {
		if v == "" {
			out = nil
			continue
		}
		out = append(out, v)
	}
	return out
}

type optKey struct{ section, name string }

func (k optKey) String() string { return "[" + k.section + "] " + k.name }

func sameFiles(a, b []File) bool {
	return slices.EqualFunc(a, b, func(x, y File) bool { return x.Path == y.Path && bytes.Equal(x.Content, y.Content) })
}

func parseOptions(files []File) (map[optKey][]string, error) {
	opts := map[optKey][]string{}
	for _, f := range files {
		parsed, err := unitOptions(f.Content)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
		for _, o := range parsed {
			k := optKey{o.Section, o.Name}
			opts[k] = append(opts[k], o.Value)
		}
	}
	return opts, nil
}

// reloadTriggers reads X-Reload-Triggers= (any section, space-separated
// option names, optionally "Section.Name"): changes to those options only
// need a reload, e.g. a config path the service re-reads on SIGHUP.
func reloadTriggers(opts map[optKey][]string) map[string]bool {
	t := map[string]bool{}
	for k, vs := range opts {
		if k.name != "X-Reload-Triggers" {
			continue
		}
		for _, v := range vs {
			for _, f := range strings.Fields(v) {
				t[f] = true
			}
		}
	}
	return t
}

// splitConfig separates the config files of a set (configfile.go), which
// systemd never reads, from its unit file and drop-ins.
func splitConfig(files []File) (unitFiles []File, config map[string][]byte) {
	for _, f := range files {
		if _, dest, ok := ConfigDest(f.Path); ok {
			if config == nil {
				config = map[string][]byte{}
			}
			config[dest] = f.Content
			continue
		}
		unitFiles = append(unitFiles, f)
	}
	return unitFiles, config
}

// changedConfig are the config files added, removed or changed, sorted.
func changedConfig(old, new map[string][]byte) []string {
	var ds []string
	for d, b := range new {
		if ob, ok := old[d]; !ok || !bytes.Equal(ob, b) {
			ds = append(ds, d)
		}
	}
	for d := range old {
		if _, ok := new[d]; !ok {
			ds = append(ds, d)
		}
	}
	slices.Sort(ds)
	return ds
}

// fileTriggers reads [X-Agentd] RestartTriggers= or ReloadTriggers= (a
// list: an empty assignment clears it) as a set of paths.
func fileTriggers(opts map[optKey][]string, key string) map[string]bool {
	t := map[string]bool{}
	for _, v := range resetList(opts[optKey{"X-Agentd", key}]) {
		for _, f := range strings.Fields(v) {
			t[f] = true
		}
	}
	return t
}

func unionKeys(a, b map[optKey][]string) []optKey {
	seen := map[optKey]bool{}
	var ks []optKey
	for _, m := range []map[optKey][]string{a, b} {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				ks = append(ks, k)
			}
		}
	}
	slices.SortFunc(ks, func(x, y optKey) int {
		if c := strings.Compare(x.section, y.section); c != 0 {
			return c
		}
		return strings.Compare(x.name, y.name)
	})
	return ks
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
