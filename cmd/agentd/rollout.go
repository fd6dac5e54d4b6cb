package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
)

// Rollouts from the CLI: the strategy flags of `unit put`, `unit rm` and
// `unit revert` (a group write then starts a rollout, rollout.Record,
// written with the change in one transaction), `--wait` following it (and running --gate-cmd between
// waves), and `agentd rollout ls|status|pause|resume|promote|abort`. The
// CLI never moves a host: the agents do, from the record; the CLI reads
// the phase every reader computes alike and writes only control fields.

// strategyFlags are the rollout options of `unit put`, `unit rm` and
// `unit revert`: one set of flags, checked alike, and one way to stage
// the command's write as a rollout (stage) and follow it (followPut).
type strategyFlags struct {
	canary, waves, maxUnavailable string
	soak, progressDeadline        time.Duration
	pauseAfterCanary, autoRevert  bool
	maxRestarts                   int
	gateCmd, gateURL, gateProm    string
	promURL                       string
	gateTimeout                   time.Duration
	supersede                     bool
	reason                        string

	// name is the command ("unit put") and nothing what its refusals
	// say was written ("nothing stored"), for the errors.
	name, nothing string
	// s is the strategy the flags say, once checked: a rollout when
	// s.IsRollout().
	s rollout.Strategy
}

func (f *strategyFlags) bind(cmd *cobra.Command, name, nothing string) {
	f.name, f.nothing = name, nothing
	fs := cmd.Flags()
	fs.StringVar(&f.canary, "canary", "", "rollout: `N|N%` of the group's hosts take the change first, alone (the canary)")
	fs.StringVar(&f.waves, "waves", "", "rollout: cumulative `WAVES` after the canary, e.g. 1,10%,100% (how many hosts have the change after each)")
	fs.StringVar(&f.maxUnavailable, "max-unavailable", "", "rollout: at most `N|N%` hosts taking the change at once")
	fs.DurationVar(&f.soak, "soak", 0, "rollout: each host stays healthy for `DUR` before it counts")
	fs.DurationVar(&f.progressDeadline, "progress-deadline", 0, "rollout: it fails when no host became healthy for `DUR` (0: never)")
	fs.BoolVar(&f.pauseAfterCanary, "pause-after-canary", false, "rollout: once the canary is healthy, wait for \"agentd rollout promote ID\"")
	fs.BoolVar(&f.autoRevert, "auto-revert", false, "rollout: when it fails, the hosts that took the change go back to the previous version")
	fs.IntVar(&f.maxRestarts, "max-restarts", -1, "rollout: pause it when a host's unit restarted more than `N` times since it took the change (-1: off)")
	fs.StringVar(&f.gateCmd, "gate-cmd", "", "rollout, with --wait: run `CMD` (sh -c, with AGENTD_ROLLOUT, AGENTD_GROUP, AGENTD_WAVE counted from 1) before each wave after the first; the wave opens when it exits 0, else the rollout pauses")
	fs.DurationVar(&f.gateTimeout, "gate-timeout", rollout.DefaultGateTimeout, "rollout: a gate that runs longer than `DUR` fails (its processes killed) and the rollout pauses")
	fs.StringVar(&f.gateURL, "gate-url", "", "rollout: the coordinator GETs `URL` before each wave after the first; the wave opens on 2xx, else the rollout pauses (no command has to follow it)")
	fs.StringVar(&f.gateProm, "gate-prom", "", "rollout: the coordinator asks --prom-url for the PromQL `EXPR` before each wave after the first; the wave opens when it holds (a non-empty result), else the rollout pauses")
	fs.StringVar(&f.promURL, "prom-url", "", "rollout: the Prometheus `URL` --gate-prom asks (its /api/v1/query)")
	fs.BoolVar(&f.supersede, "supersede", false, "rollout: end a running rollout of the same keys (as superseded) instead of refusing")
	fs.StringVar(&f.reason, "reason", "", reasonHelp)
}

// check checks --reason (reasonFlag), parses the flags into f.s and refuses, as usage errors (exit 2,
// before anything is read or written), any bad value and the options
// where they cannot apply: to one host, --gate-cmd without --wait
// (nothing would run it), --supersede without a rollout,
// --skip-unreachable with a rollout.
func (f *strategyFlags) check(cmd *cobra.Command, tg registry.Target, wait bool, wf waitFlags, dryRun bool) error {
	if _, err := reasonFlag(cmd); err != nil {
		return err
	}
	s, err := f.strategy()
	if err != nil {
		return err
	}
	f.s = s
	if !s.IsRollout() {
		if f.supersede {
			return withCode(exitUsage, fmt.Errorf("%s: --supersede goes with a rollout (--canary, --waves, --max-unavailable, --soak, …); %s", f.name, f.nothing))
		}
		return nil
	}
	switch {
	case tg.Group == "":
		return withCode(exitUsage, fmt.Errorf("%s: the rollout options stage a change across a group's hosts; %s is one host (use --group G, or drop them); %s", f.name, tg, f.nothing))
	case s.GateCmd != "" && !wait && !dryRun:
		follow := "add --wait"
		if cmd.Flags().Lookup("no-wait") != nil { // unit edit waits unless --no-wait
			follow = "drop --no-wait"
		}
		return withCode(exitUsage, fmt.Errorf("%s: --gate-cmd is run by this command while it follows the rollout: %s; %s", f.name, follow, f.nothing))
	case wait && wf.skipUnreachable:
		return withCode(exitUsage, fmt.Errorf("%s: --skip-unreachable does not apply to a rollout (a member without a live agent holds its wave; `agentd hosts forget H` retires it first); %s", f.name, f.nothing))
	}
	return nil
}

