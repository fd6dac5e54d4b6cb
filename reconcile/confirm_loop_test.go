package reconcile_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// Commit-confirmed apply (ConfirmSec=) in the loop, with a fake systemd and
// a fake control plane; cmd/agentd's TestConfirmLostControlPlaneRollsBack
// runs it against a real systemd and etcd.

// fakeConfirmer is a control plane that answers as up says: nil, or a
// refusal after a short while; hang makes every try wait for its deadline
// (an etcd that does not answer). It counts its tries.
type fakeConfirmer struct {
	up    atomic.Bool
	hang  bool
	tries atomic.Int64
}

func (f *fakeConfirmer) Confirm(ctx context.Context) error {
	f.tries.Add(1)
	if f.hang {
		<-ctx.Done()
		return ctx.Err()
	}
	if f.up.Load() {
		return nil
	}
	time.Sleep(time.Millisecond)
	return errors.New("registry unreachable")
}

// cpObserver counts the rollbacks for want of a confirmation.
type cpObserver struct {
	reconcile.NopObserver
	mu    sync.Mutex
	units []string
}

func (o *cpObserver) ControlPlaneRollback(u string) {
	o.mu.Lock()
	o.units = append(o.units, u)
	o.mu.Unlock()
}

func (o *cpObserver) rolledBack() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.units)
}

const (
	confirmV1 = "[Service]\nExecStart=/bin/sleep 1\n[X-Agentd]\nHealthySec=0\nConfirmSec=300ms\n"
	confirmV2 = "[Service]\nExecStart=/bin/sleep 2\n[X-Agentd]\nHealthySec=0\nConfirmSec=300ms\n"
	plainV1   = "[Service]\nExecStart=/bin/sleep 1\n[X-Agentd]\nHealthySec=0\n"
	plainV2   = "[Service]\nExecStart=/bin/sleep 2\n[X-Agentd]\nHealthySec=0\n"
)

func entries(kv ...string) []reconcile.Entry {
	var es []reconcile.Entry
	for i := 0; i < len(kv); i += 2 {
		es = append(es, reconcile.Entry{Scope: reconcile.ScopeHost, Unit: kv[i], Value: []byte(kv[i+1])})
	}
	return es
}

// unitStatus is a's last status of u (zero when none).
func unitStatus(a *reconcile.Agent, u string) reconcile.Status {
	_, st := a.Statuses()
	return statusOf(st, u)
}

func waitStatus(t *testing.T, a *reconcile.Agent, u, what string, cond func(reconcile.Status) bool) reconcile.Status {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := unitStatus(a, u)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: timed out waiting until %s; status %+v", u, what, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func count(calls []string, c string) int {
	n := 0
	for _, x := range calls {
		if x == c {
			n++
		}
	}
	return n
}

// A change of a unit with ConfirmSec= that the control plane does not
// confirm in time is put back (its file, one daemon-reload, a restart) and
// reported rolled-back for lost control plane; not applied again while
// the registry holds it. A unit without ConfirmSec= changed in the same
// batch keeps its change; so does a unit's first install (nothing to put
// back).
func TestUnconfirmedChangeIsRolledBack(t *testing.T) {
	for _, hang := range []bool{false, true} {
		name := "refused"
		if hang {
			name = "hangs" // a try that never answers holds up nothing: the clock ends the window
		}
		t.Run(name, func(t *testing.T) {
			files, m, _ := testDirs(t)
			sd := &fakeSystemd{active: map[string]bool{}}
			cp := &fakeConfirmer{hang: hang}
			obs := &cpObserver{}
			a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true,
				Confirmer: cp, Observer: obs})
			snap := reconcile.Snapshot{Revision: 1, Entries: entries("a.service", confirmV1, "b.service", plainV1)}
			a.SetSnapshot(snap)
			stop := runAgent(t, a)
			defer stop()
			waitCalls(t, sd, 3) // reload, two starts
			if s := unitStatus(a, "a.service"); s.Confirming || s.Action != "start" {
				t.Fatalf("a first install awaits no confirmation (nothing to put back): %+v", s)
			}

			snap.Revision++
			snap.Entries = entries("a.service", confirmV2, "b.service", plainV2)
			t0 := time.Now()
			a.SetSnapshot(snap)
			s := waitStatus(t, a, "a.service", "it is confirming", func(s reconcile.Status) bool { return s.Confirming })
			if s.Action != "restart" || s.Hash != reconcile.Hash([]byte(confirmV2)) {
				t.Fatalf("confirming status %+v", s)
			}
			s = waitStatus(t, a, "a.service", "it is rolled back", func(s reconcile.Status) bool { return s.Action == "rolled-back" && s.Job == "" })
			took := time.Since(t0)
			if !strings.HasPrefix(s.Error, "lost control plane: the change was not confirmed within ConfirmSec=300ms") || s.Confirming {
				t.Fatalf("rolled-back status %+v", s)
			}
			if took < 300*time.Millisecond || took > 2*time.Second {
				t.Errorf("rolled back %v after the change, want just after ConfirmSec=300ms", took)
			}
			if b, _, _ := files.Read("a.service"); string(b) != confirmV1 {
				t.Fatalf("a.service on disk = %q, want v1 back", b)
			}
			if b, _, _ := files.Read("b.service"); string(b) != plainV2 {
				t.Fatalf("b.service (no ConfirmSec=) on disk = %q, want v2 kept", b)
			}
			calls := sd.Calls()
			if n := count(calls, "restart a.service"); n != 2 {
				t.Errorf("restarts of a.service = %d, want 2 (the change, the rollback): %v", n, calls)
			}
			if n := count(calls, "restart b.service"); n != 1 {
				t.Errorf("restarts of b.service = %d, want 1: %v", n, calls)
			}
			if got := obs.rolledBack(); !slices.Equal(got, []string{"a.service"}) {
				t.Errorf("control-plane rollbacks observed: %v", got)
			}
			// The control plane is back: the status says why (it is published
			// as it is), and the failed content is not applied again.
			cp.up.Store(true)
			if _, err := a.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			s = unitStatus(a, "a.service")
			if s.Action != "rolled-back" || !strings.HasPrefix(s.Error, "lost control plane") {
				t.Fatalf("status once the control plane is back: %+v", s)
			}
			if b, _, _ := files.Read("a.service"); string(b) != confirmV1 {
				t.Fatalf("a.service re-applied the unconfirmed content: %q", b)
			}
			if n := count(sd.Calls(), "restart a.service"); n != 2 {
				t.Errorf("a.service restarted again: %v", sd.Calls())
			}
		})
	}
}

