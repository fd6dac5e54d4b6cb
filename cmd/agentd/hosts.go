package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

func newHostsCmd() *cobra.Command {
	var (
		ef     etcdFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "hosts",
		Short: "List the hosts that joined the registry, live or not, with their units' convergence",
		Long: `List every host that has joined the registry: those whose agent is up
(its lease-bound membership key) and those whose agent is down (their
member record stays until "agentd hosts forget H"). A group --wait waits
for all of them.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				reg.SetLogger(cliWarnings(cmd.ErrOrStderr())) // keys skipped as garbage
				rows, err := readHostRows(ctx, reg)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), rows)
				}
				return printHostRows(cmd.OutOrStdout(), rows)
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(newHostsForgetCmd())
	return cmd
}

// hostRow is one line of `agentd hosts`: a host that joined, and for a
// live one how many of its units are converged, pending and failed.
type hostRow struct {
	registry.KnownHost
	Converged int `json:"converged"`
	Pending   int `json:"pending"`
	Failed    int `json:"failed"`
}

// readHostRows reads every known host and judges the statuses of the live
// ones (reconcile.JudgeStatus).
func readHostRows(ctx context.Context, reg *registry.Client) ([]hostRow, error) {
	known, err := reg.KnownHosts(ctx)
	if err != nil {
		return nil, err
	}
	rows := []hostRow{}
	for _, k := range known {
		r := hostRow{KnownHost: k}
		if k.Live {
			st, err := reg.Statuses(ctx, k.Host)
			if err != nil {
				return nil, err
			}
			for _, s := range st {
				switch reconcile.JudgeStatus(s) {
				case reconcile.Failed:
					r.Failed++
				case reconcile.Pending:
					r.Pending++
				default:
					r.Converged++
				}
			}
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func printHostRows(out io.Writer, rows []hostRow) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tAGENT\tGROUPS\tVERSION\tUNITS OK/PENDING/FAILED\tMACHINE-ID\tSTARTED")
	for _, r := range rows {
		agent, units := "live", fmt.Sprintf("%d/%d/%d", r.Converged, r.Pending, r.Failed)
		if !r.Live {
			agent, units = "down, last seen "+ago(time.Since(r.LastSeen))+" ago", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Host, agent, strings.Join(r.Groups, ","), r.Version,
			units, short(r.MachineID), r.StartedAt.Format(time.RFC3339))
	}
	return tw.Flush()
}

func newHostsForgetCmd() *cobra.Command {
	var ef etcdFlags
	cmd := &cobra.Command{
		Use:   "forget HOST...",
		Short: "Retire hosts: they no longer count as members of their groups (refused while a host's agent is up)",
		Args:  usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				var errs []error
				for _, h := range args {
					if err := reg.ForgetHost(ctx, h); err != nil {
						errs = append(errs, err)
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "forgot %s\n", h)
				}
				return errors.Join(errs...)
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	return cmd
}
