package reconcile

import (
	"bytes"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
)

// DesiredFile is one file the registry wants in the unit directory.
type DesiredFile struct {
	Path    string // the key suffix: "x.service", "x.service.d/y.conf" (both in the unit directory) or "x.service.files/etc/x/y.conf"
	Content []byte
	Hash    string
	Source  string // "host" or "group:<name>"
	// Revision is the registry revision that wrote the key (0 for a file
	// the agent restores, which no key holds).
	Revision int64
	// Sealed, for a secret (ConfigFile.Secret), is the hash of the
	// registry's value, the ciphertext: what statuses and logs show of
	// it. Content and Hash are then the file as written on disk, known
	// only inside the agent: a hash of a short password is a password.
	Sealed string
}

// Shown is the hash of f that may be published or logged.
func (f DesiredFile) Shown() string {
	if f.Sealed != "" {
		return f.Sealed
	}
	return f.Hash
}

// DesiredUnit is everything the registry says about one unit on this host.
type DesiredUnit struct {
	Name    string
	File    *DesiredFile           // the unit file itself; nil for an instance key or drop-ins only
	DropIns map[string]DesiredFile // by path: the drop-ins and the config files (configfile.go)
	// Reads are the config files of other units of this host that its
	// RestartTriggers= or ReloadTriggers= name (by key, as in DropIns):
	// part of the version it runs, so their change restarts or reloads
	// it, and written only by the unit whose set holds them (shared.go).
	Reads    map[string]DesiredFile
	Instance bool // an empty-valued instance key: run Name from its template
	Policy   Policy
	// Err, when set, blocks the unit: it is reported and nothing is applied.
	// A change not signed as --allowed-signers asks is a *RefusedError.
	Err error
	// Signed says how each of its keys passed the signature check (only
	// with Config.Trust): who signed what, for the journal.
	Signed []SignedKey
}

// Files returns the unit's files sorted by path.
func (u *DesiredUnit) Files() []DesiredFile {
	if len(u.DropIns) == 0 { // most units; it runs per unit per pass
		if u.File == nil {
			return nil
		}
		return []DesiredFile{*u.File}
	}
	var fs []DesiredFile
	if u.File != nil {
		fs = append(fs, *u.File)
	}
	for _, p := range slices.Sorted(maps.Keys(u.DropIns)) {
		fs = append(fs, u.DropIns[p])
	}
	return fs
}

// VersionFiles are Files and Reads, sorted by path: every file the unit
// runs on, the ones it writes and the ones of other units it reads.
func (u *DesiredUnit) VersionFiles() []DesiredFile {
	fs := u.Files()
	if len(u.Reads) == 0 {
		return fs
	}
	for _, p := range slices.Sorted(maps.Keys(u.Reads)) {
		fs = append(fs, u.Reads[p])
	}
	slices.SortFunc(fs, func(x, y DesiredFile) int { return strings.Compare(x.Path, y.Path) })
	return fs
}

// UnitFiles are the files systemd reads: Files without the config files.
func (u *DesiredUnit) UnitFiles() []DesiredFile {
	fs := u.Files()
	return slices.DeleteFunc(fs, func(f DesiredFile) bool { return IsConfigPath(f.Path) })
}

// Hash is the hash of the unit file ("" when the registry has none).
func (u *DesiredUnit) Hash() string {
	if u.File == nil {
		return ""
	}
	return u.File.Hash
}

// Desire turns a registry snapshot into the desired units of this host:
// it validates every key and value, lets a host key override group keys,
// and blocks a unit that two groups define differently. Pure.
//
// A secret stays sealed there (its ciphertext is its content): the CLI's
// previews compare it with what hosts report of it, its sealed hash.
func Desire(s Snapshot) map[string]*DesiredUnit {
	d := desiredState{sealed: true}
	d.update(s)
	return d.units
}

// desiredState is Desire kept up to date from snapshot to snapshot at the
// cost of what changed: the keys are compared with the last snapshot's
// (DiffEntries: a key comparison per unchanged key) and only the units of
// changed keys are validated and built again, each from its own keys.
// Validation, hashing and policy parsing were nearly all of Desire's work
// (4 µs per unit at 5,000 units, on every registry change). Loop-owned.
type desiredState struct {
	entries []Entry            // the last snapshot's, sorted
	byUnit  map[string][]Entry // the same, by the unit they are for, sorted
	units   map[string]*DesiredUnit
	// base holds each unit as its own keys make it; units the same
	// linked to the others (link: what it reads of them, a path two
	// units write). Most units are the same pointer in both.
	base map[string]*DesiredUnit
	// linking holds the units of base with config files or triggers:
	// the only ones link looks at.
	linking map[string]bool
	// trust checks the signatures (trust.go); nil: not asked for.
	trust *trustState
	// secrets opens the config files put with --secret (Config.Secrets);
	// with sealed, they are kept as their ciphertext (Desire, for
	// previews); with neither, a secret is the unit's error.
	secrets Decrypter
	sealed  bool
}

