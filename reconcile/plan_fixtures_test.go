// Fixtures of the planner's transition tables (plan_transitions_test.go):
// a host's state, file sets and what an action must say.

package reconcile

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

func p2H(content string) string { return Hash([]byte(content)) }

// p2File is a file on disk with its content (so the planner can classify
// against it).
func p2File(content string) LocalFile {
	return LocalFile{Exists: true, Hash: p2H(content), Content: []byte(content)}
}

// p2Files maps path -> hash for path, content pairs.
func p2Files(pairs ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i < len(pairs); i += 2 {
		m[pairs[i]] = p2H(pairs[i+1])
	}
	return m
}

func p2Key(pairs ...string) string { return KeyOf(p2Files(pairs...)) }

func p2Blobs(contents ...string) map[string][]byte {
	m := map[string][]byte{}
	for _, c := range contents {
		m[p2H(c)] = []byte(c)
	}
	return m
}

// p2Host is a host whose unit directory holds the given path, content
// pairs, all written by agentd (on disk and in the manifest).
func p2Host(units map[string]UnitState, pairs ...string) Current {
	c := Current{
		Host: HostFacts{Files: map[string]LocalFile{}, Units: units},
		Memory: Memory{
			Managed: map[string]Owned{},
			Records: map[string]UnitRecord{},
			Blobs:   map[string][]byte{},
		},
	}
	for i := 0; i < len(pairs); i += 2 {
		c.Host.Files[pairs[i]] = p2File(pairs[i+1])
		c.Memory.Managed[pairs[i]] = Owned{Hash: p2H(pairs[i+1])}
	}
	return c
}

func p2St(st UnitState, f func(*UnitState)) UnitState {
	f(&st)
	return st
}

func p2FileState(st UnitState, state string) UnitState {
	st.UnitFileState = state
	return st
}

type p2Want struct {
	kind    Kind
	job     Job
	writes  map[string]string // path -> hash of every write; nil: nothing written
	removes []string
	forget  []string
	enable  bool
	disable bool
	drop    bool // DropRecord
	adopt   bool
	refuse  string // Refuse.ContentKey; "" for no refusal
	own     Ownership
	// errLike must be in Err; with it empty, Err must be empty (but for KindBlocked).
	errLike    string
	reasonLike string
	// eff is checked when checkEff: Effective (nil included).
	eff      map[string]string
	checkEff bool
}

type p2Case struct {
	name    string
	entries []Entry
	cur     func() Current
	unit    string // default hello.service
	want    p2Want
}

// p2Check compares an action with what a case wants, and holds every
// action to the message rules.
func p2Check(t *testing.T, a Action, w p2Want) {
	t.Helper()
	if a.Kind != w.kind {
		t.Fatalf("kind = %s (reason %q, err %q), want %s", a.Kind, a.Reason, a.Err, w.kind)
	}
	if a.Steps.Job != w.job {
		t.Errorf("job = %s, want %s", a.Steps.Job, w.job)
	}
	got := map[string]string{}
	for _, f := range a.Steps.Writes {
		got[f.Path] = f.Hash
		if Hash(f.Content) != f.Hash {
			t.Errorf("write %s: content hashes to %s, not %s", f.Path, short(Hash(f.Content)), short(f.Hash))
		}
	}
	if w.writes == nil {
		w.writes = map[string]string{}
	}
	if !maps.Equal(got, w.writes) {
		t.Errorf("writes = %v, want %v", got, w.writes)
	}
	if !slices.Equal(a.Steps.Removes, w.removes) {
		t.Errorf("removes = %v, want %v", a.Steps.Removes, w.removes)
	}
	if !slices.Equal(a.Steps.Forget, w.forget) {
		t.Errorf("forget = %v, want %v", a.Steps.Forget, w.forget)
	}
	if a.Steps.Enable != w.enable || a.Steps.Disable != w.disable {
		t.Errorf("enable/disable = %v/%v, want %v/%v", a.Steps.Enable, a.Steps.Disable, w.enable, w.disable)
	}
	if a.Record.DropRecord != w.drop {
		t.Errorf("drop record = %v, want %v", a.Record.DropRecord, w.drop)
	}
	if a.Record.Adopt != w.adopt {
		t.Errorf("adopt = %v, want %v", a.Record.Adopt, w.adopt)
	}
	switch {
	case w.refuse == "" && a.Record.Refuse != nil:
		t.Errorf("refuse = %+v, want none", *a.Record.Refuse)
	case w.refuse != "" && a.Record.Refuse == nil:
		t.Errorf("no refusal, want one for %s", w.refuse)
	case w.refuse != "" && a.Record.Refuse.ContentKey != w.refuse:
		t.Errorf("refusal of %s, want %s", a.Record.Refuse.ContentKey, w.refuse)
	}
	if w.own != OwnNone && a.Own != w.own {
		t.Errorf("own = %q, want %q", a.Own, w.own)
	}
	if w.errLike != "" && !strings.Contains(a.Err, w.errLike) {
		t.Errorf("err = %q, want it to mention %q", a.Err, w.errLike)
	}
	if w.errLike == "" && a.Kind != KindBlocked && a.Err != "" {
		t.Errorf("err = %q, want none", a.Err)
	}
	if w.reasonLike != "" && !strings.Contains(a.Reason, w.reasonLike) {
		t.Errorf("reason = %q, want it to mention %q", a.Reason, w.reasonLike)
	}
	if w.checkEff && (w.eff == nil) != (a.Record.Effective == nil) || w.checkEff && !maps.Equal(a.Record.Effective, w.eff) {
		t.Errorf("effective = %v, want %v", a.Record.Effective, w.eff)
	}
	p2Messages(t, a)
}

// p2Messages: an action that does something says why, and says it cleanly.
func p2Messages(t *testing.T, a Action) {
	t.Helper()
	why := a.Reason
	if a.Kind == KindBlocked {
		why = a.Err
	}
	if a.Kind != KindNone && strings.TrimSpace(why) == "" {
		t.Errorf("%s with no reason (reason %q, err %q)", a.Kind, a.Reason, a.Err)
	}
	for _, m := range []string{a.Reason, a.Err} {
		if strings.Contains(m, "  ") || strings.Contains(m, "failed failed") {
			t.Errorf("message %q has a doubled word or space", m)
		}
	}
}
