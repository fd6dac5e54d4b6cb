package mirror

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agentd/agentd/calendar"
	"github.com/agentd/agentd/rollout"
)

// rolloutKeys are the keys rollout.toml takes, each with the form of its
// value, for the error that names an unknown one.
var rolloutKeys = map[string]string{
	"canary":             `a number of hosts (1) or a percentage ("10%")`,
	"waves":              `a list of cumulative counts: [1, "25%", "100%"]`,
	"soak":               `a duration ("10m")`,
	"max_unavailable":    `a number of hosts (2) or a percentage ("20%")`,
	"pause_after_canary": "true or false",
	"waves_by":           `a label key, or the key and the waves' order: "rack" or "zone=a,b,c"`,
	"success_threshold":  `a percentage of a wave's hosts: "90%"`,
	"budget_by":          `a label key: "rack" (max_unavailable is then a budget per rack)`,
	"window":             `a maintenance window: "Tue 02:00-04:00 Europe/Berlin" or "Sat *-*-01 00:00 UTC for 4h"`,
}

// ParseRollout reads a group's rollout.toml: the options of `unit put
// --group`'s rollout flags, as TOML `key = value` lines (a subset of TOML:
// strings without escapes, whole numbers, booleans, one-line arrays;
// # comments). It is strict: an unknown key, a repeated key, a section or
// a value of the wrong form is an error naming the line, since a typo
// ignored would roll a change out faster than its author meant. The
// strategy is validated as the flags' is (rollout.Strategy.Validate).
func ParseRollout(b []byte) (rollout.Strategy, error) {
	s := rollout.Strategy{MaxRestarts: -1} // -1: off, as --max-restarts' default
	seen := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	n := 0
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("line %d: %s", n, fmt.Sprintf(format, args...)))
	}
	for sc.Scan() {
		n++
		line := strings.TrimSpace(stripComment(sc.Text()))
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "[") {
			fail("%s: sections are not taken; write the keys at the top level", line)
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			fail("%q: want key = value", line)
			continue
		}
		if _, known := rolloutKeys[k]; !known {
			fail("unknown key %q (known: budget_by, canary, max_unavailable, pause_after_canary, soak, success_threshold, waves, waves_by, window)", k)
			continue
		}
		if first, dup := seen[k]; dup {
			fail("%s given again (first on line %d)", k, first)
			continue
		}
		seen[k] = n
		if err := setRollout(&s, k, v); err != nil {
			fail("%s: %v (want %s)", k, err, rolloutKeys[k])
		}
	}
	if err := sc.Err(); err != nil {
		return s, err
	}
	if len(errs) == 0 {
		if err := s.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return s, errors.Join(errs...)
}

func setRollout(s *rollout.Strategy, k, v string) error {
	switch k {
	case "canary", "max_unavailable":
		c, err := parseCount(k, v)
		if err != nil {
			return err
		}
		if k == "canary" {
			s.Canary = c
		} else {
			s.MaxUnavailable = c
		}
	case "waves":
		if len(v) < 2 || v[0] != '[' || v[len(v)-1] != ']' || strings.TrimSpace(v[1:len(v)-1]) == "" {
			return fmt.Errorf("%s is not a list of counts", v)
		}
		inner := v[1 : len(v)-1]
		for part := range strings.SplitSeq(inner, ",") {
			c, err := parseCount("a wave", strings.TrimSpace(part))
			if err != nil {
				return err
			}
			s.Waves = append(s.Waves, c)
		}
	case "soak":
		str, err := unquote(v)
		if err != nil {
			return err
		}
		d, err := time.ParseDuration(str)
		if err != nil {
			return err
		}
		s.Soak = d
	case "pause_after_canary":
		if v != "true" && v != "false" {
			return fmt.Errorf("%s is not true or false", v)
		}
		s.PauseAfterCanary = v == "true"
	case "window":
		str, err := unquote(v)
		if err != nil {
			return err
		}
		w, err := calendar.ParseWindow(str)
		if err != nil {
			return err
		}
		s.Window = &w
	case "budget_by":
		str, err := unquote(v)
		if err != nil {
			return err
		}
		s.BudgetBy = strings.TrimSpace(str) // checked by Validate
	case "waves_by", "success_threshold":
		str, err := unquote(v)
		if err != nil {
			return err
		}
		if k == "waves_by" {
			s.WavesBy, s.WavesByOrder, err = rollout.ParseWavesBy("waves_by", str)
		} else {
			s.SuccessThreshold, err = rollout.ParseThreshold("success_threshold", str)
		}
		return err
	}
	return nil
}

// parseCount reads 3 or "10%" (or "3").
func parseCount(what, v string) (rollout.Count, error) {
	if strings.HasPrefix(v, `"`) {
		str, err := unquote(v)
		if err != nil {
			return rollout.Count{}, err
		}
		v = str
	}
	return rollout.ParseCount(what, v)
}

// unquote reads a TOML basic string without escapes.
func unquote(v string) (string, error) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", fmt.Errorf("%s is not a quoted string", v)
	}
	s := v[1 : len(v)-1]
	if strings.ContainsAny(s, `"\`) {
		return "", fmt.Errorf("%s: escapes and inner quotes are not taken", v)
	}
	return s, nil
}

// stripComment drops a # comment that is not inside a string.
func stripComment(line string) string {
	in := false
	for i, r := range line {
		switch {
		case r == '"':
			in = !in
		case r == '#' && !in:
			return line[:i]
		}
	}
	return line
}
