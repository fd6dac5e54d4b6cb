package reconcile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Health probes at run time: a round of a unit's checks through the
// Prober (probeRound), where a unit's probes stand (ProbeState), which
// Health and the status read, and which probes the version a unit runs
// has (probeSpecOf). probe_spec.go is their spec; probes.go the part that
// runs the rounds.

// Prober does the I/O of the probes on the host (probe.Runner in
// production). Each method returns when its check is done or ctx ends
// (HealthTimeoutSec=, or the probe no longer counts): it must honour ctx,
// and leave nothing running behind it.
type Prober interface {
	// Command runs c.Argv without a shell, as c.User and c.Group when set,
	// with a minimal environment; nil when it exits 0.
	Command(ctx context.Context, c ProbeCommand) error
	// HTTP fetches url with GET and returns the status code of the answer
	// (redirects are not followed).
	HTTP(ctx context.Context, url string) (int, error)
	// TCP connects to addr (host:port) and closes the connection.
	TCP(ctx context.Context, addr string) error
}

// ProbeCommand is a HealthCmd= to run.
type ProbeCommand struct {
	Unit        string   // the unit probed (AGENTD_UNIT= in its environment)
	Argv        []string // SplitCommand of HealthCmd=
	User, Group string   // "" for the agent's own
}

// noProber is the Prober of an agent given none: every check fails.
type noProber struct{}

var errNoProber = errors.New("no prober configured in this agent")

func (noProber) Command(context.Context, ProbeCommand) error { return errNoProber }
func (noProber) HTTP(context.Context, string) (int, error)   { return 0, errNoProber }
func (noProber) TCP(context.Context, string) error           { return errNoProber }

// ProbeState is where a unit's probes stand since its last job (or since
// the version it runs became known): what Health and the status read.
type ProbeState struct {
	Rounds   int    // probe rounds counted (0: none yet)
	Failures int    // failed rounds in a row, up to the last
	Last     string // the last round's result: its failing check, or every check passed
}

// Passing says the last round passed.
func (s ProbeState) Passing() bool { return s.Rounds > 0 && s.Failures == 0 }

// Failing says failAfter rounds in a row failed: the unit is unhealthy.
func (s ProbeState) Failing(failAfter int) bool { return s.Failures >= failAfter }

// Text is the state for status and messages: the last result, and the
// failures in a row (counted up to failAfter, so the text stops changing
// once the unit is unhealthy). "" before the first round.
func (s ProbeState) Text(failAfter int) string {
	switch {
	case s.Rounds == 0:
		return ""
	case s.Failures == 0:
		return s.Last
	}
	n := min(s.Failures, failAfter)
	plural := "s"
	if n == 1 {
		plural = ""
	}
	return fmt.Sprintf("%s, %d failure%s in a row (HealthRetries=%d)", s.Last, n, plural, failAfter)
}

// CheckResult is one check's result in a probe round.
type CheckResult struct {
	Check ProbeCheck
	OK    bool
	Text  string // "HealthURL http://…: 500 (want 2xx)"
}

// after returns the state after a round with results (in order; the round
// stopped at its first failure).
func (s ProbeState) after(results []CheckResult) ProbeState {
	s.Rounds++
	var texts []string
	for _, r := range results {
		if !r.OK {
			s.Failures++
			s.Last = r.Text
			return s
		}
		texts = append(texts, r.Text)
	}
	s.Failures = 0
	s.Last = strings.Join(texts, "; ")
	return s
}

// checkText renders a check's result: "HealthURL http://x/: 500 (want
// 2xx)", "HealthTCP 127.0.0.1:80: connected".
func checkText(c ProbeCheck, detail string) string {
	return c.Kind.Key() + " " + c.Target + ": " + detail
}

