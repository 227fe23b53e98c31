package curator

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

func wantReason(t *testing.T, what string, err error, reason clusterpb.ErrorReason) {
	t.Helper()
	if got := rpc.Reason(err); got != reason {
		t.Fatalf("%s: reason %v (err %v), want %v", what, got, err, reason)
	}
}

// recordedCerts counts the certificates the curator recorded for id.
func recordedCerts(t *testing.T, m *member, id string) int {
	t.Helper()
	kv, err := m.running(time.Minute).CuratorClient()
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	resp, err := kv.Get(ctxTimeout(t, 10*time.Second), prefixCerts+id+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return int(resp.Count)
}

// TestRegistrationHardening: the ticket can be rotated, a registering
// node's status is bounded, the approval queue is capped, and CommitNode
// refuses before it issues anything.
func TestRegistrationHardening(t *testing.T) {
	c := newCluster(t)
	a := c.members[0]
	ctx := ctxTimeout(t, 2*time.Minute)
	register := func(key ed25519.PrivateKey, ticket []byte, st *clusterpb.NodeStatus) error {
		conn, _ := ephemeral(t, a.addr(), c.ca, key)
		_, err := clusterpb.NewCuratorClient(conn).RegisterNode(ctx, &clusterpb.RegisterNodeRequest{
			RegisterTicket: ticket, Status: st, TpmUsage: clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED})
		return err
	}
	newKey := func() ed25519.PrivateKey { _, k, _ := ed25519.GenerateKey(rand.Reader); return k }

	// Rotation: the old ticket stops working, the new one works.
	old := c.ticket(a)
	r, err := c.mgmt(a).RotateRegisterTicket(ctx, &clusterpb.RotateRegisterTicketRequest{})
	mustOK(t, "RotateRegisterTicket", err)
	if len(r.Ticket) == 0 || string(r.Ticket) == string(old) || string(c.ticket(a)) != string(r.Ticket) {
		t.Fatalf("rotated ticket %x, old %x", r.Ticket, old)
	}
	wantReason(t, "old ticket", register(newKey(), old, nil), clusterpb.ErrorReason_INVALID_TICKET)
	ticket := r.Ticket

	// Bounded status.
	huge := &clusterpb.NodeStatus{Version: strings.Repeat("v", 64<<10)}
	wantCode(t, "oversized status", register(newKey(), ticket, huge), codes.InvalidArgument)
	wantCode(t, "bad address", register(newKey(), ticket, &clusterpb.NodeStatus{Addresses: []string{"not an address"}}), codes.InvalidArgument)

	// CommitNode before approval: refused with a reason, nothing issued.
	waiting := newKey()
	mustOK(t, "register", register(waiting, ticket, nil))
	conn, creds := ephemeral(t, a.addr(), c.ca, waiting)
	_, join, _ := ed25519.GenerateKey(rand.Reader)
	_, err = commit(t, conn, creds, join)
	wantReason(t, "commit before approval", err, clusterpb.ErrorReason_NODE_NOT_APPROVED)
	waitingID := identity.NodeID(waiting.Public().(ed25519.PublicKey))
	if n := recordedCerts(t, a, waitingID); n != 0 {
		t.Fatalf("%d certificates issued to a node that is not approved", n)
	}
	// Unregistered: refused, nothing issued.
	stranger := newKey()
	sconn, screds := ephemeral(t, a.addr(), c.ca, stranger)
	_, err = commit(t, sconn, screds, join)
	wantCode(t, "commit of an unregistered node", err, codes.NotFound)

	// One address holds at most maxNewPerAddress places of the queue
	// (a host on the LAN with the ticket); another address still gets
	// one.
	from := func(ip string) ed25519.PrivateKey {
		k := newKey()
		testObserved.Store(identity.NodeID(k.Public().(ed25519.PublicKey)), parseIPs([]string{ip}))
		return k
	}
	var flood []ed25519.PrivateKey
	for range maxNewPerAddress {
		k := from("192.0.2.66")
		flood = append(flood, k)
		mustOK(t, "register from one address", register(k, ticket, nil))
	}
	err = register(from("192.0.2.66"), ticket, nil)
	wantReason(t, "registrations from one address", err, clusterpb.ErrorReason_REGISTRATION_QUEUE_FULL)
	if !strings.Contains(status.Convert(err).Message(), "registered from 192.0.2.66") {
		t.Errorf("the refusal does not name the address: %v", err)
	}
	mustOK(t, "register from another address", register(from("192.0.2.67"), ticket, nil))
	mustOK(t, "a queued node registering again from the same address", register(flood[0], ticket, nil))

	// The approval queue is capped: maxNewNodes NEW records, then refusal.
	for i := 2 + maxNewPerAddress; i < maxNewNodes; i++ {
		mustOK(t, "register", register(newKey(), ticket, nil))
	}
	wantReason(t, "registration flood", register(newKey(), ticket, nil), clusterpb.ErrorReason_REGISTRATION_QUEUE_FULL)
	// A node already in the queue may still repeat its registration.
	mustOK(t, "repeated registration", register(waiting, ticket, nil))
	// Approving one makes room.
	_, err = c.mgmt(a).ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: waiting.Public().(ed25519.PublicKey)})
	mustOK(t, "approve", err)
	mustOK(t, "register after approval made room", register(newKey(), ticket, nil))
	if _, err := commit(t, conn, creds, join); err != nil {
		t.Fatalf("commit after approval: %v", err)
	}
	if n := recordedCerts(t, a, waitingID); n != 1 {
		t.Fatalf("%d certificates recorded after one commit, want 1", n)
	}
}

