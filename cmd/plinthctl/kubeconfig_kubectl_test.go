//go:build built

package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"plinth.dev/plinth/platform/pki"
)

// Tests that run the kubectl make builds (PLINTH_KUBECTL), behind the
// built tag that make sets: go test ./... on a fresh clone has no kubectl
// of the nodes' version.

func TestKubeconfig(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)
	out := filepath.Join(t.TempDir(), "kubeconfig")
	ctl(t, "cluster", "kubeconfig", "--config", dir, "--file", out)
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig file: %v %v", fi.Mode(), err)
	}
	b, _ := os.ReadFile(out)
	cfg := readKubeconfig(t, b)
	self, _ := os.Executable()
	cl, u := cfg.Clusters[0].Cluster, cfg.Users[0].User.Exec
	if cfg.APIVersion != "v1" || cfg.Kind != "Config" || cfg.CurrentContext != cfg.Contexts[0].Name ||
		cfg.Contexts[0].Context.Cluster != cfg.Clusters[0].Name || cfg.Contexts[0].Context.User != cfg.Users[0].Name {
		t.Errorf("kubeconfig structure: %s", b)
	}
	// The first API server the cluster names; the Kubernetes CA, not
	// the cluster CA; a name every API server certificate has.
	if cl.Server != "https://"+f.APIServers()[0] || string(cl.CertificateAuthorityData) != string(pki.CertificatePEM(f.KubernetesCA.Certificate)) ||
		cl.TLSServerName != "kubernetes.default.svc" {
		t.Errorf("cluster: server %q, tls-server-name %q, CA %q", cl.Server, cl.TLSServerName, cl.CertificateAuthorityData)
	}
	if u.APIVersion != "client.authentication.k8s.io/v1" || u.Command != self || !slices.Equal(u.Args, []string{"kubernetes-credential", "--config", dir}) ||
		u.InteractiveMode != "Never" {
		t.Errorf("exec: %+v", u)
	}
	// Nothing long-lived in the file: no key, no certificate of the user.
	if strings.Contains(string(b), "client-key") || strings.Contains(string(b), "client-certificate") || strings.Contains(string(b), "token") {
		t.Errorf("the kubeconfig holds credentials:\n%s", b)
	}
	// kubectl (of the nodes' Kubernetes version) reads it.
	view := kubectl(t, "--kubeconfig", out, "config", "view", "-o",
		"jsonpath={.clusters[0].cluster.server} {.clusters[0].cluster.tls-server-name} {.users[0].user.exec.command}")
	if view != cl.Server+" kubernetes.default.svc "+self {
		t.Errorf("kubectl config view: %q", view)
	}
	// Writing it fetched (and cached) the first credential.
	if n := f.KubernetesIssued(); n != 1 {
		t.Errorf("%d credentials issued, want 1", n)
	}

	// --server wins; without --file the kubeconfig goes to stdout, alone.
	// The API server is asked whether it serves: a forwarded port of it
	// does.
	fwd := forward(t, f.API.Listener.Addr().String())
	stdout, _ := ctl(t, "cluster", "kubeconfig", "--config", dir, "--server", "https://"+fwd)
	if s := readKubeconfig(t, []byte(stdout)).Clusters[0].Cluster; s.Server != "https://"+fwd || s.TLSServerName != "kubernetes.default.svc" {
		t.Errorf("--server: %+v", s)
	}
	if _, stderr, code := runCLI("cluster", "kubeconfig", "--config", dir, "--server", "http://127.0.0.1:16443"); code != 2 {
		t.Errorf("--server http://: exit %d, want 2\n%s", code, stderr)
	}
	// No controller yet and no --server: nothing to write.
	f.SetAPIServers(nil)
	if _, stderr, code := runCLI("cluster", "kubeconfig", "--config", dir); code != 1 || !strings.Contains(stderr, "--server") {
		t.Errorf("without API servers: exit %d\n%s", code, stderr)
	}
}

// kubectl runs the kubectl built from the nodes' Kubernetes version
// (PLINTH_KUBECTL: make builds it before the unit tests) and returns its
// standard output.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	bin := os.Getenv("PLINTH_KUBECTL")
	if bin == "" {
		t.Fatal("PLINTH_KUBECTL unset: run `make unit`, which builds out/bin/kubectl")
	}
	cmd := exec.Command(bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// End to end with kubectl: the kubeconfig and the credential plugin
// (this test binary as plinthctl) reach an API server through a loopback
// address that is not in its certificate.
func TestKubeconfigWithKubectl(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)
	// An "API server" with a serving certificate from the Kubernetes CA
	// for kubernetes.default.svc only, requiring a client certificate from
	// the same CA.
	srv := f.ServeAPI(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := r.TLS.PeerCertificates[0]
		fmt.Fprintf(w, "%s %s", c.Subject.CommonName, strings.Join(c.Subject.Organization, ","))
	}))

	out := filepath.Join(t.TempDir(), "kubeconfig")
	ctl(t, "cluster", "kubeconfig", "--config", dir, "--server", srv.URL, "--file", out)
	// The plugin runs in a process of its own and must fetch anew.
	os.Remove(filepath.Join(dir, kubeCredentialFile))
	t.Setenv("PLINTHCTL_TEST_MAIN", "1")
	if body := kubectl(t, "--kubeconfig", out, "get", "--raw", "/version"); body != "plinth-owner:owner system:masters" {
		t.Errorf("the API server saw %q", body)
	}
	if n := f.KubernetesIssued(); n != 2 {
		t.Errorf("%d credentials issued, want 2 (kubeconfig, then the plugin)", n)
	}

	// A kubeconfig whose exec args spell -config with one dash (as
	// kubeconfigs in users' hands do) works the same.
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	cfg := readKubeconfig(t, b)
	cfg.Users[0].User.Exec.Args = []string{"kubernetes-credential", "-config", dir}
	if b, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(old, b, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, kubeCredentialFile))
	if body := kubectl(t, "--kubeconfig", old, "get", "--raw", "/version"); body != "plinth-owner:owner system:masters" {
		t.Errorf("with -config: the API server saw %q", body)
	}
	if n := f.KubernetesIssued(); n != 3 {
		t.Errorf("%d credentials issued, want 3 (the plugin again, with -config)", n)
	}
}
