package reconcile_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

// factsSink is a FactsPublisher that keeps the last facts published.
type factsSink struct {
	mu    sync.Mutex
	f     *reconcile.Facts
	calls int
}

func (s *factsSink) PublishFacts(_ context.Context, f reconcile.Facts) (<-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.f, s.calls = &f, s.calls+1
	return nil, nil
}

// settled waits until the facts publisher has been quiet for a while, and
// returns the last facts.
func (s *factsSink) settled(t *testing.T) *reconcile.Facts {
	t.Helper()
	last := -1
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		n, f := s.calls, s.f
		s.mu.Unlock()
		if n > 0 && n == last {
			return f
		}
		last = n
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("no facts published")
	return nil
}

// statusSink is a Reporter that keeps the last statuses, by unit.
type statusSink struct {
	mu sync.Mutex
	st map[string]reconcile.Status
}

func (s *statusSink) Report(_ context.Context, _ int64, st []reconcile.Status) error {
	m := map[string]reconcile.Status{}
	for _, x := range st {
		m[x.Unit] = x
	}
	s.mu.Lock()
	s.st = m
	s.mu.Unlock()
	return nil
}

func (s *statusSink) get() map[string]reconcile.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

// refusingSystemd is fakeSystemd where some units do not load (systemd
// refuses their files) or fail to start.
type refusingSystemd struct {
	*fakeSystemd
	badSetting map[string]bool // LoadState=bad-setting
	failStart  map[string]bool // the start job fails, the unit is failed
}

func (r *refusingSystemd) Start(ctx context.Context, u string) error {
	if r.badSetting[u] {
		r.rec("start " + u)
		return errors.New("Unit " + u + " has a bad unit file setting.")
	}
	if r.failStart[u] {
		r.rec("start " + u)
		return errors.New("job for " + u + " failed: exit-code")
	}
	return r.fakeSystemd.Start(ctx, u)
}

func (r *refusingSystemd) State(ctx context.Context, u string) (reconcile.UnitState, error) {
	switch {
	case r.badSetting[u]:
		return reconcile.UnitState{LoadState: "bad-setting", LoadError: "Unit " + u + " has a bad unit file setting.", ActiveState: "inactive", SubState: "dead"}, nil
	case r.failStart[u]:
		return reconcile.UnitState{LoadState: "loaded", ActiveState: "failed", SubState: "failed", Result: "exit-code", Ran: true}, nil
	}
	return r.fakeSystemd.State(ctx, u)
}

const (
	pvUnit   = "[Service]\nExecStart=/bin/sleep 1\n[X-Agentd]\nHealthySec=0\n"
	pvUnitV2 = "[Service]\nExecStart=/bin/sleep 2\n[X-Agentd]\nHealthySec=0\n"
)

func hostEntry(unit, content string) reconcile.Entry {
	return reconcile.Entry{Scope: reconcile.ScopeHost, Unit: unit, Value: []byte(content)}
}

func groupEntry(group, unit, content string) reconcile.Entry {
	return reconcile.Entry{Scope: reconcile.ScopeGroup, Group: group, Unit: unit, Value: []byte(content)}
}

