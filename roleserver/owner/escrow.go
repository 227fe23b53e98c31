package owner

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/curator/escrow"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

// ErrCAFingerprintMismatch is returned by TakeOwnership when the cluster
// CA does not have the fingerprint given with WithCAFingerprint.
var ErrCAFingerprintMismatch = errors.New("owner: the cluster CA does not have the expected fingerprint")

// TakeOwnershipOption changes how TakeOwnership trusts the cluster.
type TakeOwnershipOption func(*takeOwnershipOptions)

type takeOwnershipOptions struct {
	caFingerprint *[sha256.Size]byte
}

// WithCAFingerprint pins the cluster CA to the SHA-256 fingerprint of its
// certificate (pki.Fingerprint), learnt over a channel the owner trusts,
// such as the bootstrap node's console. Without it the CA is trusted on
// first use.
func WithCAFingerprint(sum [sha256.Size]byte) TakeOwnershipOption {
	return func(o *takeOwnershipOptions) { o.caFingerprint = &sum }
}

// TakeOwnership performs the one-time ownership hand-over with the curator
// at endpoint (host:port) for the owner key named in the bootstrap
// parameters, and returns the owner's credentials and the cluster info.
//
// No CA is known beforehand, so the server's certificate is accepted and
// pinned on the escrow connection; the cluster CA then comes from
// GetClusterInfo over a second connection, with the new owner
// certificate, that must present the very same server certificate. Both
// the server's node certificate and the owner certificate must chain to
// that CA, or nothing is returned.
//
// With WithCAFingerprint, the CA the server presents after its own
// certificate must have that fingerprint and must have signed the
// server's certificate, or the handshake fails with
// ErrCAFingerprintMismatch before anything is sent; the CA that
// GetClusterInfo names is checked against it again.
func TakeOwnership(ctx context.Context, endpoint string, key ed25519.PrivateKey, opts ...TakeOwnershipOption) (*identity.Credentials, *clusterpb.GetClusterInfoResponse, error) {
	var o takeOwnershipOptions
	for _, opt := range opts {
		opt(&o)
	}
	if len(key) != ed25519.PrivateKeySize {
		return nil, nil, errors.New("owner: invalid owner key")
	}
	ownerCert, server, err := escrowOwnerCertificate(ctx, endpoint, key, o)
	if err != nil {
		return nil, nil, err
	}
	info, err := clusterInfoAs(ctx, endpoint, key, ownerCert, server)
	if err != nil {
		return nil, nil, err
	}
	ca, err := checkClusterCA(endpoint, info, o, server, ownerCert)
	if err != nil {
		return nil, nil, err
	}
	creds, err := identity.NewCredentials(key, ownerCert.Raw, ca.Raw)
	if err != nil {
		return nil, nil, fmt.Errorf("owner: %w", err)
	}
	return creds, info, nil
}

// escrowOwnerCertificate is the first connection: with an ephemeral
// certificate for key, it takes the owner certificate through escrow. It
// returns that and the server's certificate, accepted on first use (or
// checked against the pinned CA fingerprint, if any).
func escrowOwnerCertificate(ctx context.Context, endpoint string, key ed25519.PrivateKey, o takeOwnershipOptions) (ownerCert, server *x509.Certificate, err error) {
	eph, err := identity.EphemeralCertificate(key)
	if err != nil {
		return nil, nil, err
	}
	// A refused CA fails the handshake; gRPC reports that as text, so the
	// typed error is kept here.
	var pinMu sync.Mutex
	var pinErr error
	capture := identity.NewCapturingCredentials(&tls.Config{
		Certificates: []tls.Certificate{eph},
		MinVersion:   tls.VersionTLS13,
		// Trust on first use: checked against the cluster CA by
		// checkClusterCA.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("owner: server sent no certificate")
			}
			if o.caFingerprint != nil {
				if err := checkPresentedCA(raw, *o.caFingerprint); err != nil {
					pinMu.Lock()
					pinErr = err
					pinMu.Unlock()
					return err
				}
			}
			return nil
		},
	})
	cc, err := dial(endpoint, capture)
	if err != nil {
		return nil, nil, err
	}
	ownerCert, err = escrow.TakeOwnership(ctx, clusterpb.NewAAAClient(cc), capture, key)
	cc.Close()
	if err != nil {
		pinMu.Lock()
		defer pinMu.Unlock()
		if pinErr != nil {
			return nil, nil, pinErr
		}
		return nil, nil, fmt.Errorf("owner: %w", err)
	}
	state, ok := capture.State()
	if !ok || len(state.PeerCertificates) == 0 {
		return nil, nil, errors.New("owner: no TLS state for the escrow connection")
	}
	if !identity.IsOwner(ownerCert) {
		return nil, nil, fmt.Errorf("owner: server issued %q, not an owner certificate", ownerCert.Subject)
	}
	return ownerCert, state.PeerCertificates[0], nil
}

