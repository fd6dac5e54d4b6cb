package unitdir

import (
	"github.com/agentd/agentd/internal/citest"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/agentd/agentd/reconcile"
)

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// The state directory is 0700 and managed.json and the blobs 0600 whatever
// the umask (here 0, the widest); a directory and files left wider by an
// earlier version are tightened when it is opened. Unit files stay 0644.
func TestPrivateModesUnderUmask0(t *testing.T) {
	old := syscall.Umask(0) // process-wide: this test is not parallel
	defer syscall.Umask(old)

	state := filepath.Join(t.TempDir(), "state")
	m, err := OpenManifest(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Set("a.service", reconcile.Owned{Hash: "h1"}); err != nil {
		t.Fatal(err)
	}
	if err := m.PutBlob("h1", []byte("Environment=TOKEN=secret\n")); err != nil {
		t.Fatal(err)
	}
	m.Close()
	d, err := OpenPrivate(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Append("log", []byte("a line\n")); err != nil {
		t.Fatal(err)
	}
	d.Close()
	for p, want := range map[string]os.FileMode{
		state:                               0o700,
		filepath.Join(state, "log"):         0o600,
		filepath.Join(state, journalFile):   0o600,
		filepath.Join(state, "blobs"):       0o700,
		filepath.Join(state, "blobs", "h1"): 0o600,
	} {
		if got := mode(t, p); got != want {
			t.Errorf("%s: mode %04o, want %04o", p, got, want)
		}
	}

	// As an earlier version (or a umask of 0) left them.
	for _, p := range []string{state, filepath.Join(state, "blobs")} {
		os.Chmod(p, 0o755)
	}
	for _, p := range []string{filepath.Join(state, "managed.json"), filepath.Join(state, "blobs", "h1"), filepath.Join(state, "registry-snapshot.json")} {
		os.WriteFile(p, []byte("{}"), 0o644)
		os.Chmod(p, 0o644)
	}
	outside := filepath.Join(t.TempDir(), "outside")
	os.WriteFile(outside, nil, 0o644)
	os.Chmod(outside, 0o644)
	os.Symlink(outside, filepath.Join(state, "link"))
	d, err = OpenPrivate(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Write("registry-snapshot.json", []byte("{}\n")); err != nil {
		t.Fatal(err)
	}
	d.Close()
	for p, want := range map[string]os.FileMode{
		state:                                          0o700,
		filepath.Join(state, "managed.json"):           0o600,
		filepath.Join(state, "blobs"):                  0o700,
		filepath.Join(state, "blobs", "h1"):            0o600,
		filepath.Join(state, "registry-snapshot.json"): 0o600,
	} {
		if got := mode(t, p); got != want {
			t.Errorf("tightened %s: mode %04o, want %04o", p, got, want)
		}
	}
	if got := mode(t, outside); got != 0o644 {
		t.Errorf("a symlink's target outside was changed to %04o", got)
	}

	units, err := Open(filepath.Join(t.TempDir(), "units"))
	if err != nil {
		t.Fatal(err)
	}
	defer units.Close()
	if err := units.Write("x.service.d/10-a.conf", []byte("[Service]\n")); err != nil {
		t.Fatal(err)
	}
	if got := mode(t, filepath.Join(units.Path(), "x.service.d", "10-a.conf")); got != 0o644 {
		t.Errorf("unit file: mode %04o, want 0644", got)
	}
}

// A private directory that belongs to another user is refused, not used.
func TestPrivateDirOfAnotherUser(t *testing.T) {
	citest.NeedRoot(t, "to give a directory away")
	dir := filepath.Join(t.TempDir(), "theirs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenPrivate(dir); err == nil {
		t.Fatal("a directory of uid 65534 was accepted as the state directory")
	}
}
