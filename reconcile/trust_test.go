package reconcile

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeVerifier accepts "sig <signer> <sha256 of the message>" from the
// signers it knows: deterministic, like the real one (cmd/agentd's, on
// sshsig), whose format is tested in package sshsig.
type fakeVerifier map[string]string // fingerprint → principals

func (f fakeVerifier) VerifyChange(msg, armored []byte) (Signer, error) {
	parts := strings.Fields(string(armored))
	if len(parts) != 3 || parts[0] != "sig" {
		return Signer{}, errors.New("malformed SSH signature: truncated?")
	}
	who := Signer{Fingerprint: parts[1]}
	p, ok := f[parts[1]]
	if !ok {
		return who, errors.New("not an allowed signer (no line of allowed_signers holds the key)")
	}
	who.Principals = p
	sum := sha256.Sum256(msg)
	if parts[2] != hex.EncodeToString(sum[:]) {
		return who, fmt.Errorf("%w: signature does not match the message", ErrSignatureMismatch)
	}
	return who, nil
}

var trustTargets = []SignedTarget{
	{Scope: ScopeHost, Name: "hosts/h1", Root: "/agentd/hosts/h1/units/"},
	{Scope: ScopeGroup, Group: "web", Name: "groups/web", Root: "/agentd/groups/web/units/"},
}

// sigRecord is the record the writer stores for key (a unit key of
// target; content nil: a removal), signed by signer.
func sigRecord(target, unit string, content []byte, seq uint64, revert bool, signer string) Entry {
	root, scope, group := "/agentd/hosts/h1/units/", ScopeHost, ""
	if target != "hosts/h1" {
		group = strings.TrimPrefix(target, "groups/")
		root, scope = "/agentd/"+target+"/units/", ScopeGroup
	}
	c := SignedChange{Key: root + unit, Target: target, Seq: seq, Revert: revert}
	if content != nil {
		c.Hash = Hash(content)
	}
	sum := sha256.Sum256(c.Message())
	r := SignatureRecord{Key: c.Key, Hash: c.Hash, Removed: content == nil, Seq: seq, Revert: revert, Signer: signer,
		Signature: "sig " + signer + " " + hex.EncodeToString(sum[:])}
	b, _ := json.Marshal(r)
	return Entry{Scope: scope, Group: group, Unit: unit, Value: b}
}

