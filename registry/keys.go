package registry

import (
	"errors"
	"fmt"
	"strings"

	"github.com/agentd/agentd/reconcile"
)

// DefaultPrefix is the key prefix used when none is configured.
const DefaultPrefix = "/agentd"

var (
	// ErrNotFound is returned (wrapped) when a unit key does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalid is returned (wrapped) for a malformed host, group, unit
	// name or target.
	ErrInvalid = errors.New("invalid")
	// ErrHostTaken is returned (wrapped) by Join and Report when a live
	// agent with a different machine ID holds the host name.
	ErrHostTaken = errors.New("host name held by another live agent")
	// ErrSessionClosed is returned by Report after Close.
	ErrSessionClosed = errors.New("session closed")
)

// Target is where unit keys live: exactly one of Host and Group is set.
type Target struct {
	Host  string
	Group string
}

// Validate checks that exactly one of Host and Group is set and valid.
func (t Target) Validate() error {
	switch {
	case t.Host != "" && t.Group != "":
		return fmt.Errorf("%w target: both host %q and group %q set; give exactly one", ErrInvalid, t.Host, t.Group)
	case t.Host != "":
		return ValidateName("host", t.Host)
	case t.Group != "":
		return ValidateName("group", t.Group)
	}
	return fmt.Errorf("%w target: neither host nor group set; give exactly one", ErrInvalid)
}

// Scope is reconcile.ScopeGroup when Group is set, else ScopeHost.
func (t Target) Scope() reconcile.Scope {
	if t.Group != "" {
		return reconcile.ScopeGroup
	}
	return reconcile.ScopeHost
}

// String is "hosts/<host>" or "groups/<group>", the key segment of the target.
func (t Target) String() string {
	if t.Group != "" {
		return "groups/" + t.Group
	}
	return "hosts/" + t.Host
}

// ValidateName checks a host or group name used as a key segment: 1–253
// characters from [A-Za-z0-9._-], not containing "..". kind ("host",
// "group") is used in the error message.
func ValidateName(kind, name string) error {
	if name == "" {
		return fmt.Errorf("%w %s name: empty", ErrInvalid, kind)
	}
	if len(name) > 253 {
		return fmt.Errorf("%w %s name %.20q…: longer than 253 characters", ErrInvalid, kind, name)
	}
	if strings.Contains(name, "..") || name == "." {
		return fmt.Errorf("%w %s name %q: must not be \".\" or contain \"..\"", ErrInvalid, kind, name)
	}
	for _, r := range name {
		if !isAlnum(r) && r != '.' && r != '_' && r != '-' {
			return fmt.Errorf("%w %s name %q: character %q not allowed (use A-Z a-z 0-9 . _ -)", ErrInvalid, kind, name, r)
		}
	}
	return nil
}

func isAlnum(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}

// ValidateUnit checks a unit key suffix — a unit name such as
// "hello.service" or "hello@1.service", or a drop-in "<unit>.d/<name>.conf" —
// with reconcile.ParseKey, the rule the agent applies to the same key: what
// the agent would block is refused here before it is written. The error
// wraps ErrInvalid and the reconcile error (reconcile.ErrReserved for a unit
// on the deny-list).
func ValidateUnit(unit string) error {
	if _, _, err := reconcile.ParseKey(unit); err != nil {
		return &invalidUnitError{err}
	}
	return nil
}

// invalidUnitError reads as the shared validator's message and is both
// ErrInvalid and that error.
type invalidUnitError struct{ err error }

func (e *invalidUnitError) Error() string   { return e.err.Error() }
func (e *invalidUnitError) Unwrap() []error { return []error{ErrInvalid, e.err} }

// isUnitType reports whether s is a unit type agentd manages ("service").
func isUnitType(s string) bool { return reconcile.SupportedType(s) }

// Key layout. All functions expect validated names.

func (c *Client) hostsRoot() string              { return c.prefix + "/hosts/" }
func (c *Client) groupsRoot() string             { return c.prefix + "/groups/" }
func (c *Client) agentsRoot() string             { return c.prefix + "/agents/" }
func (c *Client) statusRoot() string             { return c.prefix + "/status/" }
func (c *Client) hostUnits(host string) string   { return c.hostsRoot() + host + "/units/" }
func (c *Client) groupUnits(group string) string { return c.groupsRoot() + group + "/units/" }
func (c *Client) agentKey(host string) string    { return c.agentsRoot() + host }
func (c *Client) hostStatus(host string) string  { return c.statusRoot() + host + "/" }
func (c *Client) factsRoot() string              { return c.prefix + "/facts/" }
func (c *Client) factsKey(host string) string    { return c.factsRoot() + host }

func (c *Client) targetUnits(t Target) string {
	if t.Group != "" {
		return c.groupUnits(t.Group)
	}
	return c.hostUnits(t.Host)
}

// parseUnitKey splits "<p>/hosts/<h>/units/<unit>" or
// "<p>/groups/<g>/units/<unit>" into its parts; ok is false for any other key.
func (c *Client) parseUnitKey(key string) (t Target, unit string, ok bool) {
	return c.parseTargetKey(key, "/units/")
}

// parseTargetKey splits "<p>/hosts/<h><sep><unit>" or
// "<p>/groups/<g><sep><unit>" into its parts; ok is false for any other key.
func (c *Client) parseTargetKey(key, sep string) (t Target, unit string, ok bool) {
	var rest string
	group := false
	if r, found := strings.CutPrefix(key, c.hostsRoot()); found {
		rest = r
	} else if r, found := strings.CutPrefix(key, c.groupsRoot()); found {
		rest, group = r, true
	} else {
		return Target{}, "", false
	}
	name, unit, found := strings.Cut(rest, sep)
	if !found || name == "" || unit == "" || strings.Contains(name, "/") {
		return Target{}, "", false
	}
	if group {
		t.Group = name
	} else {
		t.Host = name
	}
	return t, unit, true
}
