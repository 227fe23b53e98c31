package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
)

func TestCheckEd25519PublicKey(t *testing.T) {
	for _, tc := range []struct {
		name, hex string
		want      error
	}{
		// The eight points of small order, canonically encoded.
		{"identity", "0100000000000000000000000000000000000000000000000000000000000000", ErrKeySmallOrder},
		{"order 2 (y = -1)", "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", ErrKeySmallOrder},
		{"order 4 (y = 0, x even)", "0000000000000000000000000000000000000000000000000000000000000000", ErrKeySmallOrder},
		{"order 4 (y = 0, x odd)", "0000000000000000000000000000000000000000000000000000000000000080", ErrKeySmallOrder},
		{"order 8", "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05", ErrKeySmallOrder},
		{"order 8, negated x", "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85", ErrKeySmallOrder},
		{"order 8, other y", "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a", ErrKeySmallOrder},
		{"order 8, other y, negated x", "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa", ErrKeySmallOrder},
		// Non-canonical encodings: y >= p, or x = 0 with the sign bit set.
		{"identity as y = p+1", "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", ErrKeyNotCanonical},
		{"identity with negative zero x", "0100000000000000000000000000000000000000000000000000000000000080", ErrKeyNotCanonical},
		{"order 4 as y = p", "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", ErrKeyNotCanonical},
		{"order 2 with negative zero x", "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", ErrKeyNotCanonical},
		{"large order, y = p+3", "f0ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", ErrKeyNotCanonical},
		// y = 2 has no x on the curve.
		{"not on the curve", "0200000000000000000000000000000000000000000000000000000000000000", ErrKeyNotOnCurve},
		{"short", "0100", ErrKeyLength},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := hex.DecodeString(tc.hex)
			if err != nil {
				t.Fatal(err)
			}
			if err := CheckEd25519PublicKey(b); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
	if err := CheckEd25519PublicKey(nil); !errors.Is(err, ErrKeyLength) {
		t.Errorf("nil key: %v", err)
	}
	// y = 3 is a point of large order: accepted in its canonical form
	// (and refused above as y = p+3).
	three := make([]byte, 32)
	three[0] = 3
	if err := CheckEd25519PublicKey(three); err != nil {
		t.Errorf("y = 3: %v", err)
	}
	for range 100 {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckEd25519PublicKey(pub); err != nil {
			t.Fatalf("generated key %x refused: %v", pub, err)
		}
	}
}

// The identity key is why small-order keys are refused: a signature made
// without any private key verifies for every message.
func TestIdentityKeyForgery(t *testing.T) {
	pub, _ := hex.DecodeString("0100000000000000000000000000000000000000000000000000000000000000")
	// R = identity, S = 0: [0]B = identity + [k]identity.
	sig := append(append([]byte{}, pub...), make([]byte, 32)...)
	if CheckEd25519PublicKey(pub) == nil {
		t.Error("the identity key passed")
	}
	for _, msg := range []string{"approve node", "anything at all"} {
		if !ed25519.Verify(pub, []byte(msg), sig) {
			t.Logf("this Go's crypto/ed25519 refuses the identity key itself (%q): the check above still must", msg)
		}
	}
}