// strategy parses the flags into a validated strategy; any bad value is a
// usage error (exit 2) and nothing is written.
func (f *strategyFlags) strategy() (rollout.Strategy, error) {
	s := rollout.Strategy{
		Soak: f.soak, ProgressDeadline: f.progressDeadline,
		PauseAfterCanary: f.pauseAfterCanary, AutoRevert: f.autoRevert,
		MaxRestarts: f.maxRestarts, GateCmd: strings.TrimSpace(f.gateCmd),
		GateURL: strings.TrimSpace(f.gateURL), GateProm: strings.TrimSpace(f.gateProm), PromURL: strings.TrimSpace(f.promURL),
	}
	if f.gateTimeout != rollout.DefaultGateTimeout {
		s.GateTimeout = f.gateTimeout
	}
	var errs []error
	count := func(flag, v string, into *rollout.Count) {
		if v == "" {
			return
		}
		c, err := rollout.ParseCount(flag, v)
		if err != nil {
			errs = append(errs, err)
			return
		}
		*into = c
	}
	count("--canary", f.canary, &s.Canary)
	count("--max-unavailable", f.maxUnavailable, &s.MaxUnavailable)
	if f.waves != "" {
		for part := range strings.SplitSeq(f.waves, ",") {
			c, err := rollout.ParseCount("--waves", part)
			if err != nil {
				errs = append(errs, fmt.Errorf("%w (in --waves %s)", err, f.waves))
				continue
			}
			s.Waves = append(s.Waves, c)
		}
	}
	if f.gateTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--gate-timeout %s: want a duration above 0 (a gate must end)", f.gateTimeout))
	}
	if f.gateCmd != "" && s.GateCmd == "" {
		errs = append(errs, errors.New("--gate-cmd: an empty command"))
	}
	if len(errs) == 0 {
		if err := s.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return s, withCode(exitUsage, fmt.Errorf("%s: %w; %s", f.name, err, f.nothing))
	}
	return s, nil
}

// stage is what makes a checked write to tg a rollout when the flags say
// so: the rollout (nil: not one) and opts with the option that writes it
// in the write's own transaction (registry.WithRollout).
func (f *strategyFlags) stage(ctx context.Context, reg *registry.Client, tg registry.Target, opts []registry.WriteOption, warn io.Writer) (*rollout.Record, []registry.WriteOption, error) {
	if !f.s.IsRollout() {
		return nil, opts, nil
	}
	r, err := f.newRollout(ctx, reg, tg.Group, warn)
	if err != nil {
		return nil, nil, err
	}
	return r, append(opts, registry.WithRollout(r, f.supersede)), nil
}

