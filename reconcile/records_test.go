package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testlog"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/unitdir"
)

// refusesRecords is a manifest whose records cannot be saved.
type refusesRecords struct{ *unitdir.Manifest }

func (refusesRecords) SetUnits(map[string]reconcile.UnitRecord, reconcile.Intent) error {
	return errors.New("disk full")
}

// A pass whose records cannot be saved still stands, and says so once, in
// one line that names what failed once.
func TestPersistErrorLoggedOnce(t *testing.T) {
	files, m, _ := testDirs(t)
	sd := &fakeSystemd{active: map[string]bool{}}
	var log testlog.Buffer
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: refusesRecords{m}, CheckFocus: true,
		Log: slog.New(slog.NewTextHandler(&log, nil))})
	a.SetSnapshot(snapshot("a.service"))
	stop := runAgent(t, a)
	waitCalls(t, sd, 2)
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(log.String(), "disk full"); {
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("no error logged:\n%s", log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	for _, line := range strings.Split(log.String(), "\n") {
		if !strings.Contains(line, "disk full") {
			continue
		}
		if n := strings.Count(line, "save unit records"); n != 1 || !strings.Contains(line, "level=ERROR") {
			t.Errorf("want one error naming the save once, got: %s", line)
		}
	}
}

// errorsSystemd fails as the systemd adapter does: its errors name the
// operation and the unit.
type errorsSystemd struct {
	*fakeSystemd
	reload, state error
}

func (e *errorsSystemd) Reload(context.Context) error { return e.reload }

func (e *errorsSystemd) State(ctx context.Context, u string) (reconcile.UnitState, error) {
	if e.state != nil {
		return reconcile.UnitState{}, fmt.Errorf("state of %s: %w", u, e.state)
	}
	return e.fakeSystemd.State(ctx, u)
}

// A pass's error names each layer's part once: no "daemon-reload:
// daemon-reload:", no "read state of x: state of x:".
func TestPassErrorsNotDoubled(t *testing.T) {
	for name, sd := range map[string]*errorsSystemd{
		"daemon-reload": {reload: errors.New("daemon-reload: bus gone")},
		"state of":      {state: errors.New("bus gone")},
	} {
		t.Run(name, func(t *testing.T) {
			files, m, _ := testDirs(t)
			sd.fakeSystemd = &fakeSystemd{active: map[string]bool{}}
			a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m})
			a.SetSnapshot(snapshot("a.service"))
			defer runAgent(t, a)()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := a.Sync(ctx)
			if err == nil {
				t.Fatal("sync succeeded")
			}
			if n := strings.Count(err.Error(), name); n != 1 {
				t.Errorf("error %q names %q %d times, want once", err, name, n)
			}
		})
	}
}
