package storage

import (
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"

	"plinth.dev/plinth/platform/gpt"
)

// UnlockKeySize is the length of a node unlock key (NUK) and of a cluster
// unlock key (CUK): 256 bits each.
const UnlockKeySize = 32

// Volume key sizes per mode.
const (
	// CryptKeySize: AES-256-XTS takes two AES-256 keys (data and tweak).
	CryptKeySize = 64
	// AuthenticatedKeySize: the AES-256-XTS key followed by a 32-byte
	// HMAC-SHA256 key, in the order dm-crypt expects for the cipher
	// "capi:authenc(hmac(sha256),xts(aes))-random": encryption key first,
	// MAC key last.
	AuthenticatedKeySize = CryptKeySize + 32
)

// volumeKeyInfo prefixes the HKDF info string. The version lets a future
// derivation coexist with this one without any chance of equal keys.
const volumeKeyInfo = "plinth data volume v1 "

// DeriveVolumeKey derives the dm-crypt key of a data partition with
// HKDF-SHA256 (RFC 5869):
//
//	IKM  = NUK || CUK      (CUK empty when there is none)
//	salt = partition ID    (the 16 GUID bytes in GPT on-disk order)
//	info = "plinth data volume v1 " + mode.String()
//	L    = 64 bytes (ModeCrypt) or 96 bytes (ModeAuthenticated)
//
// Why:
//   - The NUK is sealed in the TPM; on worker nodes the CUK is held by the
//     cluster, so a stolen disk together with its TPM is still unreadable
//     without the cluster. A consensus member keeps its CUK sealed in its
//     own join state too (it must open its disk when no other member
//     answers); the bootstrap node, set up before any cluster exists,
//     passes a nil CUK. Both keys have a fixed length, so the
//     concatenation is unambiguous: no (NUK, CUK) pair can produce the IKM
//     of another. Whether a CUK is mixed in is fixed when the partition is
//     set up, and the header's KeyPolicy records it.
//   - The partition ID as salt gives every partition its own key even if a
//     NUK were ever reused.
//   - The mode in info means the two modes never share key material.
//   - ModeAuthenticated uses AES-256-XTS plus HMAC-SHA256 rather than
//     AES-256-GCM: dm-crypt's AEAD modes pick a random IV per sector write,
//     and GCM's 96-bit IV collides with non-negligible probability after
//     about 2^32 writes — a busy disk reaches that — and one collision
//     breaks GCM's authenticity. XTS+HMAC has no such limit, at the cost
//     of a larger tag (dm-integrity keeps it per sector).
func DeriveVolumeKey(nodeUnlockKey, clusterUnlockKey []byte, partitionID gpt.GUID, mode Mode) ([]byte, error) {
	if len(nodeUnlockKey) != UnlockKeySize {
		return nil, fmt.Errorf("storage: node unlock key of %d bytes, want %d", len(nodeUnlockKey), UnlockKeySize)
	}
	if len(clusterUnlockKey) != 0 && len(clusterUnlockKey) != UnlockKeySize {
		return nil, fmt.Errorf("storage: cluster unlock key of %d bytes, want %d or none", len(clusterUnlockKey), UnlockKeySize)
	}
	if partitionID.IsZero() {
		return nil, errors.New("storage: zero partition ID")
	}
	var size int
	switch mode {
	case ModeCrypt:
		size = CryptKeySize
	case ModeAuthenticated:
		size = AuthenticatedKeySize
	default:
		return nil, fmt.Errorf("storage: invalid mode %d", mode)
	}
	ikm := make([]byte, 0, 2*UnlockKeySize)
	ikm = append(ikm, nodeUnlockKey...)
	ikm = append(ikm, clusterUnlockKey...)
	defer clear(ikm)
	key, err := hkdf.Key(sha256.New, ikm, partitionID[:], volumeKeyInfo+mode.String(), size)
	if err != nil {
		return nil, fmt.Errorf("storage: derive volume key: %w", err)
	}
	return key, nil
}
