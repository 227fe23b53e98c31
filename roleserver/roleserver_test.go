package roleserver

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/curator/escrow"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/internal/testutil"
	"plinth.dev/plinth/roleserver/localstorage"
)

// takeOwnership runs AAA.Escrow against the node's curator and returns
// owner credentials.
func takeOwnership(t *testing.T, addr string, caCreds *identity.Credentials, ownerKey ed25519.PrivateKey) *identity.Credentials {
	t.Helper()
	eph, err := identity.EphemeralCertificate(ownerKey)
	if err != nil {
		t.Fatal(err)
	}
	var owner *identity.Credentials
	eventually(t, 30*time.Second, "escrow", func() error {
		capture := identity.NewCapturingCredentials(identity.ClientTLSConfig(identity.NewTrust(caCreds.CA), eph, identity.ServerCurator))
		conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(capture))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cert, err := escrow.TakeOwnership(ctx, clusterpb.NewAAAClient(conn), capture, ownerKey)
		if err != nil {
			return err
		}
		owner = &identity.Credentials{PrivateKey: ownerKey, Certificate: cert, CA: caCreds.CA}
		return nil
	})
	return owner
}

// ownNode returns this node's record as the curator's Management sees it.
func ownNode(ctx context.Context, mgmt clusterpb.ManagementClient, id string) (*clusterpb.Node, error) {
	s, err := mgmt.GetNodes(ctx, &clusterpb.GetNodesRequest{})
	if err != nil {
		return nil, err
	}
	for {
		n, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("node not listed")
		}
		if err != nil {
			return nil, err
		}
		if n.GetId() == id {
			return n, nil
		}
	}
}

func waitHealthy(t *testing.T, mgmt clusterpb.ManagementClient, id string) *clusterpb.Node {
	t.Helper()
	var node *clusterpb.Node
	eventually(t, 40*time.Second, "node HEALTHY at the curator", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := ownNode(ctx, mgmt, id)
		if err != nil {
			return err
		}
		if n.GetHealth() != clusterpb.NodeHealth_NODE_HEALTH_HEALTHY {
			return errors.New("health " + n.GetHealth().String())
		}
		if len(n.GetStatus().GetAddresses()) == 0 {
			return errors.New("no status pushed yet")
		}
		node = n
		return nil
	})
	return node
}

