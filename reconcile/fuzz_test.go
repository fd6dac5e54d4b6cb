package reconcile

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// Fuzz targets. Seed corpora of realistic inputs live in
// testdata/fuzz/<FuzzName>/ and run as ordinary tests; fuzz with e.g.
//
//	go test ./reconcile -run '^$' -fuzz '^FuzzParseKey$' -fuzztime 60s -parallel 1
//
// Each target asserts properties, not just the absence of a panic.

// FuzzParseKey: whatever a registry key holds, an accepted key names a
// plain file in the unit directory or in one "<unit>.d/" below it, of a
// valid, supported, non-reserved unit; and the name an invalid key is
// reported under can never shape a status key.
func FuzzParseKey(f *testing.F) {
	f.Fuzz(func(t *testing.T, key string) {
		path, unit, err := ParseKey(key)
		p2, u2, err2 := ParseKey(key)
		if path != p2 || unit != u2 || (err == nil) != (err2 == nil) {
			t.Fatalf("ParseKey(%q) not deterministic", key)
		}
		if sn := StatusName(key); strings.Contains(sn, "/") || strings.Contains(sn, "..") || (key != "" && sn == "") {
			t.Fatalf("StatusName(%q) = %q: contains \"/\" or \"..\", or is empty", key, sn)
		}
		if err != nil {
			if path != "" || unit != "" {
				t.Fatalf("ParseKey(%q) = %q, %q with error %v", key, path, unit, err)
			}
			if errors.Is(err, ErrReserved) {
				u, _, _ := strings.Cut(key, ".d/")
				if _, ok := Reserved(u); !ok {
					t.Fatalf("ParseKey(%q): ErrReserved for %q, which Reserved does not list", key, u)
				}
			}
			return
		}
		if path != key {
			t.Fatalf("ParseKey(%q): path %q differs from the key", key, path)
		}
		if strings.Contains(path, "..") || strings.HasPrefix(path, ".") || strings.HasPrefix(path, "/") || strings.HasSuffix(path, "/") {
			t.Fatalf("ParseKey(%q): unsafe path %q", key, path)
		}
		if err := ValidateUnitName(unit); err != nil {
			t.Fatalf("ParseKey(%q): unit %q fails ValidateUnitName: %v", key, unit, err)
		}
		if _, ok := Reserved(unit); ok {
			t.Fatalf("ParseKey(%q): reserved unit %q accepted", key, unit)
		}
		if strings.ContainsAny(unit, "/\x00") || len(unit) > maxFileName {
			t.Fatalf("ParseKey(%q): unit %q", key, unit)
		}
		switch strings.Count(path, "/") {
		case 0:
			if unit != path {
				t.Fatalf("ParseKey(%q): unit %q for a unit file", key, unit)
			}
		case 1:
			dir, file, _ := strings.Cut(path, "/")
			if dir != unit+".d" {
				t.Fatalf("ParseKey(%q): drop-in directory %q is not %q", key, dir, unit+".d")
			}
			if !strings.HasSuffix(file, ".conf") || len(file) <= len(".conf") || strings.HasPrefix(file, ".") || len(file) > maxFileName || len(dir) > maxFileName {
				t.Fatalf("ParseKey(%q): drop-in file name %q", key, file)
			}
			for i := 0; i < len(file); i++ {
				if file[i] < 0x21 || file[i] > 0x7e || file[i] == '\\' {
					t.Fatalf("ParseKey(%q): drop-in file name %q has byte %#x", key, file, file[i])
				}
			}
			if UnitOfPath(path) != unit {
				t.Fatalf("ParseKey(%q): UnitOfPath = %q, want %q", key, UnitOfPath(path), unit)
			}
		default:
			t.Fatalf("ParseKey(%q): path %q has more than one \"/\"", key, path)
		}
	})
}

// classifyNames are the unit names FuzzClassify picks from: each type's
// own rules (mount options, reload triggers) get exercised.
var classifyNames = []string{"a.service", "a.socket", "a.timer", "a.path", "a.target", "a.slice", "data.mount", "a@.service"}

