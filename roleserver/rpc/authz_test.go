package rpc

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/internal/testutil"
)

var allKinds = []identity.Kind{identity.KindUnauthenticated, identity.KindNode, identity.KindOwner, identity.KindEphemeral}

// wantAllowed is the policy written out per RPC, independently of the
// permission names: who may call each method. A new RPC fails the test
// until it is added here.
var wantAllowed = map[string][]identity.Kind{
	"/plinth.cluster.v1.Curator/RegisterNode":       {identity.KindEphemeral},
	"/plinth.cluster.v1.Curator/CommitNode":         {identity.KindEphemeral},
	"/plinth.cluster.v1.Curator/JoinNode":           {identity.KindEphemeral},
	"/plinth.cluster.v1.Curator/Watch":              {identity.KindNode, identity.KindOwner},
	"/plinth.cluster.v1.Curator/WatchClusterPolicy": {identity.KindNode, identity.KindOwner},
	"/plinth.cluster.v1.Curator/UpdateNodeStatus":   {identity.KindNode},
	"/plinth.cluster.v1.Curator/Heartbeat":          {identity.KindNode},
	"/plinth.cluster.v1.Curator/IssueCertificate":   {identity.KindNode},
	"/plinth.cluster.v1.Curator/GetCurrentLeader":   {identity.KindNode, identity.KindOwner},

	"/plinth.cluster.v1.Management/GetRegisterTicket":           {identity.KindOwner},
	"/plinth.cluster.v1.Management/RotateRegisterTicket":        {identity.KindOwner},
	"/plinth.cluster.v1.Management/GetClusterInfo":              {identity.KindNode, identity.KindOwner},
	"/plinth.cluster.v1.Management/GetNodes":                    {identity.KindNode, identity.KindOwner},
	"/plinth.cluster.v1.Management/ApproveNode":                 {identity.KindOwner},
	"/plinth.cluster.v1.Management/UpdateNodeRoles":             {identity.KindOwner},
	"/plinth.cluster.v1.Management/DecommissionNode":            {identity.KindOwner},
	"/plinth.cluster.v1.Management/IssueKubernetesCredentials":  {identity.KindOwner},
	"/plinth.cluster.v1.Management/RevokeKubernetesCredentials": {identity.KindOwner},
	"/plinth.cluster.v1.Management/UpdateClusterPolicy":         {identity.KindOwner},
	"/plinth.cluster.v1.Management/RotateSecretsKey":            {identity.KindOwner},
	"/plinth.cluster.v1.Management/RotateOwnerKey":              {identity.KindOwner},
	"/plinth.cluster.v1.AAA/Escrow":                             {identity.KindEphemeral},

	"/plinth.cluster.v1.NodeManagement/Logs":           {identity.KindOwner},
	"/plinth.cluster.v1.NodeManagement/Status":         {identity.KindNode, identity.KindOwner},
	"/plinth.cluster.v1.NodeManagement/Reboot":         {identity.KindOwner},
	"/plinth.cluster.v1.NodeManagement/PowerOff":       {identity.KindOwner},
	"/plinth.cluster.v1.NodeManagement/Update":         {identity.KindOwner},
	"/plinth.cluster.v1.NodeManagement/ActivateUpdate": {identity.KindOwner},
	"/plinth.cluster.v1.NodeManagement/CancelUpdate":   {identity.KindOwner},
}

