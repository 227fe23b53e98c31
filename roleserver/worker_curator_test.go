package roleserver

import (
	"net"
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
	n.config = func(c *Config) {
		c.CuratorEndpoints = endpoints
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
	if n.clusterKeyDropped.Load() {
		t.Fatal("the local cluster unlock key was dropped")
	}
}
