package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// validateValue checks an edited value for key as `unit put` and the agent
// do (checkUnitFile), and refuses an empty one: an edit cannot take a unit
// away.
func validateValue(key string, b []byte) error {
	if _, _, err := reconcile.ParseKey(key); err != nil {
		return err
	}
	if len(b) == 0 {
		return errors.New("empty file (to take the unit away, use agentd unit rm)")
	}
	return checkUnitFile(key, b)
}

// editorCommand is $EDITOR, else $VISUAL, else vi: a shell command line
// (it may carry arguments) the file name is appended to.
func editorCommand() string {
	for _, v := range []string{"EDITOR", "VISUAL"} {
		if s := strings.TrimSpace(os.Getenv(v)); s != "" {
			return s
		}
	}
	return "vi"
}

func runEditor(ctx context.Context, path string) error {
	ed := editorCommand()
	c := exec.CommandContext(ctx, "/bin/sh", "-c", ed+` "$@"`, "agentd-edit", path)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := c.Run(); err != nil {
		return fmt.Errorf("editor %q: %w", ed, err)
	}
	return nil
}

// editOptions are the flags of `unit edit`.
type editOptions struct {
	ef     etcdFlags
	tf     targetFlags
	yes    bool
	noWait bool
	wf     waitFlags
	asJSON bool
	sf     strategyFlags // the rollout options, as put takes them
}

