package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/agentd/agentd/internal/httpserve"
	"github.com/agentd/agentd/mirror"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/sshsig"
)

// mirrorOptions are the flags of `agentd mirror`.
type mirrorOptions struct {
	ef                etcdFlags
	repo, branch      string
	allowedSigners    string
	name              string
	cacheDir          string
	poll              time.Duration
	verify            string
	start             string
	threshold         percentValue
	webhookListen     string
	webhookSecretFile string
	metricsAddr       string
	notifyURL         string
	logLevel          string
	leaseTTL          time.Duration
	auth              mirrorAuthFlags // --ssh-key, --https-token-file, … (mirror_auth.go)

	// id is this candidate's name in the election (default host:pid;
	// tests running two in one process set their own).
	id string
	// logOut overrides where logs go (tests: t.Output()).
	logOut io.Writer
	// onElected, when set, is called each time this process is elected (tests).
	onElected func()
}

// percentValue is --mass-delete-threshold: "20%" or "20", 0 to 100,
// kept as a fraction.
type percentValue float64

func (p *percentValue) String() string {
	return strconv.FormatFloat(float64(*p)*100, 'f', -1, 64) + "%"
}
func (p *percentValue) Type() string { return "percent" }
func (p *percentValue) Set(s string) error {
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "%"), 64)
	if err != nil || v < 0 || v > 100 {
		return fmt.Errorf("want a share of the mirrored keys from 0%% to 100%%, got %q", s)
	}
	*p = percentValue(v / 100)
	return nil
}

// defaultMirrorCacheDir is --cache-dir's default: the service's state
// directory ($STATE_DIRECTORY, agentd-mirror.service's StateDirectory=),
// /var/lib/agentd-mirror for root, else $XDG_STATE_HOME/agentd-mirror.
func defaultMirrorCacheDir() string {
	if v, _, _ := strings.Cut(os.Getenv("STATE_DIRECTORY"), ":"); filepath.IsAbs(v) {
		return v
	}
	if os.Geteuid() == 0 {
		return "/var/lib/agentd-mirror"
	}
	if v := os.Getenv("XDG_STATE_HOME"); v != "" {
		return filepath.Join(v, "agentd-mirror")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "state", "agentd-mirror")
}

// parseSHA is a full commit SHA (40 hex digits): a mirror names commits
// whole, so that no abbreviation can become ambiguous later.
func parseSHA(flag, s string) (plumbing.Hash, error) {
	if b, err := hex.DecodeString(s); err != nil || len(b) != 20 {
		return plumbing.ZeroHash, withCode(exitUsage, fmt.Errorf("%s %q: want a full commit SHA (40 hex digits: git rev-parse)", flag, s))
	}
	return plumbing.NewHash(s), nil
}

// check validates the flags (exit 2 when they are wrong) and makes the
// mirror's settings; it reads the allowed signers and the webhook secret.
func (o *mirrorOptions) check() (mirrorConfig, []byte, error) {
	usage := func(format string, args ...any) (mirrorConfig, []byte, error) {
		return mirrorConfig{}, nil, withCode(exitUsage, fmt.Errorf(format, args...))
	}
	if o.repo == "" {
		return usage("mirror: --repo URL is required (https://…, ssh://… or git@host:path)")
	}
	if o.allowedSigners == "" {
		return usage("mirror: --allowed-signers FILE is required: only commits its keys signed are mirrored")
	}
	if err := registry.ValidateName("mirror", o.name); err != nil {
		return usage("mirror: --name: %w", err)
	}
	if o.branch == "" {
		return usage("mirror: --branch is empty")
	}
	if ref := plumbing.NewBranchReferenceName(o.branch); ref.Validate() != nil {
		return usage("mirror: --branch %q: not a branch name", o.branch)
	}
	if o.poll < time.Second {
		return usage("mirror: --poll %s: want at least 1s", o.poll)
	}
	cfg := mirrorConfig{name: o.name, url: o.repo, branch: o.branch, threshold: float64(o.threshold)}
	switch o.verify {
	case "all":
		if o.start != "" {
			return usage("mirror: --start goes with --verify=tip; --verify=all checks every commit from the first")
		}
	case "tip":
		if o.start == "" {
			return usage("mirror: --verify=tip needs --start SHA: a signed commit to vouch for the history before it")
		}
		h, err := parseSHA("--start", o.start)
		if err != nil {
			return mirrorConfig{}, nil, err
		}
		cfg.verifyTip, cfg.start = true, h
	default:
		return usage("mirror: --verify %q: want all or tip", o.verify)
	}
	if (o.webhookListen == "") != (o.webhookSecretFile == "") {
		return usage("mirror: --webhook-listen and --webhook-secret-file go together: a webhook without a secret would let anybody trigger fetches")
	}
	if err := checkNotifyURL(o.notifyURL); err != nil {
		return mirrorConfig{}, nil, withCode(exitUsage, err)
	}
	dir := o.cacheDir
	if dir == "" {
		dir = defaultMirrorCacheDir()
	}
	if !filepath.IsAbs(dir) {
		return usage("mirror: --cache-dir %q: want an absolute path", dir)
	}
	cfg.dir = filepath.Join(dir, o.name)
	as, err := sshsig.LoadAllowedSigners(o.allowedSigners)
	if err != nil {
		return usage("mirror: --allowed-signers: %w", err)
	}
	cfg.signers = as
	home, _ := os.UserHomeDir()
	if cfg.opts, err = o.auth.options(o.repo, home); err != nil {
		return mirrorConfig{}, nil, err
	}
	var secret []byte
	if o.webhookSecretFile != "" {
		if secret, err = readWebhookSecret(o.webhookSecretFile); err != nil {
			return mirrorConfig{}, nil, withCode(exitUsage, err)
		}
	}
	return cfg, secret, nil
}