// A preview (the CLI's --dry-run, edit, and the put's warning) and the
// pass it predicts run the same planner on the same inputs: the registry
// before and after a put, and the host as its agent publishes it
// (statuses and facts). For every refusal the planner has, the host's
// agent is run for real (fake systemd, real unit directory), the preview
// is made from what it published, and both are compared: before the put
// (what `unit put --dry-run` says) and again once the host has met the
// put (what a second --dry-run of the same put says). A refusal systemd
// makes (it will not load the content) or a failure can be known only
// after the fact: for those only the second comparison holds.
func TestPreviewAgreesWithThePass(t *testing.T) {
	failed := reconcile.Hash([]byte(pvUnitV2))
	cases := []struct {
		name    string
		disk    map[string]string // files on disk the agent did not write ("->" + target: a symlink)
		before  []reconcile.Entry
		halts   []reconcile.Halt
		put     reconcile.Put
		bad     []string // units systemd will not load
		fail    []string // units whose start fails
		want    string   // the Do of the touched unit once the host has met the put
		reason  string   // a substring of its reason
		afterOn bool     // known only once the host met it
	}{
		{name: "unmanaged file",
			disk: map[string]string{"hw.service": "[Service]\nExecStart=/bin/sleep 9\n"},
			put:  reconcile.Put{Units: map[string][]byte{"hw.service": []byte(pvUnit)}},
			want: reconcile.DoBlocked, reason: "unmanaged file: hw.service exists and agentd did not write it"},
		{name: "unmanaged drop-in",
			disk:   map[string]string{"app.service.d/x.conf": "[Service]\nEnvironment=A=1\n"},
			before: []reconcile.Entry{hostEntry("app.service", pvUnit)},
			put:    reconcile.Put{Units: map[string][]byte{"app.service.d/x.conf": []byte("[Service]\nEnvironment=A=2\n")}},
			want:   reconcile.DoBlocked, reason: "unmanaged file: app.service.d/x.conf"},
		{name: "not a regular file (masked)",
			disk: map[string]string{"hw.service": "->/dev/null"},
			put:  reconcile.Put{Units: map[string][]byte{"hw.service": []byte(pvUnit)}},
			want: reconcile.DoBlocked, reason: "not a regular file"},
		{name: "reserved unit",
			put:  reconcile.Put{Units: map[string][]byte{"dbus-x.service": []byte(pvUnit)}},
			want: reconcile.DoBlocked, reason: "reserved unit"},
		{name: "bad content",
			put:  reconcile.Put{Units: map[string][]byte{"b.service": []byte("[Service\nExecStart=/bin/true\n")}},
			want: reconcile.DoBlocked, reason: "b.service"},
		{name: "bad policy",
			put:  reconcile.Put{Units: map[string][]byte{"b.service": []byte(pvUnit + "OnChnage=reload\n")}},
			want: reconcile.DoBlocked, reason: "OnChnage"},
		{name: "empty value for a unit that is no instance",
			put:  reconcile.Put{Units: map[string][]byte{"e.service": nil}},
			want: reconcile.DoBlocked, reason: "empty value"},
		{name: "two groups disagree",
			before: []reconcile.Entry{groupEntry("db", "app.service", pvUnit), groupEntry("web", "app.service", pvUnit)},
			put:    reconcile.Put{Scope: reconcile.ScopeGroup, Group: "web", Units: map[string][]byte{"app.service": []byte(pvUnitV2)}},
			want:   reconcile.DoBlocked, reason: "conflict"},
		{name: "OnChange=reload without ExecReload",
			before: []reconcile.Entry{hostEntry("app.service", pvUnit)},
			put:    reconcile.Put{Units: map[string][]byte{"app.service": []byte(pvUnitV2 + "OnChange=reload\n")}},
			want:   reconcile.DoBlocked, reason: "cannot reload"},
		{name: "halted rollout",
			before: []reconcile.Entry{groupEntry("web", "app.service", pvUnit)},
			halts:  []reconcile.Halt{{Scope: "groups/web", Unit: "app.service", Hash: failed, Host: "h2", Reason: "exit-code"}},
			put: reconcile.Put{Scope: reconcile.ScopeGroup, Group: "web", Units: map[string][]byte{"app.service": []byte(pvUnitV2)},
				Halts: []reconcile.Halt{{Scope: "groups/web", Unit: "app.service", Hash: failed, Host: "h2", Reason: "exit-code"}}},
			want: reconcile.DoHeld, reason: "h2 failed it"},
		{name: "systemd refuses to load the content",
			put: reconcile.Put{Units: map[string][]byte{"bad.service": []byte(pvUnit)}}, bad: []string{"bad.service"},
			want: reconcile.DoBlocked, reason: "systemd refused to load bad.service", afterOn: true},
		{name: "the content failed: not retried",
			put: reconcile.Put{Units: map[string][]byte{"f.service": []byte(pvUnit)}}, fail: []string{"f.service"},
			want: reconcile.DoBlocked, reason: "not retried until the registry content changes", afterOn: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			files, m, _ := testDirs(t)
			for p, content := range c.disk {
				full := filepath.Join(files.Path(), p)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				var err error
				if target, ok := strings.CutPrefix(content, "->"); ok {
					err = os.Symlink(target, full)
				} else {
					err = os.WriteFile(full, []byte(content), 0o644)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			sd := &refusingSystemd{fakeSystemd: &fakeSystemd{active: map[string]bool{}}, badSetting: map[string]bool{}, failStart: map[string]bool{}}
			for _, u := range c.bad {
				sd.badSetting[u] = true
			}
			for _, u := range c.fail {
				sd.failStart[u] = true
			}
			statuses, facts := &statusSink{}, &factsSink{}
			a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, Reporter: statuses, Facts: facts, CheckFocus: true})
			before := reconcile.Snapshot{Revision: 1, Entries: c.before, Halts: c.halts}
			a.SetSnapshot(before)
			stop := runAgent(t, a)
			defer stop()
			ctx := context.Background()
			if _, err := a.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			view := func(s reconcile.Snapshot) reconcile.HostView {
				return reconcile.HostView{Host: "h1", Snapshot: s, Statuses: statuses.get(), Facts: facts.settled(t)}
			}
			// What the registry holds once the put is stored.
			after := reconcile.Snapshot{Revision: 2, Entries: slices.Clone(c.before), Halts: c.put.Halts}
			for k, v := range c.put.Units {
				i := slices.IndexFunc(after.Entries, func(e reconcile.Entry) bool {
					return e.Scope == c.put.Scope && e.Group == c.put.Group && e.Unit == k
				})
				if i >= 0 {
					after.Entries[i].Value = v
				} else {
					after.Entries = append(after.Entries, reconcile.Entry{Scope: c.put.Scope, Group: c.put.Group, Unit: k, Value: v})
				}
			}

			// Before the put: the preview, then the pass that meets it.
			predicted := reconcile.Preview(view(before), c.put)
			a.SetSnapshot(after)
			plan, err := a.Sync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !c.afterOn {
				compare(t, "before the put", predicted, plan)
			}
			// The pass that met it ends, and its failure is judged; then
			// the same put previewed again, and the pass after it.
			if _, err := a.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			predicted = reconcile.Preview(view(after), c.put)
			plan, err = a.DryRun(ctx)
			if err != nil {
				t.Fatal(err)
			}
			compare(t, "once the host met the put", predicted, plan)
			if len(predicted) == 0 || predicted[0].Do != c.want || !strings.Contains(predicted[0].Reason, c.reason) {
				t.Fatalf("predicted %+v, want %s saying %q", predicted, c.want, c.reason)
			}
		})
	}
}

// compare checks that each predicted unit's action is the one the pass
// planned, in the preview's words (reconcile.Describe).
func compare(t *testing.T, when string, predicted []reconcile.Prediction, plan []reconcile.Action) {
	t.Helper()
	for _, p := range predicted {
		i := slices.IndexFunc(plan, func(a reconcile.Action) bool { return a.Unit == p.Unit })
		if i < 0 {
			t.Fatalf("%s: predicted %s %q, the pass planned nothing for it: %+v", when, p.Do, p.Reason, plan)
		}
		do, reason := reconcile.Describe(plan[i])
		if do != p.Do || (do == reconcile.DoBlocked || do == reconcile.DoHeld) && reason != p.Reason {
			t.Fatalf("%s: %s: predicted %s %q, the pass: %s %q", when, p.Unit, p.Do, p.Reason, do, reason)
		}
	}
}
