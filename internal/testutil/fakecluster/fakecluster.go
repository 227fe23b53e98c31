// Package fakecluster is an in-process stand-in for a Plinth cluster as
// its owner's tools see it: the gRPC services that roleserver/owner and
// plinthctl call, served over the same mutual TLS as a real cluster, and
// a Kubernetes API server that answers what plinthctl asks of one.
//
//	owner.Client, plinthctl
//	   │ mTLS (owner, or ephemeral for Escrow)
//	   ├─► Addr      curator certificate  AAA.Escrow          owner key → owner certificate
//	   │                                  Management          info, ticket, nodes, approve,
//	   │                                                      Kubernetes credentials
//	   ├─► NodeAddr  node certificate     NodeManagement      Logs, Update
//	   └─► API       KubernetesCA         /readyz, the default service account
//
// Why: both the owner library and plinthctl are tested against a
// cluster. With one fake, an RPC or a check added to the owner's side is
// served once, and what the tests assume of a cluster (its first ticket,
// its nodes, its directory) is written in one place instead of two copies
// drifting apart. A test changes the fake only through its setters, so
// every difference from the defaults is visible in the test.
//
// It lives under /internal, not roleserver/internal, so that cmd/plinthctl
// may import it too. Only tests import it (TestNotImportedByProduction).
// It must not import roleserver/owner: owner's own in-package tests
// import it.
package fakecluster

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"net"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
)

// FirstTicket is the register ticket until a test rotates it.
const FirstTicket = "first ticket"

// NewNodeID is the ID of the NEW node that GetNodes lists after the
// cluster's own node; its public key is 32 bytes of 0xaa.
const NewNodeID = "plinth-00000000000000aa"

// Config is what a test chooses of a new fake; the zero value is a cluster
// of its own.
type Config struct {
	// CA is the cluster CA (a new one if nil). Fakes sharing a CA are
	// nodes of one cluster: an owner certificate of one opens the others.
	CA *pki.CA
	// OwnerKey is the bootstrap owner's key, the only one Escrow
	// certifies (a new one if nil).
	OwnerKey ed25519.PrivateKey
}

// Cluster is a running fake. Its exported fields are set by New and never
// change; what a test may change goes through the setters.
type Cluster struct {
	clusterpb.UnimplementedAAAServer
	clusterpb.UnimplementedManagementServer
	clusterpb.UnimplementedNodeManagementServer

	CA           *pki.CA               // the cluster CA
	Node         *identity.Credentials // the node's credentials (NodeManagement's certificate)
	Curator      *x509.Certificate     // the certificate Addr is served with
	OwnerKey     ed25519.PrivateKey    // the bootstrap owner's key
	Addr         string                // AAA and Management, served with a curator certificate
	NodeAddr     string                // NodeManagement, served with the node certificate
	KubernetesCA *pki.CA               // signs the API server's and the owner's Kubernetes certificates
	API          *httptest.Server      // the Kubernetes API server

	mu       sync.Mutex
	issuer   *pki.CA // signs owner certificates and is trusted for owner callers
	infoCA   *pki.CA // what GetClusterInfo reports
	mgmtErr  error   // if set, every owner call's answer
	calls    int     // owner calls, mgmtErr or not
	escrows  int     // Escrow streams opened
	ticket   []byte
	nodes    []*clusterpb.Node
	approved [][]byte
	update   updateRecord
	kube     kubeState
	policy   *clusterpb.ClusterConfiguration // as UpdateClusterPolicy left it
	// ownerKey is the owner key now (OwnerKey until RotateOwnerKey), crl
	// the CRL GetClusterInfo hands out (SetCRL).
	ownerKey ed25519.PublicKey
	crl      []byte
}

// updateRecord is what the node got in its last Update.
type updateRecord struct {
	start    *clusterpb.UpdateStart
	received int
}

