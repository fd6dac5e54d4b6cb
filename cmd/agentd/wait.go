package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// Progress states of one host for one key, as `--wait` shows them.
const (
	statePending   = "pending" // the agent has not acted on the new content yet
	stateSlot      = "waiting for a slot"
	stateApplying  = "applying"  // new file not yet in place, or the unit on its way up
	stateVerifying = "verifying" // running the new content, inside HealthySec
	stateHealthy   = "healthy"   // done
	stateRemoved   = "removed"   // done (unit rm)
	stateFailed    = "failed"
	stateRolled    = "rolled back"
	stateHeld      = "held" // the rollout was halted by another host's failure
)

func terminal(state string) bool {
	switch state {
	case stateHealthy, stateRemoved, stateFailed, stateRolled, stateHeld:
		return true
	}
	return false
}

func success(state string) bool { return state == stateHealthy || state == stateRemoved }

// waitConverged blocks until every targeted host reports each unit in a
// final state for the content just written (or gone, for removals), showing
// progress. It judges by the status hash, never by state alone: a host still
// running the old hash is never counted as done.
func waitConverged(ctx context.Context, reg *registry.Client, tg registry.Target, units map[string][]byte, removing bool, timeout time.Duration, asJSON bool, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hosts := []string{tg.Host}
	if tg.Group != "" {
		ms, err := reg.Members(ctx)
		if err != nil {
			return err
		}
		hosts = nil
		for _, m := range ms {
			if slices.Contains(m.Groups, tg.Group) {
				hosts = append(hosts, m.Host)
			}
		}
		if len(hosts) == 0 {
			return withCode(exitFailed, fmt.Errorf("no live agent is in group %s: nothing to wait for", tg.Group))
		}
		slices.Sort(hosts)
	}
	var want []expectation
	for _, key := range slices.Sorted(mapsKeys(units)) {
		content := units[key]
		_, unit, err := reconcile.ParseKey(key)
		if err != nil {
			return withCode(exitUsage, err)
		}
		e := expectation{key: key, unit: unit, hash: reconcile.Hash(content), removing: removing, state: reconcile.StateStarted}
		if len(content) == 0 {
			e.hash = ""
		}
		if p, err := reconcile.ParsePolicy(content); err == nil && key == unit {
			e.state = p.State
		}
		if reconcile.IsTemplate(unit) {
			e.state = reconcile.StatePresent
		}
		want = append(want, e)
	}
	view := newProgressView(out, asJSON, hosts, want)
	var rows map[string]row
	err := reg.WatchStatuses(ctx, hosts, func(all map[string]map[string]reconcile.Status) bool {
		rows = map[string]row{}
		done := true
		var members map[string]bool // read once per update, when a removal needs it
		live := func(h string) func() bool {
			return func() bool {
				if members == nil {
					members = map[string]bool{}
					ms, err := reg.Members(ctx)
					if err != nil {
						return false // not known: not counted as removed on this update
					}
					for _, m := range ms {
						members[m.Host] = true
					}
				}
				return members[h]
			}
		}
		for _, h := range hosts {
			for _, e := range want {
				state, detail := e.judge(all[h], live(h))
				rows[h+"\x00"+e.key] = row{h, e.key, state, detail}
				done = done && terminal(state)
			}
		}
		view.update(rows)
		return done
	})
	var failures []string
	var pending []string
	for _, id := range slices.Sorted(mapsKeys(rows)) {
		r := rows[id]
		switch {
		case success(r.state):
		case terminal(r.state):
			failures = append(failures, fmt.Sprintf("%s %s: %s%s", r.host, r.key, r.state, prefixed(r.detail)))
		default:
			pending = append(pending, fmt.Sprintf("%s %s (%s)", r.host, r.key, r.state))
		}
	}
	if len(failures) > 0 {
		return withCode(exitFailed, errors.New(strings.Join(failures, "; ")))
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return withCode(exitTimeout, fmt.Errorf("timed out after %s; not converged: %s", timeout, strings.Join(pending, "; ")))
	}
	return err
}

type row struct{ host, key, state, detail string }

type expectation struct {
	key, unit string
	hash      string
	removing  bool
	state     reconcile.RunState
}

