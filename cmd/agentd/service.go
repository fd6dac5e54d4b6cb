package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/agentd/agentd/metrics"
	"github.com/agentd/agentd/reconcile"
)

// service is the agent's side of systemd's notify protocol (Type=notify),
// driven by the reconcile loop through reconcile.Observer:
//
//   - READY=1 once the first pass that had a registry snapshot succeeded
//     (or, with the registry unreachable for --registry-timeout, once a
//     pass on the last-known-good snapshot succeeded, or at once when there
//     is none: see lastKnownGood);
//   - STATUS= with the registry revision and the units converged, pending
//     and failed, whenever that line changes (`systemctl status` shows it);
//   - WATCHDOG=1 while the loop shows progress (see alive), so a wedged
//     loop gets the agent killed and restarted after WatchdogSec;
//   - EXTEND_TIMEOUT_USEC= before READY while the loop shows progress, so a
//     long first pass (slow start jobs) is not killed by TimeoutStartSec
//     while a stuck one is;
//   - STOPPING=1 at shutdown.
//
// Without $NOTIFY_SOCKET every message is dropped. Observer methods run on
// the loop goroutine; sending a datagram to the manager does not block.
type service struct {
	reconcile.NopObserver
	notify   func(state string) // sends to the service manager
	log      *slog.Logger
	watchdog time.Duration // WatchdogSec from $WATCHDOG_USEC; 0: off
	tick     time.Duration // heartbeat interval, and how often run looks at the loop
	now      func() time.Time

	mu       sync.Mutex
	ready    bool
	reported bool   // Reported was called since the last Pass
	status   string // last STATUS= sent
	summary  string // the last pass's summary
	offline  string // set while running on a saved snapshot: says which
	beat     time.Time
	waits    map[int]time.Time // deadlines of the bounded waits in progress
	nextWait int
	stalled  bool // a stall was logged; log the recovery once
}

// newService reads $WATCHDOG_USEC. The heartbeat interval is a quarter of
// the watchdog interval (1 s without a watchdog).
func newService(log *slog.Logger) *service {
	wd, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("ignoring a bad watchdog setting from systemd", "err", err)
		wd = 0
	}
	s := &service{
		notify: func(state string) {
			if _, err := daemon.SdNotify(false, state); err != nil {
				log.Warn("notify systemd", "err", err)
			}
		},
		log:      log,
		watchdog: wd,
		tick:     time.Second,
		now:      time.Now,
		waits:    map[int]time.Time{},
	}
	if wd > 0 {
		s.tick = wd / 4
	}
	s.beat = s.now()
	return s
}

// heartbeatInterval is reconcile.Config.HeartbeatInterval: none without a
// watchdog, so an idle agent has no timer of its own to wake it.
func (s *service) heartbeatInterval() time.Duration {
	if s.watchdog == 0 {
		return 0
	}
	return s.tick
}

// setStatus sends STATUS=text if it differs from the last one sent.
func (s *service) setStatus(text string) {
	s.mu.Lock()
	changed := text != s.status
	s.status = text
	s.mu.Unlock()
	if changed {
		s.notify("STATUS=" + text)
	}
}

func (s *service) isReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}

// Heartbeat is called by the loop every tick while idle and after every pass.
func (s *service) Heartbeat() {
	s.mu.Lock()
	s.beat = s.now()
	s.mu.Unlock()
}

// Reported summarizes a pass for STATUS=.
func (s *service) Reported(revision int64, st []reconcile.Status) {
	c, p, f := metrics.Count(st)
	summary := fmt.Sprintf("registry revision %d: %d units converged, %d pending, %d failed", revision, c, p, f)
	s.mu.Lock()
	s.reported = true
	s.summary = summary
	text := s.statusLocked()
	ready := s.ready
	s.mu.Unlock()
	if ready {
		s.setStatus(text)
	}
}

func (s *service) statusLocked() string {
	if s.offline != "" {
		return s.offline + "; " + s.summary
	}
	return s.summary
}

// Pass sends READY=1 after the first successful pass that had a snapshot.
func (s *service) Pass(_ time.Duration, err error) {
	s.mu.Lock()
	becomesReady := !s.ready && s.reported && err == nil
	s.reported = false
	if becomesReady {
		s.ready = true
		s.status = s.statusLocked()
	}
	text := s.status
	s.mu.Unlock()
	if becomesReady {
		s.log.Info("first reconcile pass done; ready", "status", text)
		s.notify("READY=1\nSTATUS=" + text)
	}
}

