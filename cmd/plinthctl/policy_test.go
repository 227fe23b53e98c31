package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/pki"
)

// policy runs plinthctl cluster policy with the configuration in cfg.
func policy(cfg string, args ...string) (stdout, stderr string, code int) {
	return runCLI(append([]string{"cluster", "policy", "--config", cfg}, args...)...)
}

// TestPolicyRegistries: plinthctl cluster policy sets up an image
// registry part by part (mirrors, CA from a file, credentials with the
// password from a file), prints it without the password, changes one
// part keeping the others, drops it; flags that say two things are wrong
// usage, and a password file that is missing and a registry that is not
// a host are refused with the flag's name, before anything changes.
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

	out, _ := ctl(t, "cluster", "policy", "--config", cfg, "--registry", "10.0.0.5:5000", "--mirror", "https://mirror.example.com,https://10.0.0.7:5000",
		"--registry-ca", caFile, "--registry-username", "puller", "--registry-password-file", pwFile)
	want := "image registries:   10.0.0.5:5000: mirrors https://mirror.example.com https://10.0.0.7:5000, CA CN=Registry CA, user puller (password set)"
	if !strings.Contains(out, want) || strings.Contains(out, "s3cret") {
		t.Errorf("printed policy:\n%s\nwant the line %q and no password", out, want)
	}
	r := f.Policy().GetKubernetes().GetImageRegistries()
	if len(r) != 1 || r[0].GetPassword() != "s3cret" || r[0].GetUsername() != "puller" || len(r[0].GetMirrors()) != 2 || !strings.Contains(r[0].GetCaCertificates(), "BEGIN CERTIFICATE") {
		t.Fatalf("stored registries: %v", r)
	}
	// Nor does JSON or YAML hold the password.
	for _, o := range []string{"json", "yaml"} {
		if out, _ := ctl(t, "cluster", "policy", "--config", cfg, "-o", o); strings.Contains(out, "s3cret") || !strings.Contains(out, "puller") {
			t.Errorf("policy -o %s:\n%s\nwant the user and no password", o, out)
		}
	}

	// One part changes, the rest stays.
	ctl(t, "cluster", "policy", "--config", cfg, "--registry", "10.0.0.5:5000", "--no-mirrors")
	if r := f.Policy().GetKubernetes().GetImageRegistries(); len(r) != 1 || len(r[0].GetMirrors()) != 0 || r[0].GetPassword() != "s3cret" || r[0].GetCaCertificates() == "" {
		t.Errorf("after --no-mirrors: %v", r)
	}

	before := f.Policy().String()
	for _, tc := range []struct {
		args []string
		code int // 2: wrong usage, 1: refused
		want string
	}{
		{[]string{"--mirror", "https://m.example.com"}, 2, "need --registry HOST"},
		{[]string{"--registry", "r.example", "--mirror", "https://m.example.com", "--no-mirrors"}, 2, "not both"},
		{[]string{"--registry", "r.example", "--registry-ca", caFile, "--no-registry-ca"}, 2, "not both"},
		{[]string{"--registry", "r.example", "--registry-username", "u"}, 2, "--registry-password-file"},
		{[]string{"--registry", "r.example", "--remove-registry", "r.example"}, 2, "give one"},
		{[]string{"--registry", "r.example", "--registry-username", "u", "--registry-password-file", filepath.Join(dir, "missing")}, 1, "--registry-password-file"},
		{[]string{"--registry", "https://r.example"}, 1, "image registry"},
		{[]string{"--registry", "r.example", "--mirror", "mirror.example.com"}, 1, "https://"},
		{[]string{"--remove-registry", "nowhere.example"}, 1, "no such registry"},
		{[]string{"-registry", "r.example"}, 2, "--registry"},
	} {
		_, stderr, code := policy(cfg, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("policy %q: exit %d, want %d and an error containing %q\n%s", tc.args, code, tc.code, tc.want, stderr)
		}
	}
	if f.Policy().String() != before {
		t.Errorf("refused changes changed the policy: %v", f.Policy())
	}

	out, _ = ctl(t, "cluster", "policy", "--config", cfg, "--remove-registry", "10.0.0.5:5000")
	if !strings.Contains(out, "image registries:   none configured") || len(f.Policy().GetKubernetes().GetImageRegistries()) != 0 {
		t.Errorf("policy --remove-registry:\n%s", out)
	}
}

