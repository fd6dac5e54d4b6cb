package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
)

// hostView is what the registry says about one live host (see
// reconcile.HostView).
type hostView = reconcile.HostView

// predict says what host v would do with each unit the put of units (key
// suffix → content) to tg touches: reconcile.Preview, the agent's own
// planner, on the registry as the put leaves it (with the halts the put
// clears gone, by the rule the registry applies).
func predict(v hostView, tg registry.Target, units map[string][]byte) []reconcile.Prediction {
	put := reconcile.Put{Scope: tg.Scope(), Group: tg.Group, Units: units}
	for _, h := range v.Snapshot.Halts {
		if tg.Group == "" || h.Scope != tg.String() || !registry.PutClears(h, units) {
			put.Halts = append(put.Halts, h)
		}
	}
	return reconcile.Preview(v, put)
}

// fleetPreview is what each live host tg targets would do with a put, and
// the hosts that publish no facts (their previews cannot see files agentd
// did not write, nor content they refused before).
type fleetPreview struct {
	Predictions []reconcile.Prediction
	NoFacts     []string
}

// previewFleet reads, for each live host tg targets, its registry view,
// statuses and facts, and predicts what it would do with units. A member
// of the group whose agent is down, and a --host target with no live
// agent, get one "no live agent" line per unit that says so: the change
// waits for them, and an operator who previews a group should see every
// host the change will reach.
func previewFleet(ctx context.Context, reg *registry.Client, tg registry.Target, units map[string][]byte) (fleetPreview, error) {
	var out fleetPreview
	known, err := reg.KnownHosts(ctx)
	if err != nil {
		return out, err
	}
	noAgent := func(host, why string) {
		for _, k := range slices.Sorted(maps.Keys(units)) {
			out.Predictions = append(out.Predictions, reconcile.Prediction{Host: host, Unit: k, Do: reconcile.DoNoAgent, Reason: why})
		}
	}
	found := false
	for _, k := range known {
		if tg.Host != "" && k.Host != tg.Host || tg.Group != "" && !slices.Contains(k.Groups, tg.Group) {
			continue
		}
		found = true
		if !k.Live {
			noAgent(k.Host, "down ("+lastSeen([]registry.KnownHost{k}).describe(k.Host)+"): it applies the change when its agent returns")
			continue
		}
		v, err := readHostView(ctx, reg, k.Member)
		if err != nil {
			return out, err
		}
		if v.Facts == nil {
			out.NoFacts = append(out.NoFacts, k.Host)
		}
		out.Predictions = append(out.Predictions, predict(v, tg, units)...)
	}
	switch {
	case found:
	case tg.Group != "":
		noAgent("-", "no host has joined group "+tg.Group)
	default:
		noAgent(tg.Host, "no agent has joined with this host name: it applies the change when it joins")
	}
	return out, nil
}

// readHostView reads what a preview needs of host m.
func readHostView(ctx context.Context, reg *registry.Client, m reconcile.Member) (hostView, error) {
	snap, err := reg.HostSnapshot(ctx, m.Host, m.Groups)
	if err != nil {
		return hostView{}, err
	}
	sts, err := reg.Statuses(ctx, m.Host)
	if err != nil {
		return hostView{}, err
	}
	facts, err := reg.Facts(ctx, m.Host)
	if err != nil {
		return hostView{}, err
	}
	return hostView{Host: m.Host, Snapshot: snap, Statuses: sts, Facts: facts, Labels: m.Labels}, nil
}

// what is the WOULD column: a refusal or hold says why in it.
func what(p reconcile.Prediction) string {
	if p.Do == reconcile.DoBlocked || p.Do == reconcile.DoHeld {
		return p.Do + ": " + p.Reason
	}
	return p.Do
}

