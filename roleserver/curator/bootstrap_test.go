package curator

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
)

// TestBootstrapIdempotent: Bootstrap by the bootstrapping node over its
// own cluster returns the same CA and a certificate for it again; by any
// other node it is refused.
func TestBootstrapIdempotent(t *testing.T) {
	f := newSingle(t)
	a := f.a
	st := a.running(time.Second)
	kv, err := st.CuratorClient()
	mustOK(t, "client", err)
	defer kv.Close()
	_, join, _ := ed25519.GenerateKey(rand.Reader)
	req := BootstrapRequest{
		NodePublicKey: a.pub(), JoinPublicKey: join.Public().(ed25519.PublicKey),
		OwnerPublicKey: f.owner.Public().(ed25519.PublicKey), TPMUsage: clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED,
	}
	ca, cert, err := Bootstrap(f.ctx, kv, req)
	mustOK(t, "second Bootstrap", err)
	if !ca.Equal(f.ca) {
		t.Error("second Bootstrap made a new CA")
	}
	if err := pki.Verify(ca, nil, cert, pki.UsageServerAndClient); err != nil || cert.Subject.CommonName != a.id {
		t.Errorf("second Bootstrap certificate: %v, CN %q", err, cert.Subject.CommonName)
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	req.NodePublicKey = other.Public().(ed25519.PublicKey)
	if _, _, err := Bootstrap(f.ctx, kv, req); err == nil {
		t.Error("Bootstrap by another node over an existing cluster succeeded")
	}
}

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