func TestSignedChanges(t *testing.T) {
	v1 := "[Service]\nExecStart=/bin/sleep 1\n"
	v2 := "[Service]\nExecStart=/bin/sleep 2\n"
	key := "/agentd/hosts/h1/units/a.service"
	ver := fakeVerifier{"SHA256:alice": "alice@example.com"}
	host := func(u, v string) Entry { return entry(u, v) }
	signed := func(u, v string, seq uint64) Entry {
		return sigRecord("hosts/h1", u, []byte(v), seq, false, "SHA256:alice")
	}
	for _, c := range []struct {
		name    string
		marks   map[string]Mark
		s       Snapshot
		refused string // the start of a.service's error; "" accepted
		gone    bool   // a.service is not desired at all
		mark    Mark   // a.service's mark after
	}{
		{name: "signed content is accepted",
			s:    Snapshot{Entries: []Entry{host("a.service", v1)}, Signatures: []Entry{signed("a.service", v1, 5)}},
			mark: Mark{Seq: 5, Hash: Hash([]byte(v1))}},
		{name: "unsigned content is refused",
			s:       Snapshot{Entries: []Entry{host("a.service", v1)}},
			refused: "refused: unsigned: " + key + ": sha256 "},
		{name: "a signature over other content",
			s:       Snapshot{Entries: []Entry{host("a.service", v2)}, Signatures: []Entry{signed("a.service", v1, 5)}},
			refused: "refused: bad signature: " + key + ": signed by SHA256:alice (alice@example.com): signed for other content"},
		{name: "a signature for another host",
			s: Snapshot{Entries: []Entry{host("a.service", v1)}, Signatures: []Entry{func() Entry {
				e := sigRecord("groups/db", "a.service", []byte(v1), 5, false, "SHA256:alice")
				e.Scope, e.Group = ScopeHost, ""
				return e
			}()}},
			refused: "refused: bad signature: " + key + ": signed by SHA256:alice (alice@example.com): signed for /agentd/groups/db/units/a.service, not for this key"},
		{name: "an unknown key",
			s:       Snapshot{Entries: []Entry{host("a.service", v1)}, Signatures: []Entry{sigRecord("hosts/h1", "a.service", []byte(v1), 5, false, "SHA256:mallory")}},
			refused: "refused: bad signature: " + key + ": signed by SHA256:mallory: not an allowed signer"},
		{name: "a truncated signature",
			s: Snapshot{Entries: []Entry{host("a.service", v1)}, Signatures: []Entry{func() Entry {
				e := signed("a.service", v1, 5)
				e.Value = []byte(strings.Replace(string(e.Value), `"sig SHA256:alice `, `"sig `, 1))
				return e
			}()}},
			refused: "refused: bad signature: " + key + ": malformed SSH signature"},
		{name: "a record an unsigned put emptied is unsigned",
			s: Snapshot{Entries: []Entry{host("a.service", v1)}, Signatures: []Entry{{Scope: ScopeHost, Unit: "a.service",
				Value: []byte(`{"key":"/agentd/hosts/h1/units/a.service","seq":9}`)}}},
			refused: "refused: unsigned: " + key + ": sha256 "},
		{name: "a record that is not JSON",
			s:       Snapshot{Entries: []Entry{host("a.service", v1)}, Signatures: []Entry{{Scope: ScopeHost, Unit: "a.service", Value: []byte("{")}}},
			refused: "refused: bad signature: " + key + ": its signature record is not JSON"},
		{name: "an older signed version put back is replayed",
			marks:   map[string]Mark{key: {Seq: 7, Hash: Hash([]byte(v2))}},
			s:       Snapshot{Entries: []Entry{host("a.service", v1)}, Signatures: []Entry{signed("a.service", v1, 5)}},
			refused: "refused: replayed: " + key + ": sha256 ",
			mark:    Mark{Seq: 7, Hash: Hash([]byte(v2))}},
		{name: "the same sequence over other content is replayed",
			marks:   map[string]Mark{key: {Seq: 7, Hash: Hash([]byte(v2))}},
			s:       Snapshot{Entries: []Entry{host("a.service", v1)}, Signatures: []Entry{signed("a.service", v1, 7)}},
			refused: "refused: replayed: ",
			mark:    Mark{Seq: 7, Hash: Hash([]byte(v2))}},
		{name: "a signed revert to older content is accepted",
			marks: map[string]Mark{key: {Seq: 7, Hash: Hash([]byte(v2))}},
			s:     Snapshot{Entries: []Entry{host("a.service", v1)}, Signatures: []Entry{sigRecord("hosts/h1", "a.service", []byte(v1), 8, true, "SHA256:alice")}},
			mark:  Mark{Seq: 8, Hash: Hash([]byte(v1))}},
		{name: "the content last accepted needs no new signature",
			marks: map[string]Mark{key: {Seq: 7, Hash: Hash([]byte(v1))}},
			s:     Snapshot{Entries: []Entry{host("a.service", v1)}, Signatures: []Entry{signed("a.service", v2, 9)}},
			mark:  Mark{Seq: 7, Hash: Hash([]byte(v1))}},
		{name: "a removal without a signature is refused",
			marks:   map[string]Mark{key: {Seq: 7, Hash: Hash([]byte(v1))}},
			s:       Snapshot{},
			refused: "refused: unsigned: " + key + ": removed from the registry without a signed removal",
			mark:    Mark{Seq: 7, Hash: Hash([]byte(v1))}},
		{name: "a removal whose record still signs the content is refused",
			marks:   map[string]Mark{key: {Seq: 7, Hash: Hash([]byte(v1))}},
			s:       Snapshot{Signatures: []Entry{signed("a.service", v1, 7)}},
			refused: "refused: bad signature: " + key + ": signed by SHA256:alice (alice@example.com): signed for other content: the signature is for sha256 ",
			mark:    Mark{Seq: 7, Hash: Hash([]byte(v1))}},
		{name: "a signed removal is accepted",
			marks: map[string]Mark{key: {Seq: 7, Hash: Hash([]byte(v1))}},
			s:     Snapshot{Signatures: []Entry{sigRecord("hosts/h1", "a.service", nil, 8, false, "SHA256:alice")}},
			gone:  true,
			mark:  Mark{Seq: 8, Removed: true}},
		{name: "an old signed removal put back is replayed",
			marks:   map[string]Mark{key: {Seq: 9, Hash: Hash([]byte(v1))}},
			s:       Snapshot{Signatures: []Entry{sigRecord("hosts/h1", "a.service", nil, 8, false, "SHA256:alice")}},
			refused: "refused: replayed: " + key + ": its removal signed by SHA256:alice",
			mark:    Mark{Seq: 9, Hash: Hash([]byte(v1))}},
		{name: "a key never accepted may go unsigned",
			s:    Snapshot{},
			gone: true},
		{name: "an unsigned drop-in blocks its unit",
			s: Snapshot{Entries: []Entry{host("a.service", v1), host("a.service.d/x.conf", "[Service]\nUser=root\n")},
				Signatures: []Entry{signed("a.service", v1, 5)}},
			refused: "refused: unsigned: " + key + ".d/x.conf",
			mark:    Mark{Seq: 5, Hash: Hash([]byte(v1))}},
		{name: "a group key under a host key does not count",
			s: Snapshot{Entries: []Entry{host("a.service", v1), groupEntry("web", "a.service", v2)},
				Signatures: []Entry{signed("a.service", v1, 5)}},
			mark: Mark{Seq: 5, Hash: Hash([]byte(v1))}},
		{name: "a group's key is signed for the group",
			s: Snapshot{Entries: []Entry{groupEntry("web", "a.service", v2)},
				Signatures: []Entry{sigRecord("groups/web", "a.service", []byte(v2), 3, false, "SHA256:alice")}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := desiredState{trust: newTrustState(&Trust{Verifier: ver, Targets: trustTargets, Marks: c.marks})}
			d.update(c.s)
			u := d.units["a.service"]
			switch {
			case c.gone:
				if u != nil {
					t.Fatalf("a.service desired: %+v", u)
				}
			case u == nil:
				t.Fatal("a.service not desired")
			case c.refused == "" && u.Err != nil:
				t.Fatalf("refused: %v", u.Err)
			case c.refused != "":
				var re *RefusedError
				if !errors.As(u.Err, &re) || !strings.HasPrefix(u.Err.Error(), c.refused) {
					t.Fatalf("error %v\n want it to start with %q", u.Err, c.refused)
				}
			}
			if c.mark != (Mark{}) {
				if got := d.trust.marks[key]; got != c.mark {
					t.Errorf("mark %+v, want %+v", got, c.mark)
				}
			}
			// What the loop keeps is what a check from scratch says.
			var fresh desiredState
			fresh.trust = d.trust.fresh()
			fresh.update(c.s)
			if !reflect.DeepEqual(d.units, fresh.units) {
				t.Errorf("a check from the marks now differs:\n kept %+v\nfresh %+v", d.units, fresh.units)
			}
		})
	}
}

