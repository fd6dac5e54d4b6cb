package rollout

import (
	"context"
	"log/slog"
	"net/http"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// Elector lets a host stand for coordinating a group (the registry
// session, once joined).
type Elector interface {
	// Campaign waits until this host coordinates group, or ctx ends.
	Campaign(ctx context.Context, group string) (Term, error)
}

// Term is one host's term as a group's coordinator. Its writes are
// guarded by the election: after the term ended they write nothing.
type Term interface {
	Host() string
	// Lost is closed when the term ended (the agent's lease is gone).
	Lost() <-chan struct{}
	// Resign ends the term: another candidate takes over at once.
	Resign(ctx context.Context)
	// Follow keeps the group's state current, calling poke after each
	// change, until ctx ends or the watch fails.
	Follow(ctx context.Context, poke func()) error
	// Read runs fn with the group's state; fn must not keep it. The
	// term's own admissions are in it as soon as they are written.
	Read(fn func(GroupState))
	Admit(ctx context.Context, r *Record, hosts []string, a Admission) error
	End(ctx context.Context, r *Record, e End) (bool, error)
	// Join adds hosts to r's last wave.
	Join(ctx context.Context, r *Record, hosts []string) (bool, error)
	// WriteRecord writes next if its record is still at
	// next.ModRevision (false: it moved; look again).
	WriteRecord(ctx context.Context, next *Record) (bool, error)
	WriteSummary(ctx context.Context, s Summary) error
	// ReadFollowed reads the summary of the rollout ref names (of any
	// group), which a rollout of this group follows (--after).
	ReadFollowed(ctx context.Context, ref Ref) Followed
}

// PassEvery is the shortest time between two of a coordinator's passes.
const PassEvery = 20 * time.Millisecond

// SummaryEvery is the shortest time between two writes of one rollout's
// summary: readers see counts at most this old, and a wave of 1,000 hosts
// costs a few summary writes, not 1,000.
const SummaryEvery = 250 * time.Millisecond

// Coordinator stands for coordinating one group's rollouts on this host
// and, while elected, runs them: it admits hosts, ends rollouts and keeps
// their summaries (Decide). Every agent of the group runs one; one wins.
type Coordinator struct {
	group string
	log   *slog.Logger
	elect func() Elector // nil until joined
	http  *http.Client   // for the gates it runs
}

// NewCoordinator makes the coordinator candidate for group; elect returns
// nil until the agent has joined the registry.
func NewCoordinator(group string, log *slog.Logger, elect func() Elector) *Coordinator {
	return &Coordinator{group: group, log: log.With("group", group, "component", "rollout-coordinator"), elect: elect,
		http: &http.Client{Timeout: gateCheckMax}}
}

// Run campaigns, coordinates while elected, and campaigns again when the
// term ends, until ctx is done (it then resigns: another agent takes over
// at once). Its goroutines carry the profiler label
// agentd=rollout-coordinator, so a CPU profile of an agent (or of the
// scale benchmark's thousands) tells the coordinator's share apart.
func (c *Coordinator) Run(ctx context.Context) {
	pprof.Do(ctx, pprof.Labels("agentd", "rollout-coordinator"), c.run)
}

func (c *Coordinator) run(ctx context.Context) {
	fails := 0
	for ctx.Err() == nil {
		el := c.elect()
		if el == nil {
			// Not joined yet. Looked at often: a host counts as up for
			// its group's rollouts once it stands (GroupView.Live).
			sleep(ctx, reconcile.Jitter(100*time.Millisecond))
			continue
		}
		term, err := el.Campaign(ctx, c.group)
		if err != nil {
			if ctx.Err() == nil {
				fails++
				c.log.Debug("campaign for the group's rollout coordinator failed; trying again", "err", err)
				sleep(ctx, reconcile.Jitter(min(time.Duration(fails)*500*time.Millisecond, 10*time.Second)))
			}
			continue
		}
		fails = 0
		c.log.Info("coordinating the rollouts of group " + c.group)
		c.serve(ctx, term)
		term.Resign(ctx)
		if ctx.Err() == nil {
			c.log.Warn("no longer coordinating the rollouts of group " + c.group + "; standing again")
		}
	}
}

// serve runs one term until it is lost or ctx ends.
func (c *Coordinator) serve(ctx context.Context, term Term) {
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for fails := 0; tctx.Err() == nil; fails++ {
			err := term.Follow(tctx, poke)
			if tctx.Err() != nil {
				return
			}
			c.log.Info("following the group's rollouts ended; reading them again", "err", err)
			sleep(tctx, reconcile.Jitter(min(time.Duration(fails+1)*100*time.Millisecond, 5*time.Second)))
		}
	}()
	defer func() { cancel(); <-done }()
	t := &termState{written: map[string]writtenSummary{}, settled: map[string]bool{}, done: map[string]*Followed{}}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var last time.Time
	for {
		select {
		case <-tctx.Done():
			return
		case <-term.Lost():
			return
		case <-wake:
		case <-timer.C:
		}
		// A pass costs O(hosts), and every host's progress write wakes
		// it: at most one pass per PassEvery, the writes of that time
		// folded into it (at 10,000 hosts a wave is thousands of writes).
		if wait := time.Until(last.Add(PassEvery)); wait > 0 {
			sleep(tctx, wait)
		}
		last = time.Now()
		next := c.pass(tctx, term, t, last)
		timer.Stop()
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), time.Millisecond))
		}
	}
}