// TestCallerKeyCompared: a node caller is checked against the whole key
// on record, not only the ID derived from it.
func TestCallerKeyCompared(t *testing.T) {
	c := newCluster(t)
	a := c.members[0]
	ctx := ctxTimeout(t, 30*time.Second)
	if err := a.cur.checkCaller(ctx, &identity.Peer{Kind: identity.KindNode, NodeID: a.id, PublicKey: a.pub()}); err != nil {
		t.Fatalf("the node itself: %v", err)
	}
	other, _, _ := ed25519.GenerateKey(rand.Reader)
	err := a.cur.checkCaller(ctx, &identity.Peer{Kind: identity.KindNode, NodeID: a.id, PublicKey: other})
	wantCode(t, "another key under the same ID", err, codes.Unauthenticated)
}

// TestRevocation: decommissioning puts every certificate of the node on
// the cluster CRL, which GetClusterInfo and heartbeat answers carry; the
// revoked certificate opens nothing any more.
func TestRevocation(t *testing.T) {
	c := newCluster(t)
	a := c.members[0]
	b := c.newMember("b")
	c.addNode(a, b)
	ctx := ctxTimeout(t, time.Minute)
	crlOf := func() *pki.CRL {
		info, err := c.mgmt(a).GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
		mustOK(t, "GetClusterInfo", err)
		crl, err := pki.ParseCRL(info.Crl, c.ca)
		if err != nil {
			t.Fatalf("CRL from GetClusterInfo: %v", err)
		}
		return crl
	}
	before := crlOf()
	if before.IsRevoked(b.creds.Certificate.SerialNumber) {
		t.Fatal("b revoked before its decommissioning")
	}

	// A heartbeat of a node with an older CRL gets the current one.
	hb, err := clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds)).Heartbeat(ctx)
	mustOK(t, "Heartbeat", err)
	mustOK(t, "send", hb.Send(&clusterpb.HeartbeatRequest{}))
	resp, err := hb.Recv()
	mustOK(t, "heartbeat answer", err)
	if len(resp.Crl) == 0 {
		t.Fatal("heartbeat answer without the CRL for a node holding none")
	}
	mustOK(t, "send", hb.Send(&clusterpb.HeartbeatRequest{CrlNumber: before.List.Number.Uint64()}))
	if resp, err = hb.Recv(); err != nil || len(resp.Crl) != 0 {
		t.Fatalf("heartbeat answer for a node with the current CRL: %v, %d CRL bytes", err, len(resp.GetCrl()))
	}
	hb.CloseSend()

	_, err = c.mgmt(a).DecommissionNode(ctx, &clusterpb.DecommissionNodeRequest{Id: b.id})
	mustOK(t, "DecommissionNode", err)
	after := crlOf()
	if !after.IsRevoked(b.creds.Certificate.SerialNumber) || after.List.Number.Cmp(before.List.Number) <= 0 {
		t.Fatalf("after decommissioning: CRL %v revokes b: %v", after.List.Number, after.IsRevoked(b.creds.Certificate.SerialNumber))
	}
	// Idempotent: a second call keeps the CRL as it is.
	_, err = c.mgmt(a).DecommissionNode(ctx, &clusterpb.DecommissionNodeRequest{Id: b.id})
	mustOK(t, "second DecommissionNode", err)
	if n := crlOf().List.Number; n.Cmp(after.List.Number) != 0 {
		t.Fatalf("CRL number %v after a repeated decommission, want %v", n, after.List.Number)
	}
	_, err = clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds)).UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{NodeId: b.id, Status: &clusterpb.NodeStatus{}})
	wantReason(t, "revoked node", err, clusterpb.ErrorReason_NODE_DECOMMISSIONED)
}
