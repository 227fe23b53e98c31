package enrolment

import (
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"plinth.dev/plinth/platform/layout"
)

// bootstrapReleaseKeys are the release keys a new cluster starts with:
// the initial policy's if it names any, else the key that signed this
// node's own image (layout.ReleaseKeyPath), else none (an unsigned
// image: the owner adds one with plinthctl policy -add-release-key
// before any node can be updated). Why the image's key: whoever built
// and flashed the image that founds the cluster decides what it runs
// anyway, and the next image they sign with the same key then updates it
// without a step in between. source says which it was, for the log.
func (c *Config) bootstrapReleaseKeys(fromPolicy [][]byte) (keys [][]byte, source string, err error) {
	if len(fromPolicy) > 0 {
		return fromPolicy, "initial policy", nil
	}
	path := c.releaseKeyFile
	if path == "" {
		path = layout.ReleaseKeyPath
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "none (unsigned image)", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("the image's release key: %w", err)
	}
	k, err := parseReleaseKeyFile(b)
	if err != nil {
		// The system image is verity-checked: a malformed key is the
		// builder's fault, and a cluster founded without it would refuse
		// every update silently.
		return nil, "", fmt.Errorf("the image's release key %s: %w", path, err)
	}
	return [][]byte{k}, "this node's image (" + path + ")", nil
}

// parseReleaseKeyFile reads layout.ReleaseKeyPath's form: an ed25519
// public key in hex and a newline.
func parseReleaseKeyFile(b []byte) (ed25519.PublicKey, error) {
	k, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("not hex: %w", err)
	}
	if len(k) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%d bytes, want an ed25519 public key (%d)", len(k), ed25519.PublicKeySize)
	}
	return k, nil
}
