package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/selector"
)

// targetFlags are --host, --group and --selector: exactly one. A
// selector target is the group registry.SelectorGroup names (a sel- group),
// recorded with its selector before anything is written to it (record).
type targetFlags struct {
	host, group, selector string
	sel                   selector.Selector // parsed by target
}

func (t *targetFlags) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&t.host, "host", "", "target one host")
	cmd.Flags().StringVar(&t.group, "group", "", "target every member of a group")
	cmd.Flags().StringVar(&t.selector, "selector", "", "target the hosts whose labels match this selector (e.g. 'env=prod,role=web'), as a group of their own")
}

func (t *targetFlags) target() (registry.Target, error) {
	if t.selector == "" {
		tg := registry.Target{Host: t.host, Group: t.group}
		if err := tg.Validate(); err != nil {
			return tg, withCode(exitUsage, fmt.Errorf("%w (use --host H, --group G or --selector S)", err))
		}
		return tg, nil
	}
	if t.host != "" || t.group != "" {
		return registry.Target{}, withCode(exitUsage, errors.New("--selector with --host or --group: give exactly one"))
	}
	s, err := selector.Parse(t.selector)
	if err != nil {
		return registry.Target{}, withCode(exitUsage, fmt.Errorf("--selector %q: %w", t.selector, err))
	}
	if s.Empty() {
		return registry.Target{}, withCode(exitUsage, fmt.Errorf("--selector %q: empty; it would match every host (use --group all)", t.selector))
	}
	t.sel = s
	return registry.Target{Group: registry.SelectorGroup(s)}, nil
}

// isSelector says whether the target is a selector (after target).
func (t *targetFlags) isSelector() bool { return !t.sel.Empty() }

// record writes the selector's record before keys are written to its
// group (nothing for --host or --group).
func (t *targetFlags) record(ctx context.Context, reg *registry.Client) error {
	if !t.isSelector() {
		return nil
	}
	if _, err := reg.PutSelector(ctx, t.sel); err != nil {
		return writeError(err)
	}
	return nil
}

// describe is how the CLI names the target: "selector 'env=prod'" for a
// selector, else its key segment.
func (t *targetFlags) describe(tg registry.Target) string {
	if t.isSelector() {
		return "selector '" + t.sel.String() + "' (" + tg.String() + ")"
	}
	return tg.String()
}

func newUnitCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "unit", Short: "Manage unit files in the registry"}
	cmd.AddCommand(newUnitPutCmd(), newUnitRmCmd(), newUnitLsCmd(), newUnitCatCmd())
	cmd.AddCommand(newUnitHistoryCmd(), newUnitRevertCmd())
	cmd.AddCommand(newUnitEditCmd())
	return cmd
}

// keyForFile maps a local file to its registry key: the base name, or
// "<unit>.d/<name>.conf" for a file inside a drop-in directory.
func keyForFile(path string) string {
	base := filepath.Base(path)
	if parent := filepath.Base(filepath.Dir(path)); strings.HasSuffix(parent, ".d") && strings.HasSuffix(base, ".conf") {
		return parent + "/" + base
	}
	return base
}

// putOptions are the flags of `unit put`.
type putOptions struct {
	ef        etcdFlags
	tf        targetFlags
	wait      bool
	wf        waitFlags
	asJSON    bool
	instances []string
	files     []string // --file DEST=SRC[:MODE[:OWNER]]
	dryRun    bool
	sf        strategyFlags // the rollout options
	confirm   confirmFlag   // --confirm DUR: ConfirmSec= in each unit file
	secret    secretFlags   // --secret and its recipients
}

