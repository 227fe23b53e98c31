package curator

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/internal/testutil"
)

// TestPermissions: each kind of caller (owner, ephemeral, node, none)
// reaches exactly the RPCs meant for it.
func TestPermissions(t *testing.T) {
	f := newSingle(t)
	a, ctx := f.a, f.ctx

	// Owner: accepted.
	ticket := f.ticket(a)
	if len(ticket) != 32 {
		t.Errorf("ticket has %d bytes", len(ticket))
	}
	// Ephemeral caller on Management: refused.
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	conn, _ := ephemeral(t, a.addr(), f.ca, k)
	_, err := clusterpb.NewManagementClient(conn).GetRegisterTicket(ctx, &clusterpb.GetRegisterTicketRequest{})
	wantCode(t, "ephemeral GetRegisterTicket", err, codes.PermissionDenied, "ephemeral")
	_, err = clusterpb.NewManagementClient(conn).ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: k.Public().(ed25519.PublicKey)})
	wantCode(t, "ephemeral ApproveNode", err, codes.PermissionDenied, "ephemeral")
	// A node on an owner-only RPC: refused.
	nconn := withCreds(t, a.addr(), a.creds)
	_, err = clusterpb.NewManagementClient(nconn).GetRegisterTicket(ctx, &clusterpb.GetRegisterTicketRequest{})
	wantCode(t, "node GetRegisterTicket", err, codes.PermissionDenied, "node")
	// The owner on a node-only RPC: refused.
	oconn := withCreds(t, a.addr(), f.ownerCreds(a))
	_, err = clusterpb.NewCuratorClient(oconn).UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{NodeId: a.id})
	wantCode(t, "owner UpdateNodeStatus", err, codes.PermissionDenied, "owner")
	// No client certificate at all.
	anon := testutil.Dial(t, a.addr(), credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}))
	_, err = clusterpb.NewManagementClient(anon).GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
	wantCode(t, "anonymous GetClusterInfo", err, codes.Unauthenticated)

	info, err := clusterpb.NewManagementClient(nconn).GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
	mustOK(t, "node GetClusterInfo", err)
	if !bytes.Equal(info.CaCertificate, f.ca.Raw) || len(info.Directory.GetNodes()) != 1 ||
		info.Directory.Nodes[0].Id != a.id || info.Directory.Nodes[0].Addresses[0] != "127.0.0.1" ||
		!bytes.Equal(info.Directory.Nodes[0].PublicKey, a.pub()) || info.Configuration == nil {
		t.Errorf("GetClusterInfo = %v", info)
	}
}