// TestPermissionTable walks every method of every service in api/clusterpb
// and checks, for each kind of caller, that the declared permission plus
// Permitted give exactly the expected allow/deny.
func TestPermissionTable(t *testing.T) {
	// Make sure every generated file is linked in and registered.
	_ = []protoreflect.FileDescriptor{
		clusterpb.File_cluster_v1_curator_proto,
		clusterpb.File_cluster_v1_management_proto,
		clusterpb.File_cluster_v1_node_management_proto,
	}
	seen := map[string]bool{}
	protoregistry.GlobalFiles.RangeFilesByPackage("plinth.cluster.v1", func(f protoreflect.FileDescriptor) bool {
		for i := 0; i < f.Services().Len(); i++ {
			s := f.Services().Get(i)
			for j := 0; j < s.Methods().Len(); j++ {
				m := s.Methods().Get(j)
				full := "/" + string(s.FullName()) + "/" + string(m.Name())
				seen[full] = true
				perm, err := RequiredPermission(full)
				if err != nil {
					t.Errorf("%s: %v", full, err)
					continue
				}
				// The same lookup as api/clusterpb's own test, done directly.
				direct := proto.GetExtension(m.Options().(*descriptorpb.MethodOptions), clusterpb.E_RequiredPermission).(clusterpb.Permission)
				if perm != direct {
					t.Errorf("%s: RequiredPermission = %v, descriptor says %v", full, perm, direct)
				}
				want, ok := wantAllowed[full]
				if !ok {
					t.Errorf("%s (permission %v) is missing from wantAllowed", full, perm)
					continue
				}
				for _, k := range allKinds {
					allowed := false
					for _, w := range want {
						allowed = allowed || w == k
					}
					if got := Permitted(k, perm); got != allowed {
						t.Errorf("%s: caller %v: Permitted(%v) = %v, want %v", full, k, perm, got, allowed)
					}
				}
			}
		}
		return true
	})
	for m := range wantAllowed {
		if !seen[m] {
			t.Errorf("%s is in wantAllowed but not in the registry", m)
		}
	}
	if len(seen) != 29 {
		t.Errorf("walked %d methods, want 29", len(seen))
	}
}

func TestPermittedNeverUnspecified(t *testing.T) {
	for _, k := range allKinds {
		if Permitted(k, clusterpb.Permission_PERMISSION_UNSPECIFIED) {
			t.Errorf("%v holds PERMISSION_UNSPECIFIED", k)
		}
		if Permitted(k, clusterpb.Permission(999)) {
			t.Errorf("%v holds unknown permission 999", k)
		}
	}
	for p := range clusterpb.Permission_name {
		if Permitted(identity.KindUnauthenticated, clusterpb.Permission(p)) {
			t.Errorf("unauthenticated caller holds %v", clusterpb.Permission(p))
		}
	}
}

func TestRequiredPermissionErrors(t *testing.T) {
	for _, m := range []string{
		"",
		"/",
		"/plinth.cluster.v1.Curator",
		"/plinth.cluster.v1.Curator/",
		"/plinth.cluster.v1.Curator/NoSuchMethod",
		"/plinth.cluster.v1.NoSuchService/Watch",
		"/plinth.cluster.v1.Node/Watch", // a message, not a service
		"/grpc.health.v1.Health/Check",
		"/plinth.cluster.v1.Curator/Watch/extra",
	} {
		if p, err := RequiredPermission(m); err == nil {
			t.Errorf("RequiredPermission(%q) = %v, want error", m, p)
		}
	}
	if p, err := RequiredPermission("/plinth.cluster.v1.Management/ApproveNode"); err != nil || p != clusterpb.Permission_APPROVE_NODE {
		t.Errorf("ApproveNode: %v, %v", p, err)
	}
}

// fakeServers implements a few RPCs of each kind and records who called.
type fakeServers struct {
	clusterpb.UnimplementedManagementServer
	clusterpb.UnimplementedCuratorServer
	mu    sync.Mutex
	peers []*identity.Peer
}

func (f *fakeServers) record(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peers = append(f.peers, PeerFrom(ctx))
}

func (f *fakeServers) last() *identity.Peer {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.peers) == 0 {
		return nil
	}
	return f.peers[len(f.peers)-1]
}

func (f *fakeServers) GetRegisterTicket(ctx context.Context, _ *clusterpb.GetRegisterTicketRequest) (*clusterpb.GetRegisterTicketResponse, error) {
	f.record(ctx)
	return &clusterpb.GetRegisterTicketResponse{Ticket: []byte("ticket")}, nil
}

func (f *fakeServers) GetNodes(_ *clusterpb.GetNodesRequest, srv grpc.ServerStreamingServer[clusterpb.Node]) error {
	f.record(srv.Context())
	return srv.Send(&clusterpb.Node{Id: "n1"})
}

func (f *fakeServers) RegisterNode(ctx context.Context, _ *clusterpb.RegisterNodeRequest) (*clusterpb.RegisterNodeResponse, error) {
	f.record(ctx)
	return &clusterpb.RegisterNodeResponse{}, nil
}

func (f *fakeServers) UpdateNodeStatus(ctx context.Context, _ *clusterpb.UpdateNodeStatusRequest) (*clusterpb.UpdateNodeStatusResponse, error) {
	f.record(ctx)
	return &clusterpb.UpdateNodeStatusResponse{}, nil
}

