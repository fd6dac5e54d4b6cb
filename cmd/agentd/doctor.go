package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/metrics"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/systemd"
	"github.com/agentd/agentd/unitdir"
)

// Check results.
const (
	checkOK   = "ok"
	checkWarn = "warn" // worth knowing; the agent copes
	checkFail = "FAIL" // the agent cannot work (well) until it is fixed
)

// check is one finding of `agentd doctor`.
type check struct {
	Area   string `json:"area"`
	Result string `json:"result"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
}

// maxSkew is the clock difference to etcd beyond which doctor warns:
// beyond its ±1 s measurement error, status timestamps mislead and TLS
// certificates may look not yet (or no longer) valid.
const (
	maxSkew     = 2 * time.Second
	maxSkewFail = 5 * time.Minute
)

func newDoctorCmd() *cobra.Command {
	o := &runOptions{}
	var (
		asJSON  bool
		envFile string
	)
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check that this machine can run the agent; say what is wrong and how to fix it",
		Long: `Check everything the agent depends on, with the settings agentd.service uses
(flags, AGENTD_* variables, and the variables in --env-file), and print what is
wrong and how to fix it:

  systemd    D-Bus access to the service manager, and the privilege to manage
             units (systemd grants it to root)
  unit dir   exists and is writable (a temporary file is created and removed)
  file roots each --file-root (where config files of units' sets may go) is a
             directory apart from the unit and state directories, and writable
  state dir  private (0700; tightened if wider), the ownership manifest
             parses, every file it lists exists with the content the agent
             wrote, and the saved registry snapshot (what the agent runs on
             when the registry is unreachable at start) parses
  registry   etcd answers with the configured endpoints, TLS and credentials;
             how many keys this host has; whether a live agent holds this host;
             the listeners etcd serves clients on (warns of a plaintext TCP
             one, e.g. the embedded etcd's with --embedded-insecure-tcp:
             every local user can write the registry through it)
  clock      skew against etcd. etcd has no time API: doctor reads the Date
             header of etcd's /health endpoint (1 s resolution) and takes the
             midpoint of the request, so the figure is good to about ±0.5 s plus
             half the round trip; it warns beyond 2 s
  labels     the labels file (--labels-file) parses, and only root or the
             agent's user can change it
  agent      the running agent answers on its debug socket; units in error

Exit code 0 when nothing failed (warnings allowed), 1 otherwise.`,
		Example: `  agentd doctor                 # the system agent, as configured in /etc/default/agentd
  agentd doctor --user --env-file=
  agentd doctor --json | jq '.[] | select(.result != "ok")'`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := loadEnvFile(cmd.Flags(), envFile); err != nil {
				return err
			}
			if err := o.defaults(); err != nil {
				return err
			}
			checks := runDoctor(cmd.Context(), o, len(o.etcd.endpoints) == 0)
			return reportChecks(cmd.OutOrStdout(), checks, asJSON)
		},
	}
	fs := cmd.Flags()
	o.bindLocal(fs) // before o.etcd.bind: --user is bindLocal's
	o.etcd.bind(fs, "etcd endpoints (default "+defaultEndpoint+", or $XDG_RUNTIME_DIR/agentd/etcd.sock with --user: the local agent's embedded etcd)")
	fs.StringVar(&envFile, "env-file", "/etc/default/agentd",
		"read AGENTD_* settings from this file, as agentd.service does; flags and the environment win (empty: none)")
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// loadEnvFile sets every flag of fs that neither the command line nor the
// environment set from the AGENTD_* variables in the file at path, as
// agentd.service reads it; a missing file sets nothing, and so does "".
func loadEnvFile(fs *pflag.FlagSet, path string) error {
	if path == "" {
		return nil
	}
	vars, err := readEnvFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return applyEnvVars(fs, vars)
}

// reportChecks prints checks (as JSON, or a table) and fails when one of
// them failed.
func reportChecks(out io.Writer, checks []check, asJSON bool) error {
	if asJSON {
		if err := writeJSON(out, checks); err != nil {
			return err
		}
	} else {
		printChecks(out, checks)
	}
	failed := 0
	for _, c := range checks {
		if c.Result == checkFail {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("doctor: %d problem(s) found; see the fixes above", failed)
	}
	return nil
}

func printChecks(w io.Writer, checks []check) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Result, c.Area, c.Detail)
		if c.Fix != "" {
			fmt.Fprintf(tw, "\t\t→ %s\n", c.Fix)
		}
	}
	tw.Flush()
}

// runDoctor runs every check. embedded says the registry is the local
// agent's embedded etcd.
func runDoctor(ctx context.Context, o *runOptions, embedded bool) []check {
	var checks []check
	add := func(c ...check) { checks = append(checks, c...) }
	add(checkSystemd(ctx, o)...)
	add(checkUnitDir(o))
	add(checkFileRoots(o)...)
	add(checkStateDir(o)...)
	add(checkRegistry(ctx, o, embedded)...)
	add(checkLabels(o))
	add(checkAgent(ctx, o))
	return checks
}

func checkSystemd(ctx context.Context, o *runOptions) []check {
	which := "system"
	if o.user {
		which = "user"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sd, err := systemd.Open(ctx, o.dialSystemd, nil)
	if err != nil {
		fix := "is the bus running (systemctl status dbus)? Is systemd PID 1 here?"
		if o.user {
			fix = "is your user manager running with its bus ($DBUS_SESSION_BUS_ADDRESS, /run/user/$UID/bus)?"
		}
		return []check{{"systemd", checkFail, fmt.Sprintf("cannot reach the %s manager over D-Bus: %v", which, err), fix}}
	}
	defer sd.Close()
	out := []check{}
	probe := "agentd.service"
	st, err := sd.State(ctx, probe)
	if err != nil {
		return append(out, check{"systemd", checkFail, fmt.Sprintf("connected to the %s manager, but reading unit state failed: %v", which, err),
			"check the bus policy and that this user may talk to org.freedesktop.systemd1"})
	}
	detail := fmt.Sprintf("connected to the %s manager over D-Bus", which)
	if !o.user {
		detail += fmt.Sprintf("; agentd.service is %s", describeUnit(st))
	}
	out = append(out, check{"systemd", checkOK, detail, ""})
	if !o.user {
		if ok, why := canManageUnits(); !ok {
			out = append(out, check{"systemd", checkFail, why, "run agentd (and doctor) as root; agentd.service does"})
		} else {
			out = append(out, check{"systemd", checkOK, "may manage units (root)", ""})
		}
	}
	return out
}

func describeUnit(st reconcile.UnitState) string {
	if st.LoadState == "not-found" {
		return "not installed"
	}
	return fmt.Sprintf("%s (%s)", st.ActiveState, st.SubState)
}

// canManageUnits reports whether systemd will let this process reload,
// enable, start and stop units: over the system bus (without polkit) it
// authorizes root by uid, and agentd.service runs as root with no
// capabilities at all. Read from the process, never tried.
func canManageUnits() (bool, string) {
	if uid := os.Geteuid(); uid != 0 {
		return false, fmt.Sprintf("running as uid %d: systemd lets only root (or polkit-authorized users) manage system units", uid)
	}
	return true, ""
}

func checkUnitDir(o *runOptions) check {
	fi, err := os.Stat(o.unitDir)
	if err != nil {
		return check{"unit dir", checkFail, err.Error(), "create it (mkdir -p " + o.unitDir + "); systemd must have it in its unit search path"}
	}
	if !fi.IsDir() {
		return check{"unit dir", checkFail, o.unitDir + " is not a directory", "pass --unit-dir with systemd's unit directory"}
	}
	f, err := os.CreateTemp(o.unitDir, ".agentd-doctor-*")
	if err != nil {
		return check{"unit dir", checkFail, fmt.Sprintf("%s is not writable: %v", o.unitDir, err),
			"run as root; under agentd.service the directory must be in ReadWritePaths="}
	}
	f.Close()
	if err := os.Remove(f.Name()); err != nil {
		return check{"unit dir", checkWarn, fmt.Sprintf("could not remove the probe file %s: %v", f.Name(), err), "remove it by hand"}
	}
	return check{"unit dir", checkOK, o.unitDir + " is writable", ""}
}

// checkFileRoots checks the --file-root directories as the agent takes
// them, and that each is writable.
func checkFileRoots(o *runOptions) []check {
	if len(o.fileRoots) == 0 {
		return []check{{"file roots", checkOK, "no --file-root: config files of units' sets (agentd unit put --file) are refused on this host", ""}}
	}
	if err := unitdir.CheckRoots(o.fileRoots, o.unitDir, o.stateDir); err != nil {
		return []check{{"file roots", checkFail, err.Error(), "fix --file-root (" + envVar("file-root") + "): the agent refuses to start with it"}}
	}
	var out []check
	for _, root := range o.fileRoots {
		f, err := os.CreateTemp(root, ".agentd-doctor-*")
		if err != nil {
			out = append(out, check{"file roots", checkFail, fmt.Sprintf("%s is not writable: %v", root, err),
				"run as root; under agentd.service the directory must be in ReadWritePaths= (systemctl edit agentd)"})
			continue
		}
		f.Close()
		if err := os.Remove(f.Name()); err != nil {
			out = append(out, check{"file roots", checkWarn, fmt.Sprintf("could not remove the probe file %s: %v", f.Name(), err), "remove it by hand"})
			continue
		}
		out = append(out, check{"file roots", checkOK, root + " is writable", ""})
	}
	return out
}

func checkStateDir(o *runOptions) []check {
	if _, err := os.Stat(o.stateDir); errors.Is(err, os.ErrNotExist) {
		return []check{{"state dir", checkWarn, o.stateDir + " does not exist: the agent has not run here yet", "nothing to do: `agentd run` creates it"}}
	}
	var out []check
	if fi, err := os.Stat(o.stateDir); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
			return []check{{"state dir", checkFail, fmt.Sprintf("%s belongs to uid %d; doctor runs as uid %d and cannot read it", o.stateDir, st.Uid, os.Geteuid()),
				"run doctor as the agent's user (the system agent: sudo agentd doctor), or with --user for your own agent"}}
		}
	}
	if fi, err := os.Stat(o.stateDir); err == nil && fi.Mode().Perm()&0o077 != 0 {
		out = append(out, check{"state dir", checkWarn, fmt.Sprintf("%s was mode %04o (old unit versions and the registry snapshot may hold secrets); tightened it to 0700", o.stateDir, fi.Mode().Perm()),
			"nothing more to do: the agent keeps it 0700 and its files 0600"})
	}
	manifest, err := unitdir.OpenManifest(o.stateDir)
	if err != nil {
		return []check{{"state dir", checkFail, fmt.Sprintf("ownership manifest: %v", err),
			"restore " + filepath.Join(o.stateDir, "managed.json") + " from a backup. Moving it away makes the agent forget every file it wrote: it then refuses to overwrite them (status: unmanaged file) until they are removed"}}
	}
	defer manifest.Close()
	managed := manifest.Managed()
	units, err := unitdir.Open(o.unitDir)
	if err != nil {
		return append(out, check{"state dir", checkFail, err.Error(), ""})
	}
	defer units.Close()
	files, err := unitdir.OpenRoots(units, o.fileRoots, o.stateDir)
	if err != nil {
		// Reported by checkFileRoots; config files then read as outside
		// every root.
		files, _ = unitdir.OpenRoots(units, nil)
	}
	defer files.Close()
	out = append(out, checkManagedFiles(files, managed)...)
	return append(out, checkSavedSnapshot(o))
}

// checkManagedFiles checks that every file the manifest lists (managed:
// path → the hash agentd wrote) is in files with that content.
func checkManagedFiles(files *unitdir.Roots, managed map[string]reconcile.Owned) []check {
	var out []check
	bad := 0
	for _, p := range slices.Sorted(maps.Keys(managed)) {
		if managed[p].Instance {
			continue
		}
		h := managed[p].Hash
		b, exists, err := files.Read(p)
		switch {
		case errors.Is(err, unitdir.ErrOutsideRoots):
			bad++
			out = append(out, check{"state dir", checkFail, fmt.Sprintf("managed file: %v", err), "give the agent the --file-root it was written under (" + envVar("file-root") + ")"})
		case err != nil:
			bad++
			out = append(out, check{"state dir", checkFail, fmt.Sprintf("managed file: %v", err), "make it a regular file again (agentd never replaces symlinks or directories)"})
		case !exists:
			bad++
			out = append(out, check{"state dir", checkWarn, fmt.Sprintf("managed file %s is missing", p), "nothing to do if the registry still has it: the agent writes it again on its next pass (agentd sync)"})
		case reconcile.Hash(b) != h:
			bad++
			out = append(out, check{"state dir", checkWarn, fmt.Sprintf("managed file %s was changed behind agentd's back (now %s, agentd wrote %s)", p, short(reconcile.Hash(b)), short(h)),
				"see `agentd diff " + reconcile.UnitOfPath(p) + "`; change the registry copy (agentd unit put), not the file"})
		}
	}
	if bad == 0 {
		out = append(out, check{"state dir", checkOK, fmt.Sprintf("ownership manifest lists %d file(s), all present with the content agentd wrote", len(managed)), ""})
	}
	return out
}

// checkSavedSnapshot checks the last-known-good registry snapshot in the
// state directory: readable, usable, there.
func checkSavedSnapshot(o *runOptions) check {
	var readErr error
	read := func(name string) ([]byte, bool, error) {
		b, err := os.ReadFile(filepath.Join(o.stateDir, name))
		if errors.Is(err, os.ErrNotExist) {
			return nil, false, nil
		}
		if err != nil {
			readErr = err
		}
		return b, err == nil, err
	}
	s, err := unitdir.ReadSavedSnapshot(read, o.host, o.etcd.prefix, o.groups)
	switch {
	case readErr != nil:
		return check{"state dir", checkWarn, fmt.Sprintf("saved registry snapshot: %v", readErr), ""}
	case err != nil:
		return check{"state dir", checkWarn, fmt.Sprintf("saved registry snapshot unusable: %v", err),
			"remove " + filepath.Join(o.stateDir, unitdir.SnapshotFile) + " and " + unitdir.SnapshotJournal + "; the agent saves a new one when it reads the registry"}
	case s == nil:
		return check{"state dir", checkWarn, "no saved registry snapshot: started without the registry, the agent would touch nothing",
			"nothing to do: the agent saves one as soon as it reads the registry"}
	}
	return check{"state dir", checkOK, fmt.Sprintf("last-known-good registry snapshot: revision %d, %d key(s), saved %s",
		s.Snapshot.Revision, len(s.Snapshot.Entries), s.SavedAt.Local().Format(time.RFC3339)), ""}
}

func checkRegistry(ctx context.Context, o *runOptions, embedded bool) []check {
	eps := o.etcd.endpoints
	if embedded {
		eps = []string{o.etcd.localEndpoint(o.user)}
	}
	cfg := o.etcd.config(eps)
	if err := cfg.Validate(); err != nil {
		return []check{{"registry", checkFail, err.Error(), "fix the etcd settings (flags, AGENTD_* variables, /etc/default/agentd)"}}
	}
	reg, err := registry.Dial(ctx, cfg)
	if err != nil {
		return []check{{"registry", checkFail, err.Error(), registryFix(err, embedded)}}
	}
	defer reg.Close()
	var out []check
	keys, err := reg.List(ctx, &registry.Target{Host: o.host})
	if err != nil {
		return []check{{"registry", checkFail, err.Error(), registryFix(err, embedded)}}
	}
	out = append(out, check{"registry", checkOK, fmt.Sprintf("etcd at %s answers (prefix %s); %d key(s) for host %s",
		strings.Join(eps, ","), reg.Prefix(), len(keys), o.host), ""})
	members, err := reg.Members(ctx)
	if err != nil {
		out = append(out, check{"registry", checkFail, err.Error(), registryFix(err, embedded)})
	} else {
		out = append(out, memberCheck(members, o.host, machineID()))
	}
	out = append(out, checkListeners(ctx, reg, embedded))
	out = append(out, checkClock(ctx, o, eps[0], embedded))
	return out
}

// checkListeners looks at the client URLs etcd advertises (for the
// embedded etcd, each listener it has): a plaintext http:// one lets whoever
// reaches it write the registry, and so have units run as root.
func checkListeners(ctx context.Context, reg *registry.Client, embedded bool) check {
	urls, err := reg.ClientURLs(ctx)
	if err != nil {
		return check{"registry", checkWarn, "cannot read which listeners etcd serves clients on: " + err.Error(), ""}
	}
	var plain []string
	for _, u := range urls {
		if strings.HasPrefix(u, "http://") {
			plain = append(plain, u)
		}
	}
	switch {
	case len(plain) > 0 && embedded:
		return check{"registry", checkWarn, insecureTCPWarning(strings.Join(plain, ",")),
			"drop --embedded-insecure-tcp and the http:// --embedded-listen (AGENTD_EMBEDDED_INSECURE_TCP, AGENTD_EMBEDDED_LISTEN in /etc/default/agentd): " +
				"local commands need only the unix socket; remote ones, --embedded-listen https://ADDR:PORT with --embedded-cert, --embedded-key and --embedded-ca"}
	case len(plain) > 0:
		return check{"registry", checkWarn, "etcd serves clients on plaintext TCP at " + strings.Join(plain, ",") +
			": whoever reaches it can write the registry, and so have units run as root on every machine it targets, unless etcd's authentication stops them (and then passwords cross in clear)",
			"serve etcd's clients over https:// with client-certificate auth (etcd --client-cert-auth --trusted-ca-file), and give the agents --etcd-ca, --etcd-cert and --etcd-key"}
	}
	return check{"registry", checkOK, "etcd serves clients on " + strings.Join(urls, ", ") + " (no plaintext TCP)", ""}
}

func memberCheck(members []reconcile.Member, host, machine string) check {
	for _, m := range members {
		if m.Host != host {
			continue
		}
		if m.MachineID != machine {
			return check{"registry", checkFail, fmt.Sprintf("host name %s is held by another machine (machine-id %s, this one is %s)", host, m.MachineID, machine),
				"give this machine another name (--host / AGENTD_HOST), or stop the agent on the other one"}
		}
		return check{"registry", checkOK, fmt.Sprintf("a live agent holds host %s (version %s, up since %s)", host, m.Version, m.StartedAt.Local().Format(time.RFC3339)), ""}
	}
	return check{"registry", checkWarn, "no live agent holds host " + host, "start the agent: systemctl enable --now agentd"}
}

// registryFix says what to do about an error reaching etcd.
func registryFix(err error, embedded bool) string {
	msg := strings.ToLower(err.Error())
	switch {
	case embedded && strings.Contains(msg, "unix://") && strings.Contains(msg, "permission denied"):
		return "only root (or the user the agent runs as) can reach the embedded etcd's socket: run doctor as root (sudo agentd doctor), or with --user for your own agent"
	case strings.Contains(msg, "authentication") || strings.Contains(msg, "auth token") || strings.Contains(msg, "permission denied") || strings.Contains(msg, "user name"):
		return "check --etcd-user and --etcd-password (AGENTD_ETCD_USER, AGENTD_ETCD_PASSWORD in /etc/default/agentd) and the user's role on the prefix"
	case strings.Contains(msg, "x509") || strings.Contains(msg, "certificate") || strings.Contains(msg, "tls: ") || strings.Contains(msg, "handshake"):
		return "check --etcd-ca, --etcd-cert and --etcd-key, and that the endpoints use https://"
	case embedded:
		return "with no --etcd-endpoints the registry is the local agent's embedded etcd: start the agent (systemctl enable --now agentd), or give the endpoints (AGENTD_ETCD_ENDPOINTS)"
	}
	return "check --etcd-endpoints (AGENTD_ETCD_ENDPOINTS), that etcd runs there and that this machine can reach it"
}

// checkClock estimates the clock difference to etcd from the Date header
// of its /health endpoint.
func checkClock(ctx context.Context, o *runOptions, endpoint string, embedded bool) check {
	skew, rtt, err := etcdClockSkew(ctx, o, endpoint)
	if err != nil {
		return check{"clock", checkWarn, fmt.Sprintf("cannot measure the clock skew against %s: %v", endpoint, err), "compare `date -u` here and on the etcd members"}
	}
	detail := fmt.Sprintf("clock differs from etcd at %s by %s (±%s)", endpoint, skew.Round(time.Millisecond), (time.Second/2 + rtt/2).Round(time.Millisecond))
	if embedded {
		detail += "; etcd runs in the agent on this machine"
	}
	abs := max(skew, -skew)
	switch {
	case abs > maxSkewFail:
		return check{"clock", checkFail, detail, "synchronize the clocks (timedatectl set-ntp true, or chrony/ntpd)"}
	case abs > maxSkew:
		return check{"clock", checkWarn, detail, "synchronize the clocks (timedatectl set-ntp true, or chrony/ntpd)"}
	}
	return check{"clock", checkOK, detail, ""}
}

// etcdClockSkew returns (etcd's clock − ours) and the request's round trip.
// The Date header has whole seconds, so the server's time lies in
// [Date, Date+1s): its midpoint is compared with the request's midpoint.
func etcdClockSkew(ctx context.Context, o *runOptions, endpoint string) (skew, rtt time.Duration, err error) {
	ep, err := registry.ParseEndpoint(endpoint)
	if err != nil {
		return 0, 0, err
	}
	// The same TLS configuration as the agent's and the CLI's.
	sec, err := o.etcd.config([]string{endpoint}).Security()
	if err != nil {
		return 0, 0, err
	}
	tr := &http.Transport{TLSClientConfig: sec.TLS}
	base := strings.TrimSuffix(endpoint, "/")
	if ep.Scheme == "unix" {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", ep.Path)
		}
		base = "http://localhost"
	}
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	resp, err := hc.Do(req)
	t1 := time.Now()
	if err != nil {
		return 0, 0, err
	}
	resp.Body.Close()
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return 0, 0, fmt.Errorf("no usable Date header in the reply of %s/health", endpoint)
	}
	rtt = t1.Sub(t0)
	mid := t0.Add(rtt / 2)
	return date.Add(time.Second / 2).Sub(mid), rtt, nil
}

func checkAgent(ctx context.Context, o *runOptions) check {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := control.NewClient(o.debugSocket).Status(ctx)
	if err != nil {
		fix := "start it: systemctl enable --now agentd (or pass --debug-socket)"
		if o.user {
			fix = "start it: agentd run --user"
		}
		return check{"agent", checkWarn, "the agent does not answer on " + o.debugSocket, fix}
	}
	c, p, f := metrics.Count(r.Units)
	detail := fmt.Sprintf("agent for host %s answers: registry revision %d; %d unit(s) converged, %d pending, %d failed", r.Host, r.Revision, c, p, f)
	if f == 0 {
		return check{"agent", checkOK, detail, ""}
	}
	var failed []string
	for _, u := range r.Units {
		if metrics.Classify(u) == metrics.Failed {
			failed = append(failed, u.Unit+": "+u.Error)
		}
	}
	return check{"agent", checkWarn, detail + " (" + strings.Join(failed, "; ") + ")", "see `agentd status` and `journalctl -u UNIT`"}
}
