package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/rollout"
)

// socketFlag binds --debug-socket with the agent's default for the mode.
func socketFlag(cmd *cobra.Command, path *string, user *bool) {
	cmd.Flags().StringVar(path, "debug-socket", "", "the agent's debug socket (default /run/agentd/agentd.sock as root, $XDG_RUNTIME_DIR/agentd.sock otherwise or with --user)")
	cmd.Flags().BoolVar(user, "user", false, "talk to the agent of the user's systemd instance (the default for users other than root)")
}

func resolveSocket(path string, user bool) string {
	if path != "" {
		return path
	}
	o := &runOptions{user: clientUserMode(user), host: "x"}
	_ = o.defaults()
	return o.debugSocket
}

func newStatusCmd() *cobra.Command {
	var (
		sock   string
		user   bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every unit's state as the running agent sees it",
		Long: `Show every unit's state as the running agent sees it: a table of its units,
then each unit's last health probe result, then one line per rollout of the
host's groups that runs (see "agentd rollout"): its units, its state (running,
paused, or how it ended), where this host stands in it and for how long, and
this host's wave, e.g.

  web.service: rollout r20251204-101500-1a2b3c4d running, this host soaking (12 s of 30 s) in wave 2 of 3 (5 hosts)

An agent sees only its own progress: "agentd rollout status ID" shows the
whole rollout (its open wave, how many hosts are healthy).

Last, the host's labels as the agent publishes them (given, then facts), and
whether the labels file (agentd run --labels-file) is refused as it is now:

  labels env=prod,rack=r1,arch=amd64,hostname=web-01,… (labels file /etc/agentd/labels)
  labels file refused, the labels above are those from before its change: /etc/agentd/labels:3: …`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := control.NewClient(resolveSocket(sock, user)).Status(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, r)
			}
			fmt.Fprintf(out, "host %s, registry revision %d\n", r.Host, r.Revision)
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "UNIT\tREGISTRY\tLOCAL\tSTATE\tLAST ACTION\tRESULT\tERROR")
			for _, s := range r.Units {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%s\t%s\t%s\t%s\n", s.Unit, orDash(short(s.DesiredHash)), orDash(short(s.Hash)),
					orDash(s.ActiveState), orDash(s.SubState), orDash(string(s.Action))+bucketSuffix(s.SlotBucket), orDash(string(s.Result)), s.Error)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			// Health probes ([X-Agentd] HealthCmd=, HealthURL=, HealthTCP=):
			// each unit's last result, below the table.
			for _, s := range r.Units {
				if s.Probe != "" {
					fmt.Fprintf(out, "%s health probe (%s): %s\n", s.Unit, orDash(string(s.Health)), s.Probe)
				}
			}
			// Changes awaiting their confirmation ([X-Agentd] ConfirmSec=).
			for _, s := range r.Units {
				if s.Confirming {
					fmt.Fprintf(out, "%s: awaiting its confirmation: the agent must reach the registry within ConfirmSec=, or it puts the previous version back\n", s.Unit)
				}
			}
			// The rollouts running (an agent older than them says none).
			now := time.Now()
			for _, ri := range r.Rollouts {
				fmt.Fprintln(out, rolloutLine(ri, now))
			}
			// The labels (an agent older than them says nothing).
			if l := r.Labels; l != nil {
				fmt.Fprintln(out, labelsLine(l))
				if l.FileRefused != "" {
					fmt.Fprintf(out, "labels file refused, the labels above are those from before its change: %s\n", l.FileRefused)
				}
			}
			return nil
		},
	}
	socketFlag(cmd, &sock, &user)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newSyncCmd() *cobra.Command {
	var (
		sock   string
		user   bool
		asJSON bool
		dry    bool
	)
	cmd := &cobra.Command{
		Use:   "sync [--dry-run]",
		Short: "Run a reconcile pass now (or, with --dry-run, only print its plan)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := control.NewClient(resolveSocket(sock, user)).Sync(cmd.Context(), dry)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, r)
			}
			if len(r.Plan) == 0 {
				fmt.Fprintln(out, "nothing to do: every unit is converged")
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "UNIT\tACTION\tREASON")
			for _, it := range r.Plan {
				reason := it.Reason
				if it.Error != "" {
					reason = it.Error
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", it.Unit, it.Action, reason)
			}
			return tw.Flush()
		},
	}
	socketFlag(cmd, &sock, &user)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&dry, "dry-run", false, "print the plan without changing anything")
	return cmd
}

func newDiffCmd() *cobra.Command {
	var (
		sock   string
		user   bool
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "diff [UNIT]",
		Short: "Show a unified diff between the registry copy and the local file",
		Args:  usageArgs(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			unit := ""
			if len(args) == 1 {
				unit = args[0]
			}
			ds, err := control.NewClient(resolveSocket(sock, user)).Diff(cmd.Context(), unit)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, ds)
			}
			for _, d := range ds {
				switch {
				case d.RegistryError != "":
					fmt.Fprintf(out, "%s: invalid in the registry: %s\n", d.Path, d.RegistryError)
				case d.LocalReadErr != "":
					fmt.Fprintf(out, "%s: cannot read the local file: %s\n", d.Path, d.LocalReadErr)
				default:
					fmt.Fprint(out, control.UnifiedDiff("registry/"+d.Path, "local/"+d.Path, d.Registry, d.Local))
				}
			}
			return nil
		},
	}
	socketFlag(cmd, &sock, &user)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// rolloutLine is one running rollout as `agentd status` shows it: its
// units, its state, where this host stands and in which wave, and why
// when it waits or failed, e.g.
//
//	web.service: rollout r… running, this host soaking (12 s of 30 s) in wave 2 of 3 (5 hosts)
//
// An agent sees only its own progress: `agentd rollout status` counts the
// others (the open wave, how many are healthy).
func rolloutLine(ri control.RolloutInfo, now time.Time) string {
	var host string
	switch ri.HostState {
	case "":
		host = fmt.Sprintf("this host not one of its %d %s yet (it joined the group since: it goes into the last wave)", ri.Hosts, plural(ri.Hosts, "host", "hosts"))
	case rollout.HostPending:
		host = "this host pending"
	case rollout.HostSoaking:
		host = fmt.Sprintf("this host soaking (%s of %s)", ago(now.Sub(ri.HostSince)), ago(ri.Soak))
	default:
		host = fmt.Sprintf("this host %s (%s)", ri.HostState, ago(now.Sub(ri.HostSince)))
	}
	if ri.HostWave > 0 {
		host += fmt.Sprintf(" in wave %d of %d (%d %s)", ri.HostWave, ri.Waves, ri.Hosts, plural(ri.Hosts, "host", "hosts"))
	}
	var why []string
	if ri.Reason != "" {
		why = append(why, ri.Reason)
	}
	if ri.HostReason != "" && ri.HostState == rollout.HostFailed {
		why = append(why, "this host: "+ri.HostReason)
	}
	line := fmt.Sprintf("%s: rollout %s %s, %s", strings.Join(ri.Units, ", "), ri.ID, ri.State, host)
	if len(why) > 0 {
		line += " — " + strings.Join(why, "; ")
	}
	return line
}
