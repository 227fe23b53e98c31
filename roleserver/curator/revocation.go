package curator

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/consensus/client"
	"plinth.dev/plinth/roleserver/identity"
)

// Certificates the cluster CA issued, and the cluster CRL.
//
//	/certs/<node ID>/node/<serial hex>      a node certificate (CommitNode, Bootstrap)
//	/certs/<node ID>/curator/<serial hex>   a curator certificate (a curator's own, at Run)
//	/cluster/crl                            DER CRL of the cluster CA, number += 1 per change
//
// Every certificate is recorded before it leaves the curator, so that
// revoking a node can list them all: decommissioning revokes every
// certificate of the node, removing the ConsensusMember role revokes its
// curator certificates. Nodes get the CRL with every heartbeat answer
// (HeartbeatResponse.crl) and check it in every TLS handshake.
const (
	prefixCerts = "/certs/"
	keyCRL      = "/cluster/crl"
)

// Kinds of recorded certificates.
const (
	certNode    = "node"
	certCurator = "curator"
)

func certKey(id, kind string, serial *big.Int) string {
	return prefixCerts + id + "/" + kind + "/" + serial.Text(16)
}

// recordCert is the operation that records an issued certificate.
func recordCert(id, kind string, cert *x509.Certificate) clientv3.Op {
	return clientv3.OpPut(certKey(id, kind, cert.SerialNumber), "")
}

// issueRecorded issues a certificate with issue and records it, before
// anyone can see it.
func issueRecorded(ctx context.Context, kv clientv3.KV, id, kind string, issue func() (*x509.Certificate, error)) (*x509.Certificate, error) {
	cert, err := issue()
	if err != nil {
		return nil, internalErr("issuing "+kind+" certificate", err)
	}
	if _, err := kv.Txn(ctx).Then(recordCert(id, kind, cert)).Commit(); err != nil {
		return nil, etcdErr("recording "+kind+" certificate", err)
	}
	return cert, nil
}

