package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	clusterpki "plinth.dev/plinth/platform/pki"
)

// authority is a CA loaded from etcd.
type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// newKey generates the ECDSA P-256 key of a CA, a component or the
// service-account signer.
func newKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("kubernetes pki: generating a key: %w", err)
	}
	return k, nil
}

// generateAuthority makes a self-signed CA and returns its certificate
// and PKCS#8 key as PEM, the values stored in etcd.
func generateAuthority(commonName string) ([][]byte, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	tmpl, err := clusterpki.CATemplate(commonName, CAValidity)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("kubernetes pki: creating %s: %w", commonName, err)
	}
	keyPEM, err := privateKeyPEM(key)
	if err != nil {
		return nil, err
	}
	return [][]byte{pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM}, nil
}

// loadAuthority parses a CA as generateAuthority stores it (or as older
// Plinth versions stored the Kubernetes CA, with an ed25519 key), and
// refuses a certificate that is not a CA or a key that is not its own.
func loadAuthority(certPEM, keyPEM []byte) (*authority, error) {
	cert, err := clusterpki.ParseCertificatePEM(certPEM)
	if err != nil {
		return nil, err
	}
	key, err := parsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, errors.New("certificate is not a CA")
	}
	if pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(key.Public()) {
		return nil, errors.New("the key does not belong to the certificate")
	}
	return &authority{cert: cert, key: key}, nil
}

// issue signs tmpl (subject, names and extended key usages filled in by
// the caller) for pub, valid from now for validity but never beyond the
// CA.
func (a *authority) issue(pub crypto.PublicKey, tmpl *x509.Certificate, validity time.Duration) (*x509.Certificate, error) {
	if err := clusterpki.LeafWindow(tmpl, validity, a.cert.NotAfter); err != nil {
		return nil, err
	}
	tmpl.BasicConstraintsValid = true
	tmpl.IsCA = false
	// ECDSA and ed25519 keys only sign: no key encipherment.
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, pub, a.key)
	if err != nil {
		return nil, fmt.Errorf("kubernetes pki: issuing %q: %w", tmpl.Subject.CommonName, err)
	}
	return x509.ParseCertificate(der)
}

// privateKeyPEM is k as a PKCS#8 "PRIVATE KEY" block, which
// kube-apiserver, kube-controller-manager and client-go all read.
func privateKeyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("kubernetes pki: encoding a private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// publicKeyPEM is pub as a PKIX "PUBLIC KEY" block (--service-account-key-file).
func publicKeyPEM(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("kubernetes pki: encoding a public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// parsePrivateKeyPEM reads a PKCS#8 ECDSA or ed25519 key.
func parsePrivateKeyPEM(b []byte) (crypto.Signer, error) {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return nil, errors.New("no PRIVATE KEY PEM block")
		}
		if block.Type != "PRIVATE KEY" {
			continue
		}
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, err
		}
		switch k := k.(type) {
		case *ecdsa.PrivateKey:
			return k, nil
		case ed25519.PrivateKey:
			return k, nil
		}
		return nil, fmt.Errorf("private key is %T, want ECDSA or ed25519", k)
	}
}

// CheckPublicKey refuses public keys this package does not certify:
// anything but an ECDSA P-256 key (a valid curve point) or an ed25519 key
// of large order (see platform/pki.CheckEd25519PublicKey). Errors wrap
// ErrInvalidArgument.
func CheckPublicKey(pub crypto.PublicKey) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k == nil || k.Curve != elliptic.P256() {
			return fmt.Errorf("%w: ECDSA public key not on P-256", ErrInvalidArgument)
		}
		if _, err := k.ECDH(); err != nil {
			return fmt.Errorf("%w: ECDSA public key: %v", ErrInvalidArgument, err)
		}
		return nil
	case ed25519.PublicKey:
		if err := clusterpki.CheckEd25519PublicKey(k); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
		}
		return nil
	}
	return fmt.Errorf("%w: public key is %T, want ECDSA P-256 or ed25519", ErrInvalidArgument, pub)
}

// ParsePublicKey reads a DER SubjectPublicKeyInfo (PKIX) public key and
// checks it with CheckPublicKey: the form in which the owner's tool sends
// the key of its kubectl credentials.
func ParsePublicKey(der []byte) (crypto.PublicKey, error) {
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("%w: public key: %v", ErrInvalidArgument, err)
	}
	if err := CheckPublicKey(pub); err != nil {
		return nil, err
	}
	return pub, nil
}
