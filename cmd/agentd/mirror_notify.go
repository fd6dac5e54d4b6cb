package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/agentd/agentd/mirror"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
)

// A mirrored commit as a change like any other (issue 35): a group with
// groups/<group>/rollout.toml gets the commit's writes to it as rollouts
// (commitRollouts, staged by the registry in the commit's transaction),
// and --notify-url hears each commit's verdict once its rollouts end
// (mirrorNotifier).

// Verdicts of a mirrored commit (commitVerdict.Verdict).
const (
	verdictApplied    = "applied"    // written, with no rollout: no host's outcome is awaited
	verdictDone       = "done"       // every rollout it started is done
	verdictFailed     = "failed"     // one of them failed
	verdictAborted    = "aborted"    // one was aborted (or its record removed)
	verdictSuperseded = "superseded" // one was superseded (a later commit, or a direct write, wrote its keys again)
)

// commitVerdict is the JSON --notify-url receives: README.md, "Git mirror",
// documents it.
type commitVerdict struct {
	Mirror   string           `json:"mirror"`
	Repo     string           `json:"repo"`
	Branch   string           `json:"branch"`
	Commit   string           `json:"commit"`
	Subject  string           `json:"subject"`
	Signer   string           `json:"signer"`
	Verdict  string           `json:"verdict"`
	Rollouts []verdictRollout `json:"rollouts"`
	At       time.Time        `json:"at"`
}

// verdictRollout is one rollout a commit started, as it stands.
type verdictRollout struct {
	ID     string `json:"id"`
	Group  string `json:"group"`
	Phase  string `json:"phase"`
	Reason string `json:"reason,omitempty"`
	ended  bool
}

// phaseGone is the phase of a rollout whose record is gone.
const phaseGone = "gone"

// verdictOf is a commit's verdict from its rollouts, once they ended:
// the worst of them (failed, aborted, superseded, done); applied without
// any.
func verdictOf(rs []verdictRollout) string {
	if len(rs) == 0 {
		return verdictApplied
	}
	worst := verdictDone
	rank := map[string]int{verdictDone: 0, verdictSuperseded: 1, verdictAborted: 2, verdictFailed: 3}
	for _, r := range rs {
		v := r.Phase
		if v == phaseGone {
			v = verdictAborted
		}
		if _, ok := rank[v]; ok && rank[v] > rank[worst] {
			worst = v
		}
	}
	return worst
}

// commitRollouts are the rollouts commit c's change ch starts: one for
// each group it writes that has a rollout strategy in c or a maintenance
// window (its rollout.toml's, else the group's own), over the group's
// hosts now (groupRollout, as `unit put --group G --waves …`). A group
// no host has joined yet is written at once (logged): there is no host to
// stage it on.
func (m *mirrorLoop) commitRollouts(ctx context.Context, c *object.Commit, ch mirror.Change) (map[string]*rollout.Record, error) {
	strategies, err := mirror.Rollouts(c)
	if err != nil {
		return nil, err
	}
	var known []registry.KnownHost
	out := map[string]*rollout.Record{}
	for _, t := range ch.Targets() {
		if t.Group == "" {
			continue
		}
		s, ok := strategies[t.Group]
		if !ok {
			s = rollout.Strategy{MaxRestarts: -1} // none: as rollout.toml's defaults
		}
		if s.Window == nil {
			w, ok, err := m.store.Window(ctx, t.Group)
			if err != nil {
				return nil, fmt.Errorf("read the window of group %s: %w", t.Group, err)
			}
			if ok {
				s.Window = &w // the group's own: the commit's change waits for it
			}
		}
		if !s.IsRollout() {
			continue
		}
		if known == nil {
			if known, err = m.store.KnownHosts(ctx); err != nil {
				return nil, fmt.Errorf("read the hosts of group %s for its rollout: %w", t.Group, err)
			}
		}
		r, down := groupRollout(known, t.Group, s, m.now())
		if r == nil {
			m.log.Info("group has a rollout strategy but no host has joined it: the commit's change to it is written at once",
				"group", t.Group, "commit", short(c.Hash.String()))
			continue
		}
		if len(down) > 0 {
			m.log.Warn("hosts of the group have no live agent: the rollout waits for them in their wave",
				"group", t.Group, "hosts", rollout.NameHosts(down, len(down)))
		}
		out[t.Group] = r
	}
	return out, nil
}

// started is what follows a commit's write: the rollouts it started (read
// back from the state the write left), logged, and its verdict to come
// for --notify-url.
func (m *mirrorLoop) started(ctx context.Context, mc registry.MirrorCommit) {
	var rs []registry.MirrorRollout
	if len(mc.Rollouts) > 0 {
		st, _, err := m.store.MirrorState(ctx, m.cfg.name)
		switch {
		case err != nil:
			m.log.Warn("could not read the rollouts the commit started", "commit", short(mc.Commit), "err", err)
		case st.Commit == mc.Commit:
			rs = st.Rollouts
		}
	}
	for _, r := range rs {
		m.log.Info("commit started a rollout: agentd rollout status ID follows it",
			"commit", short(mc.Commit), "rollout", r.ID, "group", r.Group)
	}
	v := commitVerdict{Mirror: mc.Name, Repo: mc.URL, Branch: mc.Branch, Commit: mc.Commit,
		Subject: mc.Subject, Signer: mc.Signer, Rollouts: []verdictRollout{}}
	for _, r := range rs {
		v.Rollouts = append(v.Rollouts, verdictRollout{ID: r.ID, Group: r.Group, Phase: string(rollout.Starting)})
	}
	m.notify.report(v)
}