// judge says where one host is with one key, and why. live says whether
// the host's agent is up (read only for a removal judged by a missing
// status: an agent's statuses are bound to its lease, so they are also
// missing when the agent is down and has removed nothing).
func (e expectation) judge(statuses map[string]reconcile.Status, live func() bool) (state, detail string) {
	st, ok := statuses[e.unit]
	if e.removing {
		if !ok {
			if !live() {
				return statePending, "no live agent on this host: nothing has removed the unit yet"
			}
			return stateRemoved, ""
		}
		if st.Job != "" {
			return stateApplying, st.Job + " job running"
		}
		if e.key != e.unit {
			if _, still := st.DropIns[e.key]; !still {
				return stateRemoved, "drop-in removed"
			}
			return stateApplying, "drop-in still on disk"
		}
		if st.DesiredHash == "" && st.Error != "" {
			return stateFailed, st.Error
		}
		return stateApplying, "still installed (" + st.ActiveState + ")"
	}
	if !ok {
		return statePending, "no status from this host yet"
	}
	if e.key == e.unit && e.hash != "" && st.DesiredHash != e.hash {
		return statePending, "the agent has not seen the new content yet"
	}
	switch st.Action {
	case "wait-slot":
		return stateSlot, "MaxUnavailable"
	case "held":
		return stateHeld, strings.TrimPrefix(st.Error, "held: ")
	case "rolling-back":
		return stateApplying, "rolling back: " + st.Error
	case "rolled-back":
		if st.Error != "" && st.Job == "" {
			return stateRolled, st.Error
		}
	}
	if st.Error != "" {
		return stateFailed, describeFailure(st)
	}
	switch {
	case e.key != e.unit:
		if st.DropIns[e.key] != e.hash {
			return stateApplying, "drop-in not written yet"
		}
	case e.hash != "" && st.Hash != e.hash:
		return stateApplying, "file not replaced yet"
	}
	if reconcile.IsTemplate(e.unit) && e.key == e.unit && e.hash != "" {
		return e.judgeInstances(statuses)
	}
	if st.Job != "" {
		return stateApplying, st.Job + " job running"
	}
	switch e.state {
	case reconcile.StateStarted:
		switch {
		case st.Verifying:
			return stateVerifying, "running " + e.version(st) + ", waiting out HealthySec"
		case st.Health == "healthy":
			return stateHealthy, fmt.Sprintf("%s (%s), %s", st.ActiveState, st.SubState, e.version(st))
		case st.PendingRestart:
			return stateHealthy, "file in place, restart pending (OnChange=none), " + e.version(st)
		case st.ActiveState == "failed":
			return stateFailed, describeFailure(st)
		case e.key != e.unit && !activeState(st.ActiveState):
			// A drop-in on a unit that does not run (a vendor unit the
			// agent never starts): in place is all there is.
			return stateHealthy, "drop-in in place; " + e.unit + " is " + st.ActiveState
		}
		return stateApplying, st.ActiveState + " (" + st.SubState + ")"
	case reconcile.StateStopped:
		if st.ActiveState == "inactive" || st.ActiveState == "failed" {
			return stateHealthy, "stopped, " + e.version(st)
		}
		return stateApplying, st.ActiveState
	}
	return stateHealthy, "installed, " + e.version(st)
}

// version names what a host runs for e: the unit file's hash, or for a
// drop-in its own, for an instance (an empty key) its template's.
func (e expectation) version(st reconcile.Status) string {
	switch {
	case e.key != e.unit:
		return "drop-in " + short(st.DropIns[e.key])
	case st.Hash != "":
		return "hash " + short(st.Hash)
	case st.RunsHash != "":
		return "template " + short(st.RunsHash)
	case reconcile.IsInstance(e.unit):
		return "an instance of " + reconcile.TemplateOf(e.unit)
	}
	return "no file of its own"
}

func describeFailure(st reconcile.Status) string {
	msg := st.Error
	if msg == "" {
		msg = "unit " + st.ActiveState
	}
	if st.UnitResult != "" && st.UnitResult != "success" && !strings.Contains(msg, st.UnitResult) {
		msg += " (unit result: " + st.UnitResult + ")"
	}
	return msg
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

func newProgressView(out io.Writer, asJSON bool, hosts []string, want []expectation) *progressView {
	v := &progressView{out: out, json: asJSON, last: map[string]row{}, start: time.Now()}
	if f, ok := out.(*os.File); ok && !asJSON {
		v.tty = term.IsTerminal(int(f.Fd())) && os.Getenv("TERM") != "dumb"
	}
	for _, h := range hosts {
		for _, e := range want {
			v.order = append(v.order, h+"\x00"+e.key)
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
			writeJSONLine(v.out, map[string]any{"event": "progress", "host": r.host, "key": r.key, "state": r.state, "detail": r.detail,
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
		if success(rows[id].state) {
			done++
		}
	}
	fmt.Fprintf(tw, "%d/%d done, %s\t\t\t\n", done, len(v.order), time.Since(v.start).Round(100*time.Millisecond))
	fmt.Fprintln(tw, "HOST\tUNIT\tSTATE\tDETAIL")
	for _, id := range v.order {
		r := rows[id]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.host, r.key, orDash(r.state), r.detail)
	}
	tw.Flush()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	for _, l := range lines {
		fmt.Fprintf(v.out, "\x1b[2K%s\n", l)
	}
	v.drawn = len(lines)
}

func activeState(s string) bool { return s == "active" || s == "reloading" || s == "activating" }

// judgeInstances: a template's new set is in place on a host once every
// instance there runs it (its RunsHash) and is healthy; one instance
// failed or rolled back fails the host.
func (e expectation) judgeInstances(statuses map[string]reconcile.Status) (state, detail string) {
	var done, waiting, failed int
	why := ""
	rolled := false
	for _, name := range slices.Sorted(mapsKeys(statuses)) {
		st := statuses[name]
		if !reconcile.IsInstance(name) || reconcile.TemplateOf(name) != e.unit {
			continue
		}
		switch {
		case st.Action == "held":
			return stateHeld, name + ": " + strings.TrimPrefix(st.Error, "held: ")
		case st.Action == "rolled-back" || st.Error != "" && st.Action != "rolling-back":
			failed++
			rolled = rolled || st.Action == "rolled-back"
			if why == "" {
				why = name + ": " + describeFailure(st)
			}
		case st.RunsHash == e.hash && st.Health == "healthy" && !st.Verifying && st.Job == "":
			done++
		default:
			waiting++
		}
	}
	detail = fmt.Sprintf("instances: %d done, %d waiting, %d failed", done, waiting, failed)
	switch {
	case failed > 0 && rolled:
		return stateRolled, detail + "; " + why
	case failed > 0:
		return stateFailed, detail + "; " + why
	case waiting > 0:
		return stateApplying, detail
	}
	return stateHealthy, detail
}