// A change the control plane confirms stays: no rollback, the status
// stops saying confirming, and what ran before is forgotten (a later
// failure goes back to this version, not the one before).
func TestConfirmedChangeIsKept(t *testing.T) {
	files, m, _ := testDirs(t)
	sd := &fakeSystemd{active: map[string]bool{}}
	cp := &fakeConfirmer{}
	cp.up.Store(true)
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true, Confirmer: cp})
	snap := reconcile.Snapshot{Revision: 1, Entries: entries("a.service", confirmV1)}
	a.SetSnapshot(snap)
	stop := runAgent(t, a)
	defer stop()
	waitCalls(t, sd, 2)
	snap.Revision++
	snap.Entries = entries("a.service", confirmV2)
	a.SetSnapshot(snap)
	waitStatus(t, a, "a.service", "v2 runs, confirmed", func(s reconcile.Status) bool {
		return s.Hash == reconcile.Hash([]byte(confirmV2)) && s.Action == "restart" && s.Job == "" && !s.Confirming
	})
	time.Sleep(400 * time.Millisecond) // past ConfirmSec=300ms
	if _, err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := unitStatus(a, "a.service")
	if s.Action != "restart" || s.Error != "" || s.Health != "healthy" || s.Confirming {
		t.Fatalf("status past ConfirmSec= of a confirmed change: %+v", s)
	}
	if b, _, _ := files.Read("a.service"); string(b) != confirmV2 {
		t.Fatalf("a.service on disk = %q, want v2", b)
	}
	if n := count(sd.Calls(), "restart a.service"); n != 1 {
		t.Errorf("restarts = %v, want the change's only", sd.Calls())
	}
	if rec := m.Units()["a.service"]; rec.Confirming != "" || len(rec.Previous) != 0 {
		t.Errorf("record of a confirmed, healthy change = %+v: want no Confirming, no Previous", rec)
	}
	if cp.tries.Load() == 0 {
		t.Error("the change was kept without a try")
	}
}

// Without a Confirmer (the feature off), ConfirmSec= changes nothing: the
// agent never waits for, nor rolls back for, the control plane.
func TestNoConfirmerNoConfirmation(t *testing.T) {
	a, sd, files := newAgent(t)
	snap := reconcile.Snapshot{Revision: 1, Entries: entries("a.service", confirmV1)}
	a.SetSnapshot(snap)
	stop := runAgent(t, a)
	defer stop()
	waitCalls(t, sd, 2)
	snap.Revision++
	snap.Entries = entries("a.service", confirmV2)
	a.SetSnapshot(snap)
	waitStatus(t, a, "a.service", "v2 runs", func(s reconcile.Status) bool { return s.Hash == reconcile.Hash([]byte(confirmV2)) && s.Job == "" })
	time.Sleep(400 * time.Millisecond)
	if _, err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := unitStatus(a, "a.service"); s.Confirming || s.Action != "restart" {
		t.Fatalf("status %+v", s)
	}
	if b, _, _ := files.Read("a.service"); string(b) != confirmV2 {
		t.Fatalf("on disk %q, want v2", b)
	}
}

