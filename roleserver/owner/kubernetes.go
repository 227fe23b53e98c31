package owner

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"plinth.dev/plinth/api/clusterpb"
)

// KubernetesCredentials are the owner's credentials for the Kubernetes
// API (Management.IssueKubernetesCredentials): a client certificate for a
// Kubernetes administrator, short-lived, and where the API servers are.
type KubernetesCredentials struct {
	// CA is the Kubernetes CA: the API servers' certificates chain to it.
	CA *x509.Certificate
	// Certificate is the client certificate for the key asked for.
	Certificate *x509.Certificate
	// Expires is when Certificate does.
	Expires time.Time
	// APIServers are host:port of the controllers' API servers (none
	// while no node has the KubernetesController role).
	APIServers []string
}

// ErrBadKubernetesCredentials is returned by KubernetesCredentials when
// the cluster's answer does not hold together.
var ErrBadKubernetesCredentials = errors.New("owner: the cluster returned unusable Kubernetes credentials")

// KubernetesCredentials asks the cluster to certify pub (ECDSA P-256 or
// ed25519; the private key stays with the caller) for the Kubernetes API.
// The answer comes over the connection to a curator of the pinned
// cluster CA, which is why its Kubernetes CA can be trusted; it is checked
// to hold together: a client certificate for pub, from that CA.
func (c *Client) KubernetesCredentials(ctx context.Context, pub crypto.PublicKey) (*KubernetesCredentials, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("owner: %w", err)
	}
	var r *clusterpb.IssueKubernetesCredentialsResponse
	err = c.management(ctx, func(m clusterpb.ManagementClient) (err error) {
		r, err = m.IssueKubernetesCredentials(ctx, &clusterpb.IssueKubernetesCredentialsRequest{PublicKey: der})
		return err
	})
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(r.GetCaCertificate())
	if err != nil {
		return nil, fmt.Errorf("%w: CA: %v", ErrBadKubernetesCredentials, err)
	}
	cert, err := x509.ParseCertificate(r.GetClientCertificate())
	if err != nil {
		return nil, fmt.Errorf("%w: certificate: %v", ErrBadKubernetesCredentials, err)
	}
	if k, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(pub) {
		return nil, fmt.Errorf("%w: the certificate is for another key", ErrBadKubernetesCredentials)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadKubernetesCredentials, err)
	}
	expires := cert.NotAfter
	if e := time.Unix(0, r.GetExpiresUnixNanos()); r.GetExpiresUnixNanos() != 0 && e.Before(expires) {
		expires = e
	}
	return &KubernetesCredentials{CA: ca, Certificate: cert, Expires: expires, APIServers: r.GetApiServers()}, nil
}
