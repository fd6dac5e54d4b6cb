package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
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
	"github.com/agentd/agentd/rollout"
)

// waitSpec is what one `--wait` follows: the keys a command wrote to one
// target, at one revision.
type waitSpec struct {
	target   registry.Target
	units    map[string][]byte // unit key → content written (nil: an instance, or a removal)
	removing bool
	revision int64 // of the write: a host's answer counts once it has acted on it
	json     bool
	waitFlags
}

// waitFlags are the flags every command with --wait shares.
type waitFlags struct {
	timeout time.Duration
	// skipUnreachable: a member without a live agent does not hold up
	// the answer; it is named, and the exit code says so.
	skipUnreachable bool
}

// bind adds --timeout and --skip-unreachable to a command with --wait.
func (f *waitFlags) bind(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&f.timeout, "timeout", 2*time.Minute, "give up waiting after this long (exit 4)")
	cmd.Flags().BoolVar(&f.skipUnreachable, "skip-unreachable", false,
		"with --wait: do not wait for group members without a live agent; name them and exit 6 once the others converged")
}

// waitConverged blocks until every targeted host reports each key in a
// final state for the write (reconcile.Expectation.Assess, the one
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
	hosts, err := w.targetHosts(known)
	if err != nil {
		return err
	}
	want, hashes, err := w.expectations()
	if err != nil {
		return err
	}

	// A later write of other content to a key waited on: this one will
	// never run, and waiting out --timeout would only hide that.
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var watchers sync.WaitGroup
	defer watchers.Wait()
	defer stopWatch()
	over := w.watchOverwrite(wctx, stopWatch, reg, hashes, &watchers)

	rows, seen, err := w.watchReports(ctx, wctx, reg, hosts, want, known, out)
	stopWatch()
	watchers.Wait()
	select {
	case o := <-over:
		return withCode(exitSuperseded, errors.New(describeOverwrite(w.target, o)))
	default:
	}
	return w.verdict(rows, seen, err)
}

// targetHosts are the hosts w waits for: its host, or every known host
// (live or not) that joined its group; none is an error (exit 3).
func (w waitSpec) targetHosts(known []registry.KnownHost) ([]string, error) {
	if w.target.Group == "" {
		return []string{w.target.Host}, nil
	}
	var hosts []string
	for _, k := range known {
		if slices.Contains(k.Groups, w.target.Group) {
			hosts = append(hosts, k.Host)
		}
	}
	if len(hosts) == 0 {
		return nil, withCode(exitFailed, fmt.Errorf("no host has joined group %s: nothing to wait for", w.target.Group))
	}
	return hosts, nil
}

// expectations are what w waits for of each key, in key order, and the
// hash each key holds after the write ("" for a removal).
func (w waitSpec) expectations() ([]reconcile.Expectation, map[string]string, error) {
	var want []reconcile.Expectation
	hashes := map[string]string{}
	for _, key := range slices.Sorted(maps.Keys(w.units)) {
		e, err := reconcile.Expect(key, w.units[key], w.removing, w.revision)
		if err != nil {
			return nil, nil, withCode(exitUsage, err)
		}
		want = append(want, e)
		if !w.removing {
			hashes[key] = reconcile.Hash(w.units[key])
		} else {
			hashes[key] = ""
		}
	}
	return want, hashes, nil
}

// watchOverwrite watches, on a goroutine of watchers, for a later write
// of other content than hashes to a key of w (not for a write without a
// revision). The first is sent on the returned channel, and stop is called.
func (w waitSpec) watchOverwrite(ctx context.Context, stop context.CancelFunc, reg *registry.Client, hashes map[string]string,
	watchers *sync.WaitGroup) <-chan registry.Overwrite {
	over := make(chan registry.Overwrite, 1)
	if w.revision > 0 {
		watchers.Go(func() {
			if o, err := reg.WatchOverwrite(ctx, w.target, hashes, w.revision); err == nil {
				over <- o
				stop()
			}
		})
	}
	return over
}

// watchReports follows the hosts' reports with wctx, judging each key of
// want on each host at every change and showing progress on out, until
// every row is final (or, with skipUnreachable, has no live agent) or wctx
// ends. It returns the last rows, when each host was last seen as last
// read, and the watch's error. Liveness is read with ctx (see liveOnce).
func (w waitSpec) watchReports(ctx, wctx context.Context, reg *registry.Client, hosts []string, want []reconcile.Expectation,
	known []registry.KnownHost, out io.Writer) (map[string]row, seenTimes, error) {
	view := newProgressView(out, w.json, hosts, want)
	seen := lastSeen(known)
	// A live agent from before pass records never publishes one.
	legacy := map[string]bool{}
	for _, k := range known {
		legacy[k.Host] = k.Live && !k.PassRecords
	}
	var rows map[string]row
	err := reg.WatchReports(wctx, hosts, func(all map[string]reconcile.HostReport) bool {
		var done bool
		rows, done = w.judgeRows(all, hosts, want, legacy, liveOnce(ctx, reg, &seen), &seen)
		view.update(rows)
		return done
	})
	return rows, seen, err
}

