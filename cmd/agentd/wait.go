package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// waitSpec is what one `--wait` follows: the keys a command wrote to one
// target, at one revision.
type waitSpec struct {
	target   registry.Target
	units    map[string][]byte // unit key → content written (nil: an instance, or a removal)
	removing bool
	revision int64 // of the write: a host's answer counts once it has acted on it
	timeout  time.Duration
	json     bool
	// skipUnreachable: a member without a live agent does not hold up
	// the answer; it is named, and the exit code says so.
	skipUnreachable bool
}

// waitConverged blocks until every targeted host reports each key in a
// final state for the write (reconcile.Expectation.Judge, the one
// judgement of converged), showing progress. A host's answer counts only
// once it has acted on the write's revision. A later write of other
// content to one of the keys ends the wait at once (exit 5): this write
// will never run. A group's members are all the hosts that joined it, live
// or not.
func waitConverged(ctx context.Context, reg *registry.Client, w waitSpec, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	known, err := reg.KnownHosts(ctx)
	if err != nil {
		return err
	}
	hosts := []string{w.target.Host}
	if w.target.Group != "" {
		hosts = nil
		for _, k := range known {
			if slices.Contains(k.Groups, w.target.Group) {
				hosts = append(hosts, k.Host)
			}
		}
		if len(hosts) == 0 {
			return withCode(exitFailed, fmt.Errorf("no host has joined group %s: nothing to wait for", w.target.Group))
		}
	}
	var want []reconcile.Expectation
	hashes := map[string]string{}
	for _, key := range slices.Sorted(mapsKeys(w.units)) {
		e, err := reconcile.Expect(key, w.units[key], w.removing, w.revision)
		if err != nil {
			return withCode(exitUsage, err)
		}
		want = append(want, e)
		if !w.removing {
			hashes[key] = reconcile.Hash(w.units[key])
		} else {
			hashes[key] = ""
		}
	}

	// A later write of other content to a key waited on: this one will
	// never run, and waiting out --timeout would only hide that.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	over := make(chan registry.Overwrite, 1)
	var watchers sync.WaitGroup
	defer watchers.Wait()
	defer stopWatch()
	if w.revision > 0 {
		watchers.Go(func() {
			if o, err := reg.WatchOverwrite(wctx, w.target, hashes, w.revision); err == nil {
				over <- o
				stopWatch()
			}
		})
	}

	view := newProgressView(out, w.json, hosts, want)
	seen := lastSeen(known)
	// A live agent from before pass records never publishes one.
	legacy := map[string]bool{}
	for _, k := range known {
		legacy[k.Host] = k.Live && !k.PassRecords
	}
	var rows map[string]row
	err = reg.WatchReports(wctx, hosts, func(all map[string]reconcile.HostReport) bool {
		rows = map[string]row{}
		done := true
		var live map[string]bool // read once per update, when a host has published no pass
		isLive := func(h string) func() bool {
			return func() bool {
				if live == nil {
					live = map[string]bool{}
					ks, err := reg.KnownHosts(ctx)
					if err != nil {
						return true // not known: the host is waited for, not skipped
					}
					for _, k := range ks {
						live[k.Host] = k.Live
					}
					seen = lastSeen(ks)
				}
				return live[h]
			}
		}
		for _, h := range hosts {
			for _, e := range want {
				if legacy[h] {
					e.Revision = 0 // its answers are its statuses alone
				}
				p, detail := e.Judge(all[h], isLive(h))
				if p == reconcile.ProgressNoAgent {
					detail = seen.describe(h)
				}
				rows[h+"\x00"+e.Key] = row{h, e.Key, p, detail}
				done = done && (p.Terminal() || p == reconcile.ProgressNoAgent && w.skipUnreachable)
			}
		}
		view.update(rows)
		return done
	})
	stopWatch()
	watchers.Wait()
	select {
	case o := <-over:
		return withCode(exitSuperseded, errors.New(describeOverwrite(w.target, o)))
	default:
	}
	var failures, pending, skipped []string
	for _, id := range slices.Sorted(mapsKeys(rows)) {
		r := rows[id]
		switch {
		case r.state.Success():
		case r.state == reconcile.ProgressSuperseded:
			return withCode(exitSuperseded, fmt.Errorf("%s %s: superseded — %s", r.host, r.key, r.detail))
		case r.state.Terminal():
			failures = append(failures, fmt.Sprintf("%s %s: %s%s", r.host, r.key, r.state, prefixed(r.detail)))
		case r.state == reconcile.ProgressNoAgent && w.skipUnreachable:
			skipped = append(skipped, fmt.Sprintf("%s %s (no live agent, %s)", r.host, r.key, seen.describe(r.host)))
		case r.state == reconcile.ProgressNoAgent:
			pending = append(pending, fmt.Sprintf("%s %s (no live agent, %s)", r.host, r.key, seen.describe(r.host)))
		default:
			pending = append(pending, fmt.Sprintf("%s %s (%s%s)", r.host, r.key, r.state, prefixed(r.detail)))
		}
	}
	if len(failures) > 0 {
		return withCode(exitFailed, errors.New(strings.Join(failures, "; ")))
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return withCode(exitTimeout, fmt.Errorf("timed out after %s; not converged: %s", w.timeout, strings.Join(pending, "; ")))
	}
	if err != nil {
		return err
	}
	if len(skipped) > 0 {
		return withCode(exitSkipped, fmt.Errorf("every host with a live agent converged; skipped: %s", strings.Join(skipped, "; ")))
	}
	return nil
}

