package pki

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
)

// CertificatePEM encodes c as a "CERTIFICATE" PEM block.
func CertificatePEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// ParseCertificatePEM parses the first "CERTIFICATE" PEM block in b.
func ParseCertificatePEM(b []byte) (*x509.Certificate, error) {
	block, err := decodePEM(b, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: parsing certificate: %w", err)
	}
	return c, nil
}

// PrivateKeyPEM encodes k as a PKCS#8 "PRIVATE KEY" PEM block, the format
// etcd and most tools read.
func PrivateKeyPEM(k ed25519.PrivateKey) ([]byte, error) {
	if len(k) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("pki: private key has %d bytes, want %d", len(k), ed25519.PrivateKeySize)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("pki: marshalling private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParsePrivateKeyPEM parses a PKCS#8 "PRIVATE KEY" PEM block holding an
// ed25519 key.
func ParsePrivateKeyPEM(b []byte) (ed25519.PrivateKey, error) {
	block, err := decodePEM(b, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: parsing private key: %w", err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("pki: private key is %T, want ed25519", k)
	}
	return ek, nil
}

// decodePEM returns the first block of type typ, skipping others (e.g. a
// key file that also carries parameters or a bundle with comments).
func decodePEM(b []byte, typ string) (*pem.Block, error) {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return nil, errors.New("pki: no " + typ + " PEM block found")
		}
		if block.Type == typ {
			return block, nil
		}
	}
}
