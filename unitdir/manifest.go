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
	dir    *Dir
	mu     sync.Mutex
	files  map[string]string // path relative to the unit dir -> hash last written
	units  map[string]reconcile.UnitRecord
	intent reconcile.Intent
}

type manifestJSON struct {
	Version int                             `json:"version"`
	Files   map[string]string               `json:"files"`
	Units   map[string]reconcile.UnitRecord `json:"units,omitempty"`
	// Intent is the work a pass began and has not finished (see
	// reconcile.Intent); absent when nothing is owed.
	Intent *reconcile.Intent `json:"intent,omitempty"`
}

// OpenManifest loads the manifest from stateDir, creating the directory (and
// an empty manifest) when missing. A manifest that cannot be parsed is an
// error, never silently an empty one: that would orphan every managed unit.
// The state directory is private (OpenPrivate): 0700, managed.json and the
// blobs 0600, whatever the umask; wider modes found there are tightened.
func OpenManifest(stateDir string) (*Manifest, error) {
	d, err := OpenPrivate(stateDir)
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
		if mj.Intent != nil {
			m.intent = *mj.Intent
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

// Claim records, in one write of the manifest, that the agent owns files
// (path -> the hash about to be written there) and the intent of the pass
// that is about to write them: a crash after this leaves files the agent
// still owns, and work the next pass finishes.
func (m *Manifest) Claim(files map[string]string, in reconcile.Intent) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := maps.Clone(m.files)
	maps.Copy(next, files)
	if err := m.saveAll(next, m.units, in); err != nil {
		return err
	}
	m.files, m.intent = next, cloneIntent(in)
	return nil
}

// Intent returns the recorded intent (empty when nothing is owed).
func (m *Manifest) Intent() reconcile.Intent {
	m.mu.Lock()
	defer m.mu.Unlock()
	return cloneIntent(m.intent)
}

// SetIntent records the intent; an empty one clears it.
func (m *Manifest) SetIntent(in reconcile.Intent) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.saveAll(m.files, m.units, in); err != nil {
		return err
	}
	m.intent = cloneIntent(in)
	return nil
}

func cloneIntent(in reconcile.Intent) reconcile.Intent {
	return reconcile.Intent{Reload: in.Reload, Jobs: maps.Clone(in.Jobs)}
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

// SetUnits stores units' records and the intent in one write; an empty
// record deletes.
func (m *Manifest) SetUnits(recs map[string]reconcile.UnitRecord, in reconcile.Intent) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := maps.Clone(m.units)
	for name, rec := range recs {
		if rec.Empty() {
			delete(next, name)
		} else {
			next[name] = rec
		}
	}
	if err := m.saveAll(m.files, next, in); err != nil {
		return err
	}
	m.units = next
	m.intent = cloneIntent(in)
	return nil
}

const blobDir = "blobs"

// PutBlob keeps content under its hash (idempotent, atomic). The blob is
// durable once Flush returns.
func (m *Manifest) PutBlob(hash string, content []byte) error {
	p := blobDir + "/" + hash
	if fi, err := m.dir.root.Lstat(p); err == nil && fi.Mode().IsRegular() && fi.Size() == int64(len(content)) {
		return nil
	}
	return m.dir.WriteBatched(p, content)
}

// Flush makes the blobs put so far durable.
func (m *Manifest) Flush() error { return m.dir.Flush() }

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
		for _, h := range r.Previous {
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
	return m.saveAll(files, units, m.intent)
}

func (m *Manifest) saveAll(files map[string]string, units map[string]reconcile.UnitRecord, in reconcile.Intent) error {
	mj := manifestJSON{Version: 2, Files: files, Units: units}
	if !in.Empty() {
		mj.Intent = &in
	}
	// Compact: the whole manifest is written several times per change, and
	// indenting doubled the cost at 1,000 units (jq reads it fine).
	b, err := json.Marshal(mj)
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
