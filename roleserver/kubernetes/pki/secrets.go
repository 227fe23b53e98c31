package pki

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"plinth.dev/plinth/roleserver/consensus/client"
)

// Secrets are encrypted at rest inside etcd, not only by the disk: the
// API servers run with an EncryptionConfiguration (secretbox) whose keys
// live here, in the curator's namespace, outside /kubernetes/ (which the
// API server's own etcd endpoint is confined to), and reach the API
// servers only as a file on their tmpfs.
//
// A rotation goes in steps, so that no API server ever writes with a key
// another cannot read yet, and each step waits until every controller
// runs with the last one (SecretsLoaded):
//
//	ADD       a new key, read-only behind the write key   generation+1
//	ACTIVATE  the newest key writes; the others read      generation+1
//	          (then the owner's tool rewrites every Secret: the API
//	          server stores a Secret read with an old key anew)
//	RETIRE    the read-only keys go                       generation+1
const (
	keySecretsEncryption = "/kubernetes-ca/secrets-encryption"
	// keySecretsLoadedPrefix + node ID: the generation that node's API
	// server runs with.
	keySecretsLoadedPrefix = "/kubernetes-ca/secrets-encryption-loaded/"
)

// SecretsKeys are the secretbox keys of Secrets at rest.
type SecretsKeys struct {
	Generation uint64      `json:"generation"`
	Keys       []SecretKey `json:"keys"`
}

// SecretKey is one secretbox key: 32 random bytes.
type SecretKey struct {
	Name   string `json:"name"`
	Secret []byte `json:"secret"`
	// Write: this key encrypts (exactly one does); the others only
	// decrypt.
	Write bool `json:"write"`
}

// ErrRotation: a rotation step that does not follow from the state
// (ACTIVATE without a key added, RETIRE before ACTIVATE, ...).
var ErrRotation = errors.New("kubernetes pki: secrets key rotation")

// SecretsKeys loads the keys, making the first one on first use, and
// returns the store's revision as of the read: WatchSecretsKeys from it
// sees every later change.
func (p *PKI) SecretsKeys(ctx context.Context) (*SecretsKeys, int64, error) {
	k, _, rev, err := p.loadSecretsKeys(ctx)
	return k, rev, err
}

// loadSecretsKeys is SecretsKeys that also returns the keys'
// ModRevision, for a compare-and-swap.
func (p *PKI) loadSecretsKeys(ctx context.Context) (k *SecretsKeys, modRev, storeRev int64, err error) {
	for range 3 {
		k, modRev, storeRev, err := p.secretsKeys(ctx)
		if err != nil || k != nil {
			return k, modRev, storeRev, err
		}
		first, err := NewSecretsKeys()
		if err != nil {
			return nil, 0, 0, err
		}
		b, _ := json.Marshal(first)
		resp, err := p.kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(keySecretsEncryption), "=", 0)).
			Then(clientv3.OpPut(keySecretsEncryption, string(b))).Commit()
		if err != nil {
			return nil, 0, 0, fmt.Errorf("%w: storing the secrets encryption key: %w", ErrStore, err)
		}
		if resp.Succeeded {
			return first, resp.Header.Revision, resp.Header.Revision, nil
		}
	}
	return nil, 0, 0, fmt.Errorf("%w: the secrets encryption keys kept disappearing", ErrCorrupt)
}

func (p *PKI) secretsKeys(ctx context.Context) (k *SecretsKeys, modRev, storeRev int64, err error) {
	resp, err := p.kv.Get(ctx, keySecretsEncryption)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("%w: reading the secrets encryption keys: %w", ErrStore, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, 0, nil
	}
	k = &SecretsKeys{}
	if err := json.Unmarshal(resp.Kvs[0].Value, k); err != nil || k.check() != nil {
		return nil, 0, 0, fmt.Errorf("%w: the secrets encryption keys: %v", ErrCorrupt, errors.Join(err, k.check()))
	}
	return k, resp.Kvs[0].ModRevision, resp.Header.Revision, nil
}

// check: one write key, every key 32 bytes, names unique.
func (k *SecretsKeys) check() error {
	writers, names := 0, map[string]bool{}
	for _, s := range k.Keys {
		if len(s.Secret) != 32 || s.Name == "" || names[s.Name] {
			return errors.New("a key is malformed or named twice")
		}
		names[s.Name] = true
		if s.Write {
			writers++
		}
	}
	if writers != 1 {
		return fmt.Errorf("%d keys write, want one", writers)
	}
	return nil
}

// NewSecretsKeys is a cluster's first generation of keys: one random
// key, key-1, that writes.
func NewSecretsKeys() (*SecretsKeys, error) {
	first, err := newSecretKey(1)
	if err != nil {
		return nil, err
	}
	first.Write = true
	return &SecretsKeys{Generation: 1, Keys: []SecretKey{first}}, nil
}

func newSecretKey(n uint64) (SecretKey, error) {
	k := SecretKey{Name: fmt.Sprintf("key-%d", n), Secret: make([]byte, 32)}
	_, err := rand.Read(k.Secret)
	return k, err
}

