package unitdir

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/agentd/agentd/reconcile"
)

// ErrOutsideRoots is returned for a config file whose path is under none
// of the file roots the agent was started with (agentd run --file-root).
var ErrOutsideRoots = reconcile.ErrOutsideRoots

// Roots is the files the agent manages: the unit directory, and the config
// files of units' sets (reconcile.ConfigDest) under the file roots the
// host allows (agentd run --file-root /etc/myapp, …). A config file goes to
// the longest root that holds it and nowhere else; every other path is the
// unit directory's, unchanged. Each root is an os.Root like the unit
// directory, so neither ".." nor a symlink on the way leaves it.
//
// A config file's value is its canonical header (mode, owner by name)
// followed by its content (reconcile.ConfigFile). Write sets both on disk
// — the temp file gets its owner, then its mode, and must read back as the
// header before it is renamed into place — and Read turns the file back
// into the same bytes: a chmod or chown by hand is drift like an edit.
// Nothing is written in the place of a symlink, a directory or any other
// non-regular file, and Read reports one as an error.
//
// Roots has the capabilities the reconcile loop looks for: WriteBatched and
// Flush (directory fsyncs deferred, across the unit directory and the
// roots), Check (a write's refusal known before any file of the set is
// written) and List (the unit directory's). It is safe for concurrent use
// for distinct paths, as a Dir is.
type Roots struct {
	units *Dir
	roots []fileRoot // longest path first
	// keys maps a config file's path on disk to its key suffix, for each
	// one read or written: Watch reports a change of it under its key.
	keys sync.Map
}

type fileRoot struct {
	path string // absolute and clean, as given
	dir  *Dir
}

// OpenRoots wraps the unit directory units with the file roots roots,
// which must pass CheckRoots (private: the state directory). Roots that
// repeat are opened once; nested roots are fine (the longest wins). With no
// roots every config file is refused. Close closes the roots, not units.
func OpenRoots(units *Dir, roots []string, private ...string) (*Roots, error) {
	if err := CheckRoots(roots, units.Path(), private...); err != nil {
		return nil, err
	}
	r := &Roots{units: units}
	for _, p := range roots {
		if slices.ContainsFunc(r.roots, func(fr fileRoot) bool { return fr.path == p }) {
			continue
		}
		root, err := os.OpenRoot(p)
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("--file-root %s: %w", p, err)
		}
		// Temp files are made 0600 and given their mode once their owner
		// is set; dirMode is that of the parent directories Write makes.
		r.roots = append(r.roots, fileRoot{path: p, dir: &Dir{root: root, path: p, fileMode: 0o600, dirMode: 0o755}})
	}
	slices.SortStableFunc(r.roots, func(a, b fileRoot) int { return len(b.path) - len(a.path) })
	return r, nil
}

// CheckRoots checks file roots (agentd run --file-root) as OpenRoots
// takes them: each an absolute, clean path of an existing directory that
// neither holds nor lies inside the unit directory unitDir or any of
// private (the state directory), as given or with symlinks resolved — a
// config file must never land on a unit file or on the agent's own files.
func CheckRoots(roots []string, unitDir string, private ...string) error {
	// In order: the unit directory is named first when a root overlaps it
	// and a private directory both.
	reserved := []reservedDir{{unitDir, "the unit directory " + unitDir}}
	for _, p := range private {
		reserved = append(reserved, reservedDir{p, p + ", a directory of the agent's own"})
	}
	for _, p := range roots {
		if err := checkRoot(p, reserved); err != nil {
			return err
		}
	}
	return nil
}

// reservedDir is a directory no --file-root may overlap, and how to name it.
type reservedDir struct{ path, name string }

