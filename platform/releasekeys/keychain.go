// Package releasekeys is the chain of trust of a cluster's release keys,
// which sign the images its nodes install (platform/update.CheckRelease).
// The release keys are a chain of trust of their own, as TUF rotates its
// root: each version of the key set is a statement signed by a key of
// the version before and by every key it adds; allowing a downgrade is a
// statement signed by a current key. The curator stores and forwards
// the statements; it holds no release key, so neither it nor the
// owner's certificate can make one.
//
//	v1  {keys: [K1]}                       signed by K1        (genesis: by every key it names)
//	v2  {keys: [K1, K2], previous: h(v1)}  signed by K1 and K2 (a key of v1; every new key)
//	v3  {keys: [K2], previous: h(v2)}      signed by K2        (a key of v2)
//	downgrade {release: 41, expires: t}    signed by K2        (a key of the newest set)
//
// A node trusts a chain from where it stands (Trust, kept on its data
// volume): the newest version it verified before, else the first
// version that names its own image's release key (which that key
// signed), else, for an unsigned image, the genesis on first use. It
// refuses a chain that ends before its trust (a replay), forks from it,
// or breaks a link. Guarded by TestKeyChain and
// platform/update's TestCheckRelease.
package releasekeys

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrRefused is what every refusal of a chain or a statement is
// (errors.Is).
var ErrRefused = errors.New("release keys: refused")

// statementContext prefixes every statement before it is signed, so that
// no statement signature verifies as an image's (which signs the
// manifest's bytes alone) nor the other way round.
const statementContext = "plinth release statement v1\x00"

// Statement kinds.
const (
	KindKeySet    = "plinth.release-keys/v1"
	KindDowngrade = "plinth.downgrade/v1"
)

// MaxDowngradeValidity bounds how long a downgrade statement may be
// valid: it is an emergency's decision, not a standing permission.
const MaxDowngradeValidity = 7 * 24 * time.Hour

// Signed is a statement (JSON, the exact bytes signed) and its
// signatures.
type Signed struct {
	Body       []byte      `json:"body"`
	Signatures []Signature `json:"signatures"`
}

// Signature is one release key's ed25519 signature over
// statementContext and the body.
type Signature struct {
	Key []byte `json:"key"`
	Sig []byte `json:"sig"`
}

// Genesis is the first key set of a cluster founded from an image signed
// by key: {version 1, keys [key]}, signed by it. The builder puts it into
// the image (layout.ReleaseGenesisPath) as JSON.
func Genesis(key ed25519.PrivateKey) (Signed, error) {
	b, err := NextKeySet(nil, [][]byte{key.Public().(ed25519.PublicKey)})
	if err != nil {
		return Signed{}, err
	}
	return Sign(b, key), nil
}

// Sign signs body with each of keys.
func Sign(body []byte, keys ...ed25519.PrivateKey) Signed {
	s := Signed{Body: body}
	for _, k := range keys {
		s.Signatures = append(s.Signatures, Signature{Key: k.Public().(ed25519.PublicKey), Sig: ed25519.Sign(k, signedBytes(body))})
	}
	return s
}

func signedBytes(body []byte) []byte { return append([]byte(statementContext), body...) }

// SignedBy reports whether key (a valid ed25519 public key) signed s.
func (s Signed) SignedBy(key []byte) bool {
	if len(key) != ed25519.PublicKeySize {
		return false
	}
	for _, sig := range s.Signatures {
		if bytes.Equal(sig.Key, key) && ed25519.Verify(ed25519.PublicKey(key), signedBytes(s.Body), sig.Sig) {
			return true
		}
	}
	return false
}

// signedByAny reports whether one of keys signed s.
func (s Signed) signedByAny(keys [][]byte) bool {
	return slices.ContainsFunc(keys, s.SignedBy)
}

// Digest is the sha256 of the statement's body, hex: what the next key
// set names as previous.
func (s Signed) Digest() string {
	d := sha256.Sum256(s.Body)
	return hex.EncodeToString(d[:])
}

// KeySet is a version of the release keys.
type KeySet struct {
	Kind    string `json:"kind"`
	Version uint64 `json:"version"`
	// Keys are the ed25519 public keys, hex.
	Keys []string `json:"keys"`
	// Previous is the Digest of version-1 ("" for the genesis).
	Previous string `json:"previous,omitempty"`
}

// Downgrade allows nodes to install the image of one older release.
type Downgrade struct {
	Kind    string `json:"kind"`
	Release uint64 `json:"release"`
	// Expires is when the statement stops being accepted, Unix seconds.
	Expires int64 `json:"expires"`
}

// NextKeySet is the body of the key set after prev (nil: the genesis)
// holding keys.
func NextKeySet(prev *Signed, keys [][]byte) ([]byte, error) {
	ks := KeySet{Kind: KindKeySet, Version: 1}
	if prev != nil {
		p, _, err := parseKeySet(prev.Body)
		if err != nil {
			return nil, err
		}
		ks.Version, ks.Previous = p.Version+1, prev.Digest()
	}
	for _, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("release key of %d bytes, want an ed25519 public key (%d)", len(k), ed25519.PublicKeySize)
		}
		if h := hex.EncodeToString(k); !slices.Contains(ks.Keys, h) {
			ks.Keys = append(ks.Keys, h)
		}
	}
	if len(ks.Keys) == 0 {
		return nil, errors.New("a release key set needs at least one key: with none, no node could be updated again")
	}
	return json.Marshal(ks)
}

// NewDowngrade is the body of a statement allowing release until now+valid.
func NewDowngrade(release uint64, now time.Time, valid time.Duration) ([]byte, error) {
	if valid <= 0 || valid > MaxDowngradeValidity {
		return nil, fmt.Errorf("a downgrade statement is valid for up to %v, not %v", MaxDowngradeValidity, valid)
	}
	return json.Marshal(Downgrade{Kind: KindDowngrade, Release: release, Expires: now.Add(valid).Unix()})
}

// parseKeySet reads a key set statement's body.
func parseKeySet(body []byte) (KeySet, [][]byte, error) {
	var ks KeySet
	if err := json.Unmarshal(body, &ks); err != nil {
		return ks, nil, fmt.Errorf("not a release key set: %v", err)
	}
	if ks.Kind != KindKeySet || ks.Version == 0 || len(ks.Keys) == 0 {
		return ks, nil, fmt.Errorf("not a release key set (kind %q, version %d, %d keys)", ks.Kind, ks.Version, len(ks.Keys))
	}
	keys, err := decodeKeys(ks.Keys)
	return ks, keys, err
}

func decodeKeys(hexes []string) ([][]byte, error) {
	var keys [][]byte
	for _, h := range hexes {
		k, err := hex.DecodeString(h)
		if err != nil || len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("release key %q is not an ed25519 public key in hex", h)
		}
		keys = append(keys, k)
	}
	return keys, nil
}
