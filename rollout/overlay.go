package rollout

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/agentd/agentd/reconcile"
)

// Overlay returns the entries host runs under the rollouts: where a
// rollout governs its keys (they hold what it wrote) and host has not
// taken its change (or went back), each key holds what host ran before it:
// the rollout's From, or, when the rollout followed another that did not
// finish (After: aborted, failed, or superseded while running), what that
// one gives host, and so on back. So a host reverted from an aborted
// change, or not yet in it, keeps what it runs when the next rollout
// starts. A host that is not among a governing rollout's hosts (it
// joined the group since the start) keeps what it ran before too: it takes
// the change in the last wave, once the coordinator adds it, or when the
// rollout is done; after a failed or aborted one it runs the last good
// content. Entries no rollout touches are shared. mine is host's own
// progress, by rollout ID: nothing else is needed, so a host never reads
// another host's progress.
func Overlay(entries []reconcile.Entry, host string, records []*Record, mine map[string]*Progress) []reconcile.Entry {
	byID := make(map[string]*Record, len(records))
	for _, r := range records {
		byID[r.ID] = r
	}
	var out []reconcile.Entry
	for _, r := range records {
		if !r.Governs(entries) || mine[r.ID].Took() {
			continue
		}
		if out == nil {
			out = slices.Clone(entries)
		}
		out = r.previous(out, func(key string) (from *string, rev int64) {
			cur := r
			for {
				ru := cur.Units[key]
				from, rev = ru.From, ru.FromRevision
				next := byID[cur.After]
				if next == nil || (next.End != nil && next.End.State == Done) {
					return from, rev
				}
				if _, ok := next.Units[key]; !ok {
					return from, rev
				}
				if mine[next.ID].Took() {
					return from, rev // host runs next's change: cur's From
				}
				cur = next
			}
		})
	}
	if out == nil {
		return entries
	}
	return out
}

