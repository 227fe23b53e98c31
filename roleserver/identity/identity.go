// Package identity is who is who in a Plinth cluster: node IDs, the
// certificates the cluster CA issues to nodes, curators and the owner, the
// ephemeral self-signed certificates of nodes that have no cluster
// certificate (yet), the cluster CRL, and how TLS peers tell them apart.
//
//	cluster CA (ed25519, key kept by the curators in etcd)
//	 ├── node certificate     CN=<node ID>  OU=node     server+client
//	 ├── curator certificate  CN=<node ID>  OU=curator  server only
//	 ├── owner certificate    CN=owner      OU=owner    client
//	 └── cluster CRL          serials of decommissioned nodes' certificates
//	                          and of former curators' certificates
//
//	ephemeral certificate     self-signed, CN=ephemeral, for the caller's own
//	                          key: proves possession, grants nothing but the
//	                          REGISTER_NODE / ESCROW_OWNERSHIP permissions
//
// Why a separate curator certificate: a node certificate says "a node of
// this cluster", which a decommissioned or compromised worker also holds.
// Whoever answers as the curator leader can hand out roles and decide
// whether a node keeps its cluster unlock key, so only the curators — the
// consensus members, which hold the CA key anyway — get certificates that
// clients accept for the Curator, Management and AAA services. A curator
// issues its own when it starts; the curators revoke them (and every
// certificate of a decommissioned node) in the cluster CRL.
//
// Every TLS handshake inside the cluster checks the CRL a party holds
// (Trust): servers when they classify callers, clients when they verify
// servers. Nodes receive the newest CRL with every heartbeat answer.
//
// Servers request (but do not verify at the TLS layer) client
// certificates, because a self-signed ephemeral certificate must get
// through the handshake; PeerFromContext then classifies the caller, and
// the permission interceptor (roleserver/rpc) decides. Clients always
// verify the server against the cluster CA and the role they need from
// it (ServerCurator or ServerNode), except for the owner's one
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

// Organisational units that tell node, curator and owner certificates
// apart.
const (
	unitNode    = "node"
	unitCurator = "curator"
	unitOwner   = "owner"
	// ephemeralName is the common name of self-signed ephemeral certificates.
	ephemeralName = "ephemeral"
	// OwnerName is the common name of the owner's certificate.
	OwnerName = "owner"
)

const nodeIDPrefix = "plinth-"

// NodeID derives a node's ID from its public key, so that it is stable and
// cannot be chosen by the node. It is a valid DNS label (hostname, etcd
// member name). 128 bits of the hash: a second key with the same ID is out
// of reach even with a birthday search (the curator also compares the
// whole key with its record on every call).
func NodeID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return nodeIDPrefix + hex.EncodeToString(sum[:16])
}

// IssueNodeCertificate signs a node's certificate for its public key.
func IssueNodeCertificate(ca *pki.CA, pub ed25519.PublicKey) (*x509.Certificate, error) {
	return issue(ca, pub, NodeID(pub), unitNode, pki.UsageServerAndClient)
}

// IssueCuratorCertificate signs the server certificate a curator serves
// with: only these are accepted by clients of the Curator, Management and
// AAA services.
func IssueCuratorCertificate(ca *pki.CA, pub ed25519.PublicKey) (*x509.Certificate, error) {
	return issue(ca, pub, NodeID(pub), unitCurator, pki.UsageServer)
}

// IssueOwnerCertificate signs the owner's client certificate.
func IssueOwnerCertificate(ca *pki.CA, pub ed25519.PublicKey) (*x509.Certificate, error) {
	return issue(ca, pub, OwnerName, unitOwner, pki.UsageClient)
}

// issue is pki.CA.Issue with the organisational unit set (what
// PeerFromContext reads), valid as long as the CA.
func issue(ca *pki.CA, pub ed25519.PublicKey, cn, unit string, usage pki.Usage) (*x509.Certificate, error) {
	t := pki.Template{CommonName: cn, OrganizationalUnit: unit, PublicKey: pub, Usage: usage,
		Validity: time.Until(ca.Certificate.NotAfter) + time.Hour}
	if unit == unitNode || unit == unitCurator {
		t.DNSNames = []string{cn}
	}
	cert, err := ca.Issue(t)
	if err != nil {
		return nil, fmt.Errorf("identity: issuing %s certificate: %w", unit, err)
	}
	return cert, nil
}

