package fakecluster

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/releasekeys"
	"plinth.dev/plinth/roleserver/curator/escrow"
	"plinth.dev/plinth/roleserver/identity"
)

// Escrow certifies the owner key as a curator does: only over a TLS
// session of that key, for the owner identity, against a proof bound to
// the session; the certificate comes from the issuer.
func (f *Cluster) Escrow(s grpc.BidiStreamingServer[clusterpb.EscrowFromClient, clusterpb.EscrowFromServer]) error {
	f.mu.Lock()
	f.escrows++
	issuer, pub := f.issuer, f.ownerKey
	f.mu.Unlock()
	p, err := identity.PeerFromContext(s.Context(), identity.NewTrust(f.CA.Certificate))
	if err != nil || p.Kind != identity.KindEphemeral || !p.PublicKey.Equal(pub) {
		return status.Error(codes.PermissionDenied, "not the owner key")
	}
	m, err := s.Recv()
	if err != nil {
		return err
	}
	params := m.GetParameters()
	if params.GetRequestedIdentityName() != identity.OwnerName || !bytes.Equal(params.GetPublicKey(), pub) {
		return status.Errorf(codes.InvalidArgument, "bad parameters %v", params)
	}
	nonce := make([]byte, 32)
	rand.Read(nonce)
	if err := s.Send(&clusterpb.EscrowFromServer{Message: &clusterpb.EscrowFromServer_NeededProofs_{NeededProofs: &clusterpb.EscrowFromServer_NeededProofs{Nonce: nonce}}}); err != nil {
		return err
	}
	if m, err = s.Recv(); err != nil {
		return err
	}
	if err := escrow.VerifyEscrowProof(pub, nonce, p.TLS, m.GetProof().GetSignature()); err != nil {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	cert, err := identity.IssueOwnerCertificate(issuer, pub)
	if err != nil {
		return err
	}
	return s.Send(&clusterpb.EscrowFromServer{Message: &clusterpb.EscrowFromServer_Fulfilled_{Fulfilled: &clusterpb.EscrowFromServer_Fulfilled{OwnerCertificate: cert.Raw}}})
}

// GetClusterInfo reports the info CA and a directory of the node alone,
// at 10.42.0.10.
func (f *Cluster) GetClusterInfo(ctx context.Context, _ *clusterpb.GetClusterInfoRequest) (*clusterpb.GetClusterInfoResponse, error) {
	if err := f.owner(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	infoCA, policy, crl := f.infoCA, f.policy, f.crl
	f.mu.Unlock()
	return &clusterpb.GetClusterInfoResponse{
		Configuration: policy,
		CaCertificate: infoCA.Certificate.Raw,
		Crl:           crl,
		Directory: &clusterpb.ClusterDirectory{Nodes: []*clusterpb.DirectoryNode{
			{Id: f.Node.ID(), PublicKey: f.Node.PublicKey(), Addresses: []string{"10.42.0.10"}},
		}},
	}, nil
}

// UpdateClusterPolicy replaces the Kubernetes policy and appends a
// release key set, each refused as the curator refuses it
// (KubernetesPolicy.Check, releasekeys.CheckNext).
func (f *Cluster) UpdateClusterPolicy(ctx context.Context, req *clusterpb.UpdateClusterPolicyRequest) (*clusterpb.UpdateClusterPolicyResponse, error) {
	if err := f.owner(ctx); err != nil {
		return nil, err
	}
	if err := req.GetKubernetes().Check(); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "kubernetes: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.policy == nil {
		f.policy = &clusterpb.ClusterConfiguration{}
	}
	if next := req.GetReleaseKeys(); next != nil {
		keys, err := releasekeys.CheckNext(f.policy.ReleaseKeyChainSigned(), next.Signed())
		if err != nil {
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
		f.policy.ReleaseKeyChain = append(f.policy.ReleaseKeyChain, next)
		f.policy.ReleaseKeys = keys
	}
	if k := req.GetKubernetes(); k != nil {
		f.policy.Kubernetes = k
	}
	return &clusterpb.UpdateClusterPolicyResponse{Configuration: f.policy}, nil
}

func (f *Cluster) GetRegisterTicket(ctx context.Context, _ *clusterpb.GetRegisterTicketRequest) (*clusterpb.GetRegisterTicketResponse, error) {
	if err := f.owner(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return &clusterpb.GetRegisterTicketResponse{Ticket: f.ticket}, nil
}

// RotateRegisterTicket replaces the ticket with 32 random bytes.
func (f *Cluster) RotateRegisterTicket(ctx context.Context, _ *clusterpb.RotateRegisterTicketRequest) (*clusterpb.RotateRegisterTicketResponse, error) {
	if err := f.owner(ctx); err != nil {
		return nil, err
	}
	t := make([]byte, 32)
	rand.Read(t)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ticket = t
	return &clusterpb.RotateRegisterTicketResponse{Ticket: t}, nil
}

// GetNodes lists the nodes (EditNodes), without filtering.
func (f *Cluster) GetNodes(_ *clusterpb.GetNodesRequest, s grpc.ServerStreamingServer[clusterpb.Node]) error {
	if err := f.owner(s.Context()); err != nil {
		return err
	}
	f.mu.Lock()
	nodes := clone(f.nodes)
	f.mu.Unlock()
	for _, n := range nodes {
		if err := s.Send(n); err != nil {
			return err
		}
	}
	return nil
}

// ApproveNode records the key (Approved) and changes no node.
func (f *Cluster) ApproveNode(ctx context.Context, r *clusterpb.ApproveNodeRequest) (*clusterpb.ApproveNodeResponse, error) {
	if err := f.owner(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.approved = append(f.approved, r.GetPublicKey())
	return &clusterpb.ApproveNodeResponse{}, nil
}

// Policy is the cluster policy as UpdateClusterPolicy left it.
func (f *Cluster) Policy() *clusterpb.ClusterConfiguration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.policy
}

// SetCRL makes GetClusterInfo hand out der as the cluster CRL.
func (f *Cluster) SetCRL(der []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.crl = der
}

// RotateOwnerKey replaces the owner key Escrow certifies, as a curator
// does: signed by the new key for this cluster's CA. (The fake keeps no
// record of certificates to revoke: SetCRL is the test's.)
func (f *Cluster) RotateOwnerKey(ctx context.Context, req *clusterpb.RotateOwnerKeyRequest) (*clusterpb.RotateOwnerKeyResponse, error) {
	if err := f.owner(ctx); err != nil {
		return nil, err
	}
	next := ed25519.PublicKey(req.GetNewPublicKey())
	if len(next) != ed25519.PublicKeySize || !ed25519.Verify(next, identity.OwnerKeyRotationMessage(f.CA.Certificate.Raw, next), req.GetSignature()) {
		return nil, status.Error(codes.InvalidArgument, "signature: not the new key's")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ownerKey = next
	return &clusterpb.RotateOwnerKeyResponse{Revoked: 1}, nil
}
