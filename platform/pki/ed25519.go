package pki

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"

	"filippo.io/edwards25519"
)

// Why a public key needs more than a length check: crypto/ed25519 checks
// [S]B = R + [k]A for whatever point A the 32 bytes decode to. If A has
// small order (the identity, or a point of order 2, 4 or 8), [k]A takes at
// most eight values, so signatures verify without any private key: for
// the identity, any S with R = [S]B is valid for every message. An owner
// key in the bootstrap parameters is the root of the cluster's trust, so a
// malformed or malicious document must not be able to plant such a key.
// Non-canonical encodings are refused as well: two byte strings for one
// point would make key comparisons (and node IDs, which hash the bytes)
// disagree about who is who.

// Errors of CheckEd25519PublicKey; each is wrapped with details.
var (
	// ErrKeyLength: not 32 bytes.
	ErrKeyLength = errors.New("pki: ed25519 public key has the wrong length")
	// ErrKeyNotOnCurve: the bytes do not decode to a curve point.
	ErrKeyNotOnCurve = errors.New("pki: ed25519 public key is not a point on the curve")
	// ErrKeyNotCanonical: a valid point, but not its canonical encoding
	// (y not reduced mod p, or a negative zero x).
	ErrKeyNotCanonical = errors.New("pki: ed25519 public key is not canonically encoded")
	// ErrKeySmallOrder: a point whose order divides 8 (the identity
	// included); anyone can forge signatures for it.
	ErrKeySmallOrder = errors.New("pki: ed25519 public key is a small-order point")
)

// CheckEd25519PublicKey refuses public keys that are not a canonical
// encoding of a curve point of large order. Keys made by
// ed25519.GenerateKey always pass.
func CheckEd25519PublicKey(pub ed25519.PublicKey) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: %d bytes, want %d", ErrKeyLength, len(pub), ed25519.PublicKeySize)
	}
	p, err := new(edwards25519.Point).SetBytes(pub)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrKeyNotOnCurve, err)
	}
	// SetBytes accepts non-canonical encodings; the canonical one is what
	// Bytes gives back.
	if !bytes.Equal(p.Bytes(), pub) {
		return ErrKeyNotCanonical
	}
	// [8]P is the identity exactly when P's order divides 8.
	if new(edwards25519.Point).MultByCofactor(p).Equal(edwards25519.NewIdentityPoint()) == 1 {
		return ErrKeySmallOrder
	}
	return nil
}
