package curator

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"google.golang.org/grpc/codes"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/curator/escrow"
	"plinth.dev/plinth/roleserver/identity"
)

// TestEscrow: AAA.Escrow certifies the owner key only for a TLS session
// of that key and a proof signed by it; anything else is refused.
func TestEscrow(t *testing.T) {
	f := newSingle(t)
	a, ctx := f.a, f.ctx

	// Somebody else's key: refused before any proof.
	_, stranger, _ := ed25519.GenerateKey(rand.Reader)
	conn, creds := ephemeral(t, a.addr(), f.ca, stranger)
	_, err := escrow.TakeOwnership(ctx, clusterpb.NewAAAClient(conn), creds, stranger)
	wantCode(t, "Escrow with a stranger's key", err, codes.PermissionDenied, "owner key")

	// The owner key in Parameters, but a TLS certificate for another
	// key: refused.
	conn, _ = ephemeral(t, a.addr(), f.ca, stranger)
	st, err := clusterpb.NewAAAClient(conn).Escrow(ctx)
	mustOK(t, "Escrow", err)
	st.Send(&clusterpb.EscrowFromClient{Message: &clusterpb.EscrowFromClient_Parameters_{Parameters: &clusterpb.EscrowFromClient_Parameters{
		RequestedIdentityName: "owner", PublicKey: f.owner.Public().(ed25519.PublicKey)}}})
	_, err = st.Recv()
	wantCode(t, "Escrow with the owner key for another TLS key", err, codes.PermissionDenied, "TLS certificate")

	// The owner key, but a proof signed by another key: refused.
	conn, creds = ephemeral(t, a.addr(), f.ca, f.owner)
	st, err = clusterpb.NewAAAClient(conn).Escrow(ctx)
	mustOK(t, "Escrow", err)
	st.Send(&clusterpb.EscrowFromClient{Message: &clusterpb.EscrowFromClient_Parameters_{Parameters: &clusterpb.EscrowFromClient_Parameters{
		RequestedIdentityName: "owner", PublicKey: f.owner.Public().(ed25519.PublicKey)}}})
	msg, err := st.Recv()
	mustOK(t, "NeededProofs", err)
	if len(msg.GetNeededProofs().GetNonce()) != 32 {
		t.Fatalf("nonce: %v", msg)
	}
	state, _ := creds.State()
	sig, _ := escrow.EscrowProof(stranger, msg.GetNeededProofs().Nonce, state)
	st.Send(&clusterpb.EscrowFromClient{Message: &clusterpb.EscrowFromClient_Proof_{Proof: &clusterpb.EscrowFromClient_Proof{Signature: sig}}})
	_, err = st.Recv()
	wantCode(t, "Escrow with a bad proof", err, codes.PermissionDenied, "proof")

	// The real thing.
	oc := f.ownerCreds(a)
	if !identity.IsOwner(oc.Certificate) {
		t.Errorf("escrowed certificate is not an owner certificate: %v", oc.Certificate.Subject)
	}
}
