// Package pki is a small ed25519 X.509 PKI: a self-signed CA, leaf
// certificates issued by it, and certificate revocation lists.
//
// It is shared by the etcd member service (peer/client certificates, the
// CRL file handed to etcd's --peer-crl-file) and the cluster curator (node
// certificates). Everything is ed25519 because node identities already are
// ed25519 keys, and because it keeps certificates small and signing cheap.
//
// Revocation, not expiry, is the main way to take a certificate away, so
// certificates are long-lived by default (see DefaultValidity) and CRLs are
// distributed by the cluster itself rather than fetched from a URL.
package pki

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// DefaultValidity is used when a Template (or NewCA) asks for a zero
// validity. Ten years: nodes are long-lived and certificates are withdrawn by
// revocation, so an early expiry would only cause outages.
const DefaultValidity = 10 * 365 * 24 * time.Hour

// backdate is subtracted from NotBefore so that a certificate is usable right
// away on machines whose clocks lag a bit behind the issuer's.
const backdate = time.Hour

// CA is a certificate authority: its self-signed certificate and its key.
type CA struct {
	Certificate *x509.Certificate
	Key         ed25519.PrivateKey
}

// serialLimit is 2^128: serials are random 128-bit numbers, large enough
// that collisions between independently issued certificates do not happen.
var serialLimit = new(big.Int).Lsh(big.NewInt(1), 128)

func newSerial() (*big.Int, error) {
	for {
		s, err := rand.Int(rand.Reader, serialLimit)
		if err != nil {
			return nil, fmt.Errorf("pki: generating serial: %w", err)
		}
		// RFC 5280 wants positive serials.
		if s.Sign() > 0 {
			return s, nil
		}
	}
}

func validityOrDefault(d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("pki: negative validity %v", d)
	case d == 0:
		return DefaultValidity, nil
	}
	return d, nil
}

// CATemplate is the template of a self-signed CA that signs leaves only
// (path length 0), valid from a backdated now for validity, with a
// random 128-bit serial. Every CA of Plinth is made from it, whatever
// its key type.
func CATemplate(commonName string, validity time.Duration) (*x509.Certificate, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		// Path length 0: this CA signs leaves only, never other CAs.
		MaxPathLen:     0,
		MaxPathLenZero: true,
		KeyUsage:       x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}, nil
}

// LeafWindow fills tmpl's serial (random, 128 bits, unless the caller
// chose one: a certificate whose name carries its serial) and validity:
// from a backdated now for validity, never beyond the issuing CA's
// notAfter.
func LeafWindow(tmpl *x509.Certificate, validity time.Duration, caNotAfter time.Time) error {
	if tmpl.SerialNumber == nil {
		serial, err := newSerial()
		if err != nil {
			return err
		}
		tmpl.SerialNumber = serial
	}
	now := time.Now()
	tmpl.NotBefore = now.Add(-backdate)
	tmpl.NotAfter = now.Add(validity)
	if tmpl.NotAfter.After(caNotAfter) {
		tmpl.NotAfter = caNotAfter
	}
	return nil
}

// NewCA makes a self-signed ed25519 CA valid for `validity` (serial random
// 128-bit). A zero validity means DefaultValidity.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	validity, err := validityOrDefault(validity)
	if err != nil {
		return nil, err
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generating CA key: %w", err)
	}
	tmpl, err := CATemplate(commonName, validity)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		return nil, fmt.Errorf("pki: creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parsing CA certificate: %w", err)
	}
	return &CA{Certificate: cert, Key: priv}, nil
}

// MarshalPEM returns the CA certificate and its PKCS#8 key as PEM, the form
// LoadCA reads back.
func (ca *CA) MarshalPEM() (cert, key []byte, err error) {
	key, err = PrivateKeyPEM(ca.Key)
	if err != nil {
		return nil, nil, err
	}
	return CertificatePEM(ca.Certificate), key, nil
}

// LoadCA parses a CA written by MarshalPEM. It refuses a certificate that is
// not a CA or a key that does not belong to it, since either would only
// fail later, at signing or verification time, far from the cause.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCertificatePEM(certPEM)
	if err != nil {
		return nil, err
	}
	key, err := ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, errors.New("pki: certificate is not a CA")
	}
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("pki: CA public key is %T, want ed25519", cert.PublicKey)
	}
	if !pub.Equal(key.Public()) {
		return nil, errors.New("pki: private key does not match CA certificate")
	}
	return &CA{Certificate: cert, Key: key}, nil
}