// TestInterceptors runs the authorizer in a real gRPC server over TLS on
// loopback and calls it as every kind of caller.
func TestInterceptors(t *testing.T) {
	p := newTestPKI(t)
	fake := &fakeServers{}
	srv := NewServer(p.node(), nil)
	clusterpb.RegisterManagementServer(srv, fake)
	clusterpb.RegisterCuratorServer(srv, fake)
	addr := serve(t, srv)

	owner := p.owner()
	node := p.node()
	ephKey, ephCert := p.ephemeral()
	other := newTestPKI(t) // a foreign CA: its certificates count for nothing here
	foreign := other.owner()

	callers := map[string]tls.Certificate{
		"none":      {},
		"foreign":   foreign.TLSCertificate(),
		"ephemeral": ephCert,
		"node":      node.TLSCertificate(),
		"owner":     owner.TLSCertificate(),
	}
	type call func(ctx context.Context, conn *grpc.ClientConn) error
	ticket := func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := clusterpb.NewManagementClient(conn).GetRegisterTicket(ctx, &clusterpb.GetRegisterTicketRequest{})
		return err
	}
	getNodes := func(ctx context.Context, conn *grpc.ClientConn) error {
		s, err := clusterpb.NewManagementClient(conn).GetNodes(ctx, &clusterpb.GetNodesRequest{})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	register := func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := clusterpb.NewCuratorClient(conn).RegisterNode(ctx, &clusterpb.RegisterNodeRequest{})
		return err
	}
	updateStatus := func(ctx context.Context, conn *grpc.ClientConn) error {
		_, err := clusterpb.NewCuratorClient(conn).UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{})
		return err
	}
	tests := []struct {
		caller, name string
		call         call
		want         codes.Code
		wantKind     identity.Kind
		wantKey      ed25519.PublicKey
	}{
		{"none", "GetRegisterTicket", ticket, codes.Unauthenticated, 0, nil},
		{"none", "GetNodes", getNodes, codes.Unauthenticated, 0, nil},
		{"none", "RegisterNode", register, codes.Unauthenticated, 0, nil},
		{"foreign", "GetRegisterTicket", ticket, codes.Unauthenticated, 0, nil},
		{"ephemeral", "GetRegisterTicket", ticket, codes.PermissionDenied, 0, nil},
		{"ephemeral", "GetNodes", getNodes, codes.PermissionDenied, 0, nil},
		{"ephemeral", "RegisterNode", register, codes.OK, identity.KindEphemeral, ephKey.Public().(ed25519.PublicKey)},
		{"node", "GetRegisterTicket", ticket, codes.PermissionDenied, 0, nil},
		{"node", "RegisterNode", register, codes.PermissionDenied, 0, nil},
		{"node", "GetNodes", getNodes, codes.OK, identity.KindNode, node.PublicKey()},
		{"node", "UpdateNodeStatus", updateStatus, codes.OK, identity.KindNode, node.PublicKey()},
		{"owner", "GetRegisterTicket", ticket, codes.OK, identity.KindOwner, owner.PublicKey()},
		{"owner", "GetNodes", getNodes, codes.OK, identity.KindOwner, owner.PublicKey()},
		{"owner", "UpdateNodeStatus", updateStatus, codes.PermissionDenied, 0, nil},
		{"owner", "RegisterNode", register, codes.PermissionDenied, 0, nil},
	}
	conns := map[string]*grpc.ClientConn{}
	for name, cert := range callers {
		conns[name] = testutil.Dial(t, addr, p.clientCreds(cert))
	}
	for _, tc := range tests {
		t.Run(tc.caller+"/"+tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			before := fake.last()
			err := tc.call(ctx, conns[tc.caller])
			if got := status.Code(err); got != tc.want {
				t.Fatalf("code %v (%v), want %v", got, err, tc.want)
			}
			if tc.want == codes.PermissionDenied {
				msg := status.Convert(err).Message()
				if !strings.Contains(msg, tc.name) || !strings.Contains(msg, tc.caller) || !strings.Contains(msg, "permission") {
					t.Errorf("denial %q does not name method, permission and caller kind", msg)
				}
			}
			got := fake.last()
			if tc.want != codes.OK {
				if got != before {
					t.Fatalf("handler ran for a refused call")
				}
				return
			}
			if got == nil || got == before {
				t.Fatal("handler did not see a peer")
			}
			if got.Kind != tc.wantKind || !got.PublicKey.Equal(tc.wantKey) {
				t.Errorf("handler saw %v %x, want %v %x", got.Kind, got.PublicKey, tc.wantKind, tc.wantKey)
			}
			if tc.wantKind == identity.KindNode && got.NodeID != identity.NodeID(tc.wantKey) {
				t.Errorf("handler saw node ID %q", got.NodeID)
			}
		})
	}
}