func newUnitEditCmd() *cobra.Command {
	o := &editOptions{}
	cmd := &cobra.Command{
		Use:   "edit UNIT (--host H | --group G) [--yes] [--no-wait] [rollout options]",
		Short: "Edit a unit file in the registry with $EDITOR, see what each host would do, store it",
		Long: `Open the registry copy of UNIT (or a drop-in, <unit>.d/<name>.conf) in $EDITOR
(else $VISUAL, else vi). Nothing is stored when the editor fails (exit 1) or the
content did not change (exit 0). The result is checked as the agent checks it
(exit 2 when refused); then the diff and what each live host would do are shown,
and "store? [y/N]" is asked (--yes skips it). The store is a compare-and-swap on
the revision the file was read at: if someone else changed the key in the
meantime nothing is stored (exit 1). Then it waits like put --wait (--no-wait
returns at once). To a group, it takes put's rollout options (--canary,
--waves, --soak, …): the preview then shows the waves, and the edit is staged
as a rollout.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tg, err := o.tf.target()
			if err != nil {
				return err
			}
			key := args[0]
			if _, _, err := reconcile.ParseKey(key); err != nil {
				return withCode(exitUsage, fmt.Errorf("unit edit %s: %w", key, err))
			}
			if err := o.sf.check(cmd, tg, !o.noWait, o.wf, false); err != nil {
				return err
			}
			return withRegistry(cmd, &o.ef, func(ctx context.Context, reg *registry.Client) error {
				if err := o.tf.record(ctx, reg); err != nil {
					return err
				}
				return o.edit(ctx, cmd, reg, tg, key)
			})
		},
	}
	o.ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	o.tf.bind(cmd)
	cmd.Flags().BoolVarP(&o.yes, "yes", "y", false, "store without asking")
	cmd.Flags().BoolVar(&o.noWait, "no-wait", false, "return once stored, without waiting for the hosts")
	o.wf.bind(cmd)
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print JSON lines")
	bindKeep(cmd)
	o.sf.bind(cmd, "unit edit", "nothing stored") // and --reason
	bindSign(cmd)
	return cmd
}

// edit is `unit edit` once the registry is dialled: read the key, edit a
// copy, check it, show what it would do, ask, store it at the revision it
// was read at, and wait.
func (o *editOptions) edit(ctx context.Context, cmd *cobra.Command, reg *registry.Client, tg registry.Target, key string) error {
	out := cmd.OutOrStdout()
	old, rev, err := readForEdit(ctx, reg, tg, key)
	if err != nil {
		return err
	}
	if cf, err := reconcile.DecodeConfigFile(old); reconcile.IsConfigPath(key) && err == nil && cf.Secret {
		// The registry holds its ciphertext: an editor would show armour,
		// and the plaintext must not land in a temp file.
		_, dest, _ := reconcile.ConfigDest(key)
		return withCode(exitUsage, fmt.Errorf("unit edit %s: a secret (age-encrypted to %s); put the new version with agentd unit put %s --file %s=SRC --secret; nothing stored",
			key, strings.Join(cf.To, ", "), reconcile.UnitOfPath(key), dest))
	}
	tmp, err := newEditFile(key, old)
	if err != nil {
		return fmt.Errorf("unit edit: %w", err)
	}
	defer tmp.close()
	if err := runEditor(ctx, tmp.path); err != nil {
		return fmt.Errorf("unit edit %s: %w; nothing stored", key, err)
	}
	edited, err := os.ReadFile(tmp.path)
	if err != nil {
		return fmt.Errorf("unit edit: %w; nothing stored", err)
	}
	name := tg.String() + "/units/" + key
	if bytes.Equal(edited, old) {
		say(out, o.asJSON, map[string]any{"event": "unchanged", "key": name, "revision": rev},
			"%s/units/%s: no change; nothing stored\n", tg, key)
		return nil
	}
	if err := validateValue(key, edited); err != nil {
		tmp.keep = true
		return withCode(exitUsage, fmt.Errorf("unit edit %s: %w; nothing stored (your edit is kept in %s)", key, err, tmp.path))
	}
	units := map[string][]byte{key: edited}
	if err := o.show(ctx, out, reg, tg, key, rev, old, units, tmp); err != nil {
		return err
	}
	if !o.yes && !confirmed(cmd) {
		tmp.keep = true
		return fmt.Errorf("unit edit %s: not confirmed; nothing stored (your edit is kept in %s)", key, tmp.path)
	}
	r, opts, err := o.sf.stage(ctx, reg, tg, writeOptions(cmd), cmd.ErrOrStderr())
	if err != nil {
		tmp.keep = true
		return fmt.Errorf("unit edit %s: %w (your edit is kept in %s)", key, err, tmp.path)
	}
	newRev, err := storeEdit(ctx, reg, tg, key, rev, units, tmp, opts)
	if err != nil {
		return err
	}
	h := reconcile.Hash(edited)
	say(out, o.asJSON, map[string]any{"event": "stored", "key": name, "hash": h, "revision": newRev},
		"stored %s (hash %s, revision %d)\n", name, short(h), newRev)
	if r != nil {
		announceRollout(ctx, out, o.asJSON, reg, r)
		if o.noWait {
			return nil
		}
		return followPut(ctx, reg, r, o.wf, o.asJSON, out, cmd.ErrOrStderr())
	}
	if o.noWait {
		return nil
	}
	return waitConverged(ctx, reg, waitSpec{target: tg, units: units, revision: newRev, waitFlags: o.wf, json: o.asJSON}, out)
}

// readForEdit reads key's content and the revision it was read at. A key
// not in the registry, or an instance key (it has no content), cannot be
// edited.
func readForEdit(ctx context.Context, reg *registry.Client, tg registry.Target, key string) ([]byte, int64, error) {
	old, rev, err := reg.GetRevision(ctx, tg, key)
	if errors.Is(err, registry.ErrNotFound) {
		return nil, 0, fmt.Errorf("unit edit: %s/units/%s is not in the registry (store it first with agentd unit put)", tg, key)
	}
	if err != nil {
		return nil, 0, err
	}
	if len(old) == 0 {
		return nil, 0, withCode(exitUsage, fmt.Errorf("unit edit: %s/units/%s is an instance key: it has no content to edit (edit its template)", tg, key))
	}
	return old, rev, nil
}

// editFile is the temporary copy of the key under edit. close removes it
// unless keep is set: a failure once the edit is made keeps it, so the
// user's work is not lost.
type editFile struct {
	dir, path string
	keep      bool
}

func newEditFile(key string, content []byte) (*editFile, error) {
	dir, err := os.MkdirTemp("", "agentd-edit-")
	if err != nil {
		return nil, err
	}
	f := &editFile{dir: dir, path: filepath.Join(dir, filepath.Base(key))}
	if err := os.WriteFile(f.path, content, 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return f, nil
}

func (f *editFile) close() {
	if !f.keep {
		os.RemoveAll(f.dir)
	}
}

// show prints the diff of the edit (read at rev) and what each live host
// would do with units; a preview that fails keeps the edit.
func (o *editOptions) show(ctx context.Context, out io.Writer, reg *registry.Client, tg registry.Target, key string, rev int64,
	old []byte, units map[string][]byte, tmp *editFile) error {
	name := tg.String() + "/units/" + key
	diff := control.UnifiedDiff(fmt.Sprintf("%s (revision %d)", name, rev), name+" (edited)", string(old), string(units[key]))
	preds, err := previewFleet(ctx, reg, tg, units)
	if err != nil {
		tmp.keep = true
		return fmt.Errorf("unit edit %s: %w; nothing stored (your edit is kept in %s)", key, err, tmp.path)
	}
	if o.asJSON {
		writeJSONLine(out, map[string]any{"event": "diff", "key": name, "revision": rev, "diff": diff})
		for _, p := range preds.Predictions {
			writeJSONLine(out, map[string]any{"event": "preview", "host": p.Host, "unit": p.Unit, "do": p.Do, "reason": p.Reason})
		}
		return nil
	}
	fmt.Fprint(out, diff)
	if err := printPredictions(out, preds, false); err != nil {
		return err
	}
	if err := previewRollout(ctx, out, reg, tg, &o.sf, false); err != nil {
		tmp.keep = true
		return fmt.Errorf("unit edit %s: %w; nothing stored (your edit is kept in %s)", key, err, tmp.path)
	}
	return nil
}

// confirmed asks "store? [y/N]" on cmd's stderr and reads the answer from
// its stdin.
func confirmed(cmd *cobra.Command) bool {
	fmt.Fprint(cmd.ErrOrStderr(), "store? [y/N] ")
	line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
	a := strings.ToLower(strings.TrimSpace(line))
	return a == "y" || a == "yes"
}

// storeEdit stores units if key is still at rev, the revision it was read
// at, and returns the revision of the write; a failure keeps the edit.
func storeEdit(ctx context.Context, reg *registry.Client, tg registry.Target, key string, rev int64,
	units map[string][]byte, tmp *editFile, opts []registry.WriteOption) (int64, error) {
	newRev, err := reg.Put(ctx, tg, units, append(opts, registry.IfModRevision(key, rev))...)
	var ce *registry.ConflictError
	if errors.As(err, &ce) {
		tmp.keep = true
		if ce.Got == 0 {
			return 0, fmt.Errorf("unit edit %s: removed by someone else since you opened it (revision %d); nothing stored (your edit is kept in %s)", key, ce.Want, tmp.path)
		}
		return 0, fmt.Errorf("unit edit %s: changed by someone else since you opened it (revision %d → %d); nothing stored (your edit is kept in %s; agentd unit cat shows the new content)",
			key, ce.Want, ce.Got, tmp.path)
	}
	if err != nil {
		tmp.keep = true
		return 0, writeError(fmt.Errorf("unit edit %s: %w (your edit is kept in %s)", key, err, tmp.path))
	}
	return newRev, nil
}
