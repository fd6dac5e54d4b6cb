package reconcile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// A config file is a file of a unit's set that lives outside the unit
// directory: the /etc/myapp/app.conf its ExecStart= reads (`agentd unit put
// --file DEST=SRC[:MODE[:OWNER]]`). It is one more key of the unit,
//
//	<unit>.files/<DEST without its leading slash>
//
// so it lands, is kept, rolled back, reverted, signed and waited for with
// the unit file and drop-ins, as one set. The value is the content behind
// one header line saying how the file is to be on disk:
//
//	#agentd-file mode=0640 owner=app:app
//
// Mode and owner are in the value, under its hash, so a chmod on the host
// is drift like an edit, and history and signatures cover them. The agent
// reads a file on disk back into these same bytes to compare (the files
// adapter), which is why the header has one canonical form.

// FilesDir separates a unit's name from a config file's path in its key.
const FilesDir = ".files/"

const (
	fileHeader   = "#agentd-file "
	DefaultMode  = fs.FileMode(0o644)
	DefaultOwner = "root:root"
	maxDestPath  = 1024
)

// ConfigFile is a config file as the registry gives it.
type ConfigFile struct {
	Mode fs.FileMode // permission bits only (07777)
	// Owner is "user:group", by name: each host resolves them. Encode
	// writes DefaultOwner for "". Always spelt out: a file read back from
	// disk says its owner, and "the agent's own" would read back as either.
	Owner string
	// Secret says Content is the file age-encrypted (ASCII armour) to
	// the hosts in To (and the operators' own recipients): the header
	// reads "secret=age to=h1,h2". The registry, its history and every
	// status hold only that; each host decrypts it just before writing.
	Secret bool
	To     []string // the hosts it was encrypted to, sorted
	// Content is the file's bytes (for a secret: the ciphertext).
	Content []byte
}

// secretTag is the header's word for an age-encrypted file.
const secretTag = "secret=age"

// Encode is the canonical value of f.
func (f ConfigFile) Encode() []byte {
	var b bytes.Buffer
	owner := f.Owner
	if owner == "" {
		owner = DefaultOwner
	}
	fmt.Fprintf(&b, "%smode=%04o owner=%s", fileHeader, uint32(f.Mode.Perm())|unixBits(f.Mode), owner)
	if f.Secret {
		fmt.Fprintf(&b, " %s to=%s", secretTag, strings.Join(f.To, ","))
	}
	b.WriteByte('\n')
	b.Write(f.Content)
	return b.Bytes()
}