// bindSkipUnreachable adds --skip-unreachable to a command with --wait.
func bindSkipUnreachable(cmd *cobra.Command, skip *bool) {
	cmd.Flags().BoolVar(skip, "skip-unreachable", false,
		"with --wait: do not wait for group members without a live agent; name them and exit 6 once the others converged")
}

type row struct {
	host, key string
	state     reconcile.Progress
	detail    string
}

// seenTimes is when each known host's agent was last seen.
type seenTimes map[string]registry.KnownHost

func lastSeen(ks []registry.KnownHost) seenTimes {
	m := seenTimes{}
	for _, k := range ks {
		m[k.Host] = k
	}
	return m
}

// describe says of a host without a live agent when it was last seen.
func (s seenTimes) describe(h string) string {
	k, ok := s[h]
	if !ok || k.LastSeen.IsZero() {
		return "never seen"
	}
	return "last seen " + ago(time.Since(k.LastSeen)) + " ago"
}

func ago(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h", int(d.Hours()))
	}
	return fmt.Sprintf("%d days", int(d.Hours()/24))
}

// describeOverwrite says which later write took the place of the one
// waited on, and who stored it where the history has it.
func describeOverwrite(t registry.Target, o registry.Overwrite) string {
	what := "hash " + short(o.Hash)
	if o.Removed {
		what = "removed"
	}
	msg := fmt.Sprintf("%s/units/%s: superseded by revision %d (%s", t, o.Unit, o.Revision, what)
	if o.User != "" {
		msg += ", stored by " + o.User
	}
	if !o.Time.IsZero() {
		msg += " at " + o.Time.Local().Format(time.DateTime)
	}
	return msg + "): the registry no longer holds this write; the hosts go to the newer one"
}

// progressView shows --wait progress: a table redrawn in place on a
// terminal, one line per change otherwise, JSON lines with --json.
type progressView struct {
	out   io.Writer
	json  bool
	tty   bool
	order []string
	last  map[string]row
	drawn int
	start time.Time
}

func newProgressView(out io.Writer, asJSON bool, hosts []string, want []reconcile.Expectation) *progressView {
	v := &progressView{out: out, json: asJSON, last: map[string]row{}, start: time.Now()}
	if f, ok := out.(*os.File); ok && !asJSON {
		v.tty = term.IsTerminal(int(f.Fd())) && os.Getenv("TERM") != "dumb"
	}
	for _, h := range hosts {
		for _, e := range want {
			v.order = append(v.order, h+"\x00"+e.Key)
		}
	}
	return v
}

func (v *progressView) update(rows map[string]row) {
	if v.tty {
		v.redraw(rows)
		return
	}
	for _, id := range v.order {
		r, ok := rows[id]
		if !ok || v.last[id] == r {
			continue
		}
		v.last[id] = r
		if v.json {
			writeJSONLine(v.out, map[string]any{"event": "progress", "host": r.host, "key": r.key, "state": r.state.String(), "detail": r.detail,
				"elapsedMs": time.Since(v.start).Milliseconds()})
		} else {
			fmt.Fprintf(v.out, "%s %s: %s%s\n", r.host, r.key, r.state, prefixed(r.detail))
		}
	}
}

func (v *progressView) redraw(rows map[string]row) {
	if v.drawn > 0 {
		fmt.Fprintf(v.out, "\x1b[%dA", v.drawn) // back to the top of the table
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	done := 0
	for _, id := range v.order {
		if rows[id].state.Success() {
			done++
		}
	}
	fmt.Fprintf(tw, "%d/%d done, %s\t\t\t\n", done, len(v.order), time.Since(v.start).Round(100*time.Millisecond))
	fmt.Fprintln(tw, "HOST\tUNIT\tSTATE\tDETAIL")
	for _, id := range v.order {
		r := rows[id]
		state := "-"
		if _, ok := rows[id]; ok {
			state = r.state.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.host, r.key, state, r.detail)
	}
	tw.Flush()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	for _, l := range lines {
		fmt.Fprintf(v.out, "\x1b[2K%s\n", l)
	}
	v.drawn = len(lines)
}
