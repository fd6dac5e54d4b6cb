// Package unitdir is how the agent writes its files: unit files in the unit
// directory, the config files of units' sets under the file roots the host
// allows (Roots), and in the state directory the ownership manifest
// (Manifest) and the last-known-good registry snapshot (SnapshotStore).
// Other file access is elsewhere: configuration the agent reads (TLS files,
// /etc/machine-id), the embedded etcd's data directory (registry), the
// debug socket (control), and in cmd/agentd the doctor's checks, the
// editor's file of `unit edit` and test-only fault markers.
//
// Every access goes through an os.Root, so no path — however it is spelled or
// whatever symlinks lie on the way — can reach outside its directory. Writes
// are atomic: temp file in the target's directory, write, fsync, rename,
// fsync the directory; a crash at any point leaves the old or the new file.
// A Dir is safe for concurrent use only for distinct paths.
package unitdir

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/agentd/agentd/internal/privdir"
)

// ErrNotRegular is returned when the target exists but is not a regular file
// (a symlink such as a mask to /dev/null, a directory, a device). The agent
// never replaces such a thing.
var ErrNotRegular = errors.New("not a regular file")

// Dir is a directory the agent writes files into.
type Dir struct {
	root     *os.Root
	path     string
	fileMode os.FileMode // of every file Write makes: 0644, or 0600 for a private Dir
	dirMode  os.FileMode // of the subdirectories Write makes: 0755, or 0700

	mu       sync.Mutex
	unsynced map[string]bool // directories with renames WriteBatched left for Flush
}

// Open creates the directory if needed (0755) and roots all access in it.
// Files are written 0644 (unit files: systemd and everyone may read them).
func Open(dir string) (*Dir, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	return &Dir{root: r, path: dir, fileMode: 0o644, dirMode: 0o755}, nil
}

// OpenPrivate opens a directory only this process's user may read: the
// state directory, whose old unit versions may hold secrets (Environment=)
// and whose registry snapshot is everything this host runs. The directory
// is created 0700, or tightened to 0700 when it is wider; files are written
// 0600 and subdirectories 0700, whatever the umask. Regular files and
// directories already there (one level down) that other users could read
// are tightened too.
func OpenPrivate(dir string) (*Dir, error) {
	if err := MkdirPrivate(dir); err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	d := &Dir{root: r, path: dir, fileMode: 0o600, dirMode: 0o700}
	if err := d.tighten(".", 1); err != nil {
		r.Close()
		return nil, err
	}
	return d, nil
}

// MkdirPrivate creates dir (and missing parents, 0755 as usual) as mode
// 0700, or tightens an existing dir to 0700 if group or others have any
// access. dir must belong to this process's user.
func MkdirPrivate(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	err := privdir.Check(dir)
	var wide *privdir.ModeError
	if errors.As(err, &wide) {
		if err := os.Chmod(dir, wide.Mode&0o700|0o700); err != nil {
			return fmt.Errorf("tighten %s to 0700: %w", dir, err)
		}
		return nil
	}
	return err
}

// tighten removes group and other permissions from the regular files and
// directories in rel and, depth levels down, in its subdirectories.
// Symlinks are left alone.
func (d *Dir) tighten(rel string, depth int) error {
	f, err := d.root.Open(rel)
	if err != nil {
		return fmt.Errorf("open %s: %w", rel, err)
	}
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("list %s: %w", rel, err)
	}
	var errs []error
	for _, e := range entries {
		p := path.Join(rel, e.Name())
		fi, err := d.root.Lstat(p)
		if err != nil || !(fi.Mode().IsRegular() || fi.IsDir()) {
			continue
		}
		if m := fi.Mode().Perm(); m&0o077 != 0 {
			if err := d.root.Chmod(p, m&0o700|0o600); err != nil {
				errs = append(errs, fmt.Errorf("tighten %s: %w", p, err))
			}
		}
		if fi.IsDir() && depth > 0 {
			errs = append(errs, d.tighten(p, depth-1))
		}
	}
	return errors.Join(errs...)
}

// Path is the directory's path as given to Open.
func (d *Dir) Path() string { return d.path }

// Close releases the directory handle.
func (d *Dir) Close() error { return d.root.Close() }

// checkRel refuses paths that are not plain relative paths ("/"-separated
// names, none of them "." or ".."): the os.Root would stop an escape
// anyway, but a clear error beats a confusing one. A backslash is an
// ordinary character in a Linux file name, and systemd-escape puts one in
// unit names ("foo\\x2dbar.service").
func checkRel(rel string) error {
	if rel == "" || !fs.ValidPath(rel) || rel == "." {
		return fmt.Errorf("invalid path %q", rel)
	}
	return nil
}

