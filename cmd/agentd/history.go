package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// storedBy is who the CLI says stores a version: "user@host".
func storedBy() string {
	name := strconv.Itoa(os.Getuid())
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return name + "@" + host
}

// keepValue is --keep: an integer ≥ 1 (a flag error, exit 2, otherwise).
type keepValue int

func (k *keepValue) String() string { return strconv.Itoa(int(*k)) }
func (k *keepValue) Type() string   { return "int" }
func (k *keepValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return fmt.Errorf("want a number of versions ≥ 1, got %q", s)
	}
	*k = keepValue(n)
	return nil
}

// bindKeep adds --keep to a command that stores versions (put, rm, revert).
func bindKeep(cmd *cobra.Command) {
	k := keepValue(registry.DefaultKeep)
	cmd.Flags().Var(&k, "keep", "versions of each key kept in the registry's history, this one included")
}

// writeOptions are the registry options of every command that stores
// versions: who stores them, and --keep when the command has it.
func writeOptions(cmd *cobra.Command) []registry.WriteOption {
	opts := []registry.WriteOption{registry.StoredBy(storedBy())}
	if f := cmd.Flags().Lookup("keep"); f != nil {
		if k, ok := f.Value.(*keepValue); ok {
			opts = append(opts, registry.KeepVersions(int(*k)))
		}
	}
	return opts
}

