package rollout

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// HostPort is what a participant writes through (the registry session).
type HostPort interface {
	// WriteProgress writes this host's progress in rollout id and returns
	// the revision of the write.
	WriteProgress(ctx context.Context, id string, p Progress) (int64, error)
	// PauseRollout pauses r if its record did not change since it was
	// read (false: it did).
	PauseRollout(ctx context.Context, r *Record, reason string) (bool, error)
}

// Metrics is what a participant tells the metrics.
type Metrics interface {
	RolloutsInFlight(byGroup map[string]int)
	RolloutStep(state HostState)
}

// Participant is one host's part in its groups' rollouts. It keeps the
// host on the previous content until it is admitted (Overlay, applied to
// every snapshot before the loop or the last-known-good store sees it),
// and, beside the loop, writes the host's progress as it takes, soaks and
// judges the change (Step). It reads the loop's statuses (as an Observer)
// and never blocks it. It sees its own progress and admissions only.
type Participant struct {
	reconcile.NopObserver
	host string
	log  *slog.Logger
	port func() HostPort // nil until joined
	met  Metrics         // nil: none

	mu       sync.Mutex
	snap     *reconcile.Snapshot // as stored (not overlaid)
	view     HostView
	runs     []reconcile.Entry // snap's entries under the rollouts (Overlay), before any hold
	statuses map[string]reconcile.Status
	handed   *reconcile.Snapshot // the last snapshot handed on (overlaid)
	mark     uint64              // HostView.mark of the last snapshot
	// sent holds, per rollout, the snapshot revision a write was made
	// at: the rollout is looked at again only in a newer snapshot (which
	// shows the write).
	sent   map[string]int64
	groups map[string]bool // groups a rollout was seen in (metrics)
	wake   chan struct{}
}