// checkRoot checks one --file-root against the directories reserved.
func checkRoot(p string, reserved []reservedDir) error {
	switch {
	case p == "" || !filepath.IsAbs(p):
		return fmt.Errorf("--file-root %q: want an absolute path such as /etc/myapp", p)
	case filepath.Clean(p) != p:
		return fmt.Errorf("--file-root %s: not a clean path (it would be %s)", p, filepath.Clean(p))
	case p == "/":
		return errors.New("--file-root /: that is the whole file system; give the directory the config files go in, such as /etc/myapp")
	}
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("--file-root %s: %w", p, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("--file-root %s: not a directory", p)
	}
	// Compare as given and with symlinks resolved: a root that is a
	// symlink into the unit directory overlaps it as much as the real one.
	forms := func(p string) []string {
		if real, err := filepath.EvalSymlinks(p); err == nil && real != p {
			return []string{p, real}
		}
		return []string{p}
	}
	for _, res := range reserved {
		name := res.name
		for _, a := range forms(p) {
			for _, b := range forms(res.path) {
				switch {
				case within(a, b):
					return fmt.Errorf("--file-root %s holds %s: a config file could overwrite the agent's own files; give a directory of its own such as /etc/myapp", p, name)
				case within(b, a):
					return fmt.Errorf("--file-root %s is inside %s: a config file could overwrite the agent's own files; give a directory of its own such as /etc/myapp", p, name)
				}
			}
		}
	}
	return nil
}

// within says whether p is dir or lies under it (both clean and absolute).
func within(dir, p string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// Paths are the file roots, longest first.
func (r *Roots) Paths() []string {
	ps := make([]string, len(r.roots))
	for i, fr := range r.roots {
		ps[i] = fr.path
	}
	return ps
}

// Close closes the file roots (not the unit directory).
func (r *Roots) Close() error {
	var errs []error
	for _, fr := range r.roots {
		errs = append(errs, fr.dir.Close())
	}
	return errors.Join(errs...)
}

// List is the unit directory's List: config files are not listed.
func (r *Roots) List() ([]string, error) { return r.units.List() }

// locate finds the root that holds dest (reconcile.RootOf) and dest's
// path relative to it.
func (r *Roots) locate(dest string) (*Dir, string, error) {
	if err := reconcile.ValidateDest(dest); err != nil {
		return nil, "", err
	}
	root, err := reconcile.RootOf(dest, r.Paths())
	if err != nil {
		return nil, "", err
	}
	for _, fr := range r.roots {
		if fr.path == root {
			return fr.dir, strings.TrimPrefix(dest[len(root):], "/"), nil
		}
	}
	return nil, "", fmt.Errorf("%s: root %s not open", dest, root) // RootOf picks one of Paths
}

// Read returns a unit directory file's content, or a config file read back
// into its canonical value: the header from the file's mode and owner, then
// its content. A missing file is exists=false; a symlink, a directory or
// any other non-regular file in its place is an error (ErrNotRegular), and
// so is a path outside every root.
func (r *Roots) Read(p string) (content []byte, exists bool, err error) {
	_, dest, ok := reconcile.ConfigDest(p)
	if !ok {
		return r.units.Read(p)
	}
	d, rel, err := r.locate(dest)
	if err != nil {
		return nil, false, err
	}
	r.keys.Store(dest, p)
	fi, err := d.root.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("stat %s: %w", dest, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, true, fmt.Errorf("%s: %w but %s; agentd never replaces one", dest, ErrNotRegular, kindOf(fi.Mode()))
	}
	// O_NONBLOCK: should a FIFO take the file's place after the Lstat, the
	// open does not hang; SameFile then refuses it.
	f, err := d.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, true, fmt.Errorf("read %s: %w", dest, err)
	}
	defer f.Close()
	ffi, err := f.Stat()
	if err != nil {
		return nil, true, fmt.Errorf("read %s: %w", dest, err)
	}
	if !os.SameFile(fi, ffi) {
		return nil, true, fmt.Errorf("read %s: replaced while being read", dest)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, true, fmt.Errorf("read %s: %w", dest, err)
	}
	mode, owner := attrsOf(ffi)
	return reconcile.ConfigFile{Mode: mode, Owner: owner, Content: b}.Encode(), true, nil
}

// kindOf names what a non-regular file is.
func kindOf(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return fmt.Sprintf("of type %s", m.Type())
}

// attrsOf is a file's mode and owner as a config file's header says them:
// the permission bits with setuid, setgid and sticky; the owner by name,
// always spelt out. An ID without a name here
// is given as a number, which no registry value can hold
// (reconcile.ValidateOwner): the file is then rewritten.
func attrsOf(fi fs.FileInfo) (fs.FileMode, string) {
	mode := fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return mode, "?:?"
	}
	u, g := strconv.Itoa(int(st.Uid)), strconv.Itoa(int(st.Gid))
	if a, err := user.LookupId(u); err == nil {
		u = a.Username
	}
	if a, err := user.LookupGroupId(g); err == nil {
		g = a.Name
	}
	return mode, u + ":" + g
}

