package pki

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"maps"
	"net"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	clusterpki "plinth.dev/plinth/platform/pki"
)

const testNode = "plinth-0123456789abcdef0123456789abcdef"

var testAddrs = []net.IP{net.ParseIP("10.0.2.15"), net.ParseIP("fd00::15")}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func parsePEM(t *testing.T, what string, b []byte) *x509.Certificate {
	t.Helper()
	c, err := clusterpki.ParseCertificatePEM(b)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return c
}

// verify checks that cert chains to ca for usage and not for the other
// TLS usage.
func verify(t *testing.T, what string, ca, cert *x509.Certificate, usage x509.ExtKeyUsage) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		t.Errorf("%s does not verify: %v", what, err)
	}
	other := x509.ExtKeyUsageClientAuth
	if usage == other {
		other = x509.ExtKeyUsageServerAuth
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{other}}); err == nil {
		t.Errorf("%s also verifies for %v", what, other)
	}
}

func wantSubject(t *testing.T, what string, c *x509.Certificate, cn string, orgs ...string) {
	t.Helper()
	if c.Subject.CommonName != cn || !slices.Equal(c.Subject.Organization, orgs) {
		t.Errorf("%s: subject CN %q O %q, want CN %q O %q", what, c.Subject.CommonName, c.Subject.Organization, cn, orgs)
	}
}

func wantLifetime(t *testing.T, what string, c *x509.Certificate, d time.Duration) {
	t.Helper()
	if left := time.Until(c.NotAfter); left > d || left < d-time.Minute {
		t.Errorf("%s: valid for another %v, want %v", what, left, d)
	}
}

func ipStrings(ips []net.IP) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

// keyPair parses a KeyPair as a component would (tls.X509KeyPair checks
// that the key is the certificate's) and checks its key is ECDSA P-256.
func keyPair(t *testing.T, what string, kp KeyPair) *x509.Certificate {
	t.Helper()
	if _, err := tls.X509KeyPair(kp.Certificate, kp.Key); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	c := parsePEM(t, what, kp.Certificate)
	if k, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("%s: key %T, want ECDSA P-256", what, c.PublicKey)
	}
	return c
}

