package systemdtest

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
)

// unitProps reads unit properties over one lazily dialed go-systemd
// connection to a manager, dialed again when it dropped (a restart of the
// bus). Harness and Container embed it; dial is their Dial.
type unitProps struct {
	dial func(context.Context) (*sddbus.Conn, error)
	mu   sync.Mutex
	sd   *sddbus.Conn
}

func (u *unitProps) conn() (*sddbus.Conn, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.sd != nil && u.sd.Connected() {
		return u.sd, nil
	}
	if u.sd != nil {
		u.sd.Close()
	}
	var err error
	u.sd, err = u.dial(context.Background())
	return u.sd, err
}

// closeConn closes the connection, if one was dialed.
func (u *unitProps) closeConn() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.sd != nil {
		u.sd.Close()
		u.sd = nil
	}
}

// Prop returns the current value of a unit property, looked up on the
// generic Unit interface first and then on the unit's type interface
// (Service for ".service", ...). It fails the test on error.
func (u *unitProps) Prop(t testing.TB, unit, name string) any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := u.conn()
	if err != nil {
		t.Fatalf("Prop(%s, %s): %v", unit, name, err)
	}
	p, err := conn.GetUnitPropertyContext(ctx, unit, name)
	if err != nil {
		p, err = conn.GetUnitTypePropertyContext(ctx, unit, unitType(unit), name)
	}
	if err != nil {
		t.Fatalf("Prop(%s, %s): %v", unit, name, err)
	}
	return p.Value.Value()
}

// ActiveState returns the unit's ActiveState.
func (u *unitProps) ActiveState(t testing.TB, unit string) string {
	t.Helper()
	s, _ := u.Prop(t, unit, "ActiveState").(string)
	return s
}

// MainPID returns a service's MainPID (0 when it has none).
func (u *unitProps) MainPID(t testing.TB, unit string) uint32 {
	t.Helper()
	pid, _ := u.Prop(t, unit, "MainPID").(uint32)
	return pid
}

// unitType maps "a.service" to "Service", the suffix of its D-Bus interface.
func unitType(unit string) string {
	ext := strings.TrimPrefix(filepath.Ext(unit), ".")
	if ext == "" {
		return ""
	}
	return strings.ToUpper(ext[:1]) + ext[1:]
}
