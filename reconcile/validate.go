package reconcile

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxValueSize bounds a registry value. Real unit files are a few KiB; a
// larger value is a mistake (or an attack) and is refused before it reaches
// the disk.
const MaxValueSize = 256 << 10

// supportedTypes are the unit types agentd manages. Devices and scopes are
// not configured by files; swaps and automounts are left out deliberately.
var supportedTypes = map[string]bool{
	"service": true, "socket": true, "timer": true, "path": true,
	"target": true, "slice": true, "mount": true,
}

// SupportedType reports whether typ ("service", "socket", …) is a unit type
// agentd manages.
func SupportedType(typ string) bool { return supportedTypes[typ] }

// ErrReserved is wrapped by the errors of ValidateUnitName and ParseKey for
// a unit on the built-in deny-list (see Reserved).
var ErrReserved = errors.New("reserved unit")

// reservedWhy is the one explanation every reserved-unit error carries.
const reservedWhy = "agentd never manages its own unit, the bus, systemd's own units, the root slice or user managers"

// Reserved says whether agentd refuses to manage the unit name (and
// drop-ins of it), and what the unit is: the agent's own unit, the bus
// (dbus*), systemd's own units (systemd-*), the root slice, init.scope and
// the user managers (user@*.service). Writing any of them could cut the
// agent off from systemd or the machine from its users. Names are matched
// literally, as systemd compares them: "systemd\x2dx.service" is another
// unit than "systemd-x.service".
func Reserved(name string) (what string, ok bool) {
	switch {
	case name == "agentd.service":
		return "the agent's own unit", true
	case strings.HasPrefix(name, "dbus"):
		return "the message bus", true
	case strings.HasPrefix(name, "systemd-"):
		return "one of systemd's own units", true
	case name == "-.slice":
		return "the root slice", true
	case name == "-.mount":
		return "the root file system", true
	case name == "init.scope":
		return "PID 1's scope", true
	case strings.HasPrefix(name, "user@") && strings.HasSuffix(name, ".service"):
		return "a user manager", true
	}
	return "", false
}

// ValidateUnitName checks a unit name the way systemd does
// (unit_name_is_valid, systemd.unit(5)): at most 255 bytes; a prefix of
// [a-zA-Z0-9:_.\\-] and "@", then "." and a unit type; "name@.type" a
// template, "name@instance.type" an instance (with or without a template
// beside it). Names systemd-escape makes are valid: "foo\x2dbar.service",
// "srv-my\x2ddata.mount", "a@b\x2dc.service". On top of systemd's rule,
// for the types agentd supports and the deny-list of Reserved, it refuses:
//   - "/" and "..": the names that could reach a path outside the unit
//     directory ("srv-a..b.mount", which systemd-escape makes for /srv/a..b,
//     is refused with them);
//   - a leading ".": systemd skips hidden files, and ".<name>" is where the
//     agent keeps its temp files;
//   - a backslash that does not start an escape \xNN: systemd-escape never
//     writes one, systemd cannot unescape it (%I), and "foo\\x2dbar" is
//     what a name quoted twice looks like;
//   - a second "@": systemd takes "a@b@c.service" as an instance "b@c",
//     but systemd-escape escapes "@" in instances (\x40).
//
// It is the one rule for unit names: the agent blocks what it refuses, and
// the registry CLI refuses it before writing.
func ValidateUnitName(name string) error {
	if name == "" {
		return fmt.Errorf("empty unit name")
	}
	if len(name) > 255 {
		return fmt.Errorf("unit name %.40q…: longer than 255 bytes", name)
	}
	if strings.Contains(name, "/") || strings.Contains(name, "..") {
		return fmt.Errorf("invalid unit name %q: must not contain \"/\" or \"..\"", name)
	}
	if strings.HasPrefix(name, ".") {
		// systemd skips hidden files in unit directories, and ".<name>" is
		// where the agent keeps its temp files.
		return fmt.Errorf("invalid unit name %q: must not start with \".\"", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(":-_.\\@", r)) {
			return fmt.Errorf("invalid unit name %q: character %q not allowed", name, r)
		}
	}
	if err := checkEscapes(name); err != nil {
		return fmt.Errorf("invalid unit name %q: %w", name, err)
	}
	dot := strings.LastIndexByte(name, '.')
	if dot <= 0 {
		return fmt.Errorf("invalid unit name %q: no unit type suffix", name)
	}
	if what, ok := Reserved(name); ok {
		return fmt.Errorf("%w %q (%s): %s", ErrReserved, name, what, reservedWhy)
	}
	typ := name[dot+1:]
	if !supportedTypes[typ] {
		return fmt.Errorf("unsupported unit type %q in %q (supported: service, socket, timer, path, target, slice, mount)", typ, name)
	}
	prefix := name[:dot]
	if at := strings.IndexByte(prefix, '@'); at >= 0 {
		if at == 0 {
			return fmt.Errorf("invalid unit name %q: empty template prefix", name)
		}
		if strings.Count(prefix, "@") > 1 {
			return fmt.Errorf("invalid unit name %q: more than one \"@\"", name)
		}
	}
	return nil
}

