package owner

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"slices"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
)

func (f *fakeCluster) IssueKubernetesCredentials(ctx context.Context, req *clusterpb.IssueKubernetesCredentialsRequest) (*clusterpb.IssueKubernetesCredentialsResponse, error) {
	if err := f.owner(ctx); err != nil {
		return nil, err
	}
	pub, err := x509.ParsePKIXPublicKey(req.PublicKey)
	if err != nil {
		return nil, err
	}
	return f.k8s(pub), nil
}

// kubeCert is a client certificate from ca for pub, valid for d.
func kubeCert(t *testing.T, ca *pki.CA, pub any, usage x509.ExtKeyUsage, d time.Duration) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "plinth-owner:owner"},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(d),
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}, ca.Certificate, pub, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

// KubernetesCredentials returns what the cluster certified, and only if
// it holds together: a client certificate for the key, from the CA sent.
func TestKubernetesCredentials(t *testing.T) {
	key := newKey(t)
	f := newFakeCluster(t, newCA(t, "cluster"), key.Public().(ed25519.PublicKey))
	c := ownerClient(t, f, key, f.addr)
	k8sCA, otherCA := newCA(t, "kubernetes"), newCA(t, "other")
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	var lie string
	f.k8s = func(pub any) *clusterpb.IssueKubernetesCredentialsResponse {
		ca, usage, certified := k8sCA, x509.ExtKeyUsageClientAuth, pub
		switch lie {
		case "other key":
			certified = other.Public()
		case "other CA":
			ca = otherCA
		case "server certificate":
			usage = x509.ExtKeyUsageServerAuth
		}
		cert := kubeCert(t, ca, certified, usage, time.Hour)
		return &clusterpb.IssueKubernetesCredentialsResponse{CaCertificate: k8sCA.Certificate.Raw, ClientCertificate: cert.Raw,
			ExpiresUnixNanos: cert.NotAfter.UnixNano(), ApiServers: []string{"10.0.0.1:6443"}}
	}
	mine, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	kc, err := c.KubernetesCredentials(ctx(t), mine.Public())
	if err != nil {
		t.Fatal(err)
	}
	if !kc.CA.Equal(k8sCA.Certificate) || !mine.PublicKey.Equal(kc.Certificate.PublicKey) || !kc.Expires.Equal(kc.Certificate.NotAfter) ||
		!slices.Equal(kc.APIServers, []string{"10.0.0.1:6443"}) {
		t.Errorf("credentials: %+v", kc)
	}
	for _, lie = range []string{"other key", "other CA", "server certificate"} {
		if _, err := c.KubernetesCredentials(ctx(t), mine.Public()); !errors.Is(err, ErrBadKubernetesCredentials) {
			t.Errorf("%s: %v, want ErrBadKubernetesCredentials", lie, err)
		}
	}
}
