package main

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/agentd/agentd/reconcile"
)

// fileHelp is the --file flag's help: the form and where it lands.
const fileHelp = `a config file of the unit's set, DEST=SRC[:MODE[:OWNER]]: SRC read here, written at
DEST on each host (under one of its agent's --file-root), MODE octal (default 0644),
OWNER as USER:GROUP by name (default root:root). Repeatable`

// configFile is one --file of unit put.
type configFile struct {
	dest, src string
	file      reconcile.ConfigFile
}

// parseFileFlag reads DEST=SRC[:MODE[:OWNER]] and the file SRC names. SRC
// may not hold a ":" (the form has no escape for it). A MODE not given is
// mode.
func parseFileFlag(spec string, mode fs.FileMode) (configFile, error) {
	dest, rest, ok := strings.Cut(spec, "=")
	if !ok || dest == "" || rest == "" {
		return configFile{}, fmt.Errorf("--file %q: want DEST=SRC[:MODE[:OWNER]], e.g. /etc/myapp/app.conf=./app.conf:0640:root:myapp", spec)
	}
	if err := reconcile.ValidateDest(dest); err != nil {
		return configFile{}, fmt.Errorf("--file %q: %w", spec, err)
	}
	parts := strings.SplitN(rest, ":", 3) // SRC, MODE, USER:GROUP
	c := configFile{dest: dest, src: parts[0], file: reconcile.ConfigFile{Mode: mode}}
	if len(parts) > 1 {
		m, err := reconcile.ParseMode(parts[1])
		if err != nil {
			return configFile{}, fmt.Errorf("--file %q: %w", spec, err)
		}
		c.file.Mode = m
	}
	if len(parts) > 2 {
		if err := reconcile.ValidateOwner(parts[2]); err != nil {
			return configFile{}, fmt.Errorf("--file %q: %w", spec, err)
		}
		c.file.Owner = parts[2]
	}
	st, err := os.Stat(c.src)
	if err != nil {
		return configFile{}, fmt.Errorf("--file %q: %w", spec, err)
	}
	if !st.Mode().IsRegular() {
		return configFile{}, fmt.Errorf("--file %q: %s is not a regular file", spec, c.src)
	}
	if c.file.Content, err = os.ReadFile(c.src); err != nil {
		return configFile{}, fmt.Errorf("--file %q: %w", spec, err)
	}
	if err := reconcile.ValidateContent(c.file.Encode()); err != nil {
		return configFile{}, fmt.Errorf("--file %q: %s: %w (config files are text)", spec, c.src, err)
	}
	return c, nil
}

// addConfigFiles adds each --file to units as a key of the unit it belongs
// to: the put's one unit, or among several the one whose RestartTriggers=
// or ReloadTriggers= names it (in its unit file, else its drop-ins: the
// agent's rule, reconcile.PolicyOf). Anything else is a usage error.
func addConfigFiles(units map[string][]byte, specs []string) error {
	_, err := addFiles(units, specs, reconcile.DefaultMode)
	return err
}

// addFiles is addConfigFiles with mode for a --file that gives none; it
// returns the keys it added (a secret's, for unit put --secret to seal).
func addFiles(units map[string][]byte, specs []string, mode fs.FileMode) ([]string, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	owners := map[string]bool{}
	for k, v := range units {
		if !reconcile.IsConfigPath(k) && v != nil {
			owners[reconcile.UnitOfPath(k)] = true
		}
	}
	if len(owners) == 0 {
		return nil, withCode(exitUsage, errors.New("unit put --file: give the unit (or a drop-in of it) the file belongs to"))
	}
	var keys []string
	for _, spec := range specs {
		c, err := parseFileFlag(spec, mode)
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("unit put %w", err))
		}
		unit, err := ownerOf(c.dest, owners, units)
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("unit put --file %s: %w", c.dest, err))
		}
		key := reconcile.ConfigKey(unit, c.dest)
		if _, dup := units[key]; dup {
			return nil, withCode(exitUsage, fmt.Errorf("unit put --file %s: given twice", c.dest))
		}
		units[key] = c.file.Encode()
		keys = append(keys, key)
	}
	return keys, nil
}

// ownerOf picks the unit a config file at dest belongs to.
func ownerOf(dest string, owners map[string]bool, units map[string][]byte) (string, error) {
	names := slices.Sorted(maps.Keys(owners))
	if len(names) == 1 {
		return names[0], nil
	}
	var naming []string
	for _, u := range names {
		p, err := reconcile.PolicyOf(u, units)
		if err != nil {
			continue // checked with the unit file; its error is its own
		}
		if slices.Contains(strings.Fields(p.RestartTriggers+" "+p.ReloadTriggers), dest) {
			naming = append(naming, u)
		}
	}
	if len(naming) == 1 {
		return naming[0], nil
	}
	if len(naming) == 0 {
		return "", fmt.Errorf("the put has several units (%s) and no RestartTriggers= or ReloadTriggers= of theirs names it; put it with its unit alone", strings.Join(names, ", "))
	}
	return "", fmt.Errorf("the triggers of %s all name it; a file belongs to one unit's set", strings.Join(naming, " and "))
}
