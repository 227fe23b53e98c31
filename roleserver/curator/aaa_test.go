package curator

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
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

// TestRotateOwnerKey: a new owner key, signed for this cluster by the
// new key and asked for with the current owner's certificate, replaces
// the old: the old key's certificate is on the cluster CRL, Escrow
// refuses the old key and certifies the new one (not revoked), the
// owner's Kubernetes credentials have a new epoch, and the old
// certificate cannot rotate again. A signature by another key, or for
// another cluster, is refused and changes nothing.
func TestRotateOwnerKey(t *testing.T) {
	c := newCluster(t)
	a := c.members[0]
	ctx := ctxTimeout(t, time.Minute)
	old := c.ownerCreds(a)
	mg := c.mgmt(a)
	info := func() *clusterpb.GetClusterInfoResponse {
		t.Helper()
		r, err := mg.GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
		mustOK(t, "GetClusterInfo", err)
		return r
	}
	epoch := info().GetConfiguration().GetKubernetesOwnerEpoch()
	newPub, newKey, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	for what, sig := range map[string][]byte{
		"signed by another key":      ed25519.Sign(other, identity.OwnerKeyRotationMessage(c.ca.Raw, newPub)),
		"signed for another cluster": ed25519.Sign(newKey, identity.OwnerKeyRotationMessage([]byte("another CA"), newPub)),
	} {
		_, err := mg.RotateOwnerKey(ctx, &clusterpb.RotateOwnerKeyRequest{NewPublicKey: newPub, Signature: sig})
		wantCode(t, what, err, codes.InvalidArgument, "signature")
	}
	r, err := mg.RotateOwnerKey(ctx, &clusterpb.RotateOwnerKeyRequest{NewPublicKey: newPub, Signature: ed25519.Sign(newKey, identity.OwnerKeyRotationMessage(c.ca.Raw, newPub))})
	mustOK(t, "RotateOwnerKey", err)
	if r.GetRevoked() < 1 || r.GetKubernetesOwnerEpoch() != epoch+1 {
		t.Errorf("rotation: %d revoked, epoch %d (was %d)", r.GetRevoked(), r.GetKubernetesOwnerEpoch(), epoch)
	}
	// The old certificate is refused as soon as the curator has the new
	// CRL (it watches it in etcd), for a read as for another rotation.
	eventually(t, 10*time.Second, "the old certificate refused", func() error {
		_, err := mg.GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "revoked") {
			return fmt.Errorf("a read with the old certificate: %v", err)
		}
		return nil
	})
	_, err = mg.RotateOwnerKey(ctx, &clusterpb.RotateOwnerKeyRequest{NewPublicKey: newPub, Signature: ed25519.Sign(newKey, identity.OwnerKeyRotationMessage(c.ca.Raw, newPub))})
	wantCode(t, "a second rotation with the old certificate", err, codes.PermissionDenied, "revoked")

	conn, creds := ephemeral(t, a.addr(), c.ca, c.owner)
	_, err = escrow.TakeOwnership(ctx, clusterpb.NewAAAClient(conn), creds, c.owner)
	wantCode(t, "Escrow with the old key", err, codes.PermissionDenied, "owner key")
	conn, creds = ephemeral(t, a.addr(), c.ca, newKey)
	cert, err := escrow.TakeOwnership(ctx, clusterpb.NewAAAClient(conn), creds, newKey)
	mustOK(t, "Escrow with the new key", err)
	nc, err := identity.NewCredentials(newKey, cert.Raw, c.ca.Raw)
	if err != nil {
		t.Fatal(err)
	}
	mg = clusterpb.NewManagementClient(withCreds(t, a.addr(), nc))
	crl, err := pki.ParseCRL(info().GetCrl(), c.ca)
	if err != nil || !crl.IsRevoked(old.Certificate.SerialNumber) || crl.IsRevoked(cert.SerialNumber) {
		t.Fatalf("the cluster CRL: the old certificate revoked %v, the new %v (%v)", crl.IsRevoked(old.Certificate.SerialNumber), crl.IsRevoked(cert.SerialNumber), err)
	}
	if e := info().GetConfiguration().GetKubernetesOwnerEpoch(); e != epoch+1 {
		t.Errorf("the owner's Kubernetes epoch is %d, want %d", e, epoch+1)
	}
}

// A rotation whose key swap committed but whose answer was lost (or whose
// revocation failed) is finished by the same request again, still made
// with the old certificate; a request for any other key is refused.
func TestRotateOwnerKeyRetried(t *testing.T) {
	c := newCluster(t)
	a := c.members[0]
	ctx := ctxTimeout(t, time.Minute)
	c.ownerCreds(a)
	mg := c.mgmt(a)
	newPub, newKey, _ := ed25519.GenerateKey(rand.Reader)
	kv, err := a.running(time.Minute).CuratorClient()
	mustOK(t, "CuratorClient", err)
	defer kv.Close()
	// The swap of the first attempt, without its revocation.
	_, err = kv.Put(ctx, keyOwnerKey, string(newPub))
	mustOK(t, "Put", err)

	otherPub, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	_, err = mg.RotateOwnerKey(ctx, &clusterpb.RotateOwnerKeyRequest{NewPublicKey: otherPub, Signature: ed25519.Sign(otherKey, identity.OwnerKeyRotationMessage(c.ca.Raw, otherPub))})
	wantCode(t, "a rotation to another key by the old certificate", err, codes.PermissionDenied, "current owner key")

	r, err := mg.RotateOwnerKey(ctx, &clusterpb.RotateOwnerKeyRequest{NewPublicKey: newPub, Signature: ed25519.Sign(newKey, identity.OwnerKeyRotationMessage(c.ca.Raw, newPub))})
	mustOK(t, "the retried RotateOwnerKey", err)
	if r.GetRevoked() < 1 {
		t.Errorf("the retried rotation revoked %d certificates", r.GetRevoked())
	}
	eventually(t, 10*time.Second, "the old certificate refused", func() error {
		_, err := mg.GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "revoked") {
			return fmt.Errorf("a read with the old certificate: %v", err)
		}
		return nil
	})
	conn, creds := ephemeral(t, a.addr(), c.ca, newKey)
	_, err = escrow.TakeOwnership(ctx, clusterpb.NewAAAClient(conn), creds, newKey)
	mustOK(t, "Escrow with the new key", err)
}
