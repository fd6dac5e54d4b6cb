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

const (
	manifestFile = "managed.json"
	// journalFile holds what changed since managed.json was last written
	// whole: a change costs a write the size of the change, not of the
	// manifest (at 1,000 units the whole manifest was ~300 KB to encode
	// and fsync before every change's first side effect).
	journalFile = "managed.journal.json"
	// compactAfter is how many changed entries the journal holds before
	// the manifest is written whole again and the journal removed.
	compactAfter = 256
)

// Manifest is the agent's memory that survives a restart, in the state
// directory: which files in the unit directory it owns (a file not listed is
// never overwritten or removed), per unit what the running unit was started
// with and the last version that was healthy (for rollback), the intent of
// the pass under way, and the content of those versions (blobs/<hash>).
//
// Every change is durable when its method returns: it is written, atomically,
// to the journal (managed.journal.json: the entries changed since
// managed.json was last written, and the intent), and managed.json is
// rewritten whole only when the journal grows past compactAfter entries.
// Both carry a sequence number; at load the journal counts only when it is
// newer than managed.json (a crash between writing managed.json and removing
// the journal leaves an old journal behind). Safe for concurrent use.
type Manifest struct {
	dir    *Dir
	mu     sync.Mutex
	files  map[string]string // path relative to the unit dir -> its entry in wire form (ownedWire)
	units  map[string]reconcile.UnitRecord
	intent reconcile.Intent
	seq    int64 // of the last write, manifest or journal
	// The journal's entries: files ("" = forgotten) and records (empty =
	// deleted) changed since managed.json was written.
	jFiles map[string]string
	jUnits map[string]reconcile.UnitRecord
}

type manifestJSON struct {
	Version int                             `json:"version"`
	Seq     int64                           `json:"seq,omitempty"`
	Files   map[string]string               `json:"files"`
	Units   map[string]reconcile.UnitRecord `json:"units,omitempty"`
	// Intent is the work a pass began and has not finished (see
	// reconcile.Intent); absent when nothing is owed.
	Intent *reconcile.Intent `json:"intent,omitempty"`
}

type journalJSON struct {
	Seq    int64                           `json:"seq"`
	Files  map[string]string               `json:"files,omitempty"`
	Units  map[string]reconcile.UnitRecord `json:"units,omitempty"`
	Intent *reconcile.Intent               `json:"intent,omitempty"`
}

// OpenManifest loads the manifest from stateDir, creating the directory (and
// an empty manifest) when missing. A manifest or journal that cannot be
// parsed is an error, never silently an empty one: that would orphan every
// managed unit. The state directory is private (OpenPrivate): 0700,
// managed.json and the blobs 0600, whatever the umask; wider modes found
// there are tightened.
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
		m.seq = mj.Seq
	}
	b, exists, err = d.Read(journalFile)
	if err != nil {
		return nil, err
	}
	if exists {
		var jj journalJSON
		if err := json.Unmarshal(b, &jj); err != nil {
			return nil, fmt.Errorf("parse %s/%s: %w", stateDir, journalFile, err)
		}
		if jj.Seq > m.seq {
			m.seq, m.jFiles, m.jUnits = jj.Seq, jj.Files, jj.Units
			applyFiles(m.files, jj.Files)
			applyUnits(m.units, jj.Units)
			m.intent = reconcile.Intent{}
			if jj.Intent != nil {
				m.intent = *jj.Intent
			}
		}
	}
	return m, nil
}

func applyFiles(dst, delta map[string]string) {
	for p, h := range delta {
		if h == "" {
			delete(dst, p)
		} else {
			dst[p] = h
		}
	}
}

func applyUnits(dst, delta map[string]reconcile.UnitRecord) {
	for u, r := range delta {
		if r.Empty() {
			delete(dst, u)
		} else {
			dst[u] = r
		}
	}
}

// instanceWire is how the manifest files hold an instance's entry
// (reconcile.Owned.Instance) in place of a file's hash; agents before the
// typed entries read and write the same.
const instanceWire = "instance"

// ownedWire is e as the manifest files hold it: the file's hash, or
// instanceWire.
func ownedWire(e reconcile.Owned) string {
	if e.Instance {
		return instanceWire
	}
	return e.Hash
}

