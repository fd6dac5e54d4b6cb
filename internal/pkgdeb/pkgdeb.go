// Package pkgdeb builds agentd's Debian package (`make deb`, cmd/mkdeb),
// agentd_<version>_<arch>.deb, with nfpm as a library; nothing of it is in
// the agent's binary.
//
// Build compiles agentd (static: CGO_ENABLED=0; stripped; the version from
// git describe stamped into it with -ldflags), asks that binary for its man
// pages (the hidden `agentd man-pages`, cobra/doc) and its bash, zsh and
// fish completions, and packs them with the files of the source tree:
// contrib/systemd (the system, mirror and user units, /etc/default/agentd
// and /etc/default/agentd-mirror) and
// contrib/deb (maintainer scripts, copyright, lintian overrides). The unit
// files are the tree's, with ExecStart= pointing at /usr/bin/agentd instead
// of /usr/local/bin/agentd (a from-source install's path).
//
// A build is reproducible: every date in the package (archive members, man
// pages, changelog) is SOURCE_DATE_EPOCH if set, else the commit's time.
// Build is safe for concurrent use with distinct output directories.
package pkgdeb

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
	"github.com/goreleaser/nfpm/v2/files"
)

// DefaultMaintainer is the package's Maintainer unless DEBFULLNAME and
// DEBEMAIL (the variables Debian's own tools read) or Options say otherwise.
const DefaultMaintainer = "agentd maintainers <maintainers@users.noreply.a-seed-c04d5d86.example>"

// Paths inside the package.
const (
	BinPath         = "/usr/bin/agentd"
	SystemUnitPath  = "/lib/systemd/system/agentd.service"
	MirrorUnitPath  = "/lib/systemd/system/agentd-mirror.service" // disabled: postinst enables agentd.service only
	UserUnitPath    = "/usr/lib/systemd/user/agentd.service"
	DefaultsPath    = "/etc/default/agentd"
	MirrorDefaults  = "/etc/default/agentd-mirror" // agentd-mirror.service's EnvironmentFile=, every line commented
	MirrorStateDir  = "/var/lib/agentd-mirror"     // its StateDirectory=: systemd makes it; purge removes it
	StateDir        = "/var/lib/agentd"
	ManDir          = "/usr/share/man/man8"
	BashCompletion  = "/usr/share/bash-completion/completions/agentd"
	ZshCompletion   = "/usr/share/zsh/vendor-completions/_agentd"
	FishCompletion  = "/usr/share/fish/vendor_completions.d/agentd.fish"
	DocDir          = "/usr/share/doc/agentd"
	LintianOverride = "/usr/share/lintian/overrides/agentd"
)

// sourceBin is the agent's path in the tree's unit files; the package's
// is BinPath.
const sourceBin = "/usr/local/bin/agentd"

// Options of Build.
type Options struct {
	// Dir is the source tree (the module's root), normally a git checkout.
	Dir string
	// OutDir receives the .deb; it is created if missing.
	OutDir string
	// Describe is the version stamped into the binary, as
	// `git describe --tags --always --dirty` prints it (v1.2.3,
	// v1.2.3-4-gabc1234, …). Empty: ask git in Dir.
	Describe string
	// GoArch is the target architecture (GOARCH). Empty: runtime.GOARCH.
	GoArch string
	// Maintainer is "Name <email>". Empty: "$DEBFULLNAME <$DEBEMAIL>" when
	// both are set, else DefaultMaintainer.
	Maintainer string
	// Log receives one line per step with its duration (nil: none).
	Log io.Writer
}

// Package is a built .deb.
type Package struct {
	Path     string // OutDir/agentd_<Version>_<Arch>.deb
	Version  string // the Debian version, e.g. 1.2.3+git4.abc1234-1
	Describe string // the version `agentd --version` prints
	Arch     string // the Debian architecture, e.g. amd64
	Date     time.Time
}

// debArch maps GOARCH to Debian's architecture names (those Go builds
// without further settings).
var debArch = map[string]string{
	"amd64":   "amd64",
	"arm64":   "arm64",
	"386":     "i386",
	"ppc64le": "ppc64el",
	"s390x":   "s390x",
	"riscv64": "riscv64",
	"loong64": "loong64",
}

