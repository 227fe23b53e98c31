package curator

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/consensus/client"
	"plinth.dev/plinth/roleserver/identity"
)

// BootstrapRequest is what the first node of a new cluster knows.
type BootstrapRequest struct {
	NodePublicKey, JoinPublicKey, OwnerPublicKey ed25519.PublicKey
	Configuration                                *clusterpb.ClusterConfiguration
	TPMUsage                                     clusterpb.NodeTPMUsage
	Status                                       *clusterpb.NodeStatus
	// Kubernetes roles of the first node (it is always a consensus
	// member).
	KubernetesController, KubernetesWorker bool
}

// FirstNodeRoles are the roles Bootstrap gives the first node.
func FirstNodeRoles(controller, worker bool) *clusterpb.NodeRoles {
	// No join data: this node's etcd member already exists.
	r := &clusterpb.NodeRoles{ConsensusMember: &clusterpb.NodeRoles_ConsensusMember{}}
	if controller {
		r.KubernetesController = &clusterpb.NodeRoles_KubernetesController{}
	}
	if worker {
		r.KubernetesWorker = &clusterpb.NodeRoles_KubernetesWorker{}
	}
	return r
}

// Bootstrap writes the initial cluster state (cluster CA generated here,
// key kept in etcd; register ticket; owner key; configuration; first node
// UP with roles ConsensusMember and the Kubernetes roles asked for) and returns the
// first node's certificate. Idempotent for the same node key: a repeated
// call issues a new certificate from the existing CA and changes nothing
// else. A cluster bootstrapped by another node is an error.
//
// The first node gets no cluster unlock key: its data volume is sealed
// locally only, so that the cluster can cold-start from it.
func Bootstrap(ctx context.Context, cl client.Namespaced, req BootstrapRequest) (ca, nodeCert *x509.Certificate, err error) {
	for name, k := range map[string]ed25519.PublicKey{"node": req.NodePublicKey, "join": req.JoinPublicKey, "owner": req.OwnerPublicKey} {
		if len(k) != ed25519.PublicKeySize {
			return nil, nil, fmt.Errorf("curator: bootstrap: %s public key has %d bytes, want %d", name, len(k), ed25519.PublicKeySize)
		}
	}
	if err := pki.CheckEd25519PublicKey(req.OwnerPublicKey); err != nil {
		return nil, nil, fmt.Errorf("curator: bootstrap: owner public key refused: %w", err)
	}
	if req.OwnerPublicKey.Equal(req.NodePublicKey) || req.OwnerPublicKey.Equal(req.JoinPublicKey) {
		return nil, nil, errors.New("curator: bootstrap: the owner key must not be a node's key")
	}
	cfg := req.Configuration
	if cfg == nil {
		cfg = &clusterpb.ClusterConfiguration{}
	}
	if err := checkTPMPolicy(cfg, req.TPMUsage); err != nil {
		return nil, nil, fmt.Errorf("curator: bootstrap: first node refused: %w", err)
	}
	id := identity.NodeID(req.NodePublicKey)

	if existing, err := bootstrapped(ctx, cl, id); err != nil || existing != nil {
		if err != nil {
			return nil, nil, err
		}
		cert, err := issueRecorded(ctx, cl, id, certNode, func() (*x509.Certificate, error) {
			return identity.IssueNodeCertificate(existing, req.NodePublicKey)
		})
		if err != nil {
			return nil, nil, fmt.Errorf("curator: bootstrap: %w", err)
		}
		return existing.Certificate, cert, nil
	}

	newCA, err := pki.NewCA("Plinth cluster CA", 0)
	if err != nil {
		return nil, nil, err
	}
	caPEM, keyPEM, err := newCA.MarshalPEM()
	if err != nil {
		return nil, nil, err
	}
	ticket, err := newTicket()
	if err != nil {
		return nil, nil, err
	}
	crl, err := newCA.NewCRL()
	if err != nil {
		return nil, nil, err
	}
	cert, err := identity.IssueNodeCertificate(newCA, req.NodePublicKey)
	if err != nil {
		return nil, nil, err
	}
	cfgBytes, err := proto.Marshal(cfg)
	if err != nil {
		return nil, nil, err
	}
	node, err := marshalNode(&clusterpb.Node{
		Id:        id,
		PublicKey: req.NodePublicKey,
		State:     clusterpb.NodeState_NODE_STATE_UP,
		Roles:     FirstNodeRoles(req.KubernetesController, req.KubernetesWorker),
		Status:    req.Status,
		TpmUsage:  req.TPMUsage,
	})
	if err != nil {
		return nil, nil, err
	}
	resp, err := cl.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(keyCACert), "=", 0)).Then(
		clientv3.OpPut(keyCACert, string(caPEM)),
		clientv3.OpPut(keyCAKey, string(keyPEM)),
		clientv3.OpPut(keyOwnerKey, string(req.OwnerPublicKey)),
		clientv3.OpPut(keyTicket, string(ticket)),
		clientv3.OpPut(keyConfiguration, string(cfgBytes)),
		clientv3.OpPut(nodeKey(id), node),
		clientv3.OpPut(joinKeyKey(req.JoinPublicKey), id),
		clientv3.OpPut(keyCRL, string(crl.Raw)),
		recordCert(id, certNode, cert),
	).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("curator: bootstrap: writing cluster state: %w", err)
	}
	if !resp.Succeeded {
		// Someone (a concurrent attempt) got there first.
		return Bootstrap(ctx, cl, req)
	}
	return newCA.Certificate, cert, nil
}

// bootstrapped returns the CA of an existing cluster bootstrapped by node
// id, nil if there is no cluster yet, and an error for another node's.
func bootstrapped(ctx context.Context, cl client.Namespaced, id string) (*pki.CA, error) {
	v, _, err := getValue(ctx, cl, keyCACert)
	if err != nil {
		return nil, fmt.Errorf("curator: bootstrap: %w", err)
	}
	if v == nil {
		return nil, nil
	}
	n, _, err := getNode(ctx, cl, id)
	if err != nil {
		return nil, fmt.Errorf("curator: bootstrap: %w", err)
	}
	if n == nil || n.State != clusterpb.NodeState_NODE_STATE_UP {
		return nil, fmt.Errorf("curator: bootstrap: the cluster in etcd was bootstrapped by another node than %s", id)
	}
	ca, err := loadCA(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("curator: bootstrap: %w", err)
	}
	return ca, nil
}

// newTicket is a random register ticket.
func newTicket() ([]byte, error) {
	t := make([]byte, 32)
	if _, err := rand.Read(t); err != nil {
		return nil, err
	}
	return t, nil
}