func TestController(t *testing.T) {
	p := New(newKV(t))
	cr, err := p.Controller(ctx(t), testNode, append(testAddrs, net.ParseIP("127.0.0.1")))
	if err != nil {
		t.Fatal(err)
	}
	ca := parsePEM(t, "CA", cr.CACertificate)
	fp := parsePEM(t, "front-proxy CA", cr.FrontProxyCACertificate)
	if !ca.IsCA || !fp.IsCA || ca.Equal(fp) {
		t.Fatalf("CAs: %v %v", ca.Subject, fp.Subject)
	}
	for _, c := range []*x509.Certificate{ca, fp} {
		if k, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
			t.Errorf("%s: key %T, want ECDSA P-256", c.Subject.CommonName, c.PublicKey)
		}
		wantLifetime(t, c.Subject.CommonName, c, CAValidity)
	}

	api := keyPair(t, "API server", cr.APIServer)
	verify(t, "API server", ca, api, x509.ExtKeyUsageServerAuth)
	wantDNS := []string{testNode, "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	wantIPs := []string{"10.0.2.15", "fd00::15", "127.0.0.1", "10.96.0.1"}
	if !slices.Equal(api.DNSNames, wantDNS) || !slices.Equal(ipStrings(api.IPAddresses), wantIPs) {
		t.Errorf("API server SANs %q %q, want %q %q", api.DNSNames, ipStrings(api.IPAddresses), wantDNS, wantIPs)
	}
	for _, h := range append(wantDNS, wantIPs...) {
		if err := api.VerifyHostname(h); err != nil {
			t.Errorf("API server certificate: %v", err)
		}
	}
	if api.VerifyHostname("plinth-ffffffffffffffffffffffffffffffff") == nil || api.VerifyHostname("10.0.2.16") == nil {
		t.Error("API server certificate valid for another node")
	}

	for _, c := range []struct {
		what string
		kp   KeyPair
		ca   *x509.Certificate
		cn   string
		orgs []string
	}{
		{"kubelet client", cr.KubeletClient, ca, "kube-apiserver-kubelet-client", nil},
		{"front-proxy client", cr.FrontProxyClient, fp, "front-proxy-client", nil},
		{"controller-manager", cr.ControllerManager, ca, "system:kube-controller-manager", nil},
		{"scheduler", cr.Scheduler, ca, "system:kube-scheduler", nil},
		{"metrics server", cr.MetricsServer, ca, "plinth:metrics-server", nil},
	} {
		cert := keyPair(t, c.what, c.kp)
		wantSubject(t, c.what, cert, c.cn, c.orgs...)
		verify(t, c.what, c.ca, cert, x509.ExtKeyUsageClientAuth)
		wantLifetime(t, c.what, cert, ControllerValidity)
		if len(cert.DNSNames)+len(cert.IPAddresses) != 0 {
			t.Errorf("%s has SANs %v %v", c.what, cert.DNSNames, cert.IPAddresses)
		}
	}
	// The metrics server's serving certificate: for the name the
	// aggregator checks (verify: and for no client).
	ms := keyPair(t, "metrics serving", cr.MetricsServing)
	verify(t, "metrics serving", ca, ms, x509.ExtKeyUsageServerAuth)
	if err := ms.VerifyHostname("metrics-server.kube-system.svc"); err != nil || len(ms.DNSNames) != 1 || len(ms.IPAddresses) != 0 {
		t.Errorf("metrics serving certificate: SANs %q %v: %v", ms.DNSNames, ms.IPAddresses, err)
	}
	// Only the front-proxy client is from the front-proxy CA, and it is
	// nobody to the API server's client CA.
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := parsePEM(t, "", cr.FrontProxyClient.Certificate).Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("the front-proxy client certificate verifies against the client CA")
	}
	if cr.NotAfter.After(api.NotAfter) {
		t.Errorf("NotAfter %v after the API server's %v", cr.NotAfter, api.NotAfter)
	}
	wantLifetime(t, "NotAfter", &x509.Certificate{NotAfter: cr.NotAfter}, ControllerValidity)

	// The service-account key pair: ECDSA P-256 (PKCS#8), the public
	// half PKIX, and a signature verifies.
	saKey, err := parsePrivateKeyPEM(cr.ServiceAccountPrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	ek, ok := saKey.(*ecdsa.PrivateKey)
	if !ok || ek.Curve != elliptic.P256() {
		t.Fatalf("service-account key %T", saKey)
	}
	block, _ := pem.Decode(cr.ServiceAccountPublicKey)
	if block == nil || block.Type != "PUBLIC KEY" {
		t.Fatalf("service-account public key: %q", cr.ServiceAccountPublicKey)
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil || !ek.PublicKey.Equal(pub) {
		t.Fatalf("service-account public key %v does not match: %v", pub, err)
	}

	// Fresh keys at every call; the same CAs and service-account key.
	again, err := p.Controller(ctx(t), testNode, testAddrs)
	if err != nil {
		t.Fatal(err)
	}
	if string(again.CACertificate) != string(cr.CACertificate) || string(again.FrontProxyCACertificate) != string(cr.FrontProxyCACertificate) ||
		string(again.ServiceAccountPrivateKey) != string(cr.ServiceAccountPrivateKey) {
		t.Error("a second Controller call changed the stored PKI")
	}
	for _, pair := range [][2]KeyPair{{cr.APIServer, again.APIServer}, {cr.KubeletClient, again.KubeletClient}, {cr.FrontProxyClient, again.FrontProxyClient},
		{cr.ControllerManager, again.ControllerManager}, {cr.Scheduler, again.Scheduler}, {cr.MetricsServing, again.MetricsServing}} {
		if string(pair[0].Key) == string(pair[1].Key) {
			t.Error("a second Controller call reused a key")
		}
	}
}

func TestKubelet(t *testing.T) {
	p := New(newKV(t))
	clientPub, _, _ := ed25519.GenerateKey(rand.Reader)
	serverKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	// Loopback, link-local and the Service and pod ranges are never a
	// node's address: left out.
	given := append(slices.Clone(testAddrs), net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP("169.254.1.1"),
		net.ParseIP("10.96.0.10"), net.ParseIP("10.244.3.1"))
	kc, err := p.Kubelet(ctx(t), testNode, given, clientPub, serverKey.Public())
	if err != nil {
		t.Fatal(err)
	}
	ca, client, server := kc.CA, kc.Client, kc.Server
	wantSubject(t, "kubelet client", client, "system:node:"+testNode, "system:nodes")
	verify(t, "kubelet client", ca, client, x509.ExtKeyUsageClientAuth)
	// The serving certificate is from a CA of its own, not the one the
	// API server's certificate (and every client's) is from.
	verify(t, "kubelet server", kc.ServingCA, server, x509.ExtKeyUsageServerAuth)
	if err := server.CheckSignatureFrom(ca); err == nil || kc.ServingCA.Equal(ca) {
		t.Error("the kubelet's serving certificate is from the Kubernetes CA")
	}
	if !clientPub.Equal(client.PublicKey) || !serverKey.PublicKey.Equal(server.PublicKey) {
		t.Error("certificates are not for the keys given")
	}
	// Exactly the node ID and the addresses given.
	if !slices.Equal(server.DNSNames, []string{testNode}) || !slices.Equal(ipStrings(server.IPAddresses), ipStrings(testAddrs)) ||
		len(server.URIs)+len(server.EmailAddresses) != 0 {
		t.Errorf("kubelet serving SANs %q %q", server.DNSNames, ipStrings(server.IPAddresses))
	}
	if len(client.DNSNames)+len(client.IPAddresses) != 0 {
		t.Errorf("kubelet client certificate has SANs")
	}
	for _, c := range []*x509.Certificate{client, server} {
		wantLifetime(t, c.Subject.CommonName, c, KubeletValidity)
	}
	// The CA is the one Controller hands the API server.
	cr, err := p.Controller(ctx(t), testNode, testAddrs)
	if err != nil {
		t.Fatal(err)
	}
	if !parsePEM(t, "CA", cr.CACertificate).Equal(ca) || !parsePEM(t, "serving CA", cr.KubeletServingCACertificate).Equal(kc.ServingCA) {
		t.Error("Kubelet and Controller use different CAs")
	}

	// Refused arguments.
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	identity := make(ed25519.PublicKey, 32)
	identity[0] = 1
	for _, tc := range []struct {
		name   string
		id     string
		addrs  []net.IP
		client crypto.PublicKey
	}{
		{"RSA key", testNode, testAddrs, rsaKey.Public()},
		{"P-384 key", testNode, testAddrs, p384.Public()},
		{"small-order ed25519 key", testNode, testAddrs, identity},
		{"short ed25519 key", testNode, testAddrs, ed25519.PublicKey{1, 2, 3}},
		{"nil key", testNode, testAddrs, nil},
		{"empty node ID", "", testAddrs, clientPub},
		{"node ID with a dot", "plinth-1.evil.example", testAddrs, clientPub},
		{"upper-case node ID", "Plinth-1", testAddrs, clientPub},
		{"bad address", testNode, []net.IP{{1, 2, 3}}, clientPub},
		{"only loopback", testNode, []net.IP{net.ParseIP("127.0.0.1")}, clientPub},
		{"no address", testNode, nil, clientPub},
	} {
		if _, err := p.Kubelet(ctx(t), tc.id, tc.addrs, tc.client, serverKey.Public()); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", tc.name, err)
		}
	}
}

