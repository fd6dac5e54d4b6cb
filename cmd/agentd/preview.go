package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// What a host would do with a unit, as `unit put --dry-run` and `unit edit`
// print it.
const (
	doNothing   = "nothing"
	doStart     = "start"
	doRestart   = "restart"
	doReload    = "reload"
	doUpdate    = "daemon-reload only"
	doStopStart = "stop-start"
	doStop      = "stop"
	doHeld      = "held"
	doBlocked   = "blocked"
	doNoAgent   = "no live agent"
)

// hostView is what the registry says about one live host: every unit key
// meant for it with its groups' halts (as its agent reads them), and the
// statuses it publishes.
type hostView struct {
	Host     string
	Snapshot reconcile.Snapshot
	Statuses map[string]reconcile.Status
}

// prediction is what one host would do with one unit.
type prediction struct {
	Host   string `json:"host"`
	Unit   string `json:"unit"`
	Do     string `json:"do"`
	Reason string `json:"reason,omitempty"`
}

func (p prediction) what() string {
	if p.Do == doBlocked || p.Do == doHeld {
		return p.Do + ": " + p.Reason
	}
	return p.Do
}

// predict says what host v would do with each unit the put of units
// (key suffix → content) to tg touches: for a template, its registry
// instances too. It is pure, and it runs the agent's own planner: the
// registry content the host sees now (reconcile.Desire; a host key
// overrides a group key) stands for what its disk holds and its units run,
// the host's published statuses for what systemd says, the registry after
// the put (the halts the put clears gone) for what it should run, and
// reconcile.Plan — with reconcile.Classify, the OnChange= policy, the
// one-instance-at-a-time rule and the halts inside it — decides.
//
// What it cannot know, and assumes:
//   - The disk holds the registry's current content and the units run it:
//     local drift, a host that has not converged yet (it says so) or a unit
//     file someone else installed (the agent refuses to overwrite it) are
//     not seen.
//   - systemd's state beyond the status: its activeState, subState, loadState
//     and job are used; whether a unit is enabled, whether a stopped unit ran
//     since boot, NeedDaemonReload and what the loop remembers (a refused or
//     failed version, an interrupted pass) are not. A unit without a status
//     is taken as not loaded, inactive.
//   - MaxUnavailable= slots: a disruptive step is shown as it will run, with
//     the slot it waits for named; when it gets it depends on the other hosts.
//   - Health: a new version that fails is rolled back, which no preview can
//     tell.
func predict(v hostView, tg registry.Target, units map[string][]byte) []prediction {
	old := reconcile.Desire(v.Snapshot)
	next := v.Snapshot
	next.Entries = slices.Clone(v.Snapshot.Entries)
	scope := reconcile.ScopeHost
	if tg.Group != "" {
		scope = reconcile.ScopeGroup
	}
	overridden := map[string]bool{} // unit -> a host key hides the group's new key
	for _, k := range slices.Sorted(maps.Keys(units)) {
		_, unit, _ := reconcile.ParseKey(k)
		i := slices.IndexFunc(next.Entries, func(e reconcile.Entry) bool {
			return e.Scope == scope && e.Group == tg.Group && e.Unit == k
		})
		if i >= 0 {
			next.Entries[i].Value = units[k]
		} else {
			next.Entries = append(next.Entries, reconcile.Entry{Scope: scope, Group: tg.Group, Unit: k, Value: units[k]})
		}
		if scope == reconcile.ScopeGroup && slices.ContainsFunc(v.Snapshot.Entries, func(e reconcile.Entry) bool {
			return e.Scope == reconcile.ScopeHost && e.Unit == k
		}) {
			overridden[unit] = true
		}
	}
	next.Halts = nil
	for _, h := range v.Snapshot.Halts {
		if scope == reconcile.ScopeHost || h.Scope != tg.String() || !registry.PutClears(h, units) {
			next.Halts = append(next.Halts, h)
		}
	}
	desired := reconcile.Desire(next)
	cur := currentFrom(old, desired, v.Statuses, next.Halts)
	actions := map[string]reconcile.Action{}
	for _, a := range reconcile.Plan(desired, cur) {
		actions[a.Unit] = a
	}

	// The units touched, in order: a template's instances after it.
	var touched []string
	for k := range units {
		_, unit, _ := reconcile.ParseKey(k)
		if !slices.Contains(touched, unit) {
			touched = append(touched, unit)
		}
	}
	slices.Sort(touched)
	var order []string
	for _, u := range touched {
		order = append(order, u)
		if reconcile.IsTemplate(u) {
			for _, n := range slices.Sorted(maps.Keys(desired)) {
				if reconcile.IsInstance(n) && reconcile.TemplateOf(n) == u && !slices.Contains(touched, n) {
					order = append(order, n)
				}
			}
		}
	}
	// Instances restarted one at a time: how many, for "i of n".
	rolling := map[string][]string{}
	for _, u := range order {
		if a := actions[u]; reconcile.IsInstance(u) && (a.Kind.Disruptive() || isRollingWait(a)) {
			t := reconcile.TemplateOf(u)
			rolling[t] = append(rolling[t], u)
		}
	}

	var out []prediction
	for _, u := range order {
		p := prediction{Host: v.Host, Unit: u}
		a, ok := actions[u]
		switch {
		case !ok:
			p.Do, p.Reason = doNothing, "not meant for this host"
		case sameContent(u, old, desired):
			p.Do, p.Reason = doNothing, "content unchanged"
			if overridden[u] {
				p.Reason = "the host's own key " + "hosts/" + v.Host + "/units/" + u + " overrides the group's"
			}
		default:
			p.Do, p.Reason = describeAction(a)
		}
		if ok && reconcile.IsInstance(u) && p.Do != doNothing {
			if peers := rolling[reconcile.TemplateOf(u)]; len(peers) > 1 && slices.Contains(peers, u) {
				p.Reason = fmt.Sprintf("instance %d of %d, one at a time, each healthy for HealthySec=%d before the next; %s",
					slices.Index(peers, u)+1, len(peers), a.Policy.HealthySec, p.Reason)
			}
		}
		if ok && a.Policy.MaxUnavailable > 0 && a.Scope != "" && (a.Kind.Disruptive() || isRollingWait(a)) {
			p.Reason += fmt.Sprintf(" (after a rollout slot: MaxUnavailable=%d in %s)", a.Policy.MaxUnavailable, a.Scope)
		}
		if st, ok := v.Statuses[u]; ok && p.Do != doNothing && st.Hash != st.DesiredHash && !reconcile.IsInstance(u) {
			p.Reason += " (the host has not converged on the registry's current content; assumed it had)"
		}
		out = append(out, p)
	}
	return out
}

