package unitdir

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentd/agentd/internal/citest"
	"github.com/agentd/agentd/reconcile"
)

// testRoots opens a unit directory and one file root, <tmp>/etc/myapp,
// both in a temp dir; it returns the Roots and the root's path.
func testRoots(t *testing.T) (*Roots, string) {
	t.Helper()
	base := t.TempDir()
	units, err := Open(filepath.Join(base, "units"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { units.Close() })
	root := filepath.Join(base, "etc", "myapp")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRoots(units, []string{root}, filepath.Join(base, "state"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, root
}

// key is the registry key suffix of a config file of web.service.
func key(dest string) string { return reconcile.ConfigKey("web.service", dest) }

// self stands for the agent's own user and group in a table (selfOwner).
const self = "self"

// selfOwner is the test process's own user and group, by name.
func selfOwner(t *testing.T) string {
	t.Helper()
	u, err := user.LookupId(strconv.Itoa(os.Geteuid()))
	if err != nil {
		t.Fatal(err)
	}
	g, err := user.LookupGroupId(strconv.Itoa(os.Getegid()))
	if err != nil {
		t.Fatal(err)
	}
	return u.Username + ":" + g.Name
}

func value(bits uint32, owner, content string) []byte {
	return reconcile.ConfigFile{Mode: reconcile.ModeOf(bits), Owner: owner, Content: []byte(content)}.Encode()
}

// needAccounts skips (fails under CI) unless this host has the users and
// groups named.
func needAccounts(t *testing.T, owner string) {
	t.Helper()
	u, g, _ := strings.Cut(owner, ":")
	if _, err := user.Lookup(u); err != nil {
		citest.Unavailable(t, "no user %q on this machine", u)
	}
	if _, err := user.LookupGroup(g); err != nil {
		citest.Unavailable(t, "no group %q on this machine", g)
	}
}

func stat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

// lookID is the uid or gid of a name, for comparing with stat.
func lookID(t *testing.T, owner string) (uint32, uint32) {
	t.Helper()
	un, gn, _ := strings.Cut(owner, ":")
	u, err := user.Lookup(un)
	if err != nil {
		t.Fatal(err)
	}
	g, err := user.LookupGroup(gn)
	if err != nil {
		t.Fatal(err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		t.Fatal(err)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(uid), uint32(gid)
}

// A config file is written with its mode and owner and reads back as the
// same bytes: the registry value's hash is the file's.
func TestRootsRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bits  uint32
		owner string
	}{
		{"0644 agent's own", 0o644, self},
		{"0600 agent's own", 0o600, self},
		{"0640 nobody:nogroup", 0o640, "nobody:nogroup"},
		{"02755 nobody:nogroup", 0o2755, "nobody:nogroup"},
		{"04750 daemon:nogroup", 0o4750, "daemon:nogroup"},
		{"01644 agent's own", 0o1644, self},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.owner == self {
				tc.owner = selfOwner(t)
			} else {
				citest.NeedRoot(t, "chown to another user")
				needAccounts(t, tc.owner)
			}
			r, root := testRoots(t)
			dest := filepath.Join(root, "conf.d", "app.conf")
			v := value(tc.bits, tc.owner, "listen=8080\nsecret=s3cr3t\n")
			if err := r.Check(key(dest), v); err != nil {
				t.Fatalf("check: %v", err)
			}
			if err := r.Write(key(dest), v); err != nil {
				t.Fatalf("write: %v", err)
			}
			got, exists, err := r.Read(key(dest))
			if err != nil || !exists || !bytes.Equal(got, v) {
				t.Fatalf("read back = %q %v %v, want %q", got, exists, err, v)
			}
			st := stat(t, dest)
			if perm := st.Mode & 0o7777; perm != tc.bits {
				t.Errorf("mode on disk %04o, want %04o", perm, tc.bits)
			}
			wantUID, wantGID := lookID(t, tc.owner)
			if st.Uid != wantUID || st.Gid != wantGID {
				t.Errorf("owner on disk %d:%d, want %d:%d", st.Uid, st.Gid, wantUID, wantGID)
			}
			if b, _ := os.ReadFile(dest); string(b) != "listen=8080\nsecret=s3cr3t\n" {
				t.Errorf("content on disk %q: the header must not be written", b)
			}
			entries, _ := os.ReadDir(filepath.Dir(dest))
			if len(entries) != 1 {
				t.Errorf("temp files left: %v", entries)
			}
			// Rewritten with other content: replaced, not edited in place.
			v2 := value(tc.bits, tc.owner, "listen=9090\n")
			if err := r.Write(key(dest), v2); err != nil {
				t.Fatal(err)
			}
			if st2 := stat(t, dest); st2.Ino == st.Ino {
				t.Error("rewritten in place, not replaced by rename")
			}
			if got, _, _ := r.Read(key(dest)); !bytes.Equal(got, v2) {
				t.Errorf("read back %q, want %q", got, v2)
			}
		})
	}
}

// A chmod or chown by hand is drift: Read no longer gives the registry's
// bytes.
func TestRootsHandChangeIsDrift(t *testing.T) {
	r, root := testRoots(t)
	dest := filepath.Join(root, "app.conf")
	v := value(0o640, selfOwner(t), "x=1\n")
	if err := r.Write(key(dest), v); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dest, 0o644); err != nil {
		t.Fatal(err)
	}
	got, _, err := r.Read(key(dest))
	if err != nil || bytes.Equal(got, v) || !bytes.Equal(got, value(0o644, selfOwner(t), "x=1\n")) {
		t.Fatalf("after chmod 0644: read %q %v", got, err)
	}
	if os.Geteuid() != 0 {
		return
	}
	needAccounts(t, "nobody:nogroup")
	if err := os.Chown(dest, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	got, _, _ = r.Read(key(dest))
	if !bytes.Contains(got, []byte(" owner=nobody:nogroup\n")) {
		t.Fatalf("after chown: read %q", got)
	}
	// An ID without a name reads back as a number, which no registry
	// value can be: the file is rewritten, never taken as converged.
	if err := os.Chown(dest, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	got, _, _ = r.Read(key(dest))
	if !bytes.HasPrefix(got, []byte("#agentd-file mode=0644 owner=54321:54321\n")) {
		t.Fatalf("unnamed owner: read %q", got)
	}
	if _, err := reconcile.DecodeConfigFile(got); err == nil {
		t.Fatal("a numeric owner must not be a valid registry value")
	}
}

// Nothing is written in the place of a symlink, a directory or a FIFO, and
// a symlink is never followed.
func TestRootsRefuseNonRegular(t *testing.T) {
	r, root := testRoots(t)
	outside := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(outside, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	inside := filepath.Join(root, "other.conf")
	if err := os.WriteFile(inside, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link.conf")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	inLink := filepath.Join(root, "inlink.conf")
	if err := os.Symlink("other.conf", inLink); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "dir.conf")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(root, "fifo.conf")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	v := value(0o644, "", "new\n")
	for _, dest := range []string{link, inLink, dir, fifo} {
		t.Run(filepath.Base(dest), func(t *testing.T) {
			for op, err := range map[string]error{
				"check":  r.Check(key(dest), v),
				"write":  r.Write(key(dest), v),
				"remove": r.Remove(key(dest)),
			} {
				if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), dest) {
					t.Errorf("%s: %v, want ErrNotRegular naming %s", op, err, dest)
				}
			}
			if _, exists, err := r.Read(key(dest)); !errors.Is(err, ErrNotRegular) || !exists {
				t.Errorf("read: %v %v, want ErrNotRegular", exists, err)
			}
			if fi, err := os.Lstat(dest); err != nil || fi.Mode().IsRegular() {
				t.Errorf("%s replaced: %v %v", dest, fi, err)
			}
		})
	}
	for _, p := range []string{outside, inside} {
		if b, _ := os.ReadFile(p); string(b) != "untouched" {
			t.Errorf("symlink target %s written: %q", p, b)
		}
	}
}

// A path under no root is refused, saying so; so is every config file when
// the agent has no roots. ".." never gets a file out of a root, nor does a
// symlinked directory.
func TestRootsOutsideRefused(t *testing.T) {
	r, root := testRoots(t)
	v := value(0o644, "", "x\n")
	sibling := filepath.Join(filepath.Dir(root), "myapp2", "x.conf") // shares a prefix
	for _, dest := range []string{"/etc/passwd", sibling, root} {
		for op, err := range map[string]error{
			"check":  r.Check(key(dest), v),
			"write":  r.Write(key(dest), v),
			"remove": r.Remove(key(dest)),
		} {
			if err == nil || !strings.Contains(err.Error(), dest) {
				t.Errorf("%s %s: %v", op, dest, err)
			}
		}
		if _, _, err := r.Read(key(dest)); err == nil {
			t.Errorf("read %s: no error", dest)
		}
	}
	if err := r.Write(key("/etc/passwd"), v); !errors.Is(err, ErrOutsideRoots) || !strings.Contains(err.Error(), root) {
		t.Errorf("outside: %v, want ErrOutsideRoots listing %s", err, root)
	}
	if _, err := os.Stat(filepath.Dir(sibling)); !errors.Is(err, os.ErrNotExist) {
		t.Error("a directory was made outside the root")
	}

	// ".." is refused by name, and a symlinked directory leading out by
	// the os.Root.
	up := root + "/../escape.conf"
	if err := r.Write(key(up), v); err == nil || !strings.Contains(err.Error(), "..") {
		t.Errorf("write %s: %v", up, err)
	}
	out := t.TempDir()
	if err := os.Symlink(out, filepath.Join(root, "out")); err != nil {
		t.Fatal(err)
	}
	via := filepath.Join(root, "out", "x.conf")
	if err := r.Check(key(via), v); err == nil {
		t.Errorf("check %s: no error", via)
	}
	if err := r.Write(key(via), v); err == nil {
		t.Errorf("write %s: no error", via)
	}
	if _, _, err := r.Read(key(via)); err == nil {
		t.Errorf("read %s: no error", via)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("written outside the root: %v", entries)
	}

	// No roots: every config file refused, clearly.
	units, _ := Open(t.TempDir())
	defer units.Close()
	none, err := OpenRoots(units, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = none.Read(key(filepath.Join(root, "x.conf")))
	if !errors.Is(err, ErrOutsideRoots) || !strings.Contains(err.Error(), "started with none") {
		t.Errorf("no roots: %v", err)
	}
}

// An owner this host does not have, or cannot read back by the names
// given, refuses the file before anything is written: no file, no temp
// file, no directory.
func TestRootsOwnerRefused(t *testing.T) {
	r, root := testRoots(t)
	dest := filepath.Join(root, "sub", "app.conf")
	cases := map[string]string{
		"no-such-user:nogroup":    `no user "no-such-user"`,
		"nobody:no-such-group":    `no group "no-such-group"`,
		"not a header":            "must begin with",
		"#agentd-file mode=0648":  "not octal",
		"#agentd-file mode=644":   "owner=USER:GROUP",
		"#agentd-file mode=0644x": "mode",
	}
	for owner, want := range cases {
		v := value(0o640, owner, "x\n")
		if strings.HasPrefix(owner, "#") || strings.Contains(owner, " ") {
			v = []byte(owner + "\nx\n")
		} else {
			needAccounts(t, "nobody:nogroup")
		}
		for op, err := range map[string]error{"check": r.Check(key(dest), v), "write": r.Write(key(dest), v)} {
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), dest) {
				t.Errorf("%s %q: %v, want an error naming %s and saying %q", op, owner, err, dest, want)
			}
		}
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("something written: %v", entries)
	}
}