// newRollout is the rollout a write of f's strategy to group starts: the
// group's members now (live or not), by name, cut into waves.
func (f *strategyFlags) newRollout(ctx context.Context, reg *registry.Client, group string, warn io.Writer) (*rollout.Record, error) {
	known, err := reg.KnownHosts(ctx)
	if err != nil {
		return nil, err
	}
	var hosts, down []string
	for _, k := range known {
		if slices.Contains(k.Groups, group) {
			hosts = append(hosts, k.Host)
			if !k.Live {
				down = append(down, k.Host)
			}
		}
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%s: no host has joined group %s: a rollout would have no host to go to (start agents with --group %s, or drop the rollout options); %s", f.name, group, group, f.nothing)
	}
	slices.Sort(hosts)
	if len(down) > 0 {
		fmt.Fprintf(warn, "warning: %s of group %s %s no live agent: the rollout waits for %s in %s wave\n",
			rollout.NameHosts(down, len(down)), group, plural(len(down), "has", "have"), plural(len(down), "it", "them"), plural(len(down), "its", "their"))
	}
	now := time.Now().UTC()
	return &rollout.Record{
		ID: registry.NewRolloutID(now), Group: group, Strategy: f.s,
		Hosts: hosts, WaveEnds: f.s.WaveEnds(len(hosts)),
		By: storedBy(), Reason: strings.TrimSpace(f.reason),
	}, nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// announceRollout says which rollout a write started, and which it
// superseded (read back: the write's transaction ended them).
func announceRollout(ctx context.Context, out io.Writer, asJSON bool, reg *registry.Client, r *rollout.Record) {
	var superseded []string
	if all, err := reg.Rollouts(ctx, r.Group, false); err == nil {
		for _, v := range all {
			if e := v.Record.End; e != nil && e.State == rollout.Superseded && e.Reason == "superseded by "+r.ID {
				superseded = append(superseded, v.Record.ID)
			}
		}
	}
	for _, id := range superseded {
		say(out, asJSON, map[string]any{"event": "rollout-superseded", "rollout": id, "by": r.ID},
			"rollout %s: superseded by %s (ended; its hosts take this one instead)\n", id, r.ID)
	}
	say(out, asJSON, map[string]any{"event": "rollout", "rollout": r.ID, "group": r.Group, "hosts": r.Hosts, "waveEnds": r.WaveEnds},
		"rollout %s: %d %s in %s %s; follow it with agentd rollout status %s --watch\n",
		r.ID, len(r.Hosts), plural(len(r.Hosts), "host", "hosts"), plural(len(r.WaveEnds), "wave", "waves"), joinInts(r.WaveEnds), r.ID)
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

// rolloutFollow follows one rollout by polling its record and summary
// (never every host's progress), until it is settled or ctx ends; show is
// called at every read, and with a gate command the gate is run when the
// rollout waits for it.
type rolloutFollow struct {
	reg   *registry.Client
	id    string
	every time.Duration
	show  func(v rollout.View, ph rollout.Phase, now time.Time)
	// gate runs Strategy.GateCmd (put --wait only); its output goes to
	// gateOut.
	gate    bool
	gateOut io.Writer
	say     func(v any, format string, args ...any)
}

func (f *rolloutFollow) run(ctx context.Context) (rollout.View, rollout.Phase, error) {
	var (
		v         rollout.View
		ph        rollout.Phase
		readErr   error
		settledAt time.Time
	)
	for {
		nv, err := f.reg.Rollout(ctx, f.id, false)
		switch {
		case ctx.Err() != nil:
			return v, ph, ctx.Err()
		case errors.Is(err, registry.ErrNoRollout):
			return v, ph, err
		case err != nil:
			readErr = err // the registry may be away a moment: read again
		default:
			readErr = nil
			v = nv
			now := time.Now()
			ph = v.Phase()
			// An end the coordinator wrote is followed by the summary of
			// the end (the final counts), at most SummaryEvery later: wait
			// for it a moment, so the last line does not show the counts
			// from before the end.
			settled := v.Settled()
			if settled && settledAt.IsZero() {
				settledAt = now
			}
			final := settled && ((v.Summary != nil && v.Summary.Phase.State.Ended()) || now.Sub(settledAt) >= 4*rollout.SummaryEvery)
			if !settled || final {
				f.show(v, ph, now)
			}
			if final {
				return v, ph, nil
			}
			// The summary says waiting-gate until the coordinator looks
			// again: a gate that passed is not run again.
			if f.gate && ph.State == rollout.WaitingGate && v.Record.Gated < ph.Wave {
				if err := f.runGate(ctx, v, ph.Wave); err != nil {
					return v, ph, err
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			if readErr != nil {
				return v, ph, fmt.Errorf("%w (last read: %v)", ctx.Err(), readErr)
			}
			return v, ph, ctx.Err()
		case <-time.After(f.every):
		}
	}
}

// runGate runs the gate command before wave (an index) of v: exit 0
// opens the wave (Record.Gated); anything else pauses the rollout with
// the reason, and the follow ends with exit 3.
func (f *rolloutFollow) runGate(ctx context.Context, v rollout.View, wave int) error {
	r := v.Record
	n := strconv.Itoa(wave + 1)
	f.say(map[string]any{"event": "rollout-gate", "rollout": r.ID, "wave": wave + 1, "cmd": r.Strategy.GateCmd},
		"rollout %s: running the gate before wave %s: %s\n", r.ID, n, r.Strategy.GateCmd)
	var tail tailBuffer
	runErr := runGateCmd(ctx, r, n, io.MultiWriter(f.gateOut, &tail))
	if ctx.Err() != nil {
		return ctx.Err()
	}
	now := time.Now().UTC()
	if runErr == nil {
		_, err := f.reg.UpdateRollout(ctx, r.ID, func(v rollout.View) error {
			if v.Phase().State.Ended() {
				return errNoChange
			}
			v.Record.Gated = max(v.Record.Gated, wave)
			return nil
		})
		if err != nil && !errors.Is(err, errNoChange) {
			return err
		}
		f.say(map[string]any{"event": "rollout-gate-passed", "rollout": r.ID, "wave": wave + 1},
			"rollout %s: the gate passed: wave %s opens\n", r.ID, n)
		return nil
	}
	reason := fmt.Sprintf("the gate before wave %s failed (%v)", n, runErr)
	if last := tail.lastLine(); last != "" {
		reason += ": " + last
	}
	_, err := f.reg.UpdateRollout(ctx, r.ID, func(v rollout.View) error {
		if v.Phase().State.Ended() {
			return errNoChange
		}
		v.Record.Paused, v.Record.PauseReason, v.Record.PausedAt = true, reason, now
		return nil
	})
	if err != nil && !errors.Is(err, errNoChange) {
		return fmt.Errorf("%s, and the rollout could not be paused: %w", reason, err)
	}
	return withCode(exitFailed, fmt.Errorf("rollout %s paused: %s; `agentd rollout promote %s` opens wave %s anyway, `agentd rollout abort %s [--revert]` ends it",
		r.ID, reason, r.ID, n, r.ID))
}

// runGateCmd runs r's gate command before wave n in a process group of
// its own, killed whole when the gate outlives --gate-timeout, when ctx
// ends (the command exits), and when the shell is done (a child it left
// in the background): a rollout never waits on a gate whose process is
// gone, and a gate never outlives the command that ran it.
func runGateCmd(ctx context.Context, r *rollout.Record, n string, out io.Writer) error {
	timeout := r.Strategy.GateTimeoutOr()
	gctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := exec.CommandContext(gctx, "sh", "-c", r.Strategy.GateCmd)
	c.Env = append(os.Environ(), "AGENTD_ROLLOUT="+r.ID, "AGENTD_GROUP="+r.Group, "AGENTD_WAVE="+n)
	c.Stdout, c.Stderr = out, out
	// Pdeathsig: the shell dies with this command even if it is killed
	// with SIGKILL (its children still have the group kill below).
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = time.Second
	err := c.Run()
	if c.Process != nil {
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
	if ctx.Err() == nil && errors.Is(gctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("timed out after %s (--gate-timeout), its processes killed", timeout)
	}
	return err
}

// tailBuffer keeps the last 4 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) lastLine() string {
	lines := strings.Split(strings.TrimSpace(string(t.b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// errNoChange: a control write found nothing to change (not written).
var errNoChange = errors.New("nothing to change")

// followPut is `--wait` on a rollout (put, rm, revert): it follows r to
// its end, printing a line of counters whenever one moves and each new
// offender, and exits as the rollout ended (0 done; 3 failed or aborted,
// after the revert if any; 5 superseded; 4 on --timeout: the rollout goes
// on).
func followPut(ctx context.Context, reg *registry.Client, r *rollout.Record, wf waitFlags, asJSON bool, out, errOut io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, wf.timeout)
	defer cancel()
	lines := newRolloutLines(out, asJSON)
	f := &rolloutFollow{reg: reg, id: r.ID, every: 200 * time.Millisecond, show: lines.show,
		gate: r.Strategy.GateCmd != "", gateOut: errOut,
		say: func(v any, format string, args ...any) { lines.flush(); say(out, asJSON, v, format, args...) }}
	if f.gate {
		// Say who runs the gate: without it, `rollout status` says no
		// command does (and `resume` runs it).
		release, err := reg.RunGate(ctx, r, storedBy())
		if err != nil {
			return err
		}
		defer release()
	}
	v, ph, err := f.run(ctx)
	lines.flush()
	if v.Record == nil && err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return withCode(exitTimeout, fmt.Errorf("timed out after %s before rollout %s could be read; it goes on without this command: agentd rollout status %s --watch", wf.timeout, r.ID, r.ID))
		}
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		msg := fmt.Sprintf("timed out after %s: rollout %s is %s (%s)", wf.timeout, r.ID, describePhase(v, ph), counters(v))
		if ph.State.Ended() && v.Summary.Holding() > 0 {
			msg += "; still going back to the previous version: " + v.Summary.Named(holdingStates...)
		}
		return withCode(exitTimeout, errors.New(msg+"; it goes on without this command: agentd rollout status "+r.ID+" --watch"))
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("interrupted: rollout %s is %s (%s); it goes on without this command: agentd rollout status %s --watch", r.ID, describePhase(v, ph), counters(v), r.ID)
	}
	if err != nil {
		return err
	}
	return rolloutVerdict(v, ph)
}

// holdingStates are the states of a host that has the change, is taking
// it, or is going back from it.
var holdingStates = []rollout.HostState{rollout.HostApplying, rollout.HostSoaking, rollout.HostHealthy, rollout.HostFailed, rollout.HostReverting}

// rolloutVerdict is the exit of a follow that saw v settled in phase ph.
func rolloutVerdict(v rollout.View, ph rollout.Phase) error {
	r, s := v.Record, v.Summary
	switch ph.State {
	case rollout.Done:
		return nil
	case rollout.Superseded:
		return withCode(exitSuperseded, fmt.Errorf("rollout %s superseded%s", r.ID, prefixed(ph.Reason)))
	}
	msg := fmt.Sprintf("rollout %s %s%s", r.ID, ph.State, prefixed(ph.Reason))
	if r.Reverts() {
		switch {
		case v.Count(rollout.HostReverted) > 0:
			msg += "; reverted to the previous version: " + s.Named(rollout.HostReverted)
		case v.Count(rollout.HostRevertFailed) == 0:
			msg += "; no host had taken it: nothing to revert"
		}
		if v.Count(rollout.HostRevertFailed) > 0 {
			msg += "; could not go back (they keep the change): " + s.Named(rollout.HostRevertFailed)
			for _, o := range s.Offenders {
				if o.State == rollout.HostRevertFailed {
					msg += "; " + o.Host + " " + o.Reason
					break
				}
			}
		}
	} else {
		// Only the hosts that run it: a host still applying (a job that
		// hangs, say) never ran it healthy, and is named apart.
		if n := v.Count(rollout.HostHealthy) + v.Count(rollout.HostSoaking); n > 0 {
			msg += "; these hosts keep the change: " + s.Named(rollout.HostHealthy, rollout.HostSoaking)
		}
		if v.Count(rollout.HostApplying) > 0 {
			msg += "; these were still taking it (never healthy on it): " + s.Named(rollout.HostApplying)
		}
	}
	return withCode(exitFailed, errors.New(msg))
}

// rolloutLines prints a rollout's changes (put --wait): a line of counters
// when one moves (redrawn in place on a terminal, at most 5 times a second
// otherwise), and each offender once.
type rolloutLines struct {
	out      io.Writer
	json     bool
	tty      bool
	last     string
	pending  string // a counters line not printed yet (rate limit)
	printed  time.Time
	drawn    bool
	said     map[string]string // offender → reason said
	start    time.Time
	primed   bool
	lastJSON map[string]any
}

func newRolloutLines(out io.Writer, asJSON bool) *rolloutLines {
	return &rolloutLines{out: out, json: asJSON, tty: !asJSON && isTerminal(out), said: map[string]string{}}
}

func (l *rolloutLines) show(v rollout.View, ph rollout.Phase, now time.Time) {
	r := v.Record
	if !l.primed {
		l.primed, l.start = true, now
	}
	if s := v.Summary; s != nil {
		for _, o := range s.Offenders {
			key := o.Host + "|" + string(o.State)
			if l.said[key] == o.Reason {
				continue
			}
			l.said[key] = o.Reason
			l.flush()
			say(l.out, l.json, map[string]any{"event": "rollout-host", "rollout": r.ID, "host": o.Host, "wave": o.Wave + 1, "state": o.State, "reason": o.Reason,
				"elapsedMs": now.Sub(l.start).Milliseconds()},
				"%s (wave %d): %s%s\n", o.Host, o.Wave+1, o.State, prefixed(o.Reason))
		}
	}
	line := fmt.Sprintf("rollout %s: %s · %s", r.ID, describePhase(v, ph), counters(v))
	if line == l.last {
		return
	}
	l.last = line
	if l.json {
		say(l.out, true, map[string]any{"event": "rollout-phase", "rollout": r.ID, "state": ph.State, "wave": phaseWave(v, ph), "waves": len(r.WaveEnds),
			"reason": ph.Reason, "counts": countsOf(v), "hosts": len(r.Hosts), "elapsedMs": now.Sub(l.start).Milliseconds()}, "")
		return
	}
	if l.tty {
		if l.drawn {
			fmt.Fprint(l.out, "\x1b[1A\x1b[2K")
		}
		fmt.Fprintf(l.out, "%s %s\n", line, progressBar(v))
		l.drawn = true
		return
	}
	l.pending = line
	if now.Sub(l.printed) >= 200*time.Millisecond || ph.State.Ended() {
		l.flush()
		l.printed = now
	}
}

// flush prints the counters line held back by the rate limit.
func (l *rolloutLines) flush() {
	if l.pending != "" {
		fmt.Fprintln(l.out, l.pending)
		l.pending = ""
	}
	l.drawn = false
}

// isTerminal says out is a terminal that takes cursor moves.
func isTerminal(out io.Writer) bool {
	f, ok := out.(*os.File)
	return ok && term.IsTerminal(int(f.Fd())) && os.Getenv("TERM") != "dumb"
}

// describePhase is "running, wave 2 of 3" with the phase's reason.
func describePhase(v rollout.View, ph rollout.Phase) string {
	return fmt.Sprintf("%s, wave %d of %d%s", ph.State, phaseWave(v, ph), len(v.Record.WaveEnds), prefixed(ph.Reason))
}

// phaseWave is the phase's wave counted from 1 (a rollout whose every
// wave is done is in its last).
func phaseWave(v rollout.View, ph rollout.Phase) int {
	return min(ph.Wave, len(v.Record.WaveEnds)-1) + 1
}

// counters is "312 healthy · 88 applying · 3 failed · 597 waiting" from
// the summary (the hosts' states it counts add up to the host total).
func counters(v rollout.View) string {
	s := v.Summary
	if s == nil {
		return fmt.Sprintf("%d %s, no count yet", len(v.Record.Hosts), plural(len(v.Record.Hosts), "host", "hosts"))
	}
	var parts []string
	for _, st := range rollout.HostStates {
		if n := s.Counts[st]; n > 0 || st == rollout.HostHealthy {
			word := string(st)
			if st == rollout.HostPending {
				word = "waiting"
			}
			parts = append(parts, fmt.Sprintf("%d %s", n, word))
		}
	}
	return strings.Join(parts, " · ")
}

func countsOf(v rollout.View) map[rollout.HostState]int {
	if v.Summary == nil {
		return map[rollout.HostState]int{rollout.HostPending: len(v.Record.Hosts)}
	}
	return v.Summary.Counts
}

// describeStrategy is the strategy as the flags that made it.
func describeStrategy(s rollout.Strategy) string {
	var parts []string
	add := func(ok bool, format string, args ...any) {
		if ok {
			parts = append(parts, fmt.Sprintf(format, args...))
		}
	}
	add(!s.Canary.IsZero(), "--canary %s", s.Canary)
	if len(s.Waves) > 0 {
		w := make([]string, len(s.Waves))
		for i, c := range s.Waves {
			w[i] = c.String()
		}
		parts = append(parts, "--waves "+strings.Join(w, ","))
	}
	add(!s.MaxUnavailable.IsZero(), "--max-unavailable %s", s.MaxUnavailable)
	add(s.Soak > 0, "--soak %s", s.Soak)
	add(s.ProgressDeadline > 0, "--progress-deadline %s", s.ProgressDeadline)
	add(s.PauseAfterCanary, "--pause-after-canary")
	add(s.AutoRevert, "--auto-revert")
	add(s.MaxRestarts >= 0, "--max-restarts %d", s.MaxRestarts)
	add(s.GateCmd != "", "--gate-cmd %q", s.GateCmd)
	add(s.GateURL != "", "--gate-url %s", s.GateURL)
	add(s.GateProm != "", "--gate-prom %q --prom-url %s", s.GateProm, s.PromURL)
	add(s.GateTimeout > 0, "--gate-timeout %s", s.GateTimeout)
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// rolloutSummary is one rollout as `rollout ls --json` and `rollout
// status --json` give it. Wave counts from 1. Hosts are listed only when
// asked for (--hosts).
type rolloutSummary struct {
	Rollout *rollout.Record `json:"rollout"`
	Phase   struct {
		State  rollout.State `json:"state"`
		Wave   int           `json:"wave"`
		Waves  int           `json:"waves"`
		Reason string        `json:"reason,omitempty"`
	} `json:"phase"`
	Healthy     int                       `json:"healthy"`
	Total       int                       `json:"total"`
	Counts      map[rollout.HostState]int `json:"counts"`
	Offenders   []rollout.Offender        `json:"offenders,omitempty"`
	Coordinator string                    `json:"coordinator,omitempty"`
	Hosts       []rolloutHost             `json:"hosts,omitempty"`
}

type rolloutHost struct {
	Host   string            `json:"host"`
	Wave   int               `json:"wave"`
	State  rollout.HostState `json:"state"`
	Since  time.Time         `json:"since,omitzero"`
	Reason string            `json:"reason,omitempty"`
}

func summarize(v rollout.View, ph rollout.Phase, which hostFilter) rolloutSummary {
	r := v.Record
	s := rolloutSummary{Rollout: r, Total: len(r.Hosts), Counts: countsOf(v), Healthy: v.Count(rollout.HostHealthy), Coordinator: v.Coordinator}
	if v.Summary != nil {
		s.Offenders = v.Summary.Offenders
	}
	s.Phase.State, s.Phase.Wave, s.Phase.Waves, s.Phase.Reason = ph.State, phaseWave(v, ph), len(r.WaveEnds), ph.Reason
	for _, h := range which.hosts(v) {
		st, reason, since := v.HostState(h)
		s.Hosts = append(s.Hosts, rolloutHost{Host: h, Wave: r.Wave(h) + 1, State: st, Since: since, Reason: reason})
	}
	return s
}

// hostFilter is --hosts: which hosts `rollout status` lists one by one
// ("": none, the counters say it all).
type hostFilter string

func (f hostFilter) check() error {
	switch f {
	case "", "all", "failed", "pending":
		return nil
	}
	return fmt.Errorf("--hosts %q: want all, failed or pending", string(f))
}

// hosts are v's hosts f lists, in rollout order (v read with progress).
func (f hostFilter) hosts(v rollout.View) []string {
	if f == "" || v.Progress == nil {
		return nil
	}
	var out []string
	for _, h := range v.Record.Hosts {
		st, _, _ := v.HostState(h)
		switch {
		case f == "all",
			f == "failed" && (st == rollout.HostFailed || st == rollout.HostReverting || st == rollout.HostReverted),
			f == "pending" && st != rollout.HostHealthy:
			out = append(out, h)
		}
	}
	return out
}

// progressBar is "[########------------] 40%".
func progressBar(v rollout.View) string {
	const width = 20
	total := len(v.Record.Hosts)
	n, pct := 0, 0
	if total > 0 {
		n = v.Count(rollout.HostHealthy) * width / total
		pct = v.Count(rollout.HostHealthy) * 100 / total
	}
	return "[" + strings.Repeat("#", n) + strings.Repeat("-", width-n) + "] " + strconv.Itoa(pct) + "%"
}

// printRolloutStatus writes the status of one rollout: a header, one line
// of counters, the first offenders, and the hosts --hosts asks for.
func printRolloutStatus(out io.Writer, v rollout.View, ph rollout.Phase, which hostFilter, now time.Time) error {
	r := v.Record
	var b bytes.Buffer
	fmt.Fprintf(&b, "rollout %s of group %s: %s\n", r.ID, r.Group, strings.Join(slices.Sorted(maps.Keys(r.Units)), ", "))
	fmt.Fprintf(&b, "phase:    %s\n", describePhase(v, ph))
	fmt.Fprintf(&b, "strategy: %s\n", describeStrategy(r.Strategy))
	fmt.Fprintf(&b, "waves:    %s of %d %s\n", joinWaveEnds(r.WaveEnds), len(r.Hosts), plural(len(r.Hosts), "host", "hosts"))
	started := fmt.Sprintf("started:  %s (%s ago)", r.CreatedAt.Local().Format(time.DateTime), ago(now.Sub(r.CreatedAt)))
	if r.By != "" {
		started += " by " + r.By
	}
	if r.Reason != "" {
		started += ": " + r.Reason
	}
	fmt.Fprintln(&b, started)
	if r.Paused {
		fmt.Fprintf(&b, "paused:   since %s%s\n", r.PausedAt.Local().Format(time.DateTime), prefixed(r.PauseReason))
	}
	if a := r.Abort; a != nil {
		what := "no host takes it any more; the hosts that took it keep it"
		if a.Revert {
			what = "the hosts that took it go back to the previous version"
		}
		fmt.Fprintf(&b, "aborted:  %s by %s: %s\n", a.At.Local().Format(time.DateTime), orDash(a.By), what)
	}
	if e := r.End; e != nil {
		fmt.Fprintf(&b, "ended:    %s, %s%s\n", e.At.Local().Format(time.DateTime), e.State, prefixed(e.Reason))
	}
	fmt.Fprintf(&b, "coordinator: %s\n", describeCoordinator(v, now))
	fmt.Fprintf(&b, "%s %s\n", progressBar(v), counters(v))
	if s := v.Summary; s != nil && len(s.Offenders) > 0 {
		fmt.Fprintln(&b, "first offenders:")
		for _, o := range s.Offenders {
			fmt.Fprintf(&b, "  %s (wave %d): %s%s\n", o.Host, o.Wave+1, o.State, prefixed(o.Reason))
		}
	}
	if hosts := which.hosts(v); len(hosts) > 0 {
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "HOST\tWAVE\tSTATE\tFOR\tREASON")
		for _, h := range hosts {
			st, reason, since := v.HostState(h)
			dur := "-"
			if !since.IsZero() {
				dur = ago(now.Sub(since))
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", h, r.Wave(h)+1, st, dur, orDash(reason))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	} else if which != "" {
		fmt.Fprintf(&b, "--hosts %s: no host\n", which)
	} else if len(r.Hosts) > 0 {
		fmt.Fprintf(&b, "(each host: agentd rollout status %s --hosts all|failed|pending)\n", r.ID)
	}
	_, err := b.WriteTo(out)
	return err
}

// describeCoordinator names the group's coordinator, or says since when
// there is none (by the summary's last write).
func describeCoordinator(v rollout.View, now time.Time) string {
	if v.Coordinator != "" {
		return v.Coordinator
	}
	if s := v.Summary; s != nil {
		return fmt.Sprintf("none for group %s since %s (its last summary, by %s); the rollout goes on when one of its agents runs", v.Record.Group, ago(now.Sub(s.At)), orDash(s.Coordinator))
	}
	return "none for group " + v.Record.Group + " yet; the rollout starts when one of its agents runs"
}

// joinWaveEnds is "1, 3, 5".
func joinWaveEnds(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

// statusSignature changes when anything `rollout status` shows changes,
// but the times.
func statusSignature(v rollout.View, ph rollout.Phase) string {
	r := v.Record
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%d|%s|%v|%s|%v|%v|%v|%s|%s", ph.State, ph.Wave, ph.Reason, r.Paused, r.PauseReason, r.Abort != nil, r.End != nil, r.Gated, counters(v), v.Coordinator)
	if s := v.Summary; s != nil {
		for _, o := range s.Offenders {
			fmt.Fprintf(&b, "|%s=%s:%s", o.Host, o.State, o.Reason)
		}
	}
	return b.String()
}

func newRolloutCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Follow and steer rollouts: a group's change taken by its hosts in stages",
		Long: `A unit put, rm or revert to a group with a strategy (--canary, --waves,
--max-unavailable, --soak, --progress-deadline, --pause-after-canary,
--auto-revert, --max-restarts, --gate-cmd) is a rollout: the group's members
at that moment take the change in waves, each host healthy for --soak before
it counts (for a removal: each host stopped and removed the units). The
agents drive it from its record in the registry; it goes on without the
command that started it. These commands read it and write its control fields.`,
	}
	cmd.AddCommand(newRolloutLsCmd(), newRolloutStatusCmd())
	cmd.AddCommand(newRolloutPauseCmd(), newRolloutResumeCmd(), newRolloutPromoteCmd(), newRolloutAbortCmd())
	return cmd
}

func newRolloutLsCmd() *cobra.Command {
	var (
		ef     etcdFlags
		group  string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "ls [--group G]",
		Short: "List rollouts, newest first",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if group != "" {
				if err := registry.ValidateName("group", group); err != nil {
					return withCode(exitUsage, err)
				}
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				all, err := reg.Rollouts(ctx, group, false)
				if err != nil {
					return err
				}
				now := time.Now()
				out := cmd.OutOrStdout()
				if asJSON {
					items := []rolloutSummary{}
					for _, v := range all {
						items = append(items, summarize(v, v.Phase(), ""))
					}
					return writeJSON(out, items)
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tGROUP\tUNITS\tSTATE\tWAVE\tHEALTHY\tAGE\tBY")
				for _, v := range all {
					r, ph := v.Record, v.Phase()
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%d/%d\t%s\t%s\n", r.ID, r.Group, strings.Join(slices.Sorted(maps.Keys(r.Units)), ","),
						ph.State, phaseWave(v, ph), len(r.WaveEnds), v.Count(rollout.HostHealthy), len(r.Hosts), ago(now.Sub(r.CreatedAt)), orDash(r.By))
				}
				return tw.Flush()
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	cmd.Flags().StringVar(&group, "group", "", "only this group's rollouts")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newRolloutStatusCmd() *cobra.Command {
	var (
		ef     etcdFlags
		watch  bool
		asJSON bool
		which  string
	)
	cmd := &cobra.Command{
		Use:   "status ID [--watch] [--hosts all|failed|pending]",
		Short: "Show a rollout: its phase, strategy, a line of counters and the first offenders",
		Long: `Show a rollout: its phase (starting, running, paused, waiting-promote,
waiting-gate, done, failed, aborted, superseded), strategy, who started it and
why, its coordinator, a progress bar with one line of counters (hosts healthy,
applying, soaking, failed, reverting, reverted, waiting), and the first hosts
that failed or hold it up, with why. All of it is read from the summary the
group's coordinator keeps: one key, whatever the group's size.

--hosts lists hosts one by one (wave, state, reason, time in that state):
all, failed (failed, reverting, reverted) or pending (not healthy yet); that
reads every host's progress.

With --watch, show it again whenever it changes (redrawn in place on a
terminal; JSON lines with --json) until it ends (and, when it reverts, until
every host went back); then exit 0 when it is done, 3 when it failed or was
aborted, 5 when it was superseded.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			hf := hostFilter(which)
			if err := hf.check(); err != nil {
				return withCode(exitUsage, err)
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				out := cmd.OutOrStdout()
				if !watch {
					v, err := reg.Rollout(ctx, args[0], hf != "")
					if err != nil {
						return err
					}
					now := time.Now()
					ph := v.Phase()
					if asJSON {
						return writeJSON(out, summarize(v, ph, hf))
					}
					return printRolloutStatus(out, v, ph, hf, now)
				}
				return watchRollout(ctx, reg, args[0], out, asJSON)
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	cmd.Flags().StringVar(&which, "hosts", "", "also list hosts one by one: all, failed or pending")
	cmd.Flags().BoolVar(&watch, "watch", false, "show it again at every change until it ends")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (with --watch, one line per change)")
	return cmd
}

// watchRollout is `rollout status --watch`: it follows the record and
// the summary only, redrawn in place on a terminal.
func watchRollout(ctx context.Context, reg *registry.Client, id string, out io.Writer, asJSON bool) error {
	tty := !asJSON && isTerminal(out)
	var (
		last  string
		drawn int
		werr  error
	)
	show := func(v rollout.View, ph rollout.Phase, now time.Time) {
		sig := statusSignature(v, ph)
		if sig == last && !tty {
			return
		}
		last = sig
		switch {
		case asJSON:
			writeJSONLine(out, summarize(v, ph, ""))
		case tty:
			var b bytes.Buffer
			werr = printRolloutStatus(&b, v, ph, "", now)
			if drawn > 0 {
				fmt.Fprintf(out, "\x1b[%dA", drawn)
			}
			lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
			for _, l := range lines {
				fmt.Fprintf(out, "\x1b[2K%s\n", l)
			}
			for i := len(lines); i < drawn; i++ { // a shorter table than the last
				fmt.Fprint(out, "\x1b[2K\n")
			}
			drawn = max(drawn, len(lines))
		default:
			if drawn > 0 {
				fmt.Fprintln(out)
			}
			drawn++
			werr = printRolloutStatus(out, v, ph, "", now)
		}
	}
	f := &rolloutFollow{reg: reg, id: id, every: 500 * time.Millisecond, show: show}
	v, ph, err := f.run(ctx)
	if werr != nil {
		return werr
	}
	if errors.Is(err, context.Canceled) && v.Record != nil {
		return nil // interrupted: the rollout goes on
	}
	if err != nil {
		return err
	}
	return rolloutVerdict(v, ph)
}

// controlCmd is a command that changes one rollout's record: change is
// applied to the record as read (again on a race) and written back, and
// its message printed; errNoChange writes nothing and prints the message.
func controlCmd(use, short, long string, bind func(cmd *cobra.Command),
	change func(v rollout.View, now time.Time, by string) (msg string, err error)) *cobra.Command {
	var (
		ef     etcdFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use: use, Short: short, Long: long,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				by := storedBy()
				var msg string
				v, err := reg.UpdateRollout(ctx, args[0], func(v rollout.View) error {
					var err error
					msg, err = change(v, time.Now().UTC(), by)
					return err
				})
				if err != nil && !errors.Is(err, errNoChange) {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return writeJSON(out, summarize(v, v.Phase(), ""))
				}
				fmt.Fprintln(out, msg)
				return nil
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the rollout as it is now, as JSON")
	if bind != nil {
		bind(cmd)
	}
	return cmd
}

// refuseEnded refuses to steer a rollout that ended.
func refuseEnded(v rollout.View, ph rollout.Phase, verb string) error {
	if ph.State.Ended() {
		return fmt.Errorf("rollout %s has ended (%s%s): nothing to %s", v.Record.ID, ph.State, prefixed(ph.Reason), verb)
	}
	return nil
}

func newRolloutPauseCmd() *cobra.Command {
	var reason string
	return controlCmd("pause ID [--reason TEXT]", "Pause a rollout: no host starts taking it (those taking it finish)",
		`Pause a rollout: no more host starts taking the change; the hosts taking it
finish their soak. "agentd rollout resume ID" goes on. A paused rollout's
--progress-deadline does not run.`,
		func(cmd *cobra.Command) { cmd.Flags().StringVar(&reason, "reason", "", "why, shown in rollout status") },
		func(v rollout.View, now time.Time, by string) (string, error) {
			r, ph := v.Record, v.Phase()
			if err := refuseEnded(v, ph, "pause"); err != nil {
				return "", err
			}
			if r.Paused {
				return fmt.Sprintf("rollout %s is already paused (since %s%s)", r.ID, r.PausedAt.Local().Format(time.DateTime), prefixed(r.PauseReason)), errNoChange
			}
			r.Paused, r.PausedAt, r.PauseReason = true, now, "paused by "+by
			if reason != "" {
				r.PauseReason += ": " + reason
			}
			return fmt.Sprintf("rollout %s paused at wave %d of %d (%s): no host starts taking it; `agentd rollout resume %s` goes on",
				r.ID, phaseWave(v, ph), len(r.WaveEnds), counters(v), r.ID), nil
		})
}

func newRolloutResumeCmd() *cobra.Command {
	var (
		ef     etcdFlags
		asJSON bool
		wf     waitFlags
	)
	cmd := &cobra.Command{
		Use:   "resume ID [--timeout D]",
		Short: "Resume a paused rollout; with a gate command, run the gate here and follow it",
		Long: `Resume a paused rollout. A rollout with --gate-cmd needs a command to run its
gate before each wave (the put --wait that started it; if that is gone, the
rollout waits, and "rollout status" says no command runs its gate): resume
then runs the recorded gate command here, before each wave, following the
rollout as put --wait does until it ends or --timeout (exit 4; the rollout
goes on). "agentd rollout promote ID" opens the waiting wave without the gate.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				out := cmd.OutOrStdout()
				var msg string
				v, err := reg.UpdateRollout(ctx, args[0], func(v rollout.View) error {
					r, ph := v.Record, v.Phase()
					if err := refuseEnded(v, ph, "resume"); err != nil {
						return err
					}
					gate := r.Strategy.GateCmd != "" && ph.State == rollout.WaitingGate && v.GateRunner == ""
					if !r.Paused {
						if gate {
							msg = fmt.Sprintf("rollout %s waits for its gate before wave %d: running it here", r.ID, phaseWave(v, ph))
							return errNoChange
						}
						return fmt.Errorf("rollout %s is not paused (%s)", r.ID, describePhase(v, ph))
					}
					r.Paused, r.PauseReason, r.ResumedAt = false, "", time.Now().UTC()
					msg = fmt.Sprintf("rollout %s resumed at wave %d of %d", r.ID, phaseWave(v, ph), len(r.WaveEnds))
					return nil
				})
				if err != nil && !errors.Is(err, errNoChange) {
					return err
				}
				say(out, asJSON, map[string]any{"event": "rollout-resumed", "rollout": v.Record.ID}, "%s\n", msg)
				if v.Record.Strategy.GateCmd == "" {
					return nil
				}
				if v.GateRunner != "" {
					fmt.Fprintf(out, "its gate is run by %s\n", v.GateRunner)
					return nil
				}
				return followPut(ctx, reg, v.Record, wf, asJSON, out, cmd.ErrOrStderr())
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON lines")
	cmd.Flags().DurationVar(&wf.timeout, "timeout", 2*time.Minute, "with a gate command: stop following after this long (exit 4; the rollout goes on)")
	return cmd
}

func newRolloutPromoteCmd() *cobra.Command {
	return controlCmd("promote ID", "Send a rollout on past what holds it: the canary's pause, a pause, or its gate",
		`Send a rollout on: after --pause-after-canary (waiting-promote), after a pause
(as resume), or past its gate (waiting-gate, or paused by a failed gate: the
wave opens without the gate, be it a command, --gate-url or --gate-prom).
Exit 1 when nothing holds it.`, nil,
		func(v rollout.View, now time.Time, _ string) (string, error) {
			r, ph := v.Record, v.Phase()
			if err := refuseEnded(v, ph, "promote"); err != nil {
				return "", err
			}
			switch ph.State {
			case rollout.WaitingPromote, rollout.Paused, rollout.WaitingGate:
			default:
				return "", fmt.Errorf("rollout %s is not paused (%s): nothing to promote", r.ID, describePhase(v, ph))
			}
			r.Promoted, r.Paused, r.PauseReason, r.ResumedAt = true, false, "", now
			// Past the gate of the wave it holds, whoever runs it: a
			// coordinator's gate (--gate-url, --gate-prom) too, else the
			// coordinator would run it again and pause once more.
			if r.Strategy.Gated() {
				r.Gated = max(r.Gated, ph.Wave)
			}
			return fmt.Sprintf("rollout %s promoted: wave %d of %d goes on", r.ID, phaseWave(v, ph), len(r.WaveEnds)), nil
		})
}

func newRolloutAbortCmd() *cobra.Command {
	var revert bool
	return controlCmd("abort ID [--revert]", "End a rollout: no host takes it any more (--revert: the hosts that took it go back)",
		`End a rollout as aborted: no host starts taking the change any more. With
--revert, the hosts that took it go back to the previous version (follow them
with "agentd rollout status ID --watch"); without, they keep it. The registry
keys keep the change: the hosts that never took it run the previous version
while the rollout is the last write of its keys; "agentd unit revert" puts the
previous version back in the keys for every host.`,
		func(cmd *cobra.Command) {
			cmd.Flags().BoolVar(&revert, "revert", false, "put the hosts that took the change back on the previous version")
		},
		func(v rollout.View, now time.Time, by string) (string, error) {
			r, ph := v.Record, v.Phase()
			if err := refuseEnded(v, ph, "abort"); err != nil {
				return "", err
			}
			reason := "aborted by " + by
			what := "the hosts that took it keep it"
			if revert {
				reason += ", with --revert"
				what = "the hosts that took it go back to the previous version"
			}
			if v.Summary.Holding() > 0 {
				what += " (" + v.Summary.Named(holdingStates...) + ")"
			} else if v.Summary != nil {
				what = "no host had taken it"
			}
			r.Abort = &rollout.Abort{Revert: revert, At: now, By: by}
			r.End = &rollout.End{State: rollout.Aborted, Reason: reason, At: now, Wave: phaseWave(v, ph)}
			return fmt.Sprintf("rollout %s aborted at wave %d of %d: no host takes it any more; %s; follow it with agentd rollout status %s --watch",
				r.ID, phaseWave(v, ph), len(r.WaveEnds), what, r.ID), nil
		})
}
