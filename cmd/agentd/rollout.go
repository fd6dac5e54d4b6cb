package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/calendar"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
	"github.com/agentd/agentd/selector"
)

// Rollouts from the CLI: the strategy flags of `unit put`, `unit rm`,
// `unit revert` and `unit edit` (a group write then starts a rollout,
// rollout.Record, written with the change in one transaction), following
// it (rollout_follow.go) and `agentd rollout …` (rollout_cmds.go). The CLI
// decides nothing: the group's coordinator moves the hosts and writes the
// phase into the summary, which the CLI reads; the CLI writes only the
// record's control fields (pause, resume, promote, abort, the gate).

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
	wavesBy, successThreshold     string
	budgetBy, after               string
	window                        string
	now                           bool
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
	fs.StringVar(&f.wavesBy, "waves-by", "", "rollout: one wave per value of the hosts' label `KEY` (sorted), or KEY=v1,v2,… in that order; the hosts without one of the values go in a last wave; instead of --canary and --waves")
	fs.StringVar(&f.successThreshold, "success-threshold", "", "rollout: a wave counts as done when `N%` of its hosts are healthy and the others failed (named); default: all of them, the first failure fails the rollout")
	fs.StringVar(&f.budgetBy, "budget-by", "", "rollout: --max-unavailable is a budget per value of the hosts' label `KEY` (--max-unavailable 1 --budget-by rack: one host per rack at once, the racks in parallel)")
	fs.StringVar(&f.after, "after", "", "rollout: begin only once the rollout `ROLLOUT|GROUP|SELECTOR` names (an ID, or the newest rollout of a group or selector target) has ended done; if it failed or was aborted, this one waits and says so")
	fs.StringVar(&f.window, "window", "", "rollout: admit hosts only inside the maintenance window `WINDOW` ('Tue 02:00-04:00 Europe/Berlin', or 'CALENDAR for DURATION'; systemd.time(7) calendar syntax, UTC without a zone); stored and staged at once")
	fs.BoolVar(&f.now, "now", false, "an emergency: apply at once though the target has a maintenance window (agentd window ls); recorded in the history")
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
		BudgetBy: strings.TrimSpace(f.budgetBy),
	}
	if f.after != "" {
		s.Follows = &rollout.Ref{Said: strings.TrimSpace(f.after)} // resolved in newRollout
	}
	if f.window != "" {
		w, err := calendar.ParseWindow(f.window)
		if err != nil {
			return s, withCode(exitUsage, fmt.Errorf("%s: --window: %w; %s", f.name, err, f.nothing))
		}
		s.Window = &w
		if f.now {
			return s, withCode(exitUsage, fmt.Errorf("%s: --now and --window: give the window, or apply at once; %s", f.name, f.nothing))
		}
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
	if f.wavesBy != "" {
		key, order, err := rollout.ParseWavesBy("--waves-by", f.wavesBy)
		if err != nil {
			errs = append(errs, err)
		}
		s.WavesBy, s.WavesByOrder = key, order
	}
	if f.successThreshold != "" {
		t, err := rollout.ParseThreshold("--success-threshold", f.successThreshold)
		if err != nil {
			errs = append(errs, err)
		}
		s.SuccessThreshold = t
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
	if tg.Group != "" && f.s.Window == nil {
		w, ok, err := reg.Window(ctx, tg.Group)
		switch {
		case err != nil:
			return nil, nil, err // a window that does not read: nothing goes out at once
		case ok && f.now:
			fmt.Fprintf(warn, "warning: --now: %s has the maintenance window %s (%s): this change goes out at once, and its history says so\n", tg, w, windowState(w, time.Now()))
			opts = append(opts, registry.Overriding("--now: outside the window "+w.String()))
		case ok:
			f.s.Window = &w // the group's window: the write is a rollout that waits for it
		}
	}
	if !f.s.IsRollout() {
		return nil, opts, nil
	}
	r, err := f.newRollout(ctx, reg, tg.Group, warn)
	if err != nil {
		return nil, nil, err
	}
	return r, append(opts, registry.WithRollout(r, f.supersede)), nil
}

// newRollout is the rollout a write of f's strategy to group starts
// (groupRollout).
func (f *strategyFlags) newRollout(ctx context.Context, reg *registry.Client, group string, warn io.Writer) (*rollout.Record, error) {
	s := f.s
	if s.Follows != nil {
		ref, err := resolveAfter(ctx, reg, s.Follows.Said, warn)
		if err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("%s: --after %s: %w; %s", f.name, s.Follows.Said, err, f.nothing))
		}
		s.Follows = ref
	}
	known, err := reg.KnownHosts(ctx)
	if err != nil {
		return nil, err
	}
	r, down := groupRollout(known, group, s, time.Now())
	if r == nil {
		return nil, fmt.Errorf("%s: no host has joined group %s: a rollout would have no host to go to (start agents with --group %s, or drop the rollout options); %s", f.name, group, group, f.nothing)
	}
	switch {
	case len(down) > 0 && s.SuccessThreshold > 0:
		fmt.Fprintf(warn, "warning: %s of group %s %s no live agent: until %s back, %s as not healthy (--success-threshold %d%%)\n",
			rollout.NameHosts(down, len(down)), group, plural(len(down), "has", "have"), plural(len(down), "it is", "they are"), plural(len(down), "it counts", "they count"), s.SuccessThreshold)
	case len(down) > 0:
		fmt.Fprintf(warn, "warning: %s of group %s %s no live agent: the rollout waits for %s in %s wave\n",
			rollout.NameHosts(down, len(down)), group, plural(len(down), "has", "have"), plural(len(down), "it", "them"), plural(len(down), "its", "their"))
	}
	if n := len(r.WaveLabels); n > 0 && strings.HasPrefix(r.WaveLabels[n-1], "(no ") {
		rest := r.WaveHosts(n - 1)
		fmt.Fprintf(warn, "warning: %s of group %s %s no %s label%s: %s in the last wave, %s\n",
			rollout.NameHosts(rest, len(rest)), group, plural(len(rest), "has", "have"), f.s.WavesBy, listedNote(f.s.WavesByOrder),
			plural(len(rest), "it goes", "they go"), r.WaveLabels[n-1])
	}
	r.By, r.Reason = storedBy(), strings.TrimSpace(f.reason)
	return r, nil
}

