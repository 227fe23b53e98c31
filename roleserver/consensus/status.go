package consensus

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"slices"
	"strconv"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/consensus/client"
)

// Status of the consensus service. It represents either a running consensus
// service to which a client can connect and on which management can be
// performed, or a stopped service.
type Status struct {
	running bool
	be      *backend
}

// FilterRunning makes Watcher.Get wait for a running consensus service.
var FilterRunning = event.Filter(func(st *Status) bool {
	return st.Running()
})

var errNotRunning = errors.New("consensus: service not running")

// Errors of AddNode that say "not now, retry later", for callers that
// queue the addition instead of failing (errors.Is).
var (
	// ErrLearnerInProgress: another learner is still catching up, and
	// etcd admits one learner at a time.
	ErrLearnerInProgress = errors.New("consensus: another learner is still catching up")
	// ErrNotYetSafe: etcd adds members only once the member asked has
	// been connected to a quorum for a while (e.g. just after it started
	// or a peer came back).
	ErrNotYetSafe = errors.New("consensus: this member has not been connected to a quorum long enough to add a member")
)

// Running returns true if this status represents a running consensus
// service which can be connected to or managed. These calls are not
// guaranteed to succeed (as the server might have stopped in the meantime),
// but the caller can use this value as a hint to whether attempts to access
// the consensus service should be done.
//
// A Status stays that of one run of the member: once that run ended (its
// in-process clients are closed) it is no longer running, even if the
// member was started again. Get a new one from Service.Watch then.
func (s *Status) Running() bool {
	return s != nil && s.running && !s.be.closed()
}

// ClusterClient returns an etcd management API client, for use by downstream
// clients that wish to perform maintenance operations on the etcd cluster
// (eg. list/modify nodes, promote learners, ...). It is nil when the service
// is not running.
func (s *Status) ClusterClient() clientv3.Cluster {
	if !s.Running() {
		return nil
	}
	return s.be.Cluster
}

// CuratorClient returns a namespaced etcd client for use by the Curator.
// The caller closes it when done; that does not affect other clients.
func (s *Status) CuratorClient() (client.Namespaced, error) {
	return s.namespaced(curatorPrefix)
}

// KubernetesClient returns a namespaced etcd client for use by Kubernetes.
// The caller closes it when done; that does not affect other clients.
func (s *Status) KubernetesClient() (client.Namespaced, error) {
	return s.namespaced(kubernetesPrefix)
}

func (s *Status) namespaced(prefix string) (client.Namespaced, error) {
	if !s.Running() {
		return nil, errNotRunning
	}
	w, l := s.be.newWatcher(), s.be.newLease()
	c, err := client.New(s.be.KV, w, l, prefix)
	if err != nil {
		w.Close()
		l.Close()
		return nil, err
	}
	return c, nil
}

// AddNodeOption can be passed to AddNode to influence the behaviour of the
// function (see PeerAddress).
type AddNodeOption struct {
	// peerHost and peerPort replace the new member's default peer address
	// (its node ID and the default peer port).
	peerHost string
	peerPort int
}

// PeerAddress makes AddNode register the new member at https://host:port
// instead of https://<node ID>:7834: for a member whose peer listener is
// not where the cluster's name resolution and the default port put it
// (Tuning.PeerAdvertise), such as several members on one host. An empty
// host or a zero port keeps that part of the default.
func PeerAddress(host string, port int) *AddNodeOption {
	return &AddNodeOption{peerHost: host, peerPort: port}
}

