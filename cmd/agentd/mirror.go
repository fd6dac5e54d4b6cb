package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentd/agentd/calendar"
	"github.com/agentd/agentd/mirror"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/sshsig"
)

// `agentd mirror` is git as the source of truth for the registry. The
// package mirror does the git side (fetch, verify, render, diff, guard);
// this file wires it to the registry: mirrorLoop is one mirror's rounds
// while it is the elected leader, runMirror the process around it
// (election, triggers, webhook, metrics).

// mirrorStore is what a mirror round needs of the registry: the mirror's
// state and tree, and its two writes. *registry.Client has it; the loop
// tests use a fake that records the writes.
type mirrorStore interface {
	MirrorState(ctx context.Context, name string) (registry.MirrorState, bool, error)
	MirrorTree(ctx context.Context, name string) (map[registry.Target]map[string][]byte, error)
	ApplyCommit(ctx context.Context, mc registry.MirrorCommit) (int64, error)
	RefuseCommit(ctx context.Context, name string, r registry.MirrorRefusal) error
	// KnownHosts are the hosts a commit's rollouts go to; Rollout reads
	// one (mirror_notify.go).
	KnownHosts(ctx context.Context) ([]registry.KnownHost, error)
	// List reads a target's keys: those of a target a commit takes over.
	List(ctx context.Context, t *registry.Target) ([]registry.Listed, error)
	// Window is a group's maintenance window (agentd window set): a
	// commit's change to the group waits for it, as a put's does.
	Window(ctx context.Context, group string) (calendar.Window, bool, error)
	rolloutReader
}

// mirrorConfig is one mirror's settings, checked (mirrorOptions.check).
type mirrorConfig struct {
	name, url, branch string
	dir               string // this mirror's directory under --cache-dir
	verifyTip         bool   // --verify=tip
	start             plumbing.Hash
	threshold         float64 // --mass-delete-threshold, 0..1
	signers           *sshsig.AllowedSigners
	opts              []mirror.Option // how to reach the remote: mirror.WithAuth (mirror_auth.go)
}

// repoDir is the bare clone; fetchFile the result of the last fetch, for
// `agentd mirror status` on the same machine.
func (c mirrorConfig) repoDir() string   { return filepath.Join(c.dir, "repo") }
func (c mirrorConfig) fetchFile() string { return filepath.Join(c.dir, "fetch.json") }

// writeTimeout bounds one registry write. A write is not cancelled by
// shutdown: a round finishes the write it started (the registry refuses it
// anyway once leadership is gone: MirrorCommit.Leader).
const writeTimeout = 30 * time.Second

// mirrorLoop runs the rounds of one mirror. Not safe for concurrent use:
// one goroutine (the leader's) owns it and its clone.
type mirrorLoop struct {
	cfg   mirrorConfig
	store mirrorStore
	log   *slog.Logger
	met   *mirrorMetrics
	now   func() time.Time
	repo  *mirror.Repo // opened (cloned) at the first round that reaches the remote
	// notify posts each commit's verdict (--notify-url; nil: off).
	notify *mirrorNotifier
}

// fetchStatus is the result of the last fetch, kept in the mirror's
// directory: the registry holds what was mirrored and refused, this file
// when the remote was last asked and what it said.
type fetchStatus struct {
	Name   string    `json:"name"`
	URL    string    `json:"url"`
	Branch string    `json:"branch"`
	At     time.Time `json:"at"`
	OK     bool      `json:"ok"`
	Error  string    `json:"error,omitempty"`
	Tip    string    `json:"tip,omitempty"`
}

