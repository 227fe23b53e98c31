package curator

import (
	"bytes"
	"context"
	"crypto/ed25519"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

// The owner key and its certificates:
//
//	/cluster/owner-key                      the owner's ed25519 public key
//	/certs/cluster-owner/owner/<serial>     every owner certificate Escrow issued
//
// RotateOwnerKey, called with the current owner's certificate and signed
// by the new key: the key is replaced (compare-and-swap on the old one),
// every recorded owner certificate goes on the CRL, and the owner's
// Kubernetes credentials move to a new epoch. An Escrow that raced with
// it (the old key proven just before) finds the key changed after it
// recorded its certificate, revokes it and refuses.
//
// Why: the owner key lies in the owner's configuration directory; whoever
// copies it holds the cluster until the owner takes it back. Guarded by
// TestRotateOwnerKey.

// Owner certificates are recorded as this "node"'s, of this kind; no node
// ID looks like it (identity.NodeID: "plinth-" and hex).
const (
	ownerCertsID = "cluster-owner"
	certOwner    = "owner"
)

// RotateOwnerKey: see management.proto.
func (m managementServer) RotateOwnerKey(ctx context.Context, req *clusterpb.RotateOwnerKeyRequest) (*clusterpb.RotateOwnerKeyResponse, error) {
	p := rpc.PeerFrom(ctx)
	kv, _, err := m.backend()
	if err != nil {
		return nil, err
	}
	next := ed25519.PublicKey(req.GetNewPublicKey())
	if len(next) != ed25519.PublicKeySize {
		return nil, status.Errorf(codes.InvalidArgument, "new_public_key: %d bytes, want an ed25519 public key", len(next))
	}
	if next.Equal(p.PublicKey) {
		return nil, status.Error(codes.InvalidArgument, "new_public_key is the owner key already")
	}
	ca, err := loadCA(ctx, kv)
	if err != nil {
		return nil, err
	}
	if !ed25519.Verify(next, identity.OwnerKeyRotationMessage(ca.Certificate.Raw, next), req.GetSignature()) {
		return nil, status.Error(codes.InvalidArgument, "signature: not the new key's over the rotation of this cluster's owner key")
	}
	// Only the current owner key's certificate: an old one not yet on
	// the CRL must not take the cluster back. A retry of this rotation
	// (its answer lost, or its revocation failed) finds next in place:
	// it finishes the revocation, as next's signature shows its holder
	// asks (TestRotateOwnerKeyRetried).
	resp, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.Value(keyOwnerKey), "=", string(p.PublicKey))).
		Then(clientv3.OpPut(keyOwnerKey, string(next))).Else(clientv3.OpGet(keyOwnerKey)).Commit()
	if err != nil {
		return nil, etcdErr("RotateOwnerKey", err)
	}
	if !resp.Succeeded && !rotatedTo(resp, next) {
		return nil, status.Error(codes.PermissionDenied, "the caller's certificate is not of the current owner key")
	}
	serials, err := issuedSerials(ctx, kv, ownerCertsID, certOwner)
	if err != nil {
		return nil, err
	}
	if err := revoke(ctx, kv, ownerCertsID, certOwner); err != nil {
		return nil, status.Errorf(status.Code(err), "the owner key is replaced but the old key's certificates are not revoked yet: %v", status.Convert(err).Message())
	}
	cfg, err := m.updateConfiguration(ctx, func(cfg *clusterpb.ClusterConfiguration) error {
		cfg.KubernetesOwnerEpoch++
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &clusterpb.RotateOwnerKeyResponse{Revoked: uint32(len(serials)), KubernetesOwnerEpoch: cfg.GetKubernetesOwnerEpoch()}, nil
}

// rotatedTo reports whether the Else branch of RotateOwnerKey's
// transaction read next as the owner key.
func rotatedTo(resp *clientv3.TxnResponse, next ed25519.PublicKey) bool {
	if len(resp.Responses) != 1 {
		return false
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	return len(kvs) == 1 && bytes.Equal(kvs[0].Value, next)
}

// checkOwnerCertificate runs after Escrow recorded an owner certificate
// for pub: if pub is no longer the owner key (a rotation raced with
// the Escrow), the certificate is revoked.
func checkOwnerCertificate(ctx context.Context, kv clientv3.KV, pub ed25519.PublicKey) error {
	owner, _, err := getValue(ctx, kv, keyOwnerKey)
	if err != nil {
		return etcdErr("reading owner key", err)
	}
	if bytes.Equal(owner, pub) {
		return nil
	}
	if err := revoke(ctx, kv, ownerCertsID, certOwner); err != nil {
		return err
	}
	return status.Error(codes.PermissionDenied, "the owner key changed while its certificate was issued")
}
