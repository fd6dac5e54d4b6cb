// Package selector says what a host label is and picks hosts by their
// labels: Parse reads a selector in Kubernetes' label selector syntax
// ("env=prod,rack in (r1,r2),!draining"), Matches evaluates it against one
// host's labels, String gives its canonical form. ValidateKey and
// ValidateValue check labels the way Kubernetes does, so a label an agent
// publishes can always be selected.
//
// The package is pure (no I/O, no clock, standard library only). A
// Selector is immutable once parsed: safe for concurrent use.
package selector

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Length limits of Kubernetes labels.
const (
	maxNameLen   = 63  // a key's name, a value
	maxPrefixLen = 253 // a key's DNS-subdomain prefix
)

// ValidateKey checks a label key: an optional prefix, a DNS subdomain
// (lowercase letters, digits, '-' and '.', at most 253 characters) followed
// by "/", then a name of at most 63 letters, digits, '-', '_' and '.' that
// starts and ends with a letter or digit ("rack", "os.id",
// "example.com/tier").
func ValidateKey(key string) error {
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	if hasPrefix {
		if prefix == "" {
			return fmt.Errorf("label key %q: empty prefix before \"/\"", key)
		}
		if err := checkSubdomain(prefix); err != nil {
			return fmt.Errorf("label key %q: prefix %w", key, err)
		}
	}
	if name == "" {
		return fmt.Errorf("label key %q: empty name", key)
	}
	if err := checkName(name); err != nil {
		return fmt.Errorf("label key %q: name %w", key, err)
	}
	return nil
}

// ValidateValue checks a label value: empty, or at most 63 letters,
// digits, '-', '_' and '.' that start and end with a letter or digit.
func ValidateValue(value string) error {
	if value == "" {
		return nil
	}
	if err := checkName(value); err != nil {
		return fmt.Errorf("label value %q: %w", value, err)
	}
	return nil
}

// Validate checks one label, key and value.
func Validate(key, value string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	return ValidateValue(value)
}

// checkName checks a key's name or a non-empty value.
func checkName(s string) error {
	if len(s) > maxNameLen {
		return fmt.Errorf("is %d characters long, at most %d allowed", len(s), maxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isAlnum(c):
		case c == '-' || c == '_' || c == '.':
			if i == 0 || i == len(s)-1 {
				return fmt.Errorf("must start and end with a letter or digit, not %q", c)
			}
		default:
			r, _ := utf8.DecodeRuneInString(s[i:])
			return fmt.Errorf("has %q at %d: only letters, digits, '-', '_' and '.' allowed", r, i+1)
		}
	}
	return nil
}

// checkSubdomain checks a DNS-1123 subdomain: dot-separated labels of
// lowercase letters, digits and '-', each starting and ending with a
// letter or digit.
func checkSubdomain(s string) error {
	if len(s) > maxPrefixLen {
		return fmt.Errorf("is %d characters long, at most %d allowed", len(s), maxPrefixLen)
	}
	for part := range strings.SplitSeq(s, ".") {
		if part == "" {
			return fmt.Errorf("%q: an empty part between dots", s)
		}
		for i := 0; i < len(part); i++ {
			c := part[i]
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			case c == '-' && i > 0 && i < len(part)-1:
			default:
				r, _ := utf8.DecodeRuneInString(part[i:])
				return fmt.Errorf("%q: want a DNS subdomain (lowercase letters, digits, '-' inside and '.'), not %q", s, r)
			}
		}
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
