package curator

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/internal/testutil/poll"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/curator/escrow"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/internal/testutil"
	"plinth.dev/plinth/roleserver/localstorage"
)

// Test timings: short enough for a test, long enough for two shared cores
// and the race detector.
const (
	testLeaderTTL        = time.Second
	testHeartbeatTimeout = 2 * time.Second
)

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// eventually is poll.Until.
var eventually = poll.Until

// wantCode fails unless err is a gRPC status with code c whose message
// contains every one of msgs.
func wantCode(t *testing.T, what string, err error, c codes.Code, msgs ...string) {
	t.Helper()
	st := status.Convert(err)
	if err == nil || st.Code() != c {
		t.Fatalf("%s: got %v, want code %v", what, err, c)
	}
	for _, m := range msgs {
		if !strings.Contains(st.Message(), m) {
			t.Fatalf("%s: message %q does not mention %q", what, st.Message(), m)
		}
	}
}

func mustOK(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// member is one node running consensus and curator on loopback, each
// under its own supervisor.
type member struct {
	t           *testing.T
	name        string
	key         ed25519.PrivateKey
	id          string
	root        localstorage.Root
	peerPort    int
	curatorPort int
	lt          *logtree.Tree
	creds       *identity.Credentials

	cons     *consensus.Service
	consStop func()
	cur      *Service
	curStop  func()
}

func newMember(t *testing.T, name string) *member {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	m := &member{t: t, name: name, key: key, id: identity.NodeID(key.Public().(ed25519.PublicKey)), lt: logtree.New(20000)}
	// A short directory: the etcd client socket path must stay below the
	// unix socket limit.
	dir, err := os.MkdirTemp("", "cur")
	if err != nil {
		t.Fatal(err)
	}
	if err := localstorage.Place(&m.root, dir); err != nil {
		t.Fatal(err)
	}
	if err := localstorage.Create(&m.root.Data.Etcd, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := localstorage.Create(&m.root.Ephemeral.Consensus, 0o700); err != nil {
		t.Fatal(err)
	}
	m.peerPort, m.curatorPort = testutil.FreePort(t), testutil.FreePort(t)
	t.Cleanup(func() {
		m.stopCurator()
		m.stopConsensus()
		os.RemoveAll(dir)
		n, _ := strconv.Atoi(os.Getenv("CURATOR_TEST_LOGS"))
		if t.Failed() {
			n = max(n, 200)
		}
		// etcd's own chatter only with CURATOR_TEST_ETCD_LOGS set.
		etcd := os.Getenv("CURATOR_TEST_ETCD_LOGS") != ""
		var lines []string
		for _, e := range m.lt.Read("", 20000) {
			if s := e.String(); etcd || !strings.Contains(s, "logger=etcd") {
				lines = append(lines, s)
			}
		}
		for _, l := range lines[max(0, len(lines)-n):] {
			t.Logf("[%s] %s", m.name, l)
		}
	})
	return m
}

func (m *member) pub() ed25519.PublicKey { return m.key.Public().(ed25519.PublicKey) }

func run(lt *logtree.Tree, r supervisor.Runnable) func() {
	ctx, cancel := context.WithCancel(context.Background())
	sup := supervisor.New(ctx, lt, r, supervisor.Options{InitialBackoff: 100 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	return sync.OnceFunc(func() {
		cancel()
		sup.Wait()
	})
}

func (m *member) startConsensus(join *consensus.JoinCluster) {
	m.cons = testutil.NewLoopbackConsensus(consensus.Config{
		Data:           &m.root.Data.Etcd,
		Ephemeral:      &m.root.Ephemeral.Consensus,
		JoinCluster:    join,
		NodeID:         m.id,
		NodePrivateKey: m.key,
	}, m.peerPort)
	m.consStop = run(m.lt, m.cons.Run)
}

func (m *member) stopConsensus() {
	if m.consStop != nil {
		m.consStop()
	}
}

func (m *member) stopCurator() {
	if m.curStop != nil {
		m.curStop()
	}
}

// running waits for the consensus member to run.
func (m *member) running(timeout time.Duration) *consensus.Status {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	w := m.cons.Watch()
	defer w.Close()
	st, err := w.Get(ctx, consensus.FilterRunning)
	if err != nil {
		m.t.Fatalf("%s: consensus not running after %v: %v", m.name, timeout, err)
	}
	return st
}

func (m *member) startCurator(peerPorts func(id string) int) {
	m.cur = New(Config{
		Credentials:      m.creds,
		Consensus:        m.cons,
		ListenAddress:    m.addr(),
		AdvertisePort:    m.curatorPort,
		LeaderTTL:        testLeaderTTL,
		HeartbeatTimeout: testHeartbeatTimeout,
		AddNodeOptions: func(id string) []*consensus.AddNodeOption {
			return []*consensus.AddNodeOption{testutil.LoopbackPeer(peerPorts(id))}
		},
		// Every test node dials from 127.0.0.1: each is "seen" at the
		// address observedAt gives it (none unless a test set one).
		Observe: func(id string, _ net.IP) []net.IP { return observedAt(id) },
	})
	m.curStop = run(m.lt, m.cur.Run)
}

// testObserved is where tests say the curators see nodes (observedAt).
var testObserved sync.Map // node ID → []net.IP

func observedAt(id string) []net.IP {
	if v, ok := testObserved.Load(id); ok {
		return v.([]net.IP)
	}
	// Unless a test says otherwise, an address of the node's own.
	h := sha256.Sum256([]byte(id))
	return []net.IP{net.IPv4(10, 77, h[0], h[1])}
}

func (m *member) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.curatorPort)) }

// connected waits until conn has a connection, so that its TLS state can
// be captured for a session proof.
func connected(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx := ctxTimeout(t, 10*time.Second)
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("connection not ready: %v", s)
		}
	}
}