// TestPolicyExternalIPs: plinthctl cluster policy allows Services address
// ranges as external IPs, prints them, refuses a range that is not a
// CIDR or meets the nodes' own networks before anything changes, and
// goes back to none.
func TestPolicyExternalIPs(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	out, _ := ctl(t, "cluster", "policy", "--config", cfg, "--allow-external-ips", "192.0.2.0/28", "--allow-external-ips", "2001:db8::/64")
	if !strings.Contains(out, "external IPs:       192.0.2.0/28 2001:db8::/64") {
		t.Fatalf("policy --allow-external-ips:\n%s", out)
	}
	before := f.Policy().String()
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"--allow-external-ips", "10.96.0.0/24"}, 1},
		{[]string{"--allow-external-ips", "192.0.2.1/28"}, 1},
		{[]string{"--allow-external-ips", "192.0.2.0/28", "--no-external-ips"}, 2},
	} {
		if _, stderr, code := policy(cfg, tc.args...); code != tc.code {
			t.Errorf("policy %q: exit %d, want %d\n%s", tc.args, code, tc.code, stderr)
		}
	}
	if f.Policy().String() != before {
		t.Errorf("refused changes changed the policy: %v", f.Policy())
	}
	out, _ = ctl(t, "cluster", "policy", "--config", cfg, "--no-external-ips")
	if !strings.Contains(out, "external IPs:       none (default)") || len(f.Policy().GetKubernetes().GetAllowedExternalIps()) != 0 {
		t.Errorf("policy --no-external-ips:\n%s", out)
	}
}

// TestPolicyOutput: -o json is the ClusterConfiguration, as the text
// shows it, also after a change (the result is printed); -o yaml names
// the same fields; wrong usage (a format it does not print, an argument,
// conflicting flags) exits 2 and changes nothing.
func TestPolicyOutput(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	path := layout.HostVolumesDir + "/data"
	out, _ := ctl(t, "cluster", "policy", "--config", cfg, "--pod-security", "restricted", "--allow-host-path", path, "-o", "json")
	var got clusterpb.ClusterConfiguration
	if err := protojson.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("policy -o json: %v\n%s", err, out)
	}
	k := got.GetKubernetes()
	if k.GetPodSecurityLevel() != "restricted" || len(k.GetAllowedHostPaths()) != 1 || k.GetAllowedHostPaths()[0] != path {
		t.Errorf("policy -o json after a change: %v", &got)
	}
	if out, _ := ctl(t, "cluster", "policy", "--config", cfg, "-o", "yaml"); !strings.Contains(out, "podSecurityLevel: restricted") {
		t.Errorf("policy -o yaml:\n%s", out)
	}
	if out, _ := ctl(t, "cluster", "policy", "--config", cfg); !strings.Contains(out, "pod security:       restricted") {
		t.Errorf("policy (text):\n%s", out)
	}
	before := f.Policy().String()
	for _, args := range [][]string{
		{"-o", "table"},
		{"extra"},
		{"--allow-host-path", path, "--no-host-paths"},
		{"--sign-key", "k"},
		{"--no-such-flag"},
	} {
		if _, stderr, code := policy(cfg, args...); code != 2 {
			t.Errorf("policy %q: exit %d, want 2\n%s", args, code, stderr)
		}
	}
	if f.Policy().String() != before {
		t.Errorf("wrong usage changed the policy: %v", f.Policy())
	}
}