// isRollingWait: an instance that waits for the one before it.
func isRollingWait(a reconcile.Action) bool {
	return a.Kind == reconcile.KindWait && strings.HasPrefix(a.Reason, "waiting for the rolling update")
}

// describeAction turns a planned action into what the operator reads.
func describeAction(a reconcile.Action) (do, reason string) {
	switch a.Kind {
	case reconcile.KindStart:
		return doStart, a.Reason
	case reconcile.KindRestart:
		return doRestart, a.Reason
	case reconcile.KindReload:
		return doReload, a.Reason
	case reconcile.KindStopStart:
		return doStopStart, a.Reason
	case reconcile.KindStop:
		return doStop, a.Reason
	case reconcile.KindBlocked:
		return doBlocked, a.Err
	case reconcile.KindUpdate:
		if a.Err != "" {
			return doBlocked, a.Err + " (the files are written and loaded; the unit keeps running the old version)"
		}
		if reconcile.IsTemplate(a.Unit) {
			return doUpdate, "a template is installed, never started; its running instances restart onto it as listed"
		}
		if a.Enable && a.Disable {
			return doUpdate, a.Reason + " (re-enabled)"
		}
		return doUpdate, a.Reason
	case reconcile.KindWait:
		switch {
		case strings.HasPrefix(a.Reason, "held:"):
			return doHeld, strings.TrimSpace(strings.TrimPrefix(a.Reason, "held:"))
		case isRollingWait(a):
			if a.Policy.OnChange == "stop-start" {
				return doStopStart, a.Reason
			}
			return doRestart, a.Reason
		}
		return "wait", a.Reason
	case reconcile.KindNone:
		return doNothing, orText(a.Reason, "already runs this content")
	}
	return a.Kind.String(), a.Reason
}