// judgeRows judges each key of want on each host from the hosts' reports
// (all); a legacy host (a live agent from before pass records) by its
// statuses alone. done says every row is final, or, with skipUnreachable,
// has no live agent. A row without a live agent says when the host was
// last seen.
func (w waitSpec) judgeRows(all map[string]reconcile.HostReport, hosts []string, want []reconcile.Expectation, legacy map[string]bool,
	isLive func(h string) func() bool, seen *seenTimes) (rows map[string]row, done bool) {
	rows = map[string]row{}
	done = true
	for _, h := range hosts {
		for _, e := range want {
			if legacy[h] {
				e.Revision = 0 // its answers are its statuses alone
			}
			p, detail := e.Assess(all[h], isLive(h))
			joining := p == reconcile.ProgressNoAgent && !seen.joined(h)
			switch {
			case joining:
				// Not down: not there yet (an agent about to start, as
				// in `make demo`). Said quietly, as any pending row.
				detail = "waiting for " + h + " to join"
			case p == reconcile.ProgressNoAgent:
				detail = seen.describe(h)
			}
			rows[h+"\x00"+e.Key] = row{h, e.Key, p, detail, joining}
			done = done && (p.Terminal() || p == reconcile.ProgressNoAgent && w.skipUnreachable)
		}
	}
	return rows, done
}

// liveOnce is, for one update of the reports, whether host h has a live
// agent: read from the registry the first time it is asked (a host that
// has published no pass), at most once per update, refreshing *seen.
func liveOnce(ctx context.Context, reg *registry.Client, seen *seenTimes) func(h string) func() bool {
	var (
		live  map[string]bool
		asked bool
	)
	return func(h string) func() bool {
		return func() bool {
			if !asked {
				asked = true
				if ks, err := reg.KnownHosts(ctx); err == nil {
					live = map[string]bool{}
					for _, k := range ks {
						live[k.Host] = k.Live
					}
					*seen = lastSeen(ks)
				}
			}
			if live == nil {
				return true // not known on this update: every host is waited for, none skipped
			}
			return live[h]
		}
	}
}

// verdict is the outcome of a wait from its last rows, when each host was
// last seen, and the error that ended the status watch: a row superseded
// (exit 5), else failures (exit 3), else a timeout with what is pending
// (exit 4), else the watch's error, else rows skipped for want of a live
// agent (exit 6), else nil.
func (w waitSpec) verdict(rows map[string]row, seen seenTimes, err error) error {
	var failures, pending, skipped []string
	for _, id := range slices.Sorted(maps.Keys(rows)) {
		r := rows[id]
		switch {
		case r.state.Success():
		case r.state == reconcile.ProgressSuperseded:
			return withCode(exitSuperseded, fmt.Errorf("%s %s: superseded — %s", r.host, r.key, r.detail))
		case r.state.Terminal():
			failures = append(failures, fmt.Sprintf("%s %s: %s%s", r.host, r.key, r.state, prefixed(r.detail)))
		case r.joining:
			what := fmt.Sprintf("%s %s (%s has not joined: no agent has run with this host name)", r.host, r.key, r.host)
			if w.skipUnreachable {
				skipped = append(skipped, what)
			} else {
				pending = append(pending, what)
			}
		case r.state == reconcile.ProgressNoAgent && w.skipUnreachable:
			skipped = append(skipped, fmt.Sprintf("%s %s (no live agent, %s)", r.host, r.key, seen.describe(r.host)))
		case r.state == reconcile.ProgressNoAgent:
			pending = append(pending, fmt.Sprintf("%s %s (no live agent, %s)", r.host, r.key, seen.describe(r.host)))
		default:
			pending = append(pending, fmt.Sprintf("%s %s (%s%s)", r.host, r.key, r.state, prefixed(r.detail)))
		}
	}
	if len(failures) > 0 {
		return withCode(exitFailed, errors.New(joinCapped(failures)))
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return withCode(exitTimeout, fmt.Errorf("timed out after %s; not converged: %s", w.timeout, joinCapped(pending)))
	}
	if err != nil {
		return err
	}
	if len(skipped) > 0 {
		return withCode(exitSkipped, fmt.Errorf("every host with a live agent converged; skipped: %s", joinCapped(skipped)))
	}
	return nil
}

// joinCapped joins the first rollout.SampleSize items and counts the
// rest: a message about 1,000 hosts stays one readable line.
func joinCapped(items []string) string {
	if len(items) <= rollout.SampleSize {
		return strings.Join(items, "; ")
	}
	return strings.Join(items[:rollout.SampleSize], "; ") + fmt.Sprintf("; and %d more", len(items)-rollout.SampleSize)
}

type row struct {
	host, key string
	state     reconcile.Progress
	detail    string
	// joining: no live agent because none has ever joined as host (not
	// one that went down); shown as waiting, not as a fault.
	joining bool
}

// stateWord is the row's state as the progress view shows it.
func (r row) stateWord() string {
	if r.joining {
		return "joining"
	}
	return r.state.String()
}

// line is the row as one line of progress.
func (r row) line() string {
	if r.joining {
		return fmt.Sprintf("%s %s: %s", r.host, r.key, r.detail)
	}
	return fmt.Sprintf("%s %s: %s%s", r.host, r.key, r.state, prefixed(r.detail))
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

// joined says an agent has been seen as host h (it may be down now).
func (s seenTimes) joined(h string) bool {
	k, ok := s[h]
	return ok && (k.Live || !k.LastSeen.IsZero())
}

// describe says of a host without a live agent when it was last seen.
func (s seenTimes) describe(h string) string {
	k, ok := s[h]
	if !ok || k.LastSeen.IsZero() {
		return "never seen"
	}
	return "last seen " + ago(time.Since(k.LastSeen)) + " ago"
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
			writeJSONLine(v.out, map[string]any{"event": "progress", "host": r.host, "key": r.key, "state": r.stateWord(), "detail": r.detail,
				"elapsedMs": time.Since(v.start).Milliseconds()})
		} else {
			fmt.Fprintln(v.out, r.line())
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
			state = r.stateWord()
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
