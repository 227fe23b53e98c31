package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/curator/escrow"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/owner"
)

// fakeCluster is an in-process curator for the cluster commands: AAA
// (escrow) and the Management calls they make, over TLS with a node
// certificate of its CA, admitting the owner certificate it issued.
type fakeCluster struct {
	clusterpb.UnimplementedAAAServer
	clusterpb.UnimplementedManagementServer

	ca       *pki.CA
	node     *identity.Credentials
	ownerKey ed25519.PrivateKey
	addr     string

	mu      sync.Mutex
	infoCA  *pki.CA // what GetClusterInfo reports; ca unless a test lies
	ticket  []byte
	escrows int // Escrow streams opened

	// IssueKubernetesCredentials: a Kubernetes CA of its own, the
	// lifetime of what it issues, the API servers it names, calls.
	k8sCA       *pki.CA
	k8sValidity time.Duration
	apiServers  []string
	k8sIssued   int

	// GetNodes: the nodes it lists (one with every role unless a test
	// changes them).
	nodes []*clusterpb.Node
	// An API server at apiServers[0] with a certificate of k8sCA whose
	// /readyz answers 200 while apiReady; listening is false once
	// stopAPI closed it; the default service account is missing while
	// noServiceAccount (the controller manager has not started).
	api              *httptest.Server
	apiReady         bool
	noServiceAccount bool
}

func newFakeCluster(t *testing.T) *fakeCluster {
	t.Helper()
	ca, err := pki.NewCA("Plinth cluster CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	_, nodeKey, _ := ed25519.GenerateKey(rand.Reader)
	// A curator serves AAA and Management with a curator certificate.
	cert, err := identity.IssueCuratorCertificate(ca, nodeKey.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	node, err := identity.NewCredentials(nodeKey, cert.Raw, ca.Certificate.Raw)
	if err != nil {
		t.Fatal(err)
	}
	_, ownerKey, _ := ed25519.GenerateKey(rand.Reader)
	k8sCA, err := pki.NewCA("fake Kubernetes CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeCluster{ca: ca, node: node, ownerKey: ownerKey, infoCA: ca, ticket: []byte("first ticket"),
		k8sCA: k8sCA, k8sValidity: time.Hour, apiReady: true,
		nodes: []*clusterpb.Node{{Id: "plinth-0123456789abcdef", State: clusterpb.NodeState_NODE_STATE_UP, Roles: &clusterpb.NodeRoles{
			ConsensusMember:      &clusterpb.NodeRoles_ConsensusMember{},
			KubernetesController: &clusterpb.NodeRoles_KubernetesController{},
			KubernetesWorker:     &clusterpb.NodeRoles_KubernetesWorker{}}}}}
	f.startAPI(t)
	f.apiServers = []string{f.api.Listener.Addr().String(), "10.42.0.12:6443"}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = lis.Addr().String()
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(node.ServerTLSConfig())))
	clusterpb.RegisterAAAServer(srv, f)
	clusterpb.RegisterManagementServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return f
}

// startAPI starts the fake API server: TLS with a serving certificate of
// the Kubernetes CA for kubernetes.default.svc, client certificates of it
// required; /readyz answers 200 while apiReady, else 500.
func (f *fakeCluster) startAPI(t *testing.T) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(1000), Subject: pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:  []string{"kubernetes.default.svc"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, f.k8sCA.Certificate, key.Public(), f.k8sCA.Key)
	if err != nil {
		t.Fatal(err)
	}
	clients := x509.NewCertPool()
	clients.AddCert(f.k8sCA.Certificate)
	f.api = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		ready, noSA := f.apiReady, f.noServiceAccount
		f.mu.Unlock()
		if r.URL.Path == "/api/v1/namespaces/default/serviceaccounts/default" && !noSA {
			w.Write([]byte(`{"kind":"ServiceAccount"}`))
		} else if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
		} else if !ready {
			http.Error(w, "[-]poststarthook/rbac/bootstrap-roles failed: not finished", http.StatusInternalServerError)
		}
	}))
	f.api.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clients}
	f.api.StartTLS()
	t.Cleanup(f.api.Close)
}

func (f *fakeCluster) setAPIReady(ready bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.apiReady = ready
}

// GetNodes lists f.nodes.
func (f *fakeCluster) GetNodes(_ *clusterpb.GetNodesRequest, s grpc.ServerStreamingServer[clusterpb.Node]) error {
	if err := f.isOwner(s.Context()); err != nil {
		return err
	}
	f.mu.Lock()
	nodes := f.nodes
	f.mu.Unlock()
	for _, n := range nodes {
		if err := s.Send(n); err != nil {
			return err
		}
	}
	return nil
}

// ownerDir is a configuration directory holding only the owner key, as
// plinthctl params -bootstrap or run leave it before takeownership.
func (f *fakeCluster) ownerDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "owner")
	if err := (&owner.Config{Dir: dir, Key: f.ownerKey}).Save(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// owned is ownerDir after a successful plinthctl takeownership.
func (f *fakeCluster) owned(t *testing.T) string {
	t.Helper()
	dir := f.ownerDir(t)
	if _, stderr, err := runVerb("takeownership", "-config", dir, "-endpoint", f.addr); err != nil {
		t.Fatalf("takeownership: %v\n%s", err, stderr)
	}
	return dir
}

func (f *fakeCluster) setInfoCA(ca *pki.CA) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.infoCA = ca
}