func orText(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// sameContent: the unit's files (its template's too, for an instance) are
// the same before and after the put.
func sameContent(u string, old, next map[string]*reconcile.DesiredUnit) bool {
	var key func(m map[string]*reconcile.DesiredUnit, n string) string
	key = func(m map[string]*reconcile.DesiredUnit, n string) string {
		d := m[n]
		if d == nil {
			return "\x00absent"
		}
		if d.Err != nil {
			return "\x00err:" + d.Err.Error()
		}
		k := reconcile.ContentKey(d)
		if reconcile.IsInstance(n) {
			k += "|" + key(m, reconcile.TemplateOf(n))
		}
		return k
	}
	return key(old, u) == key(next, u)
}

// currentFrom builds the planner's view of a host from the registry's
// current content (old) and the host's statuses: see predict for what it
// assumes.
func currentFrom(old, next map[string]*reconcile.DesiredUnit, statuses map[string]reconcile.Status, halts []reconcile.Halt) reconcile.Current {
	cur := reconcile.Current{
		Files:     map[string]reconcile.LocalFile{},
		Managed:   map[string]string{},
		Units:     map[string]reconcile.UnitState{},
		Records:   map[string]reconcile.UnitRecord{},
		Blobs:     map[string][]byte{},
		Refused:   map[string]reconcile.Refusal{},
		Started:   map[string]string{},
		Verifying: map[string]bool{},
		Slots:     map[string]string{},
		Halts:     map[string]reconcile.Halt{},
		Jobs:      map[string]reconcile.InFlight{},
	}
	for _, h := range halts {
		cur.Halts[h.Unit] = h
	}
	for name, d := range old {
		if d.Err != nil {
			continue // blocked now: what the host has of it is unknown
		}
		for _, f := range d.Files() {
			cur.Files[f.Path] = reconcile.LocalFile{Exists: true, Hash: f.Hash, Content: f.Content}
			cur.Managed[f.Path] = f.Hash
			cur.Blobs[f.Hash] = f.Content
		}
		if d.Instance {
			cur.Managed[name] = reconcile.InstanceMarker
		}
	}
	for name, d := range old {
		st, ok := statuses[name]
		if d.Err != nil || !ok || st.Error != "" {
			continue
		}
		eff := map[string]string{}
		for _, f := range d.Files() {
			eff[f.Path] = f.Hash
		}
		if t := old[reconcile.TemplateOf(name)]; reconcile.IsInstance(name) && t != nil && t.Err == nil {
			for _, f := range t.Files() {
				eff[f.Path] = f.Hash
			}
		}
		own := reconcile.OwnDropIns
		switch {
		case d.File != nil:
			own = reconcile.OwnFile
		case d.Instance:
			own = reconcile.OwnInstance
		}
		key := reconcile.KeyOf(eff)
		if len(eff) == 0 && d.Instance {
			key = reconcile.InstanceMarker
		}
		cur.Records[name] = reconcile.UnitRecord{Applied: eff, Own: own}
		cur.Started[name] = key
		if st.Verifying {
			cur.Verifying[name] = true
		}
		if j := jobNamed(st.Job); j != reconcile.JobNone {
			cur.Jobs[name] = reconcile.InFlight{Job: j, ContentKey: key}
		}
	}
	names := map[string]bool{}
	for n := range old {
		names[n] = true
	}
	for n := range next {
		names[n] = true
		cur.Slots[reconcile.SlotKey(n)] = "preview" // shown as it will run once it has its slot
	}
	for n := range names {
		st, ok := statuses[n]
		switch {
		case reconcile.IsTemplate(n):
			cur.Units[n] = reconcile.UnitState{LoadState: "template", ActiveState: "inactive", SubState: "template"}
		case ok:
			cur.Units[n] = reconcile.UnitState{LoadState: orText(st.LoadState, "loaded"), ActiveState: st.ActiveState,
				SubState: st.SubState, Result: st.UnitResult, MainPID: st.MainPID, Ran: true}
		default:
			cur.Units[n] = reconcile.UnitState{LoadState: "not-found", ActiveState: "inactive", SubState: "dead"}
		}
	}
	return cur
}

func jobNamed(s string) reconcile.Job {
	for _, j := range []reconcile.Job{reconcile.JobStart, reconcile.JobStop, reconcile.JobRestart, reconcile.JobReload} {
		if s == j.String() {
			return j
		}
	}
	return reconcile.JobNone
}

// previewFleet reads, for each live host tg targets, its registry view and
// statuses, and predicts what it would do with units. A --host target with
// no live agent gets one "no live agent" line per unit.
func previewFleet(ctx context.Context, reg *registry.Client, tg registry.Target, units map[string][]byte) ([]prediction, error) {
	ms, err := reg.Members(ctx)
	if err != nil {
		return nil, err
	}
	var out []prediction
	found := false
	for _, m := range ms {
		if tg.Host != "" && m.Host != tg.Host || tg.Group != "" && !slices.Contains(m.Groups, tg.Group) {
			continue
		}
		found = true
		snap, err := reg.HostSnapshot(ctx, m.Host, m.Groups)
		if err != nil {
			return nil, err
		}
		sts, err := reg.Statuses(ctx, m.Host)
		if err != nil {
			return nil, err
		}
		out = append(out, predict(hostView{Host: m.Host, Snapshot: snap, Statuses: sts}, tg, units)...)
	}
	if !found {
		who := tg.Host
		why := "no live agent has this host name: it applies the change when it joins"
		if tg.Group != "" {
			who, why = "-", "no live agent is in group "+tg.Group
		}
		for _, k := range slices.Sorted(maps.Keys(units)) {
			out = append(out, prediction{Host: who, Unit: k, Do: doNoAgent, Reason: why})
		}
	}
	return out, nil
}

func printPredictions(out io.Writer, ps []prediction, asJSON bool) error {
	if asJSON {
		for _, p := range ps {
			writeJSONLine(out, p)
		}
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tUNIT\tWOULD\tWHY")
	for _, p := range ps {
		why := p.Reason
		if p.Do == doBlocked || p.Do == doHeld {
			why = ""
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Host, p.Unit, p.what(), why)
	}
	return tw.Flush()
}

// dryRunPut is `unit put --dry-run`: what each targeted live host would do;
// nothing is stored.
func dryRunPut(cmd *cobra.Command, ef *etcdFlags, tg registry.Target, units map[string][]byte, wait, asJSON bool) error {
	if wait {
		return withCode(exitUsage, errors.New("unit put: --dry-run stores nothing, so there is nothing to --wait for"))
	}
	ctx := cmd.Context()
	reg, err := ef.dial(ctx)
	if err != nil {
		return err
	}
	defer reg.Close()
	ps, err := previewFleet(ctx, reg, tg, units)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if err := printPredictions(out, ps, asJSON); err != nil {
		return err
	}
	if !asJSON {
		fmt.Fprintln(out, "dry run: nothing stored")
	}
	return nil
}

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
		ef      etcdFlags
		tf      targetFlags
		yes     bool
		noWait  bool
		timeout time.Duration
		asJSON  bool
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
				for _, p := range preds {
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
			return waitConverged(ctx, reg, tg, units, false, timeout, asJSON, out)
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	tf.bind(cmd)
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "store without asking")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once stored, without waiting for the hosts")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "give up waiting after this long (exit 4)")
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