// ephemeral is a connection with an ephemeral certificate for key.
func ephemeral(t *testing.T, addr string, ca *x509.Certificate, key ed25519.PrivateKey) (*grpc.ClientConn, *identity.CapturingCredentials) {
	t.Helper()
	cert, err := identity.EphemeralCertificate(key)
	if err != nil {
		t.Fatal(err)
	}
	creds := identity.NewCapturingCredentials(identity.ClientTLSConfig(identity.NewTrust(ca), cert, identity.ServerCurator))
	conn := testutil.Dial(t, addr, creds)
	connected(t, conn)
	return conn, creds
}

func withCreds(t *testing.T, addr string, c *identity.Credentials) *grpc.ClientConn {
	return testutil.Dial(t, addr, credentials.NewTLS(c.ClientTLSConfig(identity.ServerCurator)))
}

// cluster is a test cluster bootstrapped by its first member.
type cluster struct {
	t       *testing.T
	ca      *x509.Certificate
	owner   ed25519.PrivateKey
	ownerMu sync.Mutex
	ownerC  *identity.Credentials

	mu        sync.Mutex
	peerPorts map[string]int
	members   []*member
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{t: t, peerPorts: map[string]int{}}
	_, c.owner, _ = ed25519.GenerateKey(rand.Reader)
	a := c.newMember("a")
	a.startConsensus(nil)
	st := a.running(time.Minute)
	kv, err := st.CuratorClient()
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	_, join, _ := ed25519.GenerateKey(rand.Reader)
	ctx := ctxTimeout(t, 30*time.Second)
	ca, cert, err := Bootstrap(ctx, kv, BootstrapRequest{
		NodePublicKey:  a.pub(),
		JoinPublicKey:  join.Public().(ed25519.PublicKey),
		OwnerPublicKey: c.owner.Public().(ed25519.PublicKey),
		Configuration:  &clusterpb.ClusterConfiguration{},
		TPMUsage:       clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED,
		Status:         &clusterpb.NodeStatus{Addresses: []string{"127.0.0.1"}, Version: "test"},
		// The first node as a controller, as a default bootstrap makes it.
		KubernetesController: true,
	})
	if err != nil {
		t.Fatalf("Bootstrap: %v", err)
	}
	c.ca = ca
	if a.creds, err = identity.NewCredentials(a.key, cert.Raw, ca.Raw); err != nil {
		t.Fatal(err)
	}
	a.startCurator(c.peerPort)
	c.waitLeader(a, a.id)
	return c
}

func (c *cluster) newMember(name string) *member {
	m := newMember(c.t, name)
	c.mu.Lock()
	c.peerPorts[m.id] = m.peerPort
	c.members = append(c.members, m)
	c.mu.Unlock()
	return m
}

func (c *cluster) peerPort(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peerPorts[id]
}