func newUnitPutCmd() *cobra.Command {
	o := &putOptions{}
	cmd := &cobra.Command{
		Use:   "put FILE... (--host H | --group G | --selector S) [--file DEST=SRC [--secret]] [--wait]",
		Short: "Store unit files (and drop-ins) for a host or group",
		Long: `Store unit files in the registry, all in one transaction. The key is the file's
base name; a file inside a directory named <unit>.d is stored as the drop-in
<unit>.d/<name>.conf. --instance NAME stores an empty key that runs that
instance of its template (e.g. --instance web@1.service).

--selector S (e.g. 'env=prod,role=web', the syntax of agentd hosts
--selector) targets the hosts whose labels match S, as a group of their own
named sel-<12 hex digits of the SHA-256 of S's canonical form>, recorded
with S at <p>/selectors/: each agent joins it while its labels match, and a
host relabelled takes or drops its units in one pass. Everything that takes
--group takes --selector (history, revert, rm, rollouts, --dry-run, secrets);
--wait and the rollouts count the known hosts whose labels match S. A bad
selector is refused (exit 2) and nothing is stored.

--file DEST=SRC[:MODE[:OWNER]] adds a config file to the unit's set, stored
as <unit>.files/<DEST>: each host writes it at DEST (only under a root its
agent was started with, agentd run --file-root), with the unit file and
drop-ins of the put, before one daemon-reload; a rollback or revert puts
the whole set back. [X-Agentd] RestartTriggers=DEST or ReloadTriggers=DEST
restart or reload the unit when that file changes; a file no trigger names
is written without touching the unit.

--secret encrypts every --file of the put (age) to each targeted host — for
a group, every member, live or down — and to each --admin-recipient, so the
registry holds only ciphertext and each host decrypts it just before writing
it (default mode 0600). Each host's recipient, as its agent publishes it, is
pinned on first use (--known-recipients): a changed one is refused until
"agentd secrets accept HOST". --recipients FILE takes them from a file of
yours instead. A host that joins later cannot read it: "agentd secrets
rekey". See "agentd secrets --help".

With --wait, block until every targeted host (for a group, every member, live
or not) has acted on this write and reports the new hash and the unit in its
wanted state; exit 3 when a host fails, 4 on --timeout, 5 when a later write
superseded this one, 6 when --skip-unreachable skipped members.

For a group, any of --canary, --waves, --max-unavailable, --soak,
--progress-deadline, --pause-after-canary, --auto-revert, --max-restarts or
--gate-cmd makes the put a rollout: the group's members now (live or not)
take the change in waves, by host name, each healthy for --soak before it
counts; the others keep running the previous version meanwhile. The keys and
the rollout's record are written in one transaction; a running rollout of
the same keys refuses it unless --supersede. See "agentd rollout --help".
With --wait, follow the rollout to its end: exit 0 when every host is
healthy, 3 when it failed or was aborted (after its hosts went back, with
--auto-revert), 4 on --timeout (the rollout goes on), 5 when superseded.`,
		Args: usageArgs(cobra.ArbitraryArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && len(o.instances) == 0 {
				return withCode(exitUsage, errors.New("unit put: give at least one FILE or --instance"))
			}
			tg, err := o.tf.target()
			if err != nil {
				return err
			}
			if err := o.sf.check(cmd, tg, o.wait, o.wf, o.dryRun); err != nil {
				return err
			}
			o.secret.sel = o.tf.sel
			if err := o.secret.check(cmd, o.files); err != nil {
				return err
			}
			units, err := readUnits(args, o.instances)
			if err != nil {
				return err
			}
			if err := o.confirm.apply(cmd, units); err != nil {
				return err
			}
			mode := reconcile.DefaultMode
			if o.secret.on {
				mode = secretMode
			}
			keys, err := addFiles(units, o.files, mode)
			if err != nil {
				return err
			}
			if o.secret.on {
				if err := o.secret.seal(cmd, &o.ef, tg, units, keys, o.dryRun); err != nil {
					return err
				}
			}
			if o.dryRun {
				return dryRunPut(cmd, &o.ef, &o.tf, tg, units, o.wait, o.asJSON, &o.sf)
			}
			return withRegistry(cmd, &o.ef, func(ctx context.Context, reg *registry.Client) error {
				return o.put(ctx, cmd, reg, tg, units)
			})
		},
	}
	o.ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+", the local agent's embedded etcd)")
	o.tf.bind(cmd)
	cmd.Flags().BoolVar(&o.wait, "wait", false, "wait until every targeted host runs the new version")
	o.wf.bind(cmd)
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print JSON lines")
	cmd.Flags().StringArrayVar(&o.instances, "instance", nil, "run this template instance (empty key), e.g. web@1.service")
	cmd.Flags().StringArrayVar(&o.files, "file", nil, fileHelp)
	bindKeep(cmd)
	bindSign(cmd)
	bindForce(cmd)
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "print what each targeted live host would do; store nothing")
	o.sf.bind(cmd, "unit put", "nothing stored")
	o.confirm.bind(cmd)
	o.secret.bind(cmd, true)
	return cmd
}