func newUnitHistoryCmd() *cobra.Command {
	var (
		ef     etcdFlags
		tf     targetFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "history UNIT (--host H | --group G)",
		Short: "List the kept versions of a unit key (unit file or drop-in)",
		Long: `List the versions of one unit key kept in the registry, oldest first: the etcd
revision that stored it, when, its hash and size, and who stored it (user@host
of the agentd command). A removal is a version too. Every "unit put", "unit rm"
and "unit revert" keeps the newest --keep (default 10) versions of each key it
writes, under <prefix>/history/, whatever etcd compaction does.

UNIT is a unit key: "hello.service", or a drop-in "hello.service.d/x.conf".`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tg, err := tf.target()
			if err != nil {
				return err
			}
			if err := registry.ValidateUnit(args[0]); err != nil {
				return withCode(exitUsage, fmt.Errorf("unit history: %w", err))
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				reg.SetLogger(cliWarnings(cmd.ErrOrStderr()))
				h, err := reg.History(ctx, tg, args[0])
				if err != nil {
					return err
				}
				cur := h.CurrentIndex()
				out := cmd.OutOrStdout()
				if asJSON {
					type item struct {
						registry.Version
						Current bool `json:"current"`
					}
					items := []item{}
					for i, v := range h.Versions {
						items = append(items, item{v, i == cur})
					}
					return writeJSON(out, map[string]any{"key": tg.String() + "/units/" + args[0], "exists": h.Exists, "modRevision": h.ModRevision, "versions": items})
				}
				if len(h.Versions) == 0 {
					fmt.Fprintf(out, "no history kept for %s/units/%s\n", tg, args[0])
					return nil
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "REVISION\tTIME\tHASH\tSIZE\tUSER\t")
				for i, v := range h.Versions {
					hash, size, note := short(v.Hash), strconv.Itoa(v.Size), ""
					if v.Removed {
						hash, size = "(removed)", "-"
					}
					if i == cur {
						note = "current"
					}
					who := v.User
					if who == "" {
						who = "-"
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", v.Revision, v.Time.Local().Format(time.DateTime), hash, size, who, note)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				if cur < 0 {
					what := "holds content"
					if !h.Exists {
						what = "was removed"
					}
					fmt.Fprintf(out, "note: the key now %s not stored by agentd (etcdctl?), revision %d\n", what, h.ModRevision)
				}
				return nil
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	tf.bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newUnitRevertCmd() *cobra.Command {
	var (
		ef              etcdFlags
		tf              targetFlags
		to              int64
		wait            bool
		timeout         time.Duration
		skipUnreachable bool
		asJSON          bool
	)
	cmd := &cobra.Command{
		Use:   "revert UNIT (--host H | --group G) [--to REVISION] [--wait]",
		Short: "Put back the previous version of a unit key, or the one stored at --to",
		Long: `Put back a kept version of one unit key (see "agentd unit history"): the one
before the current, or the one stored at --to REVISION. It is stored like
"unit put" stores a file — MaxUnavailable=, HealthySec=, rollback and halts
apply, and the history records it as a new version; a version that was a
removal is removed like "unit rm". It fails, storing nothing, if someone
changes the key meanwhile.

Putting back the content the key already holds is a no-op: said so, nothing
stored, exit 0. A revision that is not kept, or no history at all, is an
error (exit 1). --wait as for put: exit 3 when a host fails, 4 on --timeout.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			unit := args[0]
			tg, err := tf.target()
			if err != nil {
				return err
			}
			if err := registry.ValidateUnit(unit); err != nil {
				return withCode(exitUsage, fmt.Errorf("unit revert: %w", err))
			}
			if cmd.Flags().Changed("to") && to < 1 {
				return withCode(exitUsage, fmt.Errorf("unit revert: --to %d: want a revision shown by agentd unit history", to))
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				reg.SetLogger(cliWarnings(cmd.ErrOrStderr()))
				h, err := reg.History(ctx, tg, unit)
				if err != nil {
					return err
				}
				var v registry.Version
				if cmd.Flags().Changed("to") {
					v, err = h.At(to)
				} else {
					v, err = h.Previous()
				}
				if err != nil {
					return fmt.Errorf("unit revert: %w", err)
				}
				key := tg.String() + "/units/" + unit
				out := cmd.OutOrStdout()
				if h.Is(v) {
					if asJSON {
						writeJSONLine(out, map[string]any{"event": "unchanged", "key": key, "revision": v.Revision, "hash": v.Hash, "removed": v.Removed})
					} else {
						fmt.Fprintf(out, "%s already holds the content of revision %d%s: nothing stored\n", key, v.Revision, describe(v))
					}
					return nil
				}
				opts := append(writeOptions(cmd), registry.IfModRevision(unit, h.ModRevision))
				var rev int64
				if v.Removed {
					rev, err = reg.Remove(ctx, tg, []string{unit}, opts...)
				} else {
					rev, err = reg.Put(ctx, tg, map[string][]byte{unit: v.Content}, opts...)
				}
				if errors.Is(err, registry.ErrConflict) {
					return fmt.Errorf("unit revert: %w; look at agentd unit history again", err)
				}
				if err != nil {
					return writeError(err)
				}
				if asJSON {
					writeJSONLine(out, map[string]any{"event": "reverted", "key": key, "to": v.Revision, "hash": v.Hash, "removed": v.Removed, "revision": rev})
				} else {
					fmt.Fprintf(out, "reverted %s to revision %d%s: stored as revision %d\n", key, v.Revision, describe(v), rev)
				}
				if !wait {
					return nil
				}
				return waitConverged(ctx, reg, waitSpec{target: tg, units: map[string][]byte{unit: v.Content}, removing: v.Removed, revision: rev, timeout: timeout, json: asJSON, skipUnreachable: skipUnreachable}, out)
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	tf.bind(cmd)
	bindKeep(cmd)
	cmd.Flags().Int64Var(&to, "to", 0, "the revision to put back (default: the version before the current)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until every targeted host runs the reverted version")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "give up waiting after this long (exit 4)")
	bindSkipUnreachable(cmd, &skipUnreachable)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON lines")
	return cmd
}

// describe is " (hash …)" or " (a removal)" for a version.
func describe(v registry.Version) string {
	if v.Removed {
		return " (a removal)"
	}
	return " (hash " + short(reconcile.Hash(v.Content)) + ")"
}
