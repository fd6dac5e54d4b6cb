package sshsig

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// AllowedSigners is a parsed allowed_signers file: who may sign, for which
// namespaces, when. Safe for concurrent use (it is never modified).
type AllowedSigners struct {
	Path    string
	Entries []AllowedSigner
}

// AllowedSigner is one line of an allowed_signers file:
//
//	principals [options] keytype base64-key [comment]
//
// Options: namespaces="pattern,…", valid-after="time", valid-before="time"
// (YYYYMMDD[HHMM[SS]], with a trailing Z for UTC, else local time).
// cert-authority is refused: agentd verifies plain keys, not certificates.
type AllowedSigner struct {
	Line        int
	Principals  string // as written: a comma-separated list of patterns
	Key         ssh.PublicKey
	Namespaces  string    // "" when the line has no namespaces= option (any namespace)
	ValidAfter  time.Time // zero: no bound
	ValidBefore time.Time
}

// Signer is who made a verified signature: the key's fingerprint and the
// principals of the allowed_signers line that let it in.
type Signer struct {
	Fingerprint string
	Principals  string
	Line        int
}

var (
	// ErrUnknownKey: no line of the allowed signers holds the signing key.
	ErrUnknownKey = errors.New("not an allowed signer")
	// ErrNotAllowed: the key is there, but not for this namespace or not
	// at this time.
	ErrNotAllowed = errors.New("signing key not allowed")
)

// LoadAllowedSigners reads and parses the allowed_signers file at path.
// The error names the file and, for a malformed line, its number.
func LoadAllowedSigners(path string) (*AllowedSigners, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("allowed signers: %w", err)
	}
	return ParseAllowedSigners(path, bytes.NewReader(b))
}

// ParseAllowedSigners parses an allowed_signers file (name is for
// errors). Blank lines and lines starting with # are skipped; any other
// line that does not parse is an error naming name:line. A file with no
// signer at all is an error too: it would refuse every change.
func ParseAllowedSigners(name string, r io.Reader) (*AllowedSigners, error) {
	as := &AllowedSigners{Path: name}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		e, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("allowed signers %s:%d: %w", name, n, err)
		}
		e.Line = n
		as.Entries = append(as.Entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("allowed signers %s:%d: %w", name, n+1, err)
	}
	if len(as.Entries) == 0 {
		return nil, fmt.Errorf("allowed signers %s: no signer in the file (every change would be refused)", name)
	}
	return as, nil
}

func parseLine(line string) (AllowedSigner, error) {
	var e AllowedSigner
	// The principals: one field, which may be quoted ("a b,c").
	var rest string
	if line[0] == '"' {
		end := strings.IndexByte(line[1:], '"')
		if end < 0 {
			return e, errors.New("unterminated quoted principals")
		}
		e.Principals, rest = line[1:1+end], line[2+end:]
	} else {
		i := strings.IndexAny(line, " \t")
		if i < 0 {
			return e, errors.New("want: principals [options] keytype base64-key; found only one field")
		}
		e.Principals, rest = line[:i], line[i:]
	}
	if e.Principals == "" {
		return e, errors.New("empty principals")
	}
	rest = strings.TrimSpace(rest)
	if rest == "" {
		return e, errors.New("missing key after the principals")
	}
	key, _, options, _, err := ssh.ParseAuthorizedKey([]byte(rest))
	if err != nil {
		return e, fmt.Errorf("invalid key or options: %v", err)
	}
	e.Key = key
	for _, o := range options {
		name, val, hasVal := strings.Cut(o, "=")
		name = strings.ToLower(name)
		if hasVal {
			if len(val) < 2 || val[0] != '"' || val[len(val)-1] != '"' {
				return e, fmt.Errorf("option %s: value must be quoted", name)
			}
			val = val[1 : len(val)-1]
		}
		switch name {
		case "namespaces":
			if !hasVal || val == "" {
				return e, errors.New(`option namespaces: want namespaces="pattern,…"`)
			}
			e.Namespaces = val
		case "valid-after", "valid-before":
			t, err := parseTime(val)
			if err != nil {
				return e, fmt.Errorf("option %s: %w", name, err)
			}
			if name == "valid-after" {
				e.ValidAfter = t
			} else {
				e.ValidBefore = t
			}
		case "cert-authority":
			return e, errors.New("cert-authority: signatures by certificates are not supported; list the signers' keys")
		default:
			return e, fmt.Errorf("unsupported option %q", name)
		}
	}
	return e, nil
}

