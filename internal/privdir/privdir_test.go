package privdir

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	private, wide, file := filepath.Join(dir, "private"), filepath.Join(dir, "wide"), filepath.Join(dir, "file")
	for p, mode := range map[string]fs.FileMode{private: 0o700, wide: 0o750} {
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // whatever the umask
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Check(private); err != nil {
		t.Errorf("a 0700 directory of ours: %v", err)
	}
	var me *ModeError
	if err := Check(wide); !errors.As(err, &me) || me.Mode != 0o750 || me.Dir != wide {
		t.Errorf("a 0750 directory: %v, want a ModeError with mode 0750", err)
	}
	if err := Check(file); err == nil || errors.As(err, &me) {
		t.Errorf("a file: %v, want not a directory", err)
	}
	if err := Check(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing directory: %v, want fs.ErrNotExist", err)
	}
}
