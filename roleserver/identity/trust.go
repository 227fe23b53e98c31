package identity

import (
	"crypto/x509"
	"errors"
	"fmt"
	"sync"

	"plinth.dev/plinth/platform/pki"
)

// Trust is what a party of the cluster trusts: the cluster CA and the
// newest cluster CRL it has seen. One Trust is shared by all servers and
// clients of a node, so a CRL update takes effect in every handshake that
// follows, in both directions.
type Trust struct {
	CA *x509.Certificate

	mu  sync.RWMutex
	crl *pki.CRL
}

// NewTrust trusts ca, with no CRL yet.
func NewTrust(ca *x509.Certificate) *Trust { return &Trust{CA: ca} }

// ErrRevoked is the error for a certificate the cluster CRL lists.
var ErrRevoked = errors.New("identity: certificate is revoked by the cluster")

// ErrStaleCRL: a CRL offered to SetCRL is not newer than the one held.
var ErrStaleCRL = errors.New("identity: CRL is not newer than the one held")

// SetCRL installs the DER CRL if the CA signed it and its number is higher
// than the current one's. A CRL that is not newer is ErrStaleCRL and
// changes nothing, so an old CRL replayed by anyone can never un-revoke a
// certificate.
func (t *Trust) SetCRL(der []byte) (*pki.CRL, error) {
	crl, err := pki.ParseCRL(der, t.CA)
	if err != nil {
		return nil, err
	}
	if crl.List.Number == nil || crl.List.Number.Sign() <= 0 {
		return nil, errors.New("identity: CRL has no number")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.crl != nil && crl.List.Number.Cmp(t.crl.List.Number) <= 0 {
		return nil, fmt.Errorf("%w (offered %v, held %v)", ErrStaleCRL, crl.List.Number, t.crl.List.Number)
	}
	t.crl = crl
	return crl, nil
}

// CRL is the newest CRL held, nil if none (or t is nil).
func (t *Trust) CRL() *pki.CRL {
	if t == nil {
		return nil
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.crl
}

// CRLNumber is the number of the CRL held, 0 if none.
func (t *Trust) CRLNumber() uint64 {
	crl := t.CRL()
	if crl == nil || !crl.List.Number.IsUint64() {
		return 0
	}
	return crl.List.Number.Uint64()
}

// Verify checks that cert chains to the CA for usage, is valid now, and
// is not revoked (ErrRevoked).
func (t *Trust) Verify(cert *x509.Certificate, usage pki.Usage) error {
	if t == nil || t.CA == nil {
		return errors.New("identity: no cluster CA to verify against")
	}
	if err := pki.Verify(t.CA, nil, cert, usage); err != nil {
		return err
	}
	if t.CRL().IsRevoked(cert.SerialNumber) {
		return fmt.Errorf("%w: %q (serial %x)", ErrRevoked, cert.Subject.CommonName, cert.SerialNumber)
	}
	return nil
}
