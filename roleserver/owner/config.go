// Package owner is the cluster owner's side of the cluster API: the
// one-time ownership hand-over (TakeOwnership), the owner's configuration
// directory, and a client for Management and NodeManagement. plinthctl and
// the vmtest cluster launcher both use it.
//
//	owner key (from `plinthctl params --bootstrap`)
//	   │
//	   │ AAA.Escrow, ephemeral cert, server pinned (trust on first use)
//	   ▼
//	bootstrap node ──► owner certificate ──► GetClusterInfo over the pinned
//	                                         server: cluster CA (refused unless
//	                                         it has the fingerprint given with
//	                                         WithCAFingerprint); check the
//	                                         server and owner certificates
//	                                         both chain to it
//	   │
//	   ▼
//	config dir: owner.key owner.pem ca.pem endpoints
//	   (ca.pem is the pinned CA: the client trusts no other, and
//	   RegisterParameters hands out this one, never the server's word)
//	   │
//	   ▼
//	Client ── Management ──► curator endpoints, in order; on UNAVAILABLE the next
//	       └─ NodeManagement ──► node address:7836 (or an override from endpoints,
//	                             e.g. a vmtest forwarded port); the server must be
//	                             that node
package owner

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"plinth.dev/plinth/platform/atomicfile"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
)

// Files in the configuration directory.
const (
	KeyFile = "owner.key" // PKCS#8 PEM, the same format `plinthctl params` writes
	// NextKeyFile is the new key of a rotation under way, in KeyFile's
	// format: kept before the cluster is asked, so that a rotation whose
	// answer is lost leaves the key the cluster now wants on disk.
	NextKeyFile   = "owner.key.next"
	CertFile      = "owner.pem" // owner certificate, PEM
	CAFile        = "ca.pem"    // cluster CA certificate, PEM
	EndpointsFile = "endpoints" // see Config.Save
	// CRLFile is the newest cluster CRL the owner's tool received (DER):
	// every handshake is checked against it, so that a server whose
	// certificate the cluster revoked (a former consensus member still
	// answering on its address) is refused.
	CRLFile = "cluster-crl"
)

// Config is the owner's state on disk: the owner key, once ownership is
// taken the owner certificate and cluster CA, and where to reach the
// cluster.
type Config struct {
	// Dir is the directory the configuration lives in.
	Dir string
	// Key is the owner's private key (nil if the directory has none).
	Key ed25519.PrivateKey
	// Credentials are the owner key with its certificate from the cluster
	// CA; nil until ownership is taken.
	Credentials *identity.Credentials
	// Curators are the curator endpoints (host:port) Management calls go
	// to, tried in order.
	Curators []string
	// KeyPassphrase, if set, is the passphrase the key is kept
	// encrypted with (ownerkey.go); Save keeps it so.
	KeyPassphrase []byte
	// NodeEndpoints override where a node's NodeManagement service is
	// reached (node ID → host:port). Without an entry the node's first
	// reported address and layout.NodeManagementPort are used; vmtest
	// sets entries for its forwarded loopback ports.
	NodeEndpoints map[string]string
}

// DefaultDir is $XDG_CONFIG_HOME/plinth, or ~/.config/plinth.
func DefaultDir() (string, error) {
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "plinth"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("owner: no configuration directory: %w", err)
	}
	return filepath.Join(home, ".config", "plinth"), nil
}

// LoadConfig reads the configuration in dir. A missing directory is an
// error wrapping os.ErrNotExist; missing files leave their fields empty.
func LoadConfig(dir string) (*Config, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("owner: configuration %w", err)
	}
	c := &Config{Dir: dir, NodeEndpoints: map[string]string{}}
	keyPath := filepath.Join(dir, KeyFile)
	if _, err := os.Stat(keyPath); err == nil {
		if c.Key, c.KeyPassphrase, err = readKey(keyPath); err != nil {
			return nil, err
		}
	}
	certPEM, certErr := os.ReadFile(filepath.Join(dir, CertFile))
	caPEM, caErr := os.ReadFile(filepath.Join(dir, CAFile))
	switch {
	case certErr == nil && caErr == nil:
		if c.Key == nil {
			return nil, fmt.Errorf("owner: %s has %s but no %s", dir, CertFile, KeyFile)
		}
		cert, err := pki.ParseCertificatePEM(certPEM)
		if err != nil {
			return nil, fmt.Errorf("owner: %s: %w", filepath.Join(dir, CertFile), err)
		}
		ca, err := pki.ParseCertificatePEM(caPEM)
		if err != nil {
			return nil, fmt.Errorf("owner: %s: %w", filepath.Join(dir, CAFile), err)
		}
		if c.Credentials, err = identity.NewCredentials(c.Key, cert.Raw, ca.Raw); err != nil {
			return nil, fmt.Errorf("owner: %s: %w", dir, err)
		}
		if c.Credentials.Trust, err = loadTrust(ca, filepath.Join(dir, CRLFile)); err != nil {
			return nil, err
		}
	case !errors.Is(certErr, os.ErrNotExist):
		return nil, fmt.Errorf("owner: %w", certErr)
	case !errors.Is(caErr, os.ErrNotExist):
		return nil, fmt.Errorf("owner: %w", caErr)
	}
	raw, err := os.ReadFile(filepath.Join(dir, EndpointsFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("owner: %w", err)
	}
	if err := c.parseEndpoints(raw); err != nil {
		return nil, fmt.Errorf("owner: %s: %w", filepath.Join(dir, EndpointsFile), err)
	}
	return c, nil
}