// previous puts r's keys back to what host ran before it (prev).
func (r *Record) previous(entries []reconcile.Entry, prev func(key string) (*string, int64)) []reconcile.Entry {
	seen := map[string]bool{}
	out := entries[:0]
	for _, e := range entries {
		if _, ok := r.Units[e.Unit]; !ok || e.Scope != reconcile.ScopeGroup || e.Group != r.Group {
			out = append(out, e)
			continue
		}
		seen[e.Unit] = true
		if from, rev := prev(e.Unit); from != nil {
			e.Value, e.ModRevision = []byte(*from), rev
			out = append(out, e)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(r.Units)) {
		if from, rev := prev(key); !seen[key] && from != nil {
			out = append(out, reconcile.Entry{Scope: reconcile.ScopeGroup, Group: r.Group, Unit: key, Value: []byte(*from), ModRevision: rev})
		}
	}
	slices.SortFunc(out, reconcile.CompareEntries)
	return out
}

// OverlaySignatures returns the signature records host checks under the
// rollouts: where host took a signed rollout's change and went back
// (reverting, reverted), each key's record is the rollout's signed way
// back (Unit.BackSig), which the agent accepts for the previous content
// where the change's own record would be "bad signature" and the old one
// "replayed". Where the rollout followed others (After) the host may go
// back further than the rollout's From (Overlay): the way back is the one
// signed for the content it runs (Unit.BackSigs). A host that never took
// the change (pending, or not among its hosts: it joined since) runs the
// previous content with the record that signed it before the change
// (Unit.FromSig, along After for what an older rollout gives it): a host
// that ran it accepted that record already, and a host that joined since
// needs it; its sequence is below the change's, so the host takes the
// change when its wave comes (a way back, at a higher sequence, would
// make it refuse it). runs are what host runs (Overlay of entries).
func OverlaySignatures(sigs, entries, runs []reconcile.Entry, records []*Record, mine map[string]*Progress) []reconcile.Entry {
	byID := make(map[string]*Record, len(records))
	for _, r := range records {
		byID[r.ID] = r
	}
	var out []reconcile.Entry
	var byKey map[[2]string]reconcile.Entry // group, key → what host runs; indexed once, when needed
	run := func(group, key string) ([]byte, bool) {
		if byKey == nil {
			byKey = map[[2]string]reconcile.Entry{}
			for _, e := range runs {
				if e.Scope == reconcile.ScopeGroup {
					byKey[[2]string{e.Group, e.Unit}] = e
				}
			}
		}
		e, ok := byKey[[2]string{group, key}]
		return e.Value, ok
	}
	for _, r := range records {
		st := mine[r.ID].StateOf()
		if (st != HostReverting && st != HostReverted && st != HostRevertFailed && st != HostPending) || !r.Governs(entries) {
			continue
		}
		for key, u := range r.Units {
			var rec string
			if st == HostPending {
				var froms []string
				cur := r
				for range records { // along After, as Overlay walks it
					cu, ok := cur.Units[key]
					if !ok {
						break
					}
					if cu.FromSig != "" {
						froms = append(froms, cu.FromSig)
					}
					if cur = byID[cur.After]; cur == nil || (cur.End != nil && cur.End.State == Done) {
						break
					}
				}
				if len(froms) == 0 {
					continue
				}
				content, present := run(r.Group, key)
				if rec = signing(froms, content, present); rec == "" {
					continue // not signed here: the records as they are say why
				}
			} else {
				if u.BackSig == "" {
					continue
				}
				rec = u.BackSig
				if len(u.BackSigs) > 0 {
					content, present := run(r.Group, key)
					if rec = signing(append([]string{u.BackSig}, u.BackSigs...), content, present); rec == "" {
						rec = u.BackSig // the agent says why it refuses it
					}
				}
			}
			if out == nil {
				out = slices.Clone(sigs)
			}
			e := reconcile.Entry{Scope: reconcile.ScopeGroup, Group: r.Group, Unit: key, Value: []byte(rec)}
			i, found := slices.BinarySearchFunc(out, e, reconcile.CompareEntries)
			if found {
				e.ModRevision = out[i].ModRevision
				out[i] = e
			} else {
				out = slices.Insert(out, i, e)
			}
		}
	}
	if out == nil {
		return sigs
	}
	return out
}

// signing is the first of the signature records recs that signs content
// (absent: its removal), "" when none does.
func signing(recs []string, content []byte, present bool) string {
	hash := ""
	if present {
		hash = reconcile.Hash(content)
	}
	for _, b := range recs {
		var rec reconcile.SignatureRecord
		if json.Unmarshal([]byte(b), &rec) == nil && rec.Hash == hash && rec.Removed == !present {
			return b
		}
	}
	return ""
}

// HoldUnconfirmed keeps each group key written after upTo (the revision up
// to which the rollouts are known complete) as it was in prev: such a key
// may be staged by a rollout whose record has not arrived yet, and a host
// outside its first wave must not run it meanwhile. A key that was not in
// prev stays out. upTo 0 (not known, e.g. a saved snapshot) holds nothing.
// A removal cannot be dated (the key is gone): it is not held. It says
// whether it held anything: the snapshot then speaks for upTo only.
func HoldUnconfirmed(entries, prev []reconcile.Entry, upTo int64) ([]reconcile.Entry, bool) {
	if upTo <= 0 {
		return entries, false
	}
	held := false
	for _, e := range entries {
		if e.Scope == reconcile.ScopeGroup && e.ModRevision > upTo {
			held = true
			break
		}
	}
	if !held {
		return entries, false
	}
	was := make(map[[2]string]reconcile.Entry, len(prev))
	for _, e := range prev {
		if e.Scope == reconcile.ScopeGroup {
			was[[2]string{e.Group, e.Unit}] = e
		}
	}
	out := make([]reconcile.Entry, 0, len(entries))
	for _, e := range entries {
		if e.Scope == reconcile.ScopeGroup && e.ModRevision > upTo {
			if old, ok := was[[2]string{e.Group, e.Unit}]; ok {
				out = append(out, old)
			}
			continue
		}
		out = append(out, e)
	}
	slices.SortFunc(out, reconcile.CompareEntries)
	return out, true
}
