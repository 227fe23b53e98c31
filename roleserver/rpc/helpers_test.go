package rpc

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
)

// testPKI is a cluster CA with helpers to mint every kind of caller.
type testPKI struct {
	t  *testing.T
	ca *pki.CA
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca, err := pki.NewCA("test cluster CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{t: t, ca: ca}
}

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func (p *testPKI) node() *identity.Credentials {
	p.t.Helper()
	key := newKey(p.t)
	cert, err := identity.IssueNodeCertificate(p.ca, key.Public().(ed25519.PublicKey))
	if err != nil {
		p.t.Fatal(err)
	}
	return &identity.Credentials{PrivateKey: key, Certificate: cert, CA: p.ca.Certificate}
}

// curator is a curator's credentials: what clients of the Curator
// service accept.
func (p *testPKI) curator() *identity.Credentials {
	p.t.Helper()
	key := newKey(p.t)
	cert, err := identity.IssueCuratorCertificate(p.ca, key.Public().(ed25519.PublicKey))
	if err != nil {
		p.t.Fatal(err)
	}
	return &identity.Credentials{PrivateKey: key, Certificate: cert, CA: p.ca.Certificate}
}

func (p *testPKI) owner() *identity.Credentials {
	p.t.Helper()
	key := newKey(p.t)
	cert, err := identity.IssueOwnerCertificate(p.ca, key.Public().(ed25519.PublicKey))
	if err != nil {
		p.t.Fatal(err)
	}
	return &identity.Credentials{PrivateKey: key, Certificate: cert, CA: p.ca.Certificate}
}

// clientCreds presents cert (nothing if it is empty) and verifies the
// server against the test CA.
func (p *testPKI) clientCreds(cert tls.Certificate) credentials.TransportCredentials {
	cfg := identity.ClientTLSConfig(identity.NewTrust(p.ca.Certificate), cert, identity.ServerNode)
	if cert.Certificate == nil {
		cfg.Certificates = nil
	}
	return credentials.NewTLS(cfg)
}

func (p *testPKI) ephemeral() (ed25519.PrivateKey, tls.Certificate) {
	p.t.Helper()
	key := newKey(p.t)
	cert, err := identity.EphemeralCertificate(key)
	if err != nil {
		p.t.Fatal(err)
	}
	return key, cert
}

// serve runs srv on a loopback port until the test ends.
func serve(t *testing.T, srv *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}
