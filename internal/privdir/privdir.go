// Package privdir checks that a directory is private: a directory this
// process's user owns and that no other user may enter. The agent keeps
// there what other users must not read or reach (the state directory, the
// embedded etcd's socket). It only looks; it never changes the directory
// (unitdir.MkdirPrivate tightens one that is too wide). Safe for concurrent
// use.
package privdir

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// ModeError: the directory is this process's user's, but group or others
// have some access to it.
type ModeError struct {
	Dir  string
	Mode fs.FileMode // its permission bits
}

func (e *ModeError) Error() string {
	return fmt.Sprintf("directory %s is mode %04o: other users could reach what it holds; make it 0700", e.Dir, e.Mode)
}

// Check returns nil when dir (symlinks followed) is a directory owned by
// this process's effective user with no group or other permission bits.
// Otherwise it says why not: the error of stat, not a directory, another
// owner, or a *ModeError when only the mode is too wide.
func Check(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s belongs to uid %d, not to this process's user (uid %d): refusing to keep private files there", dir, st.Uid, os.Geteuid())
	}
	if m := fi.Mode().Perm(); m&0o077 != 0 {
		return &ModeError{Dir: dir, Mode: m}
	}
	return nil
}
