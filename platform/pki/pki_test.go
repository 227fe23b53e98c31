package pki

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"
)

type party struct {
	key  ed25519.PrivateKey
	cert *x509.Certificate
}

func issue(t *testing.T, ca *CA, cn string, u Usage) party {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Issue(Template{
		CommonName:  cn,
		DNSNames:    []string{cn},
		IPAddresses: []net.IP{net.ParseIP("10.0.0.1")},
		PublicKey:   pub,
		Usage:       u,
	})
	if err != nil {
		t.Fatalf("Issue(%s): %v", cn, err)
	}
	return party{key: priv, cert: cert}
}

func newCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA("test CA", time.Hour*24)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func (p party) tls() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{p.cert.Raw}, PrivateKey: p.key, Leaf: p.cert}
}

// handshake runs mutual TLS between server and client over net.Pipe, both
// trusting only ca, and additionally checking the peer with Verify and crl.
func handshake(t *testing.T, ca *CA, crl *CRL, server, client party) (serverErr, clientErr error) {
	t.Helper()
	sc, cc := net.Pipe()
	defer sc.Close()
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	srv := tls.Server(sc, &tls.Config{
		Certificates: []tls.Certificate{server.tls()},
		ClientCAs:    ca.CertPool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return Verify(ca.Certificate, crl, cs.PeerCertificates[0], UsageClient)
		},
	})
	cli := tls.Client(cc, &tls.Config{
		Certificates: []tls.Certificate{client.tls()},
		RootCAs:      ca.CertPool(),
		ServerName:   "server.test",
		MinVersion:   tls.VersionTLS13,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return Verify(ca.Certificate, crl, cs.PeerCertificates[0], UsageServer)
		},
	})
	errc := make(chan error, 1)
	go func() {
		err := srv.HandshakeContext(ctx)
		if err == nil {
			// Tell the client the server accepted it.
			_, err = srv.Write([]byte("k"))
		}
		sc.Close() // unblock the client on failure
		errc <- err
	}()
	clientErr = cli.HandshakeContext(ctx)
	if clientErr == nil {
		// With TLS 1.3 the client finishes before the server has checked
		// its certificate; reading surfaces the server's verdict (its byte
		// or its alert). net.Pipe is unbuffered, so the client only reads.
		buf := make([]byte, 1)
		if _, err := cli.Read(buf); err != nil {
			clientErr = err
		}
	}
	cc.Close()
	return <-errc, clientErr
}

func TestMutualTLS(t *testing.T) {
	ca := newCA(t)
	server := issue(t, ca, "server.test", UsageServer)
	client := issue(t, ca, "client.test", UsageClient)
	crl, err := ca.NewCRL()
	if err != nil {
		t.Fatal(err)
	}
	if se, ce := handshake(t, ca, crl, server, client); se != nil || ce != nil {
		t.Fatalf("handshake: server %v, client %v", se, ce)
	}

	// A peer certificate from another CA is rejected by the TLS stack.
	other := newCA(t)
	stranger := issue(t, other, "client.test", UsageClient)
	if se, _ := handshake(t, ca, crl, server, stranger); se == nil {
		t.Fatal("server accepted a client from another CA")
	}

	// A revoked client is rejected through Verify in VerifyConnection.
	crl2, err := ca.Revoke(crl, client.cert.SerialNumber)
	if err != nil {
		t.Fatal(err)
	}
	if se, _ := handshake(t, ca, crl2, server, client); se == nil || !strings.Contains(se.Error(), "revoked") {
		t.Fatalf("server accepted a revoked client: %v", se)
	}
}

func TestVerify(t *testing.T) {
	ca := newCA(t)
	server := issue(t, ca, "server.test", UsageServer)
	client := issue(t, ca, "client.test", UsageClient)
	both := issue(t, ca, "both.test", UsageServerAndClient)

	for _, tc := range []struct {
		name string
		p    party
		u    Usage
		ok   bool
	}{
		{"server as server", server, UsageServer, true},
		{"server as client", server, UsageClient, false},
		{"client as client", client, UsageClient, true},
		{"client as server", client, UsageServer, false},
		{"client as both", client, UsageServerAndClient, false},
		{"both as server", both, UsageServer, true},
		{"both as client", both, UsageClient, true},
		{"both as both", both, UsageServerAndClient, true},
		{"invalid usage", both, Usage(0), false},
	} {
		err := Verify(ca.Certificate, nil, tc.p.cert, tc.u)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}

	other := newCA(t)
	if err := Verify(other.Certificate, nil, server.cert, UsageServer); err == nil {
		t.Error("Verify accepted a certificate against the wrong CA")
	}
}

