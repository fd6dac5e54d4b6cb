package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/calendar"
	"github.com/agentd/agentd/registry"
)

// Maintenance windows of targets (registry/windows.go): `agentd window
// set|rm|ls`. A group's window makes every staged write to it a rollout
// that admits hosts only inside the window (strategyFlags.stage); `--now`
// passes over it, and the history says so.

func newWindowCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "window",
		Short: "Set, remove and list the maintenance windows of groups and selector targets",
		Long: `A group (or selector target) with a maintenance window takes a change only
inside it: "unit put", "rm", "revert" and "edit" to it (and the git mirror's
commits) store and stage the change at once, as a rollout that admits hosts
only while the window is open; outside it the rollout says "waiting for window
Tue 02:00 CET (in 3 h 12 min)" ("rollout status", "--wait", each host's
"agentd status"). "--now" on the write applies it at once, for an emergency,
and its history records that; "agentd rollout promote ID" lets a waiting
rollout go on outside its window.

A window is a systemd calendar event (systemd.time(7); "systemd-analyze
calendar" reads the same), a length and a time zone:
  'Tue 02:00-04:00 Europe/Berlin'          an end time (next day if earlier)
  'Sat *-*-01 00:00 Europe/Berlin for 4h'  a length
Without a zone the window is in UTC.`,
	}
	cmd.AddCommand(newWindowSetCmd(), newWindowRmCmd(), newWindowLsCmd())
	return cmd
}

// windowState is where w stands at now, as a clause: "opens Tue 02:00
// CET (in 3 h 12 min)", "open until 04:00 CET", "never opens again".
func windowState(w calendar.Window, now time.Time) string {
	if open, opens, _ := w.Open(now); !open && !opens.IsZero() {
		return "opens " + w.Describe(now)
	}
	return w.Describe(now)
}

// windowGroup is the group --group or --selector names; a host has no
// window (a write to one host is not staged).
func windowGroup(tf *targetFlags) (registry.Target, error) {
	tg, err := tf.target()
	if err != nil {
		return tg, err
	}
	if tg.Group == "" {
		return tg, withCode(exitUsage, fmt.Errorf("%s: a window is a group's or a selector's (a change to one host is not staged); use --group G or --selector S", tg))
	}
	return tg, nil
}

func newWindowSetCmd() *cobra.Command {
	var (
		ef etcdFlags
		tf targetFlags
	)
	cmd := &cobra.Command{
		Use:   "set WINDOW (--group G | --selector S)",
		Short: "Give a group or selector target a maintenance window (replacing its window)",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tg, err := windowGroup(&tf)
			if err != nil {
				return err
			}
			w, err := calendar.ParseWindow(args[0])
			if err != nil {
				return withCode(exitUsage, fmt.Errorf("window set: %w; nothing stored", err))
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				if err := reg.SetWindow(ctx, tg.Group, w); err != nil {
					return writeError(err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: window %s; %s; changes to it wait for it (--now passes over it)\n",
					tf.describe(tg), w, windowState(w, time.Now()))
				return nil
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	tf.bind(cmd)
	return cmd
}

func newWindowRmCmd() *cobra.Command {
	var (
		ef etcdFlags
		tf targetFlags
	)
	cmd := &cobra.Command{
		Use:   "rm (--group G | --selector S)",
		Short: "Remove a target's maintenance window (rollouts started with it keep it)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			tg, err := windowGroup(&tf)
			if err != nil {
				return err
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				had, err := reg.RemoveWindow(ctx, tg.Group)
				if err != nil {
					return writeError(err)
				}
				if !had {
					return fmt.Errorf("%s has no window", tf.describe(tg))
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: window removed; the rollouts started while it was set keep it (agentd rollout promote ID lets one go on)\n", tf.describe(tg))
				return nil
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	tf.bind(cmd)
	return cmd
}

// windowRow is one window of `window ls --json`.
type windowRow struct {
	group    string
	Target   string `json:"target"`
	Selector string `json:"selector,omitempty"`
	Window   string `json:"window,omitempty"`
	Open     bool   `json:"open"`
	Opens    string `json:"opens,omitempty"`  // RFC 3339, when closed
	Closes   string `json:"closes,omitempty"` // RFC 3339, when open
	Says     string `json:"says"`
	Error    string `json:"error,omitempty"`
}

func newWindowLsCmd() *cobra.Command {
	var (
		ef     etcdFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "ls [--json]",
		Short: "List the maintenance windows, each open or when it opens",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				ws, bad, err := reg.Windows(ctx)
				if err != nil {
					return err
				}
				sels, _, err := reg.Selectors(ctx)
				if err != nil {
					return err
				}
				now := time.Now()
				var rows []windowRow
				for g, w := range ws {
					open, opens, closes := w.Open(now)
					row := windowRow{group: g, Target: registry.Target{Group: g}.String(), Window: w.String(), Open: open, Says: w.Describe(now)}
					if open {
						row.Closes = closes.Format(time.RFC3339)
					} else if !opens.IsZero() {
						row.Opens = opens.Format(time.RFC3339)
					}
					rows = append(rows, row)
				}
				for g, e := range bad {
					rows = append(rows, windowRow{group: g, Target: registry.Target{Group: g}.String(), Says: "does not read", Error: e.Error()})
				}
				for i := range rows {
					if s, ok := sels[rows[i].group]; ok {
						rows[i].Selector = s.String()
					}
				}
				slices.SortFunc(rows, func(a, b windowRow) int { return strings.Compare(a.Target, b.Target) })
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), rows)
				}
				if len(rows) == 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "no target has a window")
					return nil
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "TARGET\tWINDOW\tNOW")
				for _, r := range rows {
					target := r.Target
					if r.Selector != "" {
						target += " (selector '" + r.Selector + "')"
					}
					says := r.Says
					if r.Error != "" {
						says += ": " + r.Error
					} else if !r.Open {
						says = "closed; opens " + says
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\n", target, orDash(r.Window), says)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				if len(bad) > 0 {
					return errors.New("a window record does not read: agentd window set or rm mends it")
				}
				return nil
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
