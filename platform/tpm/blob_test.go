package tpm

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/google/go-tpm/tpm2"
)

// syntheticBlob builds a well-formed blob without a TPM: a correct public
// area for the policy, and placeholder private/ciphertext bytes.
func syntheticBlob(t testing.TB) []byte {
	t.Helper()
	v7 := sha256.Sum256([]byte("pcr7"))
	v15 := sha256.Sum256([]byte("pcr15"))
	pcrs := []sealedPCR{{7, v7[:]}, {15, v15[:]}}
	public := tpm2.Marshal(sealedTemplate(policyPCR(pcrs)))
	name := append([]byte{0, 0x0b}, make([]byte, 32)...)
	header, err := marshalHeader(pcrs, name, public, bytes.Repeat([]byte{0xaa}, 100))
	if err != nil {
		t.Fatal(err)
	}
	return append(append(header, make([]byte, gcmNonceSize)...), make([]byte, gcmTagSize+5)...)
}

func TestParseBlob(t *testing.T) {
	data := syntheticBlob(t)
	b, err := parseBlob(data)
	if err != nil {
		t.Fatalf("parseBlob: %v", err)
	}
	if got := b.pcrIndexes(); len(got) != 2 || got[0] != 7 || got[1] != 15 {
		t.Errorf("PCRs = %v", got)
	}
	if len(b.ciphertext) != gcmTagSize+5 || len(b.nonce) != gcmNonceSize {
		t.Errorf("nonce %d, ciphertext %d bytes", len(b.nonce), len(b.ciphertext))
	}

	// A header whose PCR values disagree with the object's policy.
	bad := bytes.Clone(data)
	bad[len(blobMagic)+2+2+1+1] ^= 1 // first byte of PCR 7's value
	if _, err := parseBlob(bad); !errors.Is(err, ErrCorruptBlob) {
		t.Errorf("tampered PCR value: %v, want ErrCorruptBlob", err)
	}
	// Unknown version.
	bad = bytes.Clone(data)
	bad[len(blobMagic)+1] = 2
	if _, err := parseBlob(bad); !errors.Is(err, ErrCorruptBlob) {
		t.Errorf("version 2: %v, want ErrCorruptBlob", err)
	}
	for n := range len(data) - gcmTagSize {
		if _, err := parseBlob(data[:n]); !errors.Is(err, ErrCorruptBlob) {
			t.Fatalf("truncated to %d: %v, want ErrCorruptBlob", n, err)
		}
	}
}

func FuzzParseBlob(f *testing.F) {
	f.Add(syntheticBlob(f))
	f.Add([]byte(blobMagic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := parseBlob(data)
		if err != nil {
			if !errors.Is(err, ErrCorruptBlob) {
				t.Fatalf("error does not wrap ErrCorruptBlob: %v", err)
			}
			return
		}
		// Anything accepted must re-encode to the same header.
		header, err := marshalHeader(b.pcrs, b.srkName, b.public, b.private)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(header, b.header) {
			t.Fatalf("header does not round-trip")
		}
	})
}