// termState is what a term remembers between passes.
type termState struct {
	written map[string]writtenSummary // by rollout ID
	settled map[string]bool           // ended, and its final summary written
	// done are the followed rollouts (--after) read ended done, by the
	// ID of the rollout that follows each: that stays so.
	done map[string]*Followed
}

type writtenSummary struct {
	s  *Summary
	at time.Time
}

type decided struct {
	r *Record
	d Decision
}

// pass decides every rollout of the group once and writes the decisions;
// it returns when to look again for time alone.
func (c *Coordinator) pass(ctx context.Context, term Term, t *termState, now time.Time) (next time.Time) {
	follows := c.readFollowed(ctx, term, t)
	var todo []decided
	term.Read(func(g GroupState) {
		for _, r := range g.Records {
			if t.settled[r.ID] {
				continue
			}
			if _, ok := t.written[r.ID]; !ok && g.Summaries[r.ID] != nil {
				t.written[r.ID] = writtenSummary{s: g.Summaries[r.ID]} // a former term's
			}
			gv := GroupView{Progress: g.Progress[r.ID], Admitted: g.Admitted[r.ID], Entries: g.Entries, Follows: follows[r.ID], Live: g.Live}
			d := Decide(r, gv, term.Host(), now)
			todo = append(todo, decided{r, d})
		}
	})
	soonest := func(at time.Time) {
		if !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	for _, x := range todo {
		r, d := x.r, x.d
		log := c.log.With("rollout", r.ID)
		if len(d.Join) > 0 {
			ok, err := term.Join(ctx, r, d.Join)
			switch {
			case err != nil:
				log.Warn("rollout "+r.ID+": could not add the hosts that joined the group; trying again", "err", err)
				soonest(now.Add(reconcile.Jitter(time.Second)))
			case ok:
				log.Info("rollout "+r.ID+": "+NameHosts(d.Join, len(d.Join))+" joined the group since it started: added to its last wave", "hosts", len(d.Join))
			}
			continue // decided again on the record that says so
		}
		if d.Gate >= 0 {
			// Said before the check, which may take up to its timeout:
			// readers see the rollout wait for the gate at its wave.
			soonest(c.summarize(ctx, term, t, r, d, now, true))
			c.runGate(ctx, term, r, d.Gate, now)
			continue // decided again on the record that says how it went
		}
		if len(d.Admit) > 0 {
			a := Admission{Wave: d.Summary.Phase.Wave, At: now, By: term.Host()}
			if err := term.Admit(ctx, r, d.Admit, a); err != nil {
				log.Warn("rollout "+r.ID+": could not admit hosts; trying again", "err", err)
				soonest(now.Add(reconcile.Jitter(time.Second)))
				continue
			}
			log.Info("rollout "+r.ID+": admitted "+NameHosts(d.Admit, len(d.Admit))+" to wave "+strconv.Itoa(a.Wave+1), "hosts", len(d.Admit), "wave", a.Wave+1)
		}
		if d.End != nil {
			ok, err := term.End(ctx, r, *d.End)
			switch {
			case err != nil:
				log.Warn("rollout "+r.ID+": could not write its end; trying again", "err", err)
				soonest(now.Add(reconcile.Jitter(time.Second)))
				continue
			case !ok:
				continue // the record moved: the next pass sees it
			}
			log.Info("rollout "+r.ID+" ended: "+string(d.End.State)+prefixed(d.End.Reason), "state", d.End.State)
		}
		soonest(d.Due)
		// The summary that ends a rollout is written at once: it names the
		// hosts that failed it, which a revert may take out of the failed
		// state within SummaryEvery, so that no reader would see them.
		if retry := c.summarize(ctx, term, t, r, d, now, d.End != nil); !retry.IsZero() {
			soonest(retry)
			continue
		}
		if last := t.written[r.ID]; r.End != nil && last.s != nil && last.s.Phase.State.Ended() && (!r.Reverts() || last.s.Holding() == 0) {
			t.settled[r.ID] = true
		}
	}
	return next
}

// readFollowed reads, for each rollout that waits for another (--after),
// that one's summary, by the waiting rollout's ID: a read outside the
// group's state, so before Decide, and not again once read done.
func (c *Coordinator) readFollowed(ctx context.Context, term Term, t *termState) map[string]*Followed {
	var refs map[string]Ref
	out := map[string]*Followed{}
	term.Read(func(g GroupState) {
		for _, r := range g.Records {
			if f := t.done[r.ID]; f != nil {
				out[r.ID] = f
			} else if r.FollowsPending(GroupView{Progress: g.Progress[r.ID], Admitted: g.Admitted[r.ID]}) {
				if refs == nil {
					refs = map[string]Ref{}
				}
				refs[r.ID] = *r.Strategy.Follows
			}
		}
	})
	for id, ref := range refs {
		f := term.ReadFollowed(ctx, ref)
		out[id] = &f
		if f.Done() {
			t.done[id] = &f
			c.log.Info("rollout "+id+": "+ref.String()+", which it follows (--after), ended done; it begins", "rollout", id)
		}
	}
	return out
}

// summarize writes d's summary of r when it says something new, at most
// once per SummaryEvery unless now; it returns when to try again (zero:
// written, or nothing to write).
func (c *Coordinator) summarize(ctx context.Context, term Term, t *termState, r *Record, d Decision, now time.Time, force bool) time.Time {
	last := t.written[r.ID]
	if d.Summary.same(last.s) {
		return time.Time{}
	}
	if wait := last.at.Add(SummaryEvery); now.Before(wait) && !force {
		return wait
	}
	if err := term.WriteSummary(ctx, d.Summary); err != nil {
		c.log.Warn("rollout "+r.ID+": could not write its summary; trying again", "rollout", r.ID, "err", err)
		return now.Add(reconcile.Jitter(time.Second))
	}
	s := d.Summary
	t.written[r.ID] = writtenSummary{s: &s, at: now}
	return time.Time{}
}

// runGate runs the coordinator's gate before wave (from 0) of r and
// records how it went: the wave opens (Gated), or the rollout pauses with
// the reason (`agentd rollout resume` runs the gate again, `promote`
// opens the wave without it).
func (c *Coordinator) runGate(ctx context.Context, term Term, r *Record, wave int, now time.Time) {
	log := c.log.With("rollout", r.ID, "wave", wave+1)
	log.Info("rollout " + r.ID + ": running the gate before wave " + strconv.Itoa(wave+1) + ": " + r.Strategy.gateName())
	ok, why := CheckGate(ctx, c.http, r.Strategy)
	if ctx.Err() != nil {
		return
	}
	next := *r
	if ok {
		next.Gated = max(next.Gated, wave)
	} else {
		next.Paused, next.PausedAt = true, time.Now().UTC()
		next.PauseReason = "the gate before wave " + strconv.Itoa(wave+1) + " failed: " + why
	}
	written, err := term.WriteRecord(ctx, &next)
	switch {
	case err != nil:
		log.Warn("rollout "+r.ID+": could not record the gate's result; running it again", "err", err)
	case !written:
	case ok:
		log.Info("rollout " + r.ID + ": the gate passed: wave " + strconv.Itoa(wave+1) + " opens")
	default:
		log.Warn("rollout "+r.ID+" paused: "+next.PauseReason, "reason", next.PauseReason)
	}
}

func prefixed(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
