// The runtime's periodic GOMAXPROCS re-check wakes an idle agent once a
// second; the agent never needs more than it started with.
//
//go:debug updatemaxprocs=0

// Command agentd redeploys systemd units in place across a fleet: `agentd run`
// is the per-machine agent; the other subcommands are its clients.
//
// main only wires flags to packages; every decision lives in reconcile.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// Exit codes, documented in `agentd --help` and the README.
const (
	exitOK      = 0
	exitError   = 1 // anything else: bad input, registry or agent unreachable
	exitUsage   = 2 // bad flags or arguments
	exitFailed  = 3 // --wait: a host failed to apply the change
	exitTimeout = 4 // --wait: not every host converged before --timeout
	// --wait: a later write of other content to a key waited on; this
	// write will never run.
	exitSuperseded = 5
	// --wait --skip-unreachable: every host with a live agent converged;
	// members without one were skipped (and named).
	exitSkipped = 6
)

// exitError carries an exit code through cobra to main's single exit site.
type codeError struct {
	code int
	err  error
}

func (e *codeError) Error() string { return e.err.Error() }
func (e *codeError) Unwrap() error { return e.err }

func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &codeError{code, err}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	os.Exit(exitCode(err))
}

func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(os.Stderr, "agentd:", err)
	var ce *codeError
	if errors.As(err, &ce) {
		return ce.code
	}
	return exitError
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "agentd",
		Short: "Redeploy systemd units in place across a fleet, from etcd",
		Long: `agentd keeps the systemd units of every machine in step with a registry in etcd.

Every machine runs "agentd run" (as a service: contrib/systemd/agentd.service).
"agentd unit put" stores a unit file for a host or a group; each targeted agent
writes it, runs one daemon-reload per batch and restarts (or starts) the unit
in place, then reports the hash it runs. "agentd doctor" checks a machine.

Every flag can also be set as AGENTD_<FLAG>, upper case with "-" as "_"
(e.g. AGENTD_ETCD_ENDPOINTS for --etcd-endpoints); flags win.

Shell completion: source <(agentd completion bash); see "agentd completion --help".

Exit codes:
  0  success
  1  error (bad input, registry or agent unreachable; doctor: a check failed)
  2  usage error (bad flags or arguments)
  3  --wait: a host failed to apply the change (reason printed); a rollout failed or was aborted
  4  --wait: timed out before every host converged (a rollout goes on)
  5  --wait: superseded — a later write put other content in a key waited on (or a rollout superseded)
  6  --wait --skip-unreachable: converged, but members without a live agent were skipped`,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return withCode(exitUsage, err) })
	// Every flag can come from AGENTD_<FLAG>; filled before any command runs.
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error { return applyEnv(cmd) }
	root.AddCommand(newRunCmd(), newUnitCmd(), newHostsCmd(), newStatusCmd(), newSyncCmd(), newDiffCmd(), newDoctorCmd())
	root.AddCommand(newRbacCmd(), newRolloutCmd(), newLocksCmd(), newManPagesCmd(), newSecretsCmd(), newMirrorCmd(), newWindowCmd())
	return root
}

// usageArgs wraps a cobra.PositionalArgs so argument errors exit with exitUsage.
func usageArgs(f cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		return withCode(exitUsage, f(cmd, args))
	}
}
