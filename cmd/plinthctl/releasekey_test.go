package main

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReleaseKey: release-key writes a private key build -sign-key reads
// (0600) and a public key policy -add-release-key reads (readOwnerKey),
// of one pair, and never replaces either file.
func TestReleaseKey(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "keys", "release.key")
	out, _, err := runVerb("release-key", "-o", file)
	if err != nil {
		t.Fatal(err)
	}
	key, err := readReleaseKey(file)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := readOwnerKey(file + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pub, key.Public().(ed25519.PublicKey)) || !strings.Contains(out, hex.EncodeToString(pub)) {
		t.Errorf("FILE.pub holds %x, the key's public key is %x; printed %q", pub, key.Public(), out)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("private key file: %v, %v", st.Mode(), err)
	}
	before, _ := os.ReadFile(file)
	for _, existing := range []string{file, filepath.Join(dir, "only-pub")} {
		if existing != file {
			os.WriteFile(existing+".pub", []byte("x"), 0o644)
		}
		if _, _, err := runVerb("release-key", "-o", existing); err == nil || !strings.Contains(err.Error(), "never replaced") {
			t.Errorf("release-key -o %s over an existing key: %v", existing, err)
		}
	}
	if after, _ := os.ReadFile(file); !bytes.Equal(before, after) {
		t.Error("the existing release key was replaced")
	}
	if _, err := os.Stat(filepath.Join(dir, "only-pub")); !os.IsNotExist(err) {
		t.Errorf("a refused release-key wrote half a pair: %v", err)
	}
	if _, _, err := runVerb("release-key"); err == nil {
		t.Error("release-key without -o accepted")
	}
}

// TestBuildSignFlags: -sign-key needs an explicit -release (the number is
// what orders signed images) and a readable release key, checked before
// anything is built.
func TestBuildSignFlags(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "release.key")
	if _, _, err := runVerb("release-key", "-o", key); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runVerb("build", "-sign-key", key, "-out", dir); err == nil || !strings.Contains(err.Error(), "-sign-key needs -release") {
		t.Errorf("-sign-key without -release: %v", err)
	}
	if _, _, err := runVerb("build", "-sign-key", key+".pub", "-release", "3", "-out", dir); err == nil || !strings.Contains(err.Error(), "-sign-key") {
		t.Errorf("-sign-key with a public key: %v", err)
	}
	// The key is fine: the build goes on to its own checks.
	if _, _, err := runVerb("build", "-sign-key", key, "-release", "0", "-out", dir); err == nil || !strings.Contains(err.Error(), "-init is required") {
		t.Errorf("-sign-key with -release 0: %v", err)
	}
}

// TestBuildOCIArchiveFlag: a malformed -oci-archive is refused before
// anything is built (what an archive holds is the builder's check:
// image.TestUserImageFilesRefused).
func TestBuildOCIArchiveFlag(t *testing.T) {
	dir := t.TempDir()
	for _, bad := range []string{"=example.org/app:v1", "app.tar=Not A Reference"} {
		if _, _, err := runVerb("build", "-oci-archive", bad, "-out", dir); err == nil || !strings.Contains(err.Error(), "-oci-archive") {
			t.Errorf("-oci-archive %q: %v", bad, err)
		}
	}
	if _, _, err := runVerb("build", "-oci-archive", "app.tar=example.org/app:v1", "-out", dir); err == nil || !strings.Contains(err.Error(), "-init is required") {
		t.Errorf("a well-formed -oci-archive: %v", err)
	}
}

// TestPolicyReleaseKeys: the first release key of a cluster is added
// alone, signing itself; a second needs a current key's signature
// (-sign-key) besides its own; removing one likewise, and never the
// last. Each refusal says what to do and changes nothing; the policy
// prints the keys of the newest set.
func TestPolicyReleaseKeys(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	dir := t.TempDir()
	k1, k2, k3 := filepath.Join(dir, "k1"), filepath.Join(dir, "k2"), filepath.Join(dir, "k3")
	for _, k := range []string{k1, k2, k3} {
		if _, _, err := runVerb("release-key", "-o", k); err != nil {
			t.Fatal(err)
		}
	}
	hexOf := func(path string) string {
		k, err := readReleaseKey(path)
		if err != nil {
			t.Fatal(err)
		}
		return hex.EncodeToString(k.Public().(ed25519.PublicKey))
	}
	out, stderr, err := runVerb("policy", "-config", cfg, "-add-release-key", k1)
	if err != nil || !strings.Contains(out, hexOf(k1)) {
		t.Fatalf("the first key: %v %s\n%s", err, stderr, out)
	}
	before := f.Policy().String()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-add-release-key", k2}, "-sign-key"},
		{[]string{"-add-release-key", k2, "-sign-key", k3}, "-sign-key"},
		{[]string{"-add-release-key", k2 + ".pub", "-sign-key", k1}, "the private key"},
		{[]string{"-remove-release-key", k1 + ".pub", "-sign-key", k1}, "last release key"},
		{[]string{"-remove-release-key", k2 + ".pub", "-sign-key", k1}, "not one of the cluster's release keys"},
		{[]string{"-sign-key", k1}, "give -add-release-key or -remove-release-key"},
	} {
		if _, _, err := runVerb("policy", append([]string{"-config", cfg}, c.args...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("policy %q: %v, want an error saying %q", c.args, err, c.want)
		}
	}
	if f.Policy().String() != before {
		t.Errorf("refused changes changed the policy: %v", f.Policy())
	}
	if out, stderr, err := runVerb("policy", "-config", cfg, "-add-release-key", k2, "-sign-key", k1); err != nil || !strings.Contains(out, hexOf(k2)) {
		t.Fatalf("a second key: %v %s\n%s", err, stderr, out)
	}
	out, stderr, err = runVerb("policy", "-config", cfg, "-remove-release-key", k1+".pub", "-sign-key", k2)
	if err != nil || strings.Contains(out, hexOf(k1)) || !strings.Contains(out, hexOf(k2)) || len(f.Policy().GetReleaseKeyChain()) != 3 {
		t.Fatalf("removing the first key: %v %s\n%s", err, stderr, out)
	}
}
