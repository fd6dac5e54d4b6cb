package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/fleetlock"
	"github.com/agentd/agentd/logging"
	"github.com/agentd/agentd/metrics"
	"github.com/agentd/agentd/probe"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
	"github.com/agentd/agentd/secret"
	"github.com/agentd/agentd/sshsig"
	"github.com/agentd/agentd/systemd"
	"github.com/agentd/agentd/unitdir"
)

type runOptions struct {
	etcd            etcdFlags
	host            string
	groups          []string
	user            bool
	unitDir         string
	stateDir        string
	fileRoots       []string // --file-root: where config files (unit put --file) may go
	debugSocket     string
	embedClient     string
	embedPeer       string // ignored: the embedded etcd has no peer listener
	embedCert       string
	embedKey        string
	embedCA         string
	logLevel        string
	leaseTTL        time.Duration
	metricsAddr     string
	registryTimeout time.Duration
	fleetLockAddr   string
	fleetLockTTL    time.Duration

	// embedInsecureTCP is --embedded-insecure-tcp: an http:// --embedded-listen
	// (plaintext loopback TCP, beside the socket) asked for by name.
	embedInsecureTCP bool

	// identity is --identity: the host's SSH ed25519 key to decrypt
	// secrets with ("": <state-dir>/identity.age, made at first start);
	// recipient is its public side, published with the membership.
	identity, recipient string
	// labels is --label K=V (repeatable); given the labels parsed from it
	// (newAgentRun). labelsFile is --labels-file ("": none). labelsNow are
	// the labels published with the membership as they stand: given, the
	// labels file's and the host's facts (newAgentRun, openLocal), changed
	// while the agent runs by the labels file (watchLabelsFile).
	labels     []string
	given      map[string]string
	labelsFile string
	labelsNow  *currentLabels
	// credentialKey is --credential-key: what systemd-creds encrypts
	// credentials with (its --with-key).
	credentialKey string
	// allowedSigners is --allowed-signers: only changes its signers signed
	// are applied.
	allowedSigners string
	// wedgeFile is a test-only fault (hidden --test-wedge-file): while the
	// file exists the reconcile loop blocks (see wedgeSystemd).
	wedgeFile string
	// pauseAt is a test-only fault (hidden --test-pause-at): the point of a
	// pass where the loop blocks, for crash tests.
	pauseAt string

	// dialSystemd overrides the D-Bus connection (tests use a private manager).
	dialSystemd systemd.Dialer
	// ready, when set, receives the agent once it runs (tests).
	ready chan<- *reconcile.Agent
	// logOut overrides where logs go (tests: t.Output()).
	logOut io.Writer
	// ownProcess is set by `agentd run`: the process is the agent's alone,
	// so it may change process-wide runtime settings (one CPU when quiet).
	// An agent a test starts inside the test process leaves them alone.
	ownProcess bool
}

