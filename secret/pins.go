package secret

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
)

// PinState is what Pins.Check found for a host.
type PinState int

const (
	// PinNew: no recipient pinned for the host yet.
	PinNew PinState = iota
	// PinSame: the host's pinned recipient is this one.
	PinSame
	// PinChanged: the host has another recipient pinned: a reinstalled
	// host, or someone answering for it.
	PinChanged
)

func (s PinState) String() string {
	switch s {
	case PinNew:
		return "new"
	case PinSame:
		return "same"
	case PinChanged:
		return "changed"
	}
	return fmt.Sprintf("PinState(%d)", int(s))
}

// Pins is the CLI's record of each host's recipient, trusted on first use
// as ssh's known_hosts is: the recipient a host publishes in the registry
// is pinned the first time a secret is encrypted to it, and a different
// one later is reported (PinChanged) rather than silently used, since
// whoever can write the registry could otherwise publish their own key and
// read the next secret. The file holds one "host recipient" per line; "#"
// comments and blank lines are allowed, and Save rewrites the file sorted,
// without them. Not safe for concurrent use.
type Pins struct {
	path string
	pins map[string]string // host → canonical recipient
}

// DefaultPinsPath is $XDG_CONFIG_HOME/agentd/known_recipients, or
// ~/.config/agentd/known_recipients when XDG_CONFIG_HOME is unset.
func DefaultPinsPath() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("pins: %w", err)
	}
	return filepath.Join(dir, "agentd", "known_recipients"), nil
}

// LoadPins reads the pins file at path; a missing file is no pins yet. A
// line that does not parse is an error naming it: skipping it would make
// its host look new and accept any recipient.
func LoadPins(path string) (*Pins, error) {
	p := &Pins{path: path, pins: map[string]string{}}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return p, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pins: %w", err)
	}
	defer f.Close()
	p.pins, err = parseHostLines(f, path)
	if err != nil {
		return nil, fmt.Errorf("pins: %w", err)
	}
	return p, nil
}

// Path is the file the pins were loaded from and Save writes.
func (p *Pins) Path() string { return p.path }

// Check compares recipient with the one pinned for host. With PinChanged it
// also returns the pinned recipient, for the message to the operator.
// Recipients compare in canonical form (an SSH key's comment is ignored).
func (p *Pins) Check(host, recipient string) (PinState, string) {
	pinned, ok := p.pins[host]
	switch {
	case !ok:
		return PinNew, ""
	case pinned == canonical(recipient):
		return PinSame, pinned
	default:
		return PinChanged, pinned
	}
}

// Pin records recipient for host, replacing any pinned before (after the
// operator accepted a change). It is kept in memory until Save. A host
// that could not be written back as one field, or a recipient
// ParseRecipient refuses, is an error.
func (p *Pins) Pin(host, recipient string) error {
	if err := checkHost(host); err != nil {
		return fmt.Errorf("pin: %w", err)
	}
	_, canon, err := parseRecipient(recipient)
	if err != nil {
		return fmt.Errorf("pin %s: %w", host, err)
	}
	p.pins[host] = canon
	return nil
}

// Save writes the pins atomically, mode 0600, creating the directory (mode
// 0700) if needed.
func (p *Pins) Save() error {
	var b bytes.Buffer
	b.WriteString("# agentd: each host's secret recipient, pinned on first use.\n")
	b.WriteString("# One \"host recipient\" per line. Remove a line to accept a host's new recipient.\n")
	hosts := make([]string, 0, len(p.pins))
	for h := range p.pins {
		hosts = append(hosts, h)
	}
	slices.Sort(hosts)
	for _, h := range hosts {
		fmt.Fprintf(&b, "%s %s\n", h, p.pins[h])
	}
	if err := os.MkdirAll(filepath.Dir(p.path), 0o700); err != nil {
		return fmt.Errorf("pins: %w", err)
	}
	if err := writeAtomic(p.path, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("pins: %w", err)
	}
	return nil
}

// LoadRecipientsFile reads an operator-kept file of hosts' recipients (the
// CLI's --recipients FILE, used instead of what hosts publish): one "host
// recipient" per line, "#" comments and blank lines allowed. It returns
// host → canonical recipient. A line that does not parse, or a host given
// two different recipients, is an error naming the line.
func LoadRecipientsFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("recipients file: %w", err)
	}
	defer f.Close()
	m, err := parseHostLines(f, path)
	if err != nil {
		return nil, fmt.Errorf("recipients file: %w", err)
	}
	return m, nil
}

// parseHostLines parses "host recipient" lines; name (the file's path)
// prefixes errors as name:line.
func parseHostLines(r io.Reader, name string) (map[string]string, error) {
	m := map[string]string{}
	lineOf := map[string]int{}
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		host, rest := line, ""
		if i := strings.IndexFunc(line, unicode.IsSpace); i >= 0 {
			host, rest = line[:i], line[i:]
		}
		if err := checkHost(host); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		if strings.TrimSpace(rest) == "" {
			return nil, fmt.Errorf("%s:%d: host %s has no recipient: want \"host recipient\"", name, n, host)
		}
		_, canon, err := parseRecipient(rest)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		if prev, ok := m[host]; ok && prev != canon {
			return nil, fmt.Errorf("%s:%d: host %s has another recipient on line %d", name, n, host, lineOf[host])
		}
		m[host] = canon
		lineOf[host] = n
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", name, n+1, err)
	}
	return m, nil
}

// checkHost accepts a host name that fits in the first field of a line.
func checkHost(host string) error {
	if host == "" {
		return errors.New("empty host name")
	}
	if strings.HasPrefix(host, "#") || strings.IndexFunc(host, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}) >= 0 {
		return fmt.Errorf("host name %q: must not start with # nor hold spaces or control characters", host)
	}
	return nil
}

// canonical is recipient's canonical text, or recipient trimmed when it
// does not parse (it then matches no pin).
func canonical(recipient string) string {
	if _, canon, err := parseRecipient(recipient); err == nil {
		return canon
	}
	return strings.TrimSpace(recipient)
}
