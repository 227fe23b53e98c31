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

// TestReleaseKey: release key writes a private key build --sign-key
// reads (0600) and a public key cluster policy --add-release-key reads
// (readOwnerKey), of one pair, and never replaces either file; the file
// is FILE or --file FILE, exactly one of them.
func TestReleaseKey(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "keys", "release.key")
	out, _ := ctl(t, "release", "key", file)
	key, err := readReleaseKey(file)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := readOwnerKey(file + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pub, key.Public().(ed25519.PublicKey)) || !strings.Contains(out, hexOf(t, file)) {
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
		for _, args := range [][]string{{"release", "key", existing}, {"release", "key", "--file", existing}} {
			if _, stderr, code := runCLI(args...); code != 1 || !strings.Contains(stderr, "never replaced") {
				t.Errorf("plinthctl %q over an existing key: exit %d\n%s", args, code, stderr)
			}
		}
	}
	if after, _ := os.ReadFile(file); !bytes.Equal(before, after) {
		t.Error("the existing release key was replaced")
	}
	if _, err := os.Stat(filepath.Join(dir, "only-pub")); !os.IsNotExist(err) {
		t.Errorf("a refused release key wrote half a pair: %v", err)
	}

	// --file FILE as well as FILE.
	other := filepath.Join(dir, "other.key")
	if out, _ := ctl(t, "release", "key", "--file", other); !strings.Contains(out, hexOf(t, other)) || hexOf(t, other) == hexOf(t, file) {
		t.Errorf("release key --file: printed %q", out)
	}
}

// TestReleaseKeyUsage: release key without a file, with both FILE and
// --file, with two files, with -o (a format: it prints no object; the
// file flag is --file) or with -o FILE as it once was is wrong usage
// (exit 2), and writes nothing.
func TestReleaseKeyUsage(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.key"), filepath.Join(dir, "b.key")
	for _, args := range [][]string{
		{},
		{a, "--file", b},
		{a, b},
		{"-o", a},
		{a, "-o", "json"},
		{"-file", a},
	} {
		if _, stderr, code := runCLI(append([]string{"release", "key"}, args...)...); code != 2 {
			t.Errorf("release key %q: exit %d, want 2\n%s", args, code, stderr)
		}
	}
	if got := files(t, dir); got != "" {
		t.Errorf("wrong usage wrote %s", got)
	}
	if _, stderr, _ := runCLI("release", "key"); !strings.Contains(stderr, "--file FILE") {
		t.Errorf("release key without a file does not say what to give:\n%s", stderr)
	}
}

// hexOf is the public key of the release key in path, in hex.
func hexOf(t *testing.T, path string) string {
	t.Helper()
	k, err := readReleaseKey(path)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(k.Public().(ed25519.PublicKey))
}

// TestBuildSignFlags: --sign-key needs an explicit --release (the number
// is what orders signed images) and a readable release key, checked
// before anything is built.
func TestBuildSignFlags(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "release.key")
	ctl(t, "release", "key", key)
	build := func(args ...string) (string, int) {
		_, stderr, code := runCLI(append([]string{"build", "--init", "x", "--bin", dir, "--out", dir}, args...)...)
		return stderr, code
	}
	if stderr, code := build("--sign-key", key); code != 2 || !strings.Contains(stderr, "--sign-key needs --release") {
		t.Errorf("--sign-key without --release: exit %d\n%s", code, stderr)
	}
	if stderr, code := build("--sign-key", key+".pub", "--release", "3"); code != 1 || !strings.Contains(stderr, "--sign-key") {
		t.Errorf("--sign-key with a public key: exit %d\n%s", code, stderr)
	}
	// The key is fine: the build goes on to its next check.
	missing := filepath.Join(dir, "missing.pb")
	if stderr, code := build("--sign-key", key, "--release", "0", "--params", missing); code != 1 || !strings.Contains(stderr, "--params") || strings.Contains(stderr, "--sign-key") {
		t.Errorf("--sign-key with --release 0: exit %d\n%s", code, stderr)
	}
}

// TestBuildOCIArchiveFlag: a malformed --oci-archive is wrong usage,
// refused before anything is built (what an archive holds is the
// builder's check: image.TestUserImageFilesRefused).
func TestBuildOCIArchiveFlag(t *testing.T) {
	dir := t.TempDir()
	build := func(args ...string) (string, int) {
		_, stderr, code := runCLI(append([]string{"build", "--init", "x", "--bin", dir, "--out", dir}, args...)...)
		return stderr, code
	}
	for _, bad := range []string{"=example.org/app:v1", "app.tar=Not A Reference"} {
		if stderr, code := build("--oci-archive", bad); code != 2 || !strings.Contains(stderr, "--oci-archive") {
			t.Errorf("--oci-archive %q: exit %d\n%s", bad, code, stderr)
		}
	}
	missing := filepath.Join(dir, "missing.pb")
	if stderr, code := build("--oci-archive", "app.tar=example.org/app:v1", "--params", missing); code != 1 || !strings.Contains(stderr, "--params") {
		t.Errorf("a well-formed --oci-archive: exit %d\n%s", code, stderr)
	}
}

// TestPolicyReleaseKeys: the first release key of a cluster is added
// alone, signing itself; a second needs a current key's signature
// (--sign-key) besides its own; removing one likewise, and never the
// last. Each refusal says what to do and changes nothing; the policy
// prints the keys of the newest set.
func TestPolicyReleaseKeys(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	dir := t.TempDir()
	k1, k2, k3 := filepath.Join(dir, "k1"), filepath.Join(dir, "k2"), filepath.Join(dir, "k3")
	for _, k := range []string{k1, k2, k3} {
		ctl(t, "release", "key", k)
	}
	out, _ := ctl(t, "cluster", "policy", "--config", cfg, "--add-release-key", k1)
	if !strings.Contains(out, hexOf(t, k1)) {
		t.Fatalf("the first key:\n%s", out)
	}
	before := f.Policy().String()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--add-release-key", k2}, 1, "--sign-key"},
		{[]string{"--add-release-key", k2, "--sign-key", k3}, 1, "--sign-key"},
		{[]string{"--add-release-key", k2 + ".pub", "--sign-key", k1}, 1, "the private key"},
		{[]string{"--remove-release-key", k1 + ".pub", "--sign-key", k1}, 1, "last release key"},
		{[]string{"--remove-release-key", k2 + ".pub", "--sign-key", k1}, 1, "not one of the cluster's release keys"},
		{[]string{"--sign-key", k1}, 2, "give --add-release-key or --remove-release-key"},
	} {
		if _, stderr, code := policy(cfg, c.args...); code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("policy %q: exit %d, want %d and an error saying %q\n%s", c.args, code, c.code, c.want, stderr)
		}
	}
	if f.Policy().String() != before {
		t.Errorf("refused changes changed the policy: %v", f.Policy())
	}
	if out, _ := ctl(t, "cluster", "policy", "--config", cfg, "--add-release-key", k2, "--sign-key", k1); !strings.Contains(out, hexOf(t, k2)) {
		t.Fatalf("a second key:\n%s", out)
	}
	out, _ = ctl(t, "cluster", "policy", "--config", cfg, "--remove-release-key", k1+".pub", "--sign-key", k2)
	if strings.Contains(out, hexOf(t, k1)) || !strings.Contains(out, hexOf(t, k2)) || len(f.Policy().GetReleaseKeyChain()) != 3 {
		t.Fatalf("removing the first key:\n%s", out)
	}
}