// Without CAP_CHOWN (agentd.service runs without capabilities) a file for
// another user or group is refused before anything is written; without
// CAP_FSETID, a setgid bit for a group the agent is not in.
func TestRootsCapabilitiesChecked(t *testing.T) {
	needAccounts(t, "nobody:nogroup")
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if g, _ := user.LookupGroup("nogroup"); g.Gid == strconv.Itoa(os.Getegid()) {
		citest.Unavailable(t, "the test runs as group nogroup: it needs a group other than its own")
	}
	r, root := testRoots(t)
	dest := filepath.Join(root, "app.conf")
	defer func() { capsNow = effectiveCaps }()
	for _, tc := range []struct {
		name  string
		caps  uint64
		bits  uint32
		owner string
		want  string
	}{
		{"another user", 0, 0o640, "nobody:nogroup", "lacks CAP_CHOWN"},
		{"another group", 0, 0o640, me.Username + ":nogroup", "lacks CAP_CHOWN"},
		{"setgid for another group", 1 << capChown, 0o2750, me.Username + ":nogroup", "lacks CAP_FSETID"},
	} {
		capsNow = func() (uint64, bool) { return tc.caps, true }
		v := value(tc.bits, tc.owner, "x\n")
		for op, err := range map[string]error{"check": r.Check(key(dest), v), "write": r.Write(key(dest), v)} {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s, %s: %v, want %q", tc.name, op, err, tc.want)
			}
		}
	}
	capsNow = func() (uint64, bool) { return 0, true }
	if err := r.Check(key(dest), value(0o2755, "", "x\n")); err != nil {
		t.Errorf("the agent's own file, setgid, needs no capability: %v", err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("written: %v", entries)
	}
}

