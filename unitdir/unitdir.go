// Package unitdir is the agent's only way to touch the filesystem: unit files
// in the unit directory and the ownership manifest in the state directory.
//
// Every access goes through an os.Root, so no path — however it is spelled or
// whatever symlinks lie on the way — can reach outside the directory. Writes
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
	"strings"
)

// ErrNotRegular is returned when the target exists but is not a regular file
// (a symlink such as a mask to /dev/null, a directory, a device). The agent
// never replaces such a thing.
var ErrNotRegular = errors.New("not a regular file")

// Dir is a directory the agent writes files into.
type Dir struct {
	root *os.Root
	path string
}

// Open creates the directory if needed (0755) and roots all access in it.
func Open(dir string) (*Dir, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	return &Dir{root: r, path: dir}, nil
}

// Path is the directory's path as given to Open.
func (d *Dir) Path() string { return d.path }

// Close releases the directory handle.
func (d *Dir) Close() error { return d.root.Close() }

// checkRel refuses paths that are not plain relative paths: the os.Root
// would stop an escape anyway, but a clear error beats a confusing one.
func checkRel(rel string) error {
	if rel == "" || !fs.ValidPath(rel) || rel == "." || strings.Contains(rel, "\\") {
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

// Write replaces rel with content atomically, mode 0644, creating its parent
// directory (one level, for drop-in directories) when missing.
func (d *Dir) Write(rel string, content []byte) error {
	if err := checkRel(rel); err != nil {
		return err
	}
	if fi, err := d.root.Lstat(rel); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("write %s: %w (%s)", rel, ErrNotRegular, fi.Mode().Type())
	}
	dir := path.Dir(rel)
	if dir != "." {
		if err := d.root.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("write %s: %w", rel, err)
		}
	}
	tmp := path.Join(dir, "."+path.Base(rel)+".agentd-"+randSuffix())
	if err := d.writeTemp(tmp, content); err != nil {
		_ = d.root.Remove(tmp)
		return fmt.Errorf("write %s: %w", rel, err)
	}
	if err := d.root.Rename(tmp, rel); err != nil {
		_ = d.root.Remove(tmp)
		return fmt.Errorf("write %s: %w", rel, err)
	}
	if err := d.syncDir(dir); err != nil {
		return fmt.Errorf("write %s: %w", rel, err)
	}
	return nil
}

func (d *Dir) writeTemp(tmp string, content []byte) error {
	f, err := d.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(content); err != nil {
		f.Close()
		return err
	}
	// The umask may have narrowed the mode given to OpenFile.
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
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
	return f.Sync()
}

func randSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