// Accepted keys are told once, with who signed them; a refused unit
// whose signature is fixed is accepted at the next snapshot.
func TestSignedChangesOverSnapshots(t *testing.T) {
	v1, v2 := "[Service]\nExecStart=/bin/sleep 1\n", "[Service]\nExecStart=/bin/sleep 2\n"
	saved := 0
	d := desiredState{trust: newTrustState(&Trust{Verifier: fakeVerifier{"SHA256:alice": "alice"}, Targets: trustTargets})}
	sig := func(v string, seq uint64) Entry {
		return sigRecord("hosts/h1", "a.service", []byte(v), seq, false, "SHA256:alice")
	}
	steps := []struct {
		s        Snapshot
		accepted int
		refused  bool
	}{
		{Snapshot{Entries: []Entry{entry("a.service", v1)}, Signatures: []Entry{sig(v1, 1)}}, 1, false},
		{Snapshot{Entries: []Entry{entry("a.service", v1)}, Signatures: []Entry{sig(v1, 1)}}, 0, false}, // a resync
		{Snapshot{Entries: []Entry{entry("a.service", v2)}}, 0, true},                                   // unsigned
		{Snapshot{Entries: []Entry{entry("a.service", v2)}, Signatures: []Entry{sig(v2, 2)}}, 1, false},
		{Snapshot{Entries: []Entry{entry("a.service", v1)}, Signatures: []Entry{sig(v1, 1)}}, 0, true}, // replayed
		{Snapshot{}, 0, true}, // removed unsigned
		{Snapshot{Signatures: []Entry{sigRecord("hosts/h1", "a.service", nil, 3, false, "SHA256:alice")}}, 1, false},
	}
	for i, st := range steps {
		d.update(st.s)
		acc, marks := d.trust.takeAccepted()
		if len(acc) != st.accepted {
			t.Errorf("step %d: accepted %+v, want %d", i, acc, st.accepted)
		}
		for _, k := range acc {
			if k.Signer.Principals != "alice" || k.Unit != "a.service" {
				t.Errorf("step %d: accepted %+v", i, k)
			}
		}
		if marks != nil {
			saved++
			d.trust.changed = false
		}
		u := d.units["a.service"]
		if refused := u != nil && u.Err != nil; refused != st.refused {
			t.Errorf("step %d: refused %v (%v), want %v", i, refused, u, st.refused)
		}
	}
	if saved != 3 {
		t.Errorf("marks saved %d times, want 3 (one per accepted change)", saved)
	}
}