// unixBits maps Go's setuid, setgid and sticky flags to their octal bits.
func unixBits(m fs.FileMode) uint32 {
	var b uint32
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// ModeOf turns octal permission bits (0640, 02755) into an fs.FileMode.
func ModeOf(bits uint32) fs.FileMode {
	m := fs.FileMode(bits & 0o777)
	if bits&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if bits&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if bits&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// ParseMode reads a mode as chmod's octal form: 1 to 4 octal digits.
func ParseMode(s string) (fs.FileMode, error) {
	if s == "" || len(s) > 4 {
		return 0, fmt.Errorf("mode %q: want 1 to 4 octal digits such as 0640", s)
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		return 0, fmt.Errorf("mode %q: not octal (want digits 0-7 such as 0640)", s)
	}
	return ModeOf(uint32(n)), nil
}

// DecodeConfigFile reads a config file's value. It refuses anything but the
// canonical form Encode writes: a value the agent could not read back from
// disk byte for byte would be rewritten on every pass.
func DecodeConfigFile(b []byte) (ConfigFile, error) {
	head, content, ok := bytes.Cut(b, []byte("\n"))
	if !ok || !bytes.HasPrefix(head, []byte(fileHeader)) {
		return ConfigFile{}, fmt.Errorf("a config file's value must begin with a %q line (store it with agentd unit put --file)", strings.TrimSpace(fileHeader)+" mode=0644 owner=root:root")
	}
	var f ConfigFile
	f.Content = content
	fields := strings.Fields(string(head[len(fileHeader):]))
	for i, kv := range fields {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "mode" && i == 0:
			m, err := ParseMode(v)
			if err != nil {
				return ConfigFile{}, fmt.Errorf("config file header: %w", err)
			}
			f.Mode = m
		case k == "owner" && i == 1:
			if err := ValidateOwner(v); err != nil {
				return ConfigFile{}, fmt.Errorf("config file header: %w", err)
			}
			f.Owner = v
		case kv == secretTag && i == 2:
			f.Secret = true
		case k == "to" && i == 3 && f.Secret:
			for _, h := range strings.Split(v, ",") {
				if h == "" {
					return ConfigFile{}, fmt.Errorf("config file header: to=%q: an empty host name", v)
				}
				f.To = append(f.To, h)
			}
		default:
			return ConfigFile{}, fmt.Errorf("config file header: unexpected %q (want mode=NNNN owner=USER:GROUP)", kv)
		}
	}
	if len(fields) < 2 || f.Secret && len(fields) != 4 {
		return ConfigFile{}, fmt.Errorf("config file header %q: want mode=NNNN owner=USER:GROUP (and for a secret, secret=age to=HOST,…)", head)
	}
	if !bytes.Equal(f.Encode(), b) {
		return ConfigFile{}, fmt.Errorf("config file header %q is not in canonical form (%q); store it with agentd unit put --file", head, bytes.TrimSuffix(f.Encode()[:len(f.Encode())-len(content)], []byte("\n")))
	}
	return f, nil
}

// ValidateOwner checks an owner "user:group": both by name, as chown takes
// them. Numeric IDs are refused: the agent reads the owner of a file on
// disk back by name, and the same ID may be another account on another host.
func ValidateOwner(s string) error {
	user, group, ok := strings.Cut(s, ":")
	if !ok {
		return fmt.Errorf("owner %q: want USER:GROUP, both by name", s)
	}
	for _, n := range []string{user, group} {
		if err := validateAccountName(n); err != nil {
			return fmt.Errorf("owner %q: %w", s, err)
		}
	}
	return nil
}

func validateAccountName(n string) error {
	if n == "" || len(n) > 32 {
		return fmt.Errorf("name %q: want 1 to 32 characters", n)
	}
	if strings.Trim(n, "0123456789") == "" {
		return fmt.Errorf("name %q: numeric IDs are not taken; give the name (each host resolves it)", n)
	}
	for i, r := range n {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' ||
			(r == '-' && i > 0) || (r == '$' && i > 0 && i == len(n)-1)
		if !ok {
			return fmt.Errorf("name %q: character %q not allowed", n, r)
		}
	}
	return nil
}

// ConfigKey is the key suffix of unit's config file dest.
func ConfigKey(unit, dest string) string { return unit + FilesDir + strings.TrimPrefix(dest, "/") }

// ConfigDest is the path on disk of a config file's key suffix, and the
// unit whose set it belongs to; ok is false for any other key.
func ConfigDest(key string) (unit, dest string, ok bool) {
	unit, rest, ok := strings.Cut(key, FilesDir)
	if !ok {
		return "", "", false
	}
	return unit, "/" + rest, true
}

// IsConfigPath says whether a managed path is a config file's.
func IsConfigPath(p string) bool { return strings.Contains(p, FilesDir) }

// ValidateDest checks a config file's path on disk: absolute, clean, and
// made of plain names. Where it may be written is the host's to say
// (agentd run --file-root).
func ValidateDest(dest string) error {
	switch {
	case !strings.HasPrefix(dest, "/"):
		return fmt.Errorf("file path %q: must be absolute", dest)
	case len(dest) > maxDestPath:
		return fmt.Errorf("file path %.40q…: longer than %d bytes", dest, maxDestPath)
	case dest == "/" || strings.HasSuffix(dest, "/"):
		return fmt.Errorf("file path %q: names a directory, not a file", dest)
	case path.Clean(dest) != dest:
		return fmt.Errorf("file path %q: not clean (no \"..\", \".\" or \"//\"; it would be %q)", dest, path.Clean(dest))
	}
	for _, seg := range strings.Split(dest[1:], "/") {
		if seg == ".." || seg == "." {
			return fmt.Errorf("file path %q: \"..\" and \".\" are not allowed", dest)
		}
		if len(seg) > maxFileName {
			return fmt.Errorf("file path %q: a name longer than %d bytes", dest, maxFileName)
		}
		for _, r := range seg {
			if r < 0x21 || r > 0x7e || r == '\\' {
				return fmt.Errorf("file path %q: character %q not allowed", dest, r)
			}
		}
	}
	return nil
}

// validateConfigValue checks a config file's value as the agent takes it.
func validateConfigValue(b []byte) error {
	if err := ValidateContent(b); err != nil {
		return err
	}
	_, err := DecodeConfigFile(b)
	return err
}

// ErrOutsideRoots is wrapped by RootOf's error: a config file's path is
// under none of the roots the host allows (agentd run --file-root).
var ErrOutsideRoots = errors.New("outside every --file-root")

// RootOf is the root of roots (absolute, clean) that holds dest: the
// longest. It is the one rule of where a host takes a config file, for the
// agent's writes (unitdir.Roots) and its plan, and for a preview from the
// roots a host publishes in its facts.
func RootOf(dest string, roots []string) (string, error) {
	best := ""
	for _, r := range roots {
		if dest == r {
			return "", fmt.Errorf("%s is a --file-root, a directory, not a file", dest)
		}
		if strings.HasPrefix(dest, strings.TrimSuffix(r, "/")+"/") && len(r) > len(best) {
			best = r
		}
	}
	switch {
	case best != "":
		return best, nil
	case len(roots) == 0:
		return "", fmt.Errorf("%s is %w: this agent was started with none (agentd run --file-root DIR allows config files under DIR)", dest, ErrOutsideRoots)
	}
	return "", fmt.Errorf("%s is %w (%s): the host decides where config files may go (agentd run --file-root DIR)", dest, ErrOutsideRoots, strings.Join(roots, ", "))
}
