package enrolment

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/measure"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
)

// xorKeys is a stand-in protector whose Unseal fails for a different key,
// like a TPM after a PCR change.
type xorKeys struct{ k byte }

func (x xorKeys) Policy() string { return "test" }
func (x xorKeys) Seal(key []byte) ([]byte, error) {
	out := append([]byte{x.k}, key...)
	for i := 1; i < len(out); i++ {
		out[i] ^= x.k
	}
	return out, nil
}
func (x xorKeys) Unseal(b []byte) ([]byte, error) {
	if b[0] != x.k {
		return nil, errWrongKey
	}
	out := append([]byte(nil), b[1:]...)
	for i := range out {
		out[i] ^= x.k
	}
	return out, nil
}

type wrongKey struct{}

func (wrongKey) Error() string { return "sealed to another state" }

var errWrongKey = wrongKey{}

func TestJoinStateRoundTrip(t *testing.T) {
	ca, err := pki.NewCA("test", 0)
	if err != nil {
		t.Fatal(err)
	}
	_, jk, _ := ed25519.GenerateKey(rand.Reader)
	dir := &clusterpb.ClusterDirectory{Nodes: []*clusterpb.DirectoryNode{{Id: "plinth-1", Addresses: []string{"10.42.0.10"}}}}
	_, nk, _ := ed25519.GenerateKey(rand.Reader)
	cert, err := identity.IssueNodeCertificate(ca, nk.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	node, err := identity.NewCredentials(nk, cert.Raw, ca.Certificate.Raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, keys := range []interface {
		Policy() string
		Seal([]byte) ([]byte, error)
		Unseal([]byte) ([]byte, error)
	}{xorKeys{7}, measure.InsecureKeys{}} {
		blob, err := (&joinState{JoinKey: jk, CA: ca.Certificate, Directory: dir, Node: node, ClusterUnlockKey: []byte("cuk")}).seal(keys)
		if err != nil {
			t.Fatal(err)
		}
		got, err := unsealJoinState(keys, blob)
		if err != nil {
			t.Fatal(err)
		}
		if !got.JoinKey.Equal(jk) || !got.CA.Equal(ca.Certificate) || !proto.Equal(got.Directory, dir) ||
			got.Node == nil || got.Node.ID() != node.ID() || string(got.ClusterUnlockKey) != "cuk" {
			t.Fatalf("%s: round trip changed the state", keys.Policy())
		}
		// Tampering with the ciphertext is detected.
		blob[len(blob)-1] ^= 1
		if _, err := unsealJoinState(keys, blob); err == nil {
			t.Fatalf("%s: tampered join state accepted", keys.Policy())
		}
	}
	blob, _ := (&joinState{JoinKey: jk, CA: ca.Certificate, Directory: dir}).seal(xorKeys{7})
	if _, err := unsealJoinState(xorKeys{8}, blob); err == nil {
		t.Fatal("join state opened by another protector")
	}
	if _, err := unsealJoinState(xorKeys{7}, blob[:5]); err == nil {
		t.Fatal("truncated join state accepted")
	}
}

func TestSortedDirectory(t *testing.T) {
	a := &clusterpb.ClusterDirectory{Nodes: []*clusterpb.DirectoryNode{{Id: "plinth-b"}, {Id: "plinth-a"}}}
	b := &clusterpb.ClusterDirectory{Nodes: []*clusterpb.DirectoryNode{{Id: "plinth-a"}, {Id: "plinth-b"}}}
	if !proto.Equal(sortedDirectory(a), sortedDirectory(b)) {
		t.Fatal("the same curators in another order compare different")
	}
	if a.Nodes[0].Id != "plinth-b" {
		t.Fatal("sortedDirectory changed its argument")
	}
	if len(sortedDirectory(nil).GetNodes()) != 0 {
		t.Fatal("nil directory")
	}
}

// TestPendingRegistrationState: the state a registering node seals before
// it registers carries its node key, and reads back as pending (register
// again with these keys), never as a member's state (join).
func TestPendingRegistrationState(t *testing.T) {
	ca, err := pki.NewCA("test", 0)
	if err != nil {
		t.Fatal(err)
	}
	_, jk, _ := ed25519.GenerateKey(rand.Reader)
	_, nk, _ := ed25519.GenerateKey(rand.Reader)
	keys := xorKeys{3}
	blob, err := (&joinState{JoinKey: jk, CA: ca.Certificate, Directory: &clusterpb.ClusterDirectory{}, PendingNodeKey: nk}).seal(keys)
	if err != nil {
		t.Fatal(err)
	}
	got, err := unsealJoinState(keys, blob)
	if err != nil {
		t.Fatal(err)
	}
	if !got.pending() || !got.PendingNodeKey.Equal(nk) || !got.JoinKey.Equal(jk) || got.Node != nil {
		t.Fatalf("pending state read back as %+v", got)
	}
}