// readUnits reads each file of paths under its key (keyForFile), checked
// as the agent checks it, and adds an empty key for each template
// instance; anything refused is a usage error (exit 2).
func readUnits(paths, instances []string) (map[string][]byte, error) {
	units := map[string][]byte{}
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("unit put: %w", err)
		}
		key := keyForFile(path)
		if err := checkUnitFile(key, b); err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("unit put %s: %w", path, err))
		}
		units[key] = b
	}
	for _, in := range instances {
		if err := reconcile.ValidateUnitName(in); err != nil {
			return nil, withCode(exitUsage, fmt.Errorf("--instance: %w", err)) // the error names it
		}
		if !reconcile.IsInstance(in) {
			return nil, withCode(exitUsage, fmt.Errorf("--instance %q: not a template instance name such as web@1.service", in))
		}
		units[in] = nil
	}
	return units, nil
}

// checkUnitFile checks the content b of key as the agent will: its key,
// content, syntax and rollout policy.
func checkUnitFile(key string, b []byte) error {
	if err := reconcile.CheckValue(key, b); err != nil {
		return err
	}
	if reconcile.IsConfigPath(key) {
		return nil // a config file (unit edit of one) has no policy
	}
	_, err := reconcile.ParsePolicy(b)
	return err
}

// put stores units for tg in one transaction and says what it stored.
// With --wait it waits for the hosts; without, nobody hears the hosts'
// answer, so it says on stderr which are known to refuse the put (from
// the registry as it is before it), once it is stored.
func (o *putOptions) put(ctx context.Context, cmd *cobra.Command, reg *registry.Client, tg registry.Target, units map[string][]byte) error {
	var warnings bytes.Buffer
	if !o.wait {
		if err := warnRefusals(ctx, &warnings, reg, tg, units); err != nil {
			fmt.Fprintf(&warnings, "warning: the hosts' facts could not be read, so refusals are not known: %v\n", err)
		}
	}
	if err := o.tf.record(ctx, reg); err != nil {
		return err
	}
	r, opts, err := o.sf.stage(ctx, reg, tg, writeOptions(cmd), cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	rev, err := reg.Put(ctx, tg, units, opts...)
	if err != nil {
		return writeError(explainMirrored(ctx, reg, tg, err))
	}
	out := cmd.OutOrStdout()
	if o.tf.isSelector() && !o.asJSON {
		fmt.Fprintf(out, "target: %s\n", o.tf.describe(tg))
	}
	for _, k := range slices.Sorted(maps.Keys(units)) {
		if o.asJSON {
			writeJSONLine(out, map[string]any{"event": "stored", "key": tg.String() + "/units/" + k, "hash": reconcile.Hash(units[k]), "revision": rev})
		} else {
			fmt.Fprintf(out, "stored %s/units/%s (hash %s, revision %d)\n", tg.String(), k, short(reconcile.Hash(units[k])), rev)
		}
	}
	if r != nil {
		announceRollout(ctx, out, o.asJSON, reg, r)
	}
	if !o.wait {
		_, err := warnings.WriteTo(cmd.ErrOrStderr())
		return err
	}
	if r != nil {
		return followPut(ctx, reg, r, o.wf, o.asJSON, out, cmd.ErrOrStderr())
	}
	return waitConverged(ctx, reg, waitSpec{target: tg, units: units, revision: rev, waitFlags: o.wf, json: o.asJSON}, out)
}

// rmOptions are the flags of `unit rm`.
type rmOptions struct {
	ef        etcdFlags
	tf        targetFlags
	wait      bool
	wf        waitFlags
	asJSON    bool
	recursive bool
	sf        strategyFlags // the rollout options
}

func newUnitRmCmd() *cobra.Command {
	o := &rmOptions{}
	cmd := &cobra.Command{
		Use:   "rm UNIT... (--host H | --group G) [--recursive] [--wait] [--canary N ...]",
		Short: "Remove units from the registry: each agent stops, disables and deletes them",
		Long: `Remove unit keys from the registry, all in one transaction; each targeted agent
stops, disables and deletes what it installed of them.

A unit whose drop-ins (<unit>.d/<name>.conf) stay in the registry is not
removed: the hosts would keep a drop-in for a unit they no longer have. Name
the drop-ins too, or give --recursive to remove each unit with all its drop-ins
for that target. Nothing is removed when one of the keys is missing.

With --wait, block until every targeted host (for a group, every member, live
or not) has acted on this removal and removed them; exit 3 when a host fails,
4 on --timeout, 5 when a later write superseded it, 6 when --skip-unreachable
skipped members.

For a group, the rollout options of "agentd unit put" (--canary, --waves,
--max-unavailable, --soak, --progress-deadline, --pause-after-canary,
--auto-revert, --max-restarts, --gate-cmd, --supersede, --reason) make the
removal a rollout: the group's members take it in waves, each keeping the
units (and running them) until its wave opens; a host counts once it stopped
and removed them (and stayed so for --soak). --auto-revert or "agentd rollout
abort --revert" gives the hosts that removed them the units back. With --wait,
follow the rollout to its end, exit codes as for put.`,
		Args: usageArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tg, err := o.tf.target()
			if err != nil {
				return err
			}
			if err := o.sf.check(cmd, tg, o.wait, o.wf, false); err != nil {
				return err
			}
			return withRegistry(cmd, &o.ef, func(ctx context.Context, reg *registry.Client) error {
				return o.remove(ctx, cmd, reg, tg, args)
			})
		},
	}
	o.ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	o.tf.bind(cmd)
	bindForce(cmd)
	cmd.Flags().BoolVar(&o.recursive, "recursive", false, "also remove every drop-in of each UNIT in the registry for that target (one transaction)")
	cmd.Flags().BoolVar(&o.wait, "wait", false, "wait until every targeted host has removed the units")
	bindKeep(cmd)
	bindSign(cmd)
	o.wf.bind(cmd)
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print JSON lines")
	o.sf.bind(cmd, "unit rm", "nothing removed")
	return cmd
}

