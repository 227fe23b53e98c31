// Package identity is who is who in a Plinth cluster: node IDs, the
// certificates the cluster CA issues to nodes and to the owner, the
// ephemeral self-signed certificates of nodes that have no cluster
// certificate (yet), and how a gRPC server tells them apart.
//
//	cluster CA (ed25519, key kept by the curator in etcd)
//	 ├── node certificate   CN=<node ID>  OU=node   server+client
//	 └── owner certificate  CN=owner      OU=owner  client
//
//	ephemeral certificate   self-signed, CN=ephemeral, for the caller's own
//	                        key: proves possession, grants nothing but the
//	                        REGISTER_NODE / ESCROW_OWNERSHIP permissions
//
// Servers request (but do not verify at the TLS layer) client
// certificates, because a self-signed ephemeral certificate must get
// through the handshake; PeerFromContext then classifies the caller, and
// the permission interceptor (roleserver/rpc) decides. Clients always
// verify the server against the cluster CA, except for the owner's one
// trust-on-first-use hand-over (takeownership), which pins what it saw.
package identity

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"

	"plinth.dev/plinth/platform/atomicfile"
	"plinth.dev/plinth/platform/pki"
)

// Organisational units that tell node and owner certificates apart.
const (
	unitNode  = "node"
	unitOwner = "owner"
	// ephemeralName is the common name of self-signed ephemeral certificates.
	ephemeralName = "ephemeral"
	// OwnerName is the common name of the owner's certificate.
	OwnerName = "owner"
)

const nodeIDPrefix = "plinth-"

// NodeID derives a node's ID from its public key, so that it is stable and
// cannot be chosen by the node. It is a valid DNS label (hostname, etcd
// member name).
func NodeID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return nodeIDPrefix + hex.EncodeToString(sum[:8])
}

// IssueNodeCertificate signs a node's certificate for its public key.
func IssueNodeCertificate(ca *pki.CA, pub ed25519.PublicKey) (*x509.Certificate, error) {
	return issue(ca, pub, NodeID(pub), unitNode, pki.UsageServerAndClient)
}

// IssueOwnerCertificate signs the owner's client certificate.
func IssueOwnerCertificate(ca *pki.CA, pub ed25519.PublicKey) (*x509.Certificate, error) {
	return issue(ca, pub, OwnerName, unitOwner, pki.UsageClient)
}

// issue is pki.CA.Issue with the organisational unit set, which Template
// does not carry; the unit is what PeerFromContext reads.
func issue(ca *pki.CA, pub ed25519.PublicKey, cn, unit string, usage pki.Usage) (*x509.Certificate, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("identity: public key has %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	ekus := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if usage == pki.UsageServerAndClient {
		ekus = append(ekus, x509.ExtKeyUsageServerAuth)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn, OrganizationalUnit: []string{unit}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              ca.Certificate.NotAfter,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           ekus,
	}
	if unit == unitNode {
		tmpl.DNSNames = []string{cn}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Certificate, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("identity: issuing %s certificate: %w", unit, err)
	}
	return x509.ParseCertificate(der)
}

// EphemeralCertificate is a self-signed TLS certificate for key: it proves
// the caller holds key and nothing more.
func EphemeralCertificate(key ed25519.PrivateKey) (tls.Certificate, error) {
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: ephemeralName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("identity: ephemeral certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// Credentials are a key with its certificate from the cluster CA: a node's
// (NodeCredentials) or the owner's.
type Credentials struct {
	PrivateKey  ed25519.PrivateKey
	Certificate *x509.Certificate
	CA          *x509.Certificate
}

// NewCredentials checks that cert is for key and chains to ca.
func NewCredentials(key ed25519.PrivateKey, certDER, caDER []byte) (*Credentials, error) {
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, fmt.Errorf("identity: certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("identity: CA certificate: %w", err)
	}
	c := &Credentials{PrivateKey: key, Certificate: cert, CA: ca}
	return c, c.check()
}

func (c *Credentials) check() error {
	pub, ok := c.Certificate.PublicKey.(ed25519.PublicKey)
	if !ok || !pub.Equal(c.PrivateKey.Public()) {
		return errors.New("identity: certificate is not for this key")
	}
	if err := c.Certificate.CheckSignatureFrom(c.CA); err != nil {
		return fmt.Errorf("identity: certificate not issued by this CA: %w", err)
	}
	return nil
}

// PublicKey is the public half of the credentials' key.
func (c *Credentials) PublicKey() ed25519.PublicKey { return c.PrivateKey.Public().(ed25519.PublicKey) }

// ID is the node ID for node credentials, "owner" for the owner's.
func (c *Credentials) ID() string { return c.Certificate.Subject.CommonName }

// TLSCertificate is the certificate to present in handshakes.
func (c *Credentials) TLSCertificate() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{c.Certificate.Raw}, PrivateKey: c.PrivateKey, Leaf: c.Certificate}
}