func newRunCmd() *cobra.Command {
	o := &runOptions{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent: keep this machine's units in step with the registry",
		Long: `Run the agent. It reads the unit files meant for this host (its own keys and
its groups' keys), writes changed ones atomically into the unit directory, runs
one daemon-reload per batch, starts or restarts the units in place, and
publishes each unit's status to the registry.

With no --etcd-endpoints it runs an embedded single-node etcd in the state
directory, listening on the unix socket ` + defaultEndpoint + ` (in the
runtime directory, mode 0700: only root can reach it; with --user,
$XDG_RUNTIME_DIR/agentd/etcd.sock), so one machine needs nothing else and the
client commands on it find it with no flags. It has no peer listener. To let
other machines in, --embedded-listen https://ADDR:PORT adds a TLS listener that
accepts only client certificates signed by --embedded-ca. A plaintext TCP
listener (--embedded-listen http://127.0.0.1:PORT) lets every local user have
units run as root: it is refused unless --embedded-insecure-tcp is given too,
and then the agent warns at every start and "agentd doctor" reports it.

Config files of units' sets (agentd unit put --file DEST=SRC[:MODE[:OWNER]])
are written only under the directories given with --file-root (repeatable),
with their mode and owner, atomically and together with the unit's other
files: a DEST under none of them, a symlink or directory in its place, or an
owner this host does not have refuses the unit's whole change, and the
running version is kept. Without --file-root every config file is refused.

The agent publishes labels with its membership: those given with --label
KEY=VALUE (repeatable; AGENTD_LABEL=K=V,K=V) and in the labels file
(--labels-file, default /etc/agentd/labels: one KEY=VALUE a line, # comments;
no file is no labels from it), and the facts it reads off the host: arch,
hostname, os.id and os.version_id (ID= and VERSION_ID= of /etc/os-release;
absent without one) and systemd.version. A given label with a fact's key is
refused, and so is one that is not a valid Kubernetes label, or a key given
both with --label and in the file. "agentd hosts --selector" picks hosts by
them, "agentd unit put --selector" targets them.

The labels file is followed while the agent runs: edit it (or rename a new one
into place) and the agent republishes its labels, joins the selectors they
now match and leaves the others, taking and dropping their units in one pass,
without a restart. A file that does not parse (the log names the line), gives
a --label's key, or that someone other than root (or the agent's user) owns or
that group or others may write (the file or its directory) is refused whole:
the agent keeps the labels it had and "agentd status" says why. At start such
a file stops the agent (exit 2).

Under systemd (contrib/systemd/agentd.service, Type=notify) it reports READY=1
after its first successful reconcile pass, or after --registry-timeout with the
registry unreachable, running on the last registry snapshot it saved in the
state directory (with none saved it touches nothing until the registry
answers). "systemctl status agentd" shows the registry revision and how many
units are converged, pending and failed. With WatchdogSec= set, the
reconcile loop itself keeps the watchdog fed: a wedged loop gets the agent
restarted. Logs go to the journal with structured fields (AGENTD_*, and
OBJECT_SYSTEMD_UNIT, so "journalctl -u UNIT" shows what agentd did to UNIT).

With --fleetlock-listen it also serves the FleetLock protocol (Zincati's
fleet_lock strategy, and other reboot managers that speak it): POST
/v1/pre-reboot takes, for the client's id, a slot of every MaxUnavailable=
queue of the client's group — an agentd group, one of --group — and of the
group's reboot pool (limit: the smallest MaxUnavailable= of the group's units,
1 when none sets one), so a reboot and a restart by agentd draw from one
budget; POST /v1/steady-state gives them back. A client that never says
steady-state is freed after --fleetlock-ttl. The state is in etcd: every agent
of the group answers alike. There is no authentication: listen on loopback
(Zincati on the same machine) or keep the port behind a firewall.`,
		Example: `  agentd run --host h1                       # system instance, embedded etcd
  agentd run --etcd-endpoints https://etcd1:2379 --etcd-ca ca.pem --group web
  agentd run --embedded-listen https://10.0.0.5:2379 --embedded-cert etcd.pem \
    --embedded-key etcd-key.pem --embedded-ca clients-ca.pem   # remote clients need a client certificate
  agentd run --user                          # the user's systemd instance
  agentd run --file-root /etc/myapp          # config files (unit put --file) may go under /etc/myapp
  agentd run --label rack=r12 --label env=prod   # agentd hosts --selector 'env=prod,rack in (r12,r13)'
  AGENTD_METRICS_ADDR=127.0.0.1:9100 agentd run   # every flag has an AGENTD_* variable
  agentd run --group web --fleetlock-listen 127.0.0.1:9190   # Zincati: base_url = "http://127.0.0.1:9190/", group = "web"`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.ownProcess = true
			return runAgent(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	o.bindLocal(fs) // before o.etcd.bind: --user is bindLocal's
	o.etcd.bind(fs, "etcd endpoints (comma-separated); empty: run an embedded etcd in the state directory")
	fs.StringVar(&o.embedClient, "embedded-listen", "",
		"without --etcd-endpoints: where the embedded etcd listens besides its unix socket (default: only the socket, "+defaultEndpoint+
			", or $XDG_RUNTIME_DIR/agentd/etcd.sock with --user). https://ADDR:PORT adds a TLS listener with client-certificate auth "+
			"(needs --embedded-cert, --embedded-key, --embedded-ca); http://127.0.0.1:PORT, plaintext, only with --embedded-insecure-tcp")
	fs.BoolVar(&o.embedInsecureTCP, "embedded-insecure-tcp", false,
		"allow a plaintext http:// --embedded-listen on loopback: every local user can then write units that run as root (the agent warns at every start; doctor reports it)")
	fs.StringVar(&o.embedCert, "embedded-cert", "", "certificate of the embedded etcd's https:// --embedded-listen")
	fs.StringVar(&o.embedKey, "embedded-key", "", "key of --embedded-cert")
	fs.StringVar(&o.embedCA, "embedded-ca", "", "CA of the client certificates the embedded etcd's https:// listener accepts (client-certificate auth)")
	fs.StringVar(&o.embedPeer, "embedded-peer-listen", "", "ignored: the embedded etcd has no peer listener")
	_ = fs.MarkDeprecated("embedded-peer-listen", "the embedded etcd has no peer listener any more; the value is ignored")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&o.leaseTTL, "lease-ttl", 15*time.Second, "TTL of the lease that binds this agent's membership and statuses")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9100 (default: off)")
	fs.DurationVar(&o.registryTimeout, "registry-timeout", 30*time.Second,
		"with the registry unreachable this long after start, run on the last-known-good snapshot saved in the state directory and report ready (0: wait for the registry forever)")
	fs.StringVar(&o.fleetLockAddr, "fleetlock-listen", "",
		"serve the FleetLock protocol (Zincati's fleet_lock strategy) at http://ADDR/, e.g. 127.0.0.1:9190 (default: off). No authentication: bind it to loopback or protect it")
	fs.DurationVar(&o.fleetLockTTL, "fleetlock-ttl", defaultFleetLockTTL,
		"a FleetLock client's reboot slots are freed this long after its last pre-reboot if it never calls steady-state (whole seconds; longer than a reboot takes)")
	fs.StringVar(&o.identity, "identity", "",
		"decrypt secrets (unit put --secret) with this SSH ed25519 host key, e.g. /etc/ssh/ssh_host_ed25519_key (default: an age key made at first start in the state directory, identity.age)")
	fs.StringSliceVar(&o.labels, "label", nil,
		"a label of this host, KEY=VALUE, e.g. rack=r12 (repeatable; Kubernetes' label syntax): published with its membership, picked by agentd hosts --selector. "+
			"The agent adds the host's facts: "+strings.Join(factKeys, ", ")+" (a given label cannot have a fact's key)")
	fs.Lookup("label").Value = labelFlag{fs.Lookup("label").Value} // checked as it is set
	fs.StringVar(&o.credentialKey, "credential-key", "auto",
		"what secrets put as systemd credentials (unit put --credential) are encrypted with: auto (TPM2 where present, else the host key on persistent storage), host, tpm2 or host+tpm2 (systemd-creds --with-key)")
	fs.StringVar(&o.allowedSigners, "allowed-signers", "",
		"apply only changes signed (agentd unit put --sign-key) by a key of this file (ssh-keygen's allowed_signers format: principals [namespaces=\"agentd\"] key); "+
			"anything else is refused and the running version kept (default: no signature needed)")
	fs.StringVar(&o.wedgeFile, "test-wedge-file", "", "test only: while this file exists the reconcile loop blocks")
	_ = fs.MarkHidden("test-wedge-file")
	fs.StringVar(&o.pauseAt, "test-pause-at", "", "test only: at this point of a pass (claimed, files-written, reloaded, jobs-started, job-done) write <state-dir>/paused-at-<point> and block, so a test can kill the agent there")
	_ = fs.MarkHidden("test-pause-at")
	return cmd
}

// bindLocal binds the flags that say which machine and directories the
// agent manages (shared by run and doctor).
func (o *runOptions) bindLocal(fs *pflag.FlagSet) {
	fs.StringVar(&o.host, "host", "", "this agent's host name in the registry (default: the short hostname)")
	fs.StringSliceVar(&o.groups, "group", []string{"all"}, "group this host belongs to (repeatable)")
	fs.BoolVar(&o.user, "user", false, "manage the user's systemd instance instead of the system one")
	fs.StringVar(&o.unitDir, "unit-dir", "", "unit directory (default /etc/systemd/system, or $XDG_CONFIG_HOME/systemd/user with --user)")
	fs.StringVar(&o.stateDir, "state-dir", "", "state directory (default /var/lib/agentd, or $XDG_STATE_HOME/agentd with --user)")
	fs.StringSliceVar(&o.fileRoots, "file-root", nil,
		"directory the config files of units' sets (agentd unit put --file) may be written under, e.g. /etc/myapp (repeatable; "+
			"absolute, existing, apart from the unit and state directories). Without one every config file is refused")
	fs.StringVar(&o.debugSocket, "debug-socket", "", "unix socket of the local debug API (default /run/agentd/agentd.sock, or $XDG_RUNTIME_DIR/agentd.sock with --user)")
	fs.StringVar(&o.labelsFile, "labels-file", defaultLabelsFile,
		"labels of this host, one KEY=VALUE a line (# comments), merged with --label and followed while the agent runs: a change joins or leaves selectors without a restart. "+
			"Absent: no labels from it; \"\": none. Must be root's (or the agent's user's), not writable by group or others")
}

// defaults fills the paths that depend on --user.
func (o *runOptions) defaults() error {
	switch o.credentialKey {
	case "", "auto", "host", "tpm2", "host+tpm2":
	default:
		return withCode(exitUsage, fmt.Errorf("--credential-key %q: want auto, host, tpm2 or host+tpm2", o.credentialKey))
	}
	if o.host == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--host not given and hostname unknown: %w", err)
		}
		o.host, _, _ = strings.Cut(h, ".")
	}
	if err := registry.ValidateName("host", o.host); err != nil {
		return withCode(exitUsage, err)
	}
	for _, g := range o.groups {
		if err := registry.ValidateName("group", g); err != nil {
			return withCode(exitUsage, err)
		}
	}
	home, _ := os.UserHomeDir()
	xdg := func(env, fallback string) string {
		if v := os.Getenv(env); v != "" {
			return v
		}
		return filepath.Join(home, fallback)
	}
	if o.user {
		if o.unitDir == "" {
			o.unitDir = filepath.Join(xdg("XDG_CONFIG_HOME", ".config"), "systemd", "user")
		}
		if o.stateDir == "" {
			o.stateDir = filepath.Join(xdg("XDG_STATE_HOME", ".local/state"), "agentd")
		}
		if o.debugSocket == "" {
			rt := os.Getenv("XDG_RUNTIME_DIR")
			if rt == "" {
				rt = o.stateDir
			}
			o.debugSocket = filepath.Join(rt, "agentd.sock")
		}
	} else {
		if o.unitDir == "" {
			o.unitDir = "/etc/systemd/system"
		}
		if o.stateDir == "" {
			o.stateDir = "/var/lib/agentd"
		}
		if o.debugSocket == "" {
			o.debugSocket = "/run/agentd/agentd.sock"
		}
	}
	o.etcd.userMode = o.user
	if o.dialSystemd == nil {
		o.dialSystemd = systemd.SystemDialer()
		if o.user {
			o.dialSystemd = systemd.UserDialer()
		}
	}
	return nil
}