// Build builds the package. ctx bounds the commands it runs (git, go build,
// the built binary).
func Build(ctx context.Context, o Options) (_ *Package, err error) {
	b := &builder{o: o, ctx: ctx}
	if b.o.GoArch == "" {
		b.o.GoArch = runtime.GOARCH
	}
	arch, ok := debArch[b.o.GoArch]
	if !ok {
		return nil, fmt.Errorf("GOARCH %s: no Debian architecture known for it", b.o.GoArch)
	}
	if b.o.Dir, err = filepath.Abs(b.o.Dir); err != nil {
		return nil, err
	}
	p := &Package{Arch: arch}
	if err := b.version(p); err != nil {
		return nil, err
	}
	b.stage, err = os.MkdirTemp("", "agentd-deb")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(b.stage)

	contents, err := b.contents(p)
	if err != nil {
		return nil, err
	}
	scripts := nfpm.Scripts{}
	for _, s := range []struct {
		name string
		dst  *string
	}{{"postinst", &scripts.PostInstall}, {"prerm", &scripts.PreRemove}, {"postrm", &scripts.PostRemove}} {
		*s.dst = filepath.Join(b.o.Dir, "contrib/deb", s.name)
		if _, err := os.Stat(*s.dst); err != nil {
			return nil, err
		}
	}
	maintainer := b.o.Maintainer
	if maintainer == "" {
		maintainer = envMaintainer()
	}
	if contents, err = b.docs(p, maintainer, contents); err != nil {
		return nil, err
	}

	up, rev, _ := strings.Cut(p.Version, "-")
	info := nfpm.WithDefaults(&nfpm.Info{
		Name:          "agentd",
		Arch:          arch,
		Platform:      "linux",
		Version:       up,
		Release:       rev,
		VersionSchema: "none",
		Section:       "admin",
		Priority:      "optional",
		Maintainer:    maintainer,
		Homepage:      "https://github.com/agentd/agentd",
		Description:   description,
		MTime:         p.Date,
		Overridables: nfpm.Overridables{
			Contents: contents,
			Scripts:  scripts,
			Umask:    0o022,
			Deb:      nfpm.Deb{Compression: "gzip"},
		},
	})

	if err := os.MkdirAll(b.o.OutDir, 0o755); err != nil {
		return nil, err
	}
	p.Path = filepath.Join(b.o.OutDir, fmt.Sprintf("agentd_%s_%s.deb", p.Version, arch))
	start := time.Now()
	tmp, err := os.CreateTemp(b.o.OutDir, ".agentd-deb-*")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	if err := deb.Default.Package(info, tmp); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("nfpm: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp.Name(), p.Path); err != nil {
		return nil, err
	}
	b.logf(start, "packed %s", p.Path)
	return p, nil
}

// envMaintainer is "$DEBFULLNAME <$DEBEMAIL>" when both are set, else
// DefaultMaintainer.
func envMaintainer() string {
	if n, e := os.Getenv("DEBFULLNAME"), os.Getenv("DEBEMAIL"); n != "" && e != "" {
		return n + " <" + e + ">"
	}
	return DefaultMaintainer
}

// description is the package's Description: a synopsis and the long text.
const description = `redeploy systemd units in place across a fleet, from etcd
Every machine runs agentd; it watches an etcd registry for the unit files
meant for it, rewrites a changed file atomically, runs one daemon-reload per
batch of changes, restarts (or starts) the unit on the same host, and reports
the hash it now runs, so "agentd unit put ... --wait" returns only when every
targeted host runs the new version. A change that fails to start is rolled
back on that host and stops the rollout; MaxUnavailable= bounds how many
hosts restart at once.
.
One machine needs nothing else: without --etcd-endpoints the agent runs an
embedded single-node etcd reachable by root only. The package installs
agentd.service enabled but not started: see /etc/default/agentd.`

type builder struct {
	ctx   context.Context
	o     Options
	stage string
}

func (b *builder) logf(start time.Time, format string, args ...any) {
	if b.o.Log != nil {
		fmt.Fprintf(b.o.Log, "mkdeb: %s (%s)\n", fmt.Sprintf(format, args...), time.Since(start).Round(time.Millisecond))
	}
}

