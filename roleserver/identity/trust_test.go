package identity

import (
	"errors"
	"testing"

	"plinth.dev/plinth/platform/pki"
)

func curatorCreds(t *testing.T, ca *pki.CA) *Credentials {
	t.Helper()
	node := nodeCreds(t, ca)
	cert, err := IssueCuratorCertificate(ca, node.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	c, err := node.WithCertificate(cert)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCuratorRole: a client that needs a curator refuses a server with a
// (valid) node certificate of the same cluster, and the other way round.
func TestCuratorRole(t *testing.T) {
	ca := newCA(t)
	client, node, curator := nodeCreds(t, ca), nodeCreds(t, ca), curatorCreds(t, ca)
	if _, serr, cerr := handshake(t, curator, client.ClientTLSConfig(ServerCurator)); serr != nil || cerr != nil {
		t.Fatalf("curator refused: %v %v", serr, cerr)
	}
	if _, _, cerr := handshake(t, node, client.ClientTLSConfig(ServerCurator)); !errors.Is(cerr, ErrWrongRole) {
		t.Fatalf("a node certificate answered as a curator: %v", cerr)
	}
	if _, _, cerr := handshake(t, curator, client.ClientTLSConfig(ServerNode)); !errors.Is(cerr, ErrWrongRole) {
		t.Fatalf("a curator certificate answered as a node: %v", cerr)
	}
	// A curator certificate is no client certificate.
	if _, serr, _ := handshake(t, node, curator.ClientTLSConfig(ServerNode)); !errors.Is(serr, ErrUnauthenticated) {
		t.Fatalf("curator certificate accepted as a client: %v", serr)
	}
}

// TestRevocation: once the CRL a party holds lists a certificate, the
// party refuses it as a server and as a caller; an older CRL never
// replaces a newer one.
func TestRevocation(t *testing.T) {
	ca := newCA(t)
	server, client, curator := nodeCreds(t, ca), nodeCreds(t, ca), curatorCreds(t, ca)
	crl1, err := ca.NewCRL()
	if err != nil {
		t.Fatal(err)
	}
	crl2, err := ca.Revoke(crl1, client.Certificate.SerialNumber, curator.Certificate.SerialNumber)
	if err != nil {
		t.Fatal(err)
	}
	if p, serr, _ := handshake(t, server, client.ClientTLSConfig(ServerNode)); serr != nil || p.Kind != KindNode {
		t.Fatalf("before revocation: %v %v", p, serr)
	}
	if _, err := server.Trust.SetCRL(crl2.Raw); err != nil {
		t.Fatal(err)
	}
	if _, serr, _ := handshake(t, server, client.ClientTLSConfig(ServerNode)); !errors.Is(serr, ErrRevoked) || !errors.Is(serr, ErrUnauthenticated) {
		t.Fatalf("revoked caller: %v", serr)
	}
	if _, err := client.Trust.SetCRL(crl2.Raw); err != nil {
		t.Fatal(err)
	}
	if _, _, cerr := handshake(t, curator, server.ClientTLSConfig(ServerCurator)); !errors.Is(cerr, ErrRevoked) {
		t.Fatalf("revoked curator accepted: %v", cerr)
	}
	// Replaying the older CRL changes nothing.
	if _, err := server.Trust.SetCRL(crl1.Raw); !errors.Is(err, ErrStaleCRL) {
		t.Fatalf("older CRL: %v", err)
	}
	if server.Trust.CRLNumber() != 2 {
		t.Fatalf("CRL number %d, want 2", server.Trust.CRLNumber())
	}
	// A CRL of another CA is refused.
	other, _ := newCA(t).NewCRL()
	if _, err := server.Trust.SetCRL(other.Raw); err == nil || errors.Is(err, ErrStaleCRL) {
		t.Fatalf("foreign CRL: %v", err)
	}
}
