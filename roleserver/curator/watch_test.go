package curator

import (
	"io"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
)

// TestWatchAndDecommission: Watch replays the cluster (or one node) and
// follows it live; decommissioning a node sends its tombstone to every
// watcher and locks it out of every RPC for good, reads included;
// GetNodes filters.
func TestWatchAndDecommission(t *testing.T) {
	f := newSingle(t)
	a, ctx := f.a, f.ctx
	b, bJoin := f.worker("b")
	oc := clusterpb.NewCuratorClient(withCreds(t, a.addr(), f.ownerCreds(a)))
	wctx, cancel := ctxTimeoutCancel(t, time.Minute)
	defer cancel()
	all, err := oc.Watch(wctx, &clusterpb.WatchRequest{Kind: &clusterpb.WatchRequest_NodesInCluster_{NodesInCluster: &clusterpb.WatchRequest_NodesInCluster{}}})
	mustOK(t, "Watch all", err)
	bc := clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds))
	self, err := bc.Watch(wctx, &clusterpb.WatchRequest{Kind: &clusterpb.WatchRequest_NodeInCluster_{NodeInCluster: &clusterpb.WatchRequest_NodeInCluster{NodeId: b.id}}})
	mustOK(t, "Watch self", err)

	seen := map[string]clusterpb.NodeState{}
	seenAll, seenSelf := map[string]*clusterpb.Node{}, map[string]*clusterpb.Node{}
	for {
		ev, err := recvRecords(all, seenAll)
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
	ev, err := recvRecords(self, seenSelf)
	mustOK(t, "Watch self replay", err)
	if len(ev.Nodes) != 1 || ev.Nodes[0].Id != b.id || ev.Nodes[0].Roles.GetKubernetesWorker() == nil || ev.Progress != clusterpb.WatchEvent_PROGRESS_LAST_BACKLOGGED {
		t.Fatalf("self replay: %v", ev)
	}

	// A new node shows up live.
	d := f.newMember("d")
	conn, _ := ephemeral(t, a.addr(), f.ca, d.key)
	mustOK(t, "RegisterNode d", second(clusterpb.NewCuratorClient(conn).RegisterNode(ctx, &clusterpb.RegisterNodeRequest{
		RegisterTicket: f.ticket(a), TpmUsage: clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED})))
	ev, err = recvRecords(all, seenAll)
	mustOK(t, "Watch all live", err)
	if len(ev.Nodes) != 1 || ev.Nodes[0].Id != d.id || ev.Nodes[0].State != clusterpb.NodeState_NODE_STATE_NEW {
		t.Fatalf("live event: %v", ev)
	}

	// Decommission b: tombstones for both watchers.
	mg := f.mgmt(a)
	mustOK(t, "DecommissionNode", second(mg.DecommissionNode(ctx, &clusterpb.DecommissionNodeRequest{Id: b.id})))
	mustOK(t, "DecommissionNode twice", second(mg.DecommissionNode(ctx, &clusterpb.DecommissionNodeRequest{Id: b.id})))
	for name, s := range map[string]clusterpb.Curator_WatchClient{"all": all, "self": self} {
		seen := map[string]map[string]*clusterpb.Node{"all": seenAll, "self": seenSelf}[name]
		ev, err := recvRecords(s, seen)
		mustOK(t, "Watch "+name+" after decommission", err)
		if len(ev.Tombstones) != 1 || ev.Tombstones[0].NodeId != b.id || len(ev.Nodes) != 0 {
			t.Errorf("Watch %s after decommission: %v", name, ev)
		}
	}
	if n := f.getNode(a, b.id); n.State != clusterpb.NodeState_NODE_STATE_DECOMMISSIONED || n.Roles.GetKubernetesWorker() != nil {
		t.Errorf("after DecommissionNode: %v", n)
	}
	// What a controller node asks to delete its local volumes.
	kv, err := a.running(time.Minute).CuratorClient()
	mustOK(t, "CuratorClient", err)
	defer kv.Close()
	if ids, err := DecommissionedNodes(ctx, kv); err != nil || !slices.Equal(ids, []string{b.id}) {
		t.Errorf("DecommissionedNodes: %v, %v; want [%s]", ids, err, b.id)
	}

	// Locked out for good.
	_, err = join(t, a.addr(), f.ca, bJoin)
	wantCode(t, "JoinNode of a decommissioned node", err, codes.PermissionDenied, "decommissioned")
	rconn, _ := ephemeral(t, a.addr(), f.ca, b.key)
	_, err = clusterpb.NewCuratorClient(rconn).RegisterNode(ctx, &clusterpb.RegisterNodeRequest{
		RegisterTicket: f.ticket(a), TpmUsage: clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED})
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
	_, err = recvFirst(oc.Watch(wctx, &clusterpb.WatchRequest{}))
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
}

// recvRecords is s.Recv without the events that only say that nodes'
// health changed (Watch checks it every healthTick: it comes with
// heartbeats and time, not with records), seen being the records the
// stream sent so far, by ID, without their health.
func recvRecords(s clusterpb.Curator_WatchClient, seen map[string]*clusterpb.Node) (*clusterpb.WatchEvent, error) {
	for {
		ev, err := s.Recv()
		if err != nil {
			return ev, err
		}
		healthOnly := len(ev.Tombstones) == 0 && len(ev.Nodes) > 0 && ev.Progress == clusterpb.WatchEvent_PROGRESS_UNSPECIFIED
		for _, n := range ev.Nodes {
			r := proto.Clone(n).(*clusterpb.Node)
			r.Health, r.LastHeartbeatUnixNanos = clusterpb.NodeHealth_NODE_HEALTH_UNSPECIFIED, 0
			if p := seen[n.Id]; p == nil || !proto.Equal(p, r) {
				healthOnly = false
			}
			seen[n.Id] = r
		}
		if !healthOnly {
			return ev, nil
		}
	}
}
