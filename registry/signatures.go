package registry

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agentd/agentd/reconcile"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Signed writes (see reconcile/trust.go for what the agent checks).
//
// A write with SignWith stores, beside each unit key it writes and in the
// same transaction, a reconcile.SignatureRecord (JSON) at
//
//	<p>/hosts/<host>/signatures/<key>
//	<p>/groups/<group>/signatures/<key>
//
// — inside the target's own prefix, so the agent's one watch of
// <p>/hosts/<host>/ (and of each <p>/groups/<g>/) brings a key and its
// record in one response, and the agent's least-privilege role, which
// reads those prefixes, reads them too. A removal stores a record that
// says "removed" (the key is gone; its record stays). A write without
// SignWith empties the record of each key it writes (no signature, the
// sequence kept), so the agent says "unsigned" rather than judging an old
// signature against new content.
//
// The sequence number of a record is the writer's clock in milliseconds,
// or one more than the key's previous record when that is higher: it
// grows with every signed write of a key (writes of one key are
// serialized by the guard on its ModRevision, and on its record's), and
// keeps growing after the registry is restored from a backup.

// ChangeSigner signs the message of a signed write
// (reconcile.SignedChange.Message) in reconcile.SignatureNamespace.
type ChangeSigner interface {
	// SignChange returns the armored SSH signature of msg.
	SignChange(msg []byte) ([]byte, error)
	// Fingerprint is the signing key's SHA256 fingerprint.
	Fingerprint() string
}

// SignWith signs each key the write changes with s (see above).
func SignWith(s ChangeSigner) WriteOption { return func(o *writeOptions) { o.signer = s } }

// Reverting marks the write as a revert (`agentd unit revert`): the
// signed message says so.
func Reverting() WriteOption { return func(o *writeOptions) { o.revert = true } }

func (c *Client) targetRoot(t Target) string { return c.prefix + "/" + t.String() + "/" }

func (c *Client) signatureRoot(t Target) string { return c.targetRoot(t) + "signatures/" }

// parseSignatureKey splits "<p>/hosts/<h>/signatures/<unit>" (or groups/);
// ok is false for any other key.
func (c *Client) parseSignatureKey(key string) (t Target, unit string, ok bool) {
	return c.parseTargetKey(key, "/signatures/")
}

// SignedTargets are the unit key roots of host and its groups, as the
// agent's signature check names them (reconcile.Trust.Targets).
func (c *Client) SignedTargets(host string, groups []string) []reconcile.SignedTarget {
	out := []reconcile.SignedTarget{{Scope: reconcile.ScopeHost, Name: Target{Host: host}.String(), Root: c.hostUnits(host)}}
	for _, g := range groups {
		t := Target{Group: g}
		out = append(out, reconcile.SignedTarget{Scope: reconcile.ScopeGroup, Group: g, Name: t.String(), Root: c.groupUnits(g)})
	}
	return out
}

// signatureOps are the guards and operations that sign (or, unsigned,
// clear the records of) names, written with values (or removed), as read
// in st: a guard that each record is unchanged since, and its new record.
func (c *Client) signatureOps(t Target, names []string, values map[string][]byte, removed bool, st map[string]*keyState, o writeOptions) ([]clientv3.Cmp, []clientv3.Op, error) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	now := uint64(max(o.now().UnixMilli(), 0))
	for _, u := range names {
		s, key := st[u], c.signatureRoot(t)+u
		if o.signer == nil {
			if s.sigRev != 0 {
				// No signature, but the sequence stays: the next signed
				// write continues from it whatever its writer's clock says.
				b, err := json.Marshal(reconcile.SignatureRecord{Key: c.targetUnits(t) + u, Seq: s.sigSeq, Removed: removed})
				if err != nil {
					return nil, nil, err
				}
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", s.sigRev))
				ops = append(ops, clientv3.OpPut(key, string(b)))
			}
			continue
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", s.sigRev))
		ch := reconcile.SignedChange{Key: c.targetUnits(t) + u, Target: t.String(), Seq: max(now, s.sigSeq+1), Revert: o.revert}
		if !removed {
			ch.Hash = reconcile.Hash(values[u])
		}
		sig, err := o.signer.SignChange(ch.Message())
		if err != nil {
			return nil, nil, fmt.Errorf("sign %s: %w", ch.Key, err)
		}
		b, err := json.Marshal(reconcile.SignatureRecord{Key: ch.Key, Hash: ch.Hash, Removed: removed, Seq: ch.Seq, Revert: ch.Revert,
			Signer: o.signer.Fingerprint(), Signature: string(sig)})
		if err != nil {
			return nil, nil, fmt.Errorf("encode the signature of %s: %w", ch.Key, err)
		}
		ops = append(ops, clientv3.OpPut(key, string(b)))
	}
	return cmps, ops, nil
}

// sizeOnly stands in for a signer where only the size of the write
// matters (CheckPut): a signature of the size of an RSA-4096 one, the
// largest common key.
type sizeOnly struct{ ChangeSigner }

func (sizeOnly) SignChange([]byte) ([]byte, error) {
	return []byte("-----BEGIN SSH SIGNATURE-----\n" + strings.Repeat("A", 1100) + "\n-----END SSH SIGNATURE-----\n"), nil
}
