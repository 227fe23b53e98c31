package pki

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

func TestFingerprint(t *testing.T) {
	ca, err := NewCA("cluster", 0)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(ca.Certificate.Raw)
	fp := Fingerprint(ca.Certificate)
	// openssl's form: uppercase pairs and colons.
	if want := strings.ToUpper(hex.EncodeToString(sum[:])); strings.ReplaceAll(fp, ":", "") != want || len(fp) != 32*3-1 || strings.Count(fp, ":") != 31 {
		t.Fatalf("Fingerprint %q, want %s with colons", fp, want)
	}
	for _, in := range []string{fp, strings.ToLower(fp), hex.EncodeToString(sum[:]), "sha256 Fingerprint=" + fp, "SHA256 Fingerprint=" + fp + "\n"} {
		got, err := ParseFingerprint(in)
		if err != nil || got != sum {
			t.Errorf("ParseFingerprint(%q) = %x, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "AB:CD", fp[:len(fp)-3], fp + ":00", "A:BC" + fp[4:], "G" + fp[1:], "md5 Fingerprint=" + fp} {
		if _, err := ParseFingerprint(in); !errors.Is(err, ErrBadFingerprint) {
			t.Errorf("ParseFingerprint(%q): %v, want ErrBadFingerprint", in, err)
		}
	}
}
