package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentd/agentd/reconcile"
)

// confirmFlag is `unit put --confirm DUR`: sugar for [X-Agentd]
// ConfirmSec=DUR in each unit file of the put, written into the file before
// anything else sees it, so what is stored, signed, previewed (--dry-run)
// and diffed is the file with the line.
type confirmFlag struct {
	span string
}

func (f *confirmFlag) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.span, "confirm", "", "commit-confirmed apply: set ConfirmSec=DUR in the [X-Agentd] section of each unit file put "+
		"(the section added if absent, a ConfirmSec= line replaced): after applying the change, each host must renew its lease, "+
		"read and write the registry within DUR, or it puts the previous version back (\"rolled-back: lost control plane\"). "+
		"DUR is a time span as systemd takes it (30s, 1min 30s; 0: off). Drop-ins take their unit file's policy: put the unit file with them")
}

// apply sets ConfirmSec= in every unit file of units (a key that is a
// unit's own file, not a drop-in or an empty instance key) when --confirm
// was given. A bad span, a put without a unit file, or a file the line
// makes invalid (ConfirmSec= needs State=started) is a usage error (exit
// 2): nothing is stored.
func (f *confirmFlag) apply(cmd *cobra.Command, units map[string][]byte) error {
	if !cmd.Flags().Changed("confirm") {
		return nil
	}
	span := strings.TrimSpace(f.span)
	if strings.ContainsAny(span, "\r\n") {
		return withCode(exitUsage, fmt.Errorf("--confirm %q: one line, a time span such as 30s", f.span))
	}
	if _, err := reconcile.ParsePolicy([]byte("[X-Agentd]\nConfirmSec=" + span + "\n")); err != nil {
		return withCode(exitUsage, fmt.Errorf("--confirm %s: %w", f.span, err))
	}
	n := 0
	for _, key := range slices.Sorted(maps.Keys(units)) {
		_, unit, err := reconcile.ParseKey(key)
		if err != nil || key != unit || units[key] == nil {
			continue
		}
		b := setConfirmSec(units[key], span)
		if err := checkUnitFile(key, b); err != nil {
			return withCode(exitUsage, fmt.Errorf("--confirm %s: %s: %w", f.span, key, err))
		}
		units[key] = b
		n++
	}
	if n == 0 {
		return withCode(exitUsage, errors.New("--confirm: this put has no unit file to set ConfirmSec= in (drop-ins and instances take their unit file's policy): "+
			"put the unit file too, or write ConfirmSec= in its [X-Agentd] section"))
	}
	return nil
}

// setConfirmSec returns content with ConfirmSec=span as the first line of
// its [X-Agentd] section, every other ConfirmSec= line of that section
// dropped; a file without the section gets it at its end. Line endings
// follow the file's (CRLF when it has any).
func setConfirmSec(content []byte, span string) []byte {
	nl := "\n"
	if bytes.Contains(content, []byte("\r\n")) {
		nl = "\r\n"
	}
	line := "ConfirmSec=" + span + nl
	var out bytes.Buffer
	in, done := false, false
	for l := range bytes.Lines(content) {
		t := bytes.TrimSpace(l)
		if len(t) > 1 && t[0] == '[' && t[len(t)-1] == ']' {
			in = string(t) == "[X-Agentd]"
			out.Write(l)
			if in && !done {
				if !bytes.HasSuffix(l, []byte("\n")) {
					out.WriteString(nl)
				}
				out.WriteString(line)
				done = true
			}
			continue
		}
		if in && isConfirmSecLine(t) {
			continue
		}
		out.Write(l)
	}
	if !done {
		if out.Len() > 0 && !bytes.HasSuffix(out.Bytes(), []byte("\n")) {
			out.WriteString(nl)
		}
		out.WriteString("[X-Agentd]" + nl + line)
	}
	return out.Bytes()
}

// isConfirmSecLine says whether a trimmed line assigns ConfirmSec=.
func isConfirmSecLine(t []byte) bool {
	rest, ok := bytes.CutPrefix(t, []byte("ConfirmSec"))
	return ok && bytes.HasPrefix(bytes.TrimLeft(rest, " \t"), []byte("="))
}
