package main

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// rolloutHand is this host's part in its groups' rollouts
// (reconcile.Rollout). It keeps the host on the previous content until
// its wave opens (reconcile.Overlay, applied to every snapshot before the
// loop or the last-known-good store sees it), and, beside the loop, writes
// the host's progress as it takes, soaks and judges the change
// (reconcile.RolloutStep), ending a rollout it sees complete or failed.
// It reads the loop's statuses (as an Observer) and never blocks it.
type rolloutHand struct {
	reconcile.NopObserver
	host    string
	log     *slog.Logger
	session func() *registry.Session // nil until joined
	met     rolloutMetrics           // nil: none

	mu       sync.Mutex
	snap     *reconcile.Snapshot // as stored (not overlaid)
	statuses map[string]reconcile.Status
	// handed is the last snapshot handed on (overlaid), and progressMark
	// a fingerprint of the rollouts and progress it came with.
	handed       *reconcile.Snapshot
	progressMark uint64
	// sent holds, per rollout, the snapshot revision a write was made
	// at: the rollout is looked at again only in a newer snapshot (which
	// shows the write, or the one that beat it).
	sent   map[string]int64
	groups map[string]bool // groups a rollout was seen in (metrics)
	wake   chan struct{}
}

// rolloutMetrics is what rolloutHand tells the metrics.
type rolloutMetrics interface {
	RolloutsInFlight(byGroup map[string]int)
	RolloutStep(state reconcile.HostState)
}

func newRolloutHand(host string, log *slog.Logger, session func() *registry.Session, met rolloutMetrics) *rolloutHand {
	return &rolloutHand{host: host, log: log, session: session, met: met, sent: map[string]int64{}, groups: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// overlay returns the snapshot this host runs: s with the rollouts'
// keys held back where the host has not taken their change; and whether
// to hand it on. A snapshot that differs from the last one handed on only
// in rollout progress (every host's, each time one moves) is not: the loop
// would batch it with the next change (up to its MaxBatchDelay) for
// nothing, and the last-known-good store would save it for nothing.
func (h *rolloutHand) overlay(s reconcile.Snapshot) (reconcile.Snapshot, bool) {
	h.mu.Lock()
	var prev []reconcile.Entry
	if h.handed != nil {
		prev = h.handed.Entries
	}
	h.mu.Unlock()
	stored := s
	if len(s.Rollouts) > 0 {
		s.Entries = reconcile.Overlay(s.Entries, h.host, s.Rollouts, s.Progress)
	}
	var held bool
	if s.Entries, held = reconcile.HoldUnconfirmed(s.Entries, prev, s.RolloutsRevision); held {
		// The pass record must not claim the held write's revision.
		s.Revision = s.RolloutsRevision
	}
	mark := progressMark(s)
	h.mu.Lock()
	h.snap = &stored
	last, lastMark := h.handed, h.progressMark
	handOn := last == nil || mark == lastMark || !sameEntries(last.Entries, s.Entries) || !slices.Equal(last.Halts, s.Halts) ||
		!sameEntries(last.Signatures, s.Signatures)
	if handOn {
		h.handed = &s
	}
	h.progressMark = mark
	h.mu.Unlock()
	h.poke()
	return s, handOn
}

// progressMark is a fingerprint of the rollouts and every host's progress
// in s: it moves whenever one of them is written.
func progressMark(s reconcile.Snapshot) uint64 {
	var m uint64
	for _, r := range s.Rollouts {
		m = m*31 + uint64(r.ModRevision)
	}
	for _, hosts := range s.Progress {
		for _, p := range hosts {
			m += uint64(p.Since.UnixNano()) ^ uint64(len(p.State))
		}
	}
	return m
}

func sameEntries(a, b []reconcile.Entry) bool {
	return slices.EqualFunc(a, b, func(x, y reconcile.Entry) bool {
		return x.Scope == y.Scope && x.Group == y.Group && x.Unit == y.Unit && x.ModRevision == y.ModRevision && bytes.Equal(x.Value, y.Value)
	})
}

// Reported takes the statuses of each pass (the loop's goroutine: keep
// it short).
func (h *rolloutHand) Reported(_ int64, st []reconcile.Status) {
	m := make(map[string]reconcile.Status, len(st))
	for _, s := range st {
		m[s.Unit] = s
	}
	h.mu.Lock()
	h.statuses = m
	h.mu.Unlock()
	h.poke()
}

func (h *rolloutHand) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// run looks at the rollouts whenever a snapshot or statuses come in, or a
// soak or progress deadline is due, until ctx is done.
func (h *rolloutHand) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		case <-timer.C:
		}
		next := h.step(ctx, time.Now())
		timer.Stop()
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), 10*time.Millisecond))
		}
	}
}