// NewParticipant makes host's participant; port returns nil until the
// agent has joined the registry.
func NewParticipant(host string, log *slog.Logger, port func() HostPort, met Metrics) *Participant {
	return &Participant{host: host, log: log, port: port, met: met, sent: map[string]int64{}, groups: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// Overlay returns the snapshot this host runs: s with the rollouts' keys
// held back where the host has not taken their change; and whether to
// hand it on. A snapshot that differs from the last one handed on only in
// this host's rollout progress or admissions is not: the loop would batch
// it with the next change (up to its MaxBatchDelay) for nothing, and the
// last-known-good store would save it for nothing.
func (h *Participant) Overlay(s reconcile.Snapshot, v HostView) (reconcile.Snapshot, bool) {
	h.mu.Lock()
	var prev []reconcile.Entry
	last := h.handed
	if last != nil {
		prev = last.Entries
	}
	h.mu.Unlock()
	stored := s
	runs := s.Entries
	if len(v.Records) > 0 {
		runs = Overlay(s.Entries, h.host, v.Records, v.Mine)
		s.Signatures = OverlaySignatures(s.Signatures, s.Entries, runs, v.Records, v.Mine)
		s.Entries = runs
		s.Halts = ToleratedHalts(s.Halts, v.Records)
	}
	var held bool
	if s.Entries, held = HoldUnconfirmed(s.Entries, prev, v.KnownUpTo); held {
		// The pass record must not claim the held write's revision.
		s.Revision = v.KnownUpTo
	}
	mark := v.mark()
	h.mu.Lock()
	handOn := last == nil || mark == h.mark || !sameEntries(last.Entries, s.Entries) || !slices.Equal(last.Halts, s.Halts) ||
		!sameEntries(last.Signatures, s.Signatures)
	h.snap, h.view, h.mark, h.runs = &stored, v, mark, runs
	if handOn {
		h.handed = &s
	}
	h.mu.Unlock()
	h.poke()
	return s, handOn
}

// mark is a fingerprint of v: it moves whenever a record, this host's
// progress or an admission is written.
func (v HostView) mark() uint64 {
	var m uint64
	for _, r := range v.Records {
		m = m*31 + uint64(r.ModRevision)
	}
	for id, p := range v.Mine {
		m += uint64(p.Since.UnixNano()) ^ uint64(len(p.State)) ^ uint64(len(id))
	}
	return m*31 + uint64(len(v.Admitted))
}

func sameEntries(a, b []reconcile.Entry) bool {
	return slices.EqualFunc(a, b, func(x, y reconcile.Entry) bool {
		return x.Scope == y.Scope && x.Group == y.Group && x.Unit == y.Unit && x.ModRevision == y.ModRevision && bytes.Equal(x.Value, y.Value)
	})
}

// Reported takes the statuses of each pass (the loop's goroutine: keep
// it short).
func (h *Participant) Reported(_ int64, st []reconcile.Status) {
	m := make(map[string]reconcile.Status, len(st))
	for _, s := range st {
		m[s.Unit] = s
	}
	h.mu.Lock()
	h.statuses = m
	h.mu.Unlock()
	h.poke()
}

func (h *Participant) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Run looks at the rollouts whenever a snapshot or statuses come in, or a
// soak is due, until ctx is done.
func (h *Participant) Run(ctx context.Context) {
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
func (h *Participant) step(ctx context.Context, now time.Time) (next time.Time) {
	h.mu.Lock()
	snap, v, runs, statuses := h.snap, h.view, h.runs, h.statuses
	h.mu.Unlock()
	port := h.port()
	if snap == nil || port == nil || statuses == nil {
		// Nothing is judged before the loop's first report: a restarted
		// agent has no statuses yet, and a host soaking must not read
		// that as its unit gone unhealthy.
		return time.Time{}
	}
	h.countInFlight(snap, v)
	for _, r := range v.Records {
		if at, ok := h.sent[r.ID]; ok && snap.Revision <= at {
			continue
		}
		mine := v.Mine[r.ID]
		w := Step(r, HostInput{Host: h.host, Mine: mine, Admitted: v.Admitted[r.ID], Entries: snap.Entries, Runs: runs, Statuses: statuses}, now)
		if due := SoakDue(r, mine); !due.IsZero() && (next.IsZero() || due.Before(next)) {
			next = due
		}
		if w.IsZero() {
			continue
		}
		var rev int64
		var err error
		ok := true
		if w.Progress != nil {
			rev, err = port.WriteProgress(ctx, r.ID, *w.Progress)
		}
		if err == nil && w.Pause != "" {
			ok, err = port.PauseRollout(ctx, r, w.Pause)
		}
		// Look again only in a snapshot that shows this write: an older
		// one would decide the same step again.
		if err == nil && rev > 0 {
			h.sent[r.ID] = max(snap.Revision, rev-1)
		}
		if err == nil && w.Progress != nil && h.met != nil {
			h.met.RolloutStep(w.Progress.State)
		}
		h.logStep(r, w, ok, err)
	}
	for id := range h.sent {
		if !slices.ContainsFunc(v.Records, func(r *Record) bool { return r.ID == id }) {
			delete(h.sent, id)
		}
	}
	return next
}

func (h *Participant) countInFlight(snap *reconcile.Snapshot, v HostView) {
	if h.met == nil {
		return
	}
	inFlight := map[string]int{}
	for _, r := range v.Records {
		h.groups[r.Group] = true
		if r.End == nil && !r.Overwritten(snap.Entries) {
			inFlight[r.Group]++
		}
	}
	for g := range h.groups {
		inFlight[g] += 0 // a group whose rollouts all ended reads 0
	}
	h.met.RolloutsInFlight(inFlight)
}

// logStep says in the journal what this host did in a rollout, under each
// of its units (journalctl -u <unit> shows it).
func (h *Participant) logStep(r *Record, w Write, ok bool, err error) {
	units := slices.Sorted(maps.Keys(r.Units))
	log := h.log.With("rollout", r.ID, "group", r.Group)
	if len(units) > 0 {
		log = log.With("unit", UnitOfKey(units[0]))
	}
	if err != nil {
		log.Warn("rollout "+r.ID+": could not record this host's step; trying again at the next change", "err", err)
		return
	}
	if p := w.Progress; p != nil {
		msg := "rollout " + r.ID + ": " + string(p.State)
		if p.Reason != "" {
			msg += " — " + p.Reason
		}
		lvl := slog.LevelInfo
		if p.State == HostFailed || p.State == HostReverting {
			lvl = slog.LevelWarn
		}
		log.Log(context.Background(), lvl, msg, "state", p.State)
	}
	if w.Pause != "" && ok {
		log.Warn("rollout "+r.ID+" paused: "+w.Pause, "reason", w.Pause)
	}
}

// UnitOfKey is the unit a registry key belongs to (a drop-in's unit).
func UnitOfKey(key string) string {
	if _, unit, err := reconcile.ParseKey(key); err == nil {
		return unit
	}
	return key
}

// HostRollout is one rollout as this host sees it (`agentd status`).
type HostRollout struct {
	Record *Record
	State  State // from the record alone: ended, paused, or running
	Reason string
	Wave   int // this host's wave, from 0; -1: not one of its hosts
	Mine   *Progress
}

// Running are the rollouts of the last snapshot that run — not ended, or
// ended with this host still to go back from the change — and where this
// host stands in each; nil before the first snapshot.
func (h *Participant) Running() []HostRollout {
	h.mu.Lock()
	snap, v := h.snap, h.view
	h.mu.Unlock()
	if snap == nil {
		return nil
	}
	var out []HostRollout
	for _, r := range v.Records {
		if r.Overwritten(snap.Entries) {
			continue
		}
		mine := v.Mine[r.ID]
		hr := HostRollout{Record: r, State: Running, Wave: r.Wave(h.host), Mine: mine}
		switch {
		case r.End != nil:
			hr.State, hr.Reason = r.End.State, r.End.Reason
		case r.Paused:
			hr.State, hr.Reason = Paused, r.PauseReason
		case mine == nil && !v.Admitted[r.ID]:
			// Not admitted: a closed window is why, if the rollout has one.
			if win := r.window(); win != nil {
				if open, _, _ := win.Open(time.Now()); !open {
					hr.State, hr.Reason = WaitingWindow, WindowReason(*win, time.Now())
				}
			}
		}
		if hr.State.Ended() && mine.StateOf() != HostReverting && !(r.Reverts() && mine.Took()) {
			continue
		}
		out = append(out, hr)
	}
	return out
}

// ToleratedHalts are halts without those a running rollout with a success
// threshold tolerates: a host that failed its change halts the group's
// version for the other hosts (reconcile's own guard), but such a rollout
// lets a share of each wave fail, so its coordinator, not the first
// failure, decides whether the others go on. Pure.
func ToleratedHalts(halts []reconcile.Halt, records []*Record) []reconcile.Halt {
	if len(halts) == 0 {
		return halts
	}
	var out []reconcile.Halt
	for _, h := range halts {
		if !slices.ContainsFunc(records, func(r *Record) bool {
			u, ok := r.Units[h.Unit]
			return ok && r.End == nil && r.Strategy.SuccessThreshold > 0 && h.Scope == "groups/"+r.Group && h.Hash == u.ToHash
		}) {
			out = append(out, h)
		}
	}
	return out
}