// embedConfig turns the --embedded-* flags into the embedded etcd's
// configuration: its unix socket in the runtime directory (created 0700, or
// tightened to 0700), plus an https:// listener with client-certificate
// auth, or, with --embedded-insecure-tcp only, a plaintext loopback TCP
// listener. Anything else is refused.
func (o *runOptions) embedConfig() (registry.EmbedConfig, error) {
	cfg := registry.EmbedConfig{
		Dir:      filepath.Join(o.stateDir, "etcd"),
		CertFile: o.embedCert, KeyFile: o.embedKey, ClientCAFile: o.embedCA,
	}
	listen := o.embedClient
	tlsFlags := o.embedCert != "" || o.embedKey != "" || o.embedCA != ""
	if o.embedInsecureTCP && !strings.HasPrefix(listen, "http://") {
		return cfg, withCode(exitUsage, fmt.Errorf("--embedded-insecure-tcp goes with an http://127.0.0.1:PORT --embedded-listen, not %q; "+
			"drop it (the default unix socket and an https:// listener need no such flag)", listen))
	}
	switch {
	case listen == "" || strings.HasPrefix(listen, "https://") || strings.HasPrefix(listen, "unix://"):
	case strings.HasPrefix(listen, "http://"):
		u, err := url.Parse(listen)
		if err != nil || u.Port() == "" || (u.Path != "" && u.Path != "/") {
			return cfg, withCode(exitUsage, fmt.Errorf("--embedded-listen %q: want https://ADDR:PORT", listen))
		}
		if !registry.IsLoopbackHost(u.Host) {
			return cfg, withCode(exitUsage, fmt.Errorf("--embedded-listen %s: plaintext etcd on a non-loopback address would let anyone who reaches it have units run as root here; "+
				"use https:// with --embedded-cert, --embedded-key and --embedded-ca (client-certificate auth), or leave it unset for the private unix socket", listen))
		}
		if !o.embedInsecureTCP {
			return cfg, withCode(exitUsage, fmt.Errorf("--embedded-listen %s: plaintext TCP lets every local user write units that run as root here; "+
				"use https:// with --embedded-cert, --embedded-key and --embedded-ca (client-certificate auth), or leave it unset for the private unix socket "+
				"(to open this door anyway, add --embedded-insecure-tcp)", listen))
		}
		if tlsFlags {
			return cfg, withCode(exitUsage, fmt.Errorf("--embedded-cert, --embedded-key and --embedded-ca need an https:// --embedded-listen, not %s", listen))
		}
		cfg.InsecureURL = listen
	default:
		return cfg, withCode(exitUsage, fmt.Errorf("--embedded-listen %q: want https://ADDR:PORT", listen))
	}
	if strings.HasPrefix(listen, "https://") {
		if o.embedCert == "" || o.embedKey == "" || o.embedCA == "" {
			return cfg, withCode(exitUsage, fmt.Errorf("--embedded-listen %s needs --embedded-cert, --embedded-key and --embedded-ca: "+
				"without client-certificate auth anyone who reaches it could have units run as root here", listen))
		}
		cfg.TLSURL = listen
	} else if tlsFlags {
		return cfg, withCode(exitUsage, errors.New("--embedded-cert, --embedded-key and --embedded-ca need an https:// --embedded-listen"))
	}
	if strings.HasPrefix(listen, "unix://") {
		cfg.ClientURL = listen
		return cfg, nil
	}
	dir := runtimeDir(o.user, o.etcd.runtimeDir)
	if err := unitdir.MkdirPrivate(dir); err != nil {
		return cfg, fmt.Errorf("runtime directory of the embedded etcd's socket: %w", err)
	}
	cfg.ClientURL = "unix://" + filepath.Join(dir, etcdSocket)
	return cfg, nil
}