// FuzzClassify: two versions of a unit file. Classify is deterministic,
// calls identical content no change and different content some change,
// returns a kind it can name, and sees a comment line added to a file
// that parses as cosmetic at most.
func FuzzClassify(f *testing.F) {
	f.Fuzz(func(t *testing.T, pick uint8, old, new []byte) {
		name := classifyNames[int(pick)%len(classifyNames)]
		o := []File{{Path: name, Content: old}}
		n := []File{{Path: name, Content: new}}
		c := Classify(name, o, n)
		if again := Classify(name, o, n); !reflect.DeepEqual(c, again) {
			t.Fatalf("Classify not deterministic: %+v, then %+v", c, again)
		}
		if c.Kind < ChangeNone || c.Kind > ChangeRestart {
			t.Fatalf("Classify: kind %d out of range", c.Kind)
		}
		_ = c.Kind.String()
		if c.Kind != ChangeNone && c.Reason() == "" {
			t.Fatalf("Classify: %+v has no reason", c)
		}
		if same := bytes.Equal(old, new); same != (c.Kind == ChangeNone) {
			t.Fatalf("Classify(%q, %q) = %s; bytes equal: %v", old, new, c.Kind, same)
		}
		for _, x := range [][]byte{old, new} {
			self := []File{{Path: name, Content: x}}
			if k := Classify(name, self, []File{{Path: name, Content: bytes.Clone(x)}}).Kind; k != ChangeNone {
				t.Fatalf("Classify(x, x) = %s for %q", k, x)
			}
		}
		// A comment line appended to a file the parser reads, ending in a
		// complete line, changes nothing in effect.
		// Only for files the agent lets through (CheckSyntax): garbage such
		// as "[]" headers never reaches Classify, and go-systemd's parser
		// reads it differently from systemd.
		if _, err := unitOptions(old); err == nil && CheckSyntax(name, old) == nil && bytes.HasSuffix(old, []byte("\n")) && !endsEscaped(bytes.TrimRight(old, "\r\n")) {
			withComment := append(bytes.Clone(old), "# a comment\n"...)
			if k := Classify(name, o, []File{{Path: name, Content: withComment}}); k.Kind != ChangeCosmetic {
				t.Fatalf("a comment appended to %q: %s (%s), want cosmetic", old, k.Kind, k.Reason())
			}
		}
	})
}

// renderPolicy writes p as an [X-Agentd] section that ParsePolicy reads
// back as p.
func renderPolicy(p Policy) string {
	yn := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	s := fmt.Sprintf("[X-Agentd]\nState=%s\nEnable=%s\nOnChange=%s\nRollback=%s\nHealthySec=%v\n",
		p.State, yn(p.Enable), p.OnChange, yn(p.Rollback), p.Healthy)
	if p.SlotLimit > 0 {
		s += fmt.Sprintf("MaxUnavailable=%d\n", p.SlotLimit)
	}
	return s
}

// FuzzParsePolicy: a unit file's policy. ParsePolicy is deterministic and
// returns only values the agent knows; a file without an [X-Agentd]
// section gets the defaults; and every policy it accepts, written out as
// an [X-Agentd] section, reads back the same.
func FuzzParsePolicy(f *testing.F) {
	defaults := Policy{State: StateStarted, OnChange: "auto", Rollback: true, Healthy: DefaultHealthy}
	f.Fuzz(func(t *testing.T, content []byte) {
		p, err := ParsePolicy(content)
		p2, err2 := ParsePolicy(content)
		if p != p2 || (err == nil) != (err2 == nil) {
			t.Fatalf("ParsePolicy(%q) not deterministic", content)
		}
		if err != nil {
			return
		}
		if p.State != StateStarted && p.State != StateStopped && p.State != StatePresent {
			t.Fatalf("ParsePolicy(%q): State %d", content, p.State)
		}
		if !onChangeValues[p.OnChange] || p.Healthy < 0 || p.SlotLimit < 0 {
			t.Fatalf("ParsePolicy(%q) = %+v: a value the agent does not know", content, p)
		}
		// The defaults, for a file the agent lets through (CheckSyntax: a
		// line like "0[X-Agentd]" is refused before ParsePolicy runs).
		if !hasSectionHeader(content, "X-Agentd") && CheckSyntax("x.service", content) == nil {
			want := defaults
			want.HasInstall, want.Enable = p.HasInstall, p.HasInstall
			if p != want {
				t.Fatalf("ParsePolicy(%q) without [X-Agentd] = %+v, want the defaults %+v", content, p, want)
			}
		}
		// Round trip: the accepted policy, rendered.
		base := "[Unit]\nDescription=x\n[Service]\nExecStart=/bin/true\n"
		if p.HasInstall {
			base += "[Install]\nWantedBy=multi-user.target\n"
		}
		back, err := ParsePolicy([]byte(base + renderPolicy(p)))
		if err != nil || back != p {
			t.Fatalf("ParsePolicy(%q) = %+v; rendered and read back: %+v, %v", content, p, back, err)
		}
		// Without its section the same file gets the defaults.
		def, err := ParsePolicy([]byte(base))
		want := defaults
		want.HasInstall, want.Enable = p.HasInstall, p.HasInstall
		if err != nil || def != want {
			t.Fatalf("defaults: %+v, %v; want %+v", def, err, want)
		}
	})
}

