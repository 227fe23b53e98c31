package identity

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"plinth.dev/plinth/platform/pki"
)

// Kind is what sort of caller a gRPC peer is.
type Kind int

const (
	// KindUnauthenticated: no client certificate, or one that is neither
	// from the cluster CA nor a valid self-signed ed25519 certificate.
	KindUnauthenticated Kind = iota
	// KindNode: a node certificate from the cluster CA.
	KindNode
	// KindOwner: the owner certificate from the cluster CA.
	KindOwner
	// KindEphemeral: a self-signed certificate; proves key possession only.
	KindEphemeral
)

func (k Kind) String() string {
	switch k {
	case KindNode:
		return "node"
	case KindOwner:
		return "owner"
	case KindEphemeral:
		return "ephemeral"
	}
	return "unauthenticated"
}

// Peer is the caller of an RPC.
type Peer struct {
	Kind Kind
	// NodeID is set for KindNode.
	NodeID string
	// PublicKey is the key the caller proved it holds (every kind but
	// KindUnauthenticated).
	PublicKey ed25519.PublicKey
	// TLS is the connection's state, for exporter-bound proofs.
	TLS tls.ConnectionState
}

// ErrUnauthenticated is returned by PeerFromContext for a call without
// usable TLS credentials.
var ErrUnauthenticated = errors.New("identity: caller presented no usable certificate")

// PeerFromContext classifies the caller of a gRPC call on a server that
// used ServerTLSConfig, against what the server trusts.
func PeerFromContext(ctx context.Context, trust *Trust) (*Peer, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, ErrUnauthenticated
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, ErrUnauthenticated
	}
	return Classify(info.State, trust)
}

// Classify decides what a TLS client is from its certificate. A
// certificate from the CA that the CRL revokes is ErrRevoked (wrapped in
// ErrUnauthenticated): such a caller is nobody, not an ephemeral key.
func Classify(state tls.ConnectionState, trust *Trust) (*Peer, error) {
	if len(state.PeerCertificates) == 0 {
		return nil, ErrUnauthenticated
	}
	cert := state.PeerCertificates[0]
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%w: not an ed25519 key", ErrUnauthenticated)
	}
	out := &Peer{PublicKey: pub, TLS: state}
	if trust != nil && trust.CA != nil && cert.CheckSignatureFrom(trust.CA) == nil {
		if err := trust.Verify(cert, pki.UsageClient); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnauthenticated, err)
		}
		switch unit(cert) {
		case unitNode:
			if cert.Subject.CommonName != NodeID(pub) {
				return nil, fmt.Errorf("%w: node certificate names %q, key is %s", ErrUnauthenticated, cert.Subject.CommonName, NodeID(pub))
			}
			out.Kind, out.NodeID = KindNode, cert.Subject.CommonName
		case unitOwner:
			out.Kind = KindOwner
		default:
			return nil, fmt.Errorf("%w: certificate %q has no known role", ErrUnauthenticated, cert.Subject.CommonName)
		}
		return out, nil
	}
	// Not from the CA: only a correctly self-signed certificate counts,
	// which proves the caller holds the key in it.
	if err := cert.CheckSignature(cert.SignatureAlgorithm, cert.RawTBSCertificate, cert.Signature); err != nil {
		return nil, fmt.Errorf("%w: certificate neither from the cluster CA nor self-signed: %v", ErrUnauthenticated, err)
	}
	out.Kind = KindEphemeral
	return out, nil
}

// Labels of the RFC 5705 exporters that bind proofs to a TLS session.
const (
	ExporterCommitNode = "EXPORTER-plinth-commit-node"
	ExporterJoinNode   = "EXPORTER-plinth-join-node"
	ExporterEscrow     = "EXPORTER-plinth-escrow"
)

// sessionMessage is what proofs sign: the optional prefix (e.g. a
// server's nonce) followed by the session's exporter value for label.
func sessionMessage(state tls.ConnectionState, label string, prefix []byte) ([]byte, error) {
	v, err := state.ExportKeyingMaterial(label, nil, 32)
	if err != nil {
		return nil, fmt.Errorf("identity: TLS exporter: %w", err)
	}
	return append(append([]byte{}, prefix...), v...), nil
}

// SessionProof signs the connection's exporter value for label with key,
// after prefix (nil for none).
func SessionProof(key ed25519.PrivateKey, state tls.ConnectionState, label string, prefix []byte) ([]byte, error) {
	msg, err := sessionMessage(state, label, prefix)
	if err != nil {
		return nil, err
	}
	return ed25519.Sign(key, msg), nil
}

// VerifySessionProof checks a SessionProof made on the other end of the
// same connection with the same label and prefix.
func VerifySessionProof(pub ed25519.PublicKey, state tls.ConnectionState, label string, prefix, proof []byte) error {
	if len(pub) != ed25519.PublicKeySize {
		return errors.New("identity: invalid public key")
	}
	msg, err := sessionMessage(state, label, prefix)
	if err != nil {
		return err
	}
	if !ed25519.Verify(pub, msg, proof) {
		return errors.New("identity: proof is not a signature over this session by that key")
	}
	return nil
}

// CapturingCredentials wraps client transport credentials and remembers
// the TLS state of the last handshake, so a client can sign a
// SessionProof for the connection its RPC will use. Use one per
// grpc.ClientConn.
type CapturingCredentials struct {
	credentials.TransportCredentials
	mu    sync.Mutex
	state *tls.ConnectionState
}

// NewCapturingCredentials wraps credentials.NewTLS(cfg).
func NewCapturingCredentials(cfg *tls.Config) *CapturingCredentials {
	return &CapturingCredentials{TransportCredentials: credentials.NewTLS(cfg)}
}

func (c *CapturingCredentials) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err == nil {
		if ti, ok := info.(credentials.TLSInfo); ok {
			c.mu.Lock()
			st := ti.State
			c.state = &st
			c.mu.Unlock()
		}
	}
	return conn, info, err
}

// Clone keeps the capture: gRPC clones credentials per connection.
func (c *CapturingCredentials) Clone() credentials.TransportCredentials { return c }

// State is the TLS state of the last completed handshake.
func (c *CapturingCredentials) State() (tls.ConnectionState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == nil {
		return tls.ConnectionState{}, false
	}
	return *c.state, true
}
