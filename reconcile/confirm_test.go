package reconcile

import (
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// The decisions of commit-confirmed apply (ConfirmSec=), as tables: when a
// try confirms a change and when its window runs out (ConfirmationAt); what
// the planner makes of a change that ran out (the rollback every failed
// change gets); what the ledger keeps meanwhile.

func TestConfirmationAt(t *testing.T) {
	since := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return since.Add(d) }
	const limit = 2 * time.Second
	down := errors.New("registry unreachable")
	for _, tc := range []struct {
		name string
		try  *ConfirmTry
		now  time.Duration // after since
		want Confirmation
	}{
		{name: "no try yet, inside the window", now: time.Second, want: ConfirmPending},
		{name: "no try, the window is over", now: limit, want: ConfirmExpired},
		{name: "no try, long after", now: time.Hour, want: ConfirmExpired},
		{name: "a try begun after the change, ended in time",
			try: &ConfirmTry{Began: at(10 * time.Millisecond), Ended: at(20 * time.Millisecond)}, now: 20 * time.Millisecond, want: ConfirmConfirmed},
		{name: "a try begun at the change itself counts",
			try: &ConfirmTry{Began: at(0), Ended: at(5 * time.Millisecond)}, now: 5 * time.Millisecond, want: ConfirmConfirmed},
		{name: "a try ended exactly at the deadline counts",
			try: &ConfirmTry{Began: at(time.Second), Ended: at(limit)}, now: limit, want: ConfirmConfirmed},
		{name: "a try in time, taken after the deadline, still counts",
			try: &ConfirmTry{Began: at(time.Second), Ended: at(1900 * time.Millisecond)}, now: 3 * time.Second, want: ConfirmConfirmed},
		{name: "a try begun before the change proves nothing about it",
			try: &ConfirmTry{Began: at(-time.Millisecond), Ended: at(10 * time.Millisecond)}, now: 10 * time.Millisecond, want: ConfirmPending},
		{name: "a try begun before the change, the window over",
			try: &ConfirmTry{Began: at(-time.Millisecond), Ended: at(10 * time.Millisecond)}, now: limit, want: ConfirmExpired},
		{name: "a failed try, inside the window",
			try: &ConfirmTry{Began: at(time.Millisecond), Ended: at(600 * time.Millisecond), Err: down}, now: 600 * time.Millisecond, want: ConfirmPending},
		{name: "a failed try, the window over",
			try: &ConfirmTry{Began: at(1500 * time.Millisecond), Ended: at(2100 * time.Millisecond), Err: down}, now: 2100 * time.Millisecond, want: ConfirmExpired},
		{name: "a try that succeeded too late",
			try: &ConfirmTry{Began: at(1800 * time.Millisecond), Ended: at(2001 * time.Millisecond)}, now: 2001 * time.Millisecond, want: ConfirmExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ConfirmationAt(since, limit, tc.try, at(tc.now)); got != tc.want {
				t.Errorf("ConfirmationAt = %s, want %s", got, tc.want)
			}
		})
	}
}

