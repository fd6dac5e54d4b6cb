// Package control is the agent's local debug API: an HTTP server on a unix
// socket (mode 0600, so only the agent's user can ask) and its client, used by
// `agentd status`, `agentd diff` and `agentd sync`. The CLI holds no logic of
// its own: dry-run and sync run the agent's planning code.
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/rollout"
)

// Backend is what the server exposes; *reconcile.Agent implements it.
type Backend interface {
	Statuses() (revision int64, st []reconcile.Status)
	DryRun(ctx context.Context) ([]reconcile.Action, error)
	Sync(ctx context.Context) ([]reconcile.Action, error)
	Diff(ctx context.Context, unit string) ([]reconcile.FileDiff, error)
}

// StatusReply is the body of GET /v1/status.
type StatusReply struct {
	Host     string             `json:"host"`
	Revision int64              `json:"revision"` // registry revision of the last applied snapshot
	Units    []reconcile.Status `json:"units"`
	// Rollouts are the rollouts of the host's groups running now, as the
	// agent sees them (a Backend that is a RolloutLister); an agent
	// older than them leaves the field out.
	Rollouts []RolloutInfo `json:"rollouts,omitempty"`
	// Labels are the host's labels as the agent publishes them now (a
	// Backend that is a LabelsReporter); an agent older than them leaves
	// the field out.
	Labels *LabelsInfo `json:"labels,omitempty"`
}

// LabelsReporter is what a Backend may also tell: the host's labels.
type LabelsReporter interface {
	Labels() *LabelsInfo
}

// LabelsInfo is the host's labels: those given (agentd run --label, the
// labels file) and its facts, and whether the labels file as it is now is
// refused (the agent then keeps the labels it had).
type LabelsInfo struct {
	Labels map[string]string `json:"labels"`
	// File is the labels file ("": none).
	File string `json:"file,omitempty"`
	// FileRefused says why the file as it is now is refused ("": it is
	// not): Labels are those from before its change.
	FileRefused string `json:"fileRefused,omitempty"`
}

// RolloutLister is what a Backend may also tell: the rollouts running now.
type RolloutLister interface {
	Rollouts() []RolloutInfo
}

// RolloutInfo is one running rollout (package rollout) of the host's
// groups, from the agent's last snapshot: its record's state and where
// this host stands in it (an agent sees only its own progress: `agentd
// rollout status` has the others). Waves count from 1.
type RolloutInfo struct {
	ID    string        `json:"id"`
	Group string        `json:"group"`
	Units []string      `json:"units"` // the units its keys belong to, sorted
	State rollout.State `json:"state"`
	// Reason is the record's (why it is paused, or ended).
	Reason string `json:"reason,omitempty"`
	Waves  int    `json:"waves"`
	Hosts  int    `json:"hosts"`
	// Soak is how long each host stays healthy before it counts.
	Soak time.Duration `json:"soak,omitempty"`
	// HostWave is this host's wave; 0: it is not one of the rollout's
	// hosts (it joined the group since the rollout started).
	HostWave   int               `json:"hostWave"`
	HostState  rollout.HostState `json:"hostState,omitempty"`
	HostSince  time.Time         `json:"hostSince,omitzero"`
	HostReason string            `json:"hostReason,omitempty"`
}

// PlanItem is one unit's entry in a plan.
type PlanItem struct {
	Unit   string   `json:"unit"`
	Action string   `json:"action"`
	Reason string   `json:"reason,omitempty"`
	Error  string   `json:"error,omitempty"`
	Writes []string `json:"writes,omitempty"`
	Remove []string `json:"removes,omitempty"`
}

// PlanReply is the body of POST /v1/sync.
type PlanReply struct {
	DryRun bool       `json:"dryRun"`
	Plan   []PlanItem `json:"plan"`
}

// Items converts a plan for display, leaving out units with nothing to do.
func Items(plan []reconcile.Action) []PlanItem {
	items := []PlanItem{}
	for _, a := range plan {
		if a.Kind == reconcile.KindNone {
			continue
		}
		it := PlanItem{Unit: a.Unit, Action: a.Kind.String(), Reason: a.Reason, Error: a.Err, Remove: a.Steps.Removes}
		for _, w := range a.Steps.Writes {
			it.Writes = append(it.Writes, w.Path)
		}
		items = append(items, it)
	}
	return items
}