func TestRevoke(t *testing.T) {
	ca := newCA(t)
	a := issue(t, ca, "a", UsageClient)
	b := issue(t, ca, "b", UsageClient)

	crl1, err := ca.NewCRL()
	if err != nil {
		t.Fatal(err)
	}
	if crl1.List.Number.Cmp(big.NewInt(1)) != 0 || len(crl1.List.RevokedCertificateEntries) != 0 {
		t.Fatalf("new CRL: number %v, %d entries", crl1.List.Number, len(crl1.List.RevokedCertificateEntries))
	}
	crl2, err := ca.Revoke(crl1, a.cert.SerialNumber)
	if err != nil {
		t.Fatal(err)
	}
	crl3, err := ca.Revoke(crl2, a.cert.SerialNumber, b.cert.SerialNumber, b.cert.SerialNumber)
	if err != nil {
		t.Fatal(err)
	}
	if crl3.List.Number.Cmp(big.NewInt(3)) != 0 {
		t.Errorf("CRL number = %v, want 3", crl3.List.Number)
	}
	if n := len(crl3.List.RevokedCertificateEntries); n != 2 {
		t.Errorf("%d entries, want 2 (duplicates ignored)", n)
	}
	// Old CRLs are untouched.
	if crl1.IsRevoked(a.cert.SerialNumber) || crl2.IsRevoked(b.cert.SerialNumber) {
		t.Error("Revoke modified its input CRL")
	}
	if !crl3.IsRevoked(a.cert.SerialNumber) || !crl3.IsRevoked(b.cert.SerialNumber) {
		t.Error("revoked serials not listed")
	}

	if err := Verify(ca.Certificate, crl1, a.cert, UsageClient); err != nil {
		t.Errorf("Verify before revocation: %v", err)
	}
	if err := Verify(ca.Certificate, crl2, a.cert, UsageClient); err == nil {
		t.Error("Verify accepted a revoked certificate")
	}
	if err := Verify(ca.Certificate, crl2, b.cert, UsageClient); err != nil {
		t.Errorf("Verify of a non-revoked certificate: %v", err)
	}

	// A CRL from another CA is neither trusted by Verify nor by Revoke.
	other := newCA(t)
	foreign, err := other.NewCRL()
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(ca.Certificate, foreign, b.cert, UsageClient); err == nil {
		t.Error("Verify accepted a CRL signed by another CA")
	}
	if _, err := ca.Revoke(foreign, a.cert.SerialNumber); err == nil {
		t.Error("Revoke extended a CRL signed by another CA")
	}

	// Revoke(nil) starts a fresh list.
	fresh, err := ca.Revoke(nil, a.cert.SerialNumber)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.List.Number.Cmp(big.NewInt(1)) != 0 || !fresh.IsRevoked(a.cert.SerialNumber) {
		t.Errorf("Revoke(nil): number %v", fresh.List.Number)
	}
	var nilCRL *CRL
	if nilCRL.IsRevoked(a.cert.SerialNumber) {
		t.Error("nil CRL revokes")
	}
}

func TestParseCRL(t *testing.T) {
	ca := newCA(t)
	a := issue(t, ca, "a", UsageServer)
	crl, err := ca.Revoke(nil, a.cert.SerialNumber)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseCRL(crl.Raw, ca.Certificate)
	if err != nil {
		t.Fatalf("ParseCRL: %v", err)
	}
	if !parsed.IsRevoked(a.cert.SerialNumber) || parsed.List.Number.Cmp(crl.List.Number) != 0 {
		t.Error("parsed CRL differs")
	}
	other := newCA(t)
	if _, err := ParseCRL(crl.Raw, other.Certificate); err == nil {
		t.Error("ParseCRL accepted a CRL against another CA")
	}
	if _, err := ParseCRL([]byte("garbage"), ca.Certificate); err == nil {
		t.Error("ParseCRL accepted garbage")
	}

	p := crl.PEM()
	if !bytes.HasPrefix(p, []byte("-----BEGIN X509 CRL-----\n")) {
		t.Errorf("CRL PEM header: %q", p[:30])
	}
	block, err := decodePEM(p, "X509 CRL")
	if err != nil || !bytes.Equal(block.Bytes, crl.Raw) {
		t.Errorf("CRL PEM round trip: %v", err)
	}
}

