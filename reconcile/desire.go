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
	Path    string // relative to the unit directory: "x.service" or "x.service.d/y.conf"
	Content []byte
	Hash    string
	Source  string // "host" or "group:<name>"
}

// DesiredUnit is everything the registry says about one unit on this host.
type DesiredUnit struct {
	Name     string
	File     *DesiredFile           // the unit file itself; nil for an instance key or drop-ins only
	DropIns  map[string]DesiredFile // by path
	Instance bool                   // an empty-valued instance key: run Name from its template
	Policy   Policy
	// Err, when set, blocks the unit: it is reported and nothing is applied.
	Err error
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
func Desire(s Snapshot) map[string]*DesiredUnit {
	var c desireCache
	return c.desire(s)
}

// desireCache makes Desire cost what changed between two snapshots: the
// validation and policy parsing of a value (most of Desire's work) is kept
// for the values of the last snapshot and reused when they come again. The
// result is the same as Desire's. Loop-owned.
type desireCache struct {
	values, lastValues     map[string]valueCheck  // unit name, NUL, value -> verdict
	policies, lastPolicies map[string]policyParse // policy source -> parsed
}

type valueCheck struct {
	hash string
	err  error
}

type policyParse struct {
	p   Policy
	err error
}

func (c *desireCache) check(unit string, value []byte) (string, error) {
	k := unit + "\x00" + string(value)
	v, ok := c.lastValues[k]
	if !ok {
		v = valueCheck{hash: Hash(value), err: validateValue(unit, value)}
	}
	c.values[k] = v
	return v.hash, v.err
}

func (c *desireCache) policy(src []byte) (Policy, error) {
	v, ok := c.lastPolicies[string(src)]
	if !ok {
		v.p, v.err = ParsePolicy(src)
	}
	c.policies[string(src)] = v
	return v.p, v.err
}

func (c *desireCache) desire(s Snapshot) map[string]*DesiredUnit {
	// What this call uses becomes the cache: values no longer in the
	// registry are forgotten.
	c.lastValues, c.values = c.values, map[string]valueCheck{}
	c.lastPolicies, c.policies = c.policies, map[string]policyParse{}
	defer func() { c.lastValues, c.lastPolicies = nil, nil }()
	type cand struct {
		e    Entry
		path string
		unit string
	}
	units := map[string]*DesiredUnit{}
	get := func(name string) *DesiredUnit {
		u := units[name]
		if u == nil {
			u = &DesiredUnit{Name: name, DropIns: map[string]DesiredFile{}}
			units[name] = u
		}
		return u
	}
	block := func(u *DesiredUnit, err error) {
		if u.Err == nil {
			u.Err = err
		}
	}

	byPath := map[string][]cand{}
	for _, e := range s.Entries {
		path, unit, err := ParseKey(e.Unit)
		if err != nil {
			block(get(StatusName(e.Unit)), err)
			continue
		}
		byPath[path] = append(byPath[path], cand{e, path, unit})
	}

	for _, path := range slices.Sorted(maps.Keys(byPath)) {
		cs := byPath[path]
		u := get(cs[0].unit)
		// A host key wins over every group key for the same path.
		var chosen *cand
		for i := range cs {
			if cs[i].e.Scope == ScopeHost {
				chosen = &cs[i]
			}
		}
		if chosen == nil {
			chosen = &cs[0]
			conflict := false
			for _, c := range cs[1:] {
				conflict = conflict || !bytes.Equal(c.e.Value, chosen.e.Value)
			}
			if conflict {
				var groups []string
				for _, c := range cs {
					groups = append(groups, c.e.Group)
				}
				block(u, fmt.Errorf("conflict: groups %s give different content for %s; nothing applied",
					strings.Join(dedupe(groups), ", "), path))
				continue
			}
		}
		e := chosen.e
		source := "host"
		if e.Scope == ScopeGroup {
			source = "group:" + e.Group
		}
		if len(e.Value) == 0 {
			if path == u.Name && IsInstance(u.Name) {
				u.Instance = true
				continue
			}
			block(u, fmt.Errorf("%s: empty value (only a template instance such as foo@1.service may be empty)", path))
			continue
		}
		hash, err := c.check(u.Name, e.Value)
		if err != nil {
			block(u, fmt.Errorf("%s: %w", path, err))
			continue
		}
		f := DesiredFile{Path: path, Content: e.Value, Hash: hash, Source: source}
		if path == u.Name {
			u.File = &f
		} else {
			u.DropIns[path] = f
		}
	}

	for _, u := range units {
		if u.Err != nil {
			continue
		}
		// Policy comes from the unit file, else from the drop-ins.
		var src []byte
		if u.File != nil {
			src = u.File.Content
		} else {
			for _, f := range u.Files() {
				src = append(src, f.Content...)
				src = append(src, '\n')
			}
		}
		p, err := c.policy(src)
		if err != nil {
			u.Err = err
			continue
		}
		u.Policy = p
	}
	return units
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
