package fakecluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
)

// kubeState is the Kubernetes side of the fake, under Cluster.mu.
type kubeState struct {
	validity   time.Duration // of the owner certificates issued
	apiServers []string      // what IssueKubernetesCredentials names
	issued     int           // IssueKubernetesCredentials calls answered
	// answer, if set, replaces the issuing (a test's lying cluster).
	answer func(pub any) *clusterpb.IssueKubernetesCredentialsResponse
	// API: /readyz answers 200 while ready; the default service account
	// is missing while noServiceAccount (the controller manager has not
	// started).
	ready            bool
	noServiceAccount bool
}

// startKubernetes starts the API server and names it first, then an
// address nothing answers on, as a cluster with two controllers does.
func (f *Cluster) startKubernetes(t testing.TB) {
	t.Helper()
	f.kube = kubeState{validity: time.Hour, ready: true}
	f.API = f.ServeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		ready, noSA := f.kube.ready, f.kube.noServiceAccount
		f.mu.Unlock()
		if r.URL.Path == "/api/v1/namespaces/default/serviceaccounts/default" && !noSA {
			w.Write([]byte(`{"kind":"ServiceAccount"}`))
		} else if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
		} else if !ready {
			http.Error(w, "[-]poststarthook/rbac/bootstrap-roles failed: not finished", http.StatusInternalServerError)
		}
	}))
	f.kube.apiServers = []string{f.API.Listener.Addr().String(), "10.42.0.12:6443"}
}

// ServeAPI starts an API server with h until the test ends: TLS with a
// serving certificate of KubernetesCA for kubernetes.default.svc only,
// client certificates of KubernetesCA required.
func (f *Cluster) ServeAPI(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(1000), Subject: pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:  []string{"kubernetes.default.svc"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, f.KubernetesCA.Certificate, key.Public(), f.KubernetesCA.Key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: f.KubernetesCA.CertPool()}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// KubernetesCertificate is an owner's Kubernetes client certificate as the
// curator issues it (CN plinth-owner:owner, O system:masters): from ca for
// pub, with usage, valid until notAfter.
func KubernetesCertificate(ca *pki.CA, pub any, usage x509.ExtKeyUsage, notAfter time.Time, serial int64) (*x509.Certificate, error) {
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "plinth-owner:owner", Organization: []string{"system:masters"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}, ca.Certificate, pub, ca.Key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// IssueKubernetesCredentials certifies the key with KubernetesCA, as the
// curator does, naming the API servers (SetAPIServers); or answers what
// SetKubernetesAnswer's function does.
func (f *Cluster) IssueKubernetesCredentials(ctx context.Context, req *clusterpb.IssueKubernetesCredentialsRequest) (*clusterpb.IssueKubernetesCredentialsResponse, error) {
	if err := f.owner(ctx); err != nil {
		return nil, err
	}
	pub, err := x509.ParsePKIXPublicKey(req.PublicKey)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	f.mu.Lock()
	answer := f.kube.answer
	f.mu.Unlock()
	if answer != nil {
		return answer(pub), nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kube.issued++
	notAfter := time.Now().Add(f.kube.validity)
	cert, err := KubernetesCertificate(f.KubernetesCA, pub, x509.ExtKeyUsageClientAuth, notAfter, int64(f.kube.issued))
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &clusterpb.IssueKubernetesCredentialsResponse{CaCertificate: f.KubernetesCA.Certificate.Raw, ClientCertificate: cert.Raw,
		ExpiresUnixNanos: notAfter.UnixNano(), ApiServers: slices.Clone(f.kube.apiServers)}, nil
}

// KubernetesIssued is how many Kubernetes credentials were issued.
func (f *Cluster) KubernetesIssued() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.kube.issued
}

// APIServers is what IssueKubernetesCredentials names: API first.
func (f *Cluster) APIServers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.kube.apiServers)
}

// SetAPIServers changes what IssueKubernetesCredentials names (nil: no
// controller serves yet).
func (f *Cluster) SetAPIServers(addrs []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kube.apiServers = addrs
}

// SetKubernetesValidity is how long the certificates issued from now on
// are valid (an hour until set).
func (f *Cluster) SetKubernetesValidity(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kube.validity = d
}

// SetKubernetesAnswer makes IssueKubernetesCredentials answer what answer
// returns for the key asked about, instead of issuing.
func (f *Cluster) SetKubernetesAnswer(answer func(pub any) *clusterpb.IssueKubernetesCredentialsResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kube.answer = answer
}

// SetAPIReady makes API's /readyz answer 200 (ready) or 500.
func (f *Cluster) SetAPIReady(ready bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kube.ready = ready
}

// SetDefaultServiceAccount makes API have the default service account or
// not (as before the controller manager made it).
func (f *Cluster) SetDefaultServiceAccount(exists bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kube.noServiceAccount = !exists
}
