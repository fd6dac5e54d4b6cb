package unitdir

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

func TestWriteIsAtomicReplace(t *testing.T) {
	root := t.TempDir()
	d, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Write("a.service", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	var st1 syscall.Stat_t
	if err := syscall.Stat(filepath.Join(root, "a.service"), &st1); err != nil {
		t.Fatal(err)
	}
	if err := d.Write("a.service", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	var st2 syscall.Stat_t
	if err := syscall.Stat(filepath.Join(root, "a.service"), &st2); err != nil {
		t.Fatal(err)
	}
	if st1.Ino == st2.Ino {
		t.Fatal("file rewritten in place, not replaced by rename")
	}
	if st2.Mode&0o777 != 0o644 {
		t.Fatalf("mode %o, want 644", st2.Mode&0o777)
	}
	b, exists, err := d.Read("a.service")
	if err != nil || !exists || string(b) != "v2" {
		t.Fatalf("read: %q %v %v", b, exists, err)
	}
	entries, _ := os.ReadDir(root)
	if len(entries) != 1 {
		t.Fatalf("temp files left behind: %v", entries)
	}
}

func TestDropInDirectoryCreatedAndRemoved(t *testing.T) {
	root := t.TempDir()
	d, _ := Open(root)
	defer d.Close()
	if err := d.Write("a.service.d/x.conf", []byte("[Service]\n")); err != nil {
		t.Fatal(err)
	}
	if err := d.Remove("a.service.d/x.conf"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "a.service.d")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("empty drop-in dir left: %v", err)
	}
	if err := d.Remove("gone.service"); err != nil {
		t.Fatalf("removing a missing file: %v", err)
	}
}

func TestNothingLeavesTheDirectory(t *testing.T) {
	parent := t.TempDir()
	root := filepath.Join(parent, "units")
	d, _ := Open(root)
	defer d.Close()
	for _, p := range []string{"../x.service", "/etc/x.service", "a/../../x.service", "", ".", "..", "a/./b", "a//b", "a/", "x.service.d/../../y"} {
		if err := d.Write(p, []byte("x")); err == nil {
			t.Errorf("Write(%q) succeeded", p)
		}
		if _, _, err := d.Read(p); err == nil {
			t.Errorf("Read(%q) succeeded", p)
		}
		if err := d.Remove(p); err == nil {
			t.Errorf("Remove(%q) succeeded", p)
		}
	}
	// A symlinked directory inside the root must not lead outside either.
	if err := os.Symlink(parent, filepath.Join(root, "link.d")); err != nil {
		t.Fatal(err)
	}
	if err := d.Write("link.d/x.conf", []byte("x")); err == nil {
		t.Error("write through a symlink that leaves the root succeeded")
	}
	if _, err := os.Stat(filepath.Join(parent, "x.conf")); err == nil {
		t.Error("file written outside the unit directory")
	}
}

// TestEscapedNamesAreFileNames: the names systemd-escape makes carry a
// backslash, an ordinary character of a Linux file name; they are written,
// read and removed as they are spelled, in the directory and nowhere else.
func TestEscapedNamesAreFileNames(t *testing.T) {
	root := t.TempDir()
	d, _ := Open(root)
	defer d.Close()
	for _, p := range []string{`foo\x2dbar.service`, `a@b\x2dc.service`, `srv-my\x2ddata.mount`, `foo\x2dbar.service.d/10-x.conf`, `a\..\b.service`} {
		if err := d.Write(p, []byte(p)); err != nil {
			t.Fatalf("Write(%q): %v", p, err)
		}
		if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != p {
			t.Fatalf("%q on disk: %q, %v", p, b, err)
		}
		if b, ok, err := d.Read(p); err != nil || !ok || string(b) != p {
			t.Fatalf("Read(%q) = %q, %v, %v", p, b, ok, err)
		}
	}
	for _, p := range []string{`foo\x2dbar.service.d/10-x.conf`, `foo\x2dbar.service`} {
		if err := d.Remove(p); err != nil {
			t.Fatalf("Remove(%q): %v", p, err)
		}
	}
	entries, _ := os.ReadDir(root)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{`a@b\x2dc.service`, `a\..\b.service`, `srv-my\x2ddata.mount`}; !slices.Equal(names, want) {
		t.Fatalf("directory holds %q, want %q", names, want)
	}
	if entries, _ := os.ReadDir(filepath.Dir(root)); len(entries) != 1 {
		t.Fatalf("something was written beside the directory: %v", entries)
	}
}

func TestAppend(t *testing.T) {
	root := t.TempDir()
	d, _ := Open(root)
	defer d.Close()
	for _, line := range []string{"one\n", "two\n"} {
		if err := d.Append("j", []byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "j")); string(b) != "one\ntwo\n" {
		t.Fatalf("appended file holds %q", b)
	}
	for _, p := range []string{"../j", "/tmp/j", ""} {
		if err := d.Append(p, []byte("x")); err == nil {
			t.Errorf("Append(%q) succeeded", p)
		}
	}
	if err := os.Symlink("/dev/null", filepath.Join(root, "masked")); err != nil {
		t.Fatal(err)
	}
	if err := d.Append("masked", []byte("x")); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("append to a symlink: %v", err)
	}
}