func TestAdmin(t *testing.T) {
	p := New(newKV(t))
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca, cert, err := p.Admin(ctx(t), key.Public(), "owner", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The break-glass user is not the owner's (plinth-owner:…), so the
	// audit log never takes one for the other.
	wantSubject(t, "admin", cert, "plinth-controller:owner", "system:masters")
	verify(t, "admin", ca, cert, x509.ExtKeyUsageClientAuth)
	wantLifetime(t, "admin", cert, time.Hour)
	if !key.PublicKey.Equal(cert.PublicKey) {
		t.Error("admin certificate is not for the key given")
	}
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	if _, _, err := p.Admin(ctx(t), edPub, "owner", time.Minute); err != nil {
		t.Errorf("ed25519 key: %v", err)
	}
	for _, tc := range []struct {
		name     string
		user     string
		validity time.Duration
	}{
		{"no name", "", time.Hour},
		{"name with a space", "a b", time.Hour},
		{"name with a newline", "a\nb", time.Hour},
		{"zero validity", "owner", 0},
		{"negative validity", "owner", -time.Hour},
		{"too long", "owner", MaxAdminValidity + time.Second},
	} {
		if _, _, err := p.Admin(ctx(t), key.Public(), tc.user, tc.validity); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", tc.name, err)
		}
	}
}

// The PKI is created once, under its documented keys, and every PKI on
// the same etcd uses it.
func TestCreatedOnce(t *testing.T) {
	kv := newKV(t)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	kc1, err := New(kv).Kubelet(ctx(t), testNode, testAddrs, pub, pub)
	if err != nil {
		t.Fatal(err)
	}
	ca1 := kc1.CA
	stored := map[string]string{}
	resp, err := kv.Get(ctx(t), "/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range resp.Kvs {
		stored[string(e.Key)] = string(e.Value)
	}
	// Only what Kubelet needs is created.
	if len(stored) != 4 || stored[keyCACert] == "" || stored[keyCAKey] == "" || stored[keyKubeletServingCACert] == "" || stored[keyKubeletServingCAKey] == "" {
		t.Fatalf("stored after Kubelet: %v", slices.Sorted(maps.Keys(stored)))
	}
	if !parsePEM(t, "stored CA", []byte(stored[keyCACert])).Equal(ca1) {
		t.Error("the stored CA is not the one returned")
	}
	kc2, err := New(kv).Kubelet(ctx(t), testNode, testAddrs, pub, pub)
	if err != nil || !kc2.CA.Equal(ca1) || !kc2.ServingCA.Equal(kc1.ServingCA) {
		t.Fatalf("second PKI: %v, same CAs %v", err, err == nil && kc2.CA.Equal(ca1))
	}
	if _, err := New(kv).Controller(ctx(t), testNode, nil); err != nil {
		t.Fatal(err)
	}
	resp, err = kv.Get(ctx(t), "/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range resp.Kvs {
		keys = append(keys, string(e.Key))
		if v, ok := stored[string(e.Key)]; ok && v != string(e.Value) {
			t.Errorf("%s changed", e.Key)
		}
	}
	want := []string{keyCACert, keyCAKey, keyFrontProxyCAKey, keyFrontProxyCACert, keyServiceAccountKey, keyKubeletServingCACert, keyKubeletServingCAKey}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("stored keys %q, want %q", keys, want)
	}
}

