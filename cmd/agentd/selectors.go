package main

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/agentd/agentd/metrics"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
	"github.com/agentd/agentd/selector"
)

// Selector targets, the agent's side. A put with --selector S stores to
// the group registry.SelectorGroup(S) (a sel- group) and records S at
// <p>/selectors/<group>. Every agent follows those records and is a member
// of the sel- groups whose selectors match its own labels (--label and its
// facts, as published), besides its --group groups: its unit watch, its
// membership record and a rollout coordinator candidacy per group follow
// that set. Labels change with the labels file (currentLabels) or a
// restart: the follower then republishes the membership record with the
// new labels and joins or leaves the selectors they match, so a host
// relabelled takes or drops a selector's units in one pass, its first
// after the change. The CLI counts a selector's members by the same match
// (registry.MatchingSelectors, in registry.KnownHosts).

// selectorFollower runs the agent's unit watch over its effective groups
// and restarts it whenever they change.
type selectorFollower struct {
	o       *runOptions
	log     *slog.Logger
	met     *metrics.Metrics
	reg     *registry.Client
	s       *registry.Session
	elector func() rollout.Elector

	// sels are the selectors of the groups joined through one, by group;
	// coords cancels the coordinator candidacy of each.
	sels   map[string]selector.Selector
	coords map[string]context.CancelFunc
	// all are the selectors last applied; published the labels the
	// membership record carries; unpublished says the record is behind
	// (its put failed: tried again every membershipRetry).
	all         map[string]selector.Selector
	published   map[string]string
	unpublished bool
	wg          sync.WaitGroup
}

// membershipRetry is how often a membership record that could not be put
// (etcd away) is tried again.
const membershipRetry = 5 * time.Second

// run watches the host's keys (registry Watch) for its effective groups
// until ctx is done or the watch fails; when the selectors change which
// groups those are, it updates the membership record and watches again
// (the new snapshot is the host's one change: one pass).
func (f *selectorFollower) run(ctx context.Context, onSnapshot func(registry.Snapshot)) error {
	defer f.wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f.published = f.s.Member().Labels
	all := f.firstRead(ctx)
	changes := make(chan map[string]selector.Selector, 1)
	f.wg.Go(func() {
		_ = f.reg.WatchSelectors(ctx, func(all map[string]selector.Selector) {
			select { // keep only the newest
			case <-changes:
			default:
			}
			changes <- all
		})
	})
	if err := f.apply(ctx, all); err != nil {
		return err
	}
	for {
		groups := f.groups()
		wctx, wcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		f.wg.Go(func() { done <- f.reg.Watch(wctx, f.o.host, groups, onSnapshot) })
		err := f.until(ctx, groups, changes, done)
		wcancel()
		if err != nil {
			return err
		}
		<-done
	}
}

// until applies the selectors from changes, and the labels as they
// change, until the effective groups differ from groups (nil), the watch
// ends (done: its error) or ctx is done.
func (f *selectorFollower) until(ctx context.Context, groups []string, changes <-chan map[string]selector.Selector, done <-chan error) error {
	for {
		var retry <-chan time.Time
		if f.unpublished {
			retry = time.After(membershipRetry)
		}
		var err error
		select {
		case err := <-done:
			if err == nil {
				err = errors.New("registry watch ended")
			}
			return err
		case all := <-changes:
			err = f.apply(ctx, all)
		case <-f.o.labelsNow.Changed():
			err = f.apply(ctx, f.all)
		case <-retry:
			err = f.apply(ctx, f.all)
		}
		if err != nil {
			return err
		}
		if !slices.Equal(groups, f.groups()) {
			return nil
		}
	}
}

// firstRead reads the selectors before the first watch, so that a
// restarted agent's first snapshot already has its selector groups' units
// (none dropped and taken again). While etcd cannot answer it retries; an
// etcd role that may not read them means none.
func (f *selectorFollower) firstRead(ctx context.Context) map[string]selector.Selector {
	delay := 100 * time.Millisecond
	for {
		all, _, err := f.reg.Selectors(ctx)
		if err == nil {
			return all
		}
		if errors.Is(err, rpctypes.ErrPermissionDenied) || ctx.Err() != nil {
			f.log.Warn("the selector targets cannot be read: this host takes no selector's units", "err", err)
			return nil
		}
		f.log.Warn("reading the selector targets; retrying", "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}

// groups are the effective groups: --group and the joined selectors'.
func (f *selectorFollower) groups() []string {
	gs := slices.Concat(f.o.groups, slicesKeys(f.sels))
	slices.Sort(gs)
	return slices.Compact(gs)
}

func slicesKeys(m map[string]selector.Selector) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// apply joins the groups of the selectors in all that match the host's
// labels as they are now and leaves the others: logged, a coordinator
// candidacy started or stopped for each, and the membership record put
// again when its groups or labels changed.
func (f *selectorFollower) apply(ctx context.Context, all map[string]selector.Selector) error {
	f.all = all
	labels := f.o.labelsNow.Get()
	matching := registry.MatchingSelectors(all, labels)
	if f.sels == nil {
		f.sels, f.coords = map[string]selector.Selector{}, map[string]context.CancelFunc{}
	}
	changed := false
	for g, sel := range f.sels {
		if !slices.Contains(matching, g) {
			f.log.Info("left selector '"+sel.String()+"' ("+g+")", "group", g, "selector", sel.String())
			delete(f.sels, g)
			f.coords[g]()
			delete(f.coords, g)
			changed = true
		}
	}
	for _, g := range matching {
		if _, ok := f.sels[g]; ok || slices.Contains(f.o.groups, g) {
			continue
		}
		sel := all[g]
		f.log.Info("joined selector '"+sel.String()+"' ("+g+")", "group", g, "selector", sel.String())
		f.sels[g] = sel
		cctx, cancel := context.WithCancel(ctx)
		f.coords[g] = cancel
		c := rollout.NewCoordinator(g, f.log, f.elector)
		f.wg.Go(func() { c.Run(cctx) })
		changed = true
	}
	gs := f.groups()
	if changed {
		f.met.SetGroups(gs)
	}
	relabelled := !maps.Equal(labels, f.published)
	if !changed && !relabelled && !f.unpublished {
		return nil
	}
	if err := f.s.SetMember(ctx, gs, labels); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The watch follows the groups all the same; the record is put
		// again in membershipRetry (and with the lease's next re-creation).
		if !f.unpublished {
			f.log.Warn("the membership record does not name the host's groups and labels yet; retrying", "groups", strings.Join(gs, ","),
				"labels", describeLabels(labels, 1<<20), "err", err, "retry_in", membershipRetry)
		}
		f.unpublished = true
		return nil
	}
	if relabelled || f.unpublished {
		f.log.Info("membership republished: labels "+describeLabels(labels, 1<<20)+", groups "+strings.Join(gs, ","),
			"groups", strings.Join(gs, ","), "labels", describeLabels(labels, 1<<20))
	}
	f.published, f.unpublished = labels, false
	return nil
}