// issuedSerials lists the serials recorded for a node, of the given kinds
// (all kinds if none given).
func issuedSerials(ctx context.Context, kv clientv3.KV, id string, kinds ...string) ([]*big.Int, error) {
	prefix := prefixCerts + id + "/"
	resp, err := kv.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, etcdErr("listing certificates of "+id, err)
	}
	var out []*big.Int
	for _, k := range resp.Kvs {
		kind, hex, ok := strings.Cut(strings.TrimPrefix(string(k.Key), prefix), "/")
		if !ok || (len(kinds) > 0 && !contains(kinds, kind)) {
			continue
		}
		s, ok := new(big.Int).SetString(hex, 16)
		if !ok {
			return nil, internalErr("certificate record", fmt.Errorf("bad serial in %q", k.Key))
		}
		out = append(out, s)
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// loadCRL reads the cluster CRL and its ModRevision (nil, 0: none yet).
func loadCRL(ctx context.Context, kv clientv3.KV, ca *x509.Certificate) (*pki.CRL, int64, error) {
	crl, rev, _, err := loadCRLAt(ctx, kv, ca)
	return crl, rev, err
}

// loadCRLAt is loadCRL that also returns the store's revision as of the
// read, where a watch of the CRL starts (see getValueAt).
func loadCRLAt(ctx context.Context, kv clientv3.KV, ca *x509.Certificate) (crl *pki.CRL, modRev, storeRev int64, err error) {
	v, modRev, storeRev, err := getValueAt(ctx, kv, keyCRL)
	if err != nil {
		return nil, 0, 0, etcdErr("reading the cluster CRL", err)
	}
	if v == nil {
		return nil, 0, storeRev, nil
	}
	if crl, err = pki.ParseCRL(v, ca); err != nil {
		return nil, 0, 0, internalErr("cluster CRL in etcd", err)
	}
	return crl, modRev, storeRev, nil
}

// revoke adds the recorded certificates of node id (of the given kinds,
// all if none) to the cluster CRL. Idempotent: with nothing new to
// revoke, the CRL stays as it is.
func revoke(ctx context.Context, kv clientv3.KV, id string, kinds ...string) error {
	ca, err := loadCA(ctx, kv)
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 20; attempt++ {
		serials, err := issuedSerials(ctx, kv, id, kinds...)
		if err != nil {
			return err
		}
		crl, rev, err := loadCRL(ctx, kv, ca.Certificate)
		if err != nil {
			return err
		}
		var fresh []*big.Int
		for _, s := range serials {
			if !crl.IsRevoked(s) {
				fresh = append(fresh, s)
			}
		}
		if len(fresh) == 0 && crl != nil {
			return nil
		}
		next, err := ca.Revoke(crl, fresh...)
		if err != nil {
			return internalErr("signing the cluster CRL", err)
		}
		resp, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(keyCRL), "=", rev)).
			Then(clientv3.OpPut(keyCRL, string(next.Raw))).Commit()
		if err != nil {
			return etcdErr("writing the cluster CRL", err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	return status.Errorf(codes.Aborted, "the cluster CRL kept changing while revoking %s; retry", id)
}

// curatorCredentials issues (and records) this curator's own server
// certificate, so that clients that need a curator accept it.
func (s *Service) curatorCredentials(ctx context.Context, kv clientv3.KV) (*identity.Credentials, error) {
	ca, err := loadCA(ctx, kv)
	if err != nil {
		return nil, err
	}
	if !ca.Certificate.Equal(s.cfg.Credentials.CA) {
		return nil, errors.New("curator: the cluster CA in etcd is not the CA of this node's credentials")
	}
	pub := s.cfg.Credentials.PrivateKey.Public().(ed25519.PublicKey)
	cert, err := issueRecorded(ctx, kv, s.nodeID, certCurator, func() (*x509.Certificate, error) {
		return identity.IssueCuratorCertificate(ca, pub)
	})
	if err != nil {
		return nil, err
	}
	return s.cfg.Credentials.WithCertificate(cert)
}

// followCRL keeps trust's CRL equal to the one in etcd until ctx ends
// (an empty one is created if the cluster has none yet).
func (s *Service) followCRL(ctx context.Context, kv client.Namespaced, trust *identity.Trust, log *slog.Logger) {
	for ctx.Err() == nil {
		if err := s.followCRLOnce(ctx, kv, trust, log); err != nil && ctx.Err() == nil {
			log.Warn("following the cluster CRL", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

func (s *Service) followCRLOnce(ctx context.Context, kv client.Namespaced, trust *identity.Trust, log *slog.Logger) error {
	crl, _, rev, err := loadCRLAt(ctx, kv, trust.CA)
	if err != nil {
		return err
	}
	if crl == nil {
		// Clusters start with an empty CRL (Bootstrap); this only makes
		// one for a cluster whose state predates the CRL.
		ca, err := loadCA(ctx, kv)
		if err != nil {
			return err
		}
		empty, err := ca.NewCRL()
		if err != nil {
			return err
		}
		if _, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(keyCRL), "=", 0)).
			Then(clientv3.OpPut(keyCRL, string(empty.Raw))).Commit(); err != nil {
			return etcdErr("creating the cluster CRL", err)
		}
		return nil
	}
	s.installCRL(crl, trust, log)
	return client.FollowKey(ctx, kv, kv, keyCRL, rev, true, func(v *mvccpb.KeyValue) error {
		if v == nil {
			return nil
		}
		crl, err := pki.ParseCRL(v.Value, trust.CA)
		if err != nil {
			return err
		}
		s.installCRL(crl, trust, log)
		return nil
	})
}

// installCRL makes crl the one this curator checks and hands out.
func (s *Service) installCRL(crl *pki.CRL, trust *identity.Trust, log *slog.Logger) {
	s.mu.Lock()
	s.crl = crl
	s.mu.Unlock()
	if _, err := trust.SetCRL(crl.Raw); err == nil {
		log.Info("cluster CRL", "number", crl.List.Number.String(), "revoked", len(crl.List.RevokedCertificateEntries))
	} else if !errors.Is(err, identity.ErrStaleCRL) {
		log.Warn("cluster CRL refused", "err", err)
	}
}

// currentCRL is the CRL this curator hands out (nil until read).
func (s *Service) currentCRL() *pki.CRL {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.crl
}