// target is a config file write resolved on this host.
type target struct {
	dest string
	dir  *Dir   // the root
	rel  string // dest relative to it
	file reconcile.ConfigFile
	uid  int
	gid  int
}

// resolve checks a write of a config file's value to dest without writing:
// a root holds it, the value is canonical, the owner exists here and can be
// read back by the same names, the agent may give the file that owner and
// mode, and nothing but a regular file is in its place.
func (r *Roots) resolve(dest string, value []byte) (target, error) {
	t := target{dest: dest}
	var err error
	if t.dir, t.rel, err = r.locate(dest); err != nil {
		return t, err
	}
	if t.file, err = reconcile.DecodeConfigFile(value); err != nil {
		return t, err
	}
	if t.uid, t.gid, err = lookupOwner(t.file.Owner); err != nil {
		return t, err
	}
	if err := mayGive(t.file, t.uid, t.gid); err != nil {
		return t, err
	}
	fi, err := t.dir.root.Lstat(t.rel)
	switch {
	case err == nil && !fi.Mode().IsRegular():
		return t, fmt.Errorf("%w but %s; agentd never replaces one", ErrNotRegular, kindOf(fi.Mode()))
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return t, err // a file where a directory should be, a symlink leaving the root
	}
	return t, t.dir.writable(path.Dir(t.rel))
}

// writable says whether the agent may make files in dir, or in the
// directory nearest to it that exists (where the missing ones would be
// made): not when the file system is read-only to it (agentd.service's
// ProtectSystem=strict without the root in ReadWritePaths=) or the
// permissions say no.
func (d *Dir) writable(dir string) error {
	for dir != "." {
		if fi, err := d.root.Stat(dir); err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%s: not a directory", filepath.Join(d.path, dir))
			}
			break
		}
		dir = path.Dir(dir)
	}
	f, err := d.root.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	const wOK = 2 // unistd.h
	if err := syscall.Faccessat(int(f.Fd()), ".", wOK, 0); err != nil {
		return fmt.Errorf("cannot make files in %s: %w", filepath.Join(d.path, dir), err)
	}
	return nil
}

// lookupOwner resolves "user:group" to IDs on this host. The IDs must name
// the same user and group back, or the file would never read back as
// written: an alias (a second name for uid 0) is refused, saying what to
// give instead.
func lookupOwner(owner string) (uid, gid int, err error) {
	un, gn, _ := strings.Cut(owner, ":")
	u, err := user.Lookup(un)
	if errors.As(err, new(user.UnknownUserError)) {
		return 0, 0, fmt.Errorf("owner %s: no user %q on this host", owner, un)
	} else if err != nil {
		return 0, 0, fmt.Errorf("owner %s: %w", owner, err)
	}
	g, err := user.LookupGroup(gn)
	if errors.As(err, new(user.UnknownGroupError)) {
		return 0, 0, fmt.Errorf("owner %s: no group %q on this host", owner, gn)
	} else if err != nil {
		return 0, 0, fmt.Errorf("owner %s: %w", owner, err)
	}
	if uid, err = strconv.Atoi(u.Uid); err != nil {
		return 0, 0, fmt.Errorf("owner %s: user %q has uid %q", owner, un, u.Uid)
	}
	if gid, err = strconv.Atoi(g.Gid); err != nil {
		return 0, 0, fmt.Errorf("owner %s: group %q has gid %q", owner, gn, g.Gid)
	}
	if back, err := user.LookupId(u.Uid); err == nil && back.Username != un {
		return 0, 0, fmt.Errorf("owner %s: uid %d is named %q on this host; give that name", owner, uid, back.Username)
	}
	if back, err := user.LookupGroupId(g.Gid); err == nil && back.Name != gn {
		return 0, 0, fmt.Errorf("owner %s: gid %d is named %q on this host; give that name", owner, gid, back.Name)
	}
	return uid, gid, nil
}

// Linux capability bits (capability.h).
const (
	capChown  = 0
	capFsetid = 4
)

