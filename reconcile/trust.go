package reconcile

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Signed changes (agentd run --allowed-signers): the agent applies a
// change of a registry key only when an allowed signer signed it.
//
// A writer (`agentd unit put|rm|revert|edit --sign-key`) stores, in the
// transaction of the write, a SignatureRecord beside each unit key it
// writes: <p>/hosts/<h>/signatures/<key> (or groups/<g>/…), an OpenSSH
// signature (namespace SignatureNamespace) over SignedChange.Message: the
// full key, its target, the content's hash or "removed", a sequence
// number and whether it is a revert. The agent reads the records with the
// keys (one watch per target: a key and its record arrive in one
// snapshot, Snapshot.Signatures) and checks them here, in Desire, as a
// pure function of the snapshot, the allowed signers (Verifier) and the
// newest version it accepted of each key (Mark, kept in the state
// directory): a unit with a key it refuses is blocked (DesiredUnit.Err,
// a *RefusedError), so the version it runs is kept and its status says why.
//
// The rules, per key that gives this host content (a host key, else every
// group key of the path):
//   - content with a valid signature whose sequence is not lower than the
//     Mark's is accepted and becomes the Mark;
//   - the content of the Mark needs no new signature: the host runs it
//     already (a rollout keeping a host on the version before, a start
//     from the saved snapshot);
//   - else: no record is "unsigned", a record that does not verify (other
//     content, another key or target, an unknown key, another namespace,
//     truncated) is "bad signature", a valid one with a lower sequence is
//     "replayed";
//   - a key that had accepted content and is gone needs a signed removal
//     (a record saying "removed") by the same rules.

// trustState is the check's part of desiredState: the signature records
// of the last snapshot by unit, and the marks. Loop-owned.
type trustState struct {
	cfg     Trust
	targets map[targetID]SignedTarget
	marks   map[string]Mark
	// changed: marks changed since they were last saved; accepted: the
	// keys accepted with a new mark since the last takeAccepted.
	changed  bool
	accepted []SignedKey
	sigs     []Entry            // sorted
	byUnit   map[string][]Entry // the same, by unit
	// markUnits are the keys of this host's targets with a mark, by unit.
	markUnits map[string][]Entry
	primed    bool // the units of the marks were looked at once
}

type targetID struct {
	scope Scope
	group string
}

func newTrustState(t *Trust) *trustState {
	if t == nil {
		return nil
	}
	s := &trustState{cfg: *t, targets: map[targetID]SignedTarget{}, marks: maps.Clone(t.Marks), byUnit: map[string][]Entry{}}
	if s.marks == nil {
		s.marks = map[string]Mark{}
	}
	for _, tg := range t.Targets {
		if tg.Scope == ScopeHost {
			tg.Group = ""
		}
		s.targets[targetID{tg.Scope, tg.Group}] = tg
	}
	s.markUnits = map[string][]Entry{}
	for _, k := range slices.Sorted(maps.Keys(s.marks)) {
		s.addMark(k)
	}
	return s
}

func (t *trustState) target(e Entry) (SignedTarget, bool) {
	if e.Scope == ScopeHost {
		e.Group = ""
	}
	tg, ok := t.targets[targetID{e.Scope, e.Group}]
	if !ok && e.Scope == ScopeGroup && e.Group != "" && t.cfg.GroupTarget != nil {
		// A group joined since the start (a selector's): the snapshot has
		// its keys only because this host is a member.
		tg, ok = t.cfg.GroupTarget(e.Group), true
		t.targets[targetID{e.Scope, e.Group}] = tg
	}
	return tg, ok
}

// update takes in the snapshot's signature records and adds to dirty the
// units whose records changed (the first time, also the units of every
// mark: a key gone while the agent was away).
func (t *trustState) update(sigs []Entry, dirty map[string]bool) {
	now := SortedEntries(sigs)
	indexByUnit(t.byUnit, t.sigs, now, dirty)
	t.sigs = now
	if !t.primed {
		t.primed = true
		for name := range t.markUnits {
			dirty[name] = true
		}
	}
}

