package enrolment

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/roleserver/identity"
)

// joinState is what a registered node keeps outside its encrypted volume
// (in the data disk header, storage.Header.Enrolment) so it can rejoin
// after a reboot: its join key, the CA to trust, and where the curators
// were. Sealed as a whole: the join key is a secret and the CA decides
// whom the node trusts, so neither may be read or swapped offline.
type joinState struct {
	JoinKey   ed25519.PrivateKey
	CA        *x509.Certificate
	Directory *clusterpb.ClusterDirectory
	// ClusterUnlockKey is kept only while the node is a consensus member
	// (see Service.keepClusterKeyLocally): it then opens its volume on its
	// own, which a cold start of the whole cluster needs.
	ClusterUnlockKey []byte
	// Node is the node's key and certificate, so that a crash between the
	// commit and saving them on the volume cannot orphan the node: they
	// are in the header before the volume is set up.
	Node *identity.Credentials
	// PendingNodeKey is the node key of a registration not committed yet
	// (Node is nil then): a node that reboots while it waits for approval
	// registers again with the same key instead of a second identity.
	PendingNodeKey ed25519.PrivateKey
}

// pending reports whether this is the state of a registration that has
// not been committed yet.
func (j *joinState) pending() bool { return j.Node == nil && j.PendingNodeKey != nil }

type joinStateJSON struct {
	JoinKeySeed      []byte `json:"join_key_seed"`
	CA               []byte `json:"ca"`
	Directory        []byte `json:"directory"`
	ClusterUnlockKey []byte `json:"cluster_unlock_key,omitempty"`
	NodeKeySeed      []byte `json:"node_key_seed,omitempty"`
	NodeCertificate  []byte `json:"node_certificate,omitempty"`
	PendingNodeSeed  []byte `json:"pending_node_key_seed,omitempty"`
}

// seal encrypts the join state with a fresh data key (AES-256-GCM) and
// seals that key with the node's key protector (the TPM, bound to the
// measured boot), because a TPM-sealed object is small and the state is
// not:
//
//	u16 len | sealed data key | 12 B nonce | AES-GCM(state JSON)
func (j *joinState) seal(keys storage.KeyProtector) ([]byte, error) {
	dir, err := proto.Marshal(j.Directory)
	if err != nil {
		return nil, err
	}
	js := joinStateJSON{JoinKeySeed: j.JoinKey.Seed(), CA: j.CA.Raw, Directory: dir, ClusterUnlockKey: j.ClusterUnlockKey}
	if j.Node != nil {
		js.NodeKeySeed, js.NodeCertificate = j.Node.PrivateKey.Seed(), j.Node.Certificate.Raw
	}
	if j.PendingNodeKey != nil {
		js.PendingNodeSeed = j.PendingNodeKey.Seed()
	}
	plain, err := json.Marshal(js)
	if err != nil {
		return nil, err
	}
	dataKey := make([]byte, 32)
	if _, err := rand.Read(dataKey); err != nil {
		return nil, err
	}
	defer clear(dataKey)
	sealed, err := keys.Seal(dataKey)
	if err != nil {
		return nil, fmt.Errorf("sealing the join state key: %w", err)
	}
	aead, err := newAEAD(dataKey)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	out := binary.LittleEndian.AppendUint16(nil, uint16(len(sealed)))
	out = append(out, sealed...)
	out = append(out, nonce...)
	return aead.Seal(out, nonce, plain, []byte("plinth join state v1")), nil
}

func unsealJoinState(keys storage.KeyProtector, blob []byte) (*joinState, error) {
	if len(blob) < 2 {
		return nil, errors.New("join state: truncated")
	}
	n := int(binary.LittleEndian.Uint16(blob))
	blob = blob[2:]
	if len(blob) < n+12 {
		return nil, errors.New("join state: truncated")
	}
	dataKey, err := keys.Unseal(blob[:n])
	if err != nil {
		return nil, fmt.Errorf("join state: unsealing: %w", err)
	}
	defer clear(dataKey)
	aead, err := newAEAD(dataKey)
	if err != nil {
		return nil, err
	}
	nonce, ct := blob[n:n+aead.NonceSize()], blob[n+aead.NonceSize():]
	plain, err := aead.Open(nil, nonce, ct, []byte("plinth join state v1"))
	if err != nil {
		return nil, fmt.Errorf("join state: %w", err)
	}
	var js joinStateJSON
	if err := json.Unmarshal(plain, &js); err != nil {
		return nil, fmt.Errorf("join state: %w", err)
	}
	if len(js.JoinKeySeed) != ed25519.SeedSize {
		return nil, errors.New("join state: bad join key")
	}
	ca, err := x509.ParseCertificate(js.CA)
	if err != nil {
		return nil, fmt.Errorf("join state: CA: %w", err)
	}
	dir := &clusterpb.ClusterDirectory{}
	if err := proto.Unmarshal(js.Directory, dir); err != nil {
		return nil, fmt.Errorf("join state: directory: %w", err)
	}
	out := &joinState{JoinKey: ed25519.NewKeyFromSeed(js.JoinKeySeed), CA: ca, Directory: dir, ClusterUnlockKey: js.ClusterUnlockKey}
	if len(js.PendingNodeSeed) == ed25519.SeedSize {
		out.PendingNodeKey = ed25519.NewKeyFromSeed(js.PendingNodeSeed)
	}
	if len(js.NodeKeySeed) == ed25519.SeedSize {
		if out.Node, err = identity.NewCredentials(ed25519.NewKeyFromSeed(js.NodeKeySeed), js.NodeCertificate, js.CA); err != nil {
			return nil, fmt.Errorf("join state: node credentials: %w", err)
		}
	}
	return out, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}
