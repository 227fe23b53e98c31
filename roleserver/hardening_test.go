package roleserver

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

// fakeLeader is a Curator server that claims to lead and, asked for a
// node, strips all its roles: what a decommissioned node with its old
// certificate would like to do to the cluster.
type fakeLeader struct {
	clusterpb.UnimplementedCuratorServer
	calls atomic.Int32
}

func (f *fakeLeader) GetCurrentLeader(_ *clusterpb.GetCurrentLeaderRequest, srv grpc.ServerStreamingServer[clusterpb.GetCurrentLeaderResponse]) error {
	f.calls.Add(1)
	if err := srv.Send(&clusterpb.GetCurrentLeaderResponse{Id: "plinth-fake", ThisIsLeader: true}); err != nil {
		return err
	}
	<-srv.Context().Done()
	return nil
}

func (f *fakeLeader) Watch(req *clusterpb.WatchRequest, srv grpc.ServerStreamingServer[clusterpb.WatchEvent]) error {
	f.calls.Add(1)
	id := req.GetNodeInCluster().GetNodeId()
	if err := srv.Send(&clusterpb.WatchEvent{Nodes: []*clusterpb.Node{{Id: id, Roles: &clusterpb.NodeRoles{}}}}); err != nil {
		return err
	}
	<-srv.Context().Done()
	return nil
}

// serveFake serves f with creds' certificate on loopback.
func serveFake(t *testing.T, creds *identity.Credentials, f *fakeLeader) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(creds.ServerTLSConfig())))
	clusterpb.RegisterCuratorServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestFakeLeaderRefused: a node of the cluster whose certificate is valid