func newMirrorCmd() *cobra.Command {
	o := &mirrorOptions{threshold: percentValue(mirror.DefaultDeleteThreshold)}
	cmd := &cobra.Command{
		Use:   "mirror --repo URL --allowed-signers FILE [--branch main] [--webhook-listen ADDR --webhook-secret-file F]",
		Short: "Mirror a git repository's branch into the registry (signed commits only)",
		Long: `Run a mirror: git as the source of truth for the registry. The branch's tree maps
1:1 to unit keys: hosts/<host>/<unit> (and <unit>.d/<name>.conf drop-ins,
<unit>.files/<path> config files) and groups/<group>/… as "agentd unit put"
would store them; other top-level files (README.md, .github/) are ignored.

Several mirrors of one --name may run (on different machines): one is elected
in etcd (its lease expires with it) and writes; the others stand by and take
over. The leader fetches (go-git: no git binary needed, except for file://
URLs) every --poll (jittered), at once on an authenticated push webhook
(--webhook-listen; GitHub's X-Hub-Signature-256 or GitLab's X-Gitlab-Token,
keyed with --webhook-secret-file), and on "agentd mirror sync".

Every new commit must be SSH-signed (git config gpg.format ssh) by a key of
--allowed-signers (ssh-keygen's allowed_signers format; namespaces="git" if
given). An unsigned or badly signed commit stops the mirror at the commit
before it: nothing of it or after it is written, and "agentd mirror status"
names it, its author and why. --verify=tip --start SHA checks only the tip (and
the trusted --start commit) for a history not everyone signed. The branch may
only move forward: a force push is refused until "agentd mirror reset --to SHA".

Each good commit is written in one registry transaction: the keys it changes
and deletes against the keys mirrored so far. A commit that deletes more than
--mass-delete-threshold of them is held until "agentd mirror sync
--allow-mass-delete"; one that deletes all of them is always refused. A fetch
that fails, or a registry that does not answer, changes nothing.

A group with groups/<group>/rollout.toml (canary, waves, max_unavailable,
soak, pause_after_canary: the options of "unit put --group") gets each commit's
change to it as a rollout over its hosts, as "unit put --group G --waves …"
stages one; "agentd mirror status" shows the rollouts the last commit started.
--notify-url POSTs each commit's verdict as JSON (applied right after the
write of a commit without rollouts; else done, failed, aborted or superseded
once they end), retried; README.md ("Git mirror") documents its shape.

A target (host or group) the mirror writes belongs to it: "agentd unit put"
and "unit rm" to it are refused (exit 2) unless --force.

Under systemd: contrib/systemd/agentd-mirror.service (Type=notify).`,
		Example: `  agentd mirror --repo https://git.example.com/ops/units.git --allowed-signers /etc/agentd/allowed_signers \
    --etcd-endpoints https://etcd1:2379 --etcd-ca ca.pem
  agentd mirror --repo git@github.com:ops/units.git --allowed-signers signers \
    --webhook-listen :9180 --webhook-secret-file /etc/agentd/webhook-secret
  agentd mirror --repo … --verify=tip --start 0123456789abcdef0123456789abcdef01234567`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runMirror(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	o.ef.bind(fs, "etcd endpoints (default "+defaultEndpoint+", the local agent's embedded etcd)")
	fs.StringVar(&o.repo, "repo", "", "URL of the repository to mirror (https://, ssh://, git@host:path, file://)")
	fs.StringVar(&o.branch, "branch", "main", "branch to mirror")
	fs.StringVar(&o.allowedSigners, "allowed-signers", "", "allowed_signers file (ssh-keygen format): only commits its keys signed are mirrored")
	fs.StringVar(&o.name, "name", "default", "the mirror's name in the registry (one per repository and branch)")
	fs.StringVar(&o.cacheDir, "cache-dir", "", "where the bare clone is kept, under <dir>/<name> (default /var/lib/agentd-mirror, or $XDG_STATE_HOME/agentd-mirror when not root)")
	fs.DurationVar(&o.poll, "poll", 60*time.Second, "how often to fetch (±10% jitter)")
	fs.StringVar(&o.verify, "verify", "all", "all: every new commit must be signed; tip: only the tip (and --start)")
	fs.StringVar(&o.start, "start", "", "with --verify=tip: a signed commit (full SHA) trusted as the start of the history")
	fs.Var(&o.threshold, "mass-delete-threshold", "hold a commit that deletes more than this share of the mirrored keys until agentd mirror sync --allow-mass-delete")
	fs.StringVar(&o.webhookListen, "webhook-listen", "", "serve push webhooks at http://ADDR/ (any path), e.g. :9180 (default: off)")
	fs.StringVar(&o.webhookSecretFile, "webhook-secret-file", "", "file holding the webhook's shared secret (GitHub: the HMAC key; GitLab: the token)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics (default: off)")
	fs.StringVar(&o.notifyURL, "notify-url", "", "POST each mirrored commit's verdict (JSON: applied, or done, failed, aborted, superseded once its rollouts end) to `URL`, retried")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&o.leaseTTL, "lease-ttl", 15*time.Second, "TTL of the leader's lease: a standby takes over this long after the leader died")
	o.auth.bind(fs)
	cmd.AddCommand(newMirrorSyncCmd(), newMirrorStatusCmd(), newMirrorResetCmd())
	return cmd
}

// runMirror is `agentd mirror`: it listens (webhook, metrics), connects to
// the registry, and campaigns; while elected it runs the mirror's rounds
// (mirrorLoop.lead), and when it loses the election it stops writing and
// campaigns again. ctx's end (SIGTERM) resigns and returns nil.
func runMirror(ctx context.Context, o *mirrorOptions) error {
	cfg, secret, err := o.check()
	if err != nil {
		return err
	}
	log, err := newLogger(o.logLevel, o.logOut)
	if err != nil {
		return err
	}
	log = log.With("mirror", o.name)
	id := o.id
	if id == "" {
		h, _ := os.Hostname()
		id = fmt.Sprintf("%s:%d", h, os.Getpid())
	}
	met := newMirrorMetrics(o.name)
	pokes := make(chan struct{}, 1)
	poke := func() {
		select {
		case pokes <- struct{}{}:
		default:
		}
	}
	var servers []func(context.Context) error
	for _, l := range []struct {
		addr, what string
		h          http.Handler
	}{
		{o.webhookListen, "--webhook-listen", webhookHandler(secret, poke, log.With("component", "webhook"))},
		{o.metricsAddr, "--metrics-addr", metricsMux(met)},
	} {
		if l.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			return fmt.Errorf("%s: %w", l.what, err)
		}
		defer ln.Close()
		srv := &http.Server{Handler: l.h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second}
		servers = append(servers, func(ctx context.Context) error { return httpserve.Serve(ctx, srv, ln) })
	}
	reg, err := dialMirrorRegistry(ctx, o, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer reg.Close()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for _, serve := range servers {
		wg.Go(func() {
			if err := serve(ctx); err != nil {
				cancel(err)
			}
		})
	}
	loop := &mirrorLoop{cfg: cfg, store: withMirrorFaults(reg, cfg.dir, log), log: log, met: met, now: time.Now,
		notify: newMirrorNotifier(ctx, o.notifyURL, reg, log)}
	notify("READY=1")
	log.Info("mirror running", "repo", cfg.url, "branch", cfg.branch, "dir", cfg.dir, "id", id,
		"verify", o.verify, "poll", o.poll, "webhook", o.webhookListen, "metrics", o.metricsAddr, "notify", o.notifyURL)
	campaign(ctx, reg, loop, o, id, pokes)
	loop.notify.wait()
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("mirror stopped")
	return nil
}

// campaign campaigns for the mirror until ctx is done; each time it is
// elected it leads (rounds) until its leadership ends.
func campaign(ctx context.Context, reg *registry.Client, loop *mirrorLoop, o *mirrorOptions, id string, pokes <-chan struct{}) {
	log, delay := loop.log, time.Second
	for ctx.Err() == nil {
		notify("STATUS=standing by: campaigning to mirror " + o.repo)
		leader, err := reg.CampaignMirror(ctx, o.name, id, o.leaseTTL)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("campaign failed; retrying", "err", err, "retry_in", delay)
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, 30*time.Second)
			continue
		}
		delay = time.Second
		log.Info("elected: mirroring", "id", id)
		notify("STATUS=leader: mirroring " + o.repo + " (branch " + o.branch + ")")
		loop.met.setLeader(true)
		if o.onElected != nil {
			o.onElected()
		}
		lctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() {
			select {
			case <-leader.Done():
				stop()
			case <-lctx.Done():
			}
		})
		err = loop.lead(lctx, leader, o.poll, pokes, reg.WatchMirrorSync(lctx, o.name))
		stop()
		wg.Wait()
		loop.met.setLeader(false)
		if ctx.Err() != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if err := leader.Resign(rctx); err != nil {
				log.Warn("resign (a standby takes over when the lease expires)", "err", err)
			}
			cancel()
			return
		}
		log.Warn("leadership lost: writing stopped; campaigning again", "err", err)
	}
}

