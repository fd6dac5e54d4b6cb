package logging

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestJournalKey(t *testing.T) {
	for in, want := range map[string]string{
		"unit":                  "OBJECT_SYSTEMD_UNIT",
		"action":                "AGENTD_ACTION",
		"result":                "AGENTD_RESULT",
		"reason":                "AGENTD_REASON",
		"err":                   "AGENTD_ERROR",
		"hash":                  "AGENTD_HASH",
		"old_hash":              "AGENTD_OLD_HASH",
		"new_hash":              "AGENTD_NEW_HASH",
		"retry_in":              "AGENTD_RETRY_IN",
		"unit-dir":              "AGENTD_UNIT_DIR",
		"a.b":                   "AGENTD_A_B",
		"host":                  "AGENTD_HOST",
		"ünïcode":               "AGENTD__N_CODE",
		strings.Repeat("x", 80): "AGENTD_" + strings.Repeat("X", 57),
	} {
		if got := JournalKey(in); got != want {
			t.Errorf("JournalKey(%q) = %q, want %q", in, got, want)
		}
	}
}

// Every key ReplaceAttr produces must be one journald keeps.
func TestReplaceAttrKeysAreValidJournalFields(t *testing.T) {
	valid := regexp.MustCompile(`^[A-Z][A-Z0-9_]{0,63}$`)
	for _, k := range []string{"unit", "err", "x", "_private", "9lives", "", "a/b", "hash", "Mixed.Case-key"} {
		for _, groups := range [][]string{nil, {"g"}} {
			a := ReplaceAttr(groups, slog.String(k, "v"))
			if !valid.MatchString(a.Key) {
				t.Errorf("ReplaceAttr(%v, %q) key = %q: journald would drop it", groups, k, a.Key)
			}
		}
	}
	if g := sanitize("etcd.client"); g != "ETCD_CLIENT" {
		t.Errorf("group name %q", g)
	}
}

func TestReplaceAttrValuesForHumans(t *testing.T) {
	if a := ReplaceAttr(nil, slog.Duration("retry_in", 250*time.Millisecond)); a.Value.String() != "250ms" {
		t.Errorf("duration = %q", a.Value.String())
	}
	ts := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if a := ReplaceAttr(nil, slog.Time("at", ts)); a.Value.String() != "2026-01-02T03:04:05Z" {
		t.Errorf("time = %q", a.Value.String())
	}
}

// Outside the journal (tests, a terminal) New writes text to out.
func TestNewWritesTextOutsideTheJournal(t *testing.T) {
	var buf bytes.Buffer
	log := New(slog.LevelInfo, &buf)
	log.Debug("hidden")
	log.Warn("drift", "unit", "hello.service")
	if got := buf.String(); strings.Contains(got, "hidden") || !strings.Contains(got, "level=WARN msg=drift unit=hello.service") {
		t.Errorf("text output = %q", got)
	}
}