// New starts a fake cluster for the test's lifetime.
func New(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	if cfg.CA == nil {
		cfg.CA = NewCA(t, "Plinth cluster CA")
	}
	if cfg.OwnerKey == nil {
		cfg.OwnerKey = NewKey(t)
	}
	nodeKey := NewKey(t)
	nodeCert, err := identity.IssueNodeCertificate(cfg.CA, nodeKey.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	node, err := identity.NewCredentials(nodeKey, nodeCert.Raw, cfg.CA.Certificate.Raw)
	if err != nil {
		t.Fatal(err)
	}
	curatorCert, err := identity.IssueCuratorCertificate(cfg.CA, nodeKey.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	curator, err := node.WithCertificate(curatorCert)
	if err != nil {
		t.Fatal(err)
	}
	f := &Cluster{CA: cfg.CA, Node: node, Curator: curatorCert, OwnerKey: cfg.OwnerKey, KubernetesCA: NewCA(t, "fake Kubernetes CA"),
		issuer: cfg.CA, infoCA: cfg.CA, ticket: []byte(FirstTicket), ownerKey: cfg.OwnerKey.Public().(ed25519.PublicKey)}
	f.nodes = []*clusterpb.Node{
		{Id: node.ID(), PublicKey: node.PublicKey(), State: clusterpb.NodeState_NODE_STATE_UP, Roles: &clusterpb.NodeRoles{
			ConsensusMember:      &clusterpb.NodeRoles_ConsensusMember{},
			KubernetesController: &clusterpb.NodeRoles_KubernetesController{},
			KubernetesWorker:     &clusterpb.NodeRoles_KubernetesWorker{}}},
		{Id: NewNodeID, PublicKey: bytes.Repeat([]byte{0xaa}, 32), State: clusterpb.NodeState_NODE_STATE_NEW},
	}
	f.startKubernetes(t)
	f.Addr = serve(t, curator, func(s *grpc.Server) {
		clusterpb.RegisterAAAServer(s, f)
		clusterpb.RegisterManagementServer(s, f)
	})
	f.NodeAddr = serve(t, node, func(s *grpc.Server) { clusterpb.RegisterNodeManagementServer(s, f) })
	return f
}

// serve runs a gRPC server with creds' certificate on a loopback port
// until the test ends and returns its address.
func serve(t testing.TB, creds *identity.Credentials, register func(*grpc.Server)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(creds.ServerTLSConfig())))
	register(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// NewCA is a new CA named name; the test fails if it cannot be made.
func NewCA(t testing.TB, name string) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA(name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// NewKey is a new Ed25519 key; the test fails if it cannot be made.
func NewKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// SetIssuer makes ca sign the owner certificates Escrow hands out and the
// CA owner callers are checked against: a cluster that lies about its CA
// when it is not the cluster CA.
func (f *Cluster) SetIssuer(ca *pki.CA) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.issuer = ca
}

// SetInfoCA is the CA GetClusterInfo reports (the cluster CA until set).
func (f *Cluster) SetInfoCA(ca *pki.CA) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.infoCA = ca
}

// SetOwnerCallError makes every Management and NodeManagement call fail
// with err (nil: answer again), as a curator that cannot serve does.
func (f *Cluster) SetOwnerCallError(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mgmtErr = err
}

// EditNodes changes the nodes GetNodes lists (by default the cluster's own
// node, UP with every role, and NewNodeID, NEW without roles).
func (f *Cluster) EditNodes(edit func(nodes []*clusterpb.Node)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	edit(f.nodes)
}

// EscrowCount is how many Escrow streams were opened.
func (f *Cluster) EscrowCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.escrows
}

// OwnerCalls is how many Management and NodeManagement calls arrived,
// answered or not.
func (f *Cluster) OwnerCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// Approved lists the public keys ApproveNode was called with.
func (f *Cluster) Approved() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.approved)
}

// LastUpdate is the UpdateStart of the last Update and how many image
// bytes followed it.
func (f *Cluster) LastUpdate() (*clusterpb.UpdateStart, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.update.start, f.update.received
}

// owner admits owner certificates of the issuer, unless a test set an
// error for every call.
func (f *Cluster) owner(ctx context.Context) error {
	f.mu.Lock()
	f.calls++
	mgmtErr, issuer := f.mgmtErr, f.issuer
	f.mu.Unlock()
	if mgmtErr != nil {
		return mgmtErr
	}
	p, err := identity.PeerFromContext(ctx, identity.NewTrust(issuer.Certificate))
	if err != nil || p.Kind != identity.KindOwner {
		return status.Error(codes.PermissionDenied, "owner only")
	}
	return nil
}

// clone is a deep copy of nodes, so that a test editing them does not
// race a stream sending them.
func clone(nodes []*clusterpb.Node) []*clusterpb.Node {
	out := make([]*clusterpb.Node, len(nodes))
	for i, n := range nodes {
		out[i] = proto.Clone(n).(*clusterpb.Node)
	}
	return out
}
