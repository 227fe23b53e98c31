package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/owner"
)

// The test binary stands in for plinthctl when client-go runs the
// credential plugin a kubeconfig names (os.Executable, i.e. this binary):
// with PLINTHCTL_TEST_MAIN=1 it is plinthctl.
func TestMain(m *testing.M) {
	if os.Getenv("PLINTHCTL_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func readKubeconfig(t *testing.T, b []byte) kubeconfig {
	t.Helper()
	var cfg kubeconfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("kubeconfig: %v\n%s", err, b)
	}
	if len(cfg.Clusters) != 1 || len(cfg.Users) != 1 || len(cfg.Contexts) != 1 {
		t.Fatalf("kubeconfig: %s", b)
	}
	return cfg
}

// TestKubeconfigUsage: cluster kubeconfig prints no object (-o is
// refused: --file names the file), takes no argument, and --revoke-all
// writes nothing, so it takes none of the writing flags; each is wrong
// usage (exit 2) before anything is asked or revoked.
func TestKubeconfigUsage(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)
	out := filepath.Join(t.TempDir(), "kubeconfig")
	calls := f.OwnerCalls()
	for _, args := range [][]string{
		{"-o", out},
		{"-o", "json"},
		{"extra"},
		{"--revoke-all", "--file", out},
		{"--revoke-all", "--server", "https://127.0.0.1:6443"},
		{"--revoke-all", "--wait", "1m"},
		{"--server", "127.0.0.1:6443"},
	} {
		if _, stderr, code := runCLI(append([]string{"cluster", "kubeconfig", "--config", dir}, args...)...); code != 2 {
			t.Errorf("cluster kubeconfig %q: exit %d, want 2\n%s", args, code, stderr)
		}
	}
	if n := f.OwnerCalls(); n != calls {
		t.Errorf("wrong usage made %d owner calls", n-calls)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("wrong usage wrote a kubeconfig")
	}
}

// TestKubeconfigNotServing: a kubeconfig for an API server that does not
// serve yet is written, and plinthctl says the server is not serving
// instead of leaving kubectl to meet a reset connection; -wait waits for
// it. A cluster without a controller gets no kubeconfig at all.
func TestKubeconfigNotServing(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)
	out := filepath.Join(t.TempDir(), "kubeconfig")

	kubeconfig := func(args ...string) (string, int) {
		_, stderr, code := runCLI(append([]string{"cluster", "kubeconfig", "--config", dir}, args...)...)
		return stderr, code
	}
	notServing := owner.ErrAPINotServing.Error()

	// Not ready: /readyz answers 500.
	f.SetAPIReady(false)
	stderr, code := kubeconfig("--file", out)
	if code != 1 || !strings.Contains(stderr, notServing) || !strings.Contains(stderr, "the API server is not serving yet") ||
		!strings.Contains(stderr, "the node is still starting Kubernetes") || !strings.Contains(stderr, "--wait 10m") || !strings.Contains(stderr, "wrote "+out) {
		t.Errorf("kubeconfig against an API server that is not ready: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(out); err != nil {
		t.Errorf("the kubeconfig was not written: %v", err)
	}
	// Nothing listens (QEMU's forward of a guest port nothing listens
	// on resets the connection: a listener that closes each one).
	for name, server := range map[string]string{"closed port": closedPort(t), "reset": resetter(t)} {
		if stderr, code := kubeconfig("--server", "https://"+server, "--file", out); code != 1 || !strings.Contains(stderr, notServing) {
			t.Errorf("%s: exit %d\n%s", name, code, stderr)
		}
	}
	// Ready, but no pod can be made yet: the controller manager has not
	// made the default service account.
	f.SetAPIReady(true)
	f.SetDefaultServiceAccount(false)
	if stderr, code := kubeconfig("--file", out); code != 1 || !strings.Contains(stderr, notServing) || !strings.Contains(stderr, "default service account") {
		t.Errorf("kubeconfig before the controller manager made the default service account: exit %d\n%s", code, stderr)
	}
	f.SetDefaultServiceAccount(true)
	f.SetAPIReady(false)
	// --wait: it serves a little later.
	time.AfterFunc(3*time.Second, func() { f.SetAPIReady(true) })
	if _, stderr := ctl(t, "cluster", "kubeconfig", "--config", dir, "--file", out, "--wait", "1m"); !strings.Contains(stderr, "serving") {
		t.Errorf("kubeconfig --wait:\n%s", stderr)
	}

	// No node is a controller: nothing will ever serve.
	os.Remove(out)
	f.EditNodes(func(nodes []*clusterpb.Node) { nodes[0].Roles.KubernetesController = nil })
	stderr, code = kubeconfig("--file", out)
	if code != 1 || !strings.Contains(stderr, errNoController.Error()) || !strings.Contains(stderr, "plinthctl role add NODE kubernetes-controller kubernetes-worker") {
		t.Errorf("kubeconfig without a controller: exit %d\n%s", code, stderr)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a kubeconfig was written for a cluster without a controller")
	}
}

// forward is a TCP proxy to addr on a port of its own.
func forward(t *testing.T, addr string) string {
	t.Helper()
	return listen(t, proxyTo(addr))
}