// leaderStream opens GetCurrentLeader on m.
func (c *cluster) leaderStream(m *member) clusterpb.Curator_GetCurrentLeaderClient {
	c.t.Helper()
	conn := withCreds(c.t, m.addr(), c.members[0].creds)
	ctx, cancel := context.WithCancel(context.Background())
	c.t.Cleanup(cancel)
	var s clusterpb.Curator_GetCurrentLeaderClient
	eventually(c.t, 30*time.Second, "GetCurrentLeader on "+m.name, func() (err error) {
		s, err = clusterpb.NewCuratorClient(conn).GetCurrentLeader(ctx, &clusterpb.GetCurrentLeaderRequest{})
		return err
	})
	return s
}

// nextLeader reads the stream until it names a leader satisfying ok.
func nextLeader(t *testing.T, s clusterpb.Curator_GetCurrentLeaderClient, timeout time.Duration, ok func(*clusterpb.GetCurrentLeaderResponse) bool) *clusterpb.GetCurrentLeaderResponse {
	t.Helper()
	type result struct {
		r   *clusterpb.GetCurrentLeaderResponse
		err error
	}
	ch := make(chan result, 1)
	go func() {
		for {
			r, err := s.Recv()
			if err != nil || ok(r) {
				ch <- result{r, err}
				return
			}
		}
	}()
	select {
	case res := <-ch:
		if res.err != nil {
			t.Fatalf("GetCurrentLeader: %v", res.err)
		}
		return res.r
	case <-time.After(timeout):
		t.Fatalf("no matching leader within %v", timeout)
	}
	return nil
}

// waitLeader waits until m reports id as leader.
func (c *cluster) waitLeader(m *member, id string) *clusterpb.GetCurrentLeaderResponse {
	c.t.Helper()
	return nextLeader(c.t, c.leaderStream(m), 30*time.Second, func(r *clusterpb.GetCurrentLeaderResponse) bool { return r.Id == id })
}

// ownerCreds takes ownership through Escrow once.
func (c *cluster) ownerCreds(m *member) *identity.Credentials {
	c.t.Helper()
	c.ownerMu.Lock()
	defer c.ownerMu.Unlock()
	if c.ownerC != nil {
		return c.ownerC
	}
	conn, creds := ephemeral(c.t, m.addr(), c.ca, c.owner)
	cert, err := escrow.TakeOwnership(ctxTimeout(c.t, 10*time.Second), clusterpb.NewAAAClient(conn), creds, c.owner)
	if err != nil {
		c.t.Fatalf("Escrow: %v", err)
	}
	oc, err := identity.NewCredentials(c.owner, cert.Raw, c.ca.Raw)
	if err != nil {
		c.t.Fatal(err)
	}
	c.ownerC = oc
	return oc
}

func (c *cluster) mgmt(m *member) clusterpb.ManagementClient {
	return clusterpb.NewManagementClient(withCreds(c.t, m.addr(), c.ownerCreds(m)))
}

func (c *cluster) ticket(m *member) []byte {
	c.t.Helper()
	r, err := c.mgmt(m).GetRegisterTicket(ctxTimeout(c.t, 10*time.Second), &clusterpb.GetRegisterTicketRequest{})
	mustOK(c.t, "GetRegisterTicket", err)
	return r.Ticket
}

// single is the shared fixture of the tests of one curator: a cluster
// that a bootstrapped and leads alone, its owner, and a context bounding
// the test. Each test makes its own, so that none sees another's nodes;
// what a test needs beyond it (a committed node, a worker) it adds with
// the helpers below.
type single struct {
	*cluster
	a   *member
	ctx context.Context
}

func newSingle(t *testing.T) *single {
	t.Helper()
	c := newCluster(t)
	return &single{cluster: c, a: c.members[0], ctx: ctxTimeout(t, time.Minute)}
}

// committed is a new member, registered, approved and committed on a
// (UP, no roles, its credentials set), that then pushed its status as a
// booted node does (so that the curator has observed its address), and
// its join key.
func (s *single) committed(name string) (*member, ed25519.PrivateKey) {
	s.t.Helper()
	m := s.newMember(name)
	joinKey, _ := s.addNode(s.a, m)
	_, err := clusterpb.NewCuratorClient(withCreds(s.t, s.a.addr(), m.creds)).UpdateNodeStatus(s.ctx, &clusterpb.UpdateNodeStatusRequest{
		NodeId: m.id, Status: &clusterpb.NodeStatus{Addresses: []string{"127.0.0.1"}, Version: "test"}})
	mustOK(s.t, "UpdateNodeStatus", err)
	return m, joinKey
}

