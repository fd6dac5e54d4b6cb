package registry

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Rollouts of mirrored commits (issue 35): a group with a rollout strategy
// in the repository (groups/<group>/rollout.toml) gets its commits as
// rollouts, as `unit put --group G --waves …` stages a write.
//
// MirrorCommit.Rollouts holds, by group, the rollout the commit's write to
// that group starts (its ID, Strategy, Hosts, WaveEnds; By and Reason
// default to the commit's who and subject). ApplyCommit stages it with the
// write in the commit's one transaction (WithRollout), superseding any
// rollout of the same keys still running (an older commit's, or a direct
// put's): a commit replaces the one before it. A commit that both puts and
// deletes keys of the group stages two rollouts of the same hosts and
// waves, the puts' (the record's ID) and the deletes' (ID+"-rm"), as
// `unit put` and `unit rm` would. The state records the rollouts the
// commit started (MirrorState.Rollouts).

// MirrorRollout is a rollout a mirrored commit started.
type MirrorRollout struct {
	ID    string `json:"id"`
	Group string `json:"group"`
}

// removalSuffix names the rollout of a commit's deletes of a group that it
// also puts keys to: the puts' rollout ID with this suffix.
const removalSuffix = "-rm"

// validateRollouts checks mc.Rollouts: each a record of its group, with
// hosts and waves that cover them.
func (mc MirrorCommit) validateRollouts() error {
	var errs []error
	for g, r := range mc.Rollouts {
		switch {
		case ValidateName("group", g) != nil:
			errs = append(errs, fmt.Errorf("rollout of %q: %w", g, ValidateName("group", g)))
		case r == nil || r.ID == "" || strings.HasSuffix(r.ID, removalSuffix):
			errs = append(errs, fmt.Errorf("rollout of group %s: no record, or no ID of its own", g))
		case r.Group != "" && r.Group != g:
			errs = append(errs, fmt.Errorf("rollout %s of group %s: it says group %s", r.ID, g, r.Group))
		case len(r.Hosts) == 0 || len(r.WaveEnds) == 0 || r.WaveEnds[len(r.WaveEnds)-1] != len(r.Hosts):
			errs = append(errs, fmt.Errorf("rollout %s of group %s: no hosts, or waves that do not cover them", r.ID, g))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: %w: %w", mc, ErrInvalid, err)
	}
	return nil
}

// optionsFor is o for the write of target t: staged as the commit's
// rollout of t's group when it has one, superseding.
func (mc MirrorCommit) optionsFor(t Target, o writeOptions) writeOptions {
	r := mc.Rollouts[t.Group]
	if t.Group == "" || r == nil {
		return o
	}
	if r.By == "" {
		r.By = mc.who()
	}
	if r.Reason == "" {
		r.Reason = oneLine(mc.Subject)
	}
	o.rollout, o.supersede = r, true
	o.ended = map[string]bool{}
	return o
}

// forRemoval is o for the deletes of a target whose puts o stages as a
// rollout: the same rollout under the ID of its deletes (a record's keys
// are staged by one write).
func (o writeOptions) forRemoval() writeOptions {
	if o.rollout == nil {
		return o
	}
	r := *o.rollout
	r.ID, r.Units, r.After = o.rollout.ID+removalSuffix, nil, ""
	o.rollout = &r
	return o
}

// stagedRollouts are the rollouts ws stage, in order.
func stagedRollouts(ws []*writeTxn) []MirrorRollout {
	var out []MirrorRollout
	for _, w := range ws {
		if r := w.o.rollout; r != nil && !slices.ContainsFunc(out, func(m MirrorRollout) bool { return m.ID == r.ID }) {
			out = append(out, MirrorRollout{ID: r.ID, Group: w.target.Group})
		}
	}
	return out
}

// endOnce says whether a write ends the running rollout id it supersedes:
// the first of a commit's writes that shares its keys does; the others of
// the same transaction leave it (it ends once).
func (o writeOptions) endOnce(id string) bool {
	if o.ended == nil {
		return true
	}
	if o.ended[id] {
		return false
	}
	o.ended[id] = true
	return true
}