// check checks the keys of unit name (es, sorted: the host's first) and
// the records and marks of keys it no longer has. u is what the keys make
// of it (nil: none). It returns the unit as the check leaves it: blocked
// by the first refusal (a unit with no keys left, whose removal is
// refused, comes back blocked), with Signed filled in.
func (t *trustState) check(name string, es []Entry, u *DesiredUnit) *DesiredUnit {
	recs := map[keyID]Entry{}
	for _, r := range t.byUnit[name] {
		recs[idOf(r)] = r
	}
	hostHas := map[string]bool{} // paths a host key gives: the groups' keys of them do not count
	for _, e := range es {
		if e.Scope == ScopeHost {
			hostHas[e.Unit] = true
		}
	}
	var (
		signed  []SignedKey
		refusal *RefusedError
	)
	look := func(e Entry, hash string) {
		if e.Scope == ScopeGroup && hostHas[e.Unit] {
			return
		}
		rec, hasRec := recs[idOf(e)]
		sk, r := t.checkKey(e, hash, rec, hasRec)
		switch {
		case r != nil && refusal == nil:
			refusal = r
		case r == nil && sk.Key != "":
			signed = append(signed, sk)
		}
	}
	present := map[keyID]bool{}
	for _, e := range es {
		present[idOf(e)] = true
		look(e, Hash(e.Value))
	}
	// Keys gone: those with a record, and those with a mark.
	var gone []Entry
	for k, r := range recs {
		if !present[k] {
			present[k] = true
			gone = append(gone, Entry{Scope: r.Scope, Group: r.Group, Unit: r.Unit})
		}
	}
	for _, e := range t.markUnits[name] {
		if !present[idOf(e)] {
			present[idOf(e)] = true
			gone = append(gone, e)
		}
	}
	slices.SortFunc(gone, CompareEntries)
	for _, e := range gone {
		look(e, "")
	}
	if refusal == nil && u == nil {
		return nil
	}
	if u == nil {
		u = &DesiredUnit{Name: name, DropIns: map[string]DesiredFile{}}
	}
	if refusal != nil {
		u.Err = refusal
	}
	u.Signed = signed
	return u
}

// keyID is a registry key's identity in a snapshot.
type keyID struct {
	scope       Scope
	group, unit string
}

func idOf(e Entry) keyID { return keyID{e.Scope, e.Group, e.Unit} }

// addMark notes the unit of a marked key (markUnits).
func (t *trustState) addMark(key string) {
	for _, tg := range t.targets {
		if unit, ok := strings.CutPrefix(key, tg.Root); ok {
			name := keyUnit(unit)
			t.markUnits[name] = append(t.markUnits[name], Entry{Scope: tg.Scope, Group: tg.Group, Unit: unit})
			return
		}
	}
}

