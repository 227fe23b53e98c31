package image

import (
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"plinth.dev/plinth/platform/releasekeys"
)

// Signed images (platform/update.CheckRelease is the node's side):
//
//	manifest.json  "release": Config.Release, "release_key": hex of the signer's public key
//	manifest.sig   SignatureFile: ed25519 over manifest.json's exact bytes
//	system image   /etc/plinth/release.pub (layout.ReleaseKeyPath), /etc/os-release PLINTH_RELEASE,
//	               /etc/plinth/release-genesis.json (layout.ReleaseGenesisPath): the key set
//	               {version 1, keys: [the key]} a cluster this image founds starts with
//
// The signature covers the manifest, and the manifest the sha256 of every
// artefact and the system image's root hash, so it signs the whole
// image. It is detached so that manifest.json stays what it was (tools
// that read it need not know about signatures) and so that a signature
// can be checked over the bytes as they were sent, before they are
// parsed. The key and the release are inputs of the system image (they
// are in it): known before it is built, so the root hash, the UKIs and
// the predicted PCRs cover them like anything else the image carries.

// SignatureFile is the detached signature of ManifestFile: the 64 raw
// bytes of an ed25519 signature over its exact bytes by the release key.
// ed25519 signatures are deterministic, so two builds of the same inputs
// with the same key give the same bytes.
const SignatureFile = "manifest.sig"

// WriteManifest writes m into dir as ManifestFile and, with key, signs
// it: m.ReleaseKey is set to key's public key and SignatureFile holds the
// signature. Without key m is written unsigned and an old SignatureFile
// removed (it would sign other bytes).
func WriteManifest(dir string, m *Manifest, key ed25519.PrivateKey) error {
	m.ReleaseKey = ""
	if key != nil {
		m.ReleaseKey = hex.EncodeToString(key.Public().(ed25519.PublicKey))
	}
	js, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	js = append(js, '\n')
	sig := filepath.Join(dir, SignatureFile)
	if key == nil {
		if err := os.Remove(sig); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return writeFileAtomic(filepath.Join(dir, ManifestFile), js)
	}
	// A crash between the two leaves a signature of other bytes next to
	// the manifest, which no node accepts.
	if err := writeFileAtomic(sig, ed25519.Sign(key, js)); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, ManifestFile), js)
}

// releaseKeyFile is the system image's layout.ReleaseKeyPath: the public
// key in hex and a newline (readable with cat, the manifest's form).
func releaseKeyFile(pub ed25519.PublicKey) []byte {
	return []byte(hex.EncodeToString(pub) + "\n")
}

// releaseGenesisFile is the system image's layout.ReleaseGenesisPath:
// releasekeys.Genesis of key, as JSON.
func releaseGenesisFile(key ed25519.PrivateKey) ([]byte, error) {
	g, err := releasekeys.Genesis(key)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(g)
	return append(b, '\n'), err
}
