// Package logging builds agentd's *slog.Logger: structured records into the
// systemd journal when the process runs under systemd with its stderr
// connected to the journal, plain text on stderr otherwise.
//
// In the journal every attribute becomes a field. journald silently drops
// keys that are not [A-Z0-9_] (and keys starting with "_"), so keys are
// mapped: "unit" → OBJECT_SYSTEMD_UNIT (systemd's field for "this message is
// about that unit": `journalctl -u hello.service` then shows agentd's
// messages about hello.service, since agentd runs as root), "err" →
// AGENTD_ERROR, and every other key k → AGENTD_<K> with anything outside
// [A-Z0-9_] turned into "_" (see [JournalKey]). Levels become priorities:
// Error → err (3), Warn → warning (4), Info → info (6), Debug → debug (7).
//
// Loggers are safe for concurrent use.
package logging

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
	slogjournal "github.com/systemd/slog-journal"
)

// New returns a logger at level. With out nil (or os.Stderr) and stderr
// connected to the journal (systemd's $JOURNAL_STREAM), records go to the
// journal with structured fields; otherwise they are written as text to out
// (os.Stderr when nil).
func New(level slog.Leveler, out io.Writer) *slog.Logger {
	if out == nil {
		out = os.Stderr
	}
	if out == os.Stderr {
		if ok, _ := journal.StderrIsJournalStream(); ok {
			if h, err := NewJournalHandler(level); err == nil {
				return slog.New(h)
			}
		}
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
}

// NewJournalHandler returns a handler that sends records to the local
// journal socket with keys mapped by [JournalKey]. Without a journal every
// record is silently lost: use [New], which checks first.
func NewJournalHandler(level slog.Leveler) (slog.Handler, error) {
	return slogjournal.NewHandler(&slogjournal.Options{
		Level:        level,
		ReplaceAttr:  ReplaceAttr,
		ReplaceGroup: sanitize,
	})
}

// ReplaceAttr maps an attribute to its journal field (see [JournalKey]) and
// renders durations and times for humans ("250ms", RFC 3339) instead of the
// journal handler's bare microseconds. Attributes inside a group keep their
// sanitized key under the group's prefix.
func ReplaceAttr(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 {
		a.Key = JournalKey(a.Key)
	} else {
		a.Key = sanitize(a.Key)
	}
	switch a.Value.Kind() {
	case slog.KindDuration:
		a.Value = slog.StringValue(a.Value.Duration().String())
	case slog.KindTime:
		a.Value = slog.StringValue(a.Value.Time().Format(time.RFC3339Nano))
	}
	return a
}

// fields are the keys with a name of their own in the journal.
var fields = map[string]string{
	"unit":     "OBJECT_SYSTEMD_UNIT",
	"action":   "AGENTD_ACTION",
	"result":   "AGENTD_RESULT",
	"reason":   "AGENTD_REASON",
	"err":      "AGENTD_ERROR",
	"error":    "AGENTD_ERROR",
	"hash":     "AGENTD_HASH",
	"old_hash": "AGENTD_OLD_HASH",
	"new_hash": "AGENTD_NEW_HASH",
}

// JournalKey is the journal field name for a top-level attribute key:
// "unit" → OBJECT_SYSTEMD_UNIT, "err" → AGENTD_ERROR, any other k →
// AGENTD_<K> upper-cased with characters outside [A-Z0-9_] replaced by "_"
// ("retry_in" → AGENTD_RETRY_IN, "unit-dir" → AGENTD_UNIT_DIR). Journal field
// names are at most 64 characters; longer ones are cut.
func JournalKey(k string) string {
	if f, ok := fields[k]; ok {
		return f
	}
	return truncate("AGENTD_" + upper(k))
}

// sanitize makes k a valid journal field name on its own.
func sanitize(k string) string {
	s := upper(k)
	if s == "" || s[0] == '_' || ('0' <= s[0] && s[0] <= '9') {
		s = "X" + s // journald drops keys starting with "_"; a digit is invalid
	}
	return truncate(s)
}

// upper upper-cases k and replaces every character outside [A-Z0-9_] by "_".
func upper(k string) string {
	var b strings.Builder
	for _, c := range k {
		switch {
		case 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_':
			b.WriteRune(c)
		case 'a' <= c && c <= 'z':
			b.WriteRune(c - 'a' + 'A')
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}