// resolveAfter is the rollout --after names: a rollout ID, or the newest
// rollout of a group, or of a selector target (written as at --selector).
// One that ended other than done is named in a warning: the rollout
// waits for it all the same.
func resolveAfter(ctx context.Context, reg *registry.Client, said string, warn io.Writer) (*rollout.Ref, error) {
	if said == "" {
		return nil, errors.New("an empty name (want a rollout ID, a group or a selector)")
	}
	var v rollout.View
	switch {
	case strings.HasPrefix(said, "r") && registry.ValidateName("rollout", said) == nil && !strings.ContainsAny(said, "=!( "):
		got, err := reg.Rollout(ctx, said, false)
		if err == nil {
			v = got
			break
		}
		if !errors.Is(err, registry.ErrNoRollout) {
			return nil, err
		}
		fallthrough // a group named like a rollout ID
	default:
		group, what := said, "group "+said
		if strings.ContainsAny(said, "=!( ") {
			sel, err := selector.Parse(said)
			if err != nil {
				return nil, err
			}
			group, what = registry.SelectorGroup(sel), "selector "+sel.String()+" (group "+registry.SelectorGroup(sel)+")"
		} else if err := registry.ValidateName("group", said); err != nil {
			return nil, err
		}
		all, err := reg.Rollouts(ctx, group, false)
		if err != nil {
			return nil, err
		}
		if len(all) == 0 {
			return nil, fmt.Errorf("%s has no rollout to wait for (agentd rollout ls lists them)", what)
		}
		v = all[0] // newest first
	}
	r := v.Record
	if ph := v.Phase(); ph.State.Ended() && ph.State != rollout.Done {
		fmt.Fprintf(warn, "warning: rollout %s of group %s, which --after names, ended %s%s: this rollout waits for it to end done, which it will not\n",
			r.ID, r.Group, ph.State, prefixed(ph.Reason))
	}
	return &rollout.Ref{Group: r.Group, ID: r.ID, Said: said}, nil
}

// groupRollout is the rollout a write of strategy s to group starts (its
// By and Reason left for the writer): the group's members now (known
// hosts, live or not), by name, cut into waves; down are those without a
// live agent. It is nil when no host has joined the group. `unit put
// --group G --waves …` and `agentd mirror` (a group with a rollout.toml)
// both stage their rollouts with it.
func groupRollout(known []registry.KnownHost, group string, s rollout.Strategy, now time.Time) (r *rollout.Record, down []string) {
	var hosts []string
	for _, k := range known {
		if slices.Contains(k.Groups, group) {
			hosts = append(hosts, k.Host)
			if !k.Live {
				down = append(down, k.Host)
			}
		}
	}
	if len(hosts) == 0 {
		return nil, nil
	}
	slices.Sort(hosts)
	r = &rollout.Record{
		ID: registry.NewRolloutID(now), Group: group, Strategy: s,
		Hosts: hosts, WaveEnds: s.WaveEnds(len(hosts)),
	}
	labels := make(map[string]map[string]string, len(known))
	for _, k := range known {
		labels[k.Host] = k.Labels
	}
	if s.WavesBy != "" {
		r.Hosts, r.WaveEnds, r.WaveLabels, _ = s.ByLabel(hosts, labels)
	}
	r.Buckets, r.BucketNames = s.Buckets(r.Hosts, labels)
	return r, down
}

// listedNote is " (or one of the values listed)" for --waves-by KEY=v1,….
func listedNote(order []string) string {
	if len(order) == 0 {
		return ""
	}
	return " with one of the values " + strings.Join(order, ",")
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
			if e := v.Record.End; e != nil && e.State == rollout.Superseded && e.SupersededBy == r.ID {
				superseded = append(superseded, v.Record.ID)
			}
		}
	}
	for _, id := range superseded {
		say(out, asJSON, map[string]any{"event": "rollout-superseded", "rollout": id, "by": r.ID},
			"rollout %s: superseded by %s (ended; its hosts take this one instead)\n", id, r.ID)
	}
	say(out, asJSON, map[string]any{"event": "rollout", "rollout": r.ID, "group": r.Group, "hosts": r.Hosts, "waveEnds": r.WaveEnds},
		"rollout %s: %d %s in %s %s%s%s%s; follow it with agentd rollout status %s --watch\n",
		r.ID, len(r.Hosts), plural(len(r.Hosts), "host", "hosts"), plural(len(r.WaveEnds), "wave", "waves"), joinInts(r.WaveEnds), waveLabels(r), budgetNote(r), windowNote(r, time.Now()), r.ID)
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
