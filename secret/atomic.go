package secret

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// writeTemp writes data to a new file in path's directory with mode perm,
// synced, and returns its name. The caller renames or links it into place
// and removes it on failure.
func writeTemp(path string, data []byte, perm fs.FileMode) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("write %s: %w", tmp, err)
	}
	return tmp, nil
}

// writeAtomic replaces path with data: a reader sees the old file or the
// new one, never a part, and after a crash the one or the other. A
// non-regular target (a directory, a device, a symlink) is refused rather
// than replaced.
func writeAtomic(path string, data []byte, perm fs.FileMode) error {
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file: refusing to replace it", path)
	}
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(path))
}

// createOnce creates path with data unless it exists (an error wrapping
// fs.ErrExist then, and path is untouched): the file appears whole or not
// at all, and of two concurrent callers exactly one succeeds.
func createOnce(path string, data []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	// link(2), unlike rename(2), fails when the target exists.
	err = os.Link(tmp, path)
	os.Remove(tmp)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create %s: %w", path, fs.ErrExist)
		}
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes a rename or link in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