// TestBootstrap bootstraps a one-node cluster in-process (real etcd, real
// curator, loopback), checks the node is HEALTHY at its own curator, uses
// NodeManagement with the owner certificate, then restarts the node cold
// from what it persisted.
func TestBootstrap(t *testing.T) {
	n := newTestNode(t)
	nodeKey, joinKey, ownerKey := genKey(t), genKey(t), genKey(t)
	id := identity.NodeID(nodeKey.Public().(ed25519.PublicKey))
	n.start()
	n.svc.ProvideBootstrapData(BootstrapData{
		NodeKey:       nodeKey,
		JoinKey:       joinKey.Public().(ed25519.PublicKey),
		OwnerKey:      ownerKey.Public().(ed25519.PublicKey),
		Configuration: &clusterpb.ClusterConfiguration{AllowNodesWithoutTpm: true},
		TPMUsage:      clusterpb.NodeTPMUsage_NODE_TPM_USAGE_NOT_PRESENT,
	})

	var creds *identity.Credentials
	eventually(t, 40*time.Second, "node credentials saved", func() error {
		var err error
		creds, err = identity.Load(n.root.Data.Node.Credentials.Path())
		return err
	})
	if creds.ID() != id || !creds.PrivateKey.Equal(nodeKey) {
		t.Fatalf("saved credentials are for %s, want %s", creds.ID(), id)
	}

	owner := takeOwnership(t, n.curatorAddr(), creds, ownerKey)
	ownerTLS := credentials.NewTLS(owner.ClientTLSConfig(identity.ServerCurator))
	mgmt := clusterpb.NewManagementClient(testutil.Dial(t, n.curatorAddr(), ownerTLS))
	node := waitHealthy(t, mgmt, id)
	if node.GetState() != clusterpb.NodeState_NODE_STATE_UP || node.GetRoles().GetConsensusMember() == nil {
		t.Errorf("node record: state %v roles %v", node.GetState(), node.GetRoles())
	}
	if st := node.GetStatus(); st.GetVersion() != "v0.0.0-test" || st.GetBootCount() != 3 || st.GetAddresses()[0] != "127.0.0.1" {
		t.Errorf("pushed status %v", st)
	}

	// Roles and hosts are persisted for a cold start.
	b, err := n.root.Data.Node.Roles.Read()
	if err != nil {
		t.Fatal(err)
	}
	roles := &clusterpb.NodeRoles{}
	if err := proto.Unmarshal(b, roles); err != nil || roles.GetConsensusMember() == nil {
		t.Errorf("persisted roles %v (%v)", roles, err)
	}
	if h, err := n.root.Data.Node.Hosts.Read(); err != nil || !strings.Contains(string(h), "127.0.0.1\t"+id+"\n") {
		t.Errorf("node map cache: %q (%v), want an entry for %s", h, err, id)
	}
	if a, ok := n.names.Lookup(id); !ok || len(a) != 1 || a[0].String() != "127.0.0.1" {
		t.Errorf("Names.Lookup(%s) = %v, %v; want 127.0.0.1", id, a, ok)
	}

	// NodeManagement over mTLS with the owner certificate.
	nm := clusterpb.NewNodeManagementClient(testutil.Dial(t, n.nodeMgmtAddr(), credentials.NewTLS(owner.ClientTLSConfig(identity.ServerNode))))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := nm.Status(ctx, &clusterpb.StatusRequest{})
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if st.GetStatus().GetVersion() != "v0.0.0-test" || len(st.GetStatus().GetAddresses()) == 0 {
		t.Errorf("Status.status = %v", st.GetStatus())
	}
	states := map[string]string{}
	for _, r := range st.GetRunnables() {
		states[r.GetDn()] = r.GetState()
	}
	for _, dn := range []string{"root.roleserver.controlplane.consensus", "root.roleserver.controlplane.curator", "root.roleserver.heartbeat", "root.roleserver.nodemgmt", "root.roleserver.policyfetch"} {
		if states[dn] != string(supervisor.StateHealthy) {
			t.Errorf("runnable %s is %q, want HEALTHY (all: %v)", dn, states[dn], states)
		}
	}

	// The node follows the cluster policy the owner changes (policyfetch).
	reg := &clusterpb.ImageRegistry{Host: "10.0.0.5:5000", Username: "puller", Password: "s3cret"}
	if _, err := mgmt.UpdateClusterPolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{
		Kubernetes: &clusterpb.KubernetesPolicy{ImageRegistries: []*clusterpb.ImageRegistry{reg}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the changed policy at the node", func() error {
		if r := get(&n.svc.policy).GetKubernetes().GetImageRegistries(); len(r) != 1 || !proto.Equal(r[0], reg) {
			return errString("not yet")
		}
		return nil
	})

	// Logs: backlog of the whole roleserver subtree.
	logs, err := nm.Logs(ctx, &clusterpb.LogsRequest{Dn: "root.roleserver", Recursive: true, Backlog: -1})
	if err != nil {
		t.Fatal(err)
	}
	var got []*clusterpb.LogEntry
	for {
		r, err := logs.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Logs: %v", err)
		}
		got = append(got, r.GetEntries()...)
	}
	want := map[string]bool{"bootstrapping cluster": false, "connected to curator leader " + id: false, "serving NodeManagement": false}
	for _, e := range got {
		if !strings.HasPrefix(e.GetDn(), "root.roleserver") {
			t.Errorf("entry of %s in a root.roleserver log", e.GetDn())
		}
		for w := range want {
			if strings.HasPrefix(e.GetMessage(), w) {
				want[w] = true
			}
		}
	}
	for w, ok := range want {
		if !ok {
			t.Errorf("log line %q not served by Logs (%d entries)", w, len(got))
		}
	}

	// Logs with follow: an entry logged after the call arrives.
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	follow, err := nm.Logs(fctx, &clusterpb.LogsRequest{Dn: "root.test", Backlog: 0, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		// The subscription is in place once the server got the call; keep
		// logging until the reader is done.
		for i := 0; fctx.Err() == nil; i++ {
			n.lt.Logger("root.test").Info("followed line", "i", i)
			time.Sleep(50 * time.Millisecond)
		}
	}()
	r, err := follow.Recv()
	fcancel()
	if err != nil || len(r.GetEntries()) == 0 || r.GetEntries()[0].GetMessage() != "followed line" || r.GetEntries()[0].GetLevel() != "INFO" {
		t.Fatalf("followed Logs: %v, %v", r, err)
	}

	// The node's own certificate may read status but not logs or power.
	nodeNM := clusterpb.NewNodeManagementClient(testutil.Dial(t, n.nodeMgmtAddr(), credentials.NewTLS(creds.ClientTLSConfig(identity.ServerNode))))
	if _, err := nodeNM.Status(ctx, &clusterpb.StatusRequest{}); err != nil {
		t.Errorf("node Status: %v", err)
	}
	if _, err := nodeNM.Reboot(ctx, &clusterpb.RebootRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("node Reboot: %v, want PermissionDenied", err)
	}
	if _, err := nm.Reboot(ctx, &clusterpb.RebootRequest{}); err != nil {
		t.Fatalf("owner Reboot: %v", err)
	}
	select {
	case reboot := <-n.power:
		if !reboot {
			t.Error("Reboot powered off")
		}
	case <-time.After(5 * time.Second):
		t.Error("Reboot did not call Power")
	}

	for _, m := range []struct{ dn, msg string }{
		{"roleserver.controlplane", "bootstrapping cluster"},
		{"roleserver.controlplane", "cluster bootstrapped"},
		{"roleserver.heartbeat", "connected to curator leader"},
		{"roleserver.rolefetch", "node is HEALTHY"},
		{"roleserver.statuspush", "status pushed"},
	} {
		// The workers log what they see when they see it: the curator
		// may answer HEALTHY before rolefetch's watch has shown it.
		if !logEventually(n.lt, m.dn, m.msg, 10*time.Second) {
			t.Errorf("no %q in the %s log", m.msg, m.dn)
		}
	}

	// Cold start: a new Service on the same storage, given the saved
	// credentials as after a reboot, starts etcd and the curator from the
	// persisted roles and becomes HEALTHY again.
	n.stop()
	n.old = append(n.old, n.lt)
	n.lt = logtree.New(50000)
	n.start()
	saved, err := identity.Load(n.root.Data.Node.Credentials.Path())
	if err != nil {
		t.Fatal(err)
	}
	n.svc.ProvideJoinData(saved, nil)
	before := time.Now()
	mgmt2 := clusterpb.NewManagementClient(testutil.Dial(t, n.curatorAddr(), ownerTLS))
	waitHealthy(t, mgmt2, id)
	eventually(t, 20*time.Second, "heartbeat after restart", func() error {
		n2, err := ownNode(ctx, mgmt2, id)
		if err != nil {
			return err
		}
		if time.Unix(0, n2.GetLastHeartbeatUnixNanos()).Before(before) {
			return errors.New("last heartbeat is from before the restart")
		}
		return nil
	})
	if logContains(n.lt, "roleserver.controlplane", "bootstrapping cluster") {
		t.Error("restart bootstrapped again")
	}
}

func TestDamagedRolesFileNeverDemotesAMember(t *testing.T) {
	for _, tc := range []struct {
		name       string
		etcdData   bool
		wantMember bool
	}{
		{"etcd data on disk", true, true},
		{"no etcd data", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := &localstorage.Root{}
			if err := localstorage.Place(root, t.TempDir()); err != nil {
				t.Fatal(err)
			}
			if err := localstorage.Create(&root.Data, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := root.Data.Node.Roles.Write([]byte("\xff\xff not a NodeRoles"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.etcdData {
				if err := os.WriteFile(filepath.Join(root.Data.Etcd.Data.Path(), "member"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			lt := logtree.New(100)
			s := New(Config{StorageRoot: root, LogTree: lt})
			s.loadRoles()
			if got := get(&s.Roles).GetConsensusMember() != nil; got != tc.wantMember {
				t.Fatalf("consensus member = %v, want %v", got, tc.wantMember)
			}
			found := false
			for _, e := range lt.Read("roleserver", 10) {
				found = found || strings.Contains(e.Message, "persisted roles unreadable")
			}
			if !found {
				t.Error("the damaged roles file was not reported")
			}
		})
	}
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
