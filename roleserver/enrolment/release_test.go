package enrolment

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
)

// TestBootstrapReleaseKeys: a new cluster's release keys are the initial
// policy's, else the key the node's image carries, else none; a
// malformed image key stops the bootstrap instead of founding a cluster
// that refuses every update.
func TestBootstrapReleaseKeys(t *testing.T) {
	dir := t.TempDir()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	other, _, _ := ed25519.GenerateKey(rand.Reader)
	file := filepath.Join(dir, "release.pub")
	c := &Config{releaseKeyFile: file}

	if keys, _, err := c.bootstrapReleaseKeys(nil); err != nil || keys != nil {
		t.Errorf("unsigned image: %x, %v", keys, err)
	}
	if err := os.WriteFile(file, []byte(hex.EncodeToString(pub)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if keys, _, err := c.bootstrapReleaseKeys(nil); err != nil || len(keys) != 1 || !bytes.Equal(keys[0], pub) {
		t.Errorf("the image's key: %x, %v", keys, err)
	}
	if keys, src, err := c.bootstrapReleaseKeys([][]byte{other}); err != nil || len(keys) != 1 || !bytes.Equal(keys[0], other) || src != "initial policy" {
		t.Errorf("the initial policy's key: %x from %s, %v", keys, src, err)
	}
	for _, bad := range []string{"not hex\n", hex.EncodeToString(pub[:31]) + "\n"} {
		os.WriteFile(file, []byte(bad), 0o644)
		if _, _, err := c.bootstrapReleaseKeys(nil); err == nil {
			t.Errorf("image key %q accepted", bad)
		}
	}
}
