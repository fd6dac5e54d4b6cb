package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
)

// Following a rollout from the CLI (put --wait, rollout status --watch,
// resume): the record and the summary read, never every host's progress,
// and the gate command run between waves.

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
			msg += "; still going back to the previous version: " + v.Summary.Named(rollout.HoldingStates...)
		}
		return withCode(exitTimeout, errors.New(msg+"; "+goesOn(r)))
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("interrupted: rollout %s is %s (%s); %s", r.ID, describePhase(v, ph), counters(v), goesOn(r))
	}
	if err != nil {
		return err
	}
	return rolloutVerdict(v, ph)
}

// goesOn says what becomes of r once this command stops following it: it
// goes on, but past a gate command only if a command runs it.
func goesOn(r *rollout.Record) string {
	if r.Strategy.GateCmd != "" {
		return "it goes on without this command up to its next gate, which no command runs then: `agentd rollout resume " + r.ID +
			"` runs the gate and follows it, `agentd rollout promote " + r.ID + "` skips it"
	}
	return "it goes on without this command: agentd rollout status " + r.ID + " --watch"
}

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
	out     io.Writer
	json    bool
	tty     bool
	last    string // what the last line said (for a window's wait: without its countdown)
	pending string // a counters line not printed yet (rate limit)
	printed time.Time
	drawn   bool
	said    map[string]string // offender → reason said
	start   time.Time
	primed  bool
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
	if v.Coordinator == "" && !ph.State.Ended() {
		// Said, not waited on in silence: nothing moves until an agent
		// of the group runs (and is elected).
		line += " · no coordinator for group " + r.Group
		if v.Summary != nil {
			line += " (its last summary " + ago(now.Sub(v.Summary.At)) + " ago)"
		}
	}
	key := line
	if ph.State == rollout.WaitingWindow && !l.tty {
		// The countdown alone ("in 3 h 12 min") is no news for a log: a
		// line when the phase or the counts move, not every minute.
		key = fmt.Sprintf("%s %d %s %s", ph.State, ph.Wave, counters(v), v.Coordinator)
	}
	if key == l.last {
		return
	}
	l.last = key
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
	w := phaseWave(v, ph)
	return fmt.Sprintf("%s, wave %d of %d%s%s", ph.State, w, len(v.Record.WaveEnds), labelOf(v.Record, w-1), prefixed(ph.Reason))
}

// labelOf is " (rack=r2)" for wave w (from 0) of a rollout by label.
func labelOf(r *rollout.Record, w int) string {
	if name := r.WaveName(w); name != "" {
		return " (" + name + ")"
	}
	return ""
}

// waveLabels is " by label: rack=r1, rack=r2, (no rack)" for a rollout by
// label.
func waveLabels(r *rollout.Record) string {
	if len(r.WaveLabels) == 0 {
		return ""
	}
	return " by label: " + strings.Join(r.WaveLabels, ", ")
}

// budgetNote is "; at most 1 at once per rack (rack=r1, rack=r2)" for a
// rollout with a budget by label.
func budgetNote(r *rollout.Record) string {
	s := r.Strategy
	if s.BudgetBy == "" {
		return ""
	}
	return fmt.Sprintf("; at most %s at once per %s (%s)", s.MaxUnavailable, s.BudgetBy, strings.Join(r.BucketNames, ", "))
}

// windowNote is "; only inside the window Tue *-*-* 02:00:00 … (opens Tue
// 02:00 CET (in 3 h 12 min))" for a rollout with a window.
func windowNote(r *rollout.Record, now time.Time) string {
	w := r.Strategy.Window
	if w == nil {
		return ""
	}
	return fmt.Sprintf("; only inside the window %s (%s)", w, windowState(*w, now))
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