// ownedOf reads an entry of the manifest files (see ownedWire).
func ownedOf(wire string) reconcile.Owned {
	if wire == instanceWire {
		return reconcile.Owned{Instance: true}
	}
	return reconcile.Owned{Hash: wire}
}

// Managed returns what the agent owns, by path.
func (m *Manifest) Managed() map[string]reconcile.Owned {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]reconcile.Owned, len(m.files))
	for p, w := range m.files {
		out[p] = ownedOf(w)
	}
	return out
}

// Set records that the agent owns path: the file it is about to write
// there, or an instance. Call it before writing the file, so a crash in
// between leaves a file the agent still owns.
func (m *Manifest) Set(path string, e reconcile.Owned) error {
	w := ownedWire(e)
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.files[path]; ok && old == w {
		return nil
	}
	return m.change(map[string]string{path: w}, nil, m.intent)
}

// Claim records, in one write, that the agent owns files (path -> the hash
// about to be written there) and the intent of the pass that is about to
// write them: a crash after this leaves files the agent still owns, and work
// the next pass finishes.
func (m *Manifest) Claim(files map[string]string, in reconcile.Intent) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.change(files, nil, in)
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
	return m.change(nil, nil, in)
}

func cloneIntent(in reconcile.Intent) reconcile.Intent {
	return reconcile.Intent{Reload: in.Reload, Jobs: maps.Clone(in.Jobs), Confirm: maps.Clone(in.Confirm), Writes: maps.Clone(in.Writes)}
}

// Forget drops path from the manifest. Call it after the file is removed.
func (m *Manifest) Forget(path string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.files[path]; !ok {
		return nil
	}
	return m.change(map[string]string{path: ""}, nil, m.intent)
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
	return m.change(nil, recs, in)
}

// change makes files, recs and in durable, in the journal or, when the
// journal would grow past compactAfter, by writing the manifest whole.
// Caller holds m.mu. Nothing in memory changes unless the write succeeded.
func (m *Manifest) change(files map[string]string, recs map[string]reconcile.UnitRecord, in reconcile.Intent) error {
	jf, ju := maps.Clone(m.jFiles), maps.Clone(m.jUnits)
	if jf == nil {
		jf = map[string]string{}
	}
	if ju == nil {
		ju = map[string]reconcile.UnitRecord{}
	}
	maps.Copy(jf, files)
	maps.Copy(ju, recs)
	seq := m.seq + 1
	if len(jf)+len(ju) > compactAfter {
		// The whole manifest as it will be, on copies: the write may fail.
		nextFiles, nextUnits := maps.Clone(m.files), maps.Clone(m.units)
		applyFiles(nextFiles, files)
		applyUnits(nextUnits, recs)
		if err := m.saveAll(seq, nextFiles, nextUnits, in); err != nil {
			return err
		}
		m.files, m.units, m.intent = nextFiles, nextUnits, cloneIntent(in)
		m.seq, m.jFiles, m.jUnits = seq, nil, nil
		// A journal left by a failed removal is ignored at load (its
		// sequence number is lower) and replaced by the next change's.
		if err := m.dir.Remove(journalFile); err != nil {
			return fmt.Errorf("save manifest: %w", err)
		}
		return nil
	}
	jj := journalJSON{Seq: seq, Files: jf, Units: ju}
	if !in.Empty() {
		jj.Intent = &in
	}
	if err := m.writeJSON(journalFile, jj, "save manifest journal"); err != nil {
		return err
	}
	// In place: Managed and Units hand out copies, never these maps.
	applyFiles(m.files, files)
	applyUnits(m.units, recs)
	m.seq, m.jFiles, m.jUnits, m.intent = seq, jf, ju, cloneIntent(in)
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

// saveAll writes the manifest whole.
func (m *Manifest) saveAll(seq int64, files map[string]string, units map[string]reconcile.UnitRecord, in reconcile.Intent) error {
	mj := manifestJSON{Version: 2, Seq: seq, Files: files, Units: units}
	if !in.Empty() {
		mj.Intent = &in
	}
	return m.writeJSON(manifestFile, mj, "save manifest")
}

// writeJSON writes v as JSON to name in the state directory, atomically;
// what names the write in its error.
func (m *Manifest) writeJSON(name string, v any, what string) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := m.dir.Write(name, append(b, '\n')); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// Close releases the state directory handle.
func (m *Manifest) Close() error { return m.dir.Close() }