// A change that ran out of ConfirmSec= is recorded failed with FailedOp
// "confirm" and a reason saying "lost control plane"; the planner puts it
// back as it puts back every failed change.
func TestPlanUnconfirmedChange(t *testing.T) {
	const conf = "[X-Agentd]\nConfirmSec=2s\n"
	v1, v2 := svc+conf, p2V2+conf
	v2Reload := svc + "ExecReload=/bin/kill -HUP $MAINPID\nEnvironment=B=2\n" + conf
	h1 := p2H(v1)
	k2 := p2Key(p2Hello, v2)
	why := "lost control plane: the change was not confirmed within ConfirmSec=2s (the agent must renew its lease, read and write the registry; last try: context deadline exceeded)"
	unconfirmed := func(applied, previous map[string]string) UnitRecord {
		return UnitRecord{Applied: applied, Previous: previous, Good: applied, Failed: KeyOf(applied), FailReason: why, FailedOp: confirmOp}
	}
	cases := []p2Case{
		{name: "unconfirmed restart: the previous file back, restarted",
			entries: []Entry{entry(p2Hello, v2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, v2)
				c.Memory.Records[p2Hello] = unconfirmed(p2Files(p2Hello, v2), p2Files(p2Hello, v1))
				c.Memory.Blobs = p2Blobs(v1, v2)
				return c
			},
			want: p2Want{kind: KindRollback, job: JobRestart, writes: map[string]string{p2Hello: h1}, own: OwnFile,
				eff: map[string]string{p2Hello: h1}, checkEff: true, reasonLike: "lost control plane: the change was not confirmed within ConfirmSec=2s"}},
		{name: "unconfirmed drop-in: removed, the unit restarted on its file",
			entries: []Entry{entry(p2Hello, v1), entry(p2Env, p2DropEnv)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, v1, p2Env, p2DropEnv)
				c.Memory.Records[p2Hello] = unconfirmed(p2Files(p2Hello, v1, p2Env, p2DropEnv), p2Files(p2Hello, v1))
				c.Memory.Blobs = p2Blobs(v1, p2DropEnv)
				return c
			},
			want: p2Want{kind: KindRollback, job: JobRestart, removes: []string{p2Env}, own: OwnFile,
				eff: map[string]string{p2Hello: h1}, checkEff: true, reasonLike: "lost control plane"}},
		{name: "unconfirmed reload: restarted, not only the files put back (the process took the new config)",
			entries: []Entry{entry(p2Hello, v2Reload)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, v2Reload)
				c.Memory.Records[p2Hello] = unconfirmed(p2Files(p2Hello, v2Reload), p2Files(p2Hello, v1))
				c.Memory.Blobs = p2Blobs(v1, v2Reload)
				return c
			},
			want: p2Want{kind: KindRollback, job: JobRestart, writes: map[string]string{p2Hello: h1}, own: OwnFile,
				eff: map[string]string{p2Hello: h1}, checkEff: true}},
		{name: "put back already, the registry still holds it (etcd back): blocked, not applied again",
			entries: []Entry{entry(p2Hello, v2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, v1)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, v1), Good: p2Files(p2Hello, v1), Failed: k2, FailReason: why, FailedOp: confirmOp}
				c.Memory.Blobs = p2Blobs(v1, v2)
				return c
			},
			want: p2Want{kind: KindBlocked, own: OwnFile, errLike: "lost control plane: the change was not confirmed within ConfirmSec=2s"}},
		{name: "new content put after the rollback: applied",
			entries: []Entry{entry(p2Hello, v2+"# fixed\n")},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, v1)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, v1), Good: p2Files(p2Hello, v1), Failed: k2, FailReason: why, FailedOp: confirmOp}
				c.Memory.Blobs = p2Blobs(v1, v2)
				return c
			},
			want: p2Want{kind: KindRestart, job: JobRestart, writes: map[string]string{p2Hello: p2H(v2 + "# fixed\n")}, own: OwnFile}},
		{name: "unconfirmed, Rollback=no: left as it is, blocked with the reason",
			entries: []Entry{entry(p2Hello, v2+"Rollback=no\n")},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, v2+"Rollback=no\n")
				c.Memory.Records[p2Hello] = unconfirmed(p2Files(p2Hello, v2+"Rollback=no\n"), p2Files(p2Hello, v1))
				c.Memory.Blobs = p2Blobs(v1)
				return c
			},
			want: p2Want{kind: KindBlocked, own: OwnFile, errLike: "lost control plane"}},
		{name: "unconfirmed, the previous version not kept: blocked, says so",
			entries: []Entry{entry(p2Hello, v2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, v2)
				c.Memory.Records[p2Hello] = unconfirmed(p2Files(p2Hello, v2), p2Files(p2Hello, v1))
				return c
			},
			want: p2Want{kind: KindBlocked, own: OwnFile, errLike: "not kept"}},
		{name: "awaiting confirmation (the window open): nothing to do",
			entries: []Entry{entry(p2Hello, v2)},
			cur: func() Current {
				c := p2Host(map[string]UnitState{p2Hello: running}, p2Hello, v2)
				c.Memory.Records[p2Hello] = UnitRecord{Applied: p2Files(p2Hello, v2), Previous: p2Files(p2Hello, v1), Good: p2Files(p2Hello, v2), Confirming: k2}
				c.Memory.Blobs = p2Blobs(v1, v2)
				return c
			},
			want: p2Want{kind: KindNone, own: OwnFile}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan := Plan(Desire(Snapshot{Entries: tc.entries}), tc.cur())
			i := slices.IndexFunc(plan, func(a Action) bool { return a.Unit == p2Hello })
			if i < 0 {
				t.Fatalf("no action for %s in %+v", p2Hello, plan)
			}
			p2Check(t, plan[i], tc.want)
		})
	}
}

