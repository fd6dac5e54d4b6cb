package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/systemd"
	"github.com/agentd/agentd/unitdir"
)

type runOptions struct {
	etcd        etcdFlags
	host        string
	groups      []string
	user        bool
	unitDir     string
	stateDir    string
	debugSocket string
	embedClient string
	embedPeer   string
	logLevel    string
	leaseTTL    time.Duration

	// dialSystemd overrides the D-Bus connection (tests use a private manager).
	dialSystemd systemd.Dialer
	// ready, when set, receives the agent once it runs (tests).
	ready chan<- *reconcile.Agent
	// logOut overrides where logs go (tests: t.Output()).
	logOut io.Writer
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
directory, listening on ` + defaultEndpoint + `, so one machine needs nothing else.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd); err != nil {
				return err
			}
			return runAgent(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	o.etcd.bind(fs, "etcd endpoints (comma-separated); empty: run an embedded etcd in the state directory")
	fs.StringVar(&o.host, "host", "", "this agent's host name in the registry (default: the short hostname)")
	fs.StringSliceVar(&o.groups, "group", []string{"all"}, "group this host belongs to (repeatable)")
	fs.BoolVar(&o.user, "user", false, "manage the user's systemd instance instead of the system one")
	fs.StringVar(&o.unitDir, "unit-dir", "", "unit directory (default /etc/systemd/system, or $XDG_CONFIG_HOME/systemd/user with --user)")
	fs.StringVar(&o.stateDir, "state-dir", "", "state directory (default /var/lib/agentd, or $XDG_STATE_HOME/agentd with --user)")
	fs.StringVar(&o.debugSocket, "debug-socket", "", "unix socket of the local debug API (default /run/agentd/agentd.sock, or $XDG_RUNTIME_DIR/agentd.sock with --user)")
	fs.StringVar(&o.embedClient, "embedded-listen", defaultEndpoint, "client URL of the embedded etcd (only without --etcd-endpoints)")
	fs.StringVar(&o.embedPeer, "embedded-peer-listen", "http://127.0.0.1:2380", "peer URL of the embedded etcd (only without --etcd-endpoints)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&o.leaseTTL, "lease-ttl", 15*time.Second, "TTL of the lease that binds this agent's membership and statuses")
	return cmd
}

// defaults fills the paths that depend on --user.
func (o *runOptions) defaults() error {
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
	if o.dialSystemd == nil {
		o.dialSystemd = systemd.SystemDialer()
		if o.user {
			o.dialSystemd = systemd.UserDialer()
		}
	}
	return nil
}

func newLogger(level string, out io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, withCode(exitUsage, fmt.Errorf("--log-level: %w", err))
	}
	if out == nil {
		out = os.Stderr
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: l})), nil
}

// sessionReporter lets the agent report before the registry session exists
// (or while it is being re-established): reports fail and are retried.
type sessionReporter struct {
	mu sync.Mutex
	s  *registry.Session
}

func (r *sessionReporter) set(s *registry.Session) {
	r.mu.Lock()
	r.s = s
	r.mu.Unlock()
}

func (r *sessionReporter) Report(ctx context.Context, st []reconcile.Status) error {
	r.mu.Lock()
	s := r.s
	r.mu.Unlock()
	if s == nil {
		return errors.New("not connected to the registry yet")
	}
	return s.Report(ctx, st)
}

func runAgent(ctx context.Context, o *runOptions) error {
	if err := o.defaults(); err != nil {
		return err
	}
	log, err := newLogger(o.logLevel, o.logOut)
	if err != nil {
		return err
	}
	log = log.With("host", o.host)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	endpoints := o.etcd.endpoints
	if len(endpoints) == 0 {
		emb, err := registry.StartEmbedded(ctx, registry.EmbedConfig{
			Dir: filepath.Join(o.stateDir, "etcd"), ClientURL: o.embedClient, PeerURL: o.embedPeer, Logger: log,
		})
		if err != nil {
			return fmt.Errorf("embedded etcd: %w", err)
		}
		defer emb.Close()
		endpoints = []string{emb.Endpoint()}
		log.Info("embedded etcd running", "endpoint", emb.Endpoint(), "dir", filepath.Join(o.stateDir, "etcd"))
	}

	sd, err := systemd.Open(ctx, o.dialSystemd, log)
	if err != nil {
		return fmt.Errorf("connect to systemd: %w", err)
	}
	defer sd.Close()
	files, err := unitdir.Open(o.unitDir)
	if err != nil {
		return err
	}
	defer files.Close()
	manifest, err := unitdir.OpenManifest(o.stateDir)
	if err != nil {
		return err
	}
	defer manifest.Close()

	reporter := &sessionReporter{}
	agent := reconcile.New(reconcile.Config{
		Systemd: sd, Files: files, Manifest: manifest, Reporter: reporter, Log: log,
	})

	var wg sync.WaitGroup
	fail := func(err error) {
		if err != nil && ctx.Err() == nil {
			cancel(err)
		}
	}
	wg.Go(func() { fail(agent.Run(ctx)) })
	wg.Go(func() { fail(sd.Watch(ctx, agent.UnitChanged)) })
	wg.Go(func() { fail(control.Serve(ctx, o.debugSocket, o.host, agent)) })
	wg.Go(func() {
		reg, s, err := connectRegistry(ctx, o, endpoints, log)
		if err != nil {
			fail(err)
			return
		}
		defer reg.Close()
		defer func() {
			// Leaving revokes the lease: membership and statuses go with it.
			reporter.set(nil)
			if err := s.Close(); err != nil {
				log.Warn("leaving the registry", "err", err)
			}
		}()
		reporter.set(s)
		agent.UnitChanged("") // statuses can be published now
		fail(reg.Watch(ctx, o.host, o.groups, agent.SetSnapshot))
	})
	log.Info("agent running", "unit_dir", o.unitDir, "state_dir", o.stateDir, "debug_socket", o.debugSocket,
		"groups", strings.Join(o.groups, ","), "etcd", strings.Join(endpoints, ","))
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

// connectRegistry dials etcd and joins, retrying while etcd is unreachable:
// the units on this machine keep running untouched meanwhile. A host name
// held by another machine is fatal.
func connectRegistry(ctx context.Context, o *runOptions, endpoints []string, log *slog.Logger) (*registry.Client, *registry.Session, error) {
	member := reconcile.Member{
		Host: o.host, MachineID: machineID(), Groups: o.groups, Version: version, StartedAt: time.Now().UTC(),
	}
	cfg := o.etcd.config(endpoints)
	cfg.Logger = log
	delay := 250 * time.Millisecond
	for {
		reg, err := registry.Dial(ctx, cfg)
		if err == nil {
			s, jerr := reg.Join(ctx, member, o.leaseTTL)
			if jerr == nil {
				return reg, s, nil
			}
			reg.Close()
			if errors.Is(jerr, registry.ErrHostTaken) {
				return nil, nil, jerr
			}
			err = jerr
		}
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