// CertPool returns a pool containing only this CA, for tls.Config RootCAs
// and ClientCAs.
func (ca *CA) CertPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Certificate)
	return p
}

// Usage says what a leaf certificate may be used for in TLS.
type Usage int

const (
	// Usage starts at 1 so that a Template with no Usage set is an error
	// rather than silently becoming a server certificate.
	UsageServer Usage = iota + 1
	UsageClient
	UsageServerAndClient
)

func (u Usage) String() string {
	switch u {
	case UsageServer:
		return "server"
	case UsageClient:
		return "client"
	case UsageServerAndClient:
		return "server+client"
	}
	return fmt.Sprintf("Usage(%d)", int(u))
}

func (u Usage) extKeyUsages() ([]x509.ExtKeyUsage, error) {
	switch u {
	case UsageServer:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, nil
	case UsageClient:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil
	case UsageServerAndClient:
		return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, nil
	}
	return nil, fmt.Errorf("pki: invalid usage %v", u)
}

// Template describes a leaf certificate to Issue.
type Template struct {
	CommonName string
	// OrganizationalUnit, if set, is the subject's one OU (the cluster
	// puts the kind of party there: node, curator…).
	OrganizationalUnit string
	DNSNames           []string
	IPAddresses        []net.IP
	// PublicKey is the subject's key; the private half never reaches the CA.
	PublicKey ed25519.PublicKey
	// Usage is required (the zero value is rejected).
	Usage Usage
	// Validity defaults to DefaultValidity (10 years) when zero. The
	// certificate never outlives the CA: NotAfter is capped at the CA's.
	Validity time.Duration
}

// Issue signs a leaf certificate for t.PublicKey (random 128-bit serial).
func (ca *CA) Issue(t Template) (*x509.Certificate, error) {
	if len(t.PublicKey) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("pki: public key has %d bytes, want %d", len(t.PublicKey), ed25519.PublicKeySize)
	}
	ekus, err := t.Usage.extKeyUsages()
	if err != nil {
		return nil, err
	}
	validity, err := validityOrDefault(t.Validity)
	if err != nil {
		return nil, err
	}
	subject := pkix.Name{CommonName: t.CommonName}
	if t.OrganizationalUnit != "" {
		subject.OrganizationalUnit = []string{t.OrganizationalUnit}
	}
	tmpl := &x509.Certificate{
		Subject:               subject,
		DNSNames:              t.DNSNames,
		IPAddresses:           t.IPAddresses,
		BasicConstraintsValid: true,
		IsCA:                  false,
		// ed25519 keys only sign; there is no key encipherment.
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: ekus,
	}
	if err := LeafWindow(tmpl, validity, ca.Certificate.NotAfter); err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Certificate, t.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: issuing certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: parsing issued certificate: %w", err)
	}
	return cert, nil
}

// Verify checks that cert chains to ca, is valid now, has the usage, and is
// not revoked in crl (crl may be nil). A non-nil crl must be signed by ca, so
// that a CRL from another cluster cannot silently be consulted instead.
// UsageServerAndClient requires both usages.
func Verify(ca *x509.Certificate, crl *CRL, cert *x509.Certificate, usage Usage) error {
	if ca == nil || cert == nil {
		return errors.New("pki: nil certificate")
	}
	ekus, err := usage.extKeyUsages()
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	// x509 accepts a chain valid for any one of VerifyOptions.KeyUsages, so
	// each required usage is checked separately.
	for _, eku := range ekus {
		if _, err := cert.Verify(x509.VerifyOptions{
			Roots:     roots,
			KeyUsages: []x509.ExtKeyUsage{eku},
		}); err != nil {
			return fmt.Errorf("pki: verifying %q: %w", cert.Subject.CommonName, err)
		}
	}
	if crl != nil {
		if err := crl.List.CheckSignatureFrom(ca); err != nil {
			return fmt.Errorf("pki: CRL not signed by CA: %w", err)
		}
		if crl.IsRevoked(cert.SerialNumber) {
			return fmt.Errorf("pki: certificate %q (serial %x) is revoked", cert.Subject.CommonName, cert.SerialNumber)
		}
	}
	return nil
}