// readyWithout sends READY=1 although no pass ran: the registry cannot be
// reached and there is no snapshot to run on, so the agent touches nothing.
func (s *service) readyWithout(why string) {
	s.mu.Lock()
	if s.ready {
		s.mu.Unlock()
		return
	}
	s.ready = true
	s.status = why
	s.mu.Unlock()
	s.log.Warn("ready without a registry snapshot", "reason", why)
	s.notify("READY=1\nSTATUS=" + why)
}

// setOffline marks that the agent runs on a saved snapshot; "" clears it
// (the registry answered).
func (s *service) setOffline(desc string) {
	s.mu.Lock()
	s.offline = desc
	s.mu.Unlock()
}

// boundedWait records that the loop entered a call that ends by itself
// within d (a systemd job bounded by the job timeout, a status report bounded
// by request timeouts). While it lasts the loop counts as alive although it
// sends no heartbeat. Call the returned func when the call returns.
func (s *service) boundedWait(d time.Duration) (done func()) {
	s.mu.Lock()
	id := s.nextWait
	s.nextWait++
	s.waits[id] = s.now().Add(d)
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.waits, id)
		s.beat = s.now() // returning from the call is progress
		s.mu.Unlock()
	}
}

// alive says whether the loop shows progress: a heartbeat within the last
// two ticks (half the watchdog interval), or a bounded wait whose deadline
// has not passed. A loop stuck anywhere else, or past a deadline, is not.
func (s *service) alive() (ok bool, silent time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	silent = now.Sub(s.beat)
	if silent < 2*s.tick {
		return true, silent
	}
	for _, deadline := range s.waits {
		if now.Before(deadline) {
			return true, silent
		}
	}
	return false, silent
}

// run pings the watchdog (after READY) or extends the start timeout (before)
// every tick while the loop is alive, until ctx is done; then it sends
// STOPPING=1.
func (s *service) run(ctx context.Context) {
	t := time.NewTicker(s.tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.notify("STOPPING=1\nSTATUS=stopping")
			return
		case <-t.C:
		}
		ok, silent := s.alive()
		if s.watchdog == 0 {
			// No heartbeat to judge the loop by: only the start timeout
			// is extended, until READY; then nothing is owed.
			ok = true
			if s.isReady() {
				t.Stop()
				<-ctx.Done()
				s.notify("STOPPING=1\nSTATUS=stopping")
				return
			}
		}
		s.mu.Lock()
		ready, logStall, logRecovery := s.ready, !ok && !s.stalled, ok && s.stalled
		s.stalled = !ok
		s.mu.Unlock()
		switch {
		case logStall:
			s.log.Error("reconcile loop shows no progress; no longer pinging the watchdog: systemd restarts the agent after WatchdogSec",
				"silent_for", silent.Round(time.Millisecond), "watchdog", s.watchdog)
		case logRecovery:
			s.log.Warn("reconcile loop progresses again", "silent_for", silent.Round(time.Millisecond))
		}
		if !ok {
			continue
		}
		switch {
		case ready && s.watchdog > 0:
			s.notify("WATCHDOG=1")
		case !ready:
			s.notify(fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", (4 * s.tick).Microseconds()))
		}
	}
}

// describeSaved is the STATUS= prefix while running on a saved snapshot.
func describeSaved(rev int64, saved time.Time) string {
	return fmt.Sprintf("registry unreachable: running on the last-known-good snapshot (revision %d, saved %s)",
		rev, saved.UTC().Format(time.RFC3339))
}

// multiObserver fans the loop's observations out.
type multiObserver []reconcile.Observer

func (m multiObserver) Action(unit string, kind reconcile.Kind, result string) {
	for _, o := range m {
		o.Action(unit, kind, result)
	}
}

func (m multiObserver) PassStart() {
	for _, o := range m {
		o.PassStart()
	}
}

func (m multiObserver) Pass(d time.Duration, err error) {
	for _, o := range m {
		o.Pass(d, err)
	}
}

func (m multiObserver) Reported(revision int64, st []reconcile.Status) {
	for _, o := range m {
		o.Reported(revision, st)
	}
}

func (m multiObserver) Heartbeat() {
	for _, o := range m {
		o.Heartbeat()
	}
}

func (m multiObserver) Drift(path string) {
	for _, o := range m {
		o.Drift(path)
	}
}

func (m multiObserver) Rollback(unit string) {
	for _, o := range m {
		o.Rollback(unit)
	}
}

func (m multiObserver) ControlPlaneRollback(unit string) {
	for _, o := range m {
		o.ControlPlaneRollback(unit)
	}
}

func (m multiObserver) Probe(unit, kind string, ok bool) {
	for _, o := range m {
		o.Probe(unit, kind, ok)
	}
}

func (m multiObserver) ProbesGone(unit string) {
	for _, o := range m {
		o.ProbesGone(unit)
	}
}