// fetch opens the clone if it is not yet and fetches; the outcome is
// recorded (the status file, the metrics) whatever it is.
func (m *mirrorLoop) fetch(ctx context.Context) (plumbing.Hash, error) {
	var tip plumbing.Hash
	err := os.MkdirAll(m.cfg.dir, 0o700)
	if err == nil && m.repo == nil {
		m.repo, err = mirror.Open(ctx, m.cfg.url, m.cfg.branch, m.cfg.repoDir(), m.cfg.opts...)
	}
	if err == nil {
		tip, err = m.repo.Fetch(ctx)
	}
	st := fetchStatus{Name: m.cfg.name, URL: m.cfg.url, Branch: m.cfg.branch, At: m.now().UTC(), OK: err == nil}
	if err != nil {
		st.Error = err.Error()
	} else {
		st.Tip = tip.String()
	}
	m.met.fetched(st.At, err == nil)
	if werr := writeFetchStatus(m.cfg.fetchFile(), st); werr != nil {
		m.log.Warn("could not save the fetch status (agentd mirror status will not show it)", "err", werr)
	}
	return tip, err
}

// syncOnce is one round: fetch, list the new commits, verify them, and
// write each good one (one registry write per commit), stopping at the
// first refused. Anything that fails before a write (the fetch, the
// registry read) is an error and changes nothing; a refusal is recorded
// in the registry and is not an error. The error wraps
// registry.ErrNotLeader when leadership is gone. allowMass lets the
// commits of this round delete more than the threshold (a sync with
// --allow-mass-delete); a commit that empties the tree is refused anyway.
func (m *mirrorLoop) syncOnce(ctx context.Context, leader *registry.MirrorLeader, allowMass bool) error {
	tip, err := m.fetch(ctx)
	if err != nil {
		return err
	}
	st, _, err := m.store.MirrorState(ctx, m.cfg.name)
	if err != nil {
		return fmt.Errorf("read the mirror's state: %w", err)
	}
	if st.URL != "" && (st.URL != m.cfg.url || st.Branch != m.cfg.branch) {
		return fmt.Errorf("mirror %q mirrors %s (branch %s) in the registry, not %s (branch %s): give another --name", m.cfg.name, st.URL, st.Branch, m.cfg.url, m.cfg.branch)
	}
	var last plumbing.Hash
	if st.Commit != "" {
		last = plumbing.NewHash(st.Commit)
	}
	if tip == last {
		m.met.caughtUp()
		return nil
	}
	good, stop, err := m.verify(last, tip)
	if err != nil {
		var nff *mirror.NotFastForwardError
		if errors.As(err, &nff) {
			return m.refuse(ctx, st, tip, m.authorOf(tip), fmt.Errorf("%w; agentd mirror reset --to SHA names the commit to go on from", err))
		}
		return err
	}
	if len(good) > 0 {
		if err := m.apply(ctx, leader, last, good, allowMass, st); err != nil {
			return err
		}
	}
	if stop != nil {
		return m.refuse(ctx, st, stop.Commit, stop.Author, stop)
	}
	return nil
}