// version fills p.Describe, p.Version and p.Date from git (or Options).
func (b *builder) version(p *Package) error {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(b.ctx, "git", append([]string{"-C", b.o.Dir}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return strings.TrimSpace(string(out)), nil
	}
	if b.o.Describe != "" {
		v, err := versionFromDescribe(b.o.Describe)
		if err != nil {
			return err
		}
		p.Describe, p.Version = b.o.Describe, v
	} else {
		long, err := git("describe", "--tags", "--long", "--always", "--dirty")
		if err != nil {
			return fmt.Errorf("%w (not a git checkout? give the version by hand)", err)
		}
		n, err := git("rev-list", "--count", "HEAD")
		if err != nil {
			return err
		}
		commits, err := strconv.Atoi(n)
		if err != nil {
			return fmt.Errorf("git rev-list --count: %q", n)
		}
		if p.Describe, p.Version, err = versionFromGit(long, commits); err != nil {
			return err
		}
	}
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", s, err)
		}
		p.Date = time.Unix(sec, 0).UTC()
	} else if s, err := git("log", "-1", "--format=%ct"); err == nil {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("git log --format=%%ct: %q", s)
		}
		p.Date = time.Unix(sec, 0).UTC()
	} else {
		p.Date = time.Now().UTC().Truncate(time.Second)
	}
	return nil
}

// goBuild builds the agent for goarch into out.
func (b *builder) goBuild(p *Package, goarch, out string) error {
	start := time.Now()
	gobin, err := exec.LookPath("go")
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(b.ctx, gobin, "build", "-o", out,
		"-ldflags", "-s -w -X main.version="+p.Describe, "./cmd/agentd")
	cmd.Dir = b.o.Dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/agentd (GOARCH=%s): %v\n%s", goarch, err, out)
	}
	b.logf(start, "built %s (GOARCH=%s, version %s)", out, goarch, p.Describe)
	return nil
}