// remove removes the keys named (with --recursive, each unit's drop-ins
// too) in one transaction, says what it removed, and with --wait waits
// for the hosts.
func (o *rmOptions) remove(ctx context.Context, cmd *cobra.Command, reg *registry.Client, tg registry.Target, keys []string) error {
	if err := o.tf.record(ctx, reg); err != nil {
		return err
	}
	r, opts, err := o.sf.stage(ctx, reg, tg, writeOptions(cmd), cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	var (
		rev     int64
		removed = keys
	)
	if o.recursive {
		rev, removed, err = reg.RemoveRecursive(ctx, tg, keys, opts...)
	} else {
		rev, err = reg.Remove(ctx, tg, keys, append(opts, registry.OnlyWholeUnits())...)
	}
	if errors.Is(err, registry.ErrDropInsStay) {
		err = fmt.Errorf("%w (name them too, or give --recursive to remove each unit with all its drop-ins)", err)
	}
	if err != nil {
		return writeError(explainMirrored(ctx, reg, tg, err))
	}
	out := cmd.OutOrStdout()
	for _, k := range removed {
		say(out, o.asJSON, map[string]any{"event": "removed", "key": tg.String() + "/units/" + k, "revision": rev},
			"removed %s/units/%s (revision %d)\n", tg.String(), k, rev)
	}
	if r != nil {
		announceRollout(ctx, out, o.asJSON, reg, r)
	}
	if !o.wait {
		return nil
	}
	if r != nil {
		return followPut(ctx, reg, r, o.wf, o.asJSON, out, cmd.ErrOrStderr())
	}
	units := map[string][]byte{}
	for _, k := range removed {
		units[k] = nil
	}
	return waitConverged(ctx, reg, waitSpec{target: tg, units: units, removing: true, revision: rev, waitFlags: o.wf, json: o.asJSON}, out)
}

func newUnitLsCmd() *cobra.Command {
	var (
		ef     etcdFlags
		tf     targetFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "ls [--host H | --group G | --selector S]",
		Short: "List unit keys in the registry",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var tp *registry.Target
			if tf.host != "" || tf.group != "" || tf.selector != "" {
				tg, err := tf.target()
				if err != nil {
					return err
				}
				tp = &tg
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				ls, err := reg.List(ctx, tp)
				if err != nil {
					return err
				}
				sels, _, err := reg.Selectors(ctx)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					type item struct {
						Host     string `json:"host,omitempty"`
						Group    string `json:"group,omitempty"`
						Selector string `json:"selector,omitempty"`
						Unit     string `json:"unit"`
						Hash     string `json:"hash"`
						Size     int    `json:"size"`
						Revision int64  `json:"modRevision"`
					}
					items := []item{}
					for _, l := range ls {
						items = append(items, item{l.Host, l.Group, selectorText(sels, l.Group), l.Unit, reconcile.Hash(l.Value), len(l.Value), l.ModRevision})
					}
					return writeJSON(out, items)
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "TARGET\tUNIT\tHASH\tSIZE\tREVISION")
				for _, l := range ls {
					target := "hosts/" + l.Host
					if l.Group != "" {
						target = "groups/" + l.Group
					}
					if t := selectorText(sels, l.Group); t != "" {
						target += " (selector '" + t + "')"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", target, l.Unit, short(reconcile.Hash(l.Value)), len(l.Value), l.ModRevision)
				}
				return tw.Flush()
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	tf.bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newUnitCatCmd() *cobra.Command {
	var (
		ef     etcdFlags
		tf     targetFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "cat UNIT (--host H | --group G)",
		Short: "Print a unit file as stored in the registry",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tg, err := tf.target()
			if err != nil {
				return err
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				b, err := reg.Get(ctx, tg, args[0])
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), map[string]any{"key": tg.String() + "/units/" + args[0], "hash": reconcile.Hash(b), "content": string(b)})
				}
				_, err = cmd.OutOrStdout().Write(catValue(args[0], b))
				return err
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	tf.bind(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// writeError gives a write that the registry refused before sending it —
// over a size limit, leaving drop-ins without their unit, or to a target
// a git mirror owns (without --force) — the usage
// exit code: the arguments as given cannot be written, and nothing was.
func writeError(err error) error {
	if errors.Is(err, registry.ErrTooLarge) || errors.Is(err, registry.ErrDropInsStay) || errors.Is(err, registry.ErrTwoWriters) ||
		errors.Is(err, registry.ErrMirrored) {
		return withCode(exitUsage, err)
	}
	return err
}

// bindForce adds --force to a command that writes unit keys (put, rm,
// revert): it writes over a target a git mirror owns (agentd mirror).
func bindForce(cmd *cobra.Command) {
	cmd.Flags().Bool("force", false, "write even to a target a git mirror owns (agentd mirror status): a drift from git, "+
		"undone by the mirror's next commit that changes the same keys")
}

// explainMirrored names the mirror that owns tg when the registry refused
// a write because of it (registry.ErrMirrored), and says what to do.
func explainMirrored(ctx context.Context, reg *registry.Client, tg registry.Target, err error) error {
	if !errors.Is(err, registry.ErrMirrored) {
		return err
	}
	name, url, ok, lerr := reg.MirrorOwner(ctx, tg)
	if lerr != nil || !ok {
		return fmt.Errorf("%w: change it in git, or give --force to write over the mirror's version", err)
	}
	return fmt.Errorf("%w: %s is mirrored from %s by mirror %q: change it in git (agentd mirror status --name %s), or give --force to write over the mirror's version",
		err, tg, url, name, name)
}

// selectorText is the selector group stands for ("" for none).
func selectorText(sels map[string]selector.Selector, group string) string {
	if s, ok := sels[group]; ok {
		return s.String()
	}
	return ""
}