// verify lists and verifies the commits from last to tip: every one
// (VerifyRange), or with --verify=tip the tip alone. stop is the commit
// refused for its signature, if any; err a fetch that is not a
// fast-forward (a *mirror.NotFastForwardError) or a repository error.
func (m *mirrorLoop) verify(last, tip plumbing.Hash) (good []mirror.Verified, stop *mirror.Refusal, err error) {
	if !m.cfg.verifyTip {
		commits, err := m.repo.NewCommits(last, tip)
		if err != nil {
			return nil, nil, err
		}
		good, stop = mirror.VerifyRange(commits, m.cfg.signers)
		return good, stop, nil
	}
	if err := m.repo.FastForward(last, tip); err != nil {
		return nil, nil, err
	}
	v, err := m.repo.VerifyTip(tip, m.cfg.start, m.cfg.signers)
	var ref *mirror.Refusal
	if errors.As(err, &ref) {
		return nil, ref, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return []mirror.Verified{v}, nil, nil
}

// apply writes each good commit in order, each diffed against the tree
// the one before it left, and stops at the first one refused (its tree
// does not render, or it deletes too much).
func (m *mirrorLoop) apply(ctx context.Context, leader *registry.MirrorLeader, parent plumbing.Hash, good []mirror.Verified, allowMass bool, st registry.MirrorState) error {
	cur, err := m.store.MirrorTree(ctx, m.cfg.name)
	if err != nil {
		return fmt.Errorf("read the mirrored keys: %w", err)
	}
	current := mirror.Tree(cur)
	threshold := m.cfg.threshold
	if allowMass {
		threshold = 1
	}
	for _, v := range good {
		c := v.Commit
		next, err := mirror.Render(c)
		if err != nil {
			return m.refuse(ctx, st, c.Hash, authorOf(c), err)
		}
		if err := m.takeOver(ctx, current, next); err != nil {
			return err
		}
		ch := mirror.Changes(current, next)
		if err := mirror.Guard(current, ch, threshold); err != nil {
			if !allowMass {
				err = fmt.Errorf("%w; held: agentd mirror sync --allow-mass-delete applies it", err)
			}
			return m.refuse(ctx, st, c.Hash, authorOf(c), err)
		}
		mc := registry.MirrorCommit{
			Name: m.cfg.name, URL: m.cfg.url, Branch: m.cfg.branch,
			Commit: c.Hash.String(), Signer: signerOf(v.Signer), Author: authorOf(c), Subject: subjectOf(c),
			Puts: ch.Puts, Deletes: ch.Deletes, Owned: ownedBy(next), Leader: leader,
		}
		if !parent.IsZero() {
			mc.Parent = parent.String()
		}
		if mc.Rollouts, err = m.commitRollouts(ctx, c, ch); err != nil {
			var re *mirror.RenderError
			if errors.As(err, &re) {
				return m.refuse(ctx, st, c.Hash, authorOf(c), err)
			}
			return fmt.Errorf("commit %s not written: %w", short(mc.Commit), err)
		}
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		rev, err := m.store.ApplyCommit(wctx, mc)
		cancel()
		switch {
		case errors.Is(err, registry.ErrNotLeader):
			return fmt.Errorf("commit %s not written: %w", short(mc.Commit), err)
		case errors.Is(err, registry.ErrMirrorMoved):
			return fmt.Errorf("commit %s not written: %w (a reset, or another writer): the next round reads the mirror's state again", short(mc.Commit), err)
		case err != nil:
			return fmt.Errorf("commit %s not written: %w", short(mc.Commit), err)
		}
		m.met.mirrored()
		m.log.Info("mirrored commit", "commit", short(mc.Commit), "author", mc.Author, "signer", mc.Signer,
			"subject", mc.Subject, "put", keysIn(ch.Puts), "deleted", deletesIn(ch.Deletes), "revision", rev)
		m.started(ctx, mc)
		current, parent = next, c.Hash
	}
	return nil
}

// takeOver adds to current the keys of each target next holds that the
// mirror does not own yet, as the registry has them: the commit that
// takes a target over makes it what git says at once — keys put there by
// hand go in that commit, under the mass-delete guard — rather than in
// the commit after it.
func (m *mirrorLoop) takeOver(ctx context.Context, current, next mirror.Tree) error {
	for t := range next {
		if _, owned := current[t]; owned {
			continue
		}
		ls, err := m.store.List(ctx, &t)
		if err != nil {
			return fmt.Errorf("read %s, which the commit takes over: %w", t, err)
		}
		keys := map[string][]byte{}
		for _, l := range ls {
			keys[l.Unit] = l.Value
		}
		current[t] = keys
	}
	return nil
}

// refuse records that commit is refused and why: the mirror stops before
// it, and `agentd mirror status` names it. The same refusal recorded
// already is not written again (a round runs every poll).
func (m *mirrorLoop) refuse(ctx context.Context, st registry.MirrorState, commit plumbing.Hash, author string, why error) error {
	r := registry.MirrorRefusal{Commit: commit.String(), Author: author, Reason: why.Error(), At: m.now().UTC()}
	m.met.stoppedAt()
	if p := st.Refused; p != nil && p.Commit == r.Commit && p.Reason == r.Reason {
		m.log.Debug("commit still refused", "commit", short(r.Commit), "reason", r.Reason)
		return nil
	}
	m.met.refused(refusalKind(why))
	m.log.Warn("commit refused: the mirror stops before it, nothing of it or after it is written",
		"commit", short(r.Commit), "author", author, "reason", r.Reason)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	if err := m.store.RefuseCommit(wctx, m.cfg.name, r); err != nil {
		return fmt.Errorf("record the refusal of %s: %w", short(r.Commit), err)
	}
	return nil
}

// lead runs rounds while this mirror is the leader: at once, then on a
// jittered poll, a webhook's poke or a sync request, until ctx is done
// (nil) or leadership is lost (an error wrapping ErrNotLeader).
func (m *mirrorLoop) lead(ctx context.Context, leader *registry.MirrorLeader, poll time.Duration, pokes <-chan struct{}, syncs <-chan registry.SyncRequest) error {
	allow := false
	for {
		err := m.syncOnce(ctx, leader, allow)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, registry.ErrNotLeader):
			return err
		case err != nil:
			m.log.Warn("mirror round failed: nothing changed; retrying at the next trigger", "err", err)
		}
		allow = false
		timer := time.NewTimer(reconcile.Jitter(poll))
		select {
		case <-ctx.Done():
		case <-timer.C:
		case <-pokes:
		case r, ok := <-syncs:
			if !ok {
				syncs = nil // watch ended: polls and webhooks still come
				break
			}
			allow = r.AllowMassDelete
			m.log.Info("sync requested", "by", r.By, "allow_mass_delete", r.AllowMassDelete)
		}
		timer.Stop()
		if ctx.Err() != nil {
			return nil
		}
	}
}