// checkKey checks one key: its content hash (or "" when the key is gone)
// against its record (if any) and its mark. For a gone key without a
// mark of content the result is empty: nothing of it was ever accepted,
// so its absence changes nothing.
func (t *trustState) checkKey(e Entry, hash string, rec Entry, hasRec bool) (SignedKey, *RefusedError) {
	tg, ok := t.target(e)
	if !ok {
		return SignedKey{}, &RefusedError{Why: RefusedUnsigned, Key: e.Scope.String() + ":" + e.Group + "/" + e.Unit, Detail: "a key of a target this agent does not know"}
	}
	key := tg.Root + e.Unit
	unit := keyUnit(e.Unit)
	removed := hash == ""
	m, hasMark := t.marks[key]
	kept := hasMark && m.Removed == removed && m.Hash == hash // what the host was last given
	if removed && (!hasMark || m.Removed) {
		return SignedKey{}, nil // nothing of it was accepted, or its removal already was
	}
	what := "sha256 " + short(hash)
	if removed {
		what = "its removal"
	}
	var r SignatureRecord
	decodeErr := error(nil)
	if hasRec {
		decodeErr = json.Unmarshal(rec.Value, &r)
		hasRec = decodeErr != nil || r.Signature != "" // a record without a signature: an unsigned write kept its sequence
	}
	if !hasRec {
		if kept {
			return SignedKey{Unit: unit, Key: key, Seq: m.Seq, Kept: true}, nil
		}
		detail := what + " has no signature (store it with agentd unit put --sign-key)"
		if removed {
			detail = "removed from the registry without a signed removal (agentd unit rm --sign-key); the unit is kept as it is — put it back signed, or sign its removal"
		}
		return SignedKey{}, &RefusedError{Why: RefusedUnsigned, Key: key, Detail: detail}
	}
	if decodeErr != nil {
		if kept {
			return SignedKey{Unit: unit, Key: key, Seq: m.Seq, Kept: true}, nil
		}
		return SignedKey{}, &RefusedError{Why: RefusedBadSig, Key: key, Detail: "its signature record is not JSON: " + decodeErr.Error()}
	}
	c := SignedChange{Key: key, Target: tg.Name, Hash: hash, Seq: r.Seq, Revert: r.Revert}
	who, err := t.cfg.Verifier.VerifyChange(c.Message(), []byte(r.Signature))
	if err != nil {
		if kept {
			return SignedKey{Unit: unit, Key: key, Seq: m.Seq, Kept: true}, nil
		}
		return SignedKey{}, &RefusedError{Why: RefusedBadSig, Key: key, Detail: badSignature(c, r, who, err)}
	}
	sk := SignedKey{Unit: unit, Key: key, Signer: who, Seq: r.Seq, Revert: r.Revert, Removed: removed}
	switch {
	case !hasMark || r.Seq > m.Seq:
		if !hasMark {
			t.addMark(key)
		}
		t.marks[key] = Mark{Seq: r.Seq, Hash: hash, Removed: removed}
		t.changed = true
		t.accepted = append(t.accepted, sk)
	case r.Seq == m.Seq && kept:
	case kept:
		sk.Kept, sk.Seq = true, m.Seq // an older signature of the same content: nothing changes
	default:
		return SignedKey{}, &RefusedError{Why: RefusedReplayed, Key: key, Detail: fmt.Sprintf(
			"%s signed by %s at sequence %d, but sequence %d was already accepted for this key (an old signed version put back; sign it anew: agentd unit revert --sign-key, or put --sign-key)",
			what, who, r.Seq, m.Seq)}
	}
	return sk, nil
}

// badSignature says why a record does not sign what the key holds.
func badSignature(c SignedChange, r SignatureRecord, who Signer, err error) string {
	by := ""
	if who.Fingerprint != "" {
		by = "signed by " + who.String() + ": "
	}
	if !errors.Is(err, ErrSignatureMismatch) {
		return by + err.Error()
	}
	switch {
	case r.Key != c.Key:
		return by + "signed for " + r.Key + ", not for this key (another host, group or unit)"
	case r.Removed != (c.Hash == "") || r.Hash != c.Hash:
		signed := "sha256 " + short(r.Hash)
		if r.Removed {
			signed = "its removal"
		}
		now := "sha256 " + short(c.Hash)
		if c.Hash == "" {
			now = "no content (removed)"
		}
		return by + "signed for other content: the signature is for " + signed + ", the registry holds " + now
	}
	return by + "the signature does not match key, content, target, sequence " + strconv.FormatUint(c.Seq, 10) + " and revert flag"
}

// takeAccepted returns the keys accepted with a new mark since the last
// call, and the marks to save when they changed (nil otherwise).
func (t *trustState) takeAccepted() (accepted []SignedKey, marks map[string]Mark) {
	accepted, t.accepted = t.accepted, nil
	if t.changed {
		marks = maps.Clone(t.marks)
	}
	return accepted, marks
}

// fresh is a new check from the marks as they are now (checkDesired).
func (t *trustState) fresh() *trustState {
	cfg := t.cfg
	cfg.Marks = t.marks
	return newTrustState(&cfg)
}
