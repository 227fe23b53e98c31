package enrolment

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"plinth.dev/plinth/platform/releasekeys"
)

// TestBootstrapReleaseKeys: a new cluster's release keys are the genesis
// the node's image carries (its key, signed by it), else none; a
// malformed image key, a missing genesis or one that names another key
// stops the bootstrap instead of founding a cluster that refuses every
// update.
func TestBootstrapReleaseKeys(t *testing.T) {
	dir := t.TempDir()
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	keyFile, genesisFile := filepath.Join(dir, "release.pub"), filepath.Join(dir, "release-genesis.json")
	c := &Config{releaseKeyFile: keyFile, releaseGenesisFile: genesisFile}
	genesis := func(k ed25519.PrivateKey) {
		g, err := releasekeys.Genesis(k)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(g)
		os.WriteFile(genesisFile, b, 0o644)
	}

	if chain, keys, _, err := c.bootstrapReleaseKeys(); err != nil || keys != nil || chain != nil {
		t.Errorf("unsigned image: %x, %v", keys, err)
	}
	if err := os.WriteFile(keyFile, []byte(hex.EncodeToString(pub)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.bootstrapReleaseKeys(); err == nil {
		t.Error("a signed image without its genesis founded a cluster")
	}
	genesis(key)
	if chain, keys, _, err := c.bootstrapReleaseKeys(); err != nil || len(keys) != 1 || !bytes.Equal(keys[0], pub) || len(chain) != 1 {
		t.Errorf("the image's key: %x, %d statements, %v", keys, len(chain), err)
	}
	genesis(other)
	if _, _, _, err := c.bootstrapReleaseKeys(); err == nil {
		t.Error("a genesis of another key than the image's founded a cluster")
	}
	genesis(key)
	for _, bad := range []string{"not hex\n", hex.EncodeToString(pub[:31]) + "\n"} {
		os.WriteFile(keyFile, []byte(bad), 0o644)
		if _, _, _, err := c.bootstrapReleaseKeys(); err == nil {
			t.Errorf("image key %q accepted", bad)
		}
	}
}