// run runs the built agent (or the native one for a foreign GOARCH) and
// returns its standard output.
func (b *builder) run(bin string, env []string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(b.ctx, bin, args...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("agentd %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// contents builds the agent and stages every file but the docs.
func (b *builder) contents(p *Package) (files.Contents, error) {
	bin := filepath.Join(b.stage, "agentd")
	if err := b.goBuild(p, b.o.GoArch, bin); err != nil {
		return nil, err
	}
	// The man pages and completions come from the binary itself: the
	// packaged one, or a native build of the same tree for another GOARCH.
	native := bin
	if b.o.GoArch != runtime.GOARCH {
		native = filepath.Join(b.stage, "agentd-native")
		if err := b.goBuild(p, runtime.GOARCH, native); err != nil {
			return nil, err
		}
	}
	// A clean environment: no AGENTD_* variable of the builder's reaches
	// the generated text.
	env := []string{"PATH=/usr/bin:/bin", "SOURCE_DATE_EPOCH=" + strconv.FormatInt(p.Date.Unix(), 10)}
	start := time.Now()
	out, err := b.run(native, env, "--version")
	if err != nil {
		return nil, err
	}
	if got, want := strings.TrimSpace(string(out)), "agentd version "+p.Describe; got != want {
		return nil, fmt.Errorf("agentd --version says %q, want %q", got, want)
	}

	c := files.Contents{
		file(bin, BinPath, 0o755),
		{Destination: StateDir, Type: files.TypeDir, FileInfo: &files.ContentFileInfo{Mode: 0o700}},
		{Source: filepath.Join(b.o.Dir, "contrib/systemd/agentd.default"), Destination: DefaultsPath, Type: files.TypeConfig,
			FileInfo: &files.ContentFileInfo{Mode: 0o644}},
		{Source: filepath.Join(b.o.Dir, "contrib/systemd/agentd-mirror.default"), Destination: MirrorDefaults, Type: files.TypeConfig,
			FileInfo: &files.ContentFileInfo{Mode: 0o644}},
	}
	for _, u := range []struct{ src, dst string }{
		{"contrib/systemd/agentd.service", SystemUnitPath},
		{"contrib/systemd/agentd-mirror.service", MirrorUnitPath},
		{"contrib/systemd/user/agentd.service", UserUnitPath},
	} {
		data, err := os.ReadFile(filepath.Join(b.o.Dir, u.src))
		if err != nil {
			return nil, err
		}
		data, err = packagedUnit(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", u.src, err)
		}
		staged, err := b.write(u.src, data)
		if err != nil {
			return nil, err
		}
		c = append(c, file(staged, u.dst, 0o644))
	}

	for _, s := range []struct{ shell, dst string }{
		{"bash", BashCompletion}, {"zsh", ZshCompletion}, {"fish", FishCompletion},
	} {
		out, err := b.run(native, env, "completion", s.shell)
		if err != nil {
			return nil, err
		}
		staged, err := b.write("completion/"+s.shell, out)
		if err != nil {
			return nil, err
		}
		c = append(c, file(staged, s.dst, 0o644))
	}

	man := filepath.Join(b.stage, "man")
	if _, err := b.run(native, env, "man-pages", man); err != nil {
		return nil, err
	}
	pages, err := filepath.Glob(filepath.Join(man, "*.8"))
	if err != nil {
		return nil, err
	}
	if len(pages) == 0 {
		return nil, fmt.Errorf("agentd man-pages wrote no page")
	}
	sort.Strings(pages)
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			return nil, err
		}
		gz, err := gzipped(data)
		if err != nil {
			return nil, err
		}
		staged, err := b.write("man8/"+filepath.Base(page)+".gz", gz)
		if err != nil {
			return nil, err
		}
		c = append(c, file(staged, ManDir+"/"+filepath.Base(page)+".gz", 0o644))
	}
	b.logf(start, "generated %d man pages and 3 completions", len(pages))
	return c, nil
}

// docs adds /usr/share/doc/agentd (copyright, changelog.Debian.gz) and the
// lintian overrides.
func (b *builder) docs(p *Package, maintainer string, c files.Contents) (files.Contents, error) {
	c = append(c, file(filepath.Join(b.o.Dir, "contrib/deb/copyright"), DocDir+"/copyright", 0o644))
	changelog := fmt.Sprintf("agentd (%s) unstable; urgency=medium\n\n  * Built from the source tree at git %s.\n\n -- %s  %s\n",
		p.Version, p.Describe, maintainer, p.Date.Format("Mon, 02 Jan 2006 15:04:05 -0700"))
	gz, err := gzipped([]byte(changelog))
	if err != nil {
		return nil, err
	}
	staged, err := b.write("changelog.Debian.gz", gz)
	if err != nil {
		return nil, err
	}
	c = append(c, file(staged, DocDir+"/changelog.Debian.gz", 0o644))
	overrides := filepath.Join(b.o.Dir, "contrib/deb/lintian-overrides")
	if data, err := os.ReadFile(overrides); err == nil && len(bytes.TrimSpace(data)) > 0 {
		c = append(c, file(overrides, LintianOverride, 0o644))
	} else if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	return c, nil
}

// write stages data under name and returns its path.
func (b *builder) write(name string, data []byte) (string, error) {
	p := filepath.Join(b.stage, "files", name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	return p, os.WriteFile(p, data, 0o644)
}

func file(src, dst string, mode os.FileMode) *files.Content {
	return &files.Content{Source: src, Destination: dst, FileInfo: &files.ContentFileInfo{Mode: mode}}
}

// packagedUnit points the unit's ExecStart= at the package's binary.
func packagedUnit(unit []byte) ([]byte, error) {
	from, to := []byte("\nExecStart="+sourceBin+" "), []byte("\nExecStart="+BinPath+" ")
	if n := bytes.Count(unit, from); n != 1 {
		return nil, fmt.Errorf("want one line starting %q, found %d", bytes.TrimSpace(from), n)
	}
	unit = bytes.Replace(unit, from, to, 1)
	if bytes.Contains(unit, []byte(sourceBin)) {
		return nil, fmt.Errorf("%s is named outside ExecStart=", sourceBin)
	}
	return unit, nil
}

// gzipped compresses data as gzip -9n does: best compression, no name, no
// time stamp (lintian and reproducible builds ask for both).
func gzipped(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	w, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(data); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