// but no curator's (a decommissioned worker), and a former curator whose
// curator certificate the CRL revokes, both answer GetCurrentLeader and
// Watch as the leader. The Role Server's resolver and role fetch accept
// neither: the node keeps its roles and its locally sealed cluster key.
// issueCreds are credentials from ca for a new key: a curator's or a
// node's.
func issueCreds(t *testing.T, ca *pki.CA, curator bool) *identity.Credentials {
	t.Helper()
	key := genKey(t)
	pub := key.Public().(ed25519.PublicKey)
	issue := identity.IssueNodeCertificate
	if curator {
		issue = identity.IssueCuratorCertificate
	}
	cert, err := issue(ca, pub)
	if err != nil {
		t.Fatal(err)
	}
	c, err := identity.NewCredentials(key, cert.Raw, ca.Certificate.Raw)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFakeLeaderRefused(t *testing.T) {
	ca, _ := pki.NewCA("cluster", 0)
	worker := issueCreds(t, ca, false)       // decommissioned, but its certificate still chains to the CA
	formerCurator := issueCreds(t, ca, true) // revoked below
	fakeWorker, fakeCurator := &fakeLeader{}, &fakeLeader{}
	endpoints := []string{serveFake(t, worker, fakeWorker), serveFake(t, formerCurator, fakeCurator)}

	n := newTestNode(t)
	member := &clusterpb.NodeRoles{ConsensusMember: &clusterpb.NodeRoles_ConsensusMember{}}
	b, _ := proto.Marshal(member)
	if err := n.root.Data.Node.Roles.Write(b, 0o600); err != nil {
		t.Fatal(err)
	}
	// The node holds a CRL that revokes the former curator's certificate.
	crl, err := ca.Revoke(nil, formerCurator.Certificate.SerialNumber)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.root.Data.Node.ClusterCRL.Write(crl.Raw, 0o600); err != nil {
		t.Fatal(err)
	}
	var dropped atomic.Bool
	n.config = func(c *Config) {
		c.CuratorEndpoints = endpoints
		c.LocalClusterKey = func(keep bool) error {
			if !keep {
				dropped.Store(true)
			}
			return nil
		}
	}
	n.start()
	self := issueCreds(t, ca, false)
	n.svc.ProvideRegisterData(self, &clusterpb.ClusterDirectory{})

	// Give the resolver time to try both endpoints several times.
	eventually(t, 20*time.Second, "both fakes dialled and refused", func() error {
		var wrongRole, revoked bool
		for _, e := range n.lt.Read("", 0) {
			line := e.String()
			wrongRole = wrongRole || strings.Contains(line, "server certificate is not for the required role")
			revoked = revoked || strings.Contains(line, "revoked by the cluster")
		}
		if wrongRole && revoked {
			return nil
		}
		return errString("not yet")
	})
	time.Sleep(2 * time.Second)
	if c := fakeWorker.calls.Load() + fakeCurator.calls.Load(); c != 0 {
		t.Fatalf("a fake leader was called %d times", c)
	}
	if id, _ := get(&n.svc.CuratorConnection).Resolver.Leader(); id != "" {
		t.Fatalf("resolver follows %q", id)
	}
	if r := get(&n.svc.Roles); r.GetConsensusMember() == nil {
		t.Fatalf("roles stripped: %v", r)
	}
	if dropped.Load() {
		t.Fatal("the local cluster unlock key was dropped")
	}
}

// TestRolesWriteFailure: roles the curator sends are followed even when
// they cannot be saved, the write is retried, and the node's status says
// so until it succeeds.
func TestRolesWriteFailure(t *testing.T) {
	n := newTestNode(t)
	var failing atomic.Bool
	failing.Store(true)
	n.knobs.saveRoles = func(*clusterpb.NodeRoles) error {
		if failing.Load() {
			return errors.New("no space left on device")
		}
		return nil
	}
	n.knobs.retryInterval = 50 * time.Millisecond
	n.start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n.svc.loadRoles()
	roles := &clusterpb.NodeRoles{KubernetesWorker: &clusterpb.NodeRoles_KubernetesWorker{}}
	// The rolefetch worker's setRoles and retries, on the Service's state
	// (as Run wires them).
	rf := &workerRoleFetch{roles: &n.svc.Roles, rolesFile: &n.svc.rolesFile, keepClusterKey: n.svc.keepClusterKeyLocally}
	go rf.rolesFile.retry(ctx)
	rf.setRoles(ctx, roles)
	if !proto.Equal(get(&n.svc.Roles), roles) {
		t.Fatal("roles not followed")
	}
	if p := n.svc.status().GetProblems(); len(p) != 1 || p[0].GetComponent() != "roles" {
		t.Fatalf("status problems %v, want the roles write", p)
	}
	if _, err := n.root.Data.Node.Roles.Read(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("roles file: %v", err)
	}
	failing.Store(false)
	eventually(t, 10*time.Second, "roles saved by the retry", func() error {
		b, err := n.root.Data.Node.Roles.Read()
		if err != nil {
			return err
		}
		got := &clusterpb.NodeRoles{}
		if err := proto.Unmarshal(b, got); err != nil || !proto.Equal(got, roles) {
			return errString("not the roles")
		}
		if len(n.svc.status().GetProblems()) != 0 {
			return errString("problem still reported")
		}
		return nil
	})
}

// TestStaleRolesFileKeepsMember: a roles file without the consensus
// member role (a write of newer roles failed) next to etcd data does not
// retire the member at boot: only the curator's word does.
func TestStaleRolesFileKeepsMember(t *testing.T) {
	n := newTestNode(t)
	b, _ := proto.Marshal(&clusterpb.NodeRoles{KubernetesWorker: &clusterpb.NodeRoles_KubernetesWorker{}})
	if err := n.root.Data.Node.Roles.Write(b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(n.root.Data.Etcd.Data.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.root.Data.Etcd.Data.Path(), "member"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n.start()
	n.svc.loadRoles()
	if r := get(&n.svc.Roles); r.GetConsensusMember() == nil || r.GetKubernetesWorker() == nil {
		t.Fatalf("roles %v: want the saved ones plus consensus member", r)
	}
}

// TestNodeManagementChecksCRL: NodeManagement answers a node's Status
// until the cluster CRL the node receives revokes the caller (it was
// decommissioned); the check is in the shared authorization path.
func TestNodeManagementChecksCRL(t *testing.T) {
	ca, _ := pki.NewCA("cluster", 0)
	self, other := issueCreds(t, ca, false), issueCreds(t, ca, false)
	n := newTestNode(t)
	n.start()
	n.svc.ProvideRegisterData(self, &clusterpb.ClusterDirectory{})
	nm := clusterpb.NewNodeManagementClient(dialTLS(t, n.nodeMgmtAddr(), credentials.NewTLS(other.ClientTLSConfig(identity.ServerNode))))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eventually(t, 20*time.Second, "Status as another node", func() error {
		_, err := nm.Status(ctx, &clusterpb.StatusRequest{})
		return err
	})
	crl, err := ca.Revoke(nil, other.Certificate.SerialNumber)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.svc.acceptCRL(self.Trust, crl.Raw, n.lt.Logger("test")); err != nil {
		t.Fatal(err)
	}
	_, err = nm.Status(ctx, &clusterpb.StatusRequest{})
	if rpc.Reason(err) != clusterpb.ErrorReason_NODE_DECOMMISSIONED {
		t.Fatalf("Status by a revoked node: %v", err)
	}
	// Kept for the next boot.
	if b, err := n.root.Data.Node.ClusterCRL.Read(); err != nil || string(b) != string(crl.Raw) {
		t.Fatalf("CRL on disk: %v", err)
	}
}
