package releasekeys

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
)

// TestKeyChain attacks the chain of release keys as the holder of the
// owner's certificate or a compromised curator would (they can serve
// any chain, but sign with no release key of the cluster): every chain
// they can make is refused by a node, from wherever it stands; the
// owner's statements, signed by the current keys, move it forward; an
// old chain replayed is refused.
func TestKeyChain(t *testing.T) {
	k1pub, k1 := releaseKey(t)
	k2pub, k2 := releaseKey(t)
	_, kx := releaseKey(t) // the attacker's own
	kxpub := kx.Public().(ed25519.PublicKey)
	next := func(prev *Signed, keys []ed25519.PublicKey, signers ...ed25519.PrivateKey) Signed {
		t.Helper()
		var raw [][]byte
		for _, k := range keys {
			raw = append(raw, k)
		}
		b, err := NextKeySet(prev, raw)
		if err != nil {
			t.Fatal(err)
		}
		return Sign(b, signers...)
	}
	g := next(nil, []ed25519.PublicKey{k1pub}, k1)
	v2 := next(&g, []ed25519.PublicKey{k1pub, k2pub}, k1, k2)
	v3 := next(&v2, []ed25519.PublicKey{k2pub}, k2)
	chain := []Signed{g, v2, v3}
	follow := func(t0 Trust, c []Signed) ([][]byte, Trust, error) { t.Helper(); return t0.Follow(c) }
	want := func(what string, err error, r ChainRefusal) {
		t.Helper()
		var ce *ChainError
		if !errors.As(err, &ce) || ce.Refusal != r || !errors.Is(err, ErrRefused) {
			t.Errorf("%s: %v; want refusal %d", what, err, r)
		}
	}

	// From each place a node may stand, the owner's chain leads to K2.
	for what, t0 := range map[string]Trust{"an unsigned image (first use)": {}, "an image signed by K1": AnchorTrust(k1pub), "an image signed by K2": AnchorTrust(k2pub)} {
		keys, tr, err := follow(t0, chain)
		if err != nil || len(keys) != 1 || !slices.Equal(keys[0], []byte(k2pub)) || tr.Version != 3 || tr.Digest != v3.Digest() {
			t.Errorf("%s: %x, %+v, %v; want K2 at version 3", what, keys, tr, err)
		}
	}
	_, at3, _ := follow(Trust{}, chain)
	_, at2, _ := follow(Trust{}, chain[:2])

	// With the owner's certificate alone: a key added, one removed.
	added := next(&v3, []ed25519.PublicKey{k2pub, kxpub}, kx)
	_, _, err := follow(at3, append(slices.Clone(chain), added))
	want("a key added, signed by the new key alone", err, ChainUnsigned)
	removed := next(&v3, []ed25519.PublicKey{kxpub}, kx)
	_, _, err = follow(at3, append(slices.Clone(chain), removed))
	want("K2 replaced by the attacker's key", err, ChainUnsigned)
	// The same with K2's signature: the owner's rotation.
	rotated := next(&v3, []ed25519.PublicKey{k2pub, kxpub}, k2, kx)
	if keys, tr, err := follow(at3, append(slices.Clone(chain), rotated)); err != nil || len(keys) != 2 || tr.Version != 4 {
		t.Errorf("a key added with K2's signature and its own: %x, %+v, %v", keys, tr, err)
	}
	// A new key must sign the set that adds it (it could not sign
	// images otherwise: the owner does not hold it).
	unheld := next(&v3, []ed25519.PublicKey{k2pub, kxpub}, k2)
	_, _, err = follow(at3, append(slices.Clone(chain), unheld))
	want("a key added that did not sign", err, ChainUnsigned)

	// A whole chain of the attacker's own.
	fg := next(nil, []ed25519.PublicKey{kxpub}, kx)
	fake := []Signed{fg, next(&fg, []ed25519.PublicKey{kxpub}, kx), next(&fg, []ed25519.PublicKey{kxpub}, kx)}
	fake[2] = next(&fake[1], []ed25519.PublicKey{kxpub}, kx)
	_, _, err = follow(at3, fake)
	want("a node at version 3 given another chain of three", err, ChainForked)
	_, _, err = follow(AnchorTrust(k2pub), fake)
	want("a node signed by K2 given a chain without K2", err, ChainForeign)
	claimed := next(nil, []ed25519.PublicKey{kxpub, k2pub}, kx)
	_, _, err = follow(AnchorTrust(k2pub), []Signed{claimed})
	want("a genesis naming K2 that K2 did not sign, on a node signed by K2", err, ChainForeign)
	_, _, err = follow(Trust{}, []Signed{claimed})
	want("a genesis one of whose keys did not sign it, on first use", err, ChainUnsigned)

	// Replays and broken links.
	_, _, err = follow(at3, chain[:2])
	want("the chain before K1's removal, replayed", err, ChainStale)
	if _, tr, err := follow(at2, chain); err != nil || tr.Version != at3.Version || tr.Digest != at3.Digest {
		t.Errorf("a node at version 2 given version 3: %+v, %v", tr, err)
	}
	relinked := next(&g, []ed25519.PublicKey{k1pub}, k1)
	_, _, err = follow(at2, []Signed{g, v2, Sign(relinked.Body, k1)})
	want("version 3 naming version 1 as previous", err, ChainMalformed)
	broken := Sign([]byte(`{"kind":"plinth.release-keys/v1","version":2,"keys":["`+hex.EncodeToString(k1pub)+`"],"previous":"00"}`), k1)
	_, _, err = follow(Trust{}, []Signed{g, broken})
	want("version 2 naming no version 1", err, ChainBrokenLink)
	_, _, err = follow(Trust{}, []Signed{Sign([]byte("{"), k1)})
	want("a body that is no statement", err, ChainMalformed)
	_, _, err = follow(at3, nil)
	want("no chain", err, ChainEmpty)

	// The curator's check before it stores a statement.
	if _, err := CheckNext(chain, rotated); err != nil {
		t.Errorf("CheckNext of the owner's rotation: %v", err)
	}
	if _, err := CheckNext(chain, added); err == nil {
		t.Error("CheckNext accepted a key set no current key signed")
	}
	if _, err := CheckNext(nil, g); err != nil {
		t.Errorf("CheckNext of a first key: %v", err)
	}
	if _, err := NextKeySet(&v3, nil); err == nil {
		t.Error("a key set without keys")
	}
}

func releaseKey(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, key
}
