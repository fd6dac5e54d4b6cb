package rollout

import (
	"fmt"
	"slices"
)

// A budget bounds how many hosts take a change at once
// (Strategy.MaxUnavailable). With Strategy.BudgetBy it is one budget per
// value of a label (Flight Control's groupBy): --max-unavailable 1
// --budget-by rack lets one host per rack be down at once, every rack in
// parallel. The CLI sorts the hosts into buckets at the start
// (Record.Buckets), from the labels their agents publish; a host that
// joined since has no bucket the coordinator knows (it reads no labels),
// so it is admitted only while no other host is taking the change, and
// none is admitted while it is.

// unknownBucket is the bucket of a host whose label value the record
// does not hold (a joiner).
const unknownBucket = -1

// Buckets sorts hosts (in rollout order) into s.BudgetBy's buckets: for
// each host the index of its bucket in names, a name per bucket
// ("rack=r1", or "(no rack)" for the hosts without the label, who share
// one budget).
func (s Strategy) Buckets(hosts []string, labels map[string]map[string]string) (of []int, names []string) {
	if s.BudgetBy == "" {
		return nil, nil
	}
	index := map[string]int{}
	of = make([]int, len(hosts))
	for i, h := range hosts {
		name := "(no " + s.BudgetBy + ")"
		if v, ok := labels[h][s.BudgetBy]; ok {
			name = s.BudgetBy + "=" + v
		}
		b, seen := index[name]
		if !seen {
			b = len(names)
			index[name] = b
			names = append(names, name)
		}
		of[i] = b
	}
	return of, names
}

// bucketOf is the budget bucket of the host at index i of Hosts: 0 for
// every host without BudgetBy.
func (r *Record) bucketOf(i int) int {
	switch {
	case r.Strategy.BudgetBy == "":
		return 0
	case i < len(r.Buckets):
		return r.Buckets[i]
	}
	return unknownBucket
}

// BucketName names the bucket of host ("rack=r1"); "" without a budget
// by label.
func (r *Record) BucketName(host string) string {
	if r.Strategy.BudgetBy == "" {
		return ""
	}
	i := slices.Index(r.Hosts, host)
	if b := r.bucketOf(i); i >= 0 && b >= 0 && b < len(r.BucketNames) {
		return r.BucketNames[b]
	}
	return fmt.Sprintf("(%s not known: joined since the start)", r.Strategy.BudgetBy)
}

// unavailable says a host admitted in state st counts against the budget:
// it is taking the change or going back from it.
func unavailable(st HostState) bool {
	switch st {
	case HostPending, HostApplying, HostSoaking, HostReverting:
		return true
	}
	return false
}

// admit are the hosts of waves up to w not admitted yet, in order, as
// many as --max-unavailable leaves room for in each budget (no bound when
// unset), but not a host known down (admitted, it would hold a place in
// the budget it cannot use; it is admitted when its agent returns): a host admitted and not yet healthy counts against its budget,
// so the bound holds exactly with one coordinator and no group-wide
// guard.
func (r *Record) admit(g GroupView, w int) []string {
	bounded := !r.Strategy.MaxUnavailable.IsZero()
	size, busy := map[int]int{}, map[int]int{}
	total := 0
	for i, h := range r.Hosts {
		b := r.bucketOf(i)
		size[b]++
		if bounded && g.Admitted[h] && unavailable(g.Progress[h].StateOf()) {
			busy[b]++
			total++
		}
	}
	room := func(b int) bool {
		switch {
		case !bounded:
			return true
		case b == unknownBucket:
			return total == 0
		case busy[unknownBucket] > 0:
			return false
		}
		return busy[b] < max(1, r.Strategy.MaxUnavailable.Of(size[b]))
	}
	var out []string
	for i, h := range r.Hosts[:r.WaveEnds[w]] {
		if b := r.bucketOf(i); !g.Admitted[h] && g.Progress[h].StateOf() == HostPending && !g.down(h) && room(b) {
			out = append(out, h)
			busy[b]++
			total++
		}
	}
	return out
}
