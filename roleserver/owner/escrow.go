package owner

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
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
func TakeOwnership(ctx context.Context, endpoint string, key ed25519.PrivateKey) (*identity.Credentials, *clusterpb.GetClusterInfoResponse, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, nil, errors.New("owner: invalid owner key")
	}
	eph, err := identity.EphemeralCertificate(key)
	if err != nil {
		return nil, nil, err
	}
	capture := identity.NewCapturingCredentials(&tls.Config{
		Certificates: []tls.Certificate{eph},
		MinVersion:   tls.VersionTLS13,
		// Trust on first use: checked against the CA below.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("owner: server sent no certificate")
			}
			return nil
		},
	})
	cc, err := dial(endpoint, capture)
	if err != nil {
		return nil, nil, err
	}
	ownerCert, err := escrow.TakeOwnership(ctx, clusterpb.NewAAAClient(cc), capture, key)
	cc.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("owner: %w", err)
	}
	state, ok := capture.State()
	if !ok || len(state.PeerCertificates) == 0 {
		return nil, nil, errors.New("owner: no TLS state for the escrow connection")
	}
	server, ownerDER := state.PeerCertificates[0], ownerCert.Raw
	if !identity.IsOwner(ownerCert) {
		return nil, nil, fmt.Errorf("owner: server issued %q, not an owner certificate", ownerCert.Subject)
	}

	// Second connection: owner certificate, same server certificate.
	pinned := identity.ClientTLSConfig(nil, tls.Certificate{Certificate: [][]byte{ownerDER}, PrivateKey: key})
	pinned.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 || !bytes.Equal(raw[0], server.Raw) {
			return errors.New("owner: the server changed its certificate between escrow and GetClusterInfo")
		}
		return nil
	}
	cc, err = dial(endpoint, credentials.NewTLS(pinned))
	if err != nil {
		return nil, nil, err
	}
	defer cc.Close()
	info, err := clusterpb.NewManagementClient(cc).GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("owner: GetClusterInfo with the new owner certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(info.GetCaCertificate())
	if err != nil {
		return nil, nil, fmt.Errorf("owner: cluster CA certificate: %w", err)
	}
	if !ca.IsCA {
		return nil, nil, fmt.Errorf("owner: cluster CA certificate %q is not a CA", ca.Subject)
	}
	// The server must be a node of the cluster whose CA it named...
	check := identity.ClientTLSConfig(ca, tls.Certificate{}).VerifyPeerCertificate
	if err := check([][]byte{server.Raw}, nil); err != nil {
		return nil, nil, fmt.Errorf("owner: server %q does not belong to the cluster CA it reports: %w", server.Subject.CommonName, err)
	}
	// ...and the owner certificate must come from that same CA.
	if err := pki.Verify(ca, nil, ownerCert, pki.UsageClient); err != nil {
		return nil, nil, fmt.Errorf("owner: owner certificate is not from the server's cluster CA: %w", err)
	}
	creds, err := identity.NewCredentials(key, ownerDER, ca.Raw)
	if err != nil {
		return nil, nil, fmt.Errorf("owner: %w", err)
	}
	return creds, info, nil
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
