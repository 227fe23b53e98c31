package clusterpb

import (
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/platform/pki"
)

func testCAPEM(t *testing.T) string {
	t.Helper()
	ca, err := pki.NewCA("test registry CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return string(pki.CertificatePEM(ca.Certificate))
}

// TestImageRegistryCheck: what nodes would write into containerd's and
// the kubelet's configuration is refused when it is not a registry host,
// a mirror URL, PEM certificates or usable basic-auth credentials, with
// the reason; a registry named twice is refused by the policy's Check.
func TestImageRegistryCheck(t *testing.T) {
	ca := testCAPEM(t)
	for _, r := range []*ImageRegistry{
		{Host: "docker.io"},
		{Host: "registry.example.com", Mirrors: []string{"https://mirror.example.com", "http://10.0.0.7:5000/v2/cache"}},
		{Host: "10.0.0.5:5000", CaCertificates: ca + ca, Username: "puller", Password: "s3cret: with spaces"},
		{Host: "[fd00::1]:443"},
		{Host: "[fd00::1]", Mirrors: []string{"https://[fd00::2]:5000"}},
		{Host: "localhost"},
	} {
		if err := r.Check(); err != nil {
			t.Errorf("%v: %v", r, err)
		}
	}
	for _, tc := range []struct {
		r    *ImageRegistry
		want string
	}{
		{&ImageRegistry{}, "no host"},
		{&ImageRegistry{Host: "https://registry.example.com"}, "port"},
		{&ImageRegistry{Host: "registry.example.com/library"}, "not a host name"},
		{&ImageRegistry{Host: "Registry.example.com"}, "lower case"},
		{&ImageRegistry{Host: "registry.example.com:0"}, "port"},
		{&ImageRegistry{Host: "registry.example.com:http"}, "port"},
		{&ImageRegistry{Host: "fd00::1"}, "not a host name"},
		{&ImageRegistry{Host: "[10.0.0.1]"}, "brackets"},
		{&ImageRegistry{Host: "[fd00::1"}, "unclosed"},
		{&ImageRegistry{Host: "-bad.example.com"}, "not a host name"},
		{&ImageRegistry{Host: "a..b"}, "not a host name"},
		{&ImageRegistry{Host: "r.example", Mirrors: []string{"mirror.example.com"}}, "https://"},
		{&ImageRegistry{Host: "r.example", Mirrors: []string{"ftp://mirror.example.com"}}, "https://"},
		{&ImageRegistry{Host: "r.example", Mirrors: []string{"https://"}}, "no host"},
		{&ImageRegistry{Host: "r.example", Mirrors: []string{"https://u:p@mirror.example.com"}}, "no credentials"},
		{&ImageRegistry{Host: "r.example", Mirrors: []string{"https://mirror.example.com/?x=1"}}, "no query"},
		{&ImageRegistry{Host: "r.example", Mirrors: []string{"https://mirror.example.com/\"]\nserver"}}, ""},
		{&ImageRegistry{Host: "r.example", CaCertificates: "not a certificate"}, "CA certificates"},
		{&ImageRegistry{Host: "r.example", CaCertificates: ca + "trailing text"}, "not a PEM certificate"},
		{&ImageRegistry{Host: "r.example", CaCertificates: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}, "PRIVATE KEY"},
		{&ImageRegistry{Host: "r.example", Username: "puller"}, "both"},
		{&ImageRegistry{Host: "r.example", Password: "p"}, "both"},
		{&ImageRegistry{Host: "r.example", Username: "a:b", Password: "p"}, "':'"},
		{&ImageRegistry{Host: "r.example", Username: "u", Password: "p\n"}, "control character"},
	} {
		err := tc.r.Check()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: Check = %v, want an error containing %q", tc.r, err, tc.want)
		}
	}
	twice := &KubernetesPolicy{ImageRegistries: []*ImageRegistry{{Host: "r.example"}, {Host: "r.example", Username: "u", Password: "p"}}}
	if err := twice.Check(); err == nil || !strings.Contains(err.Error(), "named twice") {
		t.Errorf("a registry named twice: %v", err)
	}
	if got := (&ImageRegistry{Host: "r.example", Username: "u", Password: "p"}).Redacted(); got.GetPassword() != "(set)" || got.GetUsername() != "u" {
		t.Errorf("Redacted = %v", got)
	}
}
