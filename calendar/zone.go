package calendar

import (
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // zone data compiled in, so every host reads a zone alike
)

var errRightZone = errors.New("leap-second time zones (right/…) are not supported")

// splitZone takes a trailing " UTC" (any case) or " ZONE" off s, as
// systemd does: the last word is a zone if it names a tz database file.
// zoneErr explains why a last word that looks like a zone name is not one,
// for when the rest fails to parse.
func splitZone(s string) (rest, zone string, loc *time.Location, zoneErr error) {
	if n := len(s) - len(" UTC"); n >= 0 && equalFold(s[n:], " UTC") {
		return s[:n], "UTC", time.UTC, nil
	}
	i := strings.LastIndexByte(s, ' ')
	if i < 0 {
		return s, "", nil, nil
	}
	name := s[i+1:]
	loc, err := loadZone(name)
	if err != nil {
		if errors.Is(err, errRightZone) || strings.Contains(name, "/") {
			return s, "", nil, fmt.Errorf("time zone %q: %w", name, err)
		}
		return s, "", nil, nil
	}
	return s[:i], name, loc, nil
}

// loadZone loads a tz database zone by a name systemd would take: letters,
// digits, "-", "_", "+" and single inner slashes. Go's special name
// "Local" is not a zone file, so it is refused like any unknown name.
func loadZone(name string) (*time.Location, error) {
	if name == "UTC" {
		return time.UTC, nil
	}
	if name == "" || name[0] == '/' || name[len(name)-1] == '/' || strings.Contains(name, "//") ||
		strings.ContainsFunc(name, func(r rune) bool { return !zoneRune(r) }) {
		return nil, errors.New("not a tz database name")
	}
	if strings.HasPrefix(name, "right/") {
		return nil, errRightZone
	}
	if name == "Local" {
		return nil, errors.New("unknown time zone")
	}
	return time.LoadLocation(name)
}

func zoneRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_+/", r)
}
