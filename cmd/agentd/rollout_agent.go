package main

import (
	"context"
	"slices"
	"time"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
)

// The agent's part in its groups' rollouts lives in package rollout (a
// Participant for this host, a Coordinator candidate per group); these
// are the adapters that wire them to the registry session.

// sessionHostPort is the participant's port: the session once joined.
func sessionHostPort(rep *sessionReporter) func() rollout.HostPort {
	return func() rollout.HostPort {
		if s := rep.current(); s != nil {
			return s
		}
		return nil
	}
}

// sessionElector campaigns through the session once joined.
type sessionElector struct{ current func() *registry.Session }

func (e sessionElector) elector() rollout.Elector {
	if e.current() == nil {
		return nil
	}
	return e
}

func (e sessionElector) Campaign(ctx context.Context, group string) (rollout.Term, error) {
	s := e.current()
	if s == nil {
		return nil, errNotJoined
	}
	return s.Campaign(ctx, group)
}

// controlBackend is what the debug socket serves: the agent, and the
// rollouts its participant sees (`agentd status` shows them).
type controlBackend struct {
	*reconcile.Agent
	rollouts *rollout.Participant
	// live reads a unit's state from systemd now (nil: the last pass's
	// statuses only).
	live func(ctx context.Context, unit string) (reconcile.UnitState, error)
}

// Statuses are the last pass's statuses with systemd's state read now: a
// pass blocked on a job that hangs (ExecStartPre= that never returns)
// published what it saw before the job, and `agentd status` must say
// what systemd says (activating, start-pre), not that.
func (b controlBackend) Statuses() (int64, []reconcile.Status) {
	rev, st := b.Agent.Statuses()
	if b.live == nil {
		return rev, st
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for i, s := range st {
		us, err := b.live(ctx, s.Unit)
		if err != nil || us.LoadState == "" {
			continue
		}
		st[i].ActiveState, st[i].SubState, st[i].MainPID, st[i].NRestarts = us.ActiveState, us.SubState, us.MainPID, us.NRestarts
	}
	return rev, st
}

func (b controlBackend) Rollouts() []control.RolloutInfo {
	var out []control.RolloutInfo
	for _, hr := range b.rollouts.Running() {
		r := hr.Record
		var units []string
		for key := range r.Units {
			if u := rollout.UnitOfKey(key); !slices.Contains(units, u) {
				units = append(units, u)
			}
		}
		slices.Sort(units)
		ri := control.RolloutInfo{
			ID: r.ID, Group: r.Group, Units: units, State: hr.State, Reason: hr.Reason,
			Waves: len(r.WaveEnds), Hosts: len(r.Hosts), Soak: r.Strategy.Soak, HostWave: hr.Wave + 1,
		}
		if ri.HostWave > 0 {
			ri.HostState = hr.Mine.StateOf()
			if hr.Mine != nil {
				ri.HostSince, ri.HostReason = hr.Mine.Since, hr.Mine.Reason
			}
		}
		out = append(out, ri)
	}
	return out
}
