package reconcile

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// RunState is the [X-Agentd] State= key: what the agent keeps the unit doing.
type RunState int

const (
	StateStarted RunState = iota // keep it running (the default)
	StateStopped                 // keep it stopped
	StatePresent                 // install the file, never start or stop it
)

func (s RunState) String() string {
	switch s {
	case StateStopped:
		return "stopped"
	case StatePresent:
		return "present"
	}
	return "started"
}

// Policy is a unit's [X-Agentd] section with defaults applied.
type Policy struct {
	State          RunState
	Enable         bool   // enable per [Install]
	OnChange       string // auto, restart, reload, reload-or-restart, stop-start, none
	Rollback       bool
	HealthySec     int
	MaxUnavailable int // 0: unset
	// HasInstall says the file has an [Install] section with keys, i.e.
	// there is something for `enable` to do.
	HasInstall bool
}

var onChangeValues = map[string]bool{
	"auto": true, "restart": true, "reload": true, "reload-or-restart": true, "stop-start": true, "none": true,
}

// ParsePolicy reads the [X-Agentd] section (and whether [Install] has keys)
// from a unit file. Unknown keys and bad values are errors: a typo must not
// silently change how production services are treated.
func ParsePolicy(content []byte) (Policy, error) {
	p := Policy{State: StateStarted, OnChange: "auto", Rollback: true, HealthySec: 5}
	enableSet := false
	var errs []string
	for _, kv := range iniEntries(content) {
		key, val := kv.key, kv.val
		switch kv.sec {
		case "Install":
			p.HasInstall = true
		case "X-Agentd":
			var err error
			switch key {
			case "State":
				switch val {
				case "started":
					p.State = StateStarted
				case "stopped":
					p.State = StateStopped
				case "present":
					p.State = StatePresent
				default:
					err = fmt.Errorf("bad State=%s: want started, stopped or present", val)
				}
			case "Enable":
				p.Enable, err = parseBool(val)
				enableSet = true
			case "OnChange":
				if !onChangeValues[val] {
					err = fmt.Errorf("bad OnChange=%s: want auto, restart, reload, reload-or-restart, stop-start or none", val)
				}
				p.OnChange = val
			case "Rollback":
				p.Rollback, err = parseBool(val)
			case "HealthySec":
				p.HealthySec, err = strconv.Atoi(val)
				if err != nil || p.HealthySec < 0 {
					err = fmt.Errorf("bad HealthySec=%s: want a number of seconds ≥ 0", val)
				}
			case "MaxUnavailable":
				p.MaxUnavailable, err = strconv.Atoi(val)
				if err != nil || p.MaxUnavailable < 1 {
					err = fmt.Errorf("bad MaxUnavailable=%s: want an integer ≥ 1", val)
				}
			default:
				err = fmt.Errorf("unknown key %s= (known: State, Enable, OnChange, Rollback, HealthySec, MaxUnavailable)", key)
			}
			if err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return p, fmt.Errorf("[X-Agentd]: %s", strings.Join(errs, "; "))
	}
	if !enableSet {
		p.Enable = p.HasInstall && p.State == StateStarted
	}
	return p, nil
}

func parseBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "yes", "true", "1", "on":
		return true, nil
	case "no", "false", "0", "off":
		return false, nil
	}
	return false, fmt.Errorf("%q is not a boolean (yes/no)", v)
}

// iniEntries yields (section, key, value) for every assignment in a unit
// file, following systemd's syntax closely enough for policy keys:
// comments, blank lines and backslash continuations.
type iniEntry struct{ sec, key, val string }

func iniEntries(content []byte) []iniEntry {
	var out []iniEntry
	{
		sc := bufio.NewScanner(bytes.NewReader(content))
		sc.Buffer(make([]byte, 0, 4096), MaxValueSize+1)
		sec := ""
		var cont strings.Builder
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if cont.Len() == 0 {
				if line == "" || line[0] == '#' || line[0] == ';' {
					continue
				}
				if line[0] == '[' && strings.HasSuffix(line, "]") {
					sec = line[1 : len(line)-1]
					continue
				}
			} else if line != "" && (line[0] == '#' || line[0] == ';') {
				continue // systemd skips comments inside a continuation
			}
			if strings.HasSuffix(line, "\\") {
				cont.WriteString(strings.TrimSuffix(line, "\\"))
				cont.WriteByte(' ')
				continue
			}
			cont.WriteString(line)
			full := cont.String()
			cont.Reset()
			key, val, ok := strings.Cut(full, "=")
			if !ok {
				continue
			}
			out = append(out, iniEntry{sec, strings.TrimSpace(key), strings.TrimSpace(val)})
		}
	}
	return out
}