// FuzzCheckSyntax: any bytes as a unit file of any type. CheckSyntax is
// deterministic; its problems are in line order, within the file, quoted
// in short valid text; the line numbers do not depend on the line-ending
// style, and move by one under an added comment line; and a file it
// accepts, when go-systemd's parser reads it too, holds only sections and
// keys systemd reads.
func FuzzCheckSyntax(f *testing.F) {
	f.Fuzz(func(t *testing.T, pick uint8, content []byte) {
		unit := classifyNames[int(pick)%len(classifyNames)]
		problems := func(b []byte) []SyntaxProblem {
			err := CheckSyntax(unit, b)
			if err == nil {
				return nil
			}
			var se *SyntaxError
			if !errors.As(err, &se) || len(se.Problems) == 0 || err.Error() == "" {
				t.Fatalf("CheckSyntax(%q): %T %v", b, err, err)
			}
			return se.Problems
		}
		ps := problems(content)
		if again := problems(content); !reflect.DeepEqual(ps, again) {
			t.Fatalf("CheckSyntax(%q) not deterministic", content)
		}
		lines := bytes.Count(content, []byte("\n")) + bytes.Count(content, []byte("\r")) + bytes.Count(content, []byte("\x00")) + 1
		for i, p := range ps {
			if p.Line < 1 || p.EndLine < p.Line || p.EndLine > lines || (i > 0 && p.Line < ps[i-1].Line) {
				t.Fatalf("CheckSyntax(%q): problem %d at lines %d-%d (file has at most %d)", content, i, p.Line, p.EndLine, lines)
			}
			if len(p.Text) > 60+len("…") || p.Why == "" || (utf8.Valid(content) && !utf8.ValidString(p.Text)) {
				t.Fatalf("CheckSyntax(%q): problem text %q, why %q", content, p.Text, p.Why)
			}
		}
		// The same lines with CRLF ends: the same problems.
		if !bytes.ContainsAny(content, "\r\x00") {
			crlf := bytes.ReplaceAll(content, []byte("\n"), []byte("\r\n"))
			if got := problems(crlf); !sameLines(got, ps) {
				t.Fatalf("CheckSyntax: %q has problems %v, with CRLF %v", content, ps, got)
			}
		}
		// A comment line in front: every problem one line further down.
		if !bytes.Contains(content, []byte("\uFEFF")) && !bytes.HasPrefix(content, []byte("\r")) && !bytes.HasPrefix(content, []byte("\x00")) {
			// (a leading "\r" or NUL would join the added "\n" as one line end)
			got := problems(append([]byte("# added\n"), content...))
			shifted := make([]SyntaxProblem, len(ps))
			for i, p := range ps {
				shifted[i] = p
				shifted[i].Line++
				shifted[i].EndLine++
			}
			if !sameLines(got, shifted) {
				t.Fatalf("CheckSyntax: %q has problems %v, after a comment line %v", content, ps, got)
			}
		}
		// go-systemd's parser ends lines at "\n" only (trimming a "\r"
		// before it), systemd also at a lone "\r" or a NUL (which
		// ValidateContent refuses anyway): compare where they agree.
		if ps != nil || !utf8.Valid(content) || bytes.IndexByte(content, 0) >= 0 ||
			bytes.Count(content, []byte("\r")) != bytes.Count(content, []byte("\r\n")) {
			return
		}
		opts, err := unitOptions(content)
		if err != nil {
			return
		}
		for _, o := range opts {
			if strings.HasPrefix(o.Section, "X-") {
				continue
			}
			if !contains(typeSections[unit[strings.LastIndexByte(unit, '.')+1:]], o.Section) {
				t.Fatalf("CheckSyntax accepted %q, where the parser reads section [%s]", content, o.Section)
			}
			if !strings.HasPrefix(o.Name, "X-") && !isKeyName([]byte(o.Name)) {
				t.Fatalf("CheckSyntax accepted %q, where the parser reads key %q", content, o.Name)
			}
		}
	})
}

func sameLines(a, b []SyntaxProblem) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Line != b[i].Line || a[i].EndLine != b[i].EndLine || a[i].Why != b[i].Why {
			return false
		}
	}
	return true
}