func newLogger(level string, out io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("--log-level: %w", err))
	}
	return logging.New(l, out), nil
}

// runAgent is `agentd run`: it wires the agent (agentRun holds the parts) and
// runs it until ctx is done or a part fails. Every part it opens is closed
// before it returns, in the reverse order.
func runAgent(ctx context.Context, o *runOptions) error {
	r, err := newAgentRun(o)
	if err != nil {
		return err
	}
	if r.metricsLn != nil {
		defer r.metricsLn.Close()
	}
	if r.fleetLockLn != nil {
		defer r.fleetLockLn.Close()
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	emb, err := r.startEtcd(ctx)
	if err != nil {
		return err
	}
	if emb != nil {
		defer emb.Close()
	}
	defer r.closeLocal()
	if err := r.openLocal(ctx); err != nil {
		return err
	}
	quiet := newQuietSpell(o.ownProcess && emb == nil)
	defer quiet.Stop()
	r.newAgent(quiet)
	return r.run(ctx, cancel)
}

// agentRun is what runAgent wires together for one `agentd run`, in the
// order it is built: the flags, logger, notify service and metrics
// (newAgentRun); the etcd it joins (startEtcd); the machine's systemd, unit
// directory, manifest and saved snapshot (openLocal); the agent (newAgent).
type agentRun struct {
	o           *runOptions
	log         *slog.Logger
	svc         *service
	met         *metrics.Metrics
	metricsLn   net.Listener // nil without --metrics-addr
	fleetLockLn net.Listener // nil without --fleetlock-listen
	endpoints   []string     // of the etcd the agent joins

	sd       *systemd.Manager
	units    *unitdir.Dir   // the unit directory
	files    *unitdir.Roots // the unit directory and the --file-root directories
	manifest *unitdir.Manifest
	lkg      *lastKnownGood

	// allowed is --allowed-signers (nil without it); trust and marks the
	// signature check it makes and the signed versions accepted (openTrust).
	allowed *sshsig.AllowedSigners
	trust   *reconcile.Trust
	marks   *unitdir.SignedMarks
	// identity decrypts the secrets put to this host (--identity);
	// creds makes the systemd credentials of those put as one.
	identity *secret.Identity
	creds    *systemdCreds

	reporter *sessionReporter
	rollouts *rollout.Participant // this host's part in its groups' rollouts
	agent    *reconcile.Agent
}

// newAgentRun checks the flags and fills their defaults, then makes the
// logger, the notify service and the metrics, and listens on
// --metrics-addr.
func newAgentRun(o *runOptions) (*agentRun, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	log, err := newLogger(o.logLevel, o.logOut)
	if err != nil {
		return nil, err
	}
	if o.given, err = parseLabels(o.labels); err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("--label: %w", err))
	}
	if o.labelsNow, err = o.openLabels(); err != nil {
		return nil, withCode(exitUsage, err)
	}
	log = log.With("host", o.host)
	r := &agentRun{o: o, log: log, svc: newService(log), met: metrics.New(version)}
	if r.allowed, err = o.loadAllowedSigners(); err != nil {
		return nil, err
	}
	r.met.SetGroups(o.groups)
	if err := unitdir.CheckRoots(o.fileRoots, o.unitDir, o.stateDir); err != nil {
		return nil, withCode(exitUsage, err)
	}
	if o.fleetLockAddr != "" {
		if o.fleetLockTTL < time.Second {
			return nil, withCode(exitUsage, fmt.Errorf("--fleetlock-ttl %s: want at least 1s (longer than a reboot takes)", o.fleetLockTTL))
		}
		if r.fleetLockLn, err = net.Listen("tcp", o.fleetLockAddr); err != nil {
			return nil, fmt.Errorf("--fleetlock-listen: %w", err)
		}
		if !registry.IsLoopbackHost(o.fleetLockAddr) {
			log.Warn("the FleetLock server has no authentication and listens beyond loopback: anyone who reaches "+o.fleetLockAddr+
				" can take or free the reboot slots of this host's groups; keep it behind a firewall or bind it to 127.0.0.1", "fleetlock_listen", o.fleetLockAddr)
		}
	}
	if o.metricsAddr != "" {
		if r.metricsLn, err = net.Listen("tcp", o.metricsAddr); err != nil {
			if r.fleetLockLn != nil {
				r.fleetLockLn.Close()
			}
			return nil, fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	return r, nil
}

// insecureTCPWarning is what the agent logs at every start with
// --embedded-insecure-tcp, and what doctor says of a plaintext listener.
func insecureTCPWarning(endpoint string) string {
	return "the embedded etcd listens on plaintext TCP at " + endpoint + " (--embedded-insecure-tcp): every local user can write the registry there, " +
		"and so have units run as root on this machine and every machine this registry targets"
}

// defaultFleetLockTTL is --fleetlock-ttl: long enough for a machine to
// reboot and its Zincati to say steady-state, short enough that a machine
// that never comes back does not hold its group's rollouts for long.
const defaultFleetLockTTL = 30 * time.Minute

// startEtcd settles the etcd the agent joins: --etcd-endpoints, or else an
// embedded etcd it starts in the state directory (returned, for the caller
// to close; nil with --etcd-endpoints). Bad TLS or password settings fail
// here, once, rather than in the registry retry loop.
func (r *agentRun) startEtcd(ctx context.Context) (*registry.Embedded, error) {
	o, log := r.o, r.log
	r.endpoints = o.etcd.endpoints
	var ecfg *registry.EmbedConfig
	if len(r.endpoints) > 0 && (o.embedClient != "" || o.embedCert != "" || o.embedKey != "" || o.embedCA != "" || o.embedInsecureTCP) {
		return nil, withCode(exitUsage, errors.New("--embedded-listen, --embedded-cert, --embedded-key, --embedded-ca and --embedded-insecure-tcp configure the embedded etcd, "+
			"which runs only without --etcd-endpoints: drop them, or drop --etcd-endpoints"))
	}
	if len(r.endpoints) == 0 {
		c, err := o.embedConfig()
		if err != nil {
			return nil, err
		}
		ecfg, r.endpoints = &c, []string{c.ClientURL}
	}
	if err := o.etcd.config(r.endpoints).Validate(); err != nil {
		return nil, withCode(exitUsage, err)
	}
	if _, err := o.etcd.config(r.endpoints).Security(); err != nil {
		return nil, err
	}
	if ecfg == nil {
		return nil, nil
	}
	ecfg.Logger = log
	if o.embedPeer != "" {
		log.Warn("--embedded-peer-listen is ignored: the embedded etcd has no peer listener", "value", o.embedPeer)
	}
	r.svc.setStatus("starting the embedded etcd")
	// The state directory is private (0700) before etcd puts its data there.
	if err := unitdir.MkdirPrivate(o.stateDir); err != nil {
		return nil, err
	}
	emb, err := registry.StartEmbedded(ctx, *ecfg)
	if err != nil {
		return nil, err // "start embedded etcd: …"
	}
	r.endpoints = []string{emb.Endpoint()}
	log.Info("embedded etcd running", "endpoint", emb.Endpoint(), "tls_endpoint", emb.TLSEndpoint(), "insecure_endpoint", emb.InsecureEndpoint(), "dir", ecfg.Dir)
	if ep := emb.InsecureEndpoint(); ep != "" {
		log.Warn(insecureTCPWarning(ep), "insecure_endpoint", ep)
	}
	return emb, nil
}

// openLocal opens what the agent manages on this machine: the systemd
// connection, the unit directory (removing the temp files an interrupted
// write left), the ownership manifest and the last-known-good snapshot.
// closeLocal closes what it opened, also after a failure.
func (r *agentRun) openLocal(ctx context.Context) error {
	o, log := r.o, r.log
	r.svc.setStatus("connecting to systemd")
	sd, err := systemd.Open(ctx, o.dialSystemd, log)
	if err != nil {
		return fmt.Errorf("connect to systemd: %w", err)
	}
	r.sd = sd
	r.met.SetSystemdConnected(true)
	r.creds = &systemdCreds{user: o.user, withKey: o.credentialKey}
	if r.creds.version, err = sd.Version(ctx); err != nil {
		log.Warn("the service manager's version is not known: secrets put as credentials are refused", "err", err)
	}
	o.labelsNow.setFacts(hostFacts(r.creds.version, log))
	if r.units, err = unitdir.Open(o.unitDir); err != nil {
		return err
	}
	if r.files, err = unitdir.OpenRoots(r.units, o.fileRoots, o.stateDir); err != nil {
		return err // checked by newAgentRun: only an I/O error is left
	}
	removed, err := r.files.CleanTemps()
	for _, p := range removed {
		log.Info("removed a temp file left by an interrupted write", "path", p)
	}
	if err != nil {
		log.Warn("could not remove every temp file left by an interrupted write", "err", err)
	}
	if r.manifest, err = unitdir.OpenManifest(o.stateDir); err != nil {
		return err
	}
	if r.lkg, err = openLastKnownGood(o.stateDir, o.host, o.etcd.prefix, o.groups, log); err != nil {
		return err
	}
	if r.identity, err = openIdentity(o.identity, o.stateDir); err != nil {
		return err
	}
	o.recipient = r.identity.Recipient()
	return r.openTrust()
}

// openIdentity is the host's identity for secrets: the SSH key at path,
// or the age key in the state directory, made at its first start.
func openIdentity(path, stateDir string) (*secret.Identity, error) {
	if path != "" {
		id, err := secret.LoadSSH(path)
		if err != nil {
			return nil, fmt.Errorf("--identity: %w", err)
		}
		return id, nil
	}
	id, err := secret.LoadOrCreate(stateDir)
	if err != nil {
		return nil, fmt.Errorf("the identity for secrets: %w", err)
	}
	return id, nil
}

// closeLocal closes what openLocal opened, in the reverse order.
func (r *agentRun) closeLocal() {
	if r.marks != nil {
		r.marks.Close()
	}
	if r.lkg != nil {
		r.lkg.Close()
	}
	if r.manifest != nil {
		r.manifest.Close()
	}
	if r.files != nil {
		r.files.Close()
	}
	if r.units != nil {
		r.units.Close()
	}
	if r.sd != nil {
		r.sd.Close()
	}
}

// newAgent makes the agent on the local parts, reporting through the
// registry session once there is one (r.reporter).
func (r *agentRun) newAgent(quiet *quietSpell) {
	o, log, svc, met := r.o, r.log, r.svc, r.met
	var sys reconcile.Systemd = r.sd
	if o.wedgeFile != "" {
		sys = reconcile.PlainSystemd(wedgeSystemd{BasicSystemd: sys, file: o.wedgeFile, log: log})
	}
	r.reporter = &sessionReporter{svc: svc, met: met}
	r.rollouts = rollout.NewParticipant(o.host, log, sessionHostPort(r.reporter), met)
	r.agent = reconcile.New(reconcile.Config{
		Systemd:           loopSystemd{Systemd: sys, met: met},
		Files:             r.files,
		Manifest:          r.manifest,
		Reporter:          r.reporter,
		Facts:             sessionFacts{r.reporter},
		Coordinator:       sessionCoordinator{r.reporter},
		Labels:            o.labelsNow.Get, // MaxUnavailableBy= buckets: the labels now, at every pass
		Confirmer:         sessionConfirmer{r.reporter},
		Log:               log,
		Observer:          multiObserver{svc, met, quiet, r.rollouts},
		Prober:            probe.Runner{},
		HeartbeatInterval: svc.heartbeatInterval(),
		Pause:             pauseAt(o.pauseAt, o.stateDir, log),
		Trust:             r.trust,
		Secrets:           r.identity,
		Credentials:       r.creds,
		// Test only: every pass also plans every unit and panics if the
		// units it left out would have been planned differently.
		CheckFocus: os.Getenv(checkFocusEnv) == "1",
	})
}

// run runs the agent and what feeds it (systemd's and the unit
// directory's changes, the debug socket, the registry, the saved-snapshot
// fallback, the notify service, the metrics), each on a goroutine, until
// ctx is done; the first that fails cancels ctx with its error, which is
// returned once they all ended.
func (r *agentRun) run(ctx context.Context, cancel context.CancelCauseFunc) error {
	o, log, svc, met, agent := r.o, r.log, r.svc, r.met, r.agent
	onSnapshot := func(rs registry.Snapshot) {
		met.SnapshotReceived(rs.Revision)
		met.Halts(rs.Halts)
		svc.setOffline("")
		// What the host runs, rollouts applied, is also what a start
		// without the registry runs.
		if s, handOn := r.rollouts.Overlay(rs.Snapshot, rs.Rollouts); handOn {
			r.lkg.received(s, agent.SetSnapshot)
		}
	}
	svc.setStatus("waiting for the registry at " + strings.Join(r.endpoints, ","))

	var wg sync.WaitGroup
	fail := func(err error) {
		if err != nil && ctx.Err() == nil {
			cancel(err)
		}
	}
	wg.Go(func() { fail(agent.Run(ctx)) })
	wg.Go(func() { fail(r.sd.Watch(ctx, agent.UnitChanged)) })
	wg.Go(func() { fail(r.files.Watch(ctx, agent.FileChanged)) })
	wg.Go(func() {
		fail(control.Serve(ctx, o.debugSocket, o.host, labelledBackend{controlBackend{agent, r.rollouts, r.sd.State}, o.labelsNow}))
	})
	wg.Go(func() { fail(followRegistry(ctx, o, r.endpoints, log, r.reporter, met, onSnapshot, agent.UnitChanged)) })
	wg.Go(func() {
		r.lkg.fallback(ctx, fallbackAfter(o.registryTimeout, r.manifest.Units(), r.manifest.Intent(), log), agent.SetSnapshot, svc)
	})
	wg.Go(func() { svc.run(ctx) })
	wg.Go(func() { r.rollouts.Run(ctx) })
	if o.labelsFile != "" {
		wg.Go(func() { o.labelsNow.watch(ctx, log) })
	}
	// A candidate coordinator for each group: one agent of the group wins
	// and runs its rollouts; the others stand by.
	for _, g := range o.groups {
		c := rollout.NewCoordinator(g, log, sessionElector{r.reporter.current}.elector)
		wg.Go(func() { c.Run(ctx) })
	}
	if r.metricsLn != nil {
		wg.Go(func() { fail(met.Serve(ctx, r.metricsLn)) })
	}
	if r.fleetLockLn != nil {
		met.FleetLockServing()
		h := fleetlock.Handler(fleetlock.Config{
			Slots: sessionSlots{r.reporter}, TTL: o.fleetLockTTL, Groups: o.groups, Labels: o.labelsNow.Get,
			Log: log.With("component", "fleetlock"), Observe: met.FleetLockRequest,
		})
		wg.Go(func() { fail(fleetlock.Serve(ctx, r.fleetLockLn, h)) })
	}
	log.Info("agent running", "unit_dir", o.unitDir, "state_dir", o.stateDir, "file_roots", strings.Join(o.fileRoots, ","), "debug_socket", o.debugSocket,
		"groups", strings.Join(o.groups, ","), "etcd", strings.Join(r.endpoints, ","), "metrics", o.metricsAddr,
		"fleetlock", o.fleetLockAddr, "watchdog", svc.watchdog, "labels", describeLabels(o.labelsNow.Get(), 1<<20), "labels_file", o.labelsFile)
	if o.ready != nil {
		o.ready <- agent
	}
	<-ctx.Done()
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("agent stopped")
	return nil
}

// followRegistry joins the registry (retrying while etcd is unreachable),
// publishes statuses through reporter from then on, and hands every
// snapshot of this host's keys to onSnapshot until ctx is done. Leaving
// revokes the lease: membership and statuses go with it.
func followRegistry(ctx context.Context, o *runOptions, endpoints []string, log *slog.Logger,
	reporter *sessionReporter, met *metrics.Metrics, onSnapshot func(registry.Snapshot), poke func(string)) error {
	reg, s, err := connectRegistry(ctx, o, endpoints, log, met)
	if err != nil {
		return err
	}
	defer reg.Close()
	defer func() {
		reporter.set(nil)
		if err := s.Close(); err != nil {
			log.Warn("leaving the registry", "err", err)
		}
	}()
	reporter.set(s)
	poke("") // statuses can be published now
	f := &selectorFollower{o: o, log: log, met: met, reg: reg, s: s, elector: sessionElector{reporter.current}.elector}
	return f.run(ctx, onSnapshot)
}

// connectRegistry dials etcd and joins, retrying while etcd is unreachable:
// the units on this machine keep running untouched meanwhile. A host name
// held by another machine is fatal.
func connectRegistry(ctx context.Context, o *runOptions, endpoints []string, log *slog.Logger, met *metrics.Metrics) (*registry.Client, *registry.Session, error) {
	member := reconcile.Member{
		Host: o.host, MachineID: machineID(), Groups: o.groups, Version: version, StartedAt: time.Now().UTC(),
		Recipient: o.recipient, Labels: o.labelsNow.Get(),
	}
	cfg := o.etcd.config(endpoints)
	cfg.Logger = log
	delay := 250 * time.Millisecond
	for {
		reg, err := registry.Dial(ctx, cfg)
		if err == nil {
			s, jerr := reg.Join(ctx, member, o.leaseTTL)
			if jerr == nil {
				met.SetEtcdConnected(true)
				return reg, s, nil
			}
			reg.Close()
			if errors.Is(jerr, registry.ErrHostTaken) {
				return nil, nil, jerr
			}
			err = jerr
		}
		met.SetEtcdConnected(false)
		log.Warn("registry unreachable; units keep running as they are; retrying", "err", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

func machineID() string {
	b, err := os.ReadFile("/etc/machine-id")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
