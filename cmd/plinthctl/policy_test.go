package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/platform/pki"
)

// TestPolicyRegistries: plinthctl policy sets up an image registry part
// by part (mirrors, CA from a file, credentials with the password from a
// file), prints it without the password, changes one part keeping the
// others, drops it; flags that say two things, a password file that is
// missing and a registry that is not a host are refused with the flag's
// name, before anything changes.
func TestPolicyRegistries(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	dir := t.TempDir()
	ca, err := pki.NewCA("Registry CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile, pwFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "password")
	os.WriteFile(caFile, pki.CertificatePEM(ca.Certificate), 0o644)
	os.WriteFile(pwFile, []byte("s3cret\n"), 0o600)

	out, stderr, err := runVerb("policy", "-config", cfg, "-registry", "10.0.0.5:5000", "-mirror", "https://mirror.example.com,https://10.0.0.7:5000",
		"-registry-ca", caFile, "-registry-username", "puller", "-registry-password-file", pwFile)
	if err != nil {
		t.Fatalf("policy: %v\n%s", err, stderr)
	}
	want := "image registries:   10.0.0.5:5000: mirrors https://mirror.example.com https://10.0.0.7:5000, CA CN=Registry CA, user puller (password set)"
	if !strings.Contains(out, want) || strings.Contains(out, "s3cret") {
		t.Errorf("printed policy:\n%s\nwant the line %q and no password", out, want)
	}
	r := f.Policy().GetKubernetes().GetImageRegistries()
	if len(r) != 1 || r[0].GetPassword() != "s3cret" || r[0].GetUsername() != "puller" || len(r[0].GetMirrors()) != 2 || !strings.Contains(r[0].GetCaCertificates(), "BEGIN CERTIFICATE") {
		t.Fatalf("stored registries: %v", r)
	}

	// One part changes, the rest stays.
	if _, stderr, err := runVerb("policy", "-config", cfg, "-registry", "10.0.0.5:5000", "-no-mirrors"); err != nil {
		t.Fatalf("policy -no-mirrors: %v\n%s", err, stderr)
	}
	if r := f.Policy().GetKubernetes().GetImageRegistries(); len(r) != 1 || len(r[0].GetMirrors()) != 0 || r[0].GetPassword() != "s3cret" || r[0].GetCaCertificates() == "" {
		t.Errorf("after -no-mirrors: %v", r)
	}

	before := f.Policy().String()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-mirror", "https://m.example.com"}, "need -registry HOST"},
		{[]string{"-registry", "r.example", "-mirror", "https://m.example.com", "-no-mirrors"}, "not both"},
		{[]string{"-registry", "r.example", "-registry-username", "u"}, "-registry-password-file"},
		{[]string{"-registry", "r.example", "-registry-username", "u", "-registry-password-file", filepath.Join(dir, "missing")}, "-registry-password-file"},
		{[]string{"-registry", "https://r.example"}, "image registry"},
		{[]string{"-registry", "r.example", "-mirror", "mirror.example.com"}, "https://"},
		{[]string{"-remove-registry", "nowhere.example"}, "no such registry"},
	} {
		_, _, err := runVerb("policy", append([]string{"-config", cfg}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("policy %q = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	if f.Policy().String() != before {
		t.Errorf("refused changes changed the policy: %v", f.Policy())
	}

	out, stderr, err = runVerb("policy", "-config", cfg, "-remove-registry", "10.0.0.5:5000")
	if err != nil || !strings.Contains(out, "image registries:   none configured") || len(f.Policy().GetKubernetes().GetImageRegistries()) != 0 {
		t.Errorf("policy -remove-registry: %v %s\n%s", err, stderr, out)
	}
}

// TestPolicyExternalIPs: plinthctl policy allows Services address ranges
// as external IPs, prints them, refuses a range that is not a CIDR or
// meets the nodes' own networks before anything changes, and goes back
// to none.
func TestPolicyExternalIPs(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	out, stderr, err := runVerb("policy", "-config", cfg, "-allow-external-ips", "192.0.2.0/28", "-allow-external-ips", "2001:db8::/64")
	if err != nil || !strings.Contains(out, "external IPs:       192.0.2.0/28 2001:db8::/64") {
		t.Fatalf("policy -allow-external-ips: %v %s\n%s", err, stderr, out)
	}
	before := f.Policy().String()
	for _, args := range [][]string{{"-allow-external-ips", "10.96.0.0/24"}, {"-allow-external-ips", "192.0.2.1/28"},
		{"-allow-external-ips", "192.0.2.0/28", "-no-external-ips"}} {
		if _, _, err := runVerb("policy", append([]string{"-config", cfg}, args...)...); err == nil {
			t.Errorf("policy %q accepted", args)
		}
	}
	if f.Policy().String() != before {
		t.Errorf("refused changes changed the policy: %v", f.Policy())
	}
	out, _, err = runVerb("policy", "-config", cfg, "-no-external-ips")
	if err != nil || !strings.Contains(out, "external IPs:       none (default)") || len(f.Policy().GetKubernetes().GetAllowedExternalIps()) != 0 {
		t.Errorf("policy -no-external-ips: %v\n%s", err, out)
	}
}