// probeRound runs the checks of p on unit with prober, each bounded by
// HealthTimeoutSec=, and stops at the first that fails.
func probeRound(ctx context.Context, prober Prober, unit string, p Probes) []CheckResult {
	var out []CheckResult
	for _, c := range p.Checks() {
		r := runCheck(ctx, prober, unit, p, c)
		out = append(out, r)
		if !r.OK || ctx.Err() != nil {
			break
		}
	}
	return out
}

func runCheck(ctx context.Context, prober Prober, unit string, p Probes, c ProbeCheck) CheckResult {
	cctx, cancel := context.WithTimeout(ctx, p.Within())
	defer cancel()
	var err error
	detail := ""
	switch c.Kind {
	case ProbeCmd:
		cmd := ProbeCommand{Unit: unit}
		cmd.Argv, err = SplitCommand(c.Target)
		if err == nil {
			cmd.User, err = expandSpecifiers(p.User, unit)
		}
		if err == nil {
			cmd.Group, err = expandSpecifiers(p.Group, unit)
		}
		if err == nil {
			err = prober.Command(cctx, cmd)
		}
		detail = "exit 0"
	case ProbeURL:
		var code int
		code, err = prober.HTTP(cctx, c.Target)
		want := p.Status
		if want == "" {
			want = "2xx"
		}
		detail = strconv.Itoa(code)
		if err == nil && !StatusWanted(code, want) {
			err = fmt.Errorf("%d (want %s)", code, want)
		}
	case ProbeTCP:
		err = prober.TCP(cctx, c.Target)
		detail = "connected"
	}
	if err == nil {
		return CheckResult{Check: c, OK: true, Text: checkText(c, detail)}
	}
	if ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
		return CheckResult{Check: c, Text: checkText(c, fmt.Sprintf("no answer within HealthTimeoutSec=%v", p.Within()))}
	}
	return CheckResult{Check: c, Text: checkText(c, err.Error())}
}

// probeSpecOf says which probes a unit runs while it runs the version
// applied (path → hash): those of act's policy when that is the version
// act wants, else those of the version's own files (blobs; none when a
// file is missing). The key names the version ("" none).
func probeSpecOf(act Action, applied map[string]string, blobs map[string][]byte) (Probes, string) {
	key := KeyOf(applied)
	switch {
	case key == "" || IsTemplate(act.Unit): // a template never runs itself
		return Probes{}, ""
	case key == act.ContentKey:
		if act.Policy.State != StateStarted {
			return Probes{}, key
		}
		return act.Policy.Probe, key
	}
	p, ok := versionPolicy(act.Unit, applied, blobs)
	if !ok || p.State != StateStarted {
		return Probes{}, key
	}
	return p.Probe, key
}

// versionPolicy is the policy of a version of unit given by its files
// (path → hash, content in blobs), read as Desire reads the registry's:
// from the unit file, for an instance without one from its template's,
// else from the drop-ins. Only a version that mentions a Health key is
// parsed (others have no probes, and most units are those).
func versionPolicy(unit string, files map[string]string, blobs map[string][]byte) (Policy, bool) {
	var main []byte
	var dropIns [][]byte
	mentions := false
	for _, p := range slices.Sorted(maps.Keys(files)) {
		b, ok := blobs[files[p]]
		if !ok {
			return Policy{}, false
		}
		mentions = mentions || bytes.Contains(b, []byte("Health"))
		switch {
		case p == unit:
			main = b
		case main == nil && IsInstance(unit) && p == TemplateOf(unit):
			main = b
		default:
			dropIns = append(dropIns, b)
		}
	}
	if !mentions {
		return Policy{State: StateStarted}, true
	}
	src := main
	if src == nil {
		for _, b := range dropIns {
			src = append(append(src, b...), '\n')
		}
	}
	pol, err := ParsePolicy(src)
	if err != nil {
		return Policy{}, false
	}
	if pol.Probe.Cmd != "" {
		pol.Probe.User, pol.Probe.Group = serviceCreds(append([][]byte{main}, dropIns...)...)
	}
	return pol, true
}