// ServerTLSConfig serves with these (node) credentials and requests a
// client certificate of any kind; see PeerFromContext.
func (c *Credentials) ServerTLSConfig() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{c.TLSCertificate()},
		ClientAuth:   tls.RequestClientCert,
		MinVersion:   tls.VersionTLS13,
	}
}

// ClientTLSConfig presents these credentials and accepts only a server
// whose node certificate chains to the cluster CA (any node: which node
// answers is the resolver's business, see VerifyServerNode).
func (c *Credentials) ClientTLSConfig() *tls.Config {
	return ClientTLSConfig(c.CA, c.TLSCertificate())
}

// ClientTLSConfig presents cert (ephemeral or from the CA) and verifies the
// server against ca: it must hold a node certificate from the cluster CA.
func ClientTLSConfig(ca *x509.Certificate, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS13,
		// The server's address is not part of its identity (addresses come
		// from DHCP), so the chain is checked here instead of by hostname.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := verifyServer(ca, raw)
			return err
		},
		// A node ID as the server name (set by the leader resolver) pins
		// which node must answer; an address pins nothing.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if !strings.HasPrefix(cs.ServerName, nodeIDPrefix) || len(cs.PeerCertificates) == 0 {
				return nil
			}
			if cn := cs.PeerCertificates[0].Subject.CommonName; cn != cs.ServerName {
				return fmt.Errorf("identity: expected node %s, server is %s", cs.ServerName, cn)
			}
			return nil
		},
	}
}

// verifyServer checks that the server presented a node certificate from
// ca and returns it.
func verifyServer(ca *x509.Certificate, raw [][]byte) (*x509.Certificate, error) {
	if len(raw) == 0 {
		return nil, errors.New("identity: server sent no certificate")
	}
	cert, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return nil, err
	}
	if err := pki.Verify(ca, nil, cert, pki.UsageServer); err != nil {
		return nil, fmt.Errorf("identity: server is not a node of this cluster: %w", err)
	}
	if unit(cert) != unitNode {
		return nil, fmt.Errorf("identity: server certificate %q is not a node certificate", cert.Subject.CommonName)
	}
	return cert, nil
}

func unit(cert *x509.Certificate) string {
	if len(cert.Subject.OrganizationalUnit) != 1 {
		return ""
	}
	return cert.Subject.OrganizationalUnit[0]
}

// Files where credentials are kept in a directory.
const (
	keyFile  = "key.pem"
	certFile = "cert.pem"
	caFile   = "ca.pem"
)

// Save writes the credentials to dir (key 0600).
func (c *Credentials) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	key, err := pki.PrivateKeyPEM(c.PrivateKey)
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		keyFile: key, certFile: pki.CertificatePEM(c.Certificate), caFile: pki.CertificatePEM(c.CA),
	} {
		if err := atomicfile.Write(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// Load reads credentials saved by Save. A directory without them is
// os.ErrNotExist.
func Load(dir string) (*Credentials, error) {
	read := func(name string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, name)) }
	keyPEM, err := read(keyFile)
	if err != nil {
		return nil, err
	}
	certPEM, err := read(certFile)
	if err != nil {
		return nil, err
	}
	caPEM, err := read(caFile)
	if err != nil {
		return nil, err
	}
	key, err := pki.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("identity: %s: %w", filepath.Join(dir, keyFile), err)
	}
	cert, err := pki.ParseCertificatePEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("identity: %s: %w", filepath.Join(dir, certFile), err)
	}
	ca, err := pki.ParseCertificatePEM(caPEM)
	if err != nil {
		return nil, fmt.Errorf("identity: %s: %w", filepath.Join(dir, caFile), err)
	}
	c := &Credentials{PrivateKey: key, Certificate: cert, CA: ca}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("identity: %s: %w", dir, err)
	}
	return c, nil
}

// IsOwner reports whether a certificate from the cluster CA is the owner's.
func IsOwner(cert *x509.Certificate) bool {
	return unit(cert) == unitOwner && strings.EqualFold(cert.Subject.CommonName, OwnerName)
}
