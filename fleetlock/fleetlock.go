// Package fleetlock serves the FleetLock protocol — the reboot manager
// Zincati's fleet_lock update strategy talks to, also spoken by other
// reboot coordinators — on agentd's MaxUnavailable= slots, so that a
// machine's reboot and an agent's restart draw from one budget per group,
// or per rack where the group's units budget by label (MaxUnavailableBy=).
//
// The protocol, as Zincati's documentation defines it
// (https://coreos.github.io/zincati/development/fleetlock/protocol/):
//
//	POST /v1/pre-reboot     take (lock) a reboot slot, recursively: again for the same id is no error
//	POST /v1/steady-state   give it back (UnlockIfHeld: holding nothing is no error)
//
// Each request carries the header "fleet-lock-protocol: true" and the
// JSON body {"client_params": {"id": "<client id>", "group": "<group>"}}
// (Zincati sends it with no Content-Type, which is not required). Success
// is 200 with an empty JSON object; every failure a 4xx or 5xx status
// with {"kind": "...", "value": "..."}, kind one of the Kind* constants.
//
// The group is an agentd group — one of the groups the serving agent runs
// with (--group) — and a client id holds slots of that group's queues
// (registry.LockReboot): one of every unit of the group that sets
// MaxUnavailable=, with that limit, and one of the group's reboot pool,
// whose limit is the smallest MaxUnavailable= of the group's units, or 1
// when none sets one. A request that is refused for its input takes no
// slot. The state lives in etcd, and a holder that never says steady-state
// is freed when its lease's TTL runs out.
//
// Budgets by label: a unit with [X-Agentd] MaxUnavailableBy=KEY has one
// queue per value of the host label KEY (rack=r1, rack=r2, and one for
// the hosts without it), and its agents restart it in the queue of their
// own rack. A reboot takes its slot in the queue of the rebooting
// machine's rack — and the server knows no machine but its own: the
// FleetLock protocol says only a client id and a group, so the bucket is
// the serving agent's own labels (Config.Labels). That is right for the
// way Zincati is meant to be set up — each machine's client talks to the
// agent on the same machine, base_url on loopback — and keeps "a machine's
// reboot and its agent's restarts draw from one budget" true per rack. A
// client that asks another machine's agent draws from that machine's rack:
// with budgets by label, point every client at its own agent. The group's
// reboot pool is by KEY too when every unit of the group that sets
// MaxUnavailable= sets MaxUnavailableBy=KEY (registry.LockReboot). When
// the serving agent's labels change, a client already holding slots keeps
// them; its next pre-reboot takes what it lacks in the new bucket.
//
// The server has no authentication (Zincati sends none): anyone who can
// reach it can take or free any slot of the groups it serves. Bind it to
// loopback, or keep it behind a firewall or an authenticating proxy.
//
// Handler and Serve are safe for concurrent use; each request's work is
// bounded by the registry's request timeouts and ends with the request's
// context.
package fleetlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/agentd/agentd/internal/httpserve"
	"github.com/agentd/agentd/registry"
)

// Endpoints, relative to the server's base URL.
const (
	PreRebootPath   = "/v1/pre-reboot"
	SteadyStatePath = "/v1/steady-state"
)

// MaxBody is the largest request body read; a larger one is refused
// (KindBodyTooLarge) before it is decoded.
const MaxBody = 64 << 10

// The error kinds, a small bounded set (the protocol asks for one: Zincati
// tracks kind in a metric label).
const (
	KindMethodNotAllowed = "method_not_allowed"         // 405: not a POST
	KindNotFound         = "not_found"                  // 404: not a protocol endpoint
	KindMissingHeader    = "missing_fleet_lock_header"  // 400: no "fleet-lock-protocol: true"
	KindBodyTooLarge     = "body_too_large"             // 413: over MaxBody
	KindMalformed        = "malformed_body"             // 400: not the protocol's JSON body
	KindInvalidID        = "invalid_client_id"          // 400: empty, or not usable as a key segment
	KindInvalidGroup     = "invalid_group"              // 400: not ^[a-zA-Z0-9.-]+$, or not a valid agentd group name
	KindUnknownGroup     = "unknown_group"              // 403: not one of the serving agent's groups
	KindSemaphoreFull    = "failed_lock_semaphore_full" // 409: a slot the reboot needs is taken (the protocol's own example)
	KindUnavailable      = "registry_unavailable"       // 503: etcd could not be asked; nothing known to be taken
)