// The agent restarted while a change awaited its confirmation: the new
// agent does not restart the unit, shows it confirming, and — the control
// plane away — puts the change back a whole ConfirmSec= after its start.
func TestConfirmationResumesAfterAgentRestart(t *testing.T) {
	files, m, _ := testDirs(t)
	h1, h2 := reconcile.Hash([]byte(confirmV1)), reconcile.Hash([]byte(confirmV2))
	if err := files.Write("a.service", []byte(confirmV2)); err != nil {
		t.Fatal(err)
	}
	m.Set("a.service", reconcile.Owned{Hash: h2})
	m.PutBlob(h1, []byte(confirmV1))
	m.PutBlob(h2, []byte(confirmV2))
	v2 := map[string]string{"a.service": h2}
	m.SetUnits(map[string]reconcile.UnitRecord{"a.service": {Applied: v2, Good: v2, Previous: map[string]string{"a.service": h1},
		Own: reconcile.OwnFile, Confirming: reconcile.KeyOf(v2)}}, reconcile.Intent{})
	sd := &fakeSystemd{active: map[string]bool{"a.service": true}}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true, Confirmer: &fakeConfirmer{}})
	a.SetSnapshot(reconcile.Snapshot{Revision: 3, Entries: entries("a.service", confirmV2)})
	t0 := time.Now()
	stop := runAgent(t, a)
	defer stop()
	s := waitStatus(t, a, "a.service", "it is confirming", func(s reconcile.Status) bool { return s.Confirming })
	if calls := sd.Calls(); len(calls) != 0 {
		t.Fatalf("resuming the confirmation touched the unit: %v", calls)
	}
	s = waitStatus(t, a, "a.service", "it is rolled back", func(s reconcile.Status) bool { return s.Action == "rolled-back" && s.Job == "" })
	if took := time.Since(t0); took < 300*time.Millisecond {
		t.Errorf("rolled back %v after the agent started, want a whole ConfirmSec=300ms", took)
	}
	if !strings.HasPrefix(s.Error, "lost control plane") {
		t.Fatalf("status %+v", s)
	}
	if b, _, _ := files.Read("a.service"); string(b) != confirmV1 {
		t.Fatalf("on disk %q, want v1 back", b)
	}
	if calls := sd.Calls(); !slices.Equal(calls, []string{"daemon-reload", "restart a.service"}) {
		t.Fatalf("calls %v, want one daemon-reload and the rollback's restart", calls)
	}
}

// A template with ConfirmSec=: the instance it restarts onto a new set
// awaits its confirmation, and unconfirmed, the whole set goes back (the
// template's file) and the instance is restarted onto it, as when an
// instance fails its health check.
func TestUnconfirmedTemplateChangeIsRolledBack(t *testing.T) {
	files, m, _ := testDirs(t)
	sd := &fakeSystemd{active: map[string]bool{}}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true, Confirmer: &fakeConfirmer{}})
	snap := reconcile.Snapshot{Revision: 1, Entries: entries("t@.service", confirmV1, "t@1.service", "")}
	a.SetSnapshot(snap)
	stop := runAgent(t, a)
	defer stop()
	waitCalls(t, sd, 2) // reload, start t@1
	snap.Revision++
	snap.Entries = entries("t@.service", confirmV2, "t@1.service", "")
	a.SetSnapshot(snap)
	waitStatus(t, a, "t@1.service", "the instance is confirming", func(s reconcile.Status) bool { return s.Confirming })
	s := waitStatus(t, a, "t@1.service", "the instance runs the old set again", func(s reconcile.Status) bool {
		return s.RunsHash == reconcile.Hash([]byte(confirmV1)) && s.Job == "" && !s.Confirming
	})
	if b, _, _ := files.Read("t@.service"); string(b) != confirmV1 {
		t.Fatalf("template on disk %q, want v1 back", b)
	}
	if ts := unitStatus(a, "t@.service"); ts.Action != "rolled-back" || !strings.HasPrefix(ts.Error, "lost control plane") {
		t.Errorf("template status %+v, want rolled-back: lost control plane", ts)
	}
	if s.Health != "healthy" {
		t.Errorf("instance back on the old set: %+v", s)
	}
	// Back on the set that ran before is no change to confirm: no second
	// window (which, unconfirmed, would flip it onto the new set again).
	time.Sleep(400 * time.Millisecond)
	if _, err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := count(sd.Calls(), "restart t@1.service"); n != 2 {
		t.Errorf("instance restarts %v, want 2 (onto the new set, back onto the old)", sd.Calls())
	}
	if b, _, _ := files.Read("t@.service"); string(b) != confirmV1 {
		t.Fatalf("template on disk %q after ConfirmSec= more, want v1", b)
	}
}