// authorOf is a commit's author as git shows it: "Name <email>".
func authorOf(c *object.Commit) string { return fmt.Sprintf("%s <%s>", c.Author.Name, c.Author.Email) }

func (m *mirrorLoop) authorOf(h plumbing.Hash) string {
	c, err := m.repo.Commit(h)
	if err != nil {
		return "unknown"
	}
	return authorOf(c)
}

// subjectOf is a commit message's first line.
func subjectOf(c *object.Commit) string {
	s, _, _ := strings.Cut(strings.TrimSpace(c.Message), "\n")
	return strings.TrimSpace(s)
}

// signerOf says who signed: the allowed signer's principals and key.
func signerOf(s sshsig.Signer) string {
	return strings.TrimSpace(s.Principals + " " + s.Fingerprint)
}

// ownedBy is every target of a commit's tree: the targets the mirror owns
// once the commit is written (a direct write to one is refused without
// --force).
func ownedBy(t mirror.Tree) []registry.Target {
	return slices.SortedFunc(maps.Keys(t), func(a, b registry.Target) int { return strings.Compare(a.String(), b.String()) })
}

func keysIn(m map[registry.Target]map[string][]byte) int {
	n := 0
	for _, ks := range m {
		n += len(ks)
	}
	return n
}

func deletesIn(m map[registry.Target][]string) int {
	n := 0
	for _, ks := range m {
		n += len(ks)
	}
	return n
}

// refusalKind is a refusal's reason as a metric label.
func refusalKind(err error) string {
	var re *mirror.RenderError
	switch {
	case errors.Is(err, mirror.ErrNotFastForward):
		return "not-fast-forward"
	case errors.Is(err, mirror.ErrMassDelete):
		return "mass-delete"
	case errors.As(err, &re):
		return "render"
	case errors.Is(err, mirror.ErrUnsigned):
		return "unsigned"
	case errors.Is(err, mirror.ErrNotSSH):
		return "not-ssh"
	case errors.Is(err, sshsig.ErrUnknownKey):
		return "unknown-key"
	case errors.Is(err, sshsig.ErrNotAllowed):
		return "not-allowed"
	}
	return "bad-signature"
}