// worker is committed with the KubernetesWorker role.
func (s *single) worker(name string) (*member, ed25519.PrivateKey) {
	s.t.Helper()
	m, joinKey := s.committed(name)
	_, err := s.mgmt(s.a).UpdateNodeRoles(s.ctx, &clusterpb.UpdateNodeRolesRequest{
		Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: m.id}, KubernetesWorker: proto.Bool(true)})
	mustOK(s.t, "UpdateNodeRoles worker", err)
	return m, joinKey
}

// commit signs the commit proof for the connection and commits.
func commit(t *testing.T, conn *grpc.ClientConn, creds *identity.CapturingCredentials, join ed25519.PrivateKey) (*clusterpb.CommitNodeResponse, error) {
	t.Helper()
	state, ok := creds.State()
	if !ok {
		t.Fatal("no TLS state")
	}
	proof, err := identity.SessionProof(join, state, identity.ExporterCommitNode, nil)
	if err != nil {
		t.Fatal(err)
	}
	return clusterpb.NewCuratorClient(conn).CommitNode(ctxTimeout(t, 10*time.Second), &clusterpb.CommitNodeRequest{
		JoinPublicKey: join.Public().(ed25519.PublicKey),
		JoinKeyProof:  proof,
	})
}

// join rejoins with the join key and returns the cluster unlock key.
func join(t *testing.T, addr string, ca *x509.Certificate, joinKey ed25519.PrivateKey) ([]byte, error) {
	t.Helper()
	conn, creds := ephemeral(t, addr, ca, joinKey)
	state, _ := creds.State()
	proof, err := identity.SessionProof(joinKey, state, identity.ExporterJoinNode, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := clusterpb.NewCuratorClient(conn).JoinNode(ctxTimeout(t, 10*time.Second), &clusterpb.JoinNodeRequest{UsageProof: proof})
	return r.GetClusterUnlockKey(), err
}

// addNode takes m through register, approve and commit on leader, and
// reports its status with a loopback address.
func (c *cluster) addNode(leader, m *member) (joinKey ed25519.PrivateKey, cuk []byte) {
	t := c.t
	t.Helper()
	ctx := ctxTimeout(t, 30*time.Second)
	conn, creds := ephemeral(t, leader.addr(), c.ca, m.key)
	_, err := clusterpb.NewCuratorClient(conn).RegisterNode(ctx, &clusterpb.RegisterNodeRequest{
		RegisterTicket: c.ticket(leader),
		Status:         &clusterpb.NodeStatus{Addresses: []string{"127.0.0.1"}},
		TpmUsage:       clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED,
	})
	mustOK(t, "RegisterNode", err)
	_, err = c.mgmt(leader).ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: m.pub()})
	mustOK(t, "ApproveNode", err)
	_, joinKey, _ = ed25519.GenerateKey(rand.Reader)
	resp, err := commit(t, conn, creds, joinKey)
	mustOK(t, "CommitNode", err)
	if m.creds, err = identity.NewCredentials(m.key, resp.NodeCertificate, resp.CaCertificate); err != nil {
		t.Fatalf("CommitNode credentials: %v", err)
	}
	return joinKey, resp.ClusterUnlockKey
}

// getNode returns one node through Management.GetNodes.
func (c *cluster) getNode(m *member, id string) *clusterpb.Node {
	c.t.Helper()
	s, err := c.mgmt(m).GetNodes(ctxTimeout(c.t, 10*time.Second), &clusterpb.GetNodesRequest{Filter: fmt.Sprintf("node.id == %q", id)})
	mustOK(c.t, "GetNodes", err)
	var found *clusterpb.Node
	for {
		n, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		mustOK(c.t, "GetNodes", err)
		found = n
	}
	if found == nil {
		c.t.Fatalf("node %s not found", id)
	}
	return found
}

func itoa(i int) string { return strconv.Itoa(i) }

// second is the error of a call's two results.
func second[T any](_ T, err error) error { return err }

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

func ctxTimeoutCancel(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx, cancel
}

// recvFirst is the first message of a server stream (or the call's error).
func recvFirst[T any](s interface{ Recv() (*T, error) }, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	return s.Recv()
}

func generateKey() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	return ed25519.GenerateKey(rand.Reader)
}
