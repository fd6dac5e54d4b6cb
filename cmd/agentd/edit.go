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
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// validateValue checks a value for key as `unit put` and the agent do.
func validateValue(key string, b []byte) error {
	_, unit, err := reconcile.ParseKey(key)
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return errors.New("empty file (to take the unit away, use agentd unit rm)")
	}
	if err := reconcile.ValidateContent(b); err != nil {
		return err
	}
	if err := reconcile.CheckSyntax(unit, b); err != nil {
		return err
	}
	_, err = reconcile.ParsePolicy(b)
	return err
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

func newUnitEditCmd() *cobra.Command {
	var (
		ef              etcdFlags
		tf              targetFlags
		yes             bool
		noWait          bool
		timeout         time.Duration
		skipUnreachable bool
		asJSON          bool
	)
	cmd := &cobra.Command{
		Use:   "edit UNIT (--host H | --group G) [--yes] [--no-wait]",
		Short: "Edit a unit file in the registry with $EDITOR, see what each host would do, store it",
		Long: `Open the registry copy of UNIT (or a drop-in, <unit>.d/<name>.conf) in $EDITOR
(else $VISUAL, else vi). Nothing is stored when the editor fails (exit 1) or the
content did not change (exit 0). The result is checked as the agent checks it
(exit 2 when refused); then the diff and what each live host would do are shown,
and "store? [y/N]" is asked (--yes skips it). The store is a compare-and-swap on
the revision the file was read at: if someone else changed the key in the
meantime nothing is stored (exit 1). Then it waits like put --wait (--no-wait
returns at once).`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			tg, err := tf.target()
			if err != nil {
				return err
			}
			key := args[0]
			if _, _, err := reconcile.ParseKey(key); err != nil {
				return withCode(exitUsage, fmt.Errorf("unit edit %s: %w", key, err))
			}
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			reg, err := ef.dial(ctx)
			if err != nil {
				return err
			}
			defer reg.Close()
			old, rev, err := reg.GetRevision(ctx, tg, key)
			if errors.Is(err, registry.ErrNotFound) {
				return fmt.Errorf("unit edit: %s/units/%s is not in the registry (store it first with agentd unit put)", tg, key)
			}
			if err != nil {
				return err
			}
			if len(old) == 0 {
				return withCode(exitUsage, fmt.Errorf("unit edit: %s/units/%s is an instance key: it has no content to edit (edit its template)", tg, key))
			}
			dir, err := os.MkdirTemp("", "agentd-edit-")
			if err != nil {
				return fmt.Errorf("unit edit: %w", err)
			}
			keep := false
			defer func() {
				if !keep {
					os.RemoveAll(dir)
				}
			}()
			path := filepath.Join(dir, filepath.Base(key))
			if err := os.WriteFile(path, old, 0o600); err != nil {
				return fmt.Errorf("unit edit: %w", err)
			}
			if err := runEditor(ctx, path); err != nil {
				return fmt.Errorf("unit edit %s: %w; nothing stored", key, err)
			}
			edited, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("unit edit: %w; nothing stored", err)
			}
			if bytes.Equal(edited, old) {
				say(out, asJSON, map[string]any{"event": "unchanged", "key": tg.String() + "/units/" + key, "revision": rev},
					"%s/units/%s: no change; nothing stored\n", tg, key)
				return nil
			}
			if err := validateValue(key, edited); err != nil {
				keep = true
				return withCode(exitUsage, fmt.Errorf("unit edit %s: %w; nothing stored (your edit is kept in %s)", key, err, path))
			}
			units := map[string][]byte{key: edited}
			name := tg.String() + "/units/" + key
			diff := control.UnifiedDiff(fmt.Sprintf("%s (revision %d)", name, rev), name+" (edited)", string(old), string(edited))
			preds, err := previewFleet(ctx, reg, tg, units)
			if err != nil {
				keep = true
				return fmt.Errorf("unit edit %s: %w; nothing stored (your edit is kept in %s)", key, err, path)
			}
			if asJSON {
				writeJSONLine(out, map[string]any{"event": "diff", "key": name, "revision": rev, "diff": diff})
				for _, p := range preds.Predictions {
					writeJSONLine(out, map[string]any{"event": "preview", "host": p.Host, "unit": p.Unit, "do": p.Do, "reason": p.Reason})
				}
			} else {
				fmt.Fprint(out, diff)
				if err := printPredictions(out, preds, false); err != nil {
					return err
				}
			}
			if !yes {
				fmt.Fprint(cmd.ErrOrStderr(), "store? [y/N] ")
				line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if a := strings.ToLower(strings.TrimSpace(line)); a != "y" && a != "yes" {
					keep = true
					return fmt.Errorf("unit edit %s: not confirmed; nothing stored (your edit is kept in %s)", key, path)
				}
			}
			newRev, err := reg.Put(ctx, tg, units, append(writeOptions(cmd), registry.IfModRevision(key, rev))...)
			var ce *registry.ConflictError
			if errors.As(err, &ce) {
				keep = true
				if ce.Got == 0 {
					return fmt.Errorf("unit edit %s: removed by someone else since you opened it (revision %d); nothing stored (your edit is kept in %s)", key, ce.Want, path)
				}
				return fmt.Errorf("unit edit %s: changed by someone else since you opened it (revision %d → %d); nothing stored (your edit is kept in %s; agentd unit cat shows the new content)",
					key, ce.Want, ce.Got, path)
			}
			if err != nil {
				keep = true
				return writeError(fmt.Errorf("unit edit %s: %w (your edit is kept in %s)", key, err, path))
			}
			h := reconcile.Hash(edited)
			say(out, asJSON, map[string]any{"event": "stored", "key": name, "hash": h, "revision": newRev},
				"stored %s (hash %s, revision %d)\n", name, short(h), newRev)
			if noWait {
				return nil
			}
			return waitConverged(ctx, reg, waitSpec{target: tg, units: units, revision: newRev, timeout: timeout, json: asJSON, skipUnreachable: skipUnreachable}, out)
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	tf.bind(cmd)
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "store without asking")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once stored, without waiting for the hosts")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "give up waiting after this long (exit 4)")
	bindSkipUnreachable(cmd, &skipUnreachable)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON lines")
	bindKeep(cmd)
	return cmd
}

func say(out io.Writer, asJSON bool, v any, format string, args ...any) {
	if asJSON {
		writeJSONLine(out, v)
		return
	}
	fmt.Fprintf(out, format, args...)
}