func TestNonRegularTargetsAreRefused(t *testing.T) {
	root := t.TempDir()
	d, _ := Open(root)
	defer d.Close()
	// A masked unit is a symlink to /dev/null: never replace it.
	if err := os.Symlink("/dev/null", filepath.Join(root, "masked.service")); err != nil {
		t.Fatal(err)
	}
	if err := d.Write("masked.service", []byte("x")); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("write over a symlink: %v", err)
	}
	if _, _, err := d.Read("masked.service"); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("read of a symlink: %v", err)
	}
	if err := d.Remove("masked.service"); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("remove of a symlink: %v", err)
	}
	if target, _ := os.Readlink(filepath.Join(root, "masked.service")); target != "/dev/null" {
		t.Fatal("symlink touched")
	}
}

func TestManifestPersists(t *testing.T) {
	dir := t.TempDir()
	m, err := OpenManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Set("a.service", reconcile.Owned{Hash: "h1"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Set("b.service", reconcile.Owned{Hash: "h2"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Forget("b.service"); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m2, err := OpenManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	got := m2.Managed()
	if len(got) != 1 || got["a.service"] != (reconcile.Owned{Hash: "h1"}) {
		t.Fatalf("reloaded manifest = %v", got)
	}
}

func TestCorruptManifestIsAnError(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "managed.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenManifest(dir); err == nil || !strings.Contains(err.Error(), "managed.json") {
		t.Fatalf("corrupt manifest: %v", err)
	}
}

func TestWatchReportsEditsAndDropIns(t *testing.T) {
	root := t.TempDir()
	d, _ := Open(root)
	defer d.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan string, 100)
	done := make(chan error, 1)
	go func() { done <- d.Watch(ctx, func(p string) { got <- p }) }()
	time.Sleep(50 * time.Millisecond) // let the watch start
	expect := func(want string) {
		t.Helper()
		deadline := time.After(2 * time.Second)
		for {
			select {
			case p := <-got:
				if strings.HasPrefix(p, ".") {
					t.Fatalf("temp file reported: %s", p)
				}
				if p == want {
					return
				}
			case <-deadline:
				t.Fatalf("no event for %s", want)
			}
		}
	}
	if err := d.Write("a.service", []byte("x")); err != nil {
		t.Fatal(err)
	}
	expect("a.service")
	if err := os.WriteFile(filepath.Join(root, "a.service"), []byte("edited by hand"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect("a.service")
	if err := d.Write("a.service.d/x.conf", []byte("x")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the new drop-in dir is added on its create event
	if err := os.WriteFile(filepath.Join(root, "a.service.d", "x.conf"), []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	expect("a.service.d/x.conf")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Temp files that killed writes left (".<name>.agentd-<12 hex>") go, at the
// top and in drop-in directories; nothing that merely looks like one does.
func TestCleanTempsRemovesOnlyTempFiles(t *testing.T) {
	root := t.TempDir()
	d, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	write := func(rel string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	temps := []string{
		".x.service.agentd-0123456789ab",
		".y.timer.agentd-ffffffffffff",
		"x.service.d/.env.conf.agentd-a1b2c3d4e5f6",
	}
	survivors := []string{
		"x.service",
		".x.service.agentd-zz",
		".x.service.agentd-0123456789a",            // 11 hex digits
		".x.service.agentd-0123456789abc",          // 13
		".x.service.agentd-0123456789AB",           // not lowercase
		".x.service.agentd-0123456789ab~",          // trailing junk
		"x.service.agentd-0123456789ab",            // no leading dot
		"..agentd-0123456789ab",                    // no name
		"x.service.d/env.conf",                     // a drop-in
		"x.service.wants/.a.agentd-0123456789ab",   // not a *.d directory
		"x.service.d/sub.d/.a.agentd-0123456789ab", // two levels down
	}
	for _, p := range append(append([]string{}, temps...), survivors...) {
		write(p)
	}
	// A directory named like a temp file, at the top and in a drop-in dir.
	for _, p := range []string{".z.service.agentd-0123456789ab", "x.service.d/.z.conf.agentd-0123456789ab"} {
		if err := os.Mkdir(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
		survivors = append(survivors, p)
	}
	// A symlink named like a temp file.
	if err := os.Symlink("x.service", filepath.Join(root, ".w.service.agentd-0123456789ab")); err != nil {
		t.Fatal(err)
	}
	survivors = append(survivors, ".w.service.agentd-0123456789ab")

	removed, err := d.CleanTemps()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, p := range temps {
		want = append(want, filepath.Join(root, p))
	}
	slices.Sort(removed)
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Fatalf("removed %q, want %q", removed, want)
	}
	for _, p := range temps {
		if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("temp file %s left: %v", p, err)
		}
	}
	for _, p := range survivors {
		if _, err := os.Lstat(filepath.Join(root, p)); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
	if removed, err := d.CleanTemps(); err != nil || len(removed) != 0 {
		t.Fatalf("second pass: %q %v", removed, err)
	}
}

// A Write that fails after making its temp file leaves no temp file for
// its target, not even one an earlier killed write left; other targets'
// temp files (maybe a concurrent Write's) are not its business.
func TestFailedWriteLeavesNoTempFile(t *testing.T) {
	root := t.TempDir()
	d, _ := Open(root)
	defer d.Close()
	stale := filepath.Join(root, "a.service.d", ".x.conf.agentd-0123456789ab")
	other := filepath.Join(root, "a.service.d", ".y.conf.agentd-0123456789ab")
	for _, p := range []string{stale, other} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	broken := errors.New("rename failed")
	renameTemp = func(r *os.Root, from, to string) error {
		if _, err := r.Lstat(from); err != nil {
			t.Errorf("no temp file at rename time: %v", err)
		}
		return broken
	}
	defer func() { renameTemp = (*os.Root).Rename }()
	if err := d.Write("a.service.d/x.conf", []byte("x")); !errors.Is(err, broken) {
		t.Fatalf("write: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(root, "a.service.d"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{".y.conf.agentd-0123456789ab"}) {
		t.Fatalf("left in the drop-in dir: %q", names)
	}
}

// A batch of writes costs one directory fsync per directory, at Flush; the
// files are in place (whole) before it.
func TestWriteBatchedSyncsEachDirectoryOnce(t *testing.T) {
	root := t.TempDir()
	d, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var synced []string
	fsyncDir = func(f *os.File) error {
		synced = append(synced, filepath.Base(f.Name()))
		return f.Sync()
	}
	defer func() { fsyncDir = (*os.File).Sync }()

	files := []string{"a.service", "b.service", "c.service", "a.service.d/x.conf", "a.service.d/y.conf"}
	for _, p := range files {
		if err := d.WriteBatched(p, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if len(synced) != 0 {
		t.Fatalf("directory fsyncs before Flush: %v", synced)
	}
	for _, p := range files {
		if b, ok, err := d.Read(p); err != nil || !ok || string(b) != p {
			t.Fatalf("read %s before Flush: %q %v %v", p, b, ok, err)
		}
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(synced)
	if want := []string{".", "a.service.d"}; !slices.Equal(synced, want) {
		t.Fatalf("Flush synced %v, want each directory once: %v", synced, want)
	}
	synced = nil
	if err := d.Flush(); err != nil || len(synced) != 0 {
		t.Fatalf("second Flush synced %v (%v), want nothing", synced, err)
	}
	if err := d.Write("d.service", nil); err != nil || len(synced) != 1 {
		t.Fatalf("Write synced %v (%v), want its directory once", synced, err)
	}
	for _, dir := range []string{root, filepath.Join(root, "a.service.d")} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if isTemp(e.Name()) {
				t.Fatalf("temp file left: %s", e.Name())
			}
		}
	}
}

// A change is written to the journal, the size of the change; past
// compactAfter entries the manifest is written whole and the journal goes.
// Whatever the mix on disk, a reopen sees the newest state, and a journal
// older than the manifest (left by a crash after a compaction) is ignored.
func TestManifestJournal(t *testing.T) {
	dir := t.TempDir()
	m, err := OpenManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	reopen := func() *Manifest {
		t.Helper()
		m2, err := OpenManifest(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m2.Close() })
		return m2
	}
	exists := func(name string) bool {
		_, err := os.Stat(filepath.Join(dir, name))
		return err == nil
	}
	rec := func(h string) reconcile.UnitRecord {
		return reconcile.UnitRecord{Applied: map[string]string{"a.service": h}, Own: reconcile.OwnFile}
	}
	in := reconcile.Intent{Reload: true, Jobs: map[string]string{"a.service": "k1"}}
	if err := m.Claim(map[string]string{"a.service": "h1"}, in); err != nil {
		t.Fatal(err)
	}
	if err := m.SetUnits(map[string]reconcile.UnitRecord{"a.service": rec("h1")}, reconcile.Intent{}); err != nil {
		t.Fatal(err)
	}
	if exists(manifestFile) || !exists(journalFile) {
		t.Fatalf("after two small changes: manifest written %v, journal %v; want only the journal", exists(manifestFile), exists(journalFile))
	}
	r := reopen()
	if got := r.Managed(); got["a.service"] != (reconcile.Owned{Hash: "h1"}) || len(got) != 1 {
		t.Fatalf("files from the journal = %v", got)
	}
	if got := r.Units()["a.service"]; got.Applied["a.service"] != "h1" {
		t.Fatalf("record from the journal = %+v", got)
	}
	if !r.Intent().Empty() {
		t.Fatalf("intent = %+v, want the newest (empty)", r.Intent())
	}
	stale, err := os.ReadFile(filepath.Join(dir, journalFile))
	if err != nil {
		t.Fatal(err)
	}

	// Enough entries to compact.
	files := map[string]string{}
	for i := range compactAfter {
		files[fmt.Sprintf("u%03d.service", i)] = "h"
	}
	if err := m.Claim(files, in); err != nil {
		t.Fatal(err)
	}
	if !exists(manifestFile) || exists(journalFile) {
		t.Fatalf("after %d entries: manifest written %v, journal %v; want the manifest only", compactAfter+2, exists(manifestFile), exists(journalFile))
	}
	if err := m.Forget("u000.service"); err != nil {
		t.Fatal(err)
	}
	r = reopen()
	if got := r.Managed(); len(got) != compactAfter || got["a.service"] != (reconcile.Owned{Hash: "h1"}) || got["u000.service"] != (reconcile.Owned{}) {
		t.Fatalf("after compaction and a forget: %d files (a.service=%+v, u000.service=%+v)", len(got), got["a.service"], got["u000.service"])
	}
	if got := r.Intent(); !got.Reload || got.Jobs["a.service"] != "k1" {
		t.Fatalf("intent after compaction = %+v", got)
	}

	// A crash after a compaction, before the journal was removed: the
	// old journal (lower sequence) must not win over the manifest.
	if err := m.Forget("a.service"); err != nil { // the stale journal still has it
		t.Fatal(err)
	}
	more := map[string]string{}
	for i := range compactAfter + 1 {
		more[fmt.Sprintf("v%03d.service", i)] = "h"
	}
	if err := m.Claim(more, reconcile.Intent{}); err != nil { // compacts again
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, journalFile), stale, 0o600); err != nil {
		t.Fatal(err)
	}
	r = reopen()
	if got := r.Managed(); len(got) != 2*compactAfter || got["a.service"] != (reconcile.Owned{}) || !r.Intent().Empty() {
		t.Fatalf("a stale journal was applied: %d files, intent %+v", len(got), r.Intent())
	}

	os.WriteFile(filepath.Join(dir, journalFile), []byte("{not json"), 0o600)
	if _, err := OpenManifest(dir); err == nil || !strings.Contains(err.Error(), journalFile) {
		t.Fatalf("corrupt journal: %v", err)
	}
}

// The state directory's form does not change with the typed entries
// (reconcile.Owned): an agent downgraded or upgraded across them reads
// the other's manifest. Old-form bytes read back, and what is written now
// is byte-identical to what the agents before wrote for the same content.
func TestManifestWireFormUnchanged(t *testing.T) {
	inst, h1 := reconcile.Owned{Instance: true}, reconcile.Owned{Hash: "h1"}
	t.Run("reads the old form", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, manifestFile), []byte(`{"version":2,"seq":3,"files":{"a.service":"h1","b.service":"h2","web@1.service":"instance"}}`+"\n"), 0o600)
		os.WriteFile(filepath.Join(dir, journalFile), []byte(`{"seq":4,"files":{"b.service":"","web@2.service":"instance"}}`+"\n"), 0o600)
		m, err := OpenManifest(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		want := map[string]reconcile.Owned{"a.service": h1, "web@1.service": inst, "web@2.service": inst}
		if got := m.Managed(); !maps.Equal(got, want) {
			t.Fatalf("Managed() = %v, want %v", got, want)
		}
	})
	t.Run("writes the old form", func(t *testing.T) {
		dir := t.TempDir()
		m, err := OpenManifest(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		read := func(name string) string {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		if err := m.Set("web@1.service", inst); err != nil {
			t.Fatal(err)
		}
		if err := m.Set("a.service", h1); err != nil {
			t.Fatal(err)
		}
		if got, want := read(journalFile), `{"seq":2,"files":{"a.service":"h1","web@1.service":"instance"}}`+"\n"; got != want {
			t.Fatalf("journal:\n got %s\nwant %s", got, want)
		}
		files := map[string]string{}
		var want strings.Builder
		want.WriteString(`{"version":2,"seq":3,"files":{"a.service":"h1",`)
		for i := range compactAfter {
			p := fmt.Sprintf("u%03d.service", i)
			files[p] = "h"
			fmt.Fprintf(&want, "%q:\"h\",", p)
		}
		want.WriteString(`"web@1.service":"instance"}}` + "\n")
		if err := m.Claim(files, reconcile.Intent{}); err != nil { // compacts
			t.Fatal(err)
		}
		if got := read(manifestFile); got != want.String() {
			t.Fatalf("manifest:\n got %s\nwant %s", got, want.String())
		}
	})
}