func printPredictions(out io.Writer, fp fleetPreview, asJSON bool) error {
	if asJSON {
		for _, p := range fp.Predictions {
			writeJSONLine(out, p)
		}
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tUNIT\tWOULD\tWHY")
	for _, p := range fp.Predictions {
		why := p.Reason
		if p.Do == reconcile.DoBlocked || p.Do == reconcile.DoHeld {
			why = ""
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Host, p.Unit, what(p), why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, h := range fp.NoFacts {
		fmt.Fprintf(out, "note: %s publishes no facts yet (an older agent, or its first pass is not done): files agentd did not write there are not seen\n", h)
	}
	return nil
}

// dryRunPut is `unit put --dry-run`: what each targeted live host would do;
// nothing is stored.
func dryRunPut(cmd *cobra.Command, ef *etcdFlags, tf *targetFlags, tg registry.Target, units map[string][]byte, wait, asJSON bool, sf *strategyFlags) error {
	if wait {
		return withCode(exitUsage, errors.New("unit put: --dry-run stores nothing, so there is nothing to --wait for"))
	}
	return withRegistry(cmd, ef, func(ctx context.Context, reg *registry.Client) error {
		if tf.isSelector() {
			reg.AssumeSelector(tf.sel) // counted, not recorded
		}
		// What the registry would refuse, the dry run refuses too.
		if err := reg.CheckPut(ctx, tg, units, writeOptions(cmd)...); err != nil {
			return writeError(err)
		}
		fp, err := previewFleet(ctx, reg, tg, units)
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		if err := printPredictions(out, fp, asJSON); err != nil {
			return err
		}
		if err := previewRollout(ctx, out, reg, tg, sf, asJSON); err != nil {
			return err
		}
		if !asJSON {
			fmt.Fprintln(out, "dry run: nothing stored")
		}
		return nil
	})
}

// previewRollout says how a write with sf's rollout options would be
// staged: which hosts in which wave (the canary first), the soak, and
// what holds each wave; nothing when sf is not a rollout. The same rule
// cuts the waves as the real write (strategyFlags.newRollout).
func previewRollout(ctx context.Context, out io.Writer, reg *registry.Client, tg registry.Target, sf *strategyFlags, asJSON bool) error {
	if sf == nil || !sf.s.IsRollout() {
		return nil
	}
	r, err := sf.newRollout(ctx, reg, tg.Group, io.Discard)
	if err != nil {
		return err
	}
	if asJSON {
		waves := make([][]string, len(r.WaveEnds))
		for w := range r.WaveEnds {
			waves[w] = r.WaveHosts(w)
		}
		writeJSONLine(out, map[string]any{"event": "rollout-preview", "group": r.Group, "hosts": len(r.Hosts), "waves": waves, "strategy": r.Strategy})
		return nil
	}
	fmt.Fprintf(out, "rollout: %d %s of group %s in %d %s (%s)\n", len(r.Hosts), plural(len(r.Hosts), "host", "hosts"), r.Group,
		len(r.WaveEnds), plural(len(r.WaveEnds), "wave", "waves"), describeStrategy(r.Strategy))
	for w := range r.WaveEnds {
		hosts := r.WaveHosts(w)
		what := ""
		switch {
		case w == 0 && !r.Strategy.Canary.IsZero():
			what = " (canary)"
		case w > 0 && r.Strategy.PauseAfterCanary && w == 1:
			what = " (after `agentd rollout promote`)"
		case w > 0 && r.Strategy.Gated():
			what = " (after the gate)"
		}
		fmt.Fprintf(out, "  wave %d%s: %s\n", w+1, what, rollout.NameHosts(hosts, len(hosts)))
	}
	if r.Strategy.Soak > 0 {
		fmt.Fprintf(out, "  each host healthy for %s before it counts\n", r.Strategy.Soak)
	}
	return nil
}

// warnRefusals is what a put without --wait says on stderr about the hosts
// known to refuse it (their facts say so: a file agentd did not write is in
// the way, content they refused before): the put is stored all the same,
// and the exit code does not change. Only the hosts whose facts name a
// path or unit of the put are previewed in full; reading the facts of a
// group is one request.
func warnRefusals(ctx context.Context, w io.Writer, reg *registry.Client, tg registry.Target, units map[string][]byte) error {
	facts, err := reg.AllFacts(ctx)
	if err != nil {
		return err
	}
	ms, err := reg.Members(ctx)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if tg.Host != "" && m.Host != tg.Host || tg.Group != "" && !slices.Contains(m.Groups, tg.Group) {
			continue
		}
		if f := facts[m.Host]; f == nil || !mayRefuse(*f, units) {
			continue
		}
		v, err := readHostView(ctx, reg, m)
		if err != nil {
			return err
		}
		for _, p := range predict(v, tg, units) {
			if p.Refuses() {
				fmt.Fprintf(w, "warning: %s would refuse %s: %s\n", p.Host, p.Unit, p.Reason)
			}
		}
	}
	return nil
}

// mayRefuse says whether facts name a path or unit of the put: only then
// can they turn its preview into a refusal.
func mayRefuse(f reconcile.Facts, units map[string][]byte) bool {
	for k := range units {
		_, unit, _ := reconcile.ParseKey(k)
		if _, ok := f.Unowned[k]; ok {
			return true
		}
		if _, ok := f.Unowned[unit]; ok {
			return true
		}
		if _, ok := f.Refused[unit]; ok {
			return true
		}
		if _, ok := f.Failed[unit]; ok {
			return true
		}
	}
	return false
}