// dialMirrorRegistry connects to the registry, retrying while it is
// unreachable: a mirror that cannot reach it has nothing to do yet.
func dialMirrorRegistry(ctx context.Context, o *mirrorOptions, log *slog.Logger) (*registry.Client, error) {
	delay := 250 * time.Millisecond
	for {
		reg, err := o.ef.dial(ctx)
		var ce *codeError
		if err == nil || errors.As(err, &ce) {
			return reg, err
		}
		log.Warn("registry unreachable; retrying", "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

// notify sends state to systemd (Type=notify); nothing without
// $NOTIFY_SOCKET.
func notify(state string) { _, _ = daemon.SdNotify(false, state) }

func metricsMux(m *mirrorMetrics) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	return mux
}

func newMirrorSyncCmd() *cobra.Command {
	var (
		ef        etcdFlags
		name      string
		allowMass bool
	)
	cmd := &cobra.Command{
		Use:   "sync [--name NAME] [--allow-mass-delete]",
		Short: "Ask the elected mirror to fetch now",
		Long: `Ask the elected mirror to fetch and mirror now, as a push webhook does. With
--allow-mass-delete, the commits of that round may delete more than the
mirror's --mass-delete-threshold of the mirrored keys: a commit held for that
is applied (one that deletes every key is still refused).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := registry.ValidateName("mirror", name); err != nil {
				return withCode(exitUsage, fmt.Errorf("mirror sync: --name: %w", err))
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				r := registry.SyncRequest{AllowMassDelete: allowMass, By: storedBy(), At: time.Now().UTC()}
				if err := reg.RequestMirrorSync(ctx, name, r); err != nil {
					return fmt.Errorf("mirror sync: %w", err)
				}
				extra := ""
				if allowMass {
					extra = ", mass deletes allowed for that round"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "sync of mirror %s requested%s: see agentd mirror status\n", name, extra)
				return nil
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	cmd.Flags().StringVar(&name, "name", "default", "the mirror's name")
	cmd.Flags().BoolVar(&allowMass, "allow-mass-delete", false, "let this round's commits delete more than the threshold")
	return cmd
}

// mirrorStatus is `mirror status --json`.
type mirrorStatus struct {
	State registry.MirrorState `json:"state"`
	// Fetch is the last fetch of a mirror run on this machine with this
	// --cache-dir (null elsewhere).
	Fetch *fetchStatus `json:"fetch"`
	// Rollouts are the rollouts the last mirrored commit started, as
	// `agentd rollout status` reads them.
	Rollouts []mirrorRolloutStatus `json:"rollouts"`
	// Hold is a commit written in chunks and not finished (its hosts
	// wait for it); null when none.
	Hold *mirrorHold `json:"hold"`
}

// mirrorHold is a commit the mirror writes over several transactions.
type mirrorHold struct {
	Commit  string   `json:"commit"`
	Targets []string `json:"targets"`
}

// mirrorRolloutStatus is a rollout a mirrored commit started.
type mirrorRolloutStatus struct {
	ID     string `json:"id"`
	Group  string `json:"group"`
	Phase  string `json:"phase"`
	Wave   int    `json:"wave,omitempty"` // counted from 1
	Waves  int    `json:"waves,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// mirrorRollouts reads the rollouts of st's commit.
func mirrorRollouts(ctx context.Context, reg *registry.Client, st registry.MirrorState) []mirrorRolloutStatus {
	out := []mirrorRolloutStatus{}
	for _, r := range st.Rollouts {
		rs := mirrorRolloutStatus{ID: r.ID, Group: r.Group}
		v, err := reg.Rollout(ctx, r.ID, false)
		switch {
		case errors.Is(err, registry.ErrNoRollout):
			rs.Phase, rs.Reason = phaseGone, "its record is gone (agentd rollout rm)"
		case err != nil:
			rs.Phase, rs.Reason = "unknown", err.Error()
		default:
			ph := v.Phase()
			rs.Phase, rs.Wave, rs.Waves, rs.Reason = string(ph.State), phaseWave(v, ph), len(v.Record.WaveEnds), ph.Reason
		}
		out = append(out, rs)
	}
	return out
}

func newMirrorStatusCmd() *cobra.Command {
	var (
		ef       etcdFlags
		name     string
		cacheDir string
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "status [--name NAME] [--json]",
		Short: "Show what the mirror mirrored last, and what it refused",
		Long: `Show a mirror's state in the registry: the commit last mirrored (its signer,
author and subject, the registry revision that wrote it, the rollouts it
started and their phase, as "agentd rollout status" shows it), and the commit it
refused, if any, with its author and why. On the machine the mirror runs on
(same --cache-dir), also when it last fetched and the result.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := registry.ValidateName("mirror", name); err != nil {
				return withCode(exitUsage, fmt.Errorf("mirror status: --name: %w", err))
			}
			if cacheDir == "" {
				cacheDir = defaultMirrorCacheDir()
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				st, ok, err := reg.MirrorState(ctx, name)
				if err != nil {
					return fmt.Errorf("mirror status: %w", err)
				}
				if !ok {
					return fmt.Errorf("mirror status: no mirror named %q in the registry (has agentd mirror --name %s run yet?)", name, name)
				}
				out := mirrorStatus{State: st, Rollouts: mirrorRollouts(ctx, reg, st)}
				if commit, targets, held, err := reg.MirrorHold(ctx, name); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: the mirror's write hold is not known: %v\n", err)
				} else if held {
					out.Hold = &mirrorHold{Commit: commit, Targets: targets}
				}
				if f, ok, err := readFetchStatus(filepath.Join(cacheDir, name, "fetch.json")); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: the last fetch is not known: %v\n", err)
				} else if ok {
					out.Fetch = &f
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), out)
				}
				printMirrorStatus(cmd.OutOrStdout(), out, time.Now())
				return nil
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	cmd.Flags().StringVar(&name, "name", "default", "the mirror's name")
	cmd.Flags().StringVar(&cacheDir, "cache-dir", "", "the mirror's --cache-dir, for its last fetch (default as for agentd mirror)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printMirrorStatus(w io.Writer, s mirrorStatus, now time.Time) {
	st := s.State
	fmt.Fprintf(w, "mirror:      %s: %s (branch %s)\n", st.Name, st.URL, st.Branch)
	switch f := s.Fetch; {
	case f == nil:
		fmt.Fprintln(w, "last fetch:  not known here (run this on the mirror's machine, or see its metrics)")
	case f.OK:
		fmt.Fprintf(w, "last fetch:  %s (%s ago): ok, tip %s\n", f.At.Local().Format(time.RFC3339), ago(now.Sub(f.At)), short(f.Tip))
	default:
		fmt.Fprintf(w, "last fetch:  %s (%s ago): FAILED: %s\n", f.At.Local().Format(time.RFC3339), ago(now.Sub(f.At)), f.Error)
	}
	if st.Commit == "" {
		fmt.Fprintln(w, "mirrored:    nothing yet")
	} else {
		fmt.Fprintf(w, "mirrored:    %s %q by %s, signed by %s, at %s (revision %d)\n",
			short(st.Commit), st.Subject, st.Author, orDash(st.Signer), st.At.Local().Format(time.RFC3339), st.Revision)
	}
	for i, r := range s.Rollouts {
		label := "             "
		if i == 0 {
			label = "rollouts:    "
		}
		wave := ""
		if r.Waves > 0 {
			wave = fmt.Sprintf(", wave %d of %d", r.Wave, r.Waves)
		}
		fmt.Fprintf(w, "%s%s (group %s): %s%s%s\n", label, r.ID, r.Group, r.Phase, wave, prefixed(r.Reason))
	}
	if len(s.Rollouts) > 0 {
		fmt.Fprintln(w, "             agentd rollout status ID --watch follows one")
	}
	if h := s.Hold; h != nil {
		fmt.Fprintf(w, "writing:     %s in several transactions to %s: their hosts wait until it is whole (a mirror stopped halfway: the next one finishes it)\n",
			short(h.Commit), strings.Join(h.Targets, ", "))
	}
	if r := st.Refused; r != nil {
		fmt.Fprintf(w, "refused:     %s by %s at %s: %s\n", short(r.Commit), r.Author, r.At.Local().Format(time.RFC3339), r.Reason)
		fmt.Fprintln(w, "             the mirror stops before it; nothing of it or after it is written")
	}
}

func newMirrorResetCmd() *cobra.Command {
	var (
		ef   etcdFlags
		name string
		to   string
	)
	cmd := &cobra.Command{
		Use:   "reset --to SHA [--name NAME]",
		Short: "Set the commit the mirror goes on from (after a force push)",
		Long: `Set the commit the mirror considers last mirrored, so that it goes on from
there: after the branch was force-pushed or reset, name a commit of the new
branch (usually where it forked from the old one). Nothing else changes now:
at its next round the mirror writes the commits after SHA, each diffed against
the keys mirrored so far. Asks the mirror to sync at once.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := registry.ValidateName("mirror", name); err != nil {
				return withCode(exitUsage, fmt.Errorf("mirror reset: --name: %w", err))
			}
			if to == "" {
				return withCode(exitUsage, errors.New("mirror reset: --to SHA is required"))
			}
			h, err := parseSHA("--to", to)
			if err != nil {
				return err
			}
			return withRegistry(cmd, &ef, func(ctx context.Context, reg *registry.Client) error {
				st, _, err := reg.MirrorState(ctx, name)
				if err != nil {
					return fmt.Errorf("mirror reset: %w", err)
				}
				if err := reg.ResetMirror(ctx, name, h.String(), storedBy()); err != nil {
					return fmt.Errorf("mirror reset: %w", err)
				}
				was := "nothing mirrored"
				if st.Commit != "" {
					was = short(st.Commit)
				}
				out := cmd.OutOrStdout()
				fmt.Fprintf(out, "mirror %s reset to %s (was %s)\n", name, h, was)
				if err := reg.RequestMirrorSync(ctx, name, registry.SyncRequest{By: storedBy(), At: time.Now().UTC()}); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: no sync requested (%v): the mirror goes on at its next poll\n", err)
				} else {
					fmt.Fprintln(out, "sync requested: the mirror goes on from there now")
				}
				return nil
			})
		},
	}
	ef.bind(cmd.Flags(), "etcd endpoints (default "+defaultEndpoint+")")
	cmd.Flags().StringVar(&name, "name", "default", "the mirror's name")
	cmd.Flags().StringVar(&to, "to", "", "the commit (full SHA) to go on from")
	return cmd
}