// clusterInfoAs is the second connection: with the owner certificate, to
// the very same server certificate, it asks for the cluster info.
func clusterInfoAs(ctx context.Context, endpoint string, key ed25519.PrivateKey, ownerCert, server *x509.Certificate) (*clusterpb.GetClusterInfoResponse, error) {
	pinned := identity.ClientTLSConfig(nil, tls.Certificate{Certificate: [][]byte{ownerCert.Raw}, PrivateKey: key}, identity.ServerCurator)
	pinned.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 || !bytes.Equal(raw[0], server.Raw) {
			return errors.New("owner: the server changed its certificate between escrow and GetClusterInfo")
		}
		return nil
	}
	cc, err := dial(endpoint, credentials.NewTLS(pinned))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	info, err := clusterpb.NewManagementClient(cc).GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("owner: GetClusterInfo with the new owner certificate: %w", err)
	}
	return info, nil
}

// checkClusterCA returns the cluster CA that info names once it has the
// pinned fingerprint (if any), is a CA, and issued both the server's and
// the owner's certificate.
func checkClusterCA(endpoint string, info *clusterpb.GetClusterInfoResponse, o takeOwnershipOptions, server, ownerCert *x509.Certificate) (*x509.Certificate, error) {
	ca, err := x509.ParseCertificate(info.GetCaCertificate())
	if err != nil {
		return nil, fmt.Errorf("owner: cluster CA certificate: %w", err)
	}
	if want := o.caFingerprint; want != nil && sha256.Sum256(ca.Raw) != *want {
		return nil, fmt.Errorf("%w: the cluster at %s reports a CA with fingerprint %s, want %s",
			ErrCAFingerprintMismatch, endpoint, pki.Fingerprint(ca), pki.FormatFingerprint(*want))
	}
	if !ca.IsCA {
		return nil, fmt.Errorf("owner: cluster CA certificate %q is not a CA", ca.Subject)
	}
	// The server must be a curator of the cluster whose CA it named...
	check := identity.ClientTLSConfig(identity.NewTrust(ca), tls.Certificate{}, identity.ServerCurator).VerifyPeerCertificate
	if err := check([][]byte{server.Raw}, nil); err != nil {
		return nil, fmt.Errorf("owner: server %q does not belong to the cluster CA it reports: %w", server.Subject.CommonName, err)
	}
	// ...and the owner certificate must come from that same CA.
	if err := pki.Verify(ca, nil, ownerCert, pki.UsageClient); err != nil {
		return nil, fmt.Errorf("owner: owner certificate is not from the server's cluster CA: %w", err)
	}
	return ca, nil
}

// connectTimeout bounds establishing one connection, TLS included (a
// variable for tests).
var connectTimeout = 10 * time.Second

// dial makes a client connection to one endpoint, without name
// resolution beyond what the dialer does.
func dial(endpoint string, creds credentials.TransportCredentials) (*grpc.ClientConn, error) {
	cc, err := grpc.NewClient("passthrough:///"+endpoint, grpc.WithTransportCredentials(creds),
		// A connection that is accepted but never answered (a vmtest
		// router forward to a node that is off) must fail over to the
		// next endpoint rather than hang until the caller's deadline.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: connectTimeout}),
		// A stream (logs -f, GetNodes) to a node that lost power fails in
		// seconds instead of hanging (see rpc.ClientKeepalive).
		rpc.ClientKeepalive())
	if err != nil {
		return nil, fmt.Errorf("owner: %s: %w", endpoint, err)
	}
	return cc, nil
}

// checkPresentedCA checks that the chain a server presented ends in a CA
// with fingerprint want that signed the server's certificate.
func checkPresentedCA(raw [][]byte, want [sha256.Size]byte) error {
	if len(raw) < 2 {
		return fmt.Errorf("%w: the server presented no CA certificate", ErrCAFingerprintMismatch)
	}
	ca, err := x509.ParseCertificate(raw[len(raw)-1])
	if err != nil {
		return fmt.Errorf("owner: server's CA certificate: %w", err)
	}
	if sha256.Sum256(ca.Raw) != want {
		return fmt.Errorf("%w: the server presents CA %s, expected %s", ErrCAFingerprintMismatch, pki.Fingerprint(ca), pki.FormatFingerprint(want))
	}
	leaf, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return fmt.Errorf("owner: server certificate: %w", err)
	}
	if err := leaf.CheckSignatureFrom(ca); err != nil {
		return fmt.Errorf("%w: the server's certificate is not signed by the pinned CA: %v", ErrCAFingerprintMismatch, err)
	}
	return nil
}
