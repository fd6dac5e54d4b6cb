package pkgdeb

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"github.com/agentd/agentd/internal/citest"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if built.done != nil {
		<-built.done // a test that skipped may have started it
	}
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// built is the package of this source tree, built once per test run (by
// the first test that asks: start) and shared by the tests, which only
// read it.
var built struct {
	once sync.Once
	done chan struct{}
	dir  string
	pkg  *Package
	log  bytes.Buffer
	err  error
	took time.Duration
}

// startBuild starts building the package in the background, once.
func startBuild() {
	built.once.Do(func() {
		built.done = make(chan struct{})
		go func() {
			defer close(built.done)
			start := time.Now()
			built.dir, built.err = os.MkdirTemp("", "agentd-deb-test")
			if built.err != nil {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			built.pkg, built.err = Build(ctx, Options{Dir: "../..", OutDir: built.dir, Log: &built.log})
			built.took = time.Since(start)
		}()
	})
}

// builtPackage waits for the package and returns it.
func builtPackage(t *testing.T) *Package {
	t.Helper()
	startBuild()
	<-built.done
	if built.err != nil {
		t.Fatalf("build the package: %v\n%s", built.err, built.log.String())
	}
	return built.pkg
}

// needTool fails the test under CI=true (a missing tool must not pass
// silently there: .ci/run installs it) and skips it otherwise.
func needTool(t *testing.T, name string, err error) {
	t.Helper()
	citest.Unavailable(t, "%s: %v", name, err)
}

// extract unpacks the package with dpkg-deb -R (data and DEBIAN/) into a
// temporary directory.
func extract(t *testing.T, p *Package) string {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		needTool(t, "dpkg-deb", err)
	}
	dir := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-R", p.Path, dir).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -R: %v\n%s", err, out)
	}
	return dir
}

