package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/internal/testutil/fakecluster"
	"plinth.dev/plinth/roleserver/identity"
)

// node approve lists the NEW nodes (as a table with what to do next, or
// as JSON), and approves a node by its ID or its key.
func TestNodeApprove(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)
	newKey := bytes.Repeat([]byte{0xaa}, 32)

	stdout, stderr := ctl(t, "node", "approve", "--config", dir)
	if !strings.Contains(stdout, fakecluster.NewNodeID) || strings.Contains(stdout, f.Node.ID()) ||
		!strings.Contains(stderr, "plinthctl node approve PUBKEY") {
		t.Errorf("node approve: the table lists not the NEW node alone, or no hint:\n%s\n%s", stdout, stderr)
	}
	stdout, _ = ctl(t, "node", "approve", "--config", dir, "-o", "json")
	var nodes []struct{ ID, State, PublicKey string }
	if err := json.Unmarshal([]byte(stdout), &nodes); err != nil {
		t.Fatalf("node approve -o json: %v\n%s", err, stdout)
	}
	if len(nodes) != 1 || nodes[0].ID != fakecluster.NewNodeID || nodes[0].State != "NODE_STATE_NEW" {
		t.Errorf("node approve -o json: %+v, want the NEW node alone", nodes)
	}
	if len(f.Approved()) != 0 {
		t.Fatalf("listing approved %x", f.Approved())
	}

	_, stderr = ctl(t, "node", "approve", "--config", dir, fakecluster.NewNodeID, strings.Repeat("aa", 32))
	if got := f.Approved(); len(got) != 2 || !bytes.Equal(got[0], newKey) || !bytes.Equal(got[1], newKey) ||
		strings.Count(stderr, "approved "+identity.NodeID(newKey)) != 2 {
		t.Errorf("approving by ID and by key: approved %x\n%s", got, stderr)
	}
}

// Wrong usage exits 2 with the reason, before the cluster is called.
func TestNodeRoleUsage(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"node", "decommission", f.Node.ID()}, "cannot be undone"},
		{[]string{"node", "decommission"}, "missing arguments: want NODE"},
		{[]string{"node", "approve", fakecluster.NewNodeID, "-o", "json"}, "approving prints nothing"},
		{[]string{"node", "logs", f.Node.ID(), "-o", "yaml", "--audit"}, "print them with -o text or -o json"},
		{[]string{"node", "logs", f.Node.ID(), "--audit", "--dn", "root"}, "give --audit or --dn, not both"},
		{[]string{"node", "logs"}, "missing arguments: want NODE"},
		{[]string{"node", "update", f.Node.ID()}, "nothing to install: give --image DIR"},
		{[]string{"cluster", "update", "--activate"}, "act on one node's installed update"},
		{[]string{"role", "add", f.Node.ID()}, "missing arguments: want NODE ROLE..."},
		{[]string{"role", "remove", f.Node.ID(), "kubernetes-worker", "etcd"}, `unknown role "etcd": want consensus-member, kubernetes-controller or kubernetes-worker`},
		{[]string{"role", "taint"}, "missing arguments: want NODE"},
		{[]string{"role", "untaint", f.Node.ID(), "other"}, "unexpected arguments"},
		{[]string{"role", "add", f.Node.ID(), "kubernetes-worker", "--kube-server", "h:1"}, "unknown flag: --kube-server"},
	} {
		calls := f.OwnerCalls()
		_, stderr, code := runCLI(append(c.args, "--config", dir)...)
		if code != 2 || !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "Usage:") {
			t.Errorf("plinthctl %s: exit %d, want 2 with %q and the usage:\n%s", strings.Join(c.args, " "), code, c.want, stderr)
		}
		if n := f.OwnerCalls() - calls; n != 0 {
			t.Errorf("plinthctl %s: %d calls to the cluster, want none", strings.Join(c.args, " "), n)
		}
	}
}

// node logs prints the node's entries as text, as JSON Lines or as YAML
// documents; --audit prints the audit stream's messages as they are.
func TestNodeLogs(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.ownedWithNode(t)
	id := f.Node.ID()

	stdout, _ := ctl(t, "node", "logs", id, "--config", dir, "--dn", "root.x")
	if lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n"); len(lines) != 2 ||
		!strings.HasSuffix(lines[0], "root.x: hello") || !strings.HasSuffix(lines[1], "root.x: world") {
		t.Errorf("node logs: %q, want a line per entry", stdout)
	}

	stdout, _ = ctl(t, "node", "logs", id, "--config", dir, "--dn", "root.x", "-o", "json")
	var msgs []string
	for _, line := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		var e struct{ Dn, Message string }
		if err := json.Unmarshal([]byte(line), &e); err != nil || e.Dn != "root.x" {
			t.Errorf("node logs -o json: line %q: %+v, %v", line, e, err)
		}
		msgs = append(msgs, e.Message)
	}
	if strings.Join(msgs, " ") != "hello world" {
		t.Errorf("node logs -o json: messages %q, want hello world", msgs)
	}

	stdout, _ = ctl(t, "node", "logs", id, "--config", dir, "-o", "yaml")
	if docs := strings.Split(stdout, "---\n"); len(docs) != 3 || docs[0] != "" || !strings.Contains(docs[1], "message: hello") || !strings.Contains(docs[2], "message: world") {
		t.Errorf("node logs -o yaml: %q, want two documents", stdout)
	}

	stdout, _ = ctl(t, "node", "logs", id, "--config", dir, "--audit", "-o", "json")
	if stdout != "hello\nworld\n" {
		t.Errorf("node logs --audit: %q, want the messages alone", stdout)
	}
}

