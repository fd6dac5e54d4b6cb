package reconcile

import (
	"bytes"
	"cmp"
	"slices"
)

// CompareEntries orders entries by key: scope, group, unit key. A registry
// snapshot is sorted this way; one key appears once.
func CompareEntries(a, b Entry) int {
	return cmp.Or(cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Group, b.Group), cmp.Compare(a.Unit, b.Unit))
}

// SortedEntries returns es in key order with one entry per key (of
// repeated keys, the last). A registry snapshot is that already and comes
// back as it is, after an O(n) check; only hand-made snapshots (tests,
// previews) are copied and sorted.
func SortedEntries(es []Entry) []Entry { return SortedUnique(es, CompareEntries) }

// SortedUnique returns s sorted by cmp with one element per key (of equal
// ones, the last). A list that is so already is returned as it is, after an
// O(n) check: the lists the agent hands around are, and are kept without a
// copy. Otherwise s is copied; it is never modified.
func SortedUnique[T any](s []T, cmp func(x, y T) int) []T {
	ok := true
	for i := 1; i < len(s) && ok; i++ {
		ok = cmp(s[i-1], s[i]) < 0
	}
	if ok {
		return s
	}
	out := slices.Clone(s)
	slices.SortStableFunc(out, cmp)
	w := 0
	for i := range out {
		if i+1 < len(out) && cmp(out[i], out[i+1]) == 0 {
			continue // keep the last of a run of equal keys
		}
		out[w] = out[i]
		w++
	}
	return out[:w]
}

// DiffEntries calls fn, in key order, for every key whose entry differs
// between two sorted entry lists (SortedEntries): with the new entry, or
// with the old one and gone set when the key was deleted. An entry differs
// when its value or its ModRevision does.
//
// It walks both lists once and compares values with bytes.Equal, which
// returns at once for the same backing array: the watcher shares unchanged
// values between snapshots, so an unchanged key costs a key comparison.
func DiffEntries(old, now []Entry, fn func(e Entry, gone bool)) {
	i, j := 0, 0
	for i < len(old) || j < len(now) {
		c := 0
		switch {
		case i == len(old):
			c = 1
		case j == len(now):
			c = -1
		default:
			c = CompareEntries(old[i], now[j])
		}
		switch {
		case c < 0:
			fn(old[i], true)
			i++
		case c > 0:
			fn(now[j], false)
			j++
		default:
			if old[i].ModRevision != now[j].ModRevision || !bytes.Equal(old[i].Value, now[j].Value) {
				fn(now[j], false)
			}
			i++
			j++
		}
	}
}
