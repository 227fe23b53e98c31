package kubernetes

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	kubeletv1 "k8s.io/kubelet/config/v1"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/localstorage"
)

func registryCA(t *testing.T) (string, *x509.Certificate) {
	t.Helper()
	ca, err := pki.NewCA("plinth test registry CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return string(pki.CertificatePEM(ca.Certificate)), ca.Certificate
}

// ephemeralRoot is a node's tmpfs tree under a test directory.
func ephemeralRoot(t *testing.T) *localstorage.EphemeralDirectory {
	t.Helper()
	root := &localstorage.Root{}
	if err := localstorage.Place(root, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := localstorage.Create(&root.Ephemeral, 0o755); err != nil {
		t.Fatal(err)
	}
	return &root.Ephemeral
}

// TestRegistriesForContainerd: what writeRegistries writes is what
// containerd's own hosts loader (the code the CRI plugin resolves pulls
// with) reads as the policy says: the mirrors first, in order, with
// their schemes, for pull and resolve, then the registry itself (Docker
// Hub's API host for docker.io), all trusting the registry's CA; a
// registry dropped from the policy loses its directory, and the
// credentials file holds exactly the registries with credentials, mode
// 0600.
func TestRegistriesForContainerd(t *testing.T) {
	eph := ephemeralRoot(t)
	caPEM, ca := registryCA(t)
	regs := []*clusterpb.ImageRegistry{
		{Host: "registry.example.com", Mirrors: []string{"https://mirror.example.com:5000", "http://10.0.0.7:5000"}, CaCertificates: caPEM},
		{Host: "10.0.0.5:5000", Username: "puller", Password: "s3cret"},
		{Host: "docker.io", Mirrors: []string{"https://hub-cache.example.com"}},
	}
	if err := writeRegistries(eph, regs); err != nil {
		t.Fatal(err)
	}
	hosts := config.ConfigureHosts(context.Background(), config.HostOptions{HostDir: config.HostDirFromRoot(eph.Containerd.Hosts.Path())})
	type host struct{ scheme, host, path string }
	for _, tc := range []struct {
		registry string
		want     []host
		ca       bool
	}{
		{"registry.example.com", []host{{"https", "mirror.example.com:5000", "/v2"}, {"http", "10.0.0.7:5000", "/v2"}, {"https", "registry.example.com", "/v2"}}, true},
		{"10.0.0.5:5000", []host{{"https", "10.0.0.5:5000", "/v2"}}, false},
		{"docker.io", []host{{"https", "hub-cache.example.com", "/v2"}, {"https", "registry-1.docker.io", "/v2"}}, false},
	} {
		rh, err := hosts(tc.registry)
		if err != nil {
			t.Fatalf("%s: %v", tc.registry, err)
		}
		var got []host
		for _, h := range rh {
			got = append(got, host{h.Scheme, h.Host, h.Path})
			if h.Capabilities&(docker.HostCapabilityPull|docker.HostCapabilityResolve) != docker.HostCapabilityPull|docker.HostCapabilityResolve {
				t.Errorf("%s: host %s cannot pull and resolve: %v", tc.registry, h.Host, h.Capabilities)
			}
			if tc.ca && h.Scheme == "https" {
				tr, _ := h.Client.Transport.(*http.Transport)
				if tr == nil || tr.TLSClientConfig == nil || tr.TLSClientConfig.RootCAs == nil ||
					//lint:ignore SA1019 Subjects is what tells the pools apart here (none is the system pool)
					!slices.ContainsFunc(tr.TLSClientConfig.RootCAs.Subjects(), func(s []byte) bool { return bytes.Equal(s, ca.RawSubject) }) {
					t.Errorf("%s: host %s does not trust the registry's CA", tc.registry, h.Host)
				}
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: containerd resolves through %v, want %v", tc.registry, got, tc.want)
		}
	}

	creds := eph.Kubernetes.Registries.Credentials.Path()
	if fi, err := os.Stat(creds); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v %v", fi, err)
	}
	var c registryCredentials
	if b, err := os.ReadFile(creds); err != nil || json.Unmarshal(b, &c) != nil || len(c) != 1 || c["10.0.0.5:5000"].Username != "puller" || c["10.0.0.5:5000"].Password != "s3cret" {
		t.Errorf("credentials file: %v %v", c, err)
	}

	// The policy changes: one registry goes, one loses its CA.
	regs = []*clusterpb.ImageRegistry{{Host: "registry.example.com", Mirrors: []string{"https://mirror.example.com:5000"}}}
	if err := writeRegistries(eph, regs); err != nil {
		t.Fatal(err)
	}
	left, _ := os.ReadDir(eph.Containerd.Hosts.Path())
	if len(left) != 1 || left[0].Name() != "registry.example.com" {
		t.Errorf("hosts directory after the change: %v", left)
	}
	if _, err := os.Stat(filepath.Join(eph.Containerd.Hosts.Path(), "registry.example.com", "ca.pem")); !os.IsNotExist(err) {
		t.Errorf("the dropped CA is still there: %v", err)
	}
	if b, _ := os.ReadFile(creds); strings.TrimSpace(string(b)) != "{}" {
		t.Errorf("credentials after the change: %s", b)
	}
}

// TestCredentialProviderConfig: the kubelet's provider configuration
// decodes strictly into the kubelet's own CredentialProviderConfig type
// (TestCredentialProvider runs the tool it names).
func TestCredentialProviderConfig(t *testing.T) {
	credentialProviderTestConfig(t)
}

// credentialProviderTestConfig writes the registries of the credential
// provider tests and returns the kubelet's provider configuration.
func credentialProviderTestConfig(t *testing.T) kubeletv1.CredentialProviderConfig {
	t.Helper()
	eph := ephemeralRoot(t)
	regs := []*clusterpb.ImageRegistry{{Host: "10.0.0.5:5000", Username: "puller", Password: "s3cret"}, {Host: "registry.example.com"}}
	if err := writeRegistries(eph, regs); err != nil {
		t.Fatal(err)
	}
	hosts := credentialHosts(regs)
	raw := credentialProviderConfig(hosts, eph.Kubernetes.Registries.Credentials.Path())
	var cfg kubeletv1.CredentialProviderConfig
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("provider configuration: %v\n%s", err, raw)
	}
	if len(cfg.Providers) != 1 || cfg.Providers[0].Name != credentialProviderName || !slices.Equal(cfg.Providers[0].MatchImages, []string{"10.0.0.5:5000"}) ||
		cfg.Providers[0].DefaultCacheDuration == nil || cfg.Providers[0].APIVersion != "credentialprovider.kubelet.k8s.io/v1" {
		t.Errorf("provider configuration: %+v", cfg)
	}

	return cfg
}
