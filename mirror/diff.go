package mirror

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/agentd/agentd/registry"
)

// DefaultDeleteThreshold is the share of the mirrored keys one commit may
// delete before Guard refuses it: more is far likelier a broken checkout,
// a wrong branch or a bad merge than an intended teardown.
const DefaultDeleteThreshold = 0.20

// ErrMassDelete is wrapped by Guard's error: the change would delete more
// of the registry than the threshold allows. Nothing should be written;
// an operator who means it raises the threshold for that one commit.
var ErrMassDelete = errors.New("mass delete refused")

// Change is what turns one tree into the next, per target: keys to put
// (new or changed, with their new values) and keys to delete (sorted).
type Change struct {
	Puts    map[registry.Target]map[string][]byte
	Deletes map[registry.Target][]string
}

// Changes diffs current (the registry's mirrored keys) against next (a
// rendered commit). Values compare as bytes.
func Changes(current, next Tree) Change {
	ch := Change{Puts: map[registry.Target]map[string][]byte{}, Deletes: map[registry.Target][]string{}}
	for t, units := range next {
		for k, v := range units {
			if old, ok := current[t][k]; ok && bytes.Equal(old, v) {
				continue
			}
			if ch.Puts[t] == nil {
				ch.Puts[t] = map[string][]byte{}
			}
			ch.Puts[t][k] = v
		}
	}
	for t, units := range current {
		for k := range units {
			if _, ok := next[t][k]; !ok {
				ch.Deletes[t] = append(ch.Deletes[t], k)
			}
		}
		slices.Sort(ch.Deletes[t])
	}
	for t, d := range ch.Deletes {
		if len(d) == 0 {
			delete(ch.Deletes, t)
		}
	}
	return ch
}

// Empty says the change changes nothing (a commit that touched only files
// the registry does not hold, e.g. a README).
func (ch Change) Empty() bool { return len(ch.Puts) == 0 && len(ch.Deletes) == 0 }

// Targets is every target the change touches, in a stable order.
func (ch Change) Targets() []registry.Target {
	all := maps.Clone(ch.Puts)
	if all == nil {
		all = map[registry.Target]map[string][]byte{}
	}
	for t := range ch.Deletes {
		all[t] = nil
	}
	return targets(all)
}

// deletes is how many keys the change deletes.
func (ch Change) deletes() int {
	n := 0
	for _, d := range ch.Deletes {
		n += len(d)
	}
	return n
}

// DeleteFraction is the share of current's keys the change deletes (0
// when current is empty).
func (ch Change) DeleteFraction(current Tree) float64 {
	total := current.Keys()
	if total == 0 {
		return 0
	}
	return float64(ch.deletes()) / float64(total)
}

// Guard refuses (ErrMassDelete) a change that deletes more than threshold
// (DefaultDeleteThreshold, or the operator's) of current's keys, and,
// whatever the threshold, one that leaves nothing where there was
// something: an empty tree is what a broken checkout or a wrong branch
// renders to, never how a fleet is meant to be torn down by mistake.
func Guard(current Tree, ch Change, threshold float64) error {
	total, n := current.Keys(), ch.deletes()
	if total > 0 && n == total && len(ch.Puts) == 0 {
		return fmt.Errorf("%w: the commit deletes every one of the %d mirrored keys (an empty hosts/ and groups/): remove them with agentd unit rm if that is meant", ErrMassDelete, total)
	}
	if f := ch.DeleteFraction(current); f > threshold {
		return fmt.Errorf("%w: the commit deletes %d of the %d mirrored keys (%.0f%%), over the %.0f%% allowed", ErrMassDelete, n, total, 100*f, 100*threshold)
	}
	return nil
}