// proxyTo serves a connection by copying it to and from addr.
func proxyTo(addr string) func(net.Conn) {
	return func(c net.Conn) {
		defer c.Close()
		up, err := net.Dial("tcp", addr)
		if err != nil {
			return
		}
		defer up.Close()
		go io.Copy(up, c)
		io.Copy(c, up)
	}
}

// resetter accepts connections and closes them at once.
func resetter(t *testing.T) string {
	t.Helper()
	return listen(t, func(c net.Conn) { c.Close() })
}

func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	addr, err := listenOn(t, "127.0.0.1:0", serve)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// listenOn serves each connection to addr with serve until the test ends.
func listenOn(t *testing.T, addr string, serve func(net.Conn)) (string, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return lis.Addr().String(), nil
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// parseCredential checks the plugin's output as client-go would use it.
func parseCredential(t *testing.T, f *fakeCluster, out string) (execCredential, *x509.Certificate) {
	t.Helper()
	var cred execCredential
	if err := json.Unmarshal([]byte(out), &cred); err != nil || cred.Status == nil {
		t.Fatalf("ExecCredential: %v\n%s", err, out)
	}
	if cred.APIVersion != "client.authentication.k8s.io/v1" || cred.Kind != "ExecCredential" {
		t.Errorf("ExecCredential type: %s", out)
	}
	pair, err := tls.X509KeyPair([]byte(cred.Status.ClientCertificateData), []byte(cred.Status.ClientKeyData))
	if err != nil {
		t.Fatalf("ExecCredential key pair: %v", err)
	}
	if err := pki.Verify(f.KubernetesCA.Certificate, nil, pair.Leaf, pki.UsageClient); err != nil {
		t.Errorf("ExecCredential certificate: %v", err)
	}
	exp, err := time.Parse(time.RFC3339, cred.Status.ExpirationTimestamp)
	if err != nil || exp.After(pair.Leaf.NotAfter) || pair.Leaf.NotAfter.Sub(exp) >= time.Second {
		t.Errorf("expirationTimestamp %q, certificate NotAfter %v: %v", cred.Status.ExpirationTimestamp, pair.Leaf.NotAfter, err)
	}
	return cred, pair.Leaf
}

// TestKubernetesCredential: the credential plugin prints an
// ExecCredential and nothing else on stdout, caches it, and takes its
// configuration directory in the spelling the kubeconfigs it is named in
// have: --config DIR, and -config DIR (single dash) of kubeconfigs
// written before.
func TestKubernetesCredential(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)
	out, _ := ctl(t, "kubernetes-credential", "--config", dir)
	_, cert := parseCredential(t, f, out)
	if k, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("key %T, want ECDSA P-256", cert.PublicKey)
	}
	if fi, err := os.Stat(filepath.Join(dir, kubeCredentialFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("cache: %v %v", fi, err)
	}
	// The cache answers until shortly before expiry, whichever spelling
	// names it.
	for _, args := range [][]string{{"kubernetes-credential", "-config", dir}, {"kubernetes-credential", "-config=" + dir}, {"--config", dir, "kubernetes-credential"}} {
		if again, _ := ctl(t, args...); again != out || f.KubernetesIssued() != 1 {
			t.Errorf("plinthctl %q: same output %v, %d issued", args, again == out, f.KubernetesIssued())
		}
	}
	if _, ok := cachedKubeCredential(dir, time.Now().Add(time.Hour-kubeCredentialRenewBefore+time.Minute)); ok {
		t.Error("a credential about to expire came from the cache")
	}
	// A damaged cache is replaced.
	if err := os.WriteFile(filepath.Join(dir, kubeCredentialFile), []byte(`{"apiVersion":"client.authentication.k8s.io/v1","status":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ = ctl(t, "kubernetes-credential", "-config", dir)
	if f.KubernetesIssued() != 2 {
		t.Fatalf("after damage: %d issued", f.KubernetesIssued())
	}
	parseCredential(t, f, out)
	// Certificates shorter than the renewal margin are never cached.
	f.SetKubernetesValidity(kubeCredentialRenewBefore - time.Minute)
	os.Remove(filepath.Join(dir, kubeCredentialFile))
	for i := range 2 {
		if ctl(t, "kubernetes-credential", "--config", dir); f.KubernetesIssued() != 3+i {
			t.Fatalf("short-lived %d: %d issued", i, f.KubernetesIssued())
		}
	}
	// Without owner credentials there is nothing to ask with; arguments
	// it does not know are wrong usage; --help says what it is, on
	// stderr. None prints on stdout.
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"-config", f.ownerDir(t)}, 1},
		{[]string{"-config"}, 2},
		{[]string{"--config", dir, "extra"}, 2},
		{[]string{"--config", dir, "-o", "json"}, 2},
		{[]string{"--help"}, 0},
	} {
		stdout, stderr, code := runCLI(append([]string{"kubernetes-credential"}, tc.args...)...)
		if code != tc.code || stdout != "" {
			t.Errorf("kubernetes-credential %q: exit %d, want %d; stdout %q\n%s", tc.args, code, tc.code, stdout, stderr)
		}
	}
	// It stays out of help.
	if help, _ := ctl(t, "--help"); strings.Contains(help, "kubernetes-credential") {
		t.Errorf("plinthctl --help lists kubernetes-credential:\n%s", help)
	}
}
