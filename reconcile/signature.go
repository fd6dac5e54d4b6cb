// Signed changes, on the wire and in the configuration: what a writer
// signs (SignedChange), the record stored beside a key (SignatureRecord),
// the allowed signers (Verifier, Trust), and what a refusal says
// (RefusedError). The check itself is trust.go.

package reconcile

import (
	"errors"
	"fmt"
)

// SignatureNamespace is the namespace of agentd's signatures
// (ssh-keygen -Y sign -n agentd).
const SignatureNamespace = "agentd"

// SignedChange is what one signature says: this content (Hash; "" for a
// removal) for this key of this target, at this sequence.
type SignedChange struct {
	Key    string // the full registry key, e.g. "/agentd/hosts/h1/units/hello.service"
	Target string // "hosts/<host>" or "groups/<group>"
	Hash   string // SHA-256 (hex) of the content; "" for a removal
	Seq    uint64 // grows with every signed write of the key
	Revert bool   // written by `agentd unit revert`
}

// Message is the text that is signed: one "name value" line each, so it
// can be written out and checked with ssh-keygen -Y verify as it is.
func (c SignedChange) Message() []byte {
	content := "sha256:" + c.Hash
	if c.Hash == "" {
		content = "removed"
	}
	revert := "no"
	if c.Revert {
		revert = "yes"
	}
	return fmt.Appendf(nil, "agentd signed change v1\nkey %s\ntarget %s\ncontent %s\nsequence %d\nrevert %s\n",
		c.Key, c.Target, content, c.Seq, revert)
}

// SignatureRecord is the value of a signature key (JSON). The agent
// rebuilds the message from where the record is and what the key holds;
// Key, Hash, Removed and Signer only explain a refusal.
type SignatureRecord struct {
	Key       string `json:"key"`
	Hash      string `json:"hash,omitempty"`
	Removed   bool   `json:"removed,omitempty"`
	Seq       uint64 `json:"seq"`
	Revert    bool   `json:"revert,omitempty"`
	Signer    string `json:"signer,omitempty"` // the key's fingerprint
	Signature string `json:"signature"`        // armored SSH signature
}

// Signer is who made a valid signature: the key's fingerprint and the
// principals of the allowed_signers line that lets it in.
type Signer struct {
	Fingerprint string
	Principals  string
}

func (s Signer) String() string {
	if s.Principals == "" {
		return s.Fingerprint
	}
	return s.Fingerprint + " (" + s.Principals + ")"
}

// ErrSignatureMismatch is wrapped by a Verifier's error when the signature
// is well formed and by an allowed signer but not over the message: the
// refusal then says what the record claims it signed.
var ErrSignatureMismatch = errors.New("signature does not match")

// Verifier checks an armored signature over msg in SignatureNamespace
// against the allowed signers. It returns the signer, also with an error
// when the key is known (or only its fingerprint, for an unknown key).
// It must be deterministic: Desire calls it.
type Verifier interface {
	VerifyChange(msg, armored []byte) (Signer, error)
}

// Trust turns the check on (Config.Trust).
type Trust struct {
	Verifier Verifier
	// Targets are this host's unit key roots: its own and its groups'.
	Targets []SignedTarget
	// GroupTarget is the root of a group joined while the agent runs (a
	// selector target's, by its labels), for a key of a group not in
	// Targets; nil: such a key is refused as of a target it does not know.
	GroupTarget func(group string) SignedTarget
	// Marks are the newest versions accepted, by full key, as saved.
	Marks map[string]Mark
	// SaveMarks saves the marks (the state directory) when they changed;
	// nil: kept in memory only.
	SaveMarks func(map[string]Mark) error
}

// SignedTarget is where one target's unit keys are.
type SignedTarget struct {
	Scope Scope
	Group string // for ScopeGroup
	Name  string // "hosts/<host>" or "groups/<group>"
	Root  string // "<prefix>/hosts/<host>/units/": a unit key suffix appended is the full key
}

// Mark is the newest version of a key the agent accepted.
type Mark struct {
	Seq     uint64 `json:"seq"`
	Hash    string `json:"hash,omitempty"` // the content accepted; "" with Removed
	Removed bool   `json:"removed,omitempty"`
}

// Refusal words, the start of a refused unit's status error.
const (
	RefusedUnsigned = "unsigned"
	RefusedBadSig   = "bad signature"
	RefusedReplayed = "replayed"
)

// RefusedError blocks a unit whose change is not signed as it must be.
type RefusedError struct {
	Why    string // RefusedUnsigned, RefusedBadSig, RefusedReplayed
	Key    string // the full registry key
	Detail string
}

func (e *RefusedError) Error() string {
	return "refused: " + e.Why + ": " + e.Key + ": " + e.Detail
}

// SignedKey is how one key of a unit passed the check (DesiredUnit.Signed).
type SignedKey struct {
	Unit    string
	Key     string
	Signer  Signer
	Seq     uint64
	Revert  bool
	Removed bool
	// Kept: the content is the one last accepted for the key; no valid
	// signature of it was needed.
	Kept bool
}