// parseEndpoints reads lines "curator HOST:PORT" and "node ID HOST:PORT";
// blank lines and lines starting with # are skipped.
func (c *Config) parseEndpoints(raw []byte) error {
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch {
		case f[0] == "curator" && len(f) == 2:
			if err := checkHostPort(f[1]); err != nil {
				return fmt.Errorf("line %d: %w", line, err)
			}
			c.Curators = append(c.Curators, f[1])
		case f[0] == "node" && len(f) == 3:
			if err := checkHostPort(f[2]); err != nil {
				return fmt.Errorf("line %d: %w", line, err)
			}
			c.NodeEndpoints[f[1]] = f[2]
		default:
			return fmt.Errorf("line %d: want \"curator HOST:PORT\" or \"node ID HOST:PORT\", got %q", line, sc.Text())
		}
	}
	return sc.Err()
}

func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("%q is not host:port", s)
	}
	return nil
}

// Save writes the configuration to c.Dir (created 0700): the key (0600),
// certificate and CA if present, and the endpoints file.
func (c *Config) Save() error {
	if c.Dir == "" {
		return errors.New("owner: configuration has no directory")
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return fmt.Errorf("owner: %w", err)
	}
	files := map[string][]byte{EndpointsFile: c.endpointsText()}
	if c.Key != nil {
		k, err := keyFileBytes(c.Key, c.KeyPassphrase)
		if err != nil {
			return fmt.Errorf("owner: %w", err)
		}
		files[KeyFile] = k
	}
	if cr := c.Credentials; cr != nil {
		if c.Key == nil || !cr.PublicKey().Equal(c.Key.Public()) {
			return errors.New("owner: credentials are not for the configured owner key")
		}
		files[CertFile] = pki.CertificatePEM(cr.Certificate)
		files[CAFile] = pki.CertificatePEM(cr.CA)
	}
	for name, data := range files {
		if err := atomicfile.Write(filepath.Join(c.Dir, name), data, 0o600); err != nil {
			return fmt.Errorf("owner: %w", err)
		}
	}
	return nil
}

func (c *Config) endpointsText() []byte {
	var b bytes.Buffer
	b.WriteString("# Plinth cluster endpoints (plinthctl).\n# curator HOST:PORT      Management calls, tried in order\n# node ID HOST:PORT      where to reach a node's NodeManagement instead of its address\n")
	for _, e := range c.Curators {
		fmt.Fprintf(&b, "curator %s\n", e)
	}
	ids := make([]string, 0, len(c.NodeEndpoints))
	for id := range c.NodeEndpoints {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "node %s %s\n", id, c.NodeEndpoints[id])
	}
	return b.Bytes()
}

// SaveNextKey writes k as the next owner key (NextKeyFile, 0600,
// encrypted as the owner key is).
func (c *Config) SaveNextKey(k ed25519.PrivateKey) error {
	b, err := keyFileBytes(k, c.KeyPassphrase)
	if err != nil {
		return fmt.Errorf("owner: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(c.Dir, NextKeyFile), b, 0o600); err != nil {
		return fmt.Errorf("owner: %w", err)
	}
	return nil
}

// NextKey is the next owner key SaveNextKey wrote, or nil.
func (c *Config) NextKey() (ed25519.PrivateKey, error) {
	path := filepath.Join(c.Dir, NextKeyFile)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return ReadKeyFile(path)
}

// DropNextKey removes the next owner key once it is the owner key.
func (c *Config) DropNextKey() error {
	if err := os.Remove(filepath.Join(c.Dir, NextKeyFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("owner: %w", err)
	}
	return nil
}

// ReadKeyFile reads an owner private key (PKCS#8 PEM, as `plinthctl
// params` writes owner.key; or that, encrypted with a passphrase:
// ownerkey.go).
func ReadKeyFile(path string) (ed25519.PrivateKey, error) {
	k, _, err := readKey(path)
	return k, err
}