// Rotation steps (SecretsKeys).
const (
	RotateAdd      = "add"
	RotateActivate = "activate"
	RotateRetire   = "retire"
)

// RotateSecretsKeys takes one step of a rotation (RotateAdd,
// RotateActivate, RotateRetire) and returns the keys after it. A step
// that was already taken is not taken again (a retried call is
// harmless); one out of order is ErrRotation.
func (p *PKI) RotateSecretsKeys(ctx context.Context, step string) (*SecretsKeys, error) {
	for {
		k, rev, _, err := p.loadSecretsKeys(ctx)
		if err != nil {
			return nil, err
		}
		changed, err := k.rotate(step)
		if err != nil || !changed {
			return k, err
		}
		k.Generation++
		b, _ := json.Marshal(k)
		resp, err := p.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(keySecretsEncryption), "=", rev)).
			Then(clientv3.OpPut(keySecretsEncryption, string(b))).Commit()
		if err != nil {
			return nil, fmt.Errorf("%w: storing the secrets encryption keys: %w", ErrStore, err)
		}
		if resp.Succeeded {
			return k, nil
		}
	}
}

// rotate applies step to k and reports whether it changed anything.
func (k *SecretsKeys) rotate(step string) (bool, error) {
	newest := k.Keys[len(k.Keys)-1]
	switch step {
	case RotateAdd:
		if !newest.Write {
			return false, nil // added, not active yet
		}
		key, err := newSecretKey(k.Generation + 1)
		if err != nil {
			return false, err
		}
		k.Keys = append(k.Keys, key)
	case RotateActivate:
		if newest.Write {
			if len(k.Keys) > 1 {
				return false, nil // activated already
			}
			return false, fmt.Errorf("%w: no new key to activate (add one first)", ErrRotation)
		}
		for i := range k.Keys {
			k.Keys[i].Write = i == len(k.Keys)-1
		}
	case RotateRetire:
		if !newest.Write {
			return false, fmt.Errorf("%w: the newest key is not active yet: activate it (and rewrite the Secrets) first", ErrRotation)
		}
		if len(k.Keys) == 1 {
			return false, nil
		}
		k.Keys = []SecretKey{newest}
	default:
		return false, fmt.Errorf("%w: unknown step %q", ErrRotation, step)
	}
	return true, nil
}

// SetSecretsLoaded records that node's API server runs with generation.
func (p *PKI) SetSecretsLoaded(ctx context.Context, nodeID string, generation uint64) error {
	if _, err := p.kv.Put(ctx, keySecretsLoadedPrefix+nodeID, fmt.Sprint(generation)); err != nil {
		return fmt.Errorf("%w: %w", ErrStore, err)
	}
	return nil
}

// SecretsLoaded is the generation each controller's API server runs
// with, by node ID.
func (p *PKI) SecretsLoaded(ctx context.Context) (map[string]uint64, error) {
	resp, err := p.kv.Get(ctx, keySecretsLoadedPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStore, err)
	}
	out := map[string]uint64{}
	for _, kv := range resp.Kvs {
		var g uint64
		if _, err := fmt.Sscan(string(kv.Value), &g); err == nil {
			out[string(kv.Key[len(keySecretsLoadedPrefix):])] = g
		}
	}
	return out, nil
}

// WatchSecretsKeys returns a channel closed once the keys change after
// rev (the revision SecretsKeys returned), or the watch fails (not for
// a compaction of rev: see client.FollowKey).
func (p *PKI) WatchSecretsKeys(ctx context.Context, w clientv3.Watcher, rev int64) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		client.FollowKey(ctx, p.kv, w, keySecretsEncryption, rev, true, func(*mvccpb.KeyValue) error { return errKeysChanged })
	}()
	return ch
}

// errKeysChanged ends WatchSecretsKeys' FollowKey at the first change.
var errKeysChanged = errors.New("the secrets encryption keys changed")

// EncryptionConfiguration is the API server's --encryption-provider-config
// for k: Secrets written with the write key, read with any of the keys,
// and plaintext still read (a cluster from before this existed) but
// never written.
func (k *SecretsKeys) EncryptionConfiguration() []byte {
	keys := slices.Clone(k.Keys)
	slices.SortStableFunc(keys, func(a, b SecretKey) int {
		switch {
		case a.Write && !b.Write:
			return -1
		case b.Write && !a.Write:
			return 1
		}
		return 0
	})
	var list []map[string]string
	for _, s := range keys {
		list = append(list, map[string]string{"name": s.Name, "secret": base64.StdEncoding.EncodeToString(s.Secret)})
	}
	b, _ := json.MarshalIndent(map[string]any{
		"apiVersion": "apiserver.config.k8s.io/v1",
		"kind":       "EncryptionConfiguration",
		"resources": []any{map[string]any{
			"resources": []string{"secrets"},
			"providers": []any{map[string]any{"secretbox": map[string]any{"keys": list}}, map[string]any{"identity": map[string]any{}}},
		}},
	}, "", "  ")
	return b
}