// mayGive refuses an owner, or a setgid mode, that the kernel would not let
// the agent give a file: a chown to another user, or to a group it is not
// in, needs CAP_CHOWN; a setgid bit for a group it is not in needs
// CAP_FSETID (without it chmod silently drops the bit). Caught here, such a
// file refuses its whole set before anything is written.
func mayGive(f reconcile.ConfigFile, uid, gid int) error {
	caps, known := capsNow()
	has := func(bit uint) bool { return !known || caps&(1<<bit) != 0 }
	ownGroup := gid == os.Getegid()
	if !ownGroup {
		gs, _ := os.Getgroups()
		ownGroup = slices.Contains(gs, gid)
	}
	switch {
	case (uid != os.Geteuid() || !ownGroup) && !has(capChown):
		return fmt.Errorf("owner %s: the agent (uid %d) lacks CAP_CHOWN, needed to give a file to another user or group", f.Owner, os.Geteuid())
	case f.Mode&fs.ModeSetgid != 0 && !ownGroup && !has(capFsetid):
		return fmt.Errorf("%q: the agent (uid %d) lacks CAP_FSETID, needed to set the setgid bit for a group it is not in", header(f.Mode, f.Owner), os.Geteuid())
	}
	return nil
}

// header is a config file's header line for mode and owner, for messages.
func header(mode fs.FileMode, owner string) string {
	return strings.TrimSpace(string(reconcile.ConfigFile{Mode: mode, Owner: owner}.Encode()))
}

// capsNow is effectiveCaps; tests take capabilities away.
var capsNow = effectiveCaps

// effectiveCaps reads this process's effective capabilities; known is
// false when they cannot be read (then nothing is refused for want of
// one: the write itself says).
func effectiveCaps() (caps uint64, known bool) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			c, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return c, err == nil
		}
	}
	return 0, false
}

// Check says whether Write would refuse content at p, writing nothing: for
// a config file, a path outside every root, a value not in canonical form,
// an owner this host does not have (or the agent may not give), a
// directory, symlink or other non-regular file in its place or a file in
// the place of one of its directories; for a unit directory file, a bad
// path or a non-regular file in its place.
func (r *Roots) Check(p string, content []byte) error {
	_, dest, ok := reconcile.ConfigDest(p)
	if !ok {
		if err := checkRel(p); err != nil {
			return err
		}
		if fi, err := r.units.root.Lstat(p); err == nil && !fi.Mode().IsRegular() {
			return fmt.Errorf("write %s: %w (%s)", p, ErrNotRegular, fi.Mode().Type())
		}
		return nil
	}
	if _, err := r.resolve(dest, content); err != nil {
		return fmt.Errorf("write %s: %w", dest, err)
	}
	return nil
}

// Write replaces the file at p atomically: a unit directory file as
// Dir.Write does; a config file with its content, owner and mode from
// content (its canonical value), creating the directories it needs under
// its root (0755, whatever the umask).
func (r *Roots) Write(p string, content []byte) error { return r.write(p, content, false) }

// WriteBatched is Write with the directory fsync left for Flush, as
// Dir.WriteBatched.
func (r *Roots) WriteBatched(p string, content []byte) error { return r.write(p, content, true) }

func (r *Roots) write(p string, content []byte, batched bool) error {
	_, dest, ok := reconcile.ConfigDest(p)
	if !ok {
		if batched {
			return r.units.WriteBatched(p, content)
		}
		return r.units.Write(p, content)
	}
	r.keys.Store(dest, p)
	t, err := r.resolve(dest, content)
	if err == nil {
		err = t.write(batched)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", dest, err)
	}
	return nil
}

// write is the atomic write of a resolved config file: temp file in the
// target's directory, content, chown, chmod, check it reads back as the
// header, fsync, rename, fsync the directory (or mark it for Flush).
func (t target) write(batched bool) error {
	d, dir := t.dir, path.Dir(t.rel)
	if err := d.mkdirs(dir); err != nil {
		return err
	}
	tmp := path.Join(dir, tempPrefix(path.Base(t.rel))+randSuffix())
	err := t.writeTemp(tmp)
	if err == nil {
		err = renameTemp(d.root, tmp, t.rel)
	}
	if err != nil {
		if rerr := d.root.Remove(tmp); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("remove the temp file: %w", rerr))
		}
		return err
	}
	if batched {
		d.markUnsynced(dir)
		return nil
	}
	return d.syncDir(dir)
}