func TestErrorReason(t *testing.T) {
	err := Error(codes.PermissionDenied, clusterpb.ErrorReason_NODE_DECOMMISSIONED, "node %s is decommissioned", "x")
	if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "node x is decommissioned" {
		t.Fatalf("status: %v", err)
	}
	if got := Reason(fmt.Errorf("wrapped: %w", err)); got != clusterpb.ErrorReason_NODE_DECOMMISSIONED {
		t.Fatalf("Reason = %v", got)
	}
	// A plain status error with the same words carries no reason.
	if got := Reason(status.Error(codes.PermissionDenied, "node x is decommissioned")); got != clusterpb.ErrorReason_ERROR_REASON_UNSPECIFIED {
		t.Fatalf("Reason of a message-only error = %v", got)
	}
}

// panicking panics in GetRegisterTicket.
type panicking struct {
	clusterpb.UnimplementedManagementServer
}

func (panicking) GetRegisterTicket(context.Context, *clusterpb.GetRegisterTicketRequest) (*clusterpb.GetRegisterTicketResponse, error) {
	var m map[string]int
	//lint:ignore SA5000 a nil map write: a real bug, not a deliberate panic(...)
	m["boom"]++
	return nil, nil
}

// TestPanicIsInternalError: a panicking handler answers INTERNAL and the
// server keeps serving, instead of taking the process down.
func TestPanicIsInternalError(t *testing.T) {
	p := newTestPKI(t)
	srv := NewServer(p.node(), nil)
	clusterpb.RegisterManagementServer(srv, panicking{})
	conn := testutil.Dial(t, serve(t, srv), p.clientCreds(p.owner().TLSCertificate()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 2; i++ {
		_, err := clusterpb.NewManagementClient(conn).GetRegisterTicket(ctx, &clusterpb.GetRegisterTicketRequest{})
		if status.Code(err) != codes.Internal {
			t.Fatalf("call %d: %v, want Internal", i, err)
		}
	}
}

// TestCallerCheckAndCRL: the service's CallerCheck runs for every call in
// the one interceptor, and a caller whose certificate the CRL revokes is
// refused before any handler runs.
func TestCallerCheckAndCRL(t *testing.T) {
	p := newTestPKI(t)
	node, banned := p.node(), p.node()
	trust := identity.NewTrust(p.ca.Certificate)
	fake := &fakeServers{}
	a := NewAuthorizer(trust, nil, func(ctx context.Context, peer *identity.Peer) error {
		if peer.NodeID == banned.ID() {
			return Error(codes.PermissionDenied, clusterpb.ErrorReason_NODE_DECOMMISSIONED, "node %s is decommissioned", peer.NodeID)
		}
		return nil
	})
	srv := grpc.NewServer(append([]grpc.ServerOption{grpc.Creds(credentials.NewTLS(node.ServerTLSConfig()))}, a.ServerOptions()...)...)
	clusterpb.RegisterManagementServer(srv, fake)
	addr := serve(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	getNodes := func(c *identity.Credentials) error {
		s, err := clusterpb.NewManagementClient(testutil.Dial(t, addr, p.clientCreds(c.TLSCertificate()))).GetNodes(ctx, &clusterpb.GetNodesRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		return err
	}
	if err := getNodes(node); err != nil {
		t.Fatalf("node: %v", err)
	}
	if err := getNodes(banned); Reason(err) != clusterpb.ErrorReason_NODE_DECOMMISSIONED {
		t.Fatalf("refused by the caller check: %v", err)
	}
	crl, err := p.ca.Revoke(nil, node.Certificate.SerialNumber)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := trust.SetCRL(crl.Raw); err != nil {
		t.Fatal(err)
	}
	calls := len(fake.peers)
	if err := getNodes(node); status.Code(err) != codes.PermissionDenied || Reason(err) != clusterpb.ErrorReason_NODE_DECOMMISSIONED {
		t.Fatalf("revoked node: %v", err)
	}
	if len(fake.peers) != calls {
		t.Fatal("the handler ran for a revoked caller")
	}
}