// Serve listens on path until ctx ends. A stale socket file from a previous
// run is replaced; anything else at path is an error.
func Serve(ctx context.Context, path, host string, b Backend) error {
	// 0700: only the agent's user reaches what lies in the runtime directory.
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("debug socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return fmt.Errorf("debug socket: %s exists and is not a socket", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return fmt.Errorf("debug socket: %s is in use by another agent", path)
		}
		os.Remove(path)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("debug socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("debug socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		rev, st := b.Statuses()
		if st == nil {
			st = []reconcile.Status{}
		}
		reply := StatusReply{Host: host, Revision: rev, Units: st}
		if rl, ok := b.(RolloutLister); ok {
			reply.Rollouts = rl.Rollouts()
		}
		if lr, ok := b.(LabelsReporter); ok {
			reply.Labels = lr.Labels()
		}
		writeJSON(w, reply)
	})
	mux.HandleFunc("POST /v1/sync", func(w http.ResponseWriter, r *http.Request) {
		dry := r.URL.Query().Get("dry-run") == "1"
		var plan []reconcile.Action
		var err error
		if dry {
			plan, err = b.DryRun(r.Context())
		} else {
			plan, err = b.Sync(r.Context())
		}
		if err != nil && !(plan != nil && !dry) {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		writeJSON(w, PlanReply{DryRun: dry, Plan: Items(plan)})
	})
	mux.HandleFunc("GET /v1/diff", func(w http.ResponseWriter, r *http.Request) {
		d, err := b.Diff(r.Context(), r.URL.Query().Get("unit"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		writeJSON(w, d)
	})
	// The runtime's profiles (heap, goroutines, CPU) for whoever may reach
	// the socket: `curl --unix-socket <socket> http://agentd/debug/pprof/heap`.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	err = srv.Serve(l)
	os.Remove(path)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// Client talks to a running agent.
type Client struct {
	path string
	hc   *http.Client
}

// NewClient returns a client for the socket at path.
func NewClient(path string) *Client {
	return &Client{path: path, hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}}
}

func (c *Client) call(ctx context.Context, method, path string, out any) error {
	return c.do(ctx, method, path, func(body io.Reader) error {
		b, err := io.ReadAll(body)
		if err != nil {
			return err
		}
		return json.Unmarshal(b, out)
	})
}

// do sends a request to the agent and hands read the body of a 200 reply;
// any other reply is an error with the agent's words.
func (c *Client) do(ctx context.Context, method, path string, read func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://agentd"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the agent at %s (is `agentd run` running? pass --debug-socket): %w", c.path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		return fmt.Errorf("agent: %s", string(bytesTrim(body)))
	}
	return read(resp.Body)
}

// Profile writes a CPU profile of the agent over the next d (Go's pprof
// format, from /debug/pprof/profile) to w. It returns when d is over.
func (c *Client) Profile(ctx context.Context, d time.Duration, w io.Writer) error {
	return c.Fetch(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(d.Seconds())), w)
}

// Fetch copies what the agent serves at path (one of /debug/pprof/) to w.
func (c *Client) Fetch(ctx context.Context, path string, w io.Writer) error {
	return c.do(ctx, http.MethodGet, path, func(body io.Reader) error {
		_, err := io.Copy(w, body)
		return err
	})
}

func bytesTrim(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// Status fetches every unit's status.
func (c *Client) Status(ctx context.Context) (StatusReply, error) {
	var r StatusReply
	return r, c.call(ctx, http.MethodGet, "/v1/status", &r)
}

// Sync runs a pass (or only plans it, with dryRun) and returns the plan.
func (c *Client) Sync(ctx context.Context, dryRun bool) (PlanReply, error) {
	var r PlanReply
	q := ""
	if dryRun {
		q = "?dry-run=1"
	}
	return r, c.call(ctx, http.MethodPost, "/v1/sync"+q, &r)
}

// Diff fetches registry and local content of unit's files ("" for all).
func (c *Client) Diff(ctx context.Context, unit string) ([]reconcile.FileDiff, error) {
	var r []reconcile.FileDiff
	return r, c.call(ctx, http.MethodGet, "/v1/diff?unit="+url.QueryEscape(unit), &r)
}