// The ledger and the confirms part while a change awaits its
// confirmation: a healthy verdict keeps what ran before (it is what a
// rollback restores); the confirmation forgets it; running out of
// ConfirmSec= is a failure that also ends the HealthySec window.
func TestLedgerConfirm(t *testing.T) {
	v1, v2 := map[string]string{"a.service": "h1"}, map[string]string{"a.service": "h2"}
	act := Action{Unit: "a.service", Kind: KindRestart, ContentKey: KeyOf(v2), Record: Record{Effective: v2}, Policy: Policy{State: StateStarted, Confirm: time.Second, Healthy: time.Second, Rollback: true}}
	now := time.Now()
	newLedgerWith := func() (*ledger, *confirms) {
		l := &ledger{records: map[string]UnitRecord{"a.service": {Applied: v1, Good: v1}}, verify: map[string]*window{}}
		if !l.applied(act, JobRestart, "m") {
			t.Fatal("applied: a new version not said to be one")
		}
		c := newConfirms(nil, slog.New(slog.DiscardHandler))
		return l, &c
	}
	// awaitConfirm opens the window and marks the record, as the loop does.
	awaitConfirm := func(l *ledger, c *confirms) {
		c.windows[act.Unit] = &confirmWindow{act: act, since: now}
		l.markConfirming(act.Unit, act.ContentKey)
	}
	// confirm has the confirms part take a try that confirms the change,
	// and tells the ledger, as the loop does.
	confirm := func(l *ledger, c *confirms) {
		for _, u := range c.take(t.Context(), ConfirmTry{Began: now, Ended: now}) {
			l.confirmed(u)
		}
	}

	l, c := newLedgerWith()
	awaitConfirm(l, c)
	l.good("a.service", v2)
	if rec := l.records["a.service"]; !maps.Equal(rec.Previous, v1) || rec.Confirming != act.ContentKey {
		t.Fatalf("healthy while confirming: %+v, want Previous v1 kept and Confirming", rec)
	}
	confirm(l, c)
	if rec := l.records["a.service"]; rec.Previous != nil || rec.Confirming != "" || c.awaiting("a.service") {
		t.Fatalf("confirmed and healthy: %+v, want Previous and Confirming gone", rec)
	}

	l, c = newLedgerWith()
	awaitConfirm(l, c)
	confirm(l, c)
	if rec := l.records["a.service"]; !maps.Equal(rec.Previous, v1) {
		t.Fatalf("confirmed, not yet healthy: %+v, want Previous kept for the HealthySec verdict", rec)
	}
	l.good("a.service", v2)
	if rec := l.records["a.service"]; rec.Previous != nil {
		t.Fatalf("confirmed, then healthy: %+v, want Previous gone", rec)
	}

	l, c = newLedgerWith()
	awaitConfirm(l, c)
	l.verify["a.service"] = &window{act: act, op: KindRestart, ended: now}
	expired := c.expire(now.Add(act.Policy.Confirm))
	if len(expired) != 1 || expired[0].act.Unit != "a.service" {
		t.Fatalf("expire at ConfirmSec=: %+v, want a.service", expired)
	}
	rec, _ := l.unconfirmed(expired[0].act, "lost control plane: …")
	if rec.Failed != act.ContentKey || rec.FailedOp != confirmOp || !strings.HasPrefix(rec.FailReason, "lost control plane") || rec.Confirming != "" ||
		!maps.Equal(rec.Previous, v1) || l.verifying("a.service") || c.awaiting("a.service") {
		t.Fatalf("unconfirmed: %+v (verifying %v, confirming %v)", rec, l.verifying("a.service"), c.awaiting("a.service"))
	}
	if why := rollbackWhyNot(act.Policy, rec); why != "" {
		t.Fatalf("an unconfirmed change is not rolled back: %s", why)
	}

	// A newer version applied: the old one's Confirming goes with it.
	l, c = newLedgerWith()
	awaitConfirm(l, c)
	v3 := map[string]string{"a.service": "h3"}
	act3 := act
	act3.ContentKey, act3.Record.Effective = KeyOf(v3), v3
	l.applied(act3, JobRestart, "m")
	if rec := l.records["a.service"]; rec.Confirming != "" || !maps.Equal(rec.Previous, v2) {
		t.Fatalf("a newer version applied: %+v", rec)
	}
}