func gunzip(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if r.Name != "" || !r.ModTime.IsZero() {
		t.Errorf("%s: gzip header has name %q, time %v: want neither (gzip -n)", path, r.Name, r.ModTime)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return string(b)
}

// The package holds what the issue lists, with the right modes, and
// nothing else; its control data say who, what and which version.
func TestPackageContents(t *testing.T) {
	t.Parallel()
	p := builtPackage(t)
	t.Logf("built %s in %s:\n%s", filepath.Base(p.Path), built.took.Round(time.Millisecond), built.log.String())
	if want := "agentd_" + p.Version + "_" + p.Arch + ".deb"; filepath.Base(p.Path) != want {
		t.Errorf("file name %s, want %s", filepath.Base(p.Path), want)
	}
	root := extract(t, p)
	read := func(rel string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	control := read("DEBIAN/control")
	for _, want := range []string{"Package: agentd\n", "Version: " + p.Version + "\n", "Architecture: " + p.Arch + "\n",
		"Section: admin\n", "Priority: optional\n", "Maintainer: " + envMaintainer() + "\n",
		"Description: redeploy systemd units in place across a fleet, from etcd\n"} {
		if !strings.Contains(control, want) {
			t.Errorf("control lacks %q:\n%s", want, control)
		}
	}
	if got := read("DEBIAN/conffiles"); got != DefaultsPath+"\n"+MirrorDefaults+"\n" {
		t.Errorf("conffiles = %q", got)
	}
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		path := filepath.Join(root, "DEBIAN", s)
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("DEBIAN/%s: %v, %v", s, fi, err)
			continue
		}
		if out, err := exec.Command("sh", "-n", path).CombinedOutput(); err != nil {
			t.Errorf("sh -n %s: %v\n%s", s, err, out)
		}
	}

	// Every file and directory of the data, with its mode.
	modes := map[string]os.FileMode{}
	err := filepath.Walk(root, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if rel == "." || rel == "DEBIAN" || strings.HasPrefix(rel, "DEBIAN/") {
			return nil
		}
		modes["/"+rel] = fi.Mode()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]os.FileMode{
		BinPath:                                 0o755,
		SystemUnitPath:                          0o644,
		MirrorUnitPath:                          0o644,
		UserUnitPath:                            0o644,
		DefaultsPath:                            0o644,
		MirrorDefaults:                          0o644,
		StateDir:                                os.ModeDir | 0o700,
		BashCompletion:                          0o644,
		ZshCompletion:                           0o644,
		FishCompletion:                          0o644,
		DocDir + "/copyright":                   0o644,
		DocDir + "/changelog.Debian.gz":         0o644,
		LintianOverride:                         0o644,
		ManDir + "/agentd.8.gz":                 0o644,
		ManDir + "/agentd-run.8.gz":             0o644,
		ManDir + "/agentd-unit-put.8.gz":        0o644,
		ManDir + "/agentd-completion-bash.8.gz": 0o644,
		"/usr/share/doc":                        os.ModeDir | 0o755,
		"/var/lib":                              os.ModeDir | 0o755,
		"/usr/share/bash-completion/completions/": os.ModeDir | 0o755,
	}
	for path, mode := range want {
		path = strings.TrimSuffix(path, "/")
		if got, ok := modes[path]; !ok {
			t.Errorf("%s missing", path)
		} else if got != mode {
			t.Errorf("%s: mode %v, want %v", path, got, mode)
		}
	}
	var pages []string
	for path, mode := range modes {
		switch {
		case mode.IsDir(), want[path] != 0:
		case strings.HasPrefix(path, ManDir+"/agentd-") && strings.HasSuffix(path, ".8.gz"):
			pages = append(pages, path)
		default:
			t.Errorf("unexpected %s (%v) in the package", path, mode)
		}
		if !mode.IsDir() && mode.Perm()&0o022 != 0 {
			t.Errorf("%s is %v: writable by others than root", path, mode)
		}
	}
	sort.Strings(pages)
	if len(pages) < 15 {
		t.Errorf("only %d man pages: %v", len(pages), pages)
	}
	for _, page := range append(pages, ManDir+"/agentd.8.gz") {
		name := strings.TrimSuffix(filepath.Base(page), ".8.gz")
		text := gunzip(t, filepath.Join(root, page))
		if !strings.Contains(text, `.TH "`+strings.ToUpper(name)+`" "8"`) || !strings.Contains(text, "\n"+name+` \- `) && !strings.Contains(text, "\n"+name+" - ") {
			t.Errorf("%s: no .TH or NAME line for %s:\n%.300s", page, name, text)
		}
	}

	// The binary: static, stripped, the version of this tree.
	bin := filepath.Join(root, BinPath)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Error("usr/bin/agentd has an ELF interpreter: not static")
		}
	}
	if f.Section(".symtab") != nil {
		t.Error("usr/bin/agentd has a symbol table: not stripped")
	}
	f.Close()
	out, err := exec.Command(bin, "--version").Output()
	if got, want := strings.TrimSpace(string(out)), "agentd version "+p.Describe; err != nil || got != want {
		t.Errorf("agentd --version = %q, %v; want %q", got, err, want)
	}

	// The units: the tree's, ExecStart= on /usr/bin/agentd.
	for _, u := range []struct{ src, dst, exec string }{
		{"contrib/systemd/agentd.service", SystemUnitPath, "ExecStart=/usr/bin/agentd run $AGENTD_OPTS\n"},
		{"contrib/systemd/agentd-mirror.service", MirrorUnitPath, "ExecStart=/usr/bin/agentd mirror $AGENTD_MIRROR_OPTS\n"},
		{"contrib/systemd/user/agentd.service", UserUnitPath, "ExecStart=/usr/bin/agentd run --user $AGENTD_OPTS\n"},
	} {
		src, err := os.ReadFile(filepath.Join("../..", u.src))
		if err != nil {
			t.Fatal(err)
		}
		got := read(u.dst)
		if !strings.Contains(got, "\n"+u.exec) {
			t.Errorf("%s lacks %q", u.dst, u.exec)
		}
		if strings.Replace(got, "\nExecStart=/usr/bin/agentd ", "\nExecStart=/usr/local/bin/agentd ", 1) != string(src) {
			t.Errorf("%s differs from %s beyond ExecStart=", u.dst, u.src)
		}
	}
	unit := read(SystemUnitPath)
	for _, want := range []string{"Type=notify", "WatchdogSec=", "EnvironmentFile=-/etc/default/agentd", "StateDirectoryMode=0700"} {
		if !strings.Contains(unit, want) {
			t.Errorf("%s lacks %s", SystemUnitPath, want)
		}
	}
	for src, dst := range map[string]string{"agentd.default": DefaultsPath, "agentd-mirror.default": MirrorDefaults} {
		if b, _ := os.ReadFile("../../contrib/systemd/" + src); read(dst) != string(b) {
			t.Errorf("%s differs from contrib/systemd/%s", dst, src)
		}
	}
	if unit := read(MirrorUnitPath); !strings.Contains(unit, "EnvironmentFile=-"+MirrorDefaults+"\n") {
		t.Errorf("%s does not read %s", MirrorUnitPath, MirrorDefaults)
	}
	if !strings.HasPrefix(read(ZshCompletion), "#compdef agentd") {
		t.Errorf("%s does not start with #compdef agentd", ZshCompletion)
	}
	for _, c := range []string{BashCompletion, FishCompletion} {
		if s := read(c); len(s) < 1000 || !strings.Contains(s, " __complete ") {
			t.Errorf("%s: not a cobra completion script (%d bytes)", c, len(s))
		}
	}
	changelog := gunzip(t, filepath.Join(root, DocDir, "changelog.Debian.gz"))
	if first, _, _ := strings.Cut(changelog, "\n"); first != "agentd ("+p.Version+") unstable; urgency=medium" {
		t.Errorf("changelog starts %q", first)
	}
	if !strings.Contains(changelog, "\n -- "+envMaintainer()+"  "+p.Date.Format(time.RFC1123Z)+"\n") {
		t.Errorf("changelog's trailer is not the maintainer and the commit's date:\n%s", changelog)
	}
}

// lintian (Debian's package checker, the version of this Debian release)
// finds nothing: no error, warning, info, pedantic or experimental tag.
// Each override in contrib/deb/lintian-overrides says why; one that silences
// nothing is itself a tag (unused-override, mismatched-override).
func TestLintian(t *testing.T) {
	t.Parallel()
	startBuild()
	lintian, err := exec.LookPath("lintian")
	if err != nil {
		needTool(t, "lintian", err)
		return
	}
	p := builtPackage(t)
	version, _ := exec.Command(lintian, "--version").Output()
	start := time.Now()
	// Not --show-overrides: with it, overridden tags count for --fail-on.
	// Not binaries/spelling: a Go binary keeps its string constants packed
	// end to end, so the check reads words across their boundaries (it
	// found "supersed" in "supersede"+"d…"), and the words it would find
	// come and go with unrelated changes. The texts themselves are checked
	// where they are words: the man pages.
	out, err := exec.Command(lintian, "--pedantic", "--display-info", "--display-experimental", "-X", "binaries/spelling",
		"--fail-on", "error,warning,info,pedantic,experimental", p.Path).CombinedOutput()
	t.Logf("%s on %s (%s):\n%s", strings.TrimSpace(string(version)), filepath.Base(p.Path), time.Since(start).Round(time.Millisecond), out)
	if err != nil {
		t.Errorf("lintian: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if len(line) > 2 && strings.Contains("EWIPX", line[:1]) && line[1] == ':' {
			t.Errorf("lintian: %s", line)
		}
	}
}
