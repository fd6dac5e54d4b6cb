package unitdir

import (
	"encoding/json"
	"fmt"
	"maps"
	"sync"
)

const manifestFile = "managed.json"

// Manifest records which files in the unit directory the agent owns. It is
// the agent's only memory that survives a restart: a file not listed here is
// never overwritten or removed. It lives in the state directory and is
// rewritten atomically on every change. Safe for concurrent use.
type Manifest struct {
	dir   *Dir
	mu    sync.Mutex
	files map[string]string // path relative to the unit dir -> hash last written
}

type manifestJSON struct {
	Version int               `json:"version"`
	Files   map[string]string `json:"files"`
}

// OpenManifest loads the manifest from stateDir, creating the directory (and
// an empty manifest) when missing. A manifest that cannot be parsed is an
// error, never silently an empty one: that would orphan every managed unit.
func OpenManifest(stateDir string) (*Manifest, error) {
	d, err := Open(stateDir)
	if err != nil {
		return nil, err
	}
	m := &Manifest{dir: d, files: map[string]string{}}
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
	if err := m.save(next); err != nil {
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
	if err := m.save(next); err != nil {
		return err
	}
	m.files = next
	return nil
}

func (m *Manifest) save(files map[string]string) error {
	b, err := json.MarshalIndent(manifestJSON{Version: 1, Files: files}, "", "  ")
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