// groupRE is the protocol's rule for a group.
var groupRE = regexp.MustCompile(`^[a-zA-Z0-9.-]+$`)

// Slots is the registry's side: *registry.Client, or the agent's current
// registry connection.
type Slots interface {
	// LockReboot takes the client's reboot slots, each pool by label in
	// the bucket of labels (the rebooting machine's).
	LockReboot(ctx context.Context, group, id string, labels map[string]string, ttl time.Duration) error
	UnlockReboot(ctx context.Context, group, id string) (int, error)
}

// Config configures Handler.
type Config struct {
	Slots Slots
	// TTL is the lease of a reboot's slots: they are freed this long after
	// the last pre-reboot of its client at the latest.
	TTL time.Duration
	// Groups are the groups served (the agent's --group); any other is
	// refused with KindUnknownGroup.
	Groups []string
	// Labels returns the serving agent's labels, asked at each
	// pre-reboot: a pool by label (MaxUnavailableBy=) is taken in their
	// bucket (see the package doc). nil: no labels — the bucket of the
	// hosts without the label.
	Labels func() map[string]string
	Log    *slog.Logger
	// Observe, if set, is told the endpoint ("pre-reboot", "steady-state",
	// "other") and result ("ok" or the error kind) of every request.
	Observe func(endpoint, result string)
}

// Handler serves the protocol's two endpoints.
func Handler(cfg Config) http.Handler {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &server{cfg: cfg}
	mux := http.NewServeMux()
	mux.HandleFunc(PreRebootPath, s.handle("pre-reboot", s.preReboot))
	mux.HandleFunc(SteadyStatePath, s.handle("steady-state", s.steadyState))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.observe("other", KindNotFound)
		writeError(w, http.StatusNotFound, KindNotFound, "no such FleetLock endpoint "+r.URL.Path+": use POST "+PreRebootPath+" or "+SteadyStatePath)
	})
	return mux
}

// Serve serves h on ln until ctx is done, then shuts the server down. It
// returns nil after ctx is done.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
	return httpserve.Serve(ctx, srv, ln)
}

type server struct {
	cfg Config
}

func (s *server) observe(endpoint, result string) {
	if s.cfg.Observe != nil {
		s.cfg.Observe(endpoint, result)
	}
}

// rejection is a protocol error to answer with.
type rejection struct {
	status      int
	kind, value string
}

func (r *rejection) Error() string { return r.kind + ": " + r.value }

func reject(status int, kind, format string, args ...any) *rejection {
	return &rejection{status, kind, fmt.Sprintf(format, args...)}
}

// ClientParams is the protocol's client_params.
type ClientParams struct {
	ID    string `json:"id"`
	Group string `json:"group"`
}

// Request is the body of both endpoints.
type Request struct {
	ClientParams *ClientParams `json:"client_params"`
}

// Error is the body of a failure.
type Error struct {
	Kind  string `json:"kind"`
	Value string `json:"value"`
}

// handle checks what every request must be (POST, the header, the body)
// and runs do with the client's parameters.
func (s *server) handle(endpoint string, do func(ctx context.Context, p ClientParams) *rejection) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, rej := s.parse(w, r)
		if rej == nil {
			rej = do(r.Context(), p)
		}
		log := s.cfg.Log.With("endpoint", endpoint, "client_id", p.ID, "group", p.Group, "remote", r.RemoteAddr)
		if rej != nil {
			s.observe(endpoint, rej.kind)
			level := slog.LevelWarn
			if rej.kind == KindSemaphoreFull {
				level = slog.LevelInfo // the protocol's normal "not yet"
			}
			log.Log(r.Context(), level, "FleetLock "+endpoint+" refused", "kind", rej.kind, "reason", rej.value)
			writeError(w, rej.status, rej.kind, rej.value)
			return
		}
		s.observe(endpoint, "ok")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "{}\n")
	}
}

