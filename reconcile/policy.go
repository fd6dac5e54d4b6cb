package reconcile

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/unit"

	"github.com/agentd/agentd/selector"
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
	State    RunState
	Enable   bool   // enable per [Install]
	OnChange string // auto, restart, reload, reload-or-restart, stop-start, none
	Rollback bool
	// Healthy is HealthySec=: how long a (re)started unit must stay active
	// to count as healthy. A time span as systemd reads one (ParseTimespan).
	Healthy time.Duration
	// SlotLimit is [X-Agentd] MaxUnavailable=: the size of the unit's
	// disruption semaphore in its scope (slots.go) — at most SlotLimit
	// hosts of a group take a disruptive step on it at once. Not the
	// rollout's MaxUnavailable (rollout.Strategy), how many hosts a
	// progressive rollout admits at once. 0: unset.
	SlotLimit int
	// SlotBy is [X-Agentd] MaxUnavailableBy=: a host label key (valid by
	// selector.ValidateKey) that splits the semaphore into one per value
	// of the label (Bucket, BucketOf): at most SlotLimit hosts of each
	// rack at once, racks in parallel. "": one semaphore for the scope.
	// Set only with SlotLimit.
	SlotBy string
	// Confirm is ConfirmSec=: after the agent applies a change of the unit,
	// it must prove within this span that it still reaches its control
	// plane (Config.Confirmer), else it puts the previous version back
	// (confirm.go). 0: off.
	Confirm time.Duration
	// Probe is the health probes (HealthCmd=, HealthURL=, HealthTCP=, …):
	// checked during HealthySec and after it (see probe.go).
	Probe Probes
	// RestartTriggers and ReloadTriggers are config files of the unit's set
	// (configfile.go) whose change restarts or reloads it, as Home
	// Manager's X-Restart-Triggers=; a config file no trigger names is
	// written without touching the unit. Absolute paths, checked to be in
	// the set (checkTriggers). Space-separated, so that a Policy stays
	// comparable (sameDesired).
	RestartTriggers, ReloadTriggers string
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
//
// A file the unit parser cannot read (go-systemd refuses some files systemd
// loads: a line over 2048 bytes, a comment line inside a continuation, a
// line without "=") is not refused for that alone: without an [X-Agentd]
// section header it gets the default policy (HasInstall from a plain scan
// of the [Install] section); with one it is an error, since the policy it
// asks for cannot be known.
func ParsePolicy(content []byte) (Policy, error) {
	p := Policy{State: StateStarted, OnChange: "auto", Rollback: true, Healthy: DefaultHealthy}
	opts, err := unitOptions(content)
	if err != nil {
		if hasSectionHeader(content, "X-Agentd") {
			return p, fmt.Errorf("[X-Agentd]: the section could not be read: the unit file parser stopped with %q "+
				"(it refuses lines over %d bytes, comment lines inside a continued value and lines without \"=\"); fix those lines",
				err.Error(), unit.SYSTEMD_LINE_MAX)
		}
		p.HasInstall = scanHasInstall(content)
		p.Enable = p.HasInstall
		return p, nil
	}
	enableSet := false
	var errs []string
	var user, group string // [Service] User=, Group=: whom HealthCmd= runs as
	for _, o := range opts {
		key, val := o.Name, optionValue(o.Value)
		switch o.Section {
		case "Install":
			p.HasInstall = true
		case "Service":
			switch key {
			case "User":
				user = val
			case "Group":
				group = val
			}
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
				p.Healthy, err = parseHealthy(val)
			case "ConfirmSec":
				p.Confirm, err = parseConfirm(val)
			case "MaxUnavailable":
				p.SlotLimit, err = strconv.Atoi(val)
				if err != nil || p.SlotLimit < 1 {
					err = fmt.Errorf("bad MaxUnavailable=%s: want an integer ≥ 1", val)
				}
			case "MaxUnavailableBy":
				p.SlotBy, err = parseSlotBy(val)
			case "RestartTriggers":
				p.RestartTriggers, err = parseTriggers(p.RestartTriggers, key, val)
			case "ReloadTriggers":
				p.ReloadTriggers, err = parseTriggers(p.ReloadTriggers, key, val)
			default:
				var known bool
				known, err = parseProbeKey(&p.Probe, key, val)
				switch {
				case known:
				case strings.HasPrefix(key, "Health"):
					err = fmt.Errorf("unknown key %s= (the health keys are HealthySec and the probes' %s)", key, probeKeys)
				default:
					err = fmt.Errorf("unknown key %s= (known: State, Enable, OnChange, Rollback, HealthySec, ConfirmSec, MaxUnavailable, MaxUnavailableBy, RestartTriggers, ReloadTriggers, %s)", key, probeKeys)
				}
			}
			if err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	errs = append(errs, checkProbes(p.Probe, p.State)...)
	if p.SlotBy != "" && p.SlotLimit == 0 {
		errs = append(errs, fmt.Sprintf("MaxUnavailableBy=%s needs MaxUnavailable=: it says how many hosts of each %s may restart the unit at once (e.g. MaxUnavailable=1)", p.SlotBy, p.SlotBy))
	}
	if p.Confirm > 0 && p.State != StateStarted {
		errs = append(errs, "ConfirmSec= needs State=started: an unconfirmed change is put back with a restart")
	}
	if len(errs) > 0 {
		return p, fmt.Errorf("[X-Agentd]: %s", strings.Join(errs, "; "))
	}
	if p.Probe.Cmd != "" {
		p.Probe.User, p.Probe.Group = user, group
	}
	if !enableSet {
		p.Enable = p.HasInstall && p.State == StateStarted
	}
	return p, nil
}

// parseSlotBy reads MaxUnavailableBy=: one host label key, by the rules of
// the labels agents publish (selector.ValidateKey).
func parseSlotBy(val string) (string, error) {
	if val == "" {
		return "", errors.New("bad MaxUnavailableBy=: want a host label key such as rack (agentd run --label rack=r1)")
	}
	if err := selector.ValidateKey(val); err != nil {
		return "", fmt.Errorf("bad MaxUnavailableBy=%s: %w", val, err)
	}
	return val, nil
}

// parseTriggers reads a list of config file paths as systemd reads a list
// setting: each assignment adds, an empty one clears.
func parseTriggers(list, key, val string) (string, error) {
	if val == "" {
		return "", nil
	}
	for _, dest := range strings.Fields(val) {
		if err := ValidateDest(dest); err != nil {
			return list, fmt.Errorf("bad %s=: %w", key, err)
		}
		list = strings.TrimSpace(list + " " + dest)
	}
	return list, nil
}

// DefaultHealthy is HealthySec= when the unit does not set it.
const DefaultHealthy = 5 * time.Second

// parseHealthy reads HealthySec= as systemd reads its own *Sec= settings.
// "infinity" is refused: a unit would never count as healthy, so its
// version would never become the last good one, a rollout would never
// free its slot for the next host, and --wait would never return. An
// operator who wants no verdict at all wants Rollback=no, not this.
func parseHealthy(val string) (time.Duration, error) {
	d, err := ParseTimespan(val)
	switch {
	case errors.Is(err, ErrInfinity):
		return 0, fmt.Errorf("bad HealthySec=%s: a unit would never count as healthy, so its rollout and --wait would never end; give a finite span such as 30s or 5min", val)
	case err != nil:
		return 0, fmt.Errorf("bad HealthySec=%s: want a time span such as 30s, 500ms, 1min 30s or a number of seconds (systemd.time(7)): %w", val, err)
	}
	return d, nil
}

// parseConfirm reads ConfirmSec= as systemd reads its own *Sec= settings;
// 0 turns it off. "infinity" is refused: a change would wait for ever to
// be confirmed, or be rolled back never, and neither is what it asks for.
func parseConfirm(val string) (time.Duration, error) {
	d, err := ParseTimespan(val)
	switch {
	case errors.Is(err, ErrInfinity):
		return 0, fmt.Errorf("bad ConfirmSec=%s: give a finite span such as 30s (0: off)", val)
	case err != nil:
		return 0, fmt.Errorf("bad ConfirmSec=%s: want a time span such as 30s, 500ms, 1min 30s or a number of seconds (systemd.time(7)): %w", val, err)
	}
	return d, nil
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

// unitOptions parses a unit file with go-systemd's parser: the one entry
// point to it in this package. It fails on some files systemd accepts (see
// ParsePolicy); on failure the options read before the error are returned
// with it. Values are as go-systemd gives them: a continued value keeps its
// backslash-newlines (optionValue joins them as systemd does).
func unitOptions(content []byte) ([]*unit.UnitOption, error) {
	return unit.DeserializeOptions(bytes.NewReader(content))
}

// optionValue joins a continued value the way systemd does: each line is
// stripped, a trailing backslash becomes a space, and comment lines inside
// the continuation are skipped.
func optionValue(v string) string {
	if !strings.Contains(v, "\n") && !strings.HasSuffix(v, "\\") {
		return strings.TrimSpace(v)
	}
	var b strings.Builder
	for i, line := range strings.Split(v, "\n") {
		line = strings.TrimSpace(line)
		if i > 0 && line != "" && (line[0] == '#' || line[0] == ';') {
			continue
		}
		if l, ok := strings.CutSuffix(line, "\\"); ok {
			b.WriteString(l)
			b.WriteByte(' ')
			continue
		}
		b.WriteString(line)
	}
	return strings.TrimSpace(b.String())
}

// iniEntry is one assignment of a unit file: section, key and value.
type iniEntry struct{ sec, key, val string }

// iniEntries yields (section, key, value) for every assignment in a unit
// file, read with unitOptions; continued values are joined (optionValue).
// When the parser fails, the assignments before the failure are returned.
func iniEntries(content []byte) []iniEntry {
	opts, _ := unitOptions(content)
	out := make([]iniEntry, 0, len(opts))
	for _, o := range opts {
		out = append(out, iniEntry{o.Section, o.Name, optionValue(o.Value)})
	}
	return out
}

// hasSectionHeader reports whether a line of content, stripped, is the
// header "[section]". A plain scan, for files the parser cannot read.
func hasSectionHeader(content []byte, section string) bool {
	header := "[" + section + "]"
	for line := range bytes.Lines(content) {
		if string(bytes.TrimSpace(line)) == header {
			return true
		}
	}
	return false
}

// scanHasInstall reports whether an [Install] header line is followed, in
// that section, by a key=value line. A plain scan, for files the parser
// cannot read.
func scanHasInstall(content []byte) bool {
	in := false
	for line := range bytes.Lines(content) {
		line = bytes.TrimSpace(line)
		switch {
		case len(line) == 0 || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			in = string(line) == "[Install]"
		case in && bytes.IndexByte(line, '=') > 0:
			return true
		}
	}
	return false
}
