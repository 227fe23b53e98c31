package pki

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Keys in the curator's etcd namespace. The Kubernetes CA keeps the keys
// the curator used for it before this package existed.
const (
	keyCACert               = "/kubernetes-ca/ca.pem"
	keyCAKey                = "/kubernetes-ca/ca-key.pem"
	keyFrontProxyCACert     = "/kubernetes-ca/front-proxy-ca.pem"
	keyFrontProxyCAKey      = "/kubernetes-ca/front-proxy-ca-key.pem"
	keyServiceAccountKey    = "/kubernetes-ca/service-account-key.pem" // PKCS#8 PEM
	keyKubeletServingCACert = "/kubernetes-ca/kubelet-serving-ca.pem"
	keyKubeletServingCAKey  = "/kubernetes-ca/kubelet-serving-ca-key.pem"
)

// Lifetimes (see the package documentation).
const (
	// CAValidity is the lifetime of a new CA.
	CAValidity = 10 * 365 * 24 * time.Hour
	// ControllerValidity is the lifetime of the certificates Controller
	// issues; the control plane gets new ones at every start.
	ControllerValidity = 365 * 24 * time.Hour
	// KubeletValidity is the lifetime of the kubelet's certificates: the
	// worker renews them at RenewAt.
	KubeletValidity = 30 * 24 * time.Hour
	// MaxAdminValidity bounds what Admin accepts.
	MaxAdminValidity = 24 * time.Hour
)

// Errors, each wrapped with details; decide with errors.Is.
var (
	// ErrStore: etcd could not be read or written. Retrying may help.
	ErrStore = errors.New("kubernetes pki: etcd")
	// ErrCorrupt: what etcd holds is incomplete or cannot be parsed.
	ErrCorrupt = errors.New("kubernetes pki: the PKI stored in etcd is damaged")
	// ErrInvalidArgument: a public key, node ID, address, name or
	// validity handed in is refused.
	ErrInvalidArgument = errors.New("kubernetes pki: invalid argument")
)

// PKI is the Kubernetes PKI kept in one etcd namespace. It holds no state
// of its own: every call reads etcd (and creates what is missing), so
// PKIs on several nodes over the same etcd agree.
type PKI struct {
	kv clientv3.KV
}

// New returns the PKI stored in kv: the curator's etcd namespace
// (consensus Status.CuratorClient), which the curators and the
// controller nodes — always consensus members — can reach.
func New(kv clientv3.KV) *PKI {
	return &PKI{kv: kv}
}

// secret is material made once per cluster and kept under keys, all
// written in one transaction.
type secret struct {
	what     string
	keys     []string
	generate func() ([][]byte, error)
}

var (
	secretCA = secret{"the Kubernetes CA", []string{keyCACert, keyCAKey},
		func() ([][]byte, error) { return generateAuthority("Plinth Kubernetes CA") }}
	secretFrontProxyCA = secret{"the front-proxy CA", []string{keyFrontProxyCACert, keyFrontProxyCAKey},
		func() ([][]byte, error) { return generateAuthority("Plinth Kubernetes front-proxy CA") }}
	// The kubelets' serving certificates come from a CA of their own:
	// the API servers trust it for kubelets only, and nothing else trusts
	// it, so a node's serving certificate cannot pass for an API server.
	secretKubeletServingCA = secret{"the kubelet serving CA", []string{keyKubeletServingCACert, keyKubeletServingCAKey},
		func() ([][]byte, error) { return generateAuthority("Plinth kubelet serving CA") }}
	secretServiceAccount = secret{"the service-account key", []string{keyServiceAccountKey},
		func() ([][]byte, error) {
			k, err := newKey()
			if err != nil {
				return nil, err
			}
			b, err := privateKeyPEM(k)
			return [][]byte{b}, err
		}}
)

// load returns the values of s's keys, creating them first if none
// exists: the write is conditioned on every key still being absent, so of
// two concurrent creators the first to commit wins and the other reads
// what it wrote.
func (p *PKI) load(ctx context.Context, s secret) ([][]byte, error) {
	for range 3 {
		vals, err := p.get(ctx, s)
		if err != nil || vals != nil {
			return vals, err
		}
		if vals, err = s.generate(); err != nil {
			return nil, err
		}
		var cmps []clientv3.Cmp
		var puts []clientv3.Op
		for i, k := range s.keys {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
			puts = append(puts, clientv3.OpPut(k, string(vals[i])))
		}
		resp, err := p.kv.Txn(ctx).If(cmps...).Then(puts...).Commit()
		if err != nil {
			return nil, fmt.Errorf("%w: storing %s: %w", ErrStore, s.what, err)
		}
		if resp.Succeeded {
			return vals, nil
		}
	}
	// Only a concurrent deletion makes the read after a lost race empty.
	return nil, fmt.Errorf("%w: %s kept disappearing while it was being created", ErrCorrupt, s.what)
}

// get reads s's keys in one transaction: nil if none exists.
func (p *PKI) get(ctx context.Context, s secret) ([][]byte, error) {
	var ops []clientv3.Op
	for _, k := range s.keys {
		ops = append(ops, clientv3.OpGet(k))
	}
	resp, err := p.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("%w: reading %s: %w", ErrStore, s.what, err)
	}
	vals := make([][]byte, len(s.keys))
	found := 0
	for i, r := range resp.Responses {
		if kvs := r.GetResponseRange().Kvs; len(kvs) == 1 {
			vals[i] = kvs[0].Value
			found++
		}
	}
	switch found {
	case 0:
		return nil, nil
	case len(s.keys):
		return vals, nil
	}
	return nil, fmt.Errorf("%w: %s is incomplete (%d of its %d keys %v)", ErrCorrupt, s.what, found, len(s.keys), s.keys)
}

// authority loads (creating on first use) the CA of s.
func (p *PKI) authority(ctx context.Context, s secret) (*authority, error) {
	vals, err := p.load(ctx, s)
	if err != nil {
		return nil, err
	}
	a, err := loadAuthority(vals[0], vals[1])
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, s.what, err)
	}
	return a, nil
}

// serviceAccountKey loads (creating on first use) the service-account
// signing key and returns it as stored (PKCS#8 PEM) and parsed.
func (p *PKI) serviceAccountKey(ctx context.Context) ([]byte, *ecdsa.PrivateKey, error) {
	vals, err := p.load(ctx, secretServiceAccount)
	if err != nil {
		return nil, nil, err
	}
	k, err := parsePrivateKeyPEM(vals[0])
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, secretServiceAccount.what, err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		// The API server signs tokens with RSA or ECDSA keys only.
		return nil, nil, fmt.Errorf("%w: %s is %T, want ECDSA", ErrCorrupt, secretServiceAccount.what, k)
	}
	return vals[0], ek, nil
}

// RenewAt is when certificates issued at issued and valid until notAfter
// are renewed: at two thirds of their life (as the kubelet's own rotation
// does), which leaves a third of it for retries while the issuer is
// unreachable.
func RenewAt(issued, notAfter time.Time) time.Time {
	return issued.Add(notAfter.Sub(issued) * 2 / 3)
}
