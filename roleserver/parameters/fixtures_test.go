package parameters

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/nodepb"
)

// Fixed keys and times keep the fixtures, and so the fuzz seed corpus,
// the same on every run.
var (
	ownerKey = ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)).Public().(ed25519.PublicKey)

	certOnce sync.Once
	caDER    []byte
	leafDER  []byte
)

// testCerts returns a self-signed ed25519 CA and a leaf it issued, both DER.
func testCerts(t testing.TB) (ca, leaf []byte) {
	t.Helper()
	certOnce.Do(func() {
		key := ed25519.NewKeyFromSeed(append(make([]byte, 31), 1))
		notBefore := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
		caTmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(1),
			Subject:               pkix.Name{CommonName: "Plinth test cluster CA"},
			NotBefore:             notBefore,
			NotAfter:              notBefore.AddDate(10, 0, 0),
			IsCA:                  true,
			BasicConstraintsValid: true,
			KeyUsage:              x509.KeyUsageCertSign,
		}
		var err error
		caDER, err = x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, key.Public(), key)
		if err != nil {
			panic(err)
		}
		leafTmpl := &x509.Certificate{
			SerialNumber: big.NewInt(2),
			Subject:      pkix.Name{CommonName: "curator"},
			NotBefore:    notBefore,
			NotAfter:     notBefore.AddDate(1, 0, 0),
		}
		caCert, _ := x509.ParseCertificate(caDER)
		leafDER, err = x509.CreateCertificate(rand.Reader, leafTmpl, caCert, key.Public(), key)
		if err != nil {
			panic(err)
		}
	})
	return caDER, leafDER
}

func bootstrapDoc() *nodepb.Parameters {
	return &nodepb.Parameters{
		Cluster: &nodepb.Parameters_Bootstrap{Bootstrap: &nodepb.Bootstrap{
			OwnerPublicKey: ownerKey,
			InitialPolicy: &nodepb.ClusterPolicy{
				StorageSecurity: nodepb.StorageSecurity_STORAGE_SECURITY_ENCRYPTED,
			},
		}},
		Storage: &nodepb.NodeStorage{Filesystem: nodepb.NodeStorage_FILESYSTEM_XFS},
		Tpm:     &nodepb.NodeTPM{Policy: nodepb.NodeTPM_TPM_POLICY_REQUIRED, SealPcrs: []uint32{7, 11}},
		Network: &nodepb.Network{
			Hostname: "node-a",
			Static: &nodepb.StaticConfig{
				Interface: "eth0",
				Address:   "10.0.2.15/24",
				Gateway:   "10.0.2.2",
				Dns:       []string{"10.0.2.3", "2001:db8::53"},
			},
		},
	}
}

func registerDoc(t testing.TB) *nodepb.Parameters {
	ca, _ := testCerts(t)
	return &nodepb.Parameters{
		Cluster: &nodepb.Parameters_Register{Register: &nodepb.Register{
			ClusterCaCertificate: ca,
			RegisterTicket:       []byte("ticket-0123456789"),
			CuratorEndpoints:     []string{"10.0.2.10:7835", "[2001:db8::10]:7835", "curator.example:7835"},
		}},
	}
}

// mustMarshal encodes without validating, for documents that are meant to
// be invalid.
func mustMarshal(t testing.TB, p *nodepb.Parameters) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