// Read returns a regular file's content. It reports exists=false for a
// missing file and ErrNotRegular for anything that is not a regular file.
func (d *Dir) Read(rel string) (content []byte, exists bool, err error) {
	if err := checkRel(rel); err != nil {
		return nil, false, err
	}
	fi, err := d.root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("stat %s: %w", rel, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, true, fmt.Errorf("%s: %w (%s)", rel, ErrNotRegular, fi.Mode().Type())
	}
	b, err := d.root.ReadFile(rel)
	if err != nil {
		return nil, true, fmt.Errorf("read %s: %w", rel, err)
	}
	return b, true, nil
}

// Write replaces rel with content atomically, mode 0644 (0600 in a Dir
// opened with OpenPrivate), creating its parent directory (one level, for
// drop-in directories and blobs) when missing.
func (d *Dir) Write(rel string, content []byte) error {
	if err := d.write(rel, content); err != nil {
		return err
	}
	if err := d.syncDir(path.Dir(rel)); err != nil {
		return fmt.Errorf("write %s: %w", rel, err)
	}
	return nil
}

// WriteBatched is Write without the directory fsync: the file's content is
// on disk before the rename, as with Write (a crash leaves the old or the
// new file, whole), but the rename itself is durable only after Flush. A
// batch of n files then costs n+1 fsyncs instead of 2n: with 1,000 new
// units, the directory fsyncs were most of the first sync.
func (d *Dir) WriteBatched(rel string, content []byte) error {
	if err := d.write(rel, content); err != nil {
		return err
	}
	d.mu.Lock()
	if d.unsynced == nil {
		d.unsynced = map[string]bool{}
	}
	d.unsynced[path.Dir(rel)] = true
	d.mu.Unlock()
	return nil
}

