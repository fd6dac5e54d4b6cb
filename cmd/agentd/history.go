package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
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

// reasonHelp is the help of --reason, on every command that stores
// versions (put: strategyFlags binds it, for rollouts too).
const reasonHelp = "`TEXT` saying why (Kubernetes' change-cause): kept with every version this stores (unit history shows it); " +
	"a rollout's record keeps it too (rollout status shows it)"

// reasonFlag is --reason, trimmed and checked (registry.ValidateReason):
// a bad one is a usage error (exit 2), before anything is read or stored.
func reasonFlag(cmd *cobra.Command) (string, error) {
	f := cmd.Flags().Lookup("reason")
	if f == nil {
		return "", nil
	}
	why := strings.TrimSpace(f.Value.String())
	if err := registry.ValidateReason(why); err != nil {
		return "", withCode(exitUsage, fmt.Errorf("%s: --reason: %w; nothing stored", strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" "), err))
	}
	return why, nil
}

// writeOptions are the registry options of every command that stores
// versions: who stores them, why (--reason, checked by reasonFlag before),
// --keep when the command has it, and the signature of --sign-key when it
// was given.
func writeOptions(cmd *cobra.Command) []registry.WriteOption {
	opts := []registry.WriteOption{registry.StoredBy(storedBy())}
	if why, _ := reasonFlag(cmd); why != "" {
		opts = append(opts, registry.WithReason(why))
	}
	if f := cmd.Flags().Lookup("keep"); f != nil {
		if k, ok := f.Value.(*keepValue); ok {
			opts = append(opts, registry.KeepVersions(int(*k)))
		}
	}
	if sign, ok := signOption(cmd); ok {
		opts = append(opts, sign)
	}
	if f := cmd.Flags().Lookup("force"); f != nil && f.Value.String() == "true" {
		opts = append(opts, registry.Force())
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
revision that stored it, when, its hash and size, who stored it (USER: user@host
of the agentd command; ETCD USER: the etcd user it ran as, when etcd's
authentication is on), and why (REASON: its --reason). A SIGNER column shows who
signed a version, when one was signed. A removal is a version too. Every "unit
put", "unit rm", "unit revert" and "unit edit" keeps the newest --keep (default
10) versions of each key it writes, under <prefix>/history/, whatever etcd
compaction does.

The command that stores a version writes these fields: etcd checks that its
user may write the keys, nobody checks what it says of itself.

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
				key := tg.String() + "/units/" + args[0]
				if asJSON {
					return writeHistoryJSON(cmd.OutOrStdout(), key, h)
				}
				return printHistory(cmd.OutOrStdout(), key, h)
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	tf.bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// writeHistoryJSON writes the history h of key as one JSON object, each
// version marked current or not.
func writeHistoryJSON(out io.Writer, key string, h registry.History) error {
	type item struct {
		registry.Version
		Current bool `json:"current"`
	}
	cur := h.CurrentIndex()
	items := []item{}
	for i, v := range h.Versions {
		items = append(items, item{v, i == cur})
	}
	return writeJSON(out, map[string]any{"key": key, "exists": h.Exists, "modRevision": h.ModRevision, "versions": items})
}

// printHistory prints the history h of key as a table, oldest first, and a
// note when the key now holds what agentd did not store.
func printHistory(out io.Writer, key string, h registry.History) error {
	if len(h.Versions) == 0 {
		fmt.Fprintf(out, "no history kept for %s\n", key)
		return nil
	}
	cur := h.CurrentIndex()
	signed := slices.ContainsFunc(h.Versions, func(v registry.Version) bool { return v.Signer != "" })
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	header := "REVISION\tTIME\tHASH\tSIZE\tUSER\tETCD USER\t"
	if signed {
		header += "SIGNER\t"
	}
	fmt.Fprintln(tw, header+"REASON\t")
	for i, v := range h.Versions {
		hash, size, note := short(v.Hash), strconv.Itoa(v.Size), ""
		if v.Removed {
			hash, size = "(removed)", "-"
		}
		if i == cur {
			note = "current"
		}
		if v.Override != "" {
			note = strings.TrimPrefix(note+"; "+v.Override, "; ")
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t", v.Revision, v.Time.Local().Format(time.DateTime), hash, size, orDash(v.User), orDash(v.EtcdUser))
		if signed {
			fmt.Fprintf(tw, "%s\t", orDash(v.Signer))
		}
		fmt.Fprintf(tw, "%s\t%s\n", orDash(v.Reason), note)
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
}

// revertOptions are the flags of `unit revert`.
type revertOptions struct {
	ef     etcdFlags
	tf     targetFlags
	to     int64
	wait   bool
	wf     waitFlags
	asJSON bool
	sf     strategyFlags // the rollout options
}

func newUnitRevertCmd() *cobra.Command {
	o := &revertOptions{}
	cmd := &cobra.Command{
		Use:   "revert UNIT (--host H | --group G) [--to REVISION] [--wait] [--canary N ...]",
		Short: "Put back the previous version of a unit key, or the one stored at --to",
		Long: `Put back a kept version of one unit key (see "agentd unit history"): the one
before the current, or the one stored at --to REVISION. It is stored like
"unit put" stores a file — MaxUnavailable=, HealthySec=, rollback and halts
apply, and the history records it as a new version; a version that was a
removal is removed like "unit rm". It fails, storing nothing, if someone
changes the key meanwhile.

Putting back the content the key already holds is a no-op: said so, nothing
stored, exit 0. A revision that is not kept, or no history at all, is an
error (exit 1). --wait as for put: exit 3 when a host fails, 4 on --timeout,
5 when superseded, 6 when --skip-unreachable skipped members.

For a group, the rollout options of "agentd unit put" (--canary, --waves,
--max-unavailable, --soak, --progress-deadline, --pause-after-canary,
--auto-revert, --max-restarts, --gate-cmd, --supersede, --reason) make the
revert a rollout, as for put (or, for a version that was a removal, as for
rm): the group's members take the previous version in waves, each running
the current one until its wave opens. With --wait, follow it to its end.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			unit := args[0]
			tg, err := o.tf.target()
			if err != nil {
				return err
			}
			if err := registry.ValidateUnit(unit); err != nil {
				return withCode(exitUsage, fmt.Errorf("unit revert: %w", err))
			}
			if cmd.Flags().Changed("to") && o.to < 1 {
				return withCode(exitUsage, fmt.Errorf("unit revert: --to %d: want a revision shown by agentd unit history", o.to))
			}
			if err := o.sf.check(cmd, tg, o.wait, o.wf, false); err != nil {
				return err
			}
			return withRegistry(cmd, &o.ef, func(ctx context.Context, reg *registry.Client) error {
				if err := o.tf.record(ctx, reg); err != nil {
					return err
				}
				return o.revert(ctx, cmd, reg, tg, unit)
			})
		},
	}
	o.ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	o.tf.bind(cmd)
	bindKeep(cmd)
	bindSign(cmd)
	bindForce(cmd)
	cmd.Flags().Int64Var(&o.to, "to", 0, "the revision to put back (default: the version before the current)")
	cmd.Flags().BoolVar(&o.wait, "wait", false, "wait until every targeted host runs the reverted version")
	o.wf.bind(cmd)
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print JSON lines")
	o.sf.bind(cmd, "unit revert", "nothing stored")
	return cmd
}

// revert puts back the version of unit --to names (else the one before the
// current), unless the key already holds it, says so, and with --wait
// waits for the hosts.
func (o *revertOptions) revert(ctx context.Context, cmd *cobra.Command, reg *registry.Client, tg registry.Target, unit string) error {
	reg.SetLogger(cliWarnings(cmd.ErrOrStderr()))
	h, err := reg.History(ctx, tg, unit)
	if err != nil {
		return err
	}
	var v registry.Version
	if cmd.Flags().Changed("to") {
		v, err = h.At(o.to)
	} else {
		failed, ferr := failedHashes(ctx, reg, tg, unit)
		if ferr != nil {
			return ferr
		}
		v, err = h.PreviousGood(func(hash string) bool { return failed[hash] })
	}
	if err != nil {
		return fmt.Errorf("unit revert: %w", err)
	}
	key := tg.String() + "/units/" + unit
	out := cmd.OutOrStdout()
	if h.Is(v) {
		say(out, o.asJSON, map[string]any{"event": "unchanged", "key": key, "revision": v.Revision, "hash": v.Hash, "removed": v.Removed},
			"%s already holds the content of revision %d%s: nothing stored\n", key, v.Revision, describe(v))
		return nil
	}
	r, opts, err := o.sf.stage(ctx, reg, tg, nil, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	rev, err := storeVersion(ctx, cmd, reg, tg, unit, h, v, opts...)
	if err != nil {
		return err
	}
	say(out, o.asJSON, map[string]any{"event": "reverted", "key": key, "to": v.Revision, "hash": v.Hash, "removed": v.Removed, "revision": rev},
		"reverted %s to revision %d%s: stored as revision %d\n", key, v.Revision, describe(v), rev)
	noteSetKeys(ctx, cmd.ErrOrStderr(), reg, tg, unit, h.ModRevision)
	if r != nil {
		announceRollout(ctx, out, o.asJSON, reg, r)
	}
	if !o.wait {
		return nil
	}
	if r != nil {
		return followPut(ctx, reg, r, o.wf, o.asJSON, out, cmd.ErrOrStderr())
	}
	return waitConverged(ctx, reg, waitSpec{target: tg, units: map[string][]byte{unit: v.Content}, removing: v.Removed, revision: rev, waitFlags: o.wf, json: o.asJSON}, out)
}

// failedHashes are the versions of unit known to have failed in tg: the
// change of a rollout that ended failed, and a halted version (a host
// failed it). A revert without --to skips them.
func failedHashes(ctx context.Context, reg *registry.Client, tg registry.Target, unit string) (map[string]bool, error) {
	out := map[string]bool{}
	if tg.Group == "" {
		return out, nil
	}
	views, err := reg.Rollouts(ctx, tg.Group, false)
	if err != nil {
		return nil, err
	}
	for _, v := range views {
		if e := v.Record.End; e != nil && e.State == rollout.Failed {
			if u, ok := v.Record.Units[unit]; ok && u.ToHash != "" {
				out[u.ToHash] = true
			}
		}
	}
	halts, err := reg.Halts(ctx, "groups/"+tg.Group)
	if err != nil {
		return nil, err
	}
	for _, h := range halts {
		if h.Unit == unit && h.Hash != "" { // a halt names the unit file's hash
			out[h.Hash] = true
		}
	}
	return out, nil
}

// storeVersion stores v as the newest version of unit (a removal is
// removed) if the key is still at the revision its history h was read at,
// with extra options (a rollout), and returns the revision of the write.
func storeVersion(ctx context.Context, cmd *cobra.Command, reg *registry.Client, tg registry.Target, unit string,
	h registry.History, v registry.Version, extra ...registry.WriteOption) (int64, error) {
	opts := append(append(writeOptions(cmd), registry.IfModRevision(unit, h.ModRevision), registry.Reverting()), extra...)
	var (
		rev int64
		err error
	)
	if v.Removed {
		rev, err = reg.Remove(ctx, tg, []string{unit}, opts...)
	} else {
		rev, err = reg.Put(ctx, tg, map[string][]byte{unit: v.Content}, opts...)
	}
	if errors.Is(err, registry.ErrConflict) {
		return 0, fmt.Errorf("unit revert: %w; look at agentd unit history again", err)
	}
	if err != nil {
		return 0, writeError(explainMirrored(ctx, reg, tg, err))
	}
	return rev, nil
}

// describe is " (hash …)" or " (a removal)" for a version.
func describe(v registry.Version) string {
	if v.Removed {
		return " (a removal)"
	}
	return " (hash " + short(reconcile.Hash(v.Content)) + ")"
}

// noteSetKeys says on w which other keys of unit's set (its unit file,
// drop-ins, config files) the write at rev stored with the key just
// reverted: a revert puts back one key, and a set is usually put whole.
func noteSetKeys(ctx context.Context, w io.Writer, reg *registry.Client, tg registry.Target, key string, rev int64) {
	if rev == 0 {
		return
	}
	listed, err := reg.List(ctx, &tg)
	if err != nil {
		return // a hint only
	}
	unit := reconcile.UnitOfPath(key)
	for _, l := range listed {
		if l.Unit != key && reconcile.UnitOfPath(l.Unit) == unit && l.ModRevision == rev {
			fmt.Fprintf(w, "note: %s/units/%s was stored with it (revision %d) and is not reverted; revert it too: agentd unit revert %s %s\n",
				tg.String(), l.Unit, rev, l.Unit, targetFlag(tg))
		}
	}
}

// targetFlag is the --host or --group flag naming tg.
func targetFlag(tg registry.Target) string {
	if tg.Group != "" {
		return "--group " + tg.Group
	}
	return "--host " + tg.Host
}