// OwnerKeyRotationMessage is what a new owner key signs to replace the
// owner key of the cluster whose CA certificate is caDER
// (Management.RotateOwnerKey).
func OwnerKeyRotationMessage(caDER []byte, newKey ed25519.PublicKey) []byte {
	return append(append([]byte("plinth owner key rotation v1\x00"), caDER...), newKey...)
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

// Credentials are a key with its certificate from the cluster CA: a node's,
// a curator's or the owner's, with what the holder trusts.
type Credentials struct {
	PrivateKey  ed25519.PrivateKey
	Certificate *x509.Certificate
	CA          *x509.Certificate
	// Trust is the CA and the newest CRL known; shared by every server
	// and client built from these credentials (and from WithCertificate).
	// nil means the CA alone, without a CRL.
	Trust *Trust
}

// trust is c.Trust, or the CA alone.
func (c *Credentials) trust() *Trust {
	if c.Trust != nil {
		return c.Trust
	}
	return NewTrust(c.CA)
}

// WithCertificate returns credentials for the same key and trust with
// another certificate from the same CA (a curator's server certificate).
func (c *Credentials) WithCertificate(cert *x509.Certificate) (*Credentials, error) {
	out := &Credentials{PrivateKey: c.PrivateKey, Certificate: cert, CA: c.CA, Trust: c.trust()}
	return out, out.check()
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
	c := &Credentials{PrivateKey: key, Certificate: cert, CA: ca, Trust: NewTrust(ca)}
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

// TLSCertificate is the certificate to present in handshakes, followed by
// the CA certificate: a peer that does not know the CA yet (the owner
// taking ownership with a pinned CA fingerprint) can check it before it
// sends anything. Verification never trusts the second entry: it checks
// the first against the CA the verifier holds.
func (c *Credentials) TLSCertificate() tls.Certificate {
	chain := [][]byte{c.Certificate.Raw}
	if c.CA != nil {
		chain = append(chain, c.CA.Raw)
	}
	return tls.Certificate{Certificate: chain, PrivateKey: c.PrivateKey, Leaf: c.Certificate}
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

// ServerRole is what a client needs the server it dials to be.
type ServerRole int

const (
	// ServerCurator: a curator (Curator, Management and AAA services).
	ServerCurator ServerRole = iota + 1
	// ServerNode: any node of the cluster (NodeManagement).
	ServerNode
)

func (r ServerRole) unit() string {
	if r == ServerCurator {
		return unitCurator
	}
	return unitNode
}

// ClientTLSConfig presents these credentials and accepts only a server
// with a certificate for role from the cluster CA that the CRL does not
// revoke (which one answers is the resolver's business: it pins a node ID
// as the TLS server name).
func (c *Credentials) ClientTLSConfig(role ServerRole) *tls.Config {
	return ClientTLSConfig(c.trust(), c.TLSCertificate(), role)
}

// ClientTLSConfig presents cert (ephemeral or from the CA) and verifies the
// server against trust: it must hold an unrevoked certificate for role
// from the cluster CA.
func ClientTLSConfig(trust *Trust, cert tls.Certificate, role ServerRole) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS13,
		// The server's address is not part of its identity (addresses come
		// from DHCP), so the chain is checked here instead of by hostname.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := verifyServer(trust, raw, role)
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

// ErrWrongRole: the server's certificate is from the cluster CA but not
// for the role the client needs (e.g. a node certificate where a curator
// must answer).
var ErrWrongRole = errors.New("identity: server certificate is not for the required role")

// verifyServer checks that the server presented an unrevoked certificate
// for role from the trusted CA and returns it.
func verifyServer(trust *Trust, raw [][]byte, role ServerRole) (*x509.Certificate, error) {
	if len(raw) == 0 {
		return nil, errors.New("identity: server sent no certificate")
	}
	cert, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return nil, err
	}
	if err := trust.Verify(cert, pki.UsageServer); err != nil {
		return nil, fmt.Errorf("identity: server is not a member of this cluster: %w", err)
	}
	if unit(cert) != role.unit() {
		return nil, fmt.Errorf("%w: %q is a %s certificate, a %s must answer", ErrWrongRole, cert.Subject.CommonName, unit(cert), role.unit())
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
	c := &Credentials{PrivateKey: key, Certificate: cert, CA: ca, Trust: NewTrust(ca)}
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("identity: %s: %w", dir, err)
	}
	return c, nil
}

// IsOwner reports whether a certificate from the cluster CA is the owner's.
func IsOwner(cert *x509.Certificate) bool {
	return unit(cert) == unitOwner && strings.EqualFold(cert.Subject.CommonName, OwnerName)
}
