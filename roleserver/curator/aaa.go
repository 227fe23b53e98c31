package curator

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/curator/escrow"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

// Escrow hands the owner certificate to whoever proves it holds the owner
// key from the bootstrap parameters; see package escrow for the proof.
func (a aaaServer) Escrow(srv clusterpb.AAA_EscrowServer) error {
	ctx := srv.Context()
	p := rpc.PeerFrom(ctx)
	kv, _, err := a.backend()
	if err != nil {
		return err
	}
	msg, err := srv.Recv()
	if err != nil {
		return err
	}
	params := msg.GetParameters()
	if params == nil {
		return status.Error(codes.InvalidArgument, "the first message must be parameters")
	}
	if name := params.RequestedIdentityName; name != "" && name != escrow.IdentityOwner {
		return status.Errorf(codes.InvalidArgument, "unknown identity %q (only %q exists)", name, escrow.IdentityOwner)
	}
	pub := ed25519.PublicKey(params.PublicKey)
	if !pub.Equal(p.PublicKey) {
		return status.Error(codes.PermissionDenied, "public_key is not the key of the caller's TLS certificate")
	}
	owner, err := ownerKeyIs(ctx, kv, pub)
	if err != nil {
		return err
	}
	if !owner {
		return status.Error(codes.PermissionDenied, "public_key is not the owner key of this cluster")
	}
	nonce := make([]byte, 32)
	if _, err := rand.Read(nonce); err != nil {
		return internalErr("nonce", err)
	}
	if err := srv.Send(&clusterpb.EscrowFromServer{Message: &clusterpb.EscrowFromServer_NeededProofs_{
		NeededProofs: &clusterpb.EscrowFromServer_NeededProofs{Nonce: nonce},
	}}); err != nil {
		return err
	}
	if msg, err = srv.Recv(); err != nil {
		return err
	}
	proof := msg.GetProof()
	if proof == nil {
		return status.Error(codes.InvalidArgument, "the second message must be the proof")
	}
	if err := escrow.VerifyEscrowProof(pub, nonce, p.TLS, proof.Signature); err != nil {
		return status.Errorf(codes.PermissionDenied, "proof refused: %v", err)
	}
	ca, err := loadCA(ctx, kv)
	if err != nil {
		return err
	}
	// Recorded, so that a rotation of the owner key revokes it.
	cert, err := issueRecorded(ctx, kv, ownerCertsID, certOwner, func() (*x509.Certificate, error) { return identity.IssueOwnerCertificate(ca, pub) })
	if err != nil {
		return err
	}
	if err := checkOwnerCertificate(ctx, kv, pub); err != nil {
		return err
	}
	return srv.Send(&clusterpb.EscrowFromServer{Message: &clusterpb.EscrowFromServer_Fulfilled_{
		Fulfilled: &clusterpb.EscrowFromServer_Fulfilled{OwnerCertificate: cert.Raw},
	}})
}
