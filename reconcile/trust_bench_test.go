package reconcile

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agentd/agentd/sshsig"
)

// sshVerifier is the agent's Verifier (cmd/agentd's allowedSigners) on
// sshsig, here so that the benchmark checks real signatures.
type sshVerifier struct{ as *sshsig.AllowedSigners }

func (v sshVerifier) VerifyChange(msg, armored []byte) (Signer, error) {
	who, err := v.as.Verify(armored, SignatureNamespace, msg, time.Time{})
	return Signer{Fingerprint: who.Fingerprint, Principals: who.Principals}, err
}

// BenchmarkSignedChange is what the signature check adds to one changed
// unit key (--allowed-signers): Desire's update of a snapshot in which one
// unit of 100 changed, with and without the check, beside a baseline
// measured in the same run — SHA-256 of the unit file, which every change
// costs anyway. The signed row decodes the record, rebuilds the message,
// parses the armored SSH signature, finds the key among the allowed
// signers and verifies it (ed25519, sha512).
//
//	go test ./reconcile -run '^$' -bench SignedChange
func BenchmarkSignedChange(b *testing.B) {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		b.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		b.Fatal(err)
	}
	as, err := sshsig.ParseAllowedSigners("allowed_signers", strings.NewReader(
		`ops namespaces="agentd" `+string(ssh.MarshalAuthorizedKey(signer.PublicKey()))))
	if err != nil {
		b.Fatal(err)
	}
	root := "/agentd/hosts/h1/units/"
	unit := func(i, v int) []byte {
		return fmt.Appendf(nil, "[Unit]\nDescription=unit %d\n[Service]\nType=exec\nExecStart=/usr/bin/sleep %d\n[X-Agentd]\nHealthySec=0\n", i, 1000+v)
	}
	sign := func(name string, content []byte, seq uint64) Entry {
		c := SignedChange{Key: root + name, Target: "hosts/h1", Hash: Hash(content), Seq: seq}
		sig, err := sshsig.Sign(signer, SignatureNamespace, c.Message())
		if err != nil {
			b.Fatal(err)
		}
		v, _ := json.Marshal(SignatureRecord{Key: c.Key, Hash: c.Hash, Seq: seq, Signature: string(sig)})
		return Entry{Scope: ScopeHost, Unit: name, Value: v, ModRevision: int64(seq)}
	}
	// Two snapshots of 100 signed units that differ in u-0.service only.
	var snaps [2]Snapshot
	for v := range 2 {
		for i := range 100 {
			name := fmt.Sprintf("u-%d.service", i)
			content, seq := unit(i, 0), uint64(1)
			if i == 0 {
				content, seq = unit(i, v+1), uint64(v+2)
			}
			snaps[v].Entries = append(snaps[v].Entries, Entry{Scope: ScopeHost, Unit: name, Value: content, ModRevision: int64(seq)})
			snaps[v].Signatures = append(snaps[v].Signatures, sign(name, content, seq))
		}
	}
	trust := &Trust{Verifier: sshVerifier{as}, Targets: []SignedTarget{{Scope: ScopeHost, Name: "hosts/h1", Root: root}}}
	run := func(b *testing.B, d *desiredState) {
		d.update(snaps[0])
		i := 0
		for b.Loop() {
			i++
			if d.trust != nil {
				d.trust.marks[root+"u-0.service"] = Mark{} // each version is new again
			}
			changes := d.update(snaps[i%2])
			if len(changes) != 1 || changes[0].now.Err != nil {
				b.Fatalf("update: %+v", changes)
			}
		}
	}
	b.Run("baseline/sha256-of-the-unit-file", func(b *testing.B) {
		content := unit(0, 1)
		for b.Loop() {
			sha256.Sum256(content)
		}
	})
	b.Run("desire-one-change/unsigned", func(b *testing.B) { run(b, &desiredState{}) })
	b.Run("desire-one-change/signed", func(b *testing.B) { run(b, &desiredState{trust: newTrustState(trust)}) })
}
