package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/agentd/agentd/registry"
)

const (
	// systemRuntimeDir holds the system agent's sockets (agentd.service:
	// RuntimeDirectory=agentd, mode 0700).
	systemRuntimeDir = "/run/agentd"
	// etcdSocket is the embedded etcd's client socket in the runtime directory.
	etcdSocket = "etcd.sock"
	// defaultEndpoint is where `agentd run` with no --etcd-endpoints serves its
	// embedded etcd, so the client commands (run as root) find it with no
	// flags at all; only root can reach it.
	defaultEndpoint = "unix://" + systemRuntimeDir + "/" + etcdSocket
)

// runtimeDir is the directory of the agent's embedded etcd socket: the
// hidden --runtime-dir (AGENTD_RUNTIME_DIR) when set, else /run/agentd, or
// $XDG_RUNTIME_DIR/agentd in user mode (without XDG_RUNTIME_DIR, the default
// user state directory, which is private too).
func runtimeDir(user bool, override string) string {
	switch {
	case override != "":
		return override
	case !user:
		return systemRuntimeDir
	case os.Getenv("XDG_RUNTIME_DIR") != "":
		return filepath.Join(os.Getenv("XDG_RUNTIME_DIR"), "agentd")
	}
	if v := os.Getenv("XDG_STATE_HOME"); v != "" {
		return filepath.Join(v, "agentd")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "state", "agentd")
}

// etcdFlags are the registry connection flags every registry command takes.
type etcdFlags struct {
	endpoints    []string
	prefix       string
	user         string
	password     string
	passwordFile string
	cert         string
	key          string
	ca           string
	timeout      time.Duration
	// userMode: the local agent is the user's (agentd run --user). For run
	// and doctor it is their --user; the client commands bind their own.
	userMode bool
	// runtimeDir overrides where the embedded etcd's socket lives (hidden
	// --runtime-dir; tests point it at a temporary directory).
	runtimeDir string
}

func (f *etcdFlags) bind(fs *pflag.FlagSet, endpointsHelp string) {
	fs.StringSliceVar(&f.endpoints, "etcd-endpoints", nil, endpointsHelp)
	fs.StringVar(&f.prefix, "prefix", registry.DefaultPrefix, "registry key prefix")
	fs.StringVar(&f.user, "etcd-user", "", "etcd user name")
	fs.StringVar(&f.password, "etcd-password", "", "etcd password: every local user sees it in ps; prefer --etcd-password-file or AGENTD_ETCD_PASSWORD")
	fs.StringVar(&f.passwordFile, "etcd-password-file", "", "file holding the etcd password (one line; read at every connection)")
	fs.StringVar(&f.cert, "etcd-cert", "", "client certificate for etcd TLS (https:// endpoints only)")
	fs.StringVar(&f.key, "etcd-key", "", "client key for etcd TLS (https:// endpoints only)")
	fs.StringVar(&f.ca, "etcd-ca", "", "CA bundle to verify etcd's certificate (https:// endpoints only; default: the system's)")
	fs.DurationVar(&f.timeout, "etcd-dial-timeout", 5*time.Second, "how long to try reaching etcd before giving up")
	fs.StringVar(&f.runtimeDir, "runtime-dir", "", "directory of the embedded etcd's socket (default "+systemRuntimeDir+", or $XDG_RUNTIME_DIR/agentd in user mode)")
	_ = fs.MarkHidden("runtime-dir")
	// run and doctor bind --user themselves (bindLocal) and copy it here.
	if fs.Lookup("user") == nil {
		fs.BoolVar(&f.userMode, "user", false, "without --etcd-endpoints, reach the embedded etcd of the user's agent (agentd run --user); the default for users other than root")
	}
}

func (f *etcdFlags) config(endpoints []string) registry.Config {
	return registry.Config{
		Endpoints: endpoints, Prefix: f.prefix,
		Username: f.user, Password: f.password, PasswordFile: f.passwordFile,
		CertFile: f.cert, KeyFile: f.key, CAFile: f.ca,
		DialTimeout: f.timeout,
	}
}

// localEndpoint is the embedded etcd of the local agent in the given mode.
func (f *etcdFlags) localEndpoint(user bool) string {
	return "unix://" + filepath.Join(runtimeDir(user, f.runtimeDir), etcdSocket)
}

// clientUserMode says whose agent a client command talks to without
// explicit endpoints: the user's with --user, or when not run as root (only
// root can reach the system agent's sockets); the system agent's otherwise.
func clientUserMode(flag bool) bool { return flag || os.Geteuid() != 0 }

// dial connects a client command to etcd; no endpoints means the local
// agent's embedded etcd.
func (f *etcdFlags) dial(ctx context.Context) (*registry.Client, error) {
	eps := f.endpoints
	if len(eps) == 0 {
		eps = []string{f.localEndpoint(clientUserMode(f.userMode))}
	}
	cfg := f.config(eps)
	if err := cfg.Validate(); err != nil {
		return nil, withCode(exitUsage, err)
	}
	c, err := registry.Dial(ctx, cfg)
	explained := errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED)
	if err != nil && len(f.endpoints) == 0 && !explained {
		return nil, fmt.Errorf("%w (is `agentd run` running here? Else pass --etcd-endpoints)", err)
	}
	if err == nil {
		c.SetLogger(cliWarnings(os.Stderr)) // a registry key skipped as garbage is said, once per key read
	}
	return c, err
}

// withRegistry is the setup of every registry command, after its arguments
// are checked: it dials the registry ef names with cmd's context, runs fn
// with the client and closes it.
func withRegistry(cmd *cobra.Command, ef *etcdFlags, fn func(ctx context.Context, reg *registry.Client) error) error {
	ctx := cmd.Context()
	reg, err := ef.dial(ctx)
	if err != nil {
		return err
	}
	defer reg.Close()
	return fn(ctx, reg)
}