// writeFetchStatus saves st at path atomically (temp file, fsync, rename).
func writeFetchStatus(path string, st fetchStatus) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".fetch-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// readFetchStatus reads what writeFetchStatus saved; ok is false when
// there is nothing (no mirror ran with that cache directory here).
func readFetchStatus(path string) (st fetchStatus, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, false, nil
	} else if err != nil {
		return st, false, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, false, fmt.Errorf("%s: %w", path, err)
	}
	return st, true, nil
}

// mirrorMetrics are the mirror's Prometheus metrics, on a registry of
// their own (--metrics-addr). A nil *mirrorMetrics records nothing.
type mirrorMetrics struct {
	reg       *prometheus.Registry
	lastFetch prometheus.Gauge
	fetchOK   prometheus.Gauge
	fetches   *prometheus.CounterVec
	commits   prometheus.Counter
	refusals  *prometheus.CounterVec
	stopped   prometheus.Gauge
	leader    prometheus.Gauge
}

func newMirrorMetrics(name string) *mirrorMetrics {
	l := prometheus.Labels{"mirror": name}
	m := &mirrorMetrics{
		reg: prometheus.NewRegistry(),
		lastFetch: prometheus.NewGauge(prometheus.GaugeOpts{Name: "agentd_mirror_last_fetch_timestamp_seconds",
			Help: "When the mirror last asked the remote for new commits.", ConstLabels: l}),
		fetchOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "agentd_mirror_last_fetch_success",
			Help: "1 if the last fetch succeeded, 0 if it failed.", ConstLabels: l}),
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agentd_mirror_fetches_total",
			Help: "Fetches, by result (ok, error).", ConstLabels: l}, []string{"result"}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{Name: "agentd_mirror_commits_mirrored_total",
			Help: "Commits written to the registry.", ConstLabels: l}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agentd_mirror_commits_refused_total",
			Help:        "Commits refused, by reason (unsigned, unknown-key, not-allowed, not-ssh, bad-signature, not-fast-forward, render, mass-delete).",
			ConstLabels: l}, []string{"reason"}),
		stopped: prometheus.NewGauge(prometheus.GaugeOpts{Name: "agentd_mirror_stopped",
			Help: "1 while the mirror is stopped before a refused commit (until a commit is mirrored again), else 0.", ConstLabels: l}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "agentd_mirror_leader",
			Help: "1 while this process is the elected mirror, 0 while it stands by.", ConstLabels: l}),
	}
	m.reg.MustRegister(m.lastFetch, m.fetchOK, m.fetches, m.commits, m.refusals, m.stopped, m.leader)
	return m
}

func (m *mirrorMetrics) fetched(at time.Time, ok bool) {
	if m == nil {
		return
	}
	m.lastFetch.Set(float64(at.UnixNano()) / 1e9)
	if ok {
		m.fetchOK.Set(1)
		m.fetches.WithLabelValues("ok").Inc()
	} else {
		m.fetchOK.Set(0)
		m.fetches.WithLabelValues("error").Inc()
	}
}

func (m *mirrorMetrics) mirrored() {
	if m != nil {
		m.commits.Inc()
		m.stopped.Set(0)
	}
}

func (m *mirrorMetrics) refused(reason string) {
	if m != nil {
		m.refusals.WithLabelValues(reason).Inc()
	}
}

// caughtUp says the mirror holds the branch's tip: not stopped.
func (m *mirrorMetrics) caughtUp() {
	if m != nil {
		m.stopped.Set(0)
	}
}

// stoppedAt says the mirror stands before a refused commit: set at each
// round that meets it (a restarted mirror too), cleared by the next
// commit mirrored.
func (m *mirrorMetrics) stoppedAt() {
	if m != nil {
		m.stopped.Set(1)
	}
}

func (m *mirrorMetrics) setLeader(on bool) {
	if m == nil {
		return
	}
	if on {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
}