// checkEscapes refuses a backslash that does not start \xNN, the escape
// of systemd-escape (and the only one systemd's unit_name_unescape reads).
func checkEscapes(name string) error {
	for i := 0; i < len(name); i++ {
		if name[i] != '\\' {
			continue
		}
		esc := name[i:min(i+4, len(name))]
		if len(esc) < 4 || esc[1] != 'x' || !isHex(esc[2]) || !isHex(esc[3]) {
			return fmt.Errorf("a backslash must start an escape \\xNN as systemd-escape writes it, not %q (was the name quoted twice?)", esc)
		}
		i += 3
	}
	return nil
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// IsTemplate reports whether name is a template such as foo@.service: its
// first "@" comes right before its type suffix, as systemd tells.
func IsTemplate(name string) bool {
	at := strings.IndexByte(name, '@')
	return at > 0 && at+1 == strings.LastIndexByte(name, '.')
}

// IsInstance reports whether name is a template instance such as
// foo@1.service (or foo@.1.service, whose instance is ".1").
func IsInstance(name string) bool {
	at := strings.IndexByte(name, '@')
	return at > 0 && at+1 < strings.LastIndexByte(name, '.')
}

// TemplateOf returns foo@.service for foo@1.service.
func TemplateOf(instance string) string {
	at := strings.IndexByte(instance, '@')
	dot := strings.LastIndexByte(instance, '.')
	if at < 0 || dot < at {
		return ""
	}
	return instance[:at+1] + instance[dot:]
}

// maxFileName is NAME_MAX: the longest file name the unit directory takes.
const maxFileName = 255

// ParseKey splits a registry key suffix (what follows ".../units/") into the
// file path relative to the unit directory and the unit it belongs to. It
// accepts "<unit>", "<unit>.d/<name>.conf" (a drop-in) and
// "<unit>.files/<path>" (a config file, configfile.go) and nothing else:
// no type-wide ("service.d/") drop-ins, which would reach reserved units too.
// This is the one rule for unit keys, shared by the agent (which blocks a
// unit whose key it refuses) and the registry client (which refuses to
// write it); errors for reserved units wrap ErrReserved.
func ParseKey(key string) (path, unit string, err error) {
	if unitPart, dest, ok := ConfigDest(key); ok {
		if err := ValidateUnitName(unitPart); err != nil {
			if errors.Is(err, ErrReserved) {
				return "", "", fmt.Errorf("config file %q: %w", key, err)
			}
			return "", "", err
		}
		if err := ValidateDest(dest); err != nil {
			return "", "", fmt.Errorf("invalid config file key %q: %w", key, err)
		}
		return key, unitPart, nil
	}
	if unitPart, dropIn, ok := strings.Cut(key, ".d/"); ok {
		if err := ValidateUnitName(unitPart); err != nil {
			if errors.Is(err, ErrReserved) {
				return "", "", fmt.Errorf("drop-in %q: %w", key, err)
			}
			return "", "", err
		}
		if len(unitPart)+len(".d") > maxFileName {
			return "", "", fmt.Errorf("invalid drop-in for %.40q…: directory name longer than %d bytes", unitPart, maxFileName)
		}
		if !strings.HasSuffix(dropIn, ".conf") || len(dropIn) <= len(".conf") {
			return "", "", fmt.Errorf("invalid drop-in %q: name must end in .conf", key)
		}
		if strings.ContainsAny(dropIn, "/\\") || strings.Contains(dropIn, "..") || strings.HasPrefix(dropIn, ".") {
			return "", "", fmt.Errorf("invalid drop-in %q: must be a plain file name", key)
		}
		if len(dropIn) > maxFileName {
			return "", "", fmt.Errorf("invalid drop-in %.40q… for %q: file name longer than %d bytes", dropIn, unitPart, maxFileName)
		}
		for _, r := range dropIn {
			if r < 0x21 || r > 0x7e {
				return "", "", fmt.Errorf("invalid drop-in %q: character %q not allowed", key, r)
			}
		}
		return key, unitPart, nil
	}
	if err := ValidateUnitName(key); err != nil {
		return "", "", err
	}
	return key, key, nil
}

// ValidateContent checks a registry value before it may become a file.
func ValidateContent(b []byte) error {
	if len(b) > MaxValueSize {
		return fmt.Errorf("value is %d bytes, over the %d KiB limit", len(b), MaxValueSize>>10)
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return fmt.Errorf("value contains a NUL byte at offset %d", i)
	}
	if !utf8.Valid(b) {
		return fmt.Errorf("value is not valid UTF-8")
	}
	return nil
}