// parse checks the method, the header and the body, in that order, and
// returns the client's parameters, valid.
func (s *server) parse(w http.ResponseWriter, r *http.Request) (ClientParams, *rejection) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return ClientParams{}, reject(http.StatusMethodNotAllowed, KindMethodNotAllowed, "%s %s: the FleetLock protocol uses POST", r.Method, r.URL.Path)
	}
	if v := r.Header.Get("fleet-lock-protocol"); v != "true" {
		return ClientParams{}, reject(http.StatusBadRequest, KindMissingHeader,
			"the header fleet-lock-protocol: true is required (got %q): it tells a FleetLock request from a redirected one", v)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return ClientParams{}, reject(http.StatusRequestEntityTooLarge, KindBodyTooLarge, "request body over %d bytes", MaxBody)
		}
		return ClientParams{}, reject(http.StatusBadRequest, KindMalformed, "reading the body: %v", err)
	}
	var req Request
	if err := json.Unmarshal(body, &req); err != nil {
		return ClientParams{}, reject(http.StatusBadRequest, KindMalformed, `the body is not the protocol's JSON {"client_params": {"id": "...", "group": "..."}}: %v`, err)
	}
	if req.ClientParams == nil {
		return ClientParams{}, reject(http.StatusBadRequest, KindMalformed, `the body has no "client_params" object`)
	}
	p := *req.ClientParams
	if p.Group == "" || !groupRE.MatchString(p.Group) {
		return p, reject(http.StatusBadRequest, KindInvalidGroup, "group %q: want a non-empty name matching ^[a-zA-Z0-9.-]+$", p.Group)
	}
	if err := registry.ValidateName("group", p.Group); err != nil {
		return p, reject(http.StatusBadRequest, KindInvalidGroup, "%v", err)
	}
	if !slices.Contains(s.cfg.Groups, p.Group) {
		return p, reject(http.StatusForbidden, KindUnknownGroup, "group %s is not one of this agent's groups (%s): set the client's group to an agentd group (Zincati: [identity] group)",
			p.Group, strings.Join(s.cfg.Groups, ", "))
	}
	if p.ID == "" {
		return p, reject(http.StatusBadRequest, KindInvalidID, "empty client id")
	}
	if err := registry.ValidateName("FleetLock client id", p.ID); err != nil {
		return p, reject(http.StatusBadRequest, KindInvalidID, "%v", err)
	}
	return p, nil
}

// preReboot takes the client's reboot slots.
func (s *server) preReboot(ctx context.Context, p ClientParams) *rejection {
	var labels map[string]string
	if s.cfg.Labels != nil {
		labels = s.cfg.Labels()
	}
	err := s.cfg.Slots.LockReboot(ctx, p.Group, p.ID, labels, s.cfg.TTL)
	var full *registry.SlotsFullError
	switch {
	case err == nil:
		s.cfg.Log.Info("FleetLock reboot slot taken", "client_id", p.ID, "group", p.Group, "ttl", s.cfg.TTL)
		return nil
	case errors.As(err, &full):
		return reject(http.StatusConflict, KindSemaphoreFull, "semaphore full: %v", full)
	default:
		return reject(http.StatusServiceUnavailable, KindUnavailable, "%v", err)
	}
}

// steadyState frees the client's reboot slots, if it holds any.
func (s *server) steadyState(ctx context.Context, p ClientParams) *rejection {
	n, err := s.cfg.Slots.UnlockReboot(ctx, p.Group, p.ID)
	if err != nil {
		return reject(http.StatusServiceUnavailable, KindUnavailable, "%v", err)
	}
	if n > 0 {
		s.cfg.Log.Info("FleetLock reboot slot freed", "client_id", p.ID, "group", p.Group, "keys", n)
	}
	return nil
}

func writeError(w http.ResponseWriter, status int, kind, value string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Error{Kind: kind, Value: value})
}