// Concurrent first uses, from PKIs on different clients as on different
// nodes, end with one PKI that all of them return.
func TestConcurrentCreation(t *testing.T) {
	kv := newKV(t)
	const n = 8
	results := make([]*ControllerCredentials, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			cr, err := New(kv).Controller(ctx(t), testNode, nil)
			if err != nil {
				t.Error(err)
				return
			}
			results[i] = cr
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, r := range results[1:] {
		if string(r.CACertificate) != string(results[0].CACertificate) || string(r.FrontProxyCACertificate) != string(results[0].FrontProxyCACertificate) ||
			string(r.ServiceAccountPrivateKey) != string(results[0].ServiceAccountPrivateKey) {
			t.Fatal("concurrent creators ended with different PKIs")
		}
	}
	resp, err := kv.Get(ctx(t), keyCACert)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Version != 1 || string(resp.Kvs[0].Value) != string(results[0].CACertificate) {
		t.Fatalf("stored CA: %v %v", resp, err)
	}
}

// A Kubernetes CA that an older Plinth made with an ed25519 key under the
// same keys is used as it is.
func TestEd25519CAKept(t *testing.T) {
	kv := newKV(t)
	old, err := clusterpki.NewCA("Plinth Kubernetes CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := old.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Txn(ctx(t)).Then(clientv3.OpPut(keyCACert, string(certPEM)), clientv3.OpPut(keyCAKey, string(keyPEM))).Commit(); err != nil {
		t.Fatal(err)
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	kc, err := New(kv).Kubelet(ctx(t), testNode, testAddrs, pub, pub)
	if err != nil {
		t.Fatal(err)
	}
	ca, client := kc.CA, kc.Client
	if !ca.Equal(old.Certificate) {
		t.Fatal("the stored ed25519 CA was not used")
	}
	verify(t, "kubelet client from the ed25519 CA", ca, client, x509.ExtKeyUsageClientAuth)
}

func TestDamagedStore(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	for _, tc := range []struct {
		name string
		put  map[string]string
	}{
		{"certificate without key", map[string]string{keyCACert: "x"}},
		{"key without certificate", map[string]string{keyCAKey: "x"}},
		{"garbage", map[string]string{keyCACert: "x", keyCAKey: "y"}},
	} {
		kv := newKV(t)
		for k, v := range tc.put {
			if _, err := kv.Put(ctx(t), k, v); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := New(kv).Kubelet(ctx(t), testNode, testAddrs, pub, pub); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", tc.name, err)
		}
		// Nothing was overwritten.
		for k, v := range tc.put {
			if r, err := kv.Get(ctx(t), k); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != v {
				t.Errorf("%s: %s overwritten", tc.name, k)
			}
		}
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := New(newKV(t)).Kubelet(cancelled, testNode, testAddrs, pub, pub); !errors.Is(err, ErrStore) {
		t.Errorf("cancelled context: %v, want ErrStore", err)
	}
}

// This package is linked into PID 1: no k8s.io package may come with it.
func TestNoKubernetesImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "plinth.dev/plinth/roleserver/kubernetes/pki").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if strings.HasPrefix(dep, "k8s.io/") || strings.HasPrefix(dep, "sigs.k8s.io/") {
			t.Errorf("depends on %s", dep)
		}
	}
}

func TestRenewAt(t *testing.T) {
	issued := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got, want := RenewAt(issued, issued.Add(KubeletValidity)), issued.Add(20*24*time.Hour); !got.Equal(want) {
		t.Errorf("RenewAt for %v: %v, want %v", KubeletValidity, got, want)
	}
	if got := RenewAt(issued, issued.Add(-time.Hour)); got.After(issued) {
		t.Errorf("an expired certificate is renewed at %v, after its issue", got)
	}
}
