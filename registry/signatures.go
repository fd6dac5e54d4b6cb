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
		out = append(out, c.GroupSignedTarget(g))
	}
	return out
}

// GroupSignedTarget is the unit key root of group, as SignedTargets names
// a group's: for a group the agent joins while it runs (a selector's).
func (c *Client) GroupSignedTarget(group string) reconcile.SignedTarget {
	t := Target{Group: group}
	return reconcile.SignedTarget{Scope: reconcile.ScopeGroup, Group: group, Name: t.String(), Root: c.groupUnits(group)}
}

// sign adds, for each key written, its signature record (or, unsigned,
// clears the record it has), guarded by that record being unchanged since
// it was read.
func (w *writeTxn) sign() error {
	c, t, o := w.c, w.target, w.o
	now := uint64(max(o.now().UnixMilli(), 0))
	for _, u := range w.names {
		s, key := w.st[u], c.signatureRoot(t)+u
		if o.signer == nil {
			if s.sigRev != 0 {
				// No signature, but the sequence stays: the next signed
				// write continues from it whatever its writer's clock says.
				b, err := json.Marshal(reconcile.SignatureRecord{Key: c.targetUnits(t) + u, Seq: s.sigSeq, Removed: w.removal()})
				if err != nil {
					return err
				}
				w.guard(clientv3.Compare(clientv3.ModRevision(key), "=", s.sigRev))
				w.then(clientv3.OpPut(key, string(b)))
			}
			continue
		}
		w.guard(clientv3.Compare(clientv3.ModRevision(key), "=", s.sigRev))
		ch := reconcile.SignedChange{Key: c.targetUnits(t) + u, Target: t.String(), Seq: max(now, s.sigSeq+1), Revert: o.revert}
		if !w.removal() {
			ch.Hash = reconcile.Hash(w.values[u])
		}
		sig, err := o.signer.SignChange(ch.Message())
		if err != nil {
			return fmt.Errorf("sign %s: %w", ch.Key, err)
		}
		b, err := json.Marshal(reconcile.SignatureRecord{Key: ch.Key, Hash: ch.Hash, Removed: w.removal(), Seq: ch.Seq, Revert: ch.Revert,
			Signer: o.signer.Fingerprint(), Signature: string(sig)})
		if err != nil {
			return fmt.Errorf("encode the signature of %s: %w", ch.Key, err)
		}
		w.then(clientv3.OpPut(key, string(b)))
	}
	return nil
}

// sizeOnly stands in for a signer where only the size of the write
// matters (CheckPut): a signature of the size of an RSA-4096 one, the
// largest common key.
type sizeOnly struct{ ChangeSigner }

func (sizeOnly) SignChange([]byte) ([]byte, error) {
	return []byte("-----BEGIN SSH SIGNATURE-----\n" + strings.Repeat("A", 1100) + "\n-----END SSH SIGNATURE-----\n"), nil
}