// step decides and writes this host's part in each rollout it sees, and
// returns when it should look again without news (zero: not before news).
func (h *rolloutHand) step(ctx context.Context, now time.Time) (next time.Time) {
	h.mu.Lock()
	snap, statuses := h.snap, h.statuses
	h.mu.Unlock()
	s := h.session()
	if snap == nil || s == nil || statuses == nil {
		// Nothing is judged before the loop's first report: a restarted
		// agent has no statuses yet, and a host soaking must not read
		// that as its unit gone unhealthy.
		return time.Time{}
	}
	runs := reconcile.Overlay(snap.Entries, h.host, snap.Rollouts, snap.Progress)
	if h.met != nil {
		inFlight := map[string]int{}
		for _, r := range snap.Rollouts {
			h.groups[r.Group] = true
			if r.End == nil && !r.Superseded(snap.Entries) {
				inFlight[r.Group]++
			}
		}
		for g := range h.groups {
			inFlight[g] += 0 // a group whose rollouts all ended reads 0
		}
		h.met.RolloutsInFlight(inFlight)
	}
	for _, r := range snap.Rollouts {
		if r.Wave(h.host) < 0 {
			continue
		}
		if at, ok := h.sent[r.ID]; ok && snap.Revision <= at {
			continue
		}
		progress := snap.Progress[r.ID]
		w := reconcile.RolloutStep(r, h.host, progress, snap.Entries, runs, statuses, now)
		if due := dueAt(r, progress[h.host], progress); !due.IsZero() && (next.IsZero() || due.Before(next)) {
			next = due
		}
		if w.IsZero() {
			continue
		}
		rev, err := s.RolloutStep(ctx, r, snap.Revision, w)
		ok := rev > 0
		// Look again only in a snapshot that shows this write (or, when it
		// lost, one newer than what it was decided from): an older one
		// would decide the same step again.
		h.sent[r.ID] = max(snap.Revision, rev-1)
		if ok && err == nil && w.Progress != nil && h.met != nil {
			h.met.RolloutStep(w.Progress.State)
		}
		h.logStep(r, w, ok, err)
	}
	for id := range h.sent {
		if !slices.ContainsFunc(snap.Rollouts, func(r *reconcile.Rollout) bool { return r.ID == id }) {
			delete(h.sent, id)
		}
	}
	return next
}

// dueAt is when r should be looked at again for time alone: the end of
// this host's soak, or the rollout's progress deadline.
func dueAt(r *reconcile.Rollout, mine *reconcile.HostProgress, progress map[string]*reconcile.HostProgress) time.Time {
	var due time.Time
	if mine != nil && mine.State == reconcile.HostSoaking {
		due = mine.Since.Add(r.Strategy.Soak)
	}
	if d := r.Strategy.ProgressDeadline; d > 0 && r.End == nil && !r.Paused {
		last := r.CreatedAt
		if r.ResumedAt.After(last) {
			last = r.ResumedAt
		}
		for _, p := range progress {
			if p.HealthyAt.After(last) {
				last = p.HealthyAt
			}
		}
		if dl := last.Add(d + time.Millisecond); due.IsZero() || dl.Before(due) {
			due = dl
		}
	}
	return due
}

