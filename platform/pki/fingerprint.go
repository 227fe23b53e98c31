package pki

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Certificate fingerprints let an owner check, over a channel they trust
// (the bootstrap node's console, say), that the cluster CA a tool was shown
// is the cluster's: plinthctl cluster takeownership prints the CA's
// fingerprint and can be told which one to expect.

// ErrBadFingerprint is returned by ParseFingerprint for text that is not a
// SHA-256 fingerprint.
var ErrBadFingerprint = errors.New("pki: not a SHA-256 fingerprint (want 32 hex bytes, colons optional)")

// Fingerprint is the SHA-256 of cert's DER encoding, written as
// `openssl x509 -noout -fingerprint -sha256` writes it: 32 uppercase hex
// bytes separated by colons.
func Fingerprint(cert *x509.Certificate) string {
	return FormatFingerprint(sha256.Sum256(cert.Raw))
}

// FormatFingerprint writes a SHA-256 digest as Fingerprint does.
func FormatFingerprint(sum [sha256.Size]byte) string {
	var b strings.Builder
	for i, c := range sum {
		if i > 0 {
			b.WriteByte(':')
		}
		fmt.Fprintf(&b, "%02X", c)
	}
	return b.String()
}

// ParseFingerprint reads a SHA-256 fingerprint as Fingerprint and openssl
// write it, in either case, with or without the colons, and with or
// without openssl's "sha256 Fingerprint=" in front.
func ParseFingerprint(s string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '='); i >= 0 && strings.EqualFold(strings.TrimSpace(s[:i]), "sha256 fingerprint") {
		s = s[i+1:]
	}
	if strings.Contains(s, ":") {
		parts := strings.Split(s, ":")
		for _, p := range parts {
			if len(p) != 2 {
				return sum, fmt.Errorf("%w: %q", ErrBadFingerprint, s)
			}
		}
		s = strings.Join(parts, "")
	}
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != sha256.Size {
		return sum, fmt.Errorf("%w: %q", ErrBadFingerprint, s)
	}
	copy(sum[:], b)
	return sum, nil
}
