package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
)

// `agentd rollout ls|status|pause|resume|promote|abort`: read the
// record and the summary, print them, and write the control fields.

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
	if s.WavesBy != "" {
		w := s.WavesBy
		if len(s.WavesByOrder) > 0 {
			w += "=" + strings.Join(s.WavesByOrder, ",")
		}
		parts = append(parts, "--waves-by "+w)
	}
	add(s.SuccessThreshold > 0, "--success-threshold %d%%", s.SuccessThreshold)
	add(s.BudgetBy != "", "--budget-by %s", s.BudgetBy)
	add(s.Follows != nil, "--after %s", s.Follows)
	add(s.Window != nil, "--window '%s'", s.Window)
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
	fmt.Fprintf(&b, "waves:    %s of %d %s%s%s\n", joinInts(r.WaveEnds), len(r.Hosts), plural(len(r.Hosts), "host", "hosts"), waveLabels(r), budgetNote(r))
	started := fmt.Sprintf("started:  %s (%s ago)", r.CreatedAt.Local().Format(time.DateTime), ago(now.Sub(r.CreatedAt)))
	if r.By != "" {
		started += " by " + r.By
	}
	if r.Reason != "" {
		started += ": " + r.Reason
	}
	fmt.Fprintln(&b, started)
	if w := r.Strategy.Window; w != nil {
		if r.OutsideWindow {
			fmt.Fprintf(&b, "window:   %s; promoted outside it by %s at %s\n", w, orDash(r.PromotedBy), r.ResumedAt.Local().Format(time.DateTime))
		} else {
			fmt.Fprintf(&b, "window:   %s; %s\n", w, windowState(*w, now))
		}
	}
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
		sel    string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "ls [--group G | --selector S]",
		Short: "List rollouts, newest first",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if sel != "" {
				tf := targetFlags{group: group, selector: sel}
				tg, err := tf.target()
				if err != nil {
					return err
				}
				group = tg.Group
			}
			if err := groupFilter(group); err != nil {
				return err
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
	cmd.Flags().StringVar(&sel, "selector", "", "only the rollouts of this selector target (unit put --selector)")
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
(as resume), past its gate (waiting-gate, or paused by a failed gate: the
wave opens without the gate, be it a command, --gate-url or --gate-prom), or
outside its maintenance window (waiting-window: an emergency; it goes on
outside the window from now on, and rollout status says who let it).
Exit 1 when nothing holds it.`, nil,
		func(v rollout.View, now time.Time, _ string) (string, error) {
			r, ph := v.Record, v.Phase()
			if err := refuseEnded(v, ph, "promote"); err != nil {
				return "", err
			}
			switch ph.State {
			case rollout.WaitingWindow:
				// An emergency: it goes on outside its window from now on.
				r.OutsideWindow, r.PromotedBy, r.ResumedAt = true, storedBy(), now
				return fmt.Sprintf("rollout %s promoted outside its window (%s): wave %d of %d goes on now", r.ID, r.Strategy.Window, phaseWave(v, ph), len(r.WaveEnds)), nil
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
				what += " (" + v.Summary.Named(rollout.HoldingStates...) + ")"
			} else if v.Summary != nil {
				what = "no host had taken it"
			}
			r.Abort = &rollout.Abort{Revert: revert, At: now, By: by}
			r.End = &rollout.End{State: rollout.Aborted, Reason: reason, At: now, Wave: phaseWave(v, ph)}
			return fmt.Sprintf("rollout %s aborted at wave %d of %d: no host takes it any more; %s; follow it with agentd rollout status %s --watch",
				r.ID, phaseWave(v, ph), len(r.WaveEnds), what, r.ID), nil
		})
}
