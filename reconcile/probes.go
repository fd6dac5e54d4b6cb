package reconcile

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"
)

// probes are the health probes the agent runs, and what runs them: one
// target per unit whose running version has probes. Like the jobs, each
// probe round runs in a goroutine the agent owns (wg), bounded by
// HealthTimeoutSec= per check, and hands its result to the loop over done:
// a hung probe never holds up the loop. Loop-owned; it decides nothing of
// the unit's health (Health does, from ProbeState) and writes no record;
// it tells the Observer what its probes say.
//
// A round starts only while systemd says the unit is active and no job of
// the agent's runs on it, at most every HealthIntervalSec=, never two at
// once for a unit. A new job on the unit, or a new version, starts its
// probes afresh (reset): a round begun before counts for nothing.
type probes struct {
	run     Prober
	obs     Observer
	log     *slog.Logger
	targets map[string]*probeTarget
	seq     uint64
	done    chan probeResult
	wg      sync.WaitGroup
	timer   *time.Timer // the next round due; armed only when one is
	armed   bool
}

// probeTarget is one unit's probes.
type probeTarget struct {
	key     string // the content key of the version probed
	spec    Probes
	gen     uint64 // a round of another generation is dropped
	state   ProbeState
	cancel  context.CancelFunc // the round in flight, nil when none
	next    time.Time          // when the next round is due
	failing bool               // said to be failing (the transitions logged)
}

type probeResult struct {
	unit    string
	gen     uint64
	results []CheckResult
}

func newProbes(p Prober, obs Observer, log *slog.Logger) probes {
	if p == nil {
		p = noProber{}
	}
	t := time.NewTimer(time.Hour)
	t.Stop()
	return probes{run: p, obs: obs, log: log, targets: map[string]*probeTarget{}, done: make(chan probeResult, 64), timer: t}
}

// wake is the channel of the next round due, nil when none is.
func (p *probes) wake() <-chan time.Time {
	if !p.armed {
		return nil
	}
	return p.timer.C
}

// set makes unit's probes those of spec on the version key (none: it has
// no target). A new version or spec starts afresh.
func (p *probes) set(unit, key string, spec Probes) {
	t := p.targets[unit]
	switch {
	case !spec.Any():
		p.drop(unit)
	case t == nil:
		p.seq++
		p.targets[unit] = &probeTarget{key: key, spec: spec, gen: p.seq}
	case t.key != key || t.spec != spec:
		t.key, t.spec = key, spec
		p.reset(unit)
	}
}

// has says unit has a target for the version key.
func (p *probes) has(unit, key string) bool {
	t := p.targets[unit]
	return t != nil && t.key == key
}

// drop forgets unit's probes, ending its round in flight.
func (p *probes) drop(unit string) bool {
	t := p.targets[unit]
	if t == nil {
		return false
	}
	if t.cancel != nil {
		t.cancel()
	}
	delete(p.targets, unit)
	return true
}

// reset starts unit's probes afresh (a job on it starts): the round in
// flight is ended and dropped, what was counted forgotten.
func (p *probes) reset(unit string) {
	t := p.targets[unit]
	if t == nil {
		return
	}
	if t.cancel != nil {
		t.cancel()
		t.cancel = nil
	}
	p.seq++
	t.gen, t.state, t.next, t.failing = p.seq, ProbeState{}, time.Time{}, false
}

// stateOf is where unit's probes stand on the version key (zero when it
// has none, or probes another version).
func (p *probes) stateOf(unit, key string) ProbeState {
	if t := p.targets[unit]; t != nil && t.key == key {
		return t.state
	}
	return ProbeState{}
}

// launchDue starts the rounds due at now of the units eligible (systemd
// says active, no job runs), and arms the timer for the next one due. A
// unit not eligible now is looked at again after the next pass: what
// makes it eligible (a signal, a job's end) brings one.
//
// With no target, or ctx ending (shutting down), it starts nothing.
func (p *probes) launchDue(ctx context.Context, now time.Time, eligible func(unit string) bool) {
	if len(p.targets) == 0 || ctx.Err() != nil {
		p.timer.Stop()
		p.armed = false
		return
	}
	var next time.Time
	for _, u := range slices.Sorted(maps.Keys(p.targets)) {
		t := p.targets[u]
		if t.cancel != nil || !eligible(u) {
			continue
		}
		if t.next.After(now) {
			if next.IsZero() || t.next.Before(next) {
				next = t.next
			}
			continue
		}
		p.launch(ctx, u, t, now)
	}
	p.timer.Stop()
	p.armed = !next.IsZero()
	if p.armed {
		p.timer.Reset(next.Sub(now))
	}
}