// An instance that runs a template set which failed (here: unconfirmed)
// and was put back is restarted onto the set put back, classified against
// that set's content, not the registry's: the registry still holds the
// failed set, and compared with it the instance looked current (adopted,
// no restart).
func TestPlanInstanceBackOntoTheSetPutBack(t *testing.T) {
	const tmpl, inst = "t@.service", "t@1.service"
	v1, v2 := svc+"[X-Agentd]\nConfirmSec=2s\n", p2V2+"[X-Agentd]\nConfirmSec=2s\n"
	c := p2Host(map[string]UnitState{inst: running}, tmpl, v1)
	set1, set2 := p2Files(tmpl, v1), p2Files(tmpl, v2)
	c.Memory.Records[tmpl] = UnitRecord{Applied: set1, Failed: KeyOf(set2), FailReason: "lost control plane: …"}
	c.Memory.Records[inst] = UnitRecord{Applied: set2, Previous: set1, Failed: KeyOf(set2), FailReason: "lost control plane: …", FailedOp: confirmOp}
	c.Memory.Managed[inst] = Owned{Instance: true}
	c.Memory.Blobs = p2Blobs(v1, v2)
	plan := Plan(Desire(Snapshot{Entries: []Entry{entry(tmpl, v2), entry(inst, "")}}), c)
	i := slices.IndexFunc(plan, func(a Action) bool { return a.Unit == inst })
	if i < 0 {
		t.Fatalf("no action for %s: %+v", inst, plan)
	}
	if a := plan[i]; a.Kind != KindRestart || a.Steps.Job != JobRestart || !maps.Equal(a.Record.Effective, set1) {
		t.Fatalf("%s: %s (%s), effective %v; want a restart onto the set put back %v", inst, a.Kind, a.Reason, a.Record.Effective, set1)
	}
}

// A change that awaits its confirmation still holds its MaxUnavailable=
// slot: the next host of the group does not take the change before this
// one proved it still reaches the registry.
func TestSlotHeldWhileConfirming(t *testing.T) {
	const unit = "web.service"
	content := svc + "[X-Agentd]\nMaxUnavailable=1\nConfirmSec=30s\n"
	desired := Desire(Snapshot{Entries: []Entry{groupEntry("web", unit, content)}})
	h := Hash([]byte(content))
	cur := Current{
		Host: HostFacts{Files: map[string]LocalFile{unit: {Exists: true, Hash: h, Content: []byte(content)}},
			Units: map[string]UnitState{unit: running}},
		Memory: Memory{Managed: map[string]Owned{unit: {Hash: h}},
			Records: map[string]UnitRecord{unit: {Applied: map[string]string{unit: h}, Good: map[string]string{unit: h}}}},
	}
	plan := Plan(desired, cur)
	if len(SlotsNeeded(plan, cur)) != 0 {
		t.Fatalf("a confirmed unit holds a slot: %v", SlotsNeeded(plan, cur))
	}
	rec := cur.Memory.Records[unit]
	rec.Confirming = KeyOf(rec.Applied)
	cur.Memory.Records[unit] = rec
	if need := SlotsNeeded(plan, cur); len(need) != 1 {
		t.Fatalf("a unit awaiting its confirmation gave back its slot: %v", need)
	}
}
