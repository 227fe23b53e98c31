package roleserver

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/internal/testutil"
	"plinth.dev/plinth/roleserver/rpc"
)

// TestNodeManagementChecksCRL: NodeManagement answers a node's Status
// until the cluster CRL the node receives revokes the caller (it was
// decommissioned); the check is in the shared authorization path.
func TestNodeManagementChecksCRL(t *testing.T) {
	ca, _ := pki.NewCA("cluster", 0)
	self, other := issueCreds(t, ca, false), issueCreds(t, ca, false)
	n := newTestNode(t)
	n.start()
	n.svc.ProvideRegisterData(self, &clusterpb.ClusterDirectory{})
	nm := clusterpb.NewNodeManagementClient(testutil.Dial(t, n.nodeMgmtAddr(), credentials.NewTLS(other.ClientTLSConfig(identity.ServerNode))))
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