// desiredChange is a unit whose keys changed: old or now is nil when the
// unit came or went.
type desiredChange struct {
	name     string
	old, now *DesiredUnit
}

// update takes in a new snapshot and returns the units whose keys changed,
// in name order.
func (d *desiredState) update(s Snapshot) []desiredChange {
	if d.units == nil {
		d.byUnit, d.units = map[string][]Entry{}, map[string]*DesiredUnit{}
		d.base, d.linking = map[string]*DesiredUnit{}, map[string]bool{}
	}
	now := SortedEntries(s.Entries)
	dirty := map[string]bool{}
	indexByUnit(d.byUnit, d.entries, now, dirty)
	d.entries = now
	if d.trust != nil {
		d.trust.update(s.Signatures, dirty)
	}
	changes := make([]desiredChange, 0, len(dirty))
	for _, name := range slices.Sorted(maps.Keys(dirty)) {
		c := desiredChange{name: name, old: d.units[name]}
		es := d.byUnit[name]
		if len(es) > 0 {
			c.now = d.desireUnit(name, es)
		}
		if d.trust != nil {
			c.now = d.trust.check(name, es, c.now)
		}
		if c.now != nil {
			d.units[name], d.base[name] = c.now, c.now
		} else {
			delete(d.units, name)
			delete(d.base, name)
		}
		d.noteLinking(name, c.now)
		if c.old == nil && c.now == nil {
			continue // a signature record of nothing this host runs
		}
		changes = append(changes, c)
	}
	return d.link(changes)
}

// noteLinking keeps d.linking up to date for unit name, now built as u.
func (d *desiredState) noteLinking(name string, u *DesiredUnit) {
	if u != nil && u.Err == nil && (hasConfigFiles(u) || triggersOf(u.Policy) != nil) {
		d.linking[name] = true
	} else {
		delete(d.linking, name)
	}
}

// link makes d.units the units of d.base linked to each other (see
// linkUnit), and adds to changes every unit whose linked form changed
// although its own keys did not (the reader of a file that changed). Its
// cost is that of the units with config files or triggers.
func (d *desiredState) link(changes []desiredChange) []desiredChange {
	if len(d.linking) == 0 {
		return changes
	}
	writers := map[string][]writer{}
	for name := range d.linking {
		u := d.base[name]
		for p, f := range u.DropIns {
			if _, dest, ok := ConfigDest(p); ok {
				writers[dest] = append(writers[dest], writer{name, f})
			}
		}
	}
	at := make(map[string]int, len(changes))
	for i, c := range changes {
		at[c.name] = i
	}
	added := false
	for _, name := range slices.Sorted(maps.Keys(d.linking)) {
		now := linkUnit(d.base[name], writers)
		old := d.units[name]
		if now == old {
			continue
		}
		d.units[name] = now
		if i, ok := at[name]; ok {
			changes[i].now = now
			continue
		}
		if !sameDesired(old, now) {
			changes = append(changes, desiredChange{name: name, old: old, now: now})
			added = true
		}
	}
	if added {
		slices.SortFunc(changes, func(x, y desiredChange) int { return strings.Compare(x.name, y.name) })
	}
	return changes
}

// keyUnit is the unit a registry key is for; an invalid key stands for a
// unit of its own, named (and blocked) under StatusName.
func keyUnit(key string) string {
	_, unit, err := ParseKey(key)
	if err != nil {
		return StatusName(key)
	}
	return unit
}

