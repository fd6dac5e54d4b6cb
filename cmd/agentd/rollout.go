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
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// Rollouts from the CLI: the strategy flags of `unit put`, `unit rm` and
// `unit revert` (a group write then starts a rollout, reconcile.Rollout,
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
	gateCmd                       string
	supersede                     bool
	reason                        string

	// name is the command ("unit put") and nothing what its refusals
	// say was written ("nothing stored"), for the errors.
	name, nothing string
	// s is the strategy the flags say, once checked: a rollout when
	// s.IsRollout().
	s reconcile.Strategy
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
		return withCode(exitUsage, fmt.Errorf("%s: --gate-cmd is run by this command while it follows the rollout: add --wait; %s", f.name, f.nothing))
	case wait && wf.skipUnreachable:
		return withCode(exitUsage, fmt.Errorf("%s: --skip-unreachable does not apply to a rollout (a member without a live agent holds its wave; `agentd hosts forget H` retires it first); %s", f.name, f.nothing))
	}
	return nil
}

// strategy parses the flags into a validated strategy; any bad value is a
// usage error (exit 2) and nothing is written.
func (f *strategyFlags) strategy() (reconcile.Strategy, error) {
	s := reconcile.Strategy{
		Soak: f.soak, ProgressDeadline: f.progressDeadline,
		PauseAfterCanary: f.pauseAfterCanary, AutoRevert: f.autoRevert,
		MaxRestarts: f.maxRestarts, GateCmd: strings.TrimSpace(f.gateCmd),
	}
	var errs []error
	count := func(flag, v string, into *reconcile.Count) {
		if v == "" {
			return
		}
		c, err := reconcile.ParseCount(flag, v)
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
			c, err := reconcile.ParseCount("--waves", part)
			if err != nil {
				errs = append(errs, fmt.Errorf("%w (in --waves %s)", err, f.waves))
				continue
			}
			s.Waves = append(s.Waves, c)
		}
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
func (f *strategyFlags) stage(ctx context.Context, reg *registry.Client, tg registry.Target, opts []registry.WriteOption, warn io.Writer) (*reconcile.Rollout, []registry.WriteOption, error) {
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
func (f *strategyFlags) newRollout(ctx context.Context, reg *registry.Client, group string, warn io.Writer) (*reconcile.Rollout, error) {
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
			strings.Join(down, ", "), group, plural(len(down), "has", "have"), plural(len(down), "it", "them"), plural(len(down), "its", "their"))
	}
	now := time.Now().UTC()
	return &reconcile.Rollout{
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
func announceRollout(ctx context.Context, out io.Writer, asJSON bool, reg *registry.Client, r *reconcile.Rollout) {
	var superseded []string
	if all, err := reg.Rollouts(ctx, r.Group); err == nil {
		for _, v := range all {
			if e := v.Rollout.End; e != nil && e.State == reconcile.RolloutSuperseded && e.Reason == "superseded by "+r.ID {
				superseded = append(superseded, v.Rollout.ID)
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

// ended says a phase is final: nobody takes the rollout any more.
func ended(s reconcile.RolloutState) bool {
	switch s {
	case reconcile.RolloutDone, reconcile.RolloutFailed, reconcile.RolloutAborted, reconcile.RolloutSuperseded:
		return true
	}
	return false
}

// reverts says the hosts that took r go back to the previous version in
// phase ph: an abort with --revert, or a failure with --auto-revert.
func reverts(r *reconcile.Rollout, ph reconcile.Phase) bool {
	if r.Abort != nil {
		return r.Abort.Revert
	}
	return ph.State == reconcile.RolloutFailed && r.Strategy.AutoRevert
}

// hostState is where host stands in v, and since when (zero: pending).
func hostState(v registry.RolloutView, host string) (reconcile.HostState, string, time.Time) {
	p := v.Progress[host]
	if p == nil {
		return reconcile.HostPending, "", time.Time{}
	}
	return p.State, p.Reason, p.Since
}

// hostsIn are v's hosts in one of states, in rollout order.
func hostsIn(v registry.RolloutView, states ...reconcile.HostState) []string {
	var out []string
	for _, h := range v.Rollout.Hosts {
		if st, _, _ := hostState(v, h); slices.Contains(states, st) {
			out = append(out, h)
		}
	}
	return out
}

// holding are the hosts that still have the change (or are taking it, or
// going back from it).
func holding(v registry.RolloutView) []string {
	return hostsIn(v, reconcile.HostApplying, reconcile.HostSoaking, reconcile.HostHealthy, reconcile.HostFailed, reconcile.HostReverting)
}

// settled says following v can stop: it ended, and when it reverts, no
// host holds the change any more.
func settled(v registry.RolloutView, ph reconcile.Phase) bool {
	if !ended(ph.State) {
		return false
	}
	if ph.State == reconcile.RolloutFailed || ph.State == reconcile.RolloutAborted {
		return !reverts(v.Rollout, ph) || len(holding(v)) == 0
	}
	return true
}

// rolloutFollow follows one rollout by polling the registry, until it is
// settled or ctx ends; show is called at every read, and with a gate
// command the gate is run when the rollout waits for it.
type rolloutFollow struct {
	reg   *registry.Client
	id    string
	every time.Duration
	show  func(v registry.RolloutView, ph reconcile.Phase, now time.Time)
	// gate runs Strategy.GateCmd (put --wait only); its output goes to
	// gateOut.
	gate    bool
	gateOut io.Writer
	say     func(v any, format string, args ...any)
}

func (f *rolloutFollow) run(ctx context.Context) (registry.RolloutView, reconcile.Phase, error) {
	var (
		v       registry.RolloutView
		ph      reconcile.Phase
		readErr error
	)
	for {
		nv, err := f.reg.Rollout(ctx, f.id)
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
			ph = v.Phase(now)
			if ph.End != nil && v.Rollout.End == nil {
				f.writeEnd(ctx, now)
			}
			f.show(v, ph, now)
			if settled(v, ph) {
				return v, ph, nil
			}
			if f.gate && ph.State == reconcile.RolloutWaitingGate {
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

// writeEnd writes the end the phase computes at now, if nobody has yet:
// whoever first sees a rollout done or failed writes it (the agents
// too), so that it stops counting as running. Best effort: a reader
// without write access leaves it to the agents.
func (f *rolloutFollow) writeEnd(ctx context.Context, now time.Time) {
	_, _ = f.reg.UpdateRollout(ctx, f.id, func(v registry.RolloutView) error {
		if v.Rollout.End != nil {
			return errNoChange
		}
		ph := v.Rollout.Phase(v.Progress, now)
		if ph.End == nil {
			return errNoChange
		}
		v.Rollout.End = ph.End
		return nil
	})
}

// runGate runs the gate command before wave (an index) of v: exit 0
// opens the wave (Rollout.Gated); anything else pauses the rollout with
// the reason, and the follow ends with exit 3.
func (f *rolloutFollow) runGate(ctx context.Context, v registry.RolloutView, wave int) error {
	r := v.Rollout
	n := strconv.Itoa(wave + 1)
	f.say(map[string]any{"event": "rollout-gate", "rollout": r.ID, "wave": wave + 1, "cmd": r.Strategy.GateCmd},
		"rollout %s: running the gate before wave %s: %s\n", r.ID, n, r.Strategy.GateCmd)
	c := exec.CommandContext(ctx, "sh", "-c", r.Strategy.GateCmd)
	c.Env = append(os.Environ(), "AGENTD_ROLLOUT="+r.ID, "AGENTD_GROUP="+r.Group, "AGENTD_WAVE="+n)
	var tail tailBuffer
	c.Stdout = io.MultiWriter(f.gateOut, &tail)
	c.Stderr = c.Stdout
	c.WaitDelay = time.Second
	runErr := c.Run()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	now := time.Now().UTC()
	if runErr == nil {
		_, err := f.reg.UpdateRollout(ctx, r.ID, func(v registry.RolloutView) error {
			if ph := v.Phase(now); ended(ph.State) {
				return errNoChange
			}
			v.Rollout.Gated = max(v.Rollout.Gated, wave)
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
	_, err := f.reg.UpdateRollout(ctx, r.ID, func(v registry.RolloutView) error {
		if ph := v.Phase(now); ended(ph.State) {
			return errNoChange
		}
		v.Rollout.Paused, v.Rollout.PauseReason, v.Rollout.PausedAt = true, reason, now
		return nil
	})
	if err != nil && !errors.Is(err, errNoChange) {
		return fmt.Errorf("%s, and the rollout could not be paused: %w", reason, err)
	}
	return withCode(exitFailed, fmt.Errorf("rollout %s paused: %s; `agentd rollout promote %s` opens wave %s anyway, `agentd rollout abort %s [--revert]` ends it",
		r.ID, reason, r.ID, n, r.ID))
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
// its end, printing each host's and the phase's changes, and exits as the rollout
// ended (0 done; 3 failed or aborted, after the revert if any; 5
// superseded; 4 on --timeout: the rollout goes on).
func followPut(ctx context.Context, reg *registry.Client, r *reconcile.Rollout, wf waitFlags, asJSON bool, out, errOut io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, wf.timeout)
	defer cancel()
	lines := &rolloutLines{out: out, json: asJSON, hosts: map[string]hostLine{}}
	f := &rolloutFollow{reg: reg, id: r.ID, every: 200 * time.Millisecond, show: lines.show,
		gate: r.Strategy.GateCmd != "", gateOut: errOut,
		say: func(v any, format string, args ...any) { say(out, asJSON, v, format, args...) }}
	v, ph, err := f.run(ctx)
	if v.Rollout == nil && err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return withCode(exitTimeout, fmt.Errorf("timed out after %s before rollout %s could be read; it goes on without this command: agentd rollout status %s --watch", wf.timeout, r.ID, r.ID))
		}
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		msg := fmt.Sprintf("timed out after %s: rollout %s is %s (%s)", wf.timeout, r.ID, describePhase(v, ph), healthyCount(v))
		if ended(ph.State) {
			msg += "; still going back to the previous version: " + strings.Join(holding(v), ", ")
		}
		return withCode(exitTimeout, errors.New(msg+"; it goes on without this command: agentd rollout status "+r.ID+" --watch"))
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("interrupted: rollout %s is %s (%s); it goes on without this command: agentd rollout status %s --watch", r.ID, describePhase(v, ph), healthyCount(v), r.ID)
	}
	if err != nil {
		return err
	}
	return rolloutVerdict(v, ph)
}

// rolloutVerdict is the exit of a follow that saw v settled in phase ph.
func rolloutVerdict(v registry.RolloutView, ph reconcile.Phase) error {
	r := v.Rollout
	switch ph.State {
	case reconcile.RolloutDone:
		return nil
	case reconcile.RolloutSuperseded:
		return withCode(exitSuperseded, fmt.Errorf("rollout %s superseded%s", r.ID, prefixed(ph.Reason)))
	}
	msg := fmt.Sprintf("rollout %s %s%s", r.ID, ph.State, prefixed(ph.Reason))
	if reverts(r, ph) {
		if back := hostsIn(v, reconcile.HostReverted); len(back) > 0 {
			msg += "; reverted to the previous version: " + strings.Join(back, ", ")
		} else {
			msg += "; no host had taken it: nothing to revert"
		}
	} else if kept := holding(v); len(kept) > 0 {
		msg += "; these hosts keep the change: " + strings.Join(kept, ", ")
	}
	return withCode(exitFailed, errors.New(msg))
}

// hostLine is what was last said of a host.
type hostLine struct {
	state  reconcile.HostState
	reason string
}

// rolloutLines prints a rollout's changes as lines (put --wait): each
// host's new state, and the phase when it changes.
type rolloutLines struct {
	out    io.Writer
	json   bool
	hosts  map[string]hostLine
	phase  string
	start  time.Time
	primed bool
}

func (l *rolloutLines) show(v registry.RolloutView, ph reconcile.Phase, now time.Time) {
	r := v.Rollout
	if !l.primed {
		l.primed, l.start = true, now
	}
	for _, h := range r.Hosts {
		st, reason, _ := hostState(v, h)
		hl := hostLine{st, reason}
		last, seen := l.hosts[h]
		if seen && last == hl || !seen && st == reconcile.HostPending {
			l.hosts[h] = hl
			continue
		}
		l.hosts[h] = hl
		say(l.out, l.json, map[string]any{"event": "rollout-host", "rollout": r.ID, "host": h, "wave": r.Wave(h) + 1, "state": st, "reason": reason,
			"elapsedMs": now.Sub(l.start).Milliseconds()},
			"%s (wave %d): %s%s\n", h, r.Wave(h)+1, st, prefixed(reason))
	}
	phase := describePhase(v, ph)
	if phase == l.phase {
		return
	}
	l.phase = phase
	healthy := len(hostsIn(v, reconcile.HostHealthy))
	say(l.out, l.json, map[string]any{"event": "rollout-phase", "rollout": r.ID, "state": ph.State, "wave": phaseWave(v, ph), "waves": len(r.WaveEnds),
		"reason": ph.Reason, "healthy": healthy, "hosts": len(r.Hosts), "elapsedMs": now.Sub(l.start).Milliseconds()},
		"rollout %s: %s (%s)\n", r.ID, phase, healthyCount(v))
}

// describePhase is "running, wave 2 of 3" with the phase's reason.
func describePhase(v registry.RolloutView, ph reconcile.Phase) string {
	return fmt.Sprintf("%s, wave %d of %d%s", ph.State, phaseWave(v, ph), len(v.Rollout.WaveEnds), prefixed(ph.Reason))
}

// phaseWave is the phase's wave counted from 1 (a rollout whose every
// wave is done is in its last).
func phaseWave(v registry.RolloutView, ph reconcile.Phase) int {
	return min(ph.Wave, len(v.Rollout.WaveEnds)-1) + 1
}

func healthyCount(v registry.RolloutView) string {
	return fmt.Sprintf("%d/%d hosts healthy", len(hostsIn(v, reconcile.HostHealthy)), len(v.Rollout.Hosts))
}

// describeStrategy is the strategy as the flags that made it.
func describeStrategy(s reconcile.Strategy) string {
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
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// rolloutSummary is one rollout as `rollout ls --json` and `rollout
// status --json` give it. Wave counts from 1.
type rolloutSummary struct {
	Rollout *reconcile.Rollout `json:"rollout"`
	Phase   struct {
		State  reconcile.RolloutState `json:"state"`
		Wave   int                    `json:"wave"`
		Waves  int                    `json:"waves"`
		Reason string                 `json:"reason,omitempty"`
	} `json:"phase"`
	Healthy int           `json:"healthy"`
	Total   int           `json:"total"`
	Hosts   []rolloutHost `json:"hosts"`
}

type rolloutHost struct {
	Host   string              `json:"host"`
	Wave   int                 `json:"wave"`
	State  reconcile.HostState `json:"state"`
	Since  time.Time           `json:"since,omitzero"`
	Reason string              `json:"reason,omitempty"`
}

func summarize(v registry.RolloutView, ph reconcile.Phase) rolloutSummary {
	r := v.Rollout
	s := rolloutSummary{Rollout: r, Total: len(r.Hosts), Hosts: []rolloutHost{}}
	s.Phase.State, s.Phase.Wave, s.Phase.Waves, s.Phase.Reason = ph.State, phaseWave(v, ph), len(r.WaveEnds), ph.Reason
	for _, h := range r.Hosts {
		st, reason, since := hostState(v, h)
		if st == reconcile.HostHealthy {
			s.Healthy++
		}
		s.Hosts = append(s.Hosts, rolloutHost{Host: h, Wave: r.Wave(h) + 1, State: st, Since: since, Reason: reason})
	}
	return s
}

// progressBar is "[########------------] 2/5 healthy, 1 soaking".
func progressBar(v registry.RolloutView) string {
	const width = 20
	total := len(v.Rollout.Hosts)
	counts := map[reconcile.HostState]int{}
	for _, h := range v.Rollout.Hosts {
		st, _, _ := hostState(v, h)
		counts[st]++
	}
	n := 0
	if total > 0 {
		n = counts[reconcile.HostHealthy] * width / total
	}
	s := "[" + strings.Repeat("#", n) + strings.Repeat("-", width-n) + "] " +
		fmt.Sprintf("%d/%d healthy", counts[reconcile.HostHealthy], total)
	for _, st := range []reconcile.HostState{reconcile.HostApplying, reconcile.HostSoaking, reconcile.HostFailed, reconcile.HostReverting, reconcile.HostReverted} {
		if counts[st] > 0 {
			s += fmt.Sprintf(", %d %s", counts[st], st)
		}
	}
	return s
}

// printRolloutStatus writes the status of one rollout: a header and a
// table of its hosts.
func printRolloutStatus(out io.Writer, v registry.RolloutView, ph reconcile.Phase, now time.Time) error {
	r := v.Rollout
	var b bytes.Buffer
	fmt.Fprintf(&b, "rollout %s of group %s: %s\n", r.ID, r.Group, strings.Join(slices.Sorted(maps.Keys(r.Units)), ", "))
	fmt.Fprintf(&b, "phase:    %s\n", describePhase(v, ph))
	fmt.Fprintf(&b, "strategy: %s\n", describeStrategy(r.Strategy))
	fmt.Fprintf(&b, "waves:    %s of %d %s\n", joinInts(r.WaveEnds), len(r.Hosts), plural(len(r.Hosts), "host", "hosts"))
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
	fmt.Fprintln(&b, progressBar(v))
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tWAVE\tSTATE\tFOR\tREASON")
	for _, h := range r.Hosts {
		st, reason, since := hostState(v, h)
		dur := "-"
		if !since.IsZero() {
			dur = ago(now.Sub(since))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", h, r.Wave(h)+1, st, dur, orDash(reason))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := b.WriteTo(out)
	return err
}

// statusSignature changes when anything `rollout status` shows changes,
// but the times.
func statusSignature(v registry.RolloutView, ph reconcile.Phase) string {
	r := v.Rollout
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%d|%s|%v|%s|%v|%v|%v", ph.State, ph.Wave, ph.Reason, r.Paused, r.PauseReason, r.Abort != nil, r.End != nil, r.Gated)
	for _, h := range r.Hosts {
		st, reason, _ := hostState(v, h)
		fmt.Fprintf(&b, "|%s=%s:%s", h, st, reason)
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
				all, err := reg.Rollouts(ctx, group)
				if err != nil {
					return err
				}
				now := time.Now()
				out := cmd.OutOrStdout()
				if asJSON {
					items := []rolloutSummary{}
					for _, v := range all {
						items = append(items, summarize(v, v.Phase(now)))
					}
					return writeJSON(out, items)
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tGROUP\tUNITS\tSTATE\tWAVE\tHEALTHY\tAGE\tBY")
				for _, v := range all {
					r, ph := v.Rollout, v.Phase(now)
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%d/%d\t%s\t%s\n", r.ID, r.Group, strings.Join(slices.Sorted(maps.Keys(r.Units)), ","),
						ph.State, phaseWave(v, ph), len(r.WaveEnds), len(hostsIn(v, reconcile.HostHealthy)), len(r.Hosts), ago(now.Sub(r.CreatedAt)), orDash(r.By))
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
	)
	cmd := &cobra.Command{
		Use:   "status ID [--watch]",
		Short: "Show a rollout: its phase, strategy and every host's state",
		Long: `Show a rollout: its phase (running, paused, waiting-promote, waiting-gate,
done, failed, aborted, superseded), strategy, who started it and why, a
progress bar, and per host its wave, state (pending, applying, soaking,
healthy, failed, reverting, reverted), the reason and the time in that state.

With --watch, show it again whenever it changes (redrawn in place on a
terminal; JSON lines with --json) until it ends (and, when it reverts, until
every host went back); then exit 0 when it is done, 3 when it failed or was
aborted, 5 when it was superseded.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				out := cmd.OutOrStdout()
				if !watch {
					v, err := reg.Rollout(ctx, args[0])
					if err != nil {
						return err
					}
					now := time.Now()
					ph := v.Phase(now)
					if asJSON {
						return writeJSON(out, summarize(v, ph))
					}
					return printRolloutStatus(out, v, ph, now)
				}
				return watchRollout(ctx, reg, args[0], out, asJSON)
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	cmd.Flags().BoolVar(&watch, "watch", false, "show it again at every change until it ends")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (with --watch, one line per change)")
	return cmd
}

// watchRollout is `rollout status --watch`.
func watchRollout(ctx context.Context, reg *registry.Client, id string, out io.Writer, asJSON bool) error {
	tty := false
	if f, ok := out.(*os.File); ok && !asJSON {
		tty = term.IsTerminal(int(f.Fd())) && os.Getenv("TERM") != "dumb"
	}
	var (
		last  string
		drawn int
		werr  error
	)
	show := func(v registry.RolloutView, ph reconcile.Phase, now time.Time) {
		sig := statusSignature(v, ph)
		if sig == last && !tty {
			return
		}
		last = sig
		switch {
		case asJSON:
			writeJSONLine(out, summarize(v, ph))
		case tty:
			var b bytes.Buffer
			werr = printRolloutStatus(&b, v, ph, now)
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
			werr = printRolloutStatus(out, v, ph, now)
		}
	}
	f := &rolloutFollow{reg: reg, id: id, every: 500 * time.Millisecond, show: show}
	v, ph, err := f.run(ctx)
	if werr != nil {
		return werr
	}
	if errors.Is(err, context.Canceled) && v.Rollout != nil {
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
	change func(v registry.RolloutView, now time.Time, by string) (msg string, err error)) *cobra.Command {
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
				v, err := reg.UpdateRollout(ctx, args[0], func(v registry.RolloutView) error {
					var err error
					msg, err = change(v, time.Now().UTC(), by)
					return err
				})
				if err != nil && !errors.Is(err, errNoChange) {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return writeJSON(out, summarize(v, v.Phase(time.Now())))
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
func refuseEnded(v registry.RolloutView, ph reconcile.Phase, verb string) error {
	if ended(ph.State) {
		return fmt.Errorf("rollout %s has ended (%s%s): nothing to %s", v.Rollout.ID, ph.State, prefixed(ph.Reason), verb)
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
		func(v registry.RolloutView, now time.Time, by string) (string, error) {
			r, ph := v.Rollout, v.Phase(now)
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
				r.ID, phaseWave(v, ph), len(r.WaveEnds), healthyCount(v), r.ID), nil
		})
}

func newRolloutResumeCmd() *cobra.Command {
	return controlCmd("resume ID", "Resume a paused rollout", "", nil,
		func(v registry.RolloutView, now time.Time, _ string) (string, error) {
			r, ph := v.Rollout, v.Phase(now)
			if err := refuseEnded(v, ph, "resume"); err != nil {
				return "", err
			}
			if !r.Paused {
				return "", fmt.Errorf("rollout %s is not paused (%s)", r.ID, describePhase(v, ph))
			}
			r.Paused, r.PauseReason, r.ResumedAt = false, "", now
			return fmt.Sprintf("rollout %s resumed at wave %d of %d", r.ID, phaseWave(v, ph), len(r.WaveEnds)), nil
		})
}

func newRolloutPromoteCmd() *cobra.Command {
	return controlCmd("promote ID", "Send a rollout on past what holds it: the canary's pause, a pause, or its gate",
		`Send a rollout on: after --pause-after-canary (waiting-promote), after a pause
(as resume), or past its gate (waiting-gate, or paused by a failed gate: the
wave opens without the gate command). Exit 1 when nothing holds it.`, nil,
		func(v registry.RolloutView, now time.Time, _ string) (string, error) {
			r, ph := v.Rollout, v.Phase(now)
			if err := refuseEnded(v, ph, "promote"); err != nil {
				return "", err
			}
			switch ph.State {
			case reconcile.RolloutWaitingPromote, reconcile.RolloutPaused, reconcile.RolloutWaitingGate:
			default:
				return "", fmt.Errorf("rollout %s is not paused (%s): nothing to promote", r.ID, describePhase(v, ph))
			}
			r.Promoted, r.Paused, r.PauseReason, r.ResumedAt = true, false, "", now
			if r.Strategy.GateCmd != "" {
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
		func(v registry.RolloutView, now time.Time, by string) (string, error) {
			r, ph := v.Rollout, v.Phase(now)
			if err := refuseEnded(v, ph, "abort"); err != nil {
				return "", err
			}
			reason := "aborted by " + by
			took := holding(v)
			what := "the hosts that took it keep it"
			if revert {
				reason += ", with --revert"
				what = "the hosts that took it go back to the previous version"
			}
			if len(took) > 0 {
				what += " (" + strings.Join(took, ", ") + ")"
			} else {
				what = "no host had taken it"
			}
			r.Abort = &reconcile.RolloutAbort{Revert: revert, At: now, By: by}
			r.End = &reconcile.RolloutEnd{State: reconcile.RolloutAborted, Reason: reason, At: now}
			return fmt.Sprintf("rollout %s aborted at wave %d of %d: no host takes it any more; %s; follow it with agentd rollout status %s --watch",
				r.ID, phaseWave(v, ph), len(r.WaveEnds), what, r.ID), nil
		})
}