// launch starts a round of t's checks in the background.
func (p *probes) launch(ctx context.Context, unit string, t *probeTarget, now time.Time) {
	rctx, cancel := context.WithCancel(ctx)
	t.cancel, t.next = cancel, now.Add(t.spec.Every())
	gen, spec := t.gen, t.spec
	p.wg.Go(func() {
		defer cancel()
		r := probeResult{unit: unit, gen: gen, results: probeRound(rctx, p.run, unit, spec)}
		if rctx.Err() != nil {
			return // reset, dropped or shutting down: it counts for nothing
		}
		select {
		case p.done <- r:
		case <-ctx.Done():
		}
	})
}

// probeTransition is a change of a unit's probes worth a line of its own.
type probeTransition int

const (
	probeSteady  probeTransition = iota
	probeFailing                 // HealthRetries failures in a row
	probeBack                    // passing again after failing
)

// count counts a round's result on its unit's target (nil for a round
// that no longer counts), and says whether the status text changed and
// whether the probes started or stopped failing.
func (p *probes) count(r probeResult) (t *probeTarget, changed bool, tr probeTransition) {
	t = p.targets[r.unit]
	if t == nil || t.gen != r.gen {
		return nil, false, probeSteady
	}
	t.cancel = nil
	n := t.spec.FailAfter()
	before := t.state.Text(n)
	t.state = t.state.after(r.results)
	switch failing := t.state.Failing(n); {
	case failing && !t.failing:
		tr = probeFailing
	case t.failing && t.state.Passing():
		tr = probeBack
	}
	if tr != probeSteady {
		t.failing = tr == probeFailing
	}
	return t, t.state.Text(n) != before, tr
}

// take takes a probe round's result: counts it, tells the Observer, logs
// a unit's probes starting or stopping to fail outside its HealthySec
// window (verifying: inside, the verdict says it). It says whether the
// unit's status changed (the loop looks at it again), and whether a pass
// is owed: the status changed, or the unit is in its HealthySec window
// (its verdict may be due).
func (p *probes) take(r probeResult, verifying bool) (changed, pass bool) {
	t, changed, tr := p.count(r)
	if t == nil {
		return false, false
	}
	for _, c := range r.results {
		p.obs.Probe(r.unit, c.Check.Kind.String(), c.OK)
	}
	text := t.state.Text(t.spec.FailAfter())
	switch {
	case verifying:
		if changed {
			p.log.Debug("health probe", "unit", r.unit, "probe", text)
		}
	case tr == probeFailing:
		p.log.Warn(r.unit+": health probe failing — "+text+" (the version passed its HealthySec window: status unhealthy, not rolled back)",
			"unit", r.unit, "action", "probe-failing", "probe", text)
	case tr == probeBack:
		p.log.Info(r.unit+": health probe passing again — "+text, "unit", r.unit, "action", "probe-passing", "probe", text)
	}
	return changed, changed || verifying
}

// follow makes the probes of the units a round planned those of the
// version each runs (probeSpecOf); a unit looked at (look) without an
// action has none.
func (p *probes) follow(plan []Action, look map[string]bool, cur Current) {
	planned := make(map[string]bool, len(plan))
	for _, act := range plan {
		planned[act.Unit] = true
		rec := cur.Memory.Records[act.Unit]
		if act.Record.DropRecord {
			p.forget(act.Unit)
			continue
		}
		key := KeyOf(rec.Applied)
		if key != "" && key != act.ContentKey && p.has(act.Unit, key) {
			continue // an older version still runs: its probes are known
		}
		spec, key := probeSpecOf(act, rec.Applied, cur.Memory.Blobs)
		if !spec.Any() {
			p.forget(act.Unit)
			continue
		}
		p.set(act.Unit, key, spec)
	}
	for u := range p.targets {
		if look[u] && !planned[u] {
			p.forget(u)
		}
	}
}

// forget drops unit's probes and tells the Observer it has none.
func (p *probes) forget(unit string) {
	if p.drop(unit) {
		p.obs.ProbesGone(unit)
	}
}