// desireUnit builds one unit from its keys (sorted: the host key first,
// then the groups' in name order).
func (d *desiredState) desireUnit(name string, es []Entry) *DesiredUnit {
	u := &DesiredUnit{Name: name, DropIns: map[string]DesiredFile{}}
	block := func(err error) {
		if u.Err == nil {
			u.Err = err
		}
	}
	byPath := map[string][]Entry{}
	for _, e := range es {
		path, _, err := ParseKey(e.Unit)
		if err != nil {
			block(err)
			continue
		}
		byPath[path] = append(byPath[path], e)
	}
	for _, path := range slices.Sorted(maps.Keys(byPath)) {
		cs := byPath[path]
		// A host key wins over every group key for the same path.
		e := cs[0]
		if e.Scope != ScopeHost {
			var groups []string
			conflict := false
			for _, c := range cs {
				groups = append(groups, c.Group)
				conflict = conflict || !bytes.Equal(c.Value, e.Value)
			}
			if conflict {
				block(fmt.Errorf("conflict: groups %s give different content for %s; nothing applied",
					strings.Join(dedupe(groups), ", "), path))
				continue
			}
		}
		source := "host"
		if e.Scope == ScopeGroup {
			source = "group:" + e.Group
		}
		if len(e.Value) == 0 {
			if path == u.Name && IsInstance(u.Name) {
				u.Instance = true
				continue
			}
			block(fmt.Errorf("%s: empty value (only a template instance such as foo@1.service may be empty)", path))
			continue
		}
		if err := checkValue(u.Name, path, e.Value); err != nil {
			block(fmt.Errorf("%s: %w", path, err))
			continue
		}
		f := DesiredFile{Path: path, Content: e.Value, Hash: Hash(e.Value), Source: source, Revision: e.ModRevision}
		if err := d.open(&f); err != nil {
			block(err)
			continue
		}
		if path == u.Name {
			u.File = &f
		} else {
			u.DropIns[path] = f
		}
	}
	if u.Err != nil {
		return u
	}
	var unitFile []byte
	var dropIns [][]byte
	if u.File != nil {
		unitFile = u.File.Content
	}
	for _, f := range u.UnitFiles() {
		dropIns = append(dropIns, f.Content) // the unit file too, unused when there is one
	}
	p, err := ParsePolicy(policySource(unitFile, dropIns))
	if err != nil {
		u.Err = err
		return u
	}
	if p.Probe.Cmd != "" && len(u.DropIns) > 0 {
		// HealthCmd= runs as the unit does: drop-ins may set User=.
		var all [][]byte
		for _, f := range u.UnitFiles() {
			all = append(all, f.Content)
		}
		p.Probe.User, p.Probe.Group = serviceCreds(all...)
	}
	u.Policy = p // its triggers are checked against every unit's set (link)
	return u
}

// open decrypts f when it is a secret: its content becomes the file as
// it is to be on disk, its hash that file's, and Sealed the ciphertext's
// hash (see DesiredFile.Sealed). The plaintext lives only in memory, and
// on disk where the unit's set puts it.
func (d *desiredState) open(f *DesiredFile) error {
	if !IsConfigPath(f.Path) || !bytes.Contains(f.Content[:bytes.IndexByte(f.Content, '\n')+1], []byte(" "+secretTag+" ")) {
		return nil
	}
	cf, err := DecodeConfigFile(f.Content)
	if err != nil || !cf.Secret {
		return nil // checked with the value: not a secret
	}
	sealed := f.Hash
	switch {
	case d.sealed:
		f.Sealed = sealed
		return nil
	case d.secrets == nil:
		return fmt.Errorf("%s: a secret, and this agent has no identity to decrypt it with", f.Path)
	}
	plain, err := d.secrets.Decrypt(cf.Content)
	if err != nil {
		return fmt.Errorf("%s: cannot decrypt: %w (encrypted to %s; run agentd secrets rekey for its target)", f.Path, err, strings.Join(cf.To, ", "))
	}
	f.Content = ConfigFile{Mode: cf.Mode, Owner: cf.Owner, Content: plain}.Encode()
	f.Hash, f.Sealed = Hash(f.Content), sealed
	return nil
}

// policySource is what a unit's policy is read from: its unit file, else
// its drop-ins (in path order) together.
func policySource(unitFile []byte, dropIns [][]byte) []byte {
	if unitFile != nil {
		return unitFile
	}
	var src []byte
	for _, b := range dropIns {
		src = append(src, b...)
		src = append(src, '\n')
	}
	return src
}

// PolicyOf is the policy of unit as the agent reads it from keys (key
// suffix → content, as a put gives them): from its unit file, else from its
// drop-ins. Other units' keys and config files are ignored.
func PolicyOf(unit string, keys map[string][]byte) (Policy, error) {
	var dropIns [][]byte
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if k != unit && UnitOfPath(k) == unit && !IsConfigPath(k) {
			dropIns = append(dropIns, keys[k])
		}
	}
	return ParsePolicy(policySource(keys[unit], dropIns))
}

// StatusName is the name an invalid registry key is reported under: escaped
// so that a hostile key cannot shape the status key ("/" and ".." never
// survive), yet still recognisable to the operator who wrote it.
func StatusName(key string) string {
	return strings.ReplaceAll(url.PathEscape(key), "..", "%2E%2E")
}

func dedupe(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// indexByUnit applies the difference between the sorted entries old and
// now to byUnit (each unit's entries, sorted) and marks the units it
// touched in dirty.
func indexByUnit(byUnit map[string][]Entry, old, now []Entry, dirty map[string]bool) {
	DiffEntries(old, now, func(e Entry, gone bool) {
		name := keyUnit(e.Unit)
		dirty[name] = true
		es := byUnit[name]
		i, found := slices.BinarySearchFunc(es, e, CompareEntries)
		switch {
		case gone:
			es = slices.Delete(es, i, i+1)
		case found:
			es[i] = e
		default:
			es = slices.Insert(es, i, e)
		}
		if len(es) == 0 {
			delete(byUnit, name)
		} else {
			byUnit[name] = es
		}
	})
}
