package pki

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// CRL wraps an x509 revocation list signed by a CA. List is the parsed form,
// Raw the signed DER that is stored and distributed.
//
// CRLs here are pushed by the cluster, not fetched, and are replaced as a
// whole on every revocation; NextUpdate is therefore set to the CA's expiry
// and not enforced by Verify.
type CRL struct {
	List *x509.RevocationList
	Raw  []byte // DER
}

// NewCRL returns an empty CRL with number 1.
func (ca *CA) NewCRL() (*CRL, error) {
	return ca.signCRL(big.NewInt(1), nil)
}

// Revoke returns a new CRL with number crl's+1 listing crl's entries plus
// serials; serials already listed are ignored (their original revocation
// time is kept). crl is not modified. A nil crl counts as an empty one with
// number 0. crl must have been signed by ca.
func (ca *CA) Revoke(crl *CRL, serials ...*big.Int) (*CRL, error) {
	number := big.NewInt(0)
	var entries []x509.RevocationListEntry
	if crl != nil {
		if err := crl.List.CheckSignatureFrom(ca.Certificate); err != nil {
			return nil, fmt.Errorf("pki: CRL not signed by this CA: %w", err)
		}
		if crl.List.Number != nil {
			number.Set(crl.List.Number)
		}
		for _, e := range crl.List.RevokedCertificateEntries {
			entries = append(entries, x509.RevocationListEntry{
				SerialNumber:   e.SerialNumber,
				RevocationTime: e.RevocationTime,
			})
		}
	}
	now := time.Now()
	for _, s := range serials {
		if s == nil {
			return nil, errors.New("pki: nil serial")
		}
		if containsSerial(entries, s) {
			continue
		}
		entries = append(entries, x509.RevocationListEntry{
			SerialNumber:   new(big.Int).Set(s),
			RevocationTime: now,
		})
	}
	return ca.signCRL(number.Add(number, big.NewInt(1)), entries)
}

func containsSerial(entries []x509.RevocationListEntry, s *big.Int) bool {
	for _, e := range entries {
		if e.SerialNumber.Cmp(s) == 0 {
			return true
		}
	}
	return false
}

func (ca *CA) signCRL(number *big.Int, entries []x509.RevocationListEntry) (*CRL, error) {
	now := time.Now()
	next := ca.Certificate.NotAfter
	if !next.After(now) {
		return nil, errors.New("pki: CA has expired")
	}
	der, err := x509.CreateRevocationList(rand.Reader, &x509.RevocationList{
		Number:                    number,
		ThisUpdate:                now,
		NextUpdate:                next,
		RevokedCertificateEntries: entries,
	}, ca.Certificate, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: signing CRL: %w", err)
	}
	list, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parsing CRL: %w", err)
	}
	return &CRL{List: list, Raw: der}, nil
}

// ParseCRL parses a DER CRL and checks its signature against ca, so that a
// returned CRL can be trusted.
func ParseCRL(der []byte, ca *x509.Certificate) (*CRL, error) {
	list, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parsing CRL: %w", err)
	}
	if err := list.CheckSignatureFrom(ca); err != nil {
		return nil, fmt.Errorf("pki: CRL not signed by CA: %w", err)
	}
	return &CRL{List: list, Raw: append([]byte(nil), der...)}, nil
}

// IsRevoked reports whether serial is listed. A nil CRL revokes nothing.
func (c *CRL) IsRevoked(serial *big.Int) bool {
	if c == nil || c.List == nil || serial == nil {
		return false
	}
	for _, e := range c.List.RevokedCertificateEntries {
		if e.SerialNumber.Cmp(serial) == 0 {
			return true
		}
	}
	return false
}

// PEM returns the CRL as an "X509 CRL" PEM block (what etcd's
// --peer-crl-file wants).
func (c *CRL) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: c.Raw})
}
