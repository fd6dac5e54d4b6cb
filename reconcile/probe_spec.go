// Health probes: what the agent checks of a unit beyond systemd's view —
// a service that is active (running) but answers 500 is not healthy.
//
// A unit's [X-Agentd] section names them (HealthCmd=, HealthURL=,
// HealthTCP=, with HealthURLStatus=, HealthIntervalSec=, HealthTimeoutSec=
// and HealthRetries=). This file is their spec: the keys and their checks
// (ParsePolicy calls parseProbeKey), the command line splitter and the
// status classes. probe_run.go is a round of checks and where a unit's
// probes stand (ProbeState), which Health and the status read; probes.go
// is the part that runs them; the Prober does the I/O.

package reconcile

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Probe defaults, when the unit does not set them.
const (
	DefaultProbeInterval = time.Second
	DefaultProbeTimeout  = time.Second
	DefaultProbeRetries  = 3
)

// Probes are a unit's health probes, from its [X-Agentd] section. The zero
// value has none. Comparable, as Policy is.
type Probes struct {
	Cmd string // HealthCmd=: a command line (SplitCommand); exit 0 = healthy
	URL string // HealthURL=: an http:// or https:// URL, fetched with GET
	// Status is HealthURLStatus=: the status HealthURL must answer, a code
	// ("204") or a class ("2xx"); "" is 2xx.
	Status string
	TCP    string // HealthTCP=: host:port that must accept a connection
	// Interval, Timeout and Retries are HealthIntervalSec=,
	// HealthTimeoutSec= and HealthRetries=; 0 is the default.
	Interval, Timeout time.Duration
	Retries           int
	// User and Group are the unit's [Service] User= and Group= (the last
	// of the unit file and its drop-ins), set only with Cmd: HealthCmd runs
	// as them. Specifiers %i, %n, %p and %% are expanded when it runs.
	User, Group string
}

// Any says the unit has a probe.
func (p Probes) Any() bool { return p.Cmd != "" || p.URL != "" || p.TCP != "" }

// Every is how often the probes run (HealthIntervalSec=).
func (p Probes) Every() time.Duration { return cmp0(p.Interval, DefaultProbeInterval) }

// Within is how long one probe may take (HealthTimeoutSec=).
func (p Probes) Within() time.Duration { return cmp0(p.Timeout, DefaultProbeTimeout) }

// FailAfter is how many failures in a row make the unit unhealthy
// (HealthRetries=).
func (p Probes) FailAfter() int {
	if p.Retries <= 0 {
		return DefaultProbeRetries
	}
	return p.Retries
}