// AddNode creates a new consensus member corresponding to a given node ID if
// one does not yet exist. The member will at first be marked as a Learner,
// ensuring it does not take part in quorum until it has finished catching up
// to the state of the etcd store. As it does, the autopromoter will turn it
// into a 'full' node and it will start taking part in the quorum and be able
// to perform all etcd operations.
//
// For a node that already is a member with this key, AddNode returns the
// same certificate and the current membership again.
func (s *Status) AddNode(ctx context.Context, nodeID string, pk ed25519.PublicKey, opts ...*AddNodeOption) (*JoinCluster, error) {
	if !s.Running() {
		return nil, errNotRunning
	}
	if nodeID == "" || len(pk) != ed25519.PublicKeySize {
		return nil, errors.New("consensus: AddNode needs a node ID and an ed25519 public key")
	}
	host, port := nodeID, defaultPeerPort
	for _, o := range opts {
		if o == nil {
			continue
		}
		if o.peerHost != "" {
			host = o.peerHost
		}
		if o.peerPort != 0 {
			port = o.peerPort
		}
	}
	peerURL := "https://" + net.JoinHostPort(host, strconv.Itoa(port))

	ca, err := s.loadCA(ctx)
	if err != nil {
		return nil, err
	}
	rec, err := s.memberRecord(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	ml, err := s.be.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("consensus: listing members: %w", err)
	}

	var cert *x509.Certificate
	var memberID uint64
	members := ml.Members
	if m := findMember(members, nodeID, rec.peerURL, peerURL); m != nil {
		if rec.cert == nil {
			return nil, fmt.Errorf("consensus: %s is already a member but has no certificate on record; remove it first", nodeID)
		}
		if !hasKey(rec.cert, pk) {
			return nil, fmt.Errorf("consensus: %s is already a member with another key; remove it first", nodeID)
		}
		cert, memberID = rec.cert, m.ID
	} else {
		crl, _, err := s.loadCRL(ctx, ca.Certificate)
		if err != nil {
			return nil, err
		}
		if rec.cert != nil && hasKey(rec.cert, pk) && !crl.IsRevoked(rec.cert.SerialNumber) {
			// A previous AddNode got as far as issuing this, but etcd did
			// not add the member (typically: not yet safe, retry later).
			// Reusing it keeps retries from growing the CRL.
			cert = rec.cert
		} else {
			if rec.cert != nil {
				// Issued for another key: nobody may use it any more.
				if err := s.revoke(ctx, ca, nodeID, rec.cert.SerialNumber, false); err != nil {
					return nil, err
				}
			}
			if cert, err = issueMemberCertificate(ca, nodeID, pk); err != nil {
				return nil, err
			}
		}
		// Recorded before the member exists so that RemoveNode can always
		// find the serial to revoke.
		if _, err := s.be.Txn(ctx).Then(
			clientv3.OpPut(memberCertKey(nodeID), string(pki.CertificatePEM(cert))),
			clientv3.OpPut(memberPeerKey(nodeID), peerURL),
		).Commit(); err != nil {
			return nil, fmt.Errorf("consensus: recording certificate of %s: %w", nodeID, err)
		}
		resp, err := s.be.MemberAddAsLearner(ctx, []string{peerURL})
		switch {
		case errors.Is(err, rpctypes.ErrUnhealthy), errors.Is(err, rpctypes.ErrMemberNotEnoughStarted):
			return nil, fmt.Errorf("not adding %s yet (retry later): %w (%w)", nodeID, ErrNotYetSafe, err)
		case errors.Is(err, rpctypes.ErrTooManyLearners):
			return nil, fmt.Errorf("not adding %s yet (retry later): %w (%w)", nodeID, ErrLearnerInProgress, err)
		case err != nil:
			return nil, fmt.Errorf("consensus: adding %s as learner at %s: %w", nodeID, peerURL, err)
		}
		memberID, members = resp.Member.ID, resp.Members
	}

	crl, _, err := s.loadCRL(ctx, ca.Certificate)
	if err != nil {
		return nil, err
	}
	jc := &JoinCluster{CACertificate: ca.Certificate, NodeCertificate: cert, InitialCRL: crl}
	for _, m := range members {
		if m.ID == memberID || len(m.PeerURLs) == 0 {
			continue
		}
		jc.ExistingNodes = append(jc.ExistingNodes, ExistingNode{Name: GetEtcdMemberNodeId(m), URL: m.PeerURLs[0]})
	}
	return jc, nil
}

// RemoveNode removes the etcd member with the given node ID, if it is
// currently a member, and revokes its certificate. Etcd fails this
// operation if it is not safe to perform.
func (s *Status) RemoveNode(ctx context.Context, nodeID string) error {
	if !s.Running() {
		return errNotRunning
	}
	ca, err := s.loadCA(ctx)
	if err != nil {
		return err
	}
	rec, err := s.memberRecord(ctx, nodeID)
	if err != nil {
		return err
	}
	ml, err := s.be.MemberList(ctx)
	if err != nil {
		return fmt.Errorf("consensus: listing members: %w", err)
	}
	if m := findMember(ml.Members, nodeID, rec.peerURL); m != nil {
		if _, err := s.be.MemberRemove(ctx, m.ID); err != nil {
			switch {
			case errors.Is(err, rpctypes.ErrUnhealthy), errors.Is(err, rpctypes.ErrMemberNotEnoughStarted):
				return fmt.Errorf("consensus: refusing to remove %s: without it the cluster would lose quorum, as too few other members are up (%w)", nodeID, err)
			case errors.Is(err, rpctypes.ErrMemberNotFound):
				// Someone else removed it first; still revoke below.
			default:
				return fmt.Errorf("consensus: removing %s: %w", nodeID, err)
			}
		}
	}
	if rec.cert == nil {
		return nil
	}
	return s.revoke(ctx, ca, nodeID, rec.cert.SerialNumber, true)
}

func hasKey(cert *x509.Certificate, pk ed25519.PublicKey) bool {
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	return ok && pub.Equal(pk)
}

// findMember finds a member by name, or, before it has started and
// published its name, by its peer URL.
func findMember(members []*etcdserverpb.Member, nodeID string, peerURLs ...string) *etcdserverpb.Member {
	for _, m := range members {
		if m.Name == nodeID {
			return m
		}
		if m.Name != "" {
			continue
		}
		if GetEtcdMemberNodeId(m) == nodeID {
			return m
		}
		for _, u := range m.PeerURLs {
			if u != "" && slices.Contains(peerURLs, u) {
				return m
			}
		}
	}
	return nil
}

