package curator

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"

	"plinth.dev/plinth/platform/pki"
)

// Bootstrap refuses an owner key anyone could sign for, before it touches
// etcd (hence the nil client), whatever the parameters' validation let
// through.
func TestBootstrapRefusesWeakOwnerKey(t *testing.T) {
	key := func() ed25519.PublicKey { p, _, _ := ed25519.GenerateKey(rand.Reader); return p }
	for _, tc := range []struct {
		name, hex string
		want      error
	}{
		{"identity", "0100000000000000000000000000000000000000000000000000000000000000", pki.ErrKeySmallOrder},
		{"order 2", "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", pki.ErrKeySmallOrder},
		{"order 4", "0000000000000000000000000000000000000000000000000000000000000080", pki.ErrKeySmallOrder},
		{"order 8", "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a", pki.ErrKeySmallOrder},
		{"non-canonical", "0100000000000000000000000000000000000000000000000000000000000080", pki.ErrKeyNotCanonical},
	} {
		t.Run(tc.name, func(t *testing.T) {
			owner, _ := hex.DecodeString(tc.hex)
			_, _, err := Bootstrap(context.Background(), nil, BootstrapRequest{
				NodePublicKey: key(), JoinPublicKey: key(), OwnerPublicKey: owner,
			})
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}