func (t target) writeTemp(tmp string) error {
	// 0600 until the owner is right: the content may be a secret meant
	// for one service's user only.
	f, err := t.dir.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(t.file.Content); err != nil {
		return err
	}
	// The owner first: a chown drops the setuid and setgid bits. Not
	// when the file has it already (the agent's own user, root:root for
	// the packaged service): chown is a privileged call its sandbox
	// filters (SystemCallFilter=~@privileged), even to the same owner.
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != t.uid || int(st.Gid) != t.gid {
		if err := f.Chown(t.uid, t.gid); err != nil {
			return err
		}
	}
	if err := f.Chmod(t.file.Mode); err != nil { // whatever the umask
		return err
	}
	if fi, err = f.Stat(); err != nil {
		return err
	}
	if mode, owner := attrsOf(fi); mode != t.file.Mode || owner != t.file.Owner {
		return fmt.Errorf("the file came out as %q, not %q: it would never read back as written", header(mode, owner), header(t.file.Mode, t.file.Owner))
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

// mkdirs makes dir and its missing parents in d, mode d.dirMode whatever
// the umask. A component that exists must be a directory (a symlink to one
// inside the root is followed; the root refuses one that leaves it).
func (d *Dir) mkdirs(dir string) error {
	if dir == "." {
		return nil
	}
	at := ""
	for name := range strings.SplitSeq(dir, "/") {
		at = path.Join(at, name)
		fi, err := d.root.Stat(at)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%s: not a directory", filepath.Join(d.path, at))
			}
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := d.root.Mkdir(at, d.dirMode); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := d.root.Chmod(at, d.dirMode); err != nil {
			return err
		}
		if err := d.syncDir(path.Dir(at)); err != nil {
			return err
		}
	}
	return nil
}

// markUnsynced leaves dir's fsync for Flush.
func (d *Dir) markUnsynced(dir string) {
	d.mu.Lock()
	if d.unsynced == nil {
		d.unsynced = map[string]bool{}
	}
	d.unsynced[dir] = true
	d.mu.Unlock()
}

// Flush makes the renames of every WriteBatched so far durable, in the
// unit directory and the roots.
func (r *Roots) Flush() error {
	errs := []error{r.units.Flush()}
	for _, fr := range r.roots {
		if err := fr.dir.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fr.path, err))
		}
	}
	return errors.Join(errs...)
}

// Remove deletes the file at p: a unit directory file as Dir.Remove does;
// a config file alone (the directories it was in stay), refusing anything
// but a regular file. A missing file is not an error.
func (r *Roots) Remove(p string) error {
	_, dest, ok := reconcile.ConfigDest(p)
	if !ok {
		return r.units.Remove(p)
	}
	d, rel, err := r.locate(dest)
	if err != nil {
		return fmt.Errorf("remove %s: %w", dest, err)
	}
	fi, err := d.root.Lstat(rel)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("remove %s: %w", dest, err)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("remove %s: %w but %s", dest, ErrNotRegular, kindOf(fi.Mode()))
	}
	if err := d.root.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", dest, err)
	}
	if err := d.syncDir(path.Dir(rel)); err != nil {
		return fmt.Errorf("remove %s: %w", dest, err)
	}
	return nil
}

// CleanTemps removes the temp files interrupted writes left: the unit
// directory's (Dir.CleanTemps), and in every root, at any depth, the
// regular files named like a Write's temp file — nothing else, and no
// symlink is followed. removed are full paths. Call it when no Write is
// under way, e.g. at start.
func (r *Roots) CleanTemps() (removed []string, err error) {
	removed, err = r.units.CleanTemps()
	errs := []error{err}
	for _, fr := range r.roots {
		rm, err := fr.dir.cleanTree(".")
		for _, rel := range rm {
			removed = append(removed, filepath.Join(fr.path, filepath.FromSlash(rel)))
		}
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// cleanTree sweeps temp files from dir and every real directory under it.
func (d *Dir) cleanTree(dir string) (removed []string, err error) {
	removed, subdirs, err := d.sweep(dir, isTemp)
	errs := []error{err}
	for _, sub := range subdirs {
		r, err := d.cleanTree(sub)
		removed = append(removed, r...)
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}