func TestPEMRoundTrip(t *testing.T) {
	ca := newCA(t)
	certPEM, keyPEM, err := ca.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("LoadCA: %v", err)
	}
	if !loaded.Certificate.Equal(ca.Certificate) || !loaded.Key.Equal(ca.Key) {
		t.Fatal("LoadCA returned a different CA")
	}
	// The loaded CA can issue certificates that verify against the original.
	leaf := issue(t, loaded, "leaf", UsageServer)
	if err := Verify(ca.Certificate, nil, leaf.cert, UsageServer); err != nil {
		t.Fatal(err)
	}

	c, err := ParseCertificatePEM(CertificatePEM(leaf.cert))
	if err != nil || !c.Equal(leaf.cert) {
		t.Fatalf("certificate round trip: %v", err)
	}
	kp, err := PrivateKeyPEM(leaf.key)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ParsePrivateKeyPEM(kp)
	if err != nil || !k.Equal(leaf.key) {
		t.Fatalf("key round trip: %v", err)
	}

	// Mismatched pairs and wrong blocks are refused.
	other := newCA(t)
	_, otherKey, _ := other.MarshalPEM()
	if _, err := LoadCA(certPEM, otherKey); err == nil {
		t.Error("LoadCA accepted a key of another CA")
	}
	if _, err := LoadCA(CertificatePEM(leaf.cert), kp); err == nil {
		t.Error("LoadCA accepted a leaf certificate")
	}
	if _, err := ParseCertificatePEM(kp); err == nil {
		t.Error("ParseCertificatePEM accepted a key")
	}
	if _, err := ParsePrivateKeyPEM(certPEM); err == nil {
		t.Error("ParsePrivateKeyPEM accepted a certificate")
	}
}

func TestIssue(t *testing.T) {
	ca := newCA(t)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := ca.Issue(Template{CommonName: "x", PublicKey: pub}); err == nil {
		t.Error("Issue accepted a template without Usage")
	}
	if _, err := ca.Issue(Template{CommonName: "x", Usage: UsageServer}); err == nil {
		t.Error("Issue accepted a template without key")
	}
	if _, err := ca.Issue(Template{CommonName: "x", PublicKey: pub, Usage: UsageServer, Validity: -time.Hour}); err == nil {
		t.Error("Issue accepted a negative validity")
	}
	// Default validity is capped at the CA's expiry.
	c, err := ca.Issue(Template{CommonName: "x", PublicKey: pub, Usage: UsageServer})
	if err != nil {
		t.Fatal(err)
	}
	if c.NotAfter.After(ca.Certificate.NotAfter) {
		t.Errorf("leaf outlives CA: %v > %v", c.NotAfter, ca.Certificate.NotAfter)
	}
	c2, err := ca.Issue(Template{CommonName: "x", PublicKey: pub, Usage: UsageServer, Validity: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if c2.SerialNumber.Cmp(c.SerialNumber) == 0 {
		t.Error("serials repeat")
	}
	if c2.SerialNumber.BitLen() > 128 || c2.SerialNumber.Sign() <= 0 {
		t.Errorf("serial %v out of range", c2.SerialNumber)
	}
	if d := time.Until(c2.NotAfter); d > time.Minute || d < 0 {
		t.Errorf("leaf valid for %v more, want ~1m", d)
	}
	// Expired certificates fail Verify ("valid now").
	past, err := ca.Issue(Template{CommonName: "old", PublicKey: pub, Usage: UsageServer, Validity: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	if err := Verify(ca.Certificate, nil, past, UsageServer); err == nil {
		t.Error("Verify accepted an expired certificate")
	}
}