// parseTime reads ssh-keygen's YYYYMMDD[HHMM[SS]][Z].
func parseTime(s string) (time.Time, error) {
	loc := time.Local
	if t, ok := strings.CutSuffix(s, "Z"); ok {
		s, loc = t, time.UTC
	}
	var layout string
	switch len(s) {
	case 8:
		layout = "20060102"
	case 12:
		layout = "200601021504"
	case 14:
		layout = "20060102150405"
	default:
		return time.Time{}, fmt.Errorf("time %q: want YYYYMMDD[HHMM[SS]][Z]", s)
	}
	t, err := time.ParseInLocation(layout, s, loc)
	if err != nil {
		return time.Time{}, fmt.Errorf("time %q: %v", s, err)
	}
	return t, nil
}

// Verify checks an armored signature over msg in namespace, made by an
// allowed signer at now (valid-after/valid-before): the signer, or an
// error wrapping ErrMalformed, ErrNamespace, ErrUnknownKey, ErrNotAllowed
// or ErrInvalid. The signer is returned with ErrNotAllowed and ErrInvalid
// too (a known key, a bad signature), and with ErrUnknownKey its
// fingerprint, so that a refusal can name the key.
func (as *AllowedSigners) Verify(armored []byte, namespace string, msg []byte, now time.Time) (Signer, error) {
	sig, err := Parse(armored)
	if err != nil {
		return Signer{}, err
	}
	who := Signer{Fingerprint: Fingerprint(sig.PublicKey)}
	if sig.Namespace != namespace {
		return who, fmt.Errorf("%w: %q, not %q", ErrNamespace, sig.Namespace, namespace)
	}
	want := sig.PublicKey.Marshal()
	var why error
	for _, e := range as.Entries {
		if !bytes.Equal(e.Key.Marshal(), want) {
			continue
		}
		who.Principals, who.Line = e.Principals, e.Line
		switch {
		case e.Namespaces != "" && !matchList(namespace, e.Namespaces):
			why = fmt.Errorf("%w: %s:%d allows namespaces %q, not %q", ErrNotAllowed, as.Path, e.Line, e.Namespaces, namespace)
			continue
		case !e.ValidAfter.IsZero() && now.Before(e.ValidAfter):
			why = fmt.Errorf("%w: %s:%d is valid only after %s", ErrNotAllowed, as.Path, e.Line, e.ValidAfter.Format(time.RFC3339))
			continue
		case !e.ValidBefore.IsZero() && !now.Before(e.ValidBefore):
			why = fmt.Errorf("%w: %s:%d expired at %s", ErrNotAllowed, as.Path, e.Line, e.ValidBefore.Format(time.RFC3339))
			continue
		}
		return who, sig.Verify(namespace, msg)
	}
	if why != nil {
		return who, why
	}
	return who, fmt.Errorf("%w (no line of %s holds the key)", ErrUnknownKey, as.Path)
}

// matchList matches s against a comma-separated list of patterns (*, ?;
// a leading ! negates), as OpenSSH's match_pattern_list: a negated match
// refuses, else any positive match accepts.
func matchList(s, list string) bool {
	ok := false
	for p := range strings.SplitSeq(list, ",") {
		neg := strings.HasPrefix(p, "!")
		if neg {
			p = p[1:]
		}
		if match(s, p) {
			if neg {
				return false
			}
			ok = true
		}
	}
	return ok
}

// match is OpenSSH's match_pattern: * any run, ? any one character.
func match(s, p string) bool {
	for len(p) > 0 {
		switch p[0] {
		case '*':
			for len(p) > 0 && p[0] == '*' {
				p = p[1:]
			}
			if p == "" {
				return true
			}
			for i := 0; i <= len(s); i++ {
				if match(s[i:], p) {
					return true
				}
			}
			return false
		case '?':
			if s == "" {
				return false
			}
		default:
			if s == "" || s[0] != p[0] {
				return false
			}
		}
		s, p = s[1:], p[1:]
	}
	return s == ""
}