func (f *fakeCluster) escrowCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.escrows
}

func (f *fakeCluster) Escrow(s grpc.BidiStreamingServer[clusterpb.EscrowFromClient, clusterpb.EscrowFromServer]) error {
	f.mu.Lock()
	f.escrows++
	f.mu.Unlock()
	pub := f.ownerKey.Public().(ed25519.PublicKey)
	p, err := identity.PeerFromContext(s.Context(), identity.NewTrust(f.ca.Certificate))
	if err != nil || p.Kind != identity.KindEphemeral || !p.PublicKey.Equal(pub) {
		return status.Error(codes.PermissionDenied, "not the owner key")
	}
	m, err := s.Recv()
	if err != nil {
		return err
	}
	if !bytes.Equal(m.GetParameters().GetPublicKey(), pub) {
		return status.Error(codes.InvalidArgument, "wrong key")
	}
	nonce := make([]byte, 32)
	rand.Read(nonce)
	if err := s.Send(&clusterpb.EscrowFromServer{Message: &clusterpb.EscrowFromServer_NeededProofs_{NeededProofs: &clusterpb.EscrowFromServer_NeededProofs{Nonce: nonce}}}); err != nil {
		return err
	}
	if m, err = s.Recv(); err != nil {
		return err
	}
	if err := escrow.VerifyEscrowProof(pub, nonce, p.TLS, m.GetProof().GetSignature()); err != nil {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	cert, err := identity.IssueOwnerCertificate(f.ca, pub)
	if err != nil {
		return err
	}
	return s.Send(&clusterpb.EscrowFromServer{Message: &clusterpb.EscrowFromServer_Fulfilled_{Fulfilled: &clusterpb.EscrowFromServer_Fulfilled{OwnerCertificate: cert.Raw}}})
}

func (f *fakeCluster) isOwner(ctx context.Context) error {
	p, err := identity.PeerFromContext(ctx, identity.NewTrust(f.ca.Certificate))
	if err != nil || p.Kind != identity.KindOwner {
		return status.Error(codes.PermissionDenied, "owner only")
	}
	return nil
}

func (f *fakeCluster) GetClusterInfo(ctx context.Context, _ *clusterpb.GetClusterInfoRequest) (*clusterpb.GetClusterInfoResponse, error) {
	if err := f.isOwner(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return &clusterpb.GetClusterInfoResponse{
		CaCertificate: f.infoCA.Certificate.Raw,
		Directory: &clusterpb.ClusterDirectory{Nodes: []*clusterpb.DirectoryNode{
			{Id: f.node.ID(), PublicKey: f.node.PublicKey(), Addresses: []string{"10.42.0.10"}},
		}},
	}, nil
}

func (f *fakeCluster) GetRegisterTicket(ctx context.Context, _ *clusterpb.GetRegisterTicketRequest) (*clusterpb.GetRegisterTicketResponse, error) {
	if err := f.isOwner(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return &clusterpb.GetRegisterTicketResponse{Ticket: f.ticket}, nil
}

func (f *fakeCluster) RotateRegisterTicket(ctx context.Context, _ *clusterpb.RotateRegisterTicketRequest) (*clusterpb.RotateRegisterTicketResponse, error) {
	if err := f.isOwner(ctx); err != nil {
		return nil, err
	}
	t := make([]byte, 32)
	rand.Read(t)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ticket = t
	return &clusterpb.RotateRegisterTicketResponse{Ticket: t}, nil
}

// IssueKubernetesCredentials certifies the key with the fake Kubernetes
// CA, as the curator does (CN plinth-owner:owner, O system:masters).
func (f *fakeCluster) IssueKubernetesCredentials(ctx context.Context, req *clusterpb.IssueKubernetesCredentialsRequest) (*clusterpb.IssueKubernetesCredentialsResponse, error) {
	if err := f.isOwner(ctx); err != nil {
		return nil, err
	}
	pub, err := x509.ParsePKIXPublicKey(req.PublicKey)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.k8sIssued++
	now := time.Now()
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(int64(f.k8sIssued)),
		Subject:      pkix.Name{CommonName: "plinth-owner:owner", Organization: []string{"system:masters"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(f.k8sValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, f.k8sCA.Certificate, pub, f.k8sCA.Key)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &clusterpb.IssueKubernetesCredentialsResponse{CaCertificate: f.k8sCA.Certificate.Raw, ClientCertificate: der,
		ExpiresUnixNanos: now.Add(f.k8sValidity).UnixNano(), ApiServers: f.apiServers}, nil
}

func (f *fakeCluster) kubernetesIssued() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.k8sIssued
}

// runVerb runs a plinthctl verb as main does, capturing its output.
func runVerb(name string, args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	err = commands[name].new().run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), err
}

// files lists the names in dir.
func files(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}
