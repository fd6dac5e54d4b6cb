package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/agentd/agentd/selector"
)

// An agent publishes labels with its membership (reconcile.Member.Labels):
// those the operator gives (agentd run --label K=V, AGENTD_LABEL, and the
// labels file, labelsfile.go) and the facts it reads off its host
// (factKeys). `agentd hosts --selector` picks hosts by them; currentLabels
// holds them as they stand.

// The facts: labels an agent reads off its host. A given label may not
// carry one of their keys.
const (
	factArch           = "arch"            // runtime.GOARCH, in the usual names (archName)
	factHostname       = "hostname"        // the kernel's host name
	factOSID           = "os.id"           // ID= of os-release(5)
	factOSVersionID    = "os.version_id"   // VERSION_ID= of os-release(5)
	factSystemdVersion = "systemd.version" // the service manager's version
)

var factKeys = []string{factArch, factHostname, factOSID, factOSVersionID, factSystemdVersion}

// osReleasePaths are where os-release(5) says to look, in order.
var osReleasePaths = []string{"/etc/os-release", "/usr/lib/os-release"}

// parseLabels checks the given labels (--label K=V, repeatable): each a
// valid label, none given twice, none with a fact's key. An error names
// the bad label.
func parseLabels(given []string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range given {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want KEY=VALUE", kv)
		}
		if err := checkLabel(k, v); err != nil {
			return nil, err
		}
		if old, dup := labels[k]; dup {
			return nil, fmt.Errorf("label %s given twice (%s=%s, %s)", k, k, old, kv)
		}
		labels[k] = v
	}
	return labels, nil
}

// checkLabel checks one given label (--label, the labels file): a valid
// label whose key is no fact's. The error names the key or value.
func checkLabel(k, v string) error {
	if err := selector.Validate(k, v); err != nil {
		return err
	}
	if slices.Contains(factKeys, k) {
		return fmt.Errorf("label %s is the host's own fact (the agent publishes %s itself)", k, strings.Join(factKeys, ", "))
	}
	return nil
}

// labelFlag is --label: a string slice (KEY=VALUE,… from AGENTD_LABEL,
// like every slice flag) whose every Set checks the labels so far, so a
// bad one is refused naming where it came from (the command line, the
// environment, the env file). newAgentRun checks them again: an agent a
// test starts in-process sets them without the flag.
type labelFlag struct{ pflag.Value }

func (f labelFlag) Set(s string) error {
	if err := f.Value.Set(s); err != nil {
		return err
	}
	_, err := parseLabels(f.Value.(pflag.SliceValue).GetSlice())
	return err
}

// hostFacts reads the facts of this host: its architecture and host name,
// its os-release (the os.* facts are absent without one) and the service
// manager's version (absent when 0: not known). A fact that is not a valid
// label value is left out with a warning.
func hostFacts(systemdVersion int, log *slog.Logger) map[string]string {
	facts := map[string]string{factArch: archName(runtime.GOARCH)}
	if h, err := os.Hostname(); err == nil {
		facts[factHostname] = h
	}
	if systemdVersion > 0 {
		facts[factSystemdVersion] = strconv.Itoa(systemdVersion)
	}
	for _, p := range osReleasePaths {
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			log.Warn("os-release unreadable: the os.* labels are left out", "path", p, "err", err)
			break
		}
		rel := parseOSRelease(b)
		for fact, field := range map[string]string{factOSID: "ID", factOSVersionID: "VERSION_ID"} {
			if v, ok := rel[field]; ok {
				facts[fact] = v
			}
		}
		break
	}
	for _, k := range slices.Sorted(maps.Keys(facts)) {
		if err := selector.ValidateValue(facts[k]); err != nil {
			log.Warn("a fact is not a valid label value: the label is left out", "label", k, "err", err)
			delete(facts, k)
		}
	}
	return facts
}

// archName is GOARCH in the names distributions and Kubernetes use
// (amd64, arm64, ppc64le, s390x, riscv64…), which are Go's but for 386.
func archName(goarch string) string {
	if goarch == "386" {
		return "i386"
	}
	return goarch
}

// parseOSRelease reads os-release(5): KEY=VALUE lines, the value maybe
// quoted (shell-style, with \-escapes in double quotes); comments and
// lines that are not assignments are skipped.
func parseOSRelease(b []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch {
		case len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'':
			v = v[1 : len(v)-1]
		case len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"':
			v = v[1 : len(v)-1]
			var sb strings.Builder
			for i := 0; i < len(v); i++ {
				if v[i] == '\\' && i+1 < len(v) && strings.IndexByte("\"\\$`", v[i+1]) >= 0 {
					i++
				}
				sb.WriteByte(v[i])
			}
			v = sb.String()
		}
		out[strings.TrimSpace(k)] = v
	}
	return out
}

// describeLabels is the LABELS column of `agentd hosts`: "k=v,…", the
// given labels first, then the facts, each sorted by key; past width
// characters the rest is counted ("+3").
func describeLabels(labels map[string]string, width int) string {
	if len(labels) == 0 {
		return "-"
	}
	keys := slices.SortedFunc(maps.Keys(labels), func(a, b string) int {
		if fa, fb := slices.Contains(factKeys, a), slices.Contains(factKeys, b); fa != fb {
			if fa {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	var sb strings.Builder
	for i, k := range keys {
		kv := k + "=" + labels[k]
		need := sb.Len() + len(kv)
		if i > 0 {
			need++ // the comma
		}
		if rest := len(keys) - i - 1; rest > 0 {
			need += len(fmt.Sprintf(" +%d", rest)) // room to count the rest after this one
		}
		if i > 0 && need > width {
			fmt.Fprintf(&sb, " +%d", len(keys)-i)
			break
		}
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(kv)
	}
	return sb.String()
}