// rolloutReader reads a rollout as `agentd rollout status` does.
type rolloutReader interface {
	Rollout(ctx context.Context, id string, hosts bool) (rollout.View, error)
}

// mirrorNotifier posts each mirrored commit's verdict to --notify-url:
// at once for a commit without rollouts ("applied"), else once every
// rollout it started settled (ended; reverted, if it reverts). It never
// holds the mirror back: each commit has a goroutine of its own, owned by
// the notifier (wait), that ends with ctx (shutdown: the verdicts not yet
// sent are not). A nil *mirrorNotifier posts nothing. The POST is retried
// with backoff (tries in all, the first retry after retry, doubled each
// time); a 2xx ends it; the last failure is logged and the verdict
// dropped.
type mirrorNotifier struct {
	ctx    context.Context
	url    string
	client *http.Client
	reader rolloutReader
	log    *slog.Logger
	now    func() time.Time
	poll   time.Duration // how often the rollouts of a commit are read
	retry  time.Duration
	tries  int
	wg     sync.WaitGroup
}

func newMirrorNotifier(ctx context.Context, url string, reader rolloutReader, log *slog.Logger) *mirrorNotifier {
	if url == "" {
		return nil
	}
	return &mirrorNotifier{ctx: ctx, url: url, client: &http.Client{Timeout: 10 * time.Second}, reader: reader,
		log: log.With("component", "notify"), now: time.Now, poll: time.Second, retry: 2 * time.Second, tries: 5}
}

// report follows v's rollouts, then posts v with its verdict.
func (n *mirrorNotifier) report(v commitVerdict) {
	if n == nil {
		return
	}
	n.wg.Go(func() {
		if !n.follow(n.ctx, v.Rollouts) {
			return
		}
		v.Verdict, v.At = verdictOf(v.Rollouts), n.now().UTC()
		n.post(n.ctx, v)
	})
}

// wait waits for the goroutines of report: they end with the notifier's
// ctx.
func (n *mirrorNotifier) wait() {
	if n != nil {
		n.wg.Wait()
	}
}

// follow reads rs until each one settled, filling in its phase; false
// when ctx ended first.
func (n *mirrorNotifier) follow(ctx context.Context, rs []verdictRollout) bool {
	for {
		all := true
		for i := range rs {
			r := &rs[i]
			if r.ended {
				continue
			}
			v, err := n.reader.Rollout(ctx, r.ID, false)
			switch {
			case errors.Is(err, registry.ErrNoRollout):
				r.Phase, r.Reason, r.ended = phaseGone, "its record is gone (agentd rollout rm)", true
			case err != nil:
				n.log.Debug("read rollout", "rollout", r.ID, "err", err)
			default:
				ph := v.Phase()
				r.Phase, r.Reason, r.ended = string(ph.State), ph.Reason, v.Settled()
			}
			all = all && r.ended
		}
		if all {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(n.poll):
		}
	}
}

// post sends v, retried with backoff until a 2xx, n.tries in all.
func (n *mirrorNotifier) post(ctx context.Context, v commitVerdict) {
	body, err := json.Marshal(v)
	if err != nil {
		n.log.Warn("verdict not sent", "commit", short(v.Commit), "err", err)
		return
	}
	delay := n.retry
	for try := 1; ; try++ {
		err := n.postOnce(ctx, body)
		if err == nil {
			n.log.Info("verdict sent", "commit", short(v.Commit), "verdict", v.Verdict, "try", try)
			return
		}
		if try >= n.tries || ctx.Err() != nil {
			n.log.Warn("verdict not sent: giving up", "commit", short(v.Commit), "verdict", v.Verdict, "tries", try, "err", err)
			return
		}
		n.log.Debug("verdict not sent; retrying", "commit", short(v.Commit), "try", try, "retry_in", delay, "err", err)
		select {
		case <-ctx.Done():
			n.log.Warn("verdict not sent: shutting down", "commit", short(v.Commit), "verdict", v.Verdict)
			return
		case <-time.After(delay):
		}
		delay *= 2
	}
}

func (n *mirrorNotifier) postOnce(ctx context.Context, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "agentd-mirror")
	resp, err := n.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// checkNotifyURL checks --notify-url: an http:// or https:// URL.
func checkNotifyURL(u string) error {
	if u != "" && !slices.ContainsFunc([]string{"http://", "https://"}, func(p string) bool { return strings.HasPrefix(u, p) }) {
		return fmt.Errorf("mirror: --notify-url %q: want an http:// or https:// URL", u)
	}
	return nil
}
