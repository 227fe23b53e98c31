package image

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/releasekeys"
)

// TestWriteManifest: a signed manifest names its key and manifest.sig
// verifies over its exact bytes, the same bytes every time (ed25519 is
// deterministic: builds stay reproducible); written unsigned, the old
// signature goes.
func TestWriteManifest(t *testing.T) {
	dir := t.TempDir()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	m := &Manifest{Board: "qemu-x86_64", Version: "v1", Release: 12}
	if err := WriteManifest(dir, m, key); err != nil {
		t.Fatal(err)
	}
	js, sig := must(os.ReadFile(filepath.Join(dir, ManifestFile))), must(os.ReadFile(filepath.Join(dir, SignatureFile)))
	if !ed25519.Verify(pub, js, sig) || m.ReleaseKey != hex.EncodeToString(pub) {
		t.Fatalf("signature does not verify, or release_key %q is not the signer's", m.ReleaseKey)
	}
	if !bytes.Contains(js, []byte(`"release": 12`)) || !bytes.Contains(js, []byte(`"release_key": "`+hex.EncodeToString(pub)+`"`)) {
		t.Errorf("manifest:\n%s", js)
	}
	if err := WriteManifest(dir, m, key); err != nil {
		t.Fatal(err)
	}
	if again := must(os.ReadFile(filepath.Join(dir, SignatureFile))); !bytes.Equal(again, sig) {
		t.Error("signing the same manifest twice gave other bytes")
	}
	if err := WriteManifest(dir, m, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, SignatureFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an unsigned manifest kept the old signature: %v", err)
	}
	if js := must(os.ReadFile(filepath.Join(dir, ManifestFile))); bytes.Contains(js, []byte("release_key")) {
		t.Errorf("an unsigned manifest names a release key:\n%s", js)
	}
}

// checkSigned: a signed build's manifest.sig verifies with key, and the
// system image carries the key (layout.ReleaseKeyPath) and the release
// (os-release PLINTH_RELEASE).
func checkSigned(t *testing.T, out string, m *Manifest, pub ed25519.PublicKey, release uint64) {
	t.Helper()
	js, sig := must(os.ReadFile(filepath.Join(out, ManifestFile))), must(os.ReadFile(filepath.Join(out, SignatureFile)))
	if !ed25519.Verify(pub, js, sig) || m.Release != release || m.ReleaseKey != hex.EncodeToString(pub) {
		t.Errorf("signature verifies: %v; release %d, key %s", ed25519.Verify(pub, js, sig), m.Release, m.ReleaseKey)
	}
	root := filepath.Join(t.TempDir(), "root")
	keyPath, osRelease := strings.TrimPrefix(layout.ReleaseKeyPath, "/"), strings.TrimPrefix(layout.OSReleasePath, "/")
	genesisPath := strings.TrimPrefix(layout.ReleaseGenesisPath, "/")
	if msg, err := exec.Command("unsquashfs", "-no-progress", "-d", root, filepath.Join(out, SystemFile), keyPath, osRelease, genesisPath).CombinedOutput(); err != nil {
		t.Fatalf("unsquashfs: %v: %s", err, msg)
	}
	// The genesis a cluster founded by this image starts with: the key
	// alone, signed by it, as a node on first use verifies it.
	var g releasekeys.Signed
	if err := json.Unmarshal(must(os.ReadFile(filepath.Join(root, genesisPath))), &g); err != nil {
		t.Fatalf("%s: %v", layout.ReleaseGenesisPath, err)
	}
	if keys, _, err := (releasekeys.Trust{}).Follow([]releasekeys.Signed{g}); err != nil || len(keys) != 1 || !bytes.Equal(keys[0], pub) {
		t.Errorf("%s: keys %x, %v; want the signing key", layout.ReleaseGenesisPath, keys, err)
	}
	if got, err := os.ReadFile(filepath.Join(root, keyPath)); err != nil || string(got) != hex.EncodeToString(pub)+"\n" {
		t.Errorf("%s: %q, %v", layout.ReleaseKeyPath, got, err)
	}
	if got, err := os.ReadFile(filepath.Join(root, osRelease)); err != nil || !strings.Contains(string(got), fmt.Sprintf("\nPLINTH_RELEASE=%d\n", release)) {
		t.Errorf("os-release: %q, %v", got, err)
	}
}
