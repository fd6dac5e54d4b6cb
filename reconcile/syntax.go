package reconcile

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"
)

// CheckSyntax refuses a unit file or drop-in that systemd would not read
// as written: lines it drops with a warning (the operator's change would
// silently do nothing) and section headers that make it refuse the whole
// file. unit is the unit the file belongs to ("hello.service" for
// "hello.service.d/x.conf"); its type says which sections systemd reads.
//
// It reads the file the way systemd's config_parse() and parse_line()
// (src/shared/conf-parser.c, v250 and later) do, line by line:
//
//   - a line ends at "\n", "\r", "\r\n" or "\n\r";
//   - a line whose first non-blank character is "#" or ";" is a comment,
//     also inside a continuation (systemd skips it and goes on joining);
//   - a UTF-8 byte order mark at the start is ignored;
//   - a line ending in an unescaped "\" continues on the next one (the
//     "\" becomes a space);
//   - each joined line is stripped of " \t\r\n"; blank lines are skipped.
//
// and refuses, naming the line:
//
//   - a section header that does not end in "]" (text after "]", a missing
//     "]"), or whose name has a control character, a quote or a backslash:
//     systemd refuses the whole file (EBADMSG);
//   - a section this unit type does not have ([Unit], [Install] and the
//     type's own: [Service], [Socket], [Timer], [Path], [Target], [Slice],
//     [Mount]), compared exactly as systemd does — "[]", "[service]",
//     "[ Service ]" and typos included: systemd ignores the section and
//     every line in it. Sections starting with "X-" are the user's own
//     and accepted, whatever their lines;
//   - a line before the first section header;
//   - a line without "=", or with nothing before "=";
//   - a key with a character other than A-Z a-z 0-9 (every key systemd
//     knows is made of those) unless it starts with "X-": systemd ignores
//     it as unknown.
//
// In agentd's own [X-Agentd] section a line without "=", or with nothing
// before it, is refused too: the policy could not be read. Whether a key is known, and its value, is
// ParsePolicy's business (and, for systemd's keys, systemd's: a misspelt
// key made of letters is not caught here). The error is a *SyntaxError.
func CheckSyntax(unit string, content []byte) error {
	typ := unit[strings.LastIndexByte(unit, '.')+1:]
	c := syntaxChecker{sections: typeSections[typ]}
	line := 0       // physical lines read, as systemd numbers them
	var cont []byte // the continued line so far; nil when none
	contStart := 0  // its first line
	bomSeen := false
	rest := content
	for len(rest) > 0 {
		var raw []byte
		raw, rest = cutLine(rest)
		line++
		if !bomSeen {
			// systemd strips the mark after its comment check, so it
			// would warn about "\uFEFF# …" as a line outside any
			// section; it drops the line either way, and it is meant as
			// a comment.
			if q, ok := bytes.CutPrefix(raw, []byte("\uFEFF")); ok {
				raw, bomSeen = q, true
			}
		}
		if l := bytes.TrimLeft(raw, whitespace); len(l) > 0 && (l[0] == '#' || l[0] == ';') {
			continue
		}
		var p []byte
		if cont != nil {
			p = append(cont, raw...)
		} else {
			p = append([]byte(nil), raw...)
			contStart = line
		}
		if endsEscaped(p) {
			p[len(p)-1] = ' '
			cont = p
			continue
		}
		c.parseLine(contStart, line, p)
		cont = nil
	}
	if cont != nil {
		c.parseLine(contStart, line, cont)
	}
	if len(c.problems) > 0 {
		return &SyntaxError{Problems: c.problems}
	}
	return nil
}

// CheckValue checks the value of a unit key (a key suffix: a unit file, a
// drop-in or a config file) as the agent takes it; the one rule for
// clients (unit put, unit edit) and the agent (Desire).
func CheckValue(key string, value []byte) error {
	_, unit, err := ParseKey(key)
	if err != nil {
		return err
	}
	return checkValue(unit, key, value)
}

// checkValue is what Desire checks of every non-empty registry value at
// path (a key suffix of unit) before it may become a file: a config file's
// header and content (validateConfigValue); else the value itself
// (ValidateContent), then its syntax as systemd reads it (CheckSyntax).
func checkValue(unit, path string, value []byte) error {
	if IsConfigPath(path) {
		return validateConfigValue(value)
	}
	if err := ValidateContent(value); err != nil {
		return err
	}
	return CheckSyntax(unit, value)
}

// typeSections are the sections systemd reads in a unit file or drop-in of
// each type (the .sections of the unit type's vtable in src/core/).
var typeSections = map[string][]string{
	"service": {"Unit", "Service", "Install"},
	"socket":  {"Unit", "Socket", "Install"},
	"timer":   {"Unit", "Timer", "Install"},
	"path":    {"Unit", "Path", "Install"},
	"target":  {"Unit", "Target", "Install"},
	"slice":   {"Unit", "Slice", "Install"},
	"mount":   {"Unit", "Mount", "Install"},
}

// SyntaxError lists the lines of a unit file or drop-in that systemd would
// not read as written, in line order.
type SyntaxError struct {
	Problems []SyntaxProblem
}

