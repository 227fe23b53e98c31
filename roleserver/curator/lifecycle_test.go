package curator

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/identity"
)

// TestNodeLifecycle takes a node through register (ticket and TPM
// checked), approve, commit (its proof bound to the session; a lost reply
// repeated), rejoin with the join key, and status updates of its own.
func TestNodeLifecycle(t *testing.T) {
	f := newSingle(t)
	a, ctx := f.a, f.ctx
	b := f.newMember("b")
	conn, creds := ephemeral(t, a.addr(), f.ca, b.key)
	cur := clusterpb.NewCuratorClient(conn)
	mg := f.mgmt(a)
	reg := &clusterpb.RegisterNodeRequest{
		RegisterTicket: []byte("not the ticket"),
		Status:         &clusterpb.NodeStatus{Addresses: []string{"127.0.0.1"}},
		TpmUsage:       clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED,
	}
	_, err := cur.RegisterNode(ctx, reg)
	wantCode(t, "register with a wrong ticket", err, codes.PermissionDenied, "register ticket is not valid")

	reg.RegisterTicket = f.ticket(a)
	reg.TpmUsage = clusterpb.NodeTPMUsage_NODE_TPM_USAGE_NOT_PRESENT
	_, err = cur.RegisterNode(ctx, reg)
	wantCode(t, "register without TPM", err, codes.FailedPrecondition, "TPM")
	reg.TpmUsage = clusterpb.NodeTPMUsage_NODE_TPM_USAGE_UNSPECIFIED
	_, err = cur.RegisterNode(ctx, reg)
	wantCode(t, "register with unspecified TPM usage", err, codes.FailedPrecondition, "TPM")

	_, _, err = commitErr(t, conn, creds)
	wantCode(t, "commit before register", err, codes.NotFound, "not registered")

	reg.TpmUsage = clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED
	mustOK(t, "RegisterNode", second(cur.RegisterNode(ctx, reg)))
	if n := f.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_NEW || !bytes.Equal(n.PublicKey, b.pub()) ||
		n.TpmUsage != clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED || n.Status.GetAddresses()[0] != "127.0.0.1" {
		t.Fatalf("after RegisterNode: %v", n)
	}
	mustOK(t, "RegisterNode again", second(cur.RegisterNode(ctx, reg)))
	if n := f.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_NEW {
		t.Fatalf("after second RegisterNode: %v", n.State)
	}

	_, _, err = commitErr(t, conn, creds)
	wantCode(t, "commit before approve", err, codes.FailedPrecondition, "not approved")

	_, stranger, _ := ed25519.GenerateKey(rand.Reader)
	_, err = mg.ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: stranger.Public().(ed25519.PublicKey)})
	wantCode(t, "approve an unknown key", err, codes.NotFound)
	mustOK(t, "ApproveNode", second(mg.ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: b.pub()})))
	if n := f.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_STANDBY {
		t.Fatalf("after ApproveNode: %v", n.State)
	}
	// Approving twice is refused and changes nothing.
	_, err = mg.ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: b.pub()})
	wantCode(t, "ApproveNode twice", err, codes.FailedPrecondition, "already approved")
	if n := f.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_STANDBY {
		t.Fatalf("after second ApproveNode: %v", n.State)
	}

	// A proof for another connection does not count.
	_, otherCreds := ephemeral(t, a.addr(), f.ca, b.key)
	_, bJoin, _ := ed25519.GenerateKey(rand.Reader)
	otherState, _ := otherCreds.State()
	proof, _ := identity.SessionProof(bJoin, otherState, identity.ExporterCommitNode, nil)
	_, err = cur.CommitNode(ctx, &clusterpb.CommitNodeRequest{JoinPublicKey: bJoin.Public().(ed25519.PublicKey), JoinKeyProof: proof})
	wantCode(t, "commit with a proof from another session", err, codes.PermissionDenied, "join_key_proof")

	resp, err := commit(t, conn, creds, bJoin)
	mustOK(t, "CommitNode", err)
	if b.creds, err = identity.NewCredentials(b.key, resp.NodeCertificate, resp.CaCertificate); err != nil {
		t.Fatalf("CommitNode credentials: %v", err)
	}
	if b.creds.ID() != b.id || !b.creds.CA.Equal(f.ca) || len(resp.ClusterUnlockKey) != 32 {
		t.Fatalf("CommitNode: id %s, CUK %d bytes", b.creds.ID(), len(resp.ClusterUnlockKey))
	}
	bCUK := resp.ClusterUnlockKey
	if n := f.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_UP {
		t.Fatalf("after CommitNode: %v", n.State)
	}
	// The same node repeating its commit (a lost reply) gets the same
	// unlock key; another join key gets nothing.
	again, err := commit(t, conn, creds, bJoin)
	mustOK(t, "commit repeated by the committed node", err)
	if !bytes.Equal(again.ClusterUnlockKey, bCUK) {
		t.Fatal("a repeated commit returned another cluster unlock key")
	}
	_, otherJoin, _ := ed25519.GenerateKey(rand.Reader)
	_, err = commit(t, conn, creds, otherJoin)
	wantCode(t, "commit twice with another join key", err, codes.FailedPrecondition, "already committed")
	_, err = mg.ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: b.pub()})
	wantCode(t, "approve an UP node", err, codes.FailedPrecondition, "already approved")
	if n := f.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_UP {
		t.Fatalf("approve changed an UP node to %v", n.State)
	}

	// Rejoin with the join key.
	cuk, err := join(t, a.addr(), f.ca, bJoin)
	mustOK(t, "JoinNode", err)
	if !bytes.Equal(cuk, bCUK) {
		t.Error("JoinNode returned another cluster unlock key")
	}
	_, err = join(t, a.addr(), f.ca, stranger)
	wantCode(t, "JoinNode with an unknown key", err, codes.NotFound, "join key")
	jconn, _ := ephemeral(t, a.addr(), f.ca, bJoin)
	_, err = clusterpb.NewCuratorClient(jconn).JoinNode(ctx, &clusterpb.JoinNodeRequest{UsageProof: make([]byte, 64)})
	wantCode(t, "JoinNode with a bad proof", err, codes.PermissionDenied, "usage_proof")
	// The node key is not the join key.
	_, err = join(t, a.addr(), f.ca, b.key)
	wantCode(t, "JoinNode with the node key", err, codes.NotFound)

	// The node updates its own status, not another's.
	bc := clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds))
	mustOK(t, "UpdateNodeStatus", second(bc.UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{
		NodeId: b.id, Status: &clusterpb.NodeStatus{Addresses: []string{"127.0.0.1", "::1"}, Version: "v2", BootCount: 7},
	})))
	if n := f.getNode(a, b.id); n.Status.GetVersion() != "v2" || n.Status.BootCount != 7 {
		t.Errorf("status after UpdateNodeStatus: %v", n.Status)
	}
	_, err = bc.UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{NodeId: a.id, Status: &clusterpb.NodeStatus{}})
	wantCode(t, "UpdateNodeStatus for another node", err, codes.PermissionDenied, a.id)
	if n := f.getNode(a, a.id); n.Status.GetVersion() != "test" {
		t.Errorf("another node's status changed: %v", n.Status)
	}
}

// commitErr commits with a fresh join key.
func commitErr(t *testing.T, conn *grpc.ClientConn, creds *identity.CapturingCredentials) (*clusterpb.CommitNodeResponse, ed25519.PrivateKey, error) {
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	r, err := commit(t, conn, creds, k)
	return r, k, err
}
