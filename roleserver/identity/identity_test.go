package identity

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io/fs"
	"net"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/platform/pki"
)

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("test cluster CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func nodeCreds(t *testing.T, ca *pki.CA) *Credentials {
	t.Helper()
	k := newKey(t)
	cert, err := IssueNodeCertificate(ca, k.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCredentials(k, cert.Raw, ca.Certificate.Raw)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNodeIDIsStableDNSLabel(t *testing.T) {
	k := newKey(t)
	id := NodeID(k.Public().(ed25519.PublicKey))
	if id != NodeID(k.Public().(ed25519.PublicKey)) || !strings.HasPrefix(id, "plinth-") || len(id) != 39 {
		t.Fatalf("NodeID = %q", id)
	}
	if id == NodeID(newKey(t).Public().(ed25519.PublicKey)) {
		t.Fatal("two keys, one ID")
	}
}

func TestCredentialsRejectForeignCertificate(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	c := nodeCreds(t, ca)
	if _, err := NewCredentials(newKey(t), c.Certificate.Raw, ca.Certificate.Raw); err == nil {
		t.Fatal("certificate accepted for another key")
	}
	if _, err := NewCredentials(c.PrivateKey, c.Certificate.Raw, other.Certificate.Raw); err == nil {
		t.Fatal("certificate accepted under another CA")
	}
}

func TestSaveLoad(t *testing.T) {
	c := nodeCreds(t, newCA(t))
	dir := t.TempDir()
	if _, err := Load(dir); !errors.Is(err, errNotExist()) {
		t.Fatalf("Load of empty dir: %v", err)
	}
	if err := c.Save(dir); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID() != c.ID() || !got.PrivateKey.Equal(c.PrivateKey) {
		t.Fatal("round trip changed the credentials")
	}
}

// handshake runs a TLS handshake between a server with the node's
// ServerTLSConfig and a client presenting clientCert, returning what the
// server classified and the client's error.
func handshake(t *testing.T, server *Credentials, clientCfg *tls.Config) (*Peer, error, error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	type result struct {
		p   *Peer
		err error
	}
	done := make(chan result, 1)
	go func() {
		s := tls.Server(a, server.ServerTLSConfig())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.HandshakeContext(ctx); err != nil {
			done <- result{nil, err}
			return
		}
		p, err := Classify(s.ConnectionState(), server.trust())
		done <- result{p, err}
	}()
	c := tls.Client(b, clientCfg)
	cerr := c.Handshake()
	if cerr != nil {
		a.Close()
	}
	r := <-done
	if r.err != nil && cerr == nil {
		return nil, r.err, nil
	}
	return r.p, r.err, cerr
}

func TestClassify(t *testing.T) {
	ca := newCA(t)
	server := nodeCreds(t, ca)
	client := nodeCreds(t, ca)

	p, serr, cerr := handshake(t, server, client.ClientTLSConfig(ServerNode))
	if serr != nil || cerr != nil || p.Kind != KindNode || p.NodeID != client.ID() {
		t.Fatalf("node: %+v %v %v", p, serr, cerr)
	}

	ownerKey := newKey(t)
	ownerCert, err := IssueOwnerCertificate(ca, ownerKey.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	owner, err := NewCredentials(ownerKey, ownerCert.Raw, ca.Certificate.Raw)
	if err != nil {
		t.Fatal(err)
	}
	if p, serr, cerr = handshake(t, server, owner.ClientTLSConfig(ServerNode)); serr != nil || cerr != nil || p.Kind != KindOwner {
		t.Fatalf("owner: %+v %v %v", p, serr, cerr)
	}

	ek := newKey(t)
	eph, err := EphemeralCertificate(ek)
	if err != nil {
		t.Fatal(err)
	}
	p, serr, cerr = handshake(t, server, ClientTLSConfig(NewTrust(ca.Certificate), eph, ServerNode))
	if serr != nil || cerr != nil || p.Kind != KindEphemeral || !p.PublicKey.Equal(ek.Public()) {
		t.Fatalf("ephemeral: %+v %v %v", p, serr, cerr)
	}

	// A node certificate from another cluster is merely self-signed-less:
	// neither from this CA nor self-signed.
	foreign := nodeCreds(t, newCA(t))
	if _, serr, _ = handshake(t, server, ClientTLSConfig(NewTrust(ca.Certificate), foreign.TLSCertificate(), ServerNode)); !errors.Is(serr, ErrUnauthenticated) {
		t.Fatalf("foreign node certificate: %v", serr)
	}

	// The client refuses a server from another cluster.
	if _, _, cerr = handshake(t, foreign, client.ClientTLSConfig(ServerNode)); cerr == nil {
		t.Fatal("client accepted a server from another cluster")
	}
}

func TestSessionProofBindsToSession(t *testing.T) {
	ca := newCA(t)
	server := nodeCreds(t, ca)
	k := newKey(t)
	eph, _ := EphemeralCertificate(k)
	p1, _, _ := handshake(t, server, ClientTLSConfig(NewTrust(ca.Certificate), eph, ServerNode))
	p2, _, _ := handshake(t, server, ClientTLSConfig(NewTrust(ca.Certificate), eph, ServerNode))
	proof, err := SessionProof(k, p1.TLS, ExporterJoinNode, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifySessionProof(k.Public().(ed25519.PublicKey), p1.TLS, ExporterJoinNode, nil, proof); err != nil {
		t.Fatalf("valid proof refused: %v", err)
	}
	if VerifySessionProof(k.Public().(ed25519.PublicKey), p2.TLS, ExporterJoinNode, nil, proof) == nil {
		t.Fatal("proof replayed on another session accepted")
	}
	if VerifySessionProof(k.Public().(ed25519.PublicKey), p1.TLS, ExporterCommitNode, nil, proof) == nil {
		t.Fatal("proof accepted for another label")
	}
}

func errNotExist() error { return fs.ErrNotExist }

func TestServerNamePinsNode(t *testing.T) {
	ca := newCA(t)
	server, client, other := nodeCreds(t, ca), nodeCreds(t, ca), nodeCreds(t, ca)
	cfg := client.ClientTLSConfig(ServerNode)
	cfg.ServerName = server.ID()
	if _, serr, cerr := handshake(t, server, cfg); serr != nil || cerr != nil {
		t.Fatalf("the named node refused: %v %v", serr, cerr)
	}
	cfg = client.ClientTLSConfig(ServerNode)
	cfg.ServerName = other.ID()
	if _, _, cerr := handshake(t, server, cfg); cerr == nil || !strings.Contains(cerr.Error(), "expected node") {
		t.Fatalf("another node of the cluster accepted in place of %s: %v", other.ID(), cerr)
	}
}