// GetEtcdMemberNodeId returns the node ID of an etcd member. It works even
// for members which have not started, where member.Name is empty: their
// peer URL's host is the node ID (unless AddNode was told another address).
func GetEtcdMemberNodeId(member *etcdserverpb.Member) string {
	if member == nil {
		return ""
	}
	if member.Name != "" {
		return member.Name
	}
	for _, s := range member.PeerURLs {
		u, err := url.Parse(s)
		if err != nil {
			continue
		}
		if host := u.Hostname(); host != "" {
			return host
		}
	}
	return ""
}

func (s *Status) loadCA(ctx context.Context) (*pki.CA, error) {
	resp, err := s.be.Txn(ctx).Then(clientv3.OpGet(keyCACert), clientv3.OpGet(keyCAKey)).Commit()
	if err != nil {
		return nil, fmt.Errorf("consensus: reading CA: %w", err)
	}
	certKVs := resp.Responses[0].GetResponseRange().Kvs
	keyKVs := resp.Responses[1].GetResponseRange().Kvs
	if len(certKVs) != 1 || len(keyKVs) != 1 {
		return nil, errors.New("consensus: no CA in etcd (not a cluster bootstrapped by this package?)")
	}
	ca, err := pki.LoadCA(certKVs[0].Value, keyKVs[0].Value)
	if err != nil {
		return nil, fmt.Errorf("consensus: loading CA: %w", err)
	}
	return ca, nil
}

// loadCRL returns the CRL and its ModRevision for a compare-and-swap.
func (s *Status) loadCRL(ctx context.Context, ca *x509.Certificate) (*pki.CRL, int64, error) {
	resp, err := s.be.Get(ctx, keyCRL)
	if err != nil {
		return nil, 0, fmt.Errorf("consensus: reading CRL: %w", err)
	}
	if len(resp.Kvs) != 1 {
		return nil, 0, errors.New("consensus: no CRL in etcd")
	}
	crl, err := pki.ParseCRL(resp.Kvs[0].Value, ca)
	if err != nil {
		return nil, 0, fmt.Errorf("consensus: CRL in etcd: %w", err)
	}
	return crl, resp.Kvs[0].ModRevision, nil
}

type memberRecord struct {
	cert    *x509.Certificate
	peerURL string
}

func (s *Status) memberRecord(ctx context.Context, nodeID string) (memberRecord, error) {
	var rec memberRecord
	resp, err := s.be.Txn(ctx).Then(clientv3.OpGet(memberCertKey(nodeID)), clientv3.OpGet(memberPeerKey(nodeID))).Commit()
	if err != nil {
		return rec, fmt.Errorf("consensus: reading record of %s: %w", nodeID, err)
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		if rec.cert, err = pki.ParseCertificatePEM(kvs[0].Value); err != nil {
			return rec, fmt.Errorf("consensus: certificate of %s: %w", nodeID, err)
		}
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
		rec.peerURL = string(kvs[0].Value)
	}
	return rec, nil
}

// revoke adds serial to the CRL in etcd (every member's CRL watcher then
// rewrites its CRL file) and, if forget, drops the member's record in the
// same transaction, so that a later AddNode issues a fresh certificate.
func (s *Status) revoke(ctx context.Context, ca *pki.CA, nodeID string, serial *big.Int, forget bool) error {
	// The CRL is read, extended and written back only if nobody changed it
	// meanwhile: two concurrent revocations must not lose one another.
	for attempt := 0; attempt < 10; attempt++ {
		crl, rev, err := s.loadCRL(ctx, ca.Certificate)
		if err != nil {
			return err
		}
		var ops []clientv3.Op
		if !crl.IsRevoked(serial) {
			next, err := ca.Revoke(crl, serial)
			if err != nil {
				return err
			}
			ops = append(ops, clientv3.OpPut(keyCRL, string(next.Raw)))
		}
		if forget {
			ops = append(ops, clientv3.OpDelete(memberCertKey(nodeID)), clientv3.OpDelete(memberPeerKey(nodeID)))
		}
		if len(ops) == 0 {
			return nil
		}
		resp, err := s.be.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(keyCRL), "=", rev)).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("consensus: revoking certificate of %s: %w", nodeID, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("consensus: revoking certificate of %s: CRL kept changing", nodeID)
}

// ServiceHandle is implemented by Service and should be the type expected by
// other code which relies on a Consensus instance. Ie., it's the downstream
// API for a Consensus Service.
type ServiceHandle interface {
	// Watch returns a Event Value compatible Watcher for accessing the State of
	// the consensus Service in a safe manner.
	Watch() event.Watcher[*Status]
}

var _ ServiceHandle = (*Service)(nil)