// The signed message is the documented text, line for line.
func TestSignedChangeMessage(t *testing.T) {
	got := string(SignedChange{Key: "/agentd/hosts/h1/units/a.service", Target: "hosts/h1", Hash: "ab", Seq: 7}.Message())
	want := "agentd signed change v1\nkey /agentd/hosts/h1/units/a.service\ntarget hosts/h1\ncontent sha256:ab\nsequence 7\nrevert no\n"
	if got != want {
		t.Errorf("message:\n%s\nwant:\n%s", got, want)
	}
	got = string(SignedChange{Key: "/p/groups/web/units/a.service", Target: "groups/web", Seq: 8, Revert: true}.Message())
	if !strings.Contains(got, "content removed\n") || !strings.Contains(got, "revert yes\n") {
		t.Errorf("removal message:\n%s", got)
	}
}

// The marks are saved off the loop: the newest win, a failed save is
// retried, and what is pending when the agent stops is saved then.
func TestMarksSavedOffTheLoop(t *testing.T) {
	var mu sync.Mutex
	var saved []map[string]Mark
	fail := 1
	o := newMarksOut(&Trust{SaveMarks: func(m map[string]Mark) error {
		mu.Lock()
		defer mu.Unlock()
		if fail > 0 {
			fail--
			return errors.New("disk full")
		}
		saved = append(saved, m)
		return nil
	}}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	wait := o.start(ctx)
	o.offer(map[string]Mark{"k": {Seq: 1}})
	last := func() Mark {
		mu.Lock()
		defer mu.Unlock()
		if len(saved) == 0 {
			return Mark{}
		}
		return saved[len(saved)-1]["k"]
	}
	deadline := time.Now().Add(5 * time.Second)
	for last().Seq != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if last().Seq != 1 {
		t.Fatal("a failed save was not retried")
	}
	o.offer(map[string]Mark{"k": {Seq: 2}})
	cancel()
	wait()
	if last().Seq != 2 {
		t.Fatalf("the marks pending at stop were not saved: %+v", last())
	}
}
