package curator

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/curator/escrow"
	"plinth.dev/plinth/roleserver/identity"
)

// TestCurator runs the single-member tests on one bootstrapped cluster,
// in order (later steps build on the nodes of earlier ones).
func TestCurator(t *testing.T) {
	c := newCluster(t)
	a := c.members[0]
	ctx := ctxTimeout(t, 2*time.Minute)

	t.Run("Bootstrap idempotent", func(t *testing.T) {
		st := a.running(time.Second)
		kv, err := st.CuratorClient()
		mustOK(t, "client", err)
		defer kv.Close()
		_, join, _ := ed25519.GenerateKey(rand.Reader)
		req := BootstrapRequest{
			NodePublicKey: a.pub(), JoinPublicKey: join.Public().(ed25519.PublicKey),
			OwnerPublicKey: c.owner.Public().(ed25519.PublicKey), TPMUsage: clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED,
		}
		ca, cert, err := Bootstrap(ctx, kv, req)
		mustOK(t, "second Bootstrap", err)
		if !ca.Equal(c.ca) {
			t.Error("second Bootstrap made a new CA")
		}
		if err := pki.Verify(ca, nil, cert, pki.UsageServerAndClient); err != nil || cert.Subject.CommonName != a.id {
			t.Errorf("second Bootstrap certificate: %v, CN %q", err, cert.Subject.CommonName)
		}
		_, other, _ := ed25519.GenerateKey(rand.Reader)
		req.NodePublicKey = other.Public().(ed25519.PublicKey)
		if _, _, err := Bootstrap(ctx, kv, req); err == nil {
			t.Error("Bootstrap by another node over an existing cluster succeeded")
		}
	})

	t.Run("Escrow", func(t *testing.T) {
		// Somebody else's key: refused before any proof.
		_, stranger, _ := ed25519.GenerateKey(rand.Reader)
		conn, creds := ephemeral(t, a.addr(), c.ca, stranger)
		_, err := escrow.TakeOwnership(ctx, clusterpb.NewAAAClient(conn), creds, stranger)
		wantCode(t, "Escrow with a stranger's key", err, codes.PermissionDenied, "owner key")

		// The owner key in Parameters, but a TLS certificate for another
		// key: refused.
		conn, _ = ephemeral(t, a.addr(), c.ca, stranger)
		st, err := clusterpb.NewAAAClient(conn).Escrow(ctx)
		mustOK(t, "Escrow", err)
		st.Send(&clusterpb.EscrowFromClient{Message: &clusterpb.EscrowFromClient_Parameters_{Parameters: &clusterpb.EscrowFromClient_Parameters{
			RequestedIdentityName: "owner", PublicKey: c.owner.Public().(ed25519.PublicKey)}}})
		_, err = st.Recv()
		wantCode(t, "Escrow with the owner key for another TLS key", err, codes.PermissionDenied, "TLS certificate")

		// The owner key, but a proof signed by another key: refused.
		conn, creds = ephemeral(t, a.addr(), c.ca, c.owner)
		st, err = clusterpb.NewAAAClient(conn).Escrow(ctx)
		mustOK(t, "Escrow", err)
		st.Send(&clusterpb.EscrowFromClient{Message: &clusterpb.EscrowFromClient_Parameters_{Parameters: &clusterpb.EscrowFromClient_Parameters{
			RequestedIdentityName: "owner", PublicKey: c.owner.Public().(ed25519.PublicKey)}}})
		msg, err := st.Recv()
		mustOK(t, "NeededProofs", err)
		if len(msg.GetNeededProofs().GetNonce()) != 32 {
			t.Fatalf("nonce: %v", msg)
		}
		state, _ := creds.State()
		sig, _ := escrow.EscrowProof(stranger, msg.GetNeededProofs().Nonce, state)
		st.Send(&clusterpb.EscrowFromClient{Message: &clusterpb.EscrowFromClient_Proof_{Proof: &clusterpb.EscrowFromClient_Proof{Signature: sig}}})
		_, err = st.Recv()
		wantCode(t, "Escrow with a bad proof", err, codes.PermissionDenied, "proof")

		// The real thing.
		oc := c.ownerCreds(a)
		if !identity.IsOwner(oc.Certificate) {
			t.Errorf("escrowed certificate is not an owner certificate: %v", oc.Certificate.Subject)
		}
	})

	t.Run("permissions", func(t *testing.T) {
		// Owner: accepted.
		ticket := c.ticket(a)
		if len(ticket) != 32 {
			t.Errorf("ticket has %d bytes", len(ticket))
		}
		// Ephemeral caller on Management: refused.
		_, k, _ := ed25519.GenerateKey(rand.Reader)
		conn, _ := ephemeral(t, a.addr(), c.ca, k)
		_, err := clusterpb.NewManagementClient(conn).GetRegisterTicket(ctx, &clusterpb.GetRegisterTicketRequest{})
		wantCode(t, "ephemeral GetRegisterTicket", err, codes.PermissionDenied, "ephemeral")
		_, err = clusterpb.NewManagementClient(conn).ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: k.Public().(ed25519.PublicKey)})
		wantCode(t, "ephemeral ApproveNode", err, codes.PermissionDenied, "ephemeral")
		// A node on an owner-only RPC: refused.
		nconn := withCreds(t, a.addr(), a.creds)
		_, err = clusterpb.NewManagementClient(nconn).GetRegisterTicket(ctx, &clusterpb.GetRegisterTicketRequest{})
		wantCode(t, "node GetRegisterTicket", err, codes.PermissionDenied, "node")
		// The owner on a node-only RPC: refused.
		oconn := withCreds(t, a.addr(), c.ownerCreds(a))
		_, err = clusterpb.NewCuratorClient(oconn).UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{NodeId: a.id})
		wantCode(t, "owner UpdateNodeStatus", err, codes.PermissionDenied, "owner")
		// No client certificate at all.
		anon := dial(t, a.addr(), credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}))
		_, err = clusterpb.NewManagementClient(anon).GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
		wantCode(t, "anonymous GetClusterInfo", err, codes.Unauthenticated)

		info, err := clusterpb.NewManagementClient(nconn).GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
		mustOK(t, "node GetClusterInfo", err)
		if !bytes.Equal(info.CaCertificate, c.ca.Raw) || len(info.Directory.GetNodes()) != 1 ||
			info.Directory.Nodes[0].Id != a.id || info.Directory.Nodes[0].Addresses[0] != "127.0.0.1" ||
			!bytes.Equal(info.Directory.Nodes[0].PublicKey, a.pub()) || info.Configuration == nil {
			t.Errorf("GetClusterInfo = %v", info)
		}
	})

	var b *member
	var bJoin ed25519.PrivateKey
	var bCUK []byte
	t.Run("lifecycle", func(t *testing.T) {
		b = c.newMember("b")
		conn, creds := ephemeral(t, a.addr(), c.ca, b.key)
		cur := clusterpb.NewCuratorClient(conn)
		mg := c.mgmt(a)
		reg := &clusterpb.RegisterNodeRequest{
			RegisterTicket: []byte("not the ticket"),
			Status:         &clusterpb.NodeStatus{Addresses: []string{"127.0.0.1"}},
			TpmUsage:       clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED,
		}
		_, err := cur.RegisterNode(ctx, reg)
		wantCode(t, "register with a wrong ticket", err, codes.PermissionDenied, "register ticket is not valid")

		reg.RegisterTicket = c.ticket(a)
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
		if n := c.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_NEW || !bytes.Equal(n.PublicKey, b.pub()) ||
			n.TpmUsage != clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED || n.Status.GetAddresses()[0] != "127.0.0.1" {
			t.Fatalf("after RegisterNode: %v", n)
		}
		mustOK(t, "RegisterNode again", second(cur.RegisterNode(ctx, reg)))
		if n := c.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_NEW {
			t.Fatalf("after second RegisterNode: %v", n.State)
		}

		_, _, err = commitErr(t, conn, creds)
		wantCode(t, "commit before approve", err, codes.FailedPrecondition, "not approved")

		_, stranger, _ := ed25519.GenerateKey(rand.Reader)
		_, err = mg.ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: stranger.Public().(ed25519.PublicKey)})
		wantCode(t, "approve an unknown key", err, codes.NotFound)
		mustOK(t, "ApproveNode", second(mg.ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: b.pub()})))
		if n := c.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_STANDBY {
			t.Fatalf("after ApproveNode: %v", n.State)
		}
		// Approving twice is refused and changes nothing.
		_, err = mg.ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: b.pub()})
		wantCode(t, "ApproveNode twice", err, codes.FailedPrecondition, "already approved")
		if n := c.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_STANDBY {
			t.Fatalf("after second ApproveNode: %v", n.State)
		}

		// A proof for another connection does not count.
		_, otherCreds := ephemeral(t, a.addr(), c.ca, b.key)
		_, bJoin, _ = ed25519.GenerateKey(rand.Reader)
		otherState, _ := otherCreds.State()
		proof, _ := identity.SessionProof(bJoin, otherState, identity.ExporterCommitNode, nil)
		_, err = cur.CommitNode(ctx, &clusterpb.CommitNodeRequest{JoinPublicKey: bJoin.Public().(ed25519.PublicKey), JoinKeyProof: proof})
		wantCode(t, "commit with a proof from another session", err, codes.PermissionDenied, "join_key_proof")

		resp, err := commit(t, conn, creds, bJoin)
		mustOK(t, "CommitNode", err)
		if b.creds, err = identity.NewCredentials(b.key, resp.NodeCertificate, resp.CaCertificate); err != nil {
			t.Fatalf("CommitNode credentials: %v", err)
		}
		if b.creds.ID() != b.id || !b.creds.CA.Equal(c.ca) || len(resp.ClusterUnlockKey) != 32 {
			t.Fatalf("CommitNode: id %s, CUK %d bytes", b.creds.ID(), len(resp.ClusterUnlockKey))
		}
		bCUK = resp.ClusterUnlockKey
		if n := c.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_UP {
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
		if n := c.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_UP {
			t.Fatalf("approve changed an UP node to %v", n.State)
		}

		// Rejoin with the join key.
		cuk, err := join(t, a.addr(), c.ca, bJoin)
		mustOK(t, "JoinNode", err)
		if !bytes.Equal(cuk, bCUK) {
			t.Error("JoinNode returned another cluster unlock key")
		}
		_, err = join(t, a.addr(), c.ca, stranger)
		wantCode(t, "JoinNode with an unknown key", err, codes.NotFound, "join key")
		jconn, _ := ephemeral(t, a.addr(), c.ca, bJoin)
		_, err = clusterpb.NewCuratorClient(jconn).JoinNode(ctx, &clusterpb.JoinNodeRequest{UsageProof: make([]byte, 64)})
		wantCode(t, "JoinNode with a bad proof", err, codes.PermissionDenied, "usage_proof")
		// The node key is not the join key.
		_, err = join(t, a.addr(), c.ca, b.key)
		wantCode(t, "JoinNode with the node key", err, codes.NotFound)

		// The node updates its own status, not another's.
		bc := clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds))
		mustOK(t, "UpdateNodeStatus", second(bc.UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{
			NodeId: b.id, Status: &clusterpb.NodeStatus{Addresses: []string{"127.0.0.1", "::1"}, Version: "v2", BootCount: 7},
		})))
		if n := c.getNode(a, b.id); n.Status.GetVersion() != "v2" || n.Status.BootCount != 7 {
			t.Errorf("status after UpdateNodeStatus: %v", n.Status)
		}
		_, err = bc.UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{NodeId: a.id, Status: &clusterpb.NodeStatus{}})
		wantCode(t, "UpdateNodeStatus for another node", err, codes.PermissionDenied, a.id)
		if n := c.getNode(a, a.id); n.Status.GetVersion() != "test" {
			t.Errorf("another node's status changed: %v", n.Status)
		}
	})

	t.Run("roles", func(t *testing.T) {
		mg := c.mgmt(a)
		on, off := proto.Bool(true), proto.Bool(false)
		_, err := mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: b.id}, KubernetesController: on})
		wantCode(t, "controller without consensus", err, codes.FailedPrecondition, "ConsensusMember")
		_, err = mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: a.id}, ConsensusMember: off, KubernetesController: off})
		wantCode(t, "removing the last consensus member", err, codes.FailedPrecondition, "last consensus member")
		_, err = mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: "plinth-nosuchnode"}, KubernetesWorker: on})
		wantCode(t, "roles of an unknown node", err, codes.NotFound)

		// IssueCertificate needs the worker role.
		bc := clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds))
		clientPub, _, _ := ed25519.GenerateKey(rand.Reader)
		serverPub, _, _ := ed25519.GenerateKey(rand.Reader)
		req := &clusterpb.IssueCertificateRequest{Kind: &clusterpb.IssueCertificateRequest_KubernetesWorker_{
			KubernetesWorker: &clusterpb.IssueCertificateRequest_KubernetesWorker{KubeletClientPublicKey: clientPub, KubeletServerPublicKey: serverPub, ProxyPublicKey: serverPub}}}
		_, err = bc.IssueCertificate(ctx, req)
		wantCode(t, "IssueCertificate without the worker role", err, codes.PermissionDenied, "KubernetesWorker")

		mustOK(t, "UpdateNodeRoles worker", second(mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{
			Node: &clusterpb.UpdateNodeRolesRequest_PublicKey{PublicKey: b.pub()}, KubernetesWorker: on})))
		if n := c.getNode(a, b.id); n.Roles.GetKubernetesWorker() == nil || n.Roles.GetConsensusMember() != nil {
			t.Fatalf("roles after UpdateNodeRoles: %v", n.Roles)
		}
		resp, err := bc.IssueCertificate(ctx, req)
		mustOK(t, "IssueCertificate", err)
		w := resp.GetKubernetesWorker()
		k8sCA, err := x509.ParseCertificate(w.GetIdentityCaCertificate())
		mustOK(t, "Kubernetes CA", err)
		if k8sCA.Equal(c.ca) {
			t.Error("the Kubernetes CA is the cluster CA")
		}
		cc, err := x509.ParseCertificate(w.KubeletClientCertificate)
		mustOK(t, "client certificate", err)
		if err := pki.Verify(k8sCA, nil, cc, pki.UsageClient); err != nil || cc.Subject.CommonName != "system:node:"+b.id ||
			len(cc.Subject.Organization) != 1 || cc.Subject.Organization[0] != "system:nodes" || !ed25519.PublicKey(clientPub).Equal(cc.PublicKey) {
			t.Errorf("kubelet client certificate: %v, %v", err, cc.Subject)
		}
		sc, err := x509.ParseCertificate(w.KubeletServerCertificate)
		mustOK(t, "server certificate", err)
		servingCA, err := x509.ParseCertificate(w.GetKubeletServingCaCertificate())
		mustOK(t, "kubelet serving CA", err)
		if err := pki.Verify(servingCA, nil, sc, pki.UsageServer); err != nil || sc.VerifyHostname(b.id) != nil ||
			sc.VerifyHostname(observedAt(b.id)[0].String()) != nil || sc.VerifyHostname("127.0.0.1") == nil {
			t.Errorf("kubelet server certificate: %v, %v %v (want the node's ID and observed address, never loopback)", err, sc.DNSNames, sc.IPAddresses)
		}
		// The same CA the second time.
		resp2, err := bc.IssueCertificate(ctx, req)
		mustOK(t, "IssueCertificate again", err)
		if !bytes.Equal(resp2.GetKubernetesWorker().IdentityCaCertificate, k8sCA.Raw) {
			t.Error("second IssueCertificate used another CA")
		}
	})

	t.Run("heartbeat", func(t *testing.T) {
		bc := clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds))
		hctx, stop := ctxTimeoutCancel(t, time.Minute)
		hb, err := bc.Heartbeat(hctx)
		mustOK(t, "Heartbeat", err)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				if hb.Send(&clusterpb.HeartbeatRequest{}) != nil {
					return
				}
				if _, err := hb.Recv(); err != nil {
					return
				}
				select {
				case <-hctx.Done():
					return
				case <-time.After(200 * time.Millisecond):
				}
			}
		}()
		eventually(t, 10*time.Second, "HEALTHY after heartbeats", func() error {
			n := c.getNode(a, b.id)
			if n.Health != clusterpb.NodeHealth_NODE_HEALTH_HEALTHY || n.LastHeartbeatUnixNanos == 0 {
				return errorf("health %v, last heartbeat %d", n.Health, n.LastHeartbeatUnixNanos)
			}
			return nil
		})
		// Written to etcd for the other members (rate-limited).
		eventually(t, 10*time.Second, "heartbeat stored in etcd", func() error {
			kv, _, err := a.cur.backend()
			if err != nil {
				return err
			}
			if v, _, err := getValue(ctx, kv, heartbeatKey(b.id)); err != nil || parseNanos(v) == 0 {
				return errorf("stored heartbeat = %q, %v", v, err)
			}
			return nil
		})
		stop()
		<-done
		stopped := time.Now()
		eventually(t, 10*time.Second, "HEARTBEAT_TIMEOUT after heartbeats stop", func() error {
			n := c.getNode(a, b.id)
			if n.Health != clusterpb.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT {
				return errorf("health %v", n.Health)
			}
			return nil
		})
		if d := time.Since(stopped); d < testHeartbeatTimeout-testHeartbeatTimeout/3-100*time.Millisecond {
			t.Errorf("HEARTBEAT_TIMEOUT only %v after the last heartbeat", d)
		}
		// Node a never sent a heartbeat and the leader is old by now.
		if n := c.getNode(a, a.id); n.Health != clusterpb.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT || n.LastHeartbeatUnixNanos != 0 {
			t.Errorf("a: health %v, last heartbeat %d", n.Health, n.LastHeartbeatUnixNanos)
		}
	})

	t.Run("watch and decommission", func(t *testing.T) {
		oc := clusterpb.NewCuratorClient(withCreds(t, a.addr(), c.ownerCreds(a)))
		wctx, cancel := ctxTimeoutCancel(t, time.Minute)
		defer cancel()
		all, err := oc.Watch(wctx, &clusterpb.WatchRequest{Kind: &clusterpb.WatchRequest_NodesInCluster_{NodesInCluster: &clusterpb.WatchRequest_NodesInCluster{}}})
		mustOK(t, "Watch all", err)
		bc := clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds))
		self, err := bc.Watch(wctx, &clusterpb.WatchRequest{Kind: &clusterpb.WatchRequest_NodeInCluster_{NodeInCluster: &clusterpb.WatchRequest_NodeInCluster{NodeId: b.id}}})
		mustOK(t, "Watch self", err)

		seen := map[string]clusterpb.NodeState{}
		for {
			ev, err := all.Recv()
			mustOK(t, "Watch all replay", err)
			for _, n := range ev.Nodes {
				seen[n.Id] = n.State
			}
			if ev.Progress == clusterpb.WatchEvent_PROGRESS_LAST_BACKLOGGED {
				break
			}
		}
		if len(seen) != 2 || seen[a.id] != clusterpb.NodeState_NODE_STATE_UP || seen[b.id] != clusterpb.NodeState_NODE_STATE_UP {
			t.Fatalf("replay: %v", seen)
		}
		ev, err := self.Recv()
		mustOK(t, "Watch self replay", err)
		if len(ev.Nodes) != 1 || ev.Nodes[0].Id != b.id || ev.Nodes[0].Roles.GetKubernetesWorker() == nil || ev.Progress != clusterpb.WatchEvent_PROGRESS_LAST_BACKLOGGED {
			t.Fatalf("self replay: %v", ev)
		}

		// A new node shows up live.
		d := c.newMember("d")
		conn, _ := ephemeral(t, a.addr(), c.ca, d.key)
		mustOK(t, "RegisterNode d", second(clusterpb.NewCuratorClient(conn).RegisterNode(ctx, &clusterpb.RegisterNodeRequest{
			RegisterTicket: c.ticket(a), TpmUsage: clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED})))
		ev, err = all.Recv()
		mustOK(t, "Watch all live", err)
		if len(ev.Nodes) != 1 || ev.Nodes[0].Id != d.id || ev.Nodes[0].State != clusterpb.NodeState_NODE_STATE_NEW {
			t.Fatalf("live event: %v", ev)
		}

		// Decommission b: tombstones for both watchers.
		mg := c.mgmt(a)
		mustOK(t, "DecommissionNode", second(mg.DecommissionNode(ctx, &clusterpb.DecommissionNodeRequest{Id: b.id})))
		mustOK(t, "DecommissionNode twice", second(mg.DecommissionNode(ctx, &clusterpb.DecommissionNodeRequest{Id: b.id})))
		for name, s := range map[string]clusterpb.Curator_WatchClient{"all": all, "self": self} {
			ev, err := s.Recv()
			mustOK(t, "Watch "+name+" after decommission", err)
			if len(ev.Tombstones) != 1 || ev.Tombstones[0].NodeId != b.id || len(ev.Nodes) != 0 {
				t.Errorf("Watch %s after decommission: %v", name, ev)
			}
		}
		if n := c.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_DECOMMISSIONED || n.Roles.GetKubernetesWorker() != nil {
			t.Errorf("after DecommissionNode: %v", n)
		}

		// Locked out for good.
		_, err = join(t, a.addr(), c.ca, bJoin)
		wantCode(t, "JoinNode of a decommissioned node", err, codes.PermissionDenied, "decommissioned")
		rconn, _ := ephemeral(t, a.addr(), c.ca, b.key)
		_, err = clusterpb.NewCuratorClient(rconn).RegisterNode(ctx, &clusterpb.RegisterNodeRequest{
			RegisterTicket: c.ticket(a), TpmUsage: clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED})
		wantCode(t, "RegisterNode of a decommissioned key", err, codes.PermissionDenied, "decommissioned")
		_, err = mg.ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: b.pub()})
		wantCode(t, "ApproveNode of a decommissioned node", err, codes.FailedPrecondition, "decommissioned")
		_, err = bc.UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{NodeId: b.id, Status: &clusterpb.NodeStatus{}})
		wantCode(t, "UpdateNodeStatus of a decommissioned node", err, codes.PermissionDenied, "decommissioned")
		// Reads too: its certificate still chains to the CA, its record
		// does not let it in.
		_, err = recvFirst(clusterpb.NewManagementClient(withCreds(t, a.addr(), b.creds)).GetNodes(ctx, &clusterpb.GetNodesRequest{}))
		wantCode(t, "GetNodes by a decommissioned node", err, codes.PermissionDenied, "decommissioned")
		_, err = recvFirst(bc.GetCurrentLeader(ctx, &clusterpb.GetCurrentLeaderRequest{}))
		wantCode(t, "GetCurrentLeader by a decommissioned node", err, codes.PermissionDenied, "decommissioned")
		_, err = mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: b.id}, KubernetesWorker: proto.Bool(true)})
		wantCode(t, "UpdateNodeRoles of a decommissioned node", err, codes.FailedPrecondition, "DECOMMISSIONED")
		_, err = mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: d.id}, KubernetesWorker: proto.Bool(true)})
		wantCode(t, "UpdateNodeRoles of a NEW node", err, codes.FailedPrecondition, "NEW")

		// A watch of a decommissioned node replays as a tombstone.
		again, err := oc.Watch(wctx, &clusterpb.WatchRequest{Kind: &clusterpb.WatchRequest_NodeInCluster_{NodeInCluster: &clusterpb.WatchRequest_NodeInCluster{NodeId: b.id}}})
		mustOK(t, "Watch decommissioned", err)
		ev, err = again.Recv()
		mustOK(t, "Watch decommissioned replay", err)
		if len(ev.Nodes) != 0 || len(ev.Tombstones) != 1 || ev.Progress != clusterpb.WatchEvent_PROGRESS_LAST_BACKLOGGED {
			t.Errorf("decommissioned replay: %v", ev)
		}
		_, err = mustRecv(oc.Watch(wctx, &clusterpb.WatchRequest{}))
		wantCode(t, "Watch without kind", err, codes.InvalidArgument)

		// GetNodes filters.
		s, err := mg.GetNodes(ctx, &clusterpb.GetNodesRequest{Filter: "node.state == NODE_STATE_NEW"})
		mustOK(t, "GetNodes filter", err)
		var ids []string
		for {
			n, err := s.Recv()
			if err == io.EOF {
				break
			}
			mustOK(t, "GetNodes filter", err)
			ids = append(ids, n.Id)
		}
		if len(ids) != 1 || ids[0] != d.id {
			t.Errorf("GetNodes NEW = %v, want [%s]", ids, d.id)
		}
		s, _ = mg.GetNodes(ctx, &clusterpb.GetNodesRequest{Filter: "node.frobnicate(42)"})
		_, err = s.Recv()
		wantCode(t, "GetNodes with a bad filter", err, codes.InvalidArgument)
	})
}

func second[T any](_ T, err error) error { return err }

func mustRecv(s clusterpb.Curator_WatchClient, err error) (*clusterpb.WatchEvent, error) {
	if err != nil {
		return nil, err
	}
	return s.Recv()
}

// commitErr commits with a fresh join key.
func commitErr(t *testing.T, conn *grpc.ClientConn, creds *identity.CapturingCredentials) (*clusterpb.CommitNodeResponse, ed25519.PrivateKey, error) {
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	r, err := commit(t, conn, creds, k)
	return r, k, err
}

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
