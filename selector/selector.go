package selector

import (
	"fmt"
	"slices"
	"strings"
)

// Op is a requirement's operator.
type Op int

// The operators, in the order String sorts requirements of one key by.
const (
	In           Op = iota // k=v, k==v, k in (a,b)
	NotIn                  // k!=v, k notin (a,b)
	Exists                 // k
	DoesNotExist           // !k
)

func (o Op) String() string {
	switch o {
	case In:
		return "in"
	case NotIn:
		return "notin"
	case Exists:
		return "exists"
	case DoesNotExist:
		return "!"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Requirement is one comma-separated part of a selector.
type Requirement struct {
	Key string
	Op  Op
	// Values are sorted and distinct; none for Exists and DoesNotExist.
	// "=" is In with one value, "!=" NotIn with one.
	Values []string
}

// Matches says whether labels meet r. As in Kubernetes, a host without
// the key meets NotIn ("env!=prod" holds for a host with no env label).
func (r Requirement) Matches(labels map[string]string) bool {
	v, ok := labels[r.Key]
	switch r.Op {
	case In:
		return ok && slices.Contains(r.Values, v)
	case NotIn:
		return !ok || !slices.Contains(r.Values, v)
	case Exists:
		return ok
	default:
		return !ok
	}
}

// String is r's canonical form: "k=v", "k!=v", "k in (a,b)", "k notin
// (a,b)", "k", "!k".
func (r Requirement) String() string {
	switch {
	case r.Op == Exists:
		return r.Key
	case r.Op == DoesNotExist:
		return "!" + r.Key
	case len(r.Values) == 1 && r.Op == In:
		return r.Key + "=" + r.Values[0]
	case len(r.Values) == 1:
		return r.Key + "!=" + r.Values[0]
	}
	return r.Key + " " + r.Op.String() + " (" + strings.Join(r.Values, ",") + ")"
}

// Selector is a parsed label selector: the conjunction of its
// requirements. The zero Selector (Parse("")) matches every host.
type Selector struct {
	reqs []Requirement // sorted by key, operator, values; distinct
}

// Requirements returns a copy of s's requirements, in canonical order.
func (s Selector) Requirements() []Requirement { return slices.Clone(s.reqs) }

// Empty says s has no requirement: it matches every host.
func (s Selector) Empty() bool { return len(s.reqs) == 0 }

// Matches says whether labels meet every requirement of s.
func (s Selector) Matches(labels map[string]string) bool {
	for _, r := range s.reqs {
		if !r.Matches(labels) {
			return false
		}
	}
	return true
}

// String is s's canonical form: its requirements sorted by key (then
// operator, then values), each value list sorted and without repeats, no
// spaces but around in and notin. Two spellings of one selector have the
// same String, and String parses back to it.
func (s Selector) String() string {
	parts := make([]string, len(s.reqs))
	for i, r := range s.reqs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// SyntaxError is a selector Parse refused: Text, at byte Pos (1-based) of
// the selector, is where it went wrong.
type SyntaxError struct {
	Pos  int
	Text string // the offending token; "" at the end of the selector
	Msg  string
}

func (e *SyntaxError) Error() string {
	if e.Text == "" {
		return fmt.Sprintf("at %d (the end): %s", e.Pos, e.Msg)
	}
	return fmt.Sprintf("at %d, %q: %s", e.Pos, e.Text, e.Msg)
}

// Parse reads a selector in Kubernetes' label selector syntax:
// comma-separated requirements, all of which must hold —
//
//	k=v  k==v      the label k is v
//	k!=v           k is not v, or the host has no label k
//	k in (a,b)     k is a or b
//	k notin (a,b)  k is neither, or the host has no label k
//	k              the host has a label k
//	!k             the host has no label k
//
// Whitespace between tokens is ignored. Keys and values must be valid
// labels (ValidateKey, ValidateValue); a value may be empty ("k=", "k in
// (a,)"). The empty selector matches every host. An error is a
// *SyntaxError.
func Parse(s string) (Selector, error) {
	p := parser{lx: lexer{s: s}}
	var reqs []Requirement
	if p.peek().kind == tEOF {
		return Selector{}, nil
	}
	for {
		r, err := p.requirement()
		if err != nil {
			return Selector{}, err
		}
		reqs = append(reqs, r)
		switch t := p.next(); t.kind {
		case tEOF:
			return Selector{reqs: canonical(reqs)}, nil
		case tComma:
			if p.peek().kind == tEOF {
				return Selector{}, p.errAt(p.peek(), "want a requirement after \",\"")
			}
		default:
			return Selector{}, p.errAt(t, "want \",\" or the end after a requirement")
		}
	}
}

// canonical sorts reqs and drops repeats.
func canonical(reqs []Requirement) []Requirement {
	slices.SortFunc(reqs, func(a, b Requirement) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		if a.Op != b.Op {
			return int(a.Op) - int(b.Op)
		}
		return slices.Compare(a.Values, b.Values)
	})
	return slices.CompactFunc(reqs, func(a, b Requirement) bool {
		return a.Key == b.Key && a.Op == b.Op && slices.Equal(a.Values, b.Values)
	})
}

type parser struct {
	lx     lexer
	peeked *token
}

func (p *parser) next() token {
	if p.peeked != nil {
		t := *p.peeked
		p.peeked = nil
		return t
	}
	return p.lx.next()
}

func (p *parser) peek() token {
	if p.peeked == nil {
		t := p.lx.next()
		p.peeked = &t
	}
	return *p.peeked
}

func (p *parser) errAt(t token, format string, args ...any) error {
	return &SyntaxError{Pos: t.pos + 1, Text: t.text, Msg: fmt.Sprintf(format, args...)}
}

// requirement reads one requirement.
func (p *parser) requirement() (Requirement, error) {
	t := p.next()
	if t.kind == tBang {
		k, err := p.key(p.next())
		return Requirement{Key: k, Op: DoesNotExist}, err
	}
	key, err := p.key(t)
	if err != nil {
		return Requirement{}, err
	}
	op := p.peek()
	switch {
	case op.kind == tComma || op.kind == tEOF:
		return Requirement{Key: key, Op: Exists}, nil
	case op.kind == tEq || op.kind == tEqEq || op.kind == tNotEq:
		p.next()
		v, err := p.exactValue()
		if err != nil {
			return Requirement{}, err
		}
		r := Requirement{Key: key, Op: In, Values: []string{v}}
		if op.kind == tNotEq {
			r.Op = NotIn
		}
		return r, nil
	case op.kind == tIdent && (op.text == "in" || op.text == "notin"):
		p.next()
		vs, err := p.valueSet(op.text)
		if err != nil {
			return Requirement{}, err
		}
		r := Requirement{Key: key, Op: In, Values: vs}
		if op.text == "notin" {
			r.Op = NotIn
		}
		return r, nil
	}
	return Requirement{}, p.errAt(op, "want =, ==, !=, in, notin, \",\" or the end after the key %q", key)
}

// key reads a label key from t.
func (p *parser) key(t token) (string, error) {
	if t.kind != tIdent {
		return "", p.errAt(t, "want a label key")
	}
	if err := ValidateKey(t.text); err != nil {
		return "", p.errAt(t, "%v", err)
	}
	return t.text, nil
}

// exactValue reads the value after =, == or !=: a label value, or nothing
// (the empty value) before "," or the end.
func (p *parser) exactValue() (string, error) {
	t := p.peek()
	switch t.kind {
	case tComma, tEOF:
		return "", nil
	case tIdent:
		p.next()
		if err := ValidateValue(t.text); err != nil {
			return "", p.errAt(t, "%v", err)
		}
		return t.text, nil
	}
	return "", p.errAt(t, "want a label value")
}

// valueSet reads "(a,b,…)" after in or notin: sorted, without repeats. An
// empty element is the empty value.
func (p *parser) valueSet(op string) ([]string, error) {
	if t := p.next(); t.kind != tOpen {
		return nil, p.errAt(t, "want \"(\" after %s", op)
	}
	var vs []string
	for {
		v := ""
		t := p.next()
		if t.kind == tIdent {
			if err := ValidateValue(t.text); err != nil {
				return nil, p.errAt(t, "%v", err)
			}
			v, t = t.text, p.next()
		}
		vs = append(vs, v)
		switch t.kind {
		case tComma:
			continue
		case tClose:
			slices.Sort(vs)
			return slices.Compact(vs), nil
		}
		return nil, p.errAt(t, "want a label value, \",\" or \")\" in the values of %s", op)
	}
}

type tokenKind int

const (
	tEOF   tokenKind = iota
	tIdent           // a run of characters that are neither space nor one of !=,()
	tBang            // !
	tEq              // =
	tEqEq            // ==
	tNotEq           // !=
	tComma           // ,
	tOpen            // (
	tClose           // )
)

type token struct {
	kind tokenKind
	text string
	pos  int // byte offset in the selector
}

type lexer struct {
	s   string
	pos int
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isSpecial(c byte) bool { return c == '!' || c == '=' || c == ',' || c == '(' || c == ')' }

func (l *lexer) next() token {
	for l.pos < len(l.s) && isSpace(l.s[l.pos]) {
		l.pos++
	}
	start := l.pos
	if start == len(l.s) {
		return token{kind: tEOF, pos: start}
	}
	emit := func(k tokenKind, n int) token {
		l.pos += n
		return token{kind: k, text: l.s[start:l.pos], pos: start}
	}
	two := l.s[start:min(start+2, len(l.s))]
	switch {
	case two == "==":
		return emit(tEqEq, 2)
	case two == "!=":
		return emit(tNotEq, 2)
	}
	switch l.s[start] {
	case '!':
		return emit(tBang, 1)
	case '=':
		return emit(tEq, 1)
	case ',':
		return emit(tComma, 1)
	case '(':
		return emit(tOpen, 1)
	case ')':
		return emit(tClose, 1)
	}
	n := 0
	for start+n < len(l.s) && !isSpace(l.s[start+n]) && !isSpecial(l.s[start+n]) {
		n++
	}
	return emit(tIdent, n)
}