// rolesCluster is the fake cluster answering UpdateNodeRoles and
// DecommissionNode too: it records what it was asked.
type rolesCluster struct {
	*fakecluster.Cluster
	mu             sync.Mutex
	roles          []*clusterpb.UpdateNodeRolesRequest
	decommissioned []string
}

func (r *rolesCluster) UpdateNodeRoles(_ context.Context, req *clusterpb.UpdateNodeRolesRequest) (*clusterpb.UpdateNodeRolesResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.roles = append(r.roles, req)
	return &clusterpb.UpdateNodeRolesResponse{}, nil
}

func (r *rolesCluster) DecommissionNode(_ context.Context, req *clusterpb.DecommissionNodeRequest) (*clusterpb.DecommissionNodeResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.decommissioned = append(r.decommissioned, req.GetId())
	return &clusterpb.DecommissionNodeResponse{}, nil
}

// serveRoles serves f's Management with rolesCluster's additions, as a
// curator of f's cluster, and returns it and its address.
func serveRoles(t *testing.T, f *fakeCluster) (*rolesCluster, string) {
	t.Helper()
	curator, err := f.Node.WithCertificate(f.Curator)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rolesCluster{Cluster: f.Cluster}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(curator.ServerTLSConfig())))
	clusterpb.RegisterManagementServer(srv, r)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return r, lis.Addr().String()
}

// role add and role remove send the roles named for the node NODE
// names; node decommission --yes decommissions it.
func TestRoleAddRemove(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)
	r, addr := serveRoles(t, f)
	prefix := strings.TrimPrefix(fakecluster.NewNodeID, "plinth-")[:8]

	ctl(t, "role", "add", prefix, "kubernetes-worker", "consensus-member", "--config", dir, "--endpoint", addr)
	ctl(t, "role", "remove", fakecluster.NewNodeID, "kubernetes-controller", "--config", dir, "--endpoint", addr)
	want := []*clusterpb.UpdateNodeRolesRequest{
		{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: fakecluster.NewNodeID}, KubernetesWorker: proto.Bool(true), ConsensusMember: proto.Bool(true)},
		{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: fakecluster.NewNodeID}, KubernetesController: proto.Bool(false)},
	}
	r.mu.Lock()
	got := r.roles
	r.mu.Unlock()
	if len(got) != len(want) || !proto.Equal(got[0], want[0]) || !proto.Equal(got[1], want[1]) {
		t.Errorf("role add, role remove: the cluster got %v, want %v", got, want)
	}

	_, stderr := ctl(t, "node", "decommission", "--yes", prefix, "--config", dir, "--endpoint", addr)
	r.mu.Lock()
	dec := r.decommissioned
	r.mu.Unlock()
	if len(dec) != 1 || dec[0] != fakecluster.NewNodeID || !strings.Contains(stderr, fakecluster.NewNodeID+" is decommissioned") {
		t.Errorf("node decommission --yes: decommissioned %q\n%s", dec, stderr)
	}
}

// node update --stage sends a signed image to the node and says how to
// boot it, in the commands' spelling.
func TestNodeUpdateStage(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.ownedWithNode(t)
	img := t.TempDir()
	manifest := []byte(`{"board":"qemu-x86_64","version":"v2","release":9,"artefacts":{"system.img":{"size":3},"plinth-b.efi":{"size":2}}}`)
	for name, data := range map[string][]byte{"manifest.json": manifest, "system.img": []byte("sys"), "plinth-b.efi": []byte("uk"), "manifest.sig": []byte("sig")} {
		if err := os.WriteFile(filepath.Join(img, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stdout, _ := ctl(t, "node", "update", f.Node.ID(), "--image", img, "--stage", "--config", dir)
	if !strings.Contains(stdout, "plinthctl node update "+f.Node.ID()+" --activate` boots it, --cancel drops it") {
		t.Errorf("node update --stage: %q, want how to activate it", stdout)
	}
	if start, received := f.LastUpdate(); !bytes.Equal(start.GetManifest(), manifest) || !start.GetStage() || received != 5 {
		t.Errorf("the node got %v and %d bytes", start, received)
	}
}
