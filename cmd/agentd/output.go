package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// The commands' shared output: JSON, and the short forms of hashes, empty
// fields, details and durations in tables and messages.

// writeJSON writes v as one indented JSON document.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeJSONLine writes v as one JSON line (the --json output of commands
// that report events).
func writeJSONLine(w io.Writer, v any) {
	_ = json.NewEncoder(w).Encode(v)
}

// say writes v as a JSON line with asJSON, else the text format makes.
func say(out io.Writer, asJSON bool, v any, format string, args ...any) {
	if asJSON {
		writeJSONLine(out, v)
		return
	}
	fmt.Fprintf(out, format, args...)
}

// short is a hash (or machine ID) cut to its first 12 characters.
func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// orDash is s, or "-" for an empty table cell.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// prefixed is " — s", or nothing for an empty detail.
func prefixed(s string) string {
	if s == "" {
		return ""
	}
	return " — " + s
}

// ago is a duration as "12 s", "5 min", "3 h" or "4 days".
func ago(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h", int(d.Hours()))
	}
	return fmt.Sprintf("%d days", int(d.Hours()/24))
}