func cmp0(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// ProbeKind is one kind of check.
type ProbeKind int

const (
	ProbeCmd ProbeKind = iota
	ProbeURL
	ProbeTCP
)

// Key is the [X-Agentd] key of the kind: HealthCmd, HealthURL, HealthTCP.
func (k ProbeKind) Key() string { return [...]string{"HealthCmd", "HealthURL", "HealthTCP"}[k] }

// String is the kind's short name (cmd, url, tcp): the metrics' label.
func (k ProbeKind) String() string { return [...]string{"cmd", "url", "tcp"}[k] }

// ProbeCheck is one check of a unit's probes.
type ProbeCheck struct {
	Kind   ProbeKind
	Target string // the command line, URL or host:port
}

// Checks are the unit's checks in the order they run: HealthCmd,
// HealthURL, HealthTCP. A probe round runs them one after another and
// stops at the first that fails.
func (p Probes) Checks() []ProbeCheck {
	var out []ProbeCheck
	for _, c := range []ProbeCheck{{ProbeCmd, p.Cmd}, {ProbeURL, p.URL}, {ProbeTCP, p.TCP}} {
		if c.Target != "" {
			out = append(out, c)
		}
	}
	return out
}

// parseProbeKey reads one Health* key of [X-Agentd] into p. It returns
// false for a key that is not a probe key.
func parseProbeKey(p *Probes, key, val string) (known bool, err error) {
	switch key {
	case "HealthCmd":
		p.Cmd = val
		if val != "" {
			_, err = SplitCommand(val)
		}
	case "HealthURL":
		p.URL = val
		if val != "" {
			err = checkProbeURL(val)
		}
	case "HealthURLStatus":
		p.Status = val
		if val != "" && !validStatus(val) {
			err = fmt.Errorf("want a status code such as 200 or a class such as 2xx")
		}
	case "HealthTCP":
		p.TCP = val
		if val != "" {
			err = checkProbeAddr(val)
		}
	case "HealthIntervalSec":
		p.Interval, err = parseProbeSpan(val)
	case "HealthTimeoutSec":
		p.Timeout, err = parseProbeSpan(val)
	case "HealthRetries":
		p.Retries, err = strconv.Atoi(val)
		if err != nil || p.Retries < 1 {
			err = fmt.Errorf("want an integer ≥ 1 (failures in a row before the unit is unhealthy)")
		}
	default:
		return false, nil
	}
	if err != nil {
		return true, fmt.Errorf("bad %s=%s: %w", key, val, err)
	}
	return true, nil
}

// probeKeys names the probe keys, for the error of an unknown Health* key.
const probeKeys = "HealthCmd, HealthURL, HealthURLStatus, HealthTCP, HealthIntervalSec, HealthTimeoutSec, HealthRetries"

// checkProbes checks the probe keys together, once all are read.
func checkProbes(p Probes, state RunState) []string {
	var errs []string
	if !p.Any() {
		for _, k := range []struct {
			set  bool
			name string
		}{{p.Interval != 0, "HealthIntervalSec"}, {p.Timeout != 0, "HealthTimeoutSec"}, {p.Retries != 0, "HealthRetries"}} {
			if k.set {
				errs = append(errs, k.name+"= is set but there is no probe to time (HealthCmd=, HealthURL= or HealthTCP=)")
			}
		}
	} else if state != StateStarted {
		errs = append(errs, "health probes need State=started: a unit the agent does not keep running is never probed")
	}
	if p.Status != "" && p.URL == "" {
		errs = append(errs, "HealthURLStatus= without HealthURL=")
	}
	return errs
}

// parseProbeSpan reads HealthIntervalSec= and HealthTimeoutSec=: a time
// span as systemd reads one, finite and not 0.
func parseProbeSpan(val string) (time.Duration, error) {
	d, err := ParseTimespan(val)
	switch {
	case errors.Is(err, ErrInfinity):
		return 0, errors.New("want a finite time span such as 1s or 500ms")
	case err != nil:
		return 0, fmt.Errorf("want a time span such as 1s, 500ms or 2 (seconds) (systemd.time(7)): %w", err)
	case d <= 0:
		return 0, errors.New("want a time span above 0")
	}
	return d, nil
}

func checkProbeURL(val string) error {
	u, err := url.Parse(val)
	switch {
	case err != nil:
		return fmt.Errorf("not a URL: %w", err)
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("want an http:// or https:// URL")
	case u.Host == "":
		return errors.New("the URL has no host")
	}
	return nil
}

func checkProbeAddr(val string) error {
	_, port, err := net.SplitHostPort(val)
	if err != nil {
		return errors.New("want host:port, such as 127.0.0.1:8080 or [::1]:8080")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return errors.New("want a port number from 1 to 65535")
	}
	return nil
}

// validStatus says s is a status code (100–599) or class (1xx–5xx).
func validStatus(s string) bool {
	if len(s) != 3 || s[0] < '1' || s[0] > '5' {
		return false
	}
	if strings.EqualFold(s[1:], "xx") {
		return true
	}
	return s[1] >= '0' && s[1] <= '9' && s[2] >= '0' && s[2] <= '9'
}

// StatusWanted says an HTTP status code is what HealthURLStatus= wants
// ("" is 2xx).
func StatusWanted(code int, want string) bool {
	if want == "" {
		want = "2xx"
	}
	if strings.EqualFold(want[1:], "xx") {
		return code/100 == int(want[0]-'0')
	}
	return strconv.Itoa(code) == want
}

// SplitCommand splits a HealthCmd= command line into words the way
// systemd splits ExecStart= (without its prefixes, specifiers and
// variables): words are separated by blanks; "double" and 'single' quotes
// group words; a backslash escapes the next character (\n, \t as in C).
// There is no shell: pipes, redirections and $VARIABLES are not
// interpreted (use /bin/sh -c '…' for those). The program is an absolute
// path or a name looked up in a fixed PATH.
func SplitCommand(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	quote := byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			if i+1 >= len(s) {
				return nil, errors.New("the command line ends with a backslash")
			}
			i++
			switch s[i] {
			case 'n':
				cur.WriteByte('\n')
			case 't':
				cur.WriteByte('\t')
			default:
				cur.WriteByte(s[i])
			}
			inWord = true
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			cur.WriteByte(c)
		case c == '"' || c == '\'':
			quote, inWord = c, true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if inWord {
		words = append(words, cur.String())
	}
	if len(words) == 0 {
		return nil, errors.New("empty command line")
	}
	if p := words[0]; strings.Contains(p, "/") && !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("the program %q must be an absolute path or a name found in PATH", p)
	}
	return words, nil
}

// expandSpecifiers expands the unit specifiers systemd allows in User= and
// Group= that the agent knows of unit: %i (the instance), %n (the unit
// name), %p (the prefix) and %%. Another specifier is an error: the agent
// cannot know what systemd would make of it.
func expandSpecifiers(s, unit string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	name, _, _ := strings.Cut(unit[:strings.LastIndexByte(unit, '.')+1], ".")
	prefix, inst, _ := strings.Cut(name, "@")
	inst = strings.TrimSuffix(inst, ".")
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 >= len(s) {
			return "", fmt.Errorf("%q ends with %%", s)
		}
		i++
		switch s[i] {
		case 'i':
			b.WriteString(inst)
		case 'n':
			b.WriteString(unit)
		case 'p':
			b.WriteString(prefix)
		case '%':
			b.WriteByte('%')
		default:
			return "", fmt.Errorf("%q: the agent does not expand the specifier %%%c (only %%i, %%n, %%p and %%%%)", s, s[i])
		}
	}
	return b.String(), nil
}

// serviceCreds returns the last [Service] User= and Group= of the files, in
// the order systemd reads them (unit file, then drop-ins by name): whom a
// HealthCmd= runs as.
func serviceCreds(files ...[]byte) (user, group string) {
	for _, f := range files {
		for _, e := range iniEntries(f) {
			if e.sec != "Service" {
				continue
			}
			switch e.key {
			case "User":
				user = e.val
			case "Group":
				group = e.val
			}
		}
	}
	return user, group
}