// SyntaxProblem is one line systemd would drop, or a header that makes it
// refuse the file.
type SyntaxProblem struct {
	Line    int    // first physical line, counted as systemd counts them
	EndLine int    // last physical line (> Line for a continued line)
	Text    string // the line, stripped, at most 60 bytes
	Why     string
}

func (p SyntaxProblem) String() string {
	where := fmt.Sprintf("line %d", p.Line)
	if p.EndLine > p.Line {
		where = fmt.Sprintf("lines %d-%d", p.Line, p.EndLine)
	}
	return fmt.Sprintf("%s %q: %s", where, p.Text, p.Why)
}

// maxShown bounds the problems an error message spells out.
const maxShown = 3

func (e *SyntaxError) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i == maxShown {
			fmt.Fprintf(&b, "; and %d more", len(e.Problems)-maxShown)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

type syntaxChecker struct {
	sections []string // nil: a unit type whose sections are not known here
	// section is the current section; "" before the first header.
	section string
	// skip: the current section is one systemd ignores (X-, or unknown and
	// already reported): its lines are not checked.
	skip     bool
	problems []SyntaxProblem
}

const whitespace = " \t\r\n"

func (c *syntaxChecker) problem(first, last int, l []byte, why string) {
	text := string(l)
	if len(text) > 60 {
		text = text[:60]
		for !utf8.ValidString(text) {
			text = text[:len(text)-1]
		}
		text += "…"
	}
	c.problems = append(c.problems, SyntaxProblem{Line: first, EndLine: last, Text: text, Why: why})
}

// parseLine is systemd's parse_line for one logical line (first..last).
func (c *syntaxChecker) parseLine(first, last int, l []byte) {
	l = bytes.Trim(l, whitespace)
	if len(l) == 0 {
		return
	}
	if !utf8.Valid(l) {
		c.problem(first, last, l, "not valid UTF-8; systemd ignores the line")
		return
	}
	if l[0] == '[' {
		c.header(first, last, l)
		return
	}
	if c.skip && c.section != "X-Agentd" {
		return // systemd ignores every line of the section
	}
	if c.section == "" {
		c.problem(first, last, l, "a line before the first section header; systemd ignores it")
		return
	}
	eq := bytes.IndexByte(l, '=')
	switch {
	case c.section == "X-Agentd":
		if eq <= 0 {
			c.problem(first, last, l, `not a "Key=value" line in [X-Agentd]; agentd cannot read its policy`)
		}
	case eq < 0:
		c.problem(first, last, l, `no "="; systemd ignores the line`)
	case eq == 0:
		c.problem(first, last, l, `no key name before "="; systemd ignores the line`)
	default:
		key := bytes.Trim(l[:eq], whitespace)
		if !bytes.HasPrefix(key, []byte("X-")) && !isKeyName(key) {
			c.problem(first, last, l, fmt.Sprintf("key %q has a character systemd never accepts in a key name "+
				"(keys are letters and digits, or start with \"X-\"); systemd ignores the line", key))
		}
	}
}

// header handles a line starting with "[".
func (c *syntaxChecker) header(first, last int, l []byte) {
	if l[len(l)-1] != ']' || len(l) < 2 {
		c.problem(first, last, l, `invalid section header: it does not end in "]"; systemd refuses to load the file`)
		c.section, c.skip = "?", true
		return
	}
	name := string(l[1 : len(l)-1])
	if i := strings.IndexFunc(name, func(r rune) bool {
		return r < ' ' || r == 0x7f || r == '"' || r == '\'' || r == '\\'
	}); i >= 0 {
		c.problem(first, last, l, fmt.Sprintf("section name with the character %q; systemd refuses to load the file", name[i]))
		c.section, c.skip = "?", true
		return
	}
	c.section, c.skip = name, false
	switch {
	case strings.HasPrefix(name, "X-"):
		c.skip = true
	case c.sections == nil:
	case !contains(c.sections, name):
		c.problem(first, last, l, fmt.Sprintf("this unit type has no section [%s] (it has [%s], or [X-…] of your own); "+
			"systemd ignores the section and every line in it", name, strings.Join(c.sections, "], [")))
		c.skip = true
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// isKeyName reports whether key is made of ASCII letters and digits only,
// as every key systemd knows is.
func isKeyName(key []byte) bool {
	for _, b := range key {
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9') {
			return false
		}
	}
	return len(key) > 0
}

// endsEscaped reports whether p ends in a backslash that is not itself
// escaped: systemd's continuation rule.
func endsEscaped(p []byte) bool {
	escaped := false
	for _, b := range p {
		if escaped {
			escaped = false
		} else if b == '\\' {
			escaped = true
		}
	}
	return escaped
}

// cutLine splits off the first line as systemd's read_line() does: a line
// ends at "\n", "\r", "\r\n", "\n\r" (each optionally followed by a NUL)
// or a lone NUL; the end is not part of the line.
func cutLine(b []byte) (line, rest []byte) {
	i := bytes.IndexAny(b, "\n\r\x00")
	if i < 0 {
		return b, nil
	}
	line, rest = b[:i], b[i+1:]
	if b[i] == 0 {
		return line, rest
	}
	if len(rest) > 0 && (rest[0] == '\n' || rest[0] == '\r') && rest[0] != b[i] {
		rest = rest[1:]
	}
	if len(rest) > 0 && rest[0] == 0 {
		rest = rest[1:]
	}
	return line, rest
}