// Flush makes the renames of every WriteBatched so far durable: one fsync
// per directory written into.
func (d *Dir) Flush() error {
	d.mu.Lock()
	dirs := d.unsynced
	d.unsynced = nil
	d.mu.Unlock()
	var errs []error
	for dir := range dirs {
		if err := d.syncDir(dir); err != nil {
			errs = append(errs, fmt.Errorf("sync %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// write is Write up to and including the rename.
func (d *Dir) write(rel string, content []byte) error {
	if err := checkRel(rel); err != nil {
		return err
	}
	if fi, err := d.root.Lstat(rel); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("write %s: %w (%s)", rel, ErrNotRegular, fi.Mode().Type())
	}
	dir := path.Dir(rel)
	if dir != "." {
		if err := d.root.MkdirAll(dir, d.dirMode); err != nil {
			return fmt.Errorf("write %s: %w", rel, err)
		}
	}
	base := path.Base(rel)
	tmp := path.Join(dir, tempPrefix(base)+randSuffix())
	if err := d.writeTemp(tmp, content); err != nil {
		return d.failedWrite(rel, err)
	}
	if err := renameTemp(d.root, tmp, rel); err != nil {
		return d.failedWrite(rel, err)
	}
	return nil
}

// renameTemp is os.Root.Rename; tests replace it to make a Write fail
// after its temp file exists.
var renameTemp = (*os.Root).Rename

// failedWrite removes what a failed Write of rel may have left: its own
// temp file, and any earlier one for the same target (a write killed
// midway). It sweeps only rel's own temp files: a Dir may be writing
// other paths concurrently, and their temp files are not garbage.
func (d *Dir) failedWrite(rel string, err error) error {
	err = fmt.Errorf("write %s: %w", rel, err)
	dir, prefix := path.Dir(rel), tempPrefix(path.Base(rel))
	_, _, cerr := d.sweep(dir, func(name string) bool { return strings.HasPrefix(name, prefix) && isTemp(name) })
	if cerr != nil {
		return errors.Join(err, fmt.Errorf("remove temp files of %s: %w", rel, cerr))
	}
	return err
}

// tempPrefix is the start of the name of every temp file Write makes for
// a target named base; randSuffix completes it.
func tempPrefix(base string) string { return "." + base + ".agentd-" }

// tempName matches the names Write gives its temp files:
// "." + target name + ".agentd-" + 12 lowercase hex digits.
var tempName = regexp.MustCompile(`^\..+\.agentd-[0-9a-f]{12}$`)

func isTemp(name string) bool { return tempName.MatchString(name) }

// CleanTemps removes the temp files that writes killed midway (SIGKILL,
// power loss) left behind: regular files named like Write's temp files,
// at the top of the directory and in its drop-in directories (*.d, one
// level down). Nothing else is touched: not directories or symlinks named
// like a temp file, not any other name. It goes on past errors and
// reports them all; removed lists what it removed, as paths under Path().
// Call it when no Write is under way, e.g. at start.
func (d *Dir) CleanTemps() (removed []string, err error) {
	top, subdirs, err := d.sweep(".", isTemp)
	removed = top
	errs := []error{err}
	for _, sub := range subdirs {
		if !strings.HasSuffix(sub, ".d") {
			continue
		}
		r, _, err := d.sweep(sub, isTemp)
		removed = append(removed, r...)
		errs = append(errs, err)
	}
	for i, rel := range removed {
		removed[i] = filepath.Join(d.path, filepath.FromSlash(rel))
	}
	return removed, errors.Join(errs...)
}

// sweep removes the regular files in dir whose names match, and lists the
// subdirectories (real ones, not symlinks) it saw. Paths are relative to
// the root.
func (d *Dir) sweep(dir string, match func(name string) bool) (removed, subdirs []string, err error) {
	f, err := d.root.Open(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", dir, err)
	}
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		rel := path.Join(dir, e.Name())
		if e.IsDir() {
			subdirs = append(subdirs, rel)
			continue
		}
		if !match(e.Name()) {
			continue
		}
		// Look again right before removing: the listing may be stale.
		if fi, err := d.root.Lstat(rel); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if err := d.root.Remove(rel); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove %s: %w", rel, err))
			}
			continue
		}
		removed = append(removed, rel)
	}
	if len(removed) > 0 {
		if err := d.syncDir(dir); err != nil {
			errs = append(errs, fmt.Errorf("sync %s: %w", dir, err))
		}
	}
	return removed, subdirs, errors.Join(errs...)
}

func (d *Dir) writeTemp(tmp string, content []byte) error {
	f, err := d.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, d.fileMode)
	if err != nil {
		return err
	}
	if _, err := f.Write(content); err != nil {
		f.Close()
		return err
	}
	// The umask may have narrowed the mode given to OpenFile.
	if err := f.Chmod(d.fileMode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Append adds content at the end of rel, creating it (mode as for Write)
// when missing, and returns once content is on disk (fsync; the directory
// too when the file is new). A crash midway can leave part of content at
// the end: a journal written this way must tell a whole record from a
// torn one.
func (d *Dir) Append(rel string, content []byte) error {
	if err := checkRel(rel); err != nil {
		return err
	}
	fi, err := d.root.Lstat(rel)
	switch {
	case err == nil && !fi.Mode().IsRegular():
		return fmt.Errorf("append to %s: %w (%s)", rel, ErrNotRegular, fi.Mode().Type())
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("append to %s: %w", rel, err)
	}
	created := err != nil
	f, err := d.root.OpenFile(rel, os.O_WRONLY|os.O_APPEND|os.O_CREATE, d.fileMode)
	if err != nil {
		return fmt.Errorf("append to %s: %w", rel, err)
	}
	_, err = f.Write(content)
	if err == nil && created {
		err = f.Chmod(d.fileMode) // the umask may have narrowed it
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && created {
		err = d.syncDir(path.Dir(rel))
	}
	if err != nil {
		return fmt.Errorf("append to %s: %w", rel, err)
	}
	return nil
}

// Remove deletes rel (a missing file is not an error) and, when rel lives in
// a subdirectory that is now empty, that directory too.
func (d *Dir) Remove(rel string) error {
	if err := checkRel(rel); err != nil {
		return err
	}
	if fi, err := d.root.Lstat(rel); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("remove %s: %w (%s)", rel, ErrNotRegular, fi.Mode().Type())
	}
	if err := d.root.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", rel, err)
	}
	dir := path.Dir(rel)
	if dir != "." {
		// Fails harmlessly when the directory still holds other drop-ins.
		if err := d.root.Remove(dir); err == nil {
			dir = "."
		}
	}
	if err := d.syncDir(dir); err != nil {
		return fmt.Errorf("remove %s: %w", rel, err)
	}
	return nil
}

func (d *Dir) syncDir(dir string) error {
	f, err := d.root.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return fsyncDir(f)
}

// fsyncDir is (*os.File).Sync; tests count the directory fsyncs with it.
var fsyncDir = (*os.File).Sync

func randSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// List names the files in the directory — at its top, and in its <unit>.d/
// drop-in directories — relative to it: what the agent publishes of the
// files it does not own. Directories (a <target>.wants/ of enablement
// links among them) and the agent's own temp files are left out; a
// symlink is listed (a masked unit is one).
func (d *Dir) List() ([]string, error) {
	top, subdirs, err := d.list(".")
	if err != nil {
		return nil, err
	}
	for _, sub := range subdirs {
		if !strings.HasSuffix(sub, ".d") {
			continue
		}
		names, _, err := d.list(sub)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the listing of the top
		}
		if err != nil {
			return nil, err
		}
		top = append(top, names...)
	}
	return top, nil
}

// list names the entries of dir that are not directories (files), and its
// subdirectories, as paths relative to the root.
func (d *Dir) list(dir string) (files, subdirs []string, err error) {
	f, err := d.root.Open(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", dir, err)
	}
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range entries {
		rel := path.Join(dir, e.Name())
		switch {
		case e.IsDir():
			subdirs = append(subdirs, rel)
		case !isTemp(e.Name()):
			files = append(files, rel)
		}
	}
	return files, subdirs, nil
}
