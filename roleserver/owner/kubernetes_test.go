package owner

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"slices"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/internal/testutil/fakecluster"
)

// KubernetesCredentials returns what the cluster certified, and only if
// it holds together: a client certificate for the key, from the CA sent.
func TestKubernetesCredentials(t *testing.T) {
	key := fakecluster.NewKey(t)
	f := fakecluster.New(t, fakecluster.Config{CA: fakecluster.NewCA(t, "cluster"), OwnerKey: key})
	c := ownerClient(t, f, key, f.Addr)
	k8sCA, otherCA := fakecluster.NewCA(t, "kubernetes"), fakecluster.NewCA(t, "other")
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	var lie string
	f.SetKubernetesAnswer(func(pub any) *clusterpb.IssueKubernetesCredentialsResponse {
		ca, usage, certified := k8sCA, x509.ExtKeyUsageClientAuth, pub
		switch lie {
		case "other key":
			certified = other.Public()
		case "other CA":
			ca = otherCA
		case "server certificate":
			usage = x509.ExtKeyUsageServerAuth
		}
		cert, err := fakecluster.KubernetesCertificate(ca, certified, usage, time.Now().Add(time.Hour), 1)
		if err != nil {
			t.Error(err)
			return nil
		}
		return &clusterpb.IssueKubernetesCredentialsResponse{CaCertificate: k8sCA.Certificate.Raw, ClientCertificate: cert.Raw,
			ExpiresUnixNanos: cert.NotAfter.UnixNano(), ApiServers: []string{"10.0.0.1:6443"}}
	})
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