// Missing directories are made 0755 whatever the umask; the file is
// removed alone.
func TestRootsParentsMadeAndKept(t *testing.T) {
	r, root := testRoots(t)
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dest := filepath.Join(root, "a", "b", "app.conf")
	if err := r.Write(key(dest), value(0o644, "", "x\n")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Join(root, "a"), filepath.Join(root, "a", "b")} {
		if st := stat(t, d); st.Mode&0o7777 != 0o755 {
			t.Errorf("%s: mode %04o, want 0755", d, st.Mode&0o7777)
		}
	}
	if st := stat(t, dest); st.Mode&0o7777 != 0o644 {
		t.Errorf("file mode %04o under umask 077", st.Mode&0o7777)
	}
	// A file where a directory should be.
	if err := r.Check(key(filepath.Join(root, "a", "b", "app.conf", "x")), value(0o644, "", "")); err == nil {
		t.Error("check through a file: no error")
	}
	if err := r.Write(key(filepath.Join(root, "a", "b", "app.conf", "x")), value(0o644, "", "")); err == nil {
		t.Error("write through a file: no error")
	}
	if err := r.Remove(key(dest)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("not removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "a", "b")); err != nil {
		t.Errorf("its directory was removed too: %v", err)
	}
	if err := r.Remove(key(dest)); err != nil {
		t.Errorf("removing a missing file: %v", err)
	}
	if _, exists, err := r.Read(key(dest)); exists || err != nil {
		t.Errorf("read a missing file: %v %v", exists, err)
	}
}

// A directory the agent cannot make files in (here immutable; under
// agentd.service, read-only for want of ReadWritePaths=) is known to Check,
// before any file of the set is written.
func TestRootsUnwritableRefusedByCheck(t *testing.T) {
	r, root := testRoots(t)
	locked := filepath.Join(root, "locked")
	if err := os.Mkdir(locked, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("chattr", "+i", locked).CombinedOutput(); err != nil {
		citest.Unavailable(t, "chattr +i: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", locked).Run() })
	for _, dest := range []string{filepath.Join(locked, "app.conf"), filepath.Join(locked, "sub", "app.conf")} {
		v := value(0o644, "", "x\n")
		for op, err := range map[string]error{"check": r.Check(key(dest), v), "write": r.Write(key(dest), v)} {
			if err == nil || !strings.Contains(err.Error(), "cannot make files in "+locked) {
				t.Errorf("%s %s: %v", op, dest, err)
			}
		}
	}
	if entries, _ := os.ReadDir(locked); len(entries) != 0 {
		t.Errorf("written: %v", entries)
	}
}

// Unit directory paths go to the unit directory, unchanged.
func TestRootsUnitPathsPassThrough(t *testing.T) {
	r, root := testRoots(t)
	if err := r.Write("web.service", []byte("[Service]\n")); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteBatched("web.service.d/x.conf", []byte("[Unit]\n")); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(r.units.Path(), "web.service"))
	if err != nil || string(b) != "[Service]\n" {
		t.Fatalf("unit file: %q %v", b, err)
	}
	names, err := r.List()
	if err != nil || !slices.Equal(names, []string{"web.service", "web.service.d/x.conf"}) {
		t.Fatalf("list = %v %v", names, err)
	}
	if err := os.Mkdir(filepath.Join(r.units.Path(), "dir.service"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := r.Check("dir.service", []byte("x")); !errors.Is(err, ErrNotRegular) {
		t.Errorf("check a directory in the unit dir: %v", err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("unit files landed in the root: %v", entries)
	}
}

// WriteBatched leaves the directory fsyncs to Flush, one per directory,
// across the unit directory and the roots.
func TestRootsBatchedFsyncs(t *testing.T) {
	r, root := testRoots(t)
	if err := os.MkdirAll(filepath.Join(root, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	var synced []string
	fsyncDir = func(f *os.File) error {
		synced = append(synced, f.Name())
		return f.Sync()
	}
	defer func() { fsyncDir = (*os.File).Sync }()
	for _, p := range []string{"web.service", key(filepath.Join(root, "a", "1.conf")), key(filepath.Join(root, "a", "2.conf")), key(filepath.Join(root, "3.conf"))} {
		v := []byte("[Service]\n")
		if reconcile.IsConfigPath(p) {
			v = value(0o644, "", "x\n")
		}
		if err := r.WriteBatched(p, v); err != nil {
			t.Fatal(err)
		}
	}
	if len(synced) != 0 {
		t.Fatalf("fsyncs before Flush: %v", synced)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(synced) != 3 {
		t.Fatalf("Flush synced %v, want the unit dir, the root and root/a once each", synced)
	}
}

// CleanTemps sweeps the roots too, at any depth, and only the agent's own
// temp names.
func TestRootsCleanTemps(t *testing.T) {
	r, root := testRoots(t)
	deep := filepath.Join(root, "a", "b")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	stale := []string{
		filepath.Join(root, ".app.conf.agentd-0123456789ab"),
		filepath.Join(deep, ".x.conf.agentd-ba9876543210"),
		filepath.Join(r.units.Path(), ".web.service.agentd-00112233aabb"),
	}
	keep := []string{
		filepath.Join(root, "app.conf"),
		filepath.Join(root, ".app.conf.agentd-tmp"),
		filepath.Join(deep, "x.conf.agentd-0123456789ab"),
	}
	for _, p := range append(slices.Clone(stale), keep...) {
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(root, ".l.conf.agentd-0123456789ab")
	if err := os.Symlink(keep[0], link); err != nil {
		t.Fatal(err)
	}
	removed, err := r.CleanTemps()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := slices.Sorted(slices.Values(stale))
	if !slices.Equal(removed, want) {
		t.Fatalf("removed %v, want %v", removed, want)
	}
	for _, p := range append(keep, link) {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s removed: %v", p, err)
		}
	}
}

// A root must be an absolute, clean, existing directory that neither holds
// nor lies in the unit directory or the state directory.
func TestOpenRootsRefuses(t *testing.T) {
	base := t.TempDir()
	unitPath := filepath.Join(base, "etc", "systemd", "system")
	state := filepath.Join(base, "var", "lib", "agentd")
	for _, d := range []string{unitPath, state, filepath.Join(base, "etc", "myapp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(unitPath, "x"), filepath.Join(base, "sneaky")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(unitPath, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	units, err := Open(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	defer units.Close()
	for _, tc := range []struct{ root, want string }{
		{"etc/myapp", "absolute"},
		{"", "absolute"},
		{base + "/etc/./myapp", "not a clean path"},
		{base + "/etc/myapp/", "not a clean path"},
		{"/", "whole file system"},
		{filepath.Join(base, "nope"), "no such file"},
		{file, "not a directory"},
		{filepath.Join(base, "etc"), "holds the unit directory"},
		{filepath.Join(unitPath, "x"), "is inside the unit directory"},
		{unitPath, "the unit directory"},
		{filepath.Join(base, "var"), "holds " + state},
		{filepath.Join(base, "sneaky"), "is inside the unit directory"},
	} {
		r, err := OpenRoots(units, []string{filepath.Join(base, "etc", "myapp"), tc.root}, state)
		if err == nil {
			r.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--file-root %q: %v, want %q", tc.root, err, tc.want)
		}
	}
	// Repeated and nested roots are fine: the longest holds.
	outer, inner := filepath.Join(base, "etc", "myapp"), filepath.Join(base, "etc", "myapp", "inner")
	if err := os.Mkdir(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRoots(units, []string{outer, inner, outer}, state)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := r.Paths(); !slices.Equal(got, []string{inner, outer}) {
		t.Fatalf("paths = %v", got)
	}
	d, rel, err := r.locate(filepath.Join(inner, "x.conf"))
	if err != nil || d.Path() != inner || rel != "x.conf" {
		t.Fatalf("locate: %v %q %v", d, rel, err)
	}
}