// logStep says in the journal what this host did in a rollout, under each
// of its units (journalctl -u <unit> shows it).
func (h *rolloutHand) logStep(r *reconcile.Rollout, w reconcile.RolloutWrite, ok bool, err error) {
	units := slices.Sorted(maps.Keys(r.Units))
	log := h.log.With("rollout", r.ID, "group", r.Group)
	if len(units) > 0 {
		log = log.With("unit", unitOfKey(units[0]))
	}
	switch {
	case err != nil:
		log.Warn("rollout "+r.ID+": could not record this host's step; trying again at the next change", "err", err)
		return
	case !ok:
		log.Debug("rollout " + r.ID + ": the record or another host moved first; looking again")
		return
	}
	if p := w.Progress; p != nil {
		msg := "rollout " + r.ID + ": " + string(p.State)
		if p.Reason != "" {
			msg += " — " + p.Reason
		}
		lvl := slog.LevelInfo
		if p.State == reconcile.HostFailed || p.State == reconcile.HostReverting {
			lvl = slog.LevelWarn
		}
		log.Log(context.Background(), lvl, msg, "state", p.State)
	}
	if w.End != nil {
		log.Info("rollout "+r.ID+" ended: "+string(w.End.State)+" "+w.End.Reason, "state", w.End.State)
	}
	if w.Pause != "" {
		log.Warn("rollout "+r.ID+" paused: "+w.Pause, "reason", w.Pause)
	}
}

// unitOfKey is the unit a registry key belongs to (a drop-in's unit).
func unitOfKey(key string) string {
	if _, unit, err := reconcile.ParseKey(key); err == nil {
		return unit
	}
	return key
}

// controlBackend is what the debug socket serves: the agent, and the
// rollouts its rolloutHand sees (`agentd status` shows them).
type controlBackend struct {
	*reconcile.Agent
	rollouts *rolloutHand
}

func (b controlBackend) Rollouts() []control.RolloutInfo { return b.rollouts.running(time.Now()) }

// running are the rollouts of the last snapshot that run at now — not
// ended, or ended with this host still to go back from the change — and
// where this host stands in each; nil before the first snapshot.
func (h *rolloutHand) running(now time.Time) []control.RolloutInfo {
	h.mu.Lock()
	snap := h.snap
	h.mu.Unlock()
	if snap == nil {
		return nil
	}
	var out []control.RolloutInfo
	for _, r := range snap.Rollouts {
		if r.Superseded(snap.Entries) {
			continue
		}
		progress := snap.Progress[r.ID]
		ph := r.Phase(progress, now)
		mine := progress[h.host]
		if ended(ph.State) && !(mine != nil && mine.State == reconcile.HostReverting) && !(reverts(r, ph) && mine.Took()) {
			continue
		}
		var units []string
		for key := range r.Units {
			if u := unitOfKey(key); !slices.Contains(units, u) {
				units = append(units, u)
			}
		}
		slices.Sort(units)
		ri := control.RolloutInfo{
			ID: r.ID, Group: r.Group, Units: units, State: ph.State, Reason: ph.Reason,
			Wave: phaseWave(registry.RolloutView{Rollout: r}, ph), Waves: len(r.WaveEnds), Hosts: len(r.Hosts),
			Soak: r.Strategy.Soak, HostWave: r.Wave(h.host) + 1,
		}
		for _, host := range r.Hosts {
			if p := progress[host]; p != nil && p.State == reconcile.HostHealthy {
				ri.Healthy++
			}
		}
		if ri.HostWave > 0 {
			ri.HostState = reconcile.HostPending
			if mine != nil {
				ri.HostState, ri.HostSince, ri.HostReason = mine.State, mine.Since, mine.Reason
			}
		}
		out = append(out, ri)
	}
	return out
}
