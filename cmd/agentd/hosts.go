package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/selector"
)

func newHostsCmd() *cobra.Command {
	var (
		ef     etcdFlags
		asJSON bool
		group  string
		sel    string
	)
	cmd := &cobra.Command{
		Use:   "hosts [--group G] [--selector S]",
		Short: "List the hosts that joined the registry, live or not, with their units' convergence",
		Long: `List every host that has joined the registry (or, with --group, the members
of one group): those whose agent is up (its lease-bound membership key) and
those whose agent is down (their member record stays until "agentd hosts
forget H"). A group --wait waits for all of them. The first line counts them;
RUNS is what each runs: its units and the version (hash) of each.

LABELS are the host's labels: those given to its agent (agentd run --label
K=V, and its --labels-file as it last accepted it), then the facts the agent read off the host (arch, hostname, os.id,
os.version_id, systemd.version), shortened to fit; --json has them all.
--selector picks hosts by them, in Kubernetes' label selector syntax:
comma-separated requirements that must all hold, each k=v (or k==v), k!=v
(also true of a host without k), k in (a,b), k notin (a,b), k (has the
label), !k (has it not). A host that is down is judged by the labels of its
last record.`,
		Example: `  agentd hosts --selector env=prod
  agentd hosts --group web --selector 'arch=arm64,rack in (r12,r13),!drain'
  agentd hosts --selector 'os.id=debian,os.version_id!=12' --json | jq -r '.[].host'`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := groupFilter(group); err != nil {
				return err
			}
			s, err := selector.Parse(sel)
			if err != nil {
				return withCode(exitUsage, fmt.Errorf("--selector %q: %w", sel, err))
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				reg.SetLogger(cliWarnings(cmd.ErrOrStderr())) // keys skipped as garbage
				rows, err := readHostRows(ctx, reg, group, s)
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
	cmd.Flags().StringVar(&group, "group", "", "only the members of this group")
	cmd.Flags().StringVar(&sel, "selector", "", "only the hosts whose labels match this selector, e.g. 'env=prod,arch in (amd64,arm64)'")
	cmd.AddCommand(newHostsForgetCmd())
	return cmd
}

// groupFilter checks an optional --group (of `hosts`, `locks`, `rollout
// ls`): "" is every group; a bad name is a usage error (exit 2).
func groupFilter(group string) error {
	if group == "" {
		return nil
	}
	if err := registry.ValidateName("group", group); err != nil {
		return withCode(exitUsage, fmt.Errorf("--group: %w", err))
	}
	return nil
}

// hostRow is one line of `agentd hosts`: a host that joined, and for a
// live one how many of its units are converged, pending and failed.
type hostRow struct {
	registry.KnownHost
	Converged int `json:"converged"`
	Pending   int `json:"pending"`
	Failed    int `json:"failed"`
	// Runs is each unit's local version (hash), by unit.
	Runs map[string]string `json:"runs,omitempty"`
}

// readHostRows reads every known host (of group, when not "", and whose
// labels match sel) and judges the statuses of the live ones
// (reconcile.StandingOf), read in one transaction per 1,000 hosts.
func readHostRows(ctx context.Context, reg *registry.Client, group string, sel selector.Selector) ([]hostRow, error) {
	all, err := reg.KnownHosts(ctx)
	if err != nil {
		return nil, err
	}
	known := slices.DeleteFunc(all, func(k registry.KnownHost) bool {
		return group != "" && !slices.Contains(k.Groups, group) || !sel.Matches(k.Labels)
	})
	var live []string
	for _, k := range known {
		if k.Live {
			live = append(live, k.Host)
		}
	}
	reports, err := reg.Reports(ctx, live)
	if err != nil {
		return nil, err
	}
	rows := []hostRow{}
	for _, k := range known {
		r := hostRow{KnownHost: k}
		if k.Live {
			st := reports[k.Host].Statuses
			if len(st) > 0 {
				r.Runs = map[string]string{}
			}
			for _, s := range st {
				r.Runs[s.Unit] = s.Hash
				switch reconcile.StandingOf(s) {
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

// labelsWidth is how wide the LABELS column of `agentd hosts` grows before
// the rest of a host's labels are only counted.
const labelsWidth = 48

func printHostRows(out io.Writer, rows []hostRow) error {
	var live, down, ok, pending, failed int
	for _, r := range rows {
		if r.Live {
			live++
		} else {
			down++
		}
		ok, pending, failed = ok+r.Converged, pending+r.Pending, failed+r.Failed
	}
	fmt.Fprintf(out, "%d %s · %d live · %d down · units %d ok · %d pending · %d failed\n",
		len(rows), plural(len(rows), "host", "hosts"), live, down, ok, pending, failed)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tAGENT\tGROUPS\tLABELS\tVERSION\tUNITS OK/PENDING/FAILED\tRUNS\tMACHINE-ID\tSTARTED")
	for _, r := range rows {
		agent, units := "live", fmt.Sprintf("%d/%d/%d", r.Converged, r.Pending, r.Failed)
		if !r.Live {
			agent, units = "down, last seen "+ago(time.Since(r.LastSeen))+" ago", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Host, agent, strings.Join(r.Groups, ","), describeLabels(r.Labels, labelsWidth), r.Version,
			units, describeRuns(r.Runs), short(r.MachineID), r.StartedAt.Format(time.RFC3339))
	}
	return tw.Flush()
}

// describeRuns is "web.service@5e1f0c9a, worker.service@77ab01c2 +3": the
// first two units and the version of each, and how many more.
func describeRuns(runs map[string]string) string {
	if len(runs) == 0 {
		return "-"
	}
	units := slices.Sorted(maps.Keys(runs))
	var parts []string
	for _, u := range units[:min(2, len(units))] {
		parts = append(parts, u+"@"+orDash(short(runs[u])))
	}
	s := strings.Join(parts, ", ")
	if len(units) > 2 {
		s += fmt.Sprintf(" +%d", len(units)-2)
	}
	return s
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
