package unitdir

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"

	"github.com/agentd/agentd/reconcile"
)

const manifestFile = "managed.json"

// Manifest is the agent's memory that survives a restart, in the state
// directory: which files in the unit directory it owns (a file not listed is
// never overwritten or removed), per unit what the running unit was started
// with and the last version that was healthy (for rollback), and the content
// of those versions (blobs/<hash>). managed.json is rewritten atomically on
// every change. Safe for concurrent use.
type Manifest struct {
	dir   *Dir
	mu    sync.Mutex
	files map[string]string // path relative to the unit dir -> hash last written
	units map[string]reconcile.UnitRecord
}

type manifestJSON struct {
	Version int                             `json:"version"`
	Files   map[string]string               `json:"files"`
	Units   map[string]reconcile.UnitRecord `json:"units,omitempty"`
}

// OpenManifest loads the manifest from stateDir, creating the directory (and
// an empty manifest) when missing. A manifest that cannot be parsed is an
// error, never silently an empty one: that would orphan every managed unit.
func OpenManifest(stateDir string) (*Manifest, error) {
	d, err := Open(stateDir)
	if err != nil {
		return nil, err
	}
	m := &Manifest{dir: d, files: map[string]string{}, units: map[string]reconcile.UnitRecord{}}
	b, exists, err := d.Read(manifestFile)
	if err != nil {
		return nil, err
	}
	if exists {
		var mj manifestJSON
		if err := json.Unmarshal(b, &mj); err != nil {
			return nil, fmt.Errorf("parse %s/%s: %w", stateDir, manifestFile, err)
		}
		if mj.Files != nil {
			m.files = mj.Files
		}
		if mj.Units != nil {
			m.units = mj.Units
		}
	}
	return m, nil
}

// Managed returns a copy of path -> hash for every file the agent owns.
func (m *Manifest) Managed() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.files)
}

// Set records that the agent owns path and is about to hold hash there.
// Call it before writing the file, so a crash in between leaves a file the
// agent still owns.
func (m *Manifest) Set(path, hash string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.files[path]; ok && old == hash {
		return nil
	}
	next := maps.Clone(m.files)
	next[path] = hash
	if err := m.save(next, m.units); err != nil {
		return err
	}
	m.files = next
	return nil
}

// SetMany is Set for a batch of paths, with one write of the manifest.
func (m *Manifest) SetMany(files map[string]string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := maps.Clone(m.files)
	changed := false
	for p, h := range files {
		if next[p] != h {
			next[p] = h
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := m.save(next, m.units); err != nil {
		return err
	}
	m.files = next
	return nil
}

// Forget drops path from the manifest. Call it after the file is removed.
func (m *Manifest) Forget(path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.files[path]; !ok {
		return nil
	}
	next := maps.Clone(m.files)
	delete(next, path)
	if err := m.save(next, m.units); err != nil {
		return err
	}
	m.files = next
	return nil
}

// Units returns a copy of every unit's record.
func (m *Manifest) Units() map[string]reconcile.UnitRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.units)
}

// SetUnit stores a unit's record; the zero record deletes it.
func (m *Manifest) SetUnit(name string, rec reconcile.UnitRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := maps.Clone(m.units)
	if len(rec.Applied) == 0 && len(rec.Good) == 0 && rec.Failed == "" {
		if _, ok := next[name]; !ok {
			return nil
		}
		delete(next, name)
	} else {
		next[name] = rec
	}
	if err := m.save(m.files, next); err != nil {
		return err
	}
	m.units = next
	return nil
}

const blobDir = "blobs"

// PutBlob keeps content under its hash (idempotent, atomic).
func (m *Manifest) PutBlob(hash string, content []byte) error {
	p := blobDir + "/" + hash
	if _, exists, err := m.dir.Read(p); err == nil && exists {
		return nil
	}
	return m.dir.Write(p, content)
}

// Blob returns content kept by PutBlob.
func (m *Manifest) Blob(hash string) ([]byte, bool) {
	if strings.ContainsAny(hash, "/.") || hash == "" {
		return nil, false
	}
	b, exists, err := m.dir.Read(blobDir + "/" + hash)
	return b, err == nil && exists
}

// GC deletes blobs that no file or record refers to any more.
func (m *Manifest) GC() error {
	m.mu.Lock()
	keep := map[string]bool{}
	for _, h := range m.files {
		keep[h] = true
	}
	for _, r := range m.units {
		for _, h := range r.Applied {
			keep[h] = true
		}
		for _, h := range r.Good {
			keep[h] = true
		}
	}
	m.mu.Unlock()
	f, err := m.dir.root.Open(blobDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gc blobs: %w", err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("gc blobs: %w", err)
	}
	var errs []error
	for _, n := range names {
		if !keep[n] {
			errs = append(errs, m.dir.root.Remove(blobDir+"/"+n))
		}
	}
	return errors.Join(errs...)
}

func (m *Manifest) save(files map[string]string, units map[string]reconcile.UnitRecord) error {
	b, err := json.MarshalIndent(manifestJSON{Version: 2, Files: files, Units: units}, "", "  ")
	if err != nil {
		return err
	}
	if err := m.dir.Write(manifestFile, append(b, '\n')); err != nil {
		return fmt.Errorf("save manifest: %w", err)
	}
	return nil
}

// Close releases the state directory handle.
func (m *Manifest) Close() error { return m.dir.Close() }
