package releasekeys

import (
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// What a signed system image carries of its release key (the builder
// writes both; image/sign.go):
//
//	layout.ReleaseKeyPath      hex public key   ─► AnchorTrust: where a node
//	                                               stands before its first chain
//	layout.ReleaseGenesisPath  Genesis, JSON    ─► the chain a cluster founded
//	                                               by the image starts with

// ImageKey reads the release key an image carries at path (hex and a
// newline): nil without the file (an unsigned image). The system image
// is verity-checked, so a malformed key is the builder's fault and an
// error, not an unsigned image.
func ImageKey(path string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the image's release key: %w", err)
	}
	k, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("the image's release key %s: not hex: %w", path, err)
	}
	if len(k) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("the image's release key %s: %d bytes, want an ed25519 public key (%d)", path, len(k), ed25519.PublicKeySize)
	}
	return k, nil
}

// ImageGenesis reads the genesis an image signed by key carries at path
// and checks it as every node of the cluster will: one key set, version
// 1, naming key and signed by it.
func ImageGenesis(path string, key ed25519.PublicKey) (Signed, error) {
	var g Signed
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &g)
	}
	if err == nil {
		_, _, err = AnchorTrust(key).Follow([]Signed{g})
	}
	if err != nil {
		return Signed{}, fmt.Errorf("the image's release key genesis %s: %w", path, err)
	}
	return g, nil
}
