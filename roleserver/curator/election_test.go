package curator

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/identity"
)

// TestConsensusRolesAndFailover grows a cluster to three consensus members
// through UpdateNodeRoles (each new member starting from the JoinCluster
// stored in its role), runs a curator on each, and stops the leader.
func TestConsensusRolesAndFailover(t *testing.T) {
	c := newCluster(t)
	a := c.members[0]
	ctx := ctxTimeout(t, 3*time.Minute)
	mg := c.mgmt(a)

	for _, name := range []string{"b", "c"} {
		m := c.newMember(name)
		joinKey, cuk := c.addNode(a, m)
		eventually(t, 30*time.Second, "UpdateNodeRoles ConsensusMember for "+name, func() error {
			_, err := mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{
				Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: m.id}, ConsensusMember: proto.Bool(true), KubernetesController: proto.Bool(true),
			})
			return err
		})
		// etcd may not admit the member at once (just after the previous
		// one joined it waits until every voter has been connected for a
		// while): the role is then pending and the leader adds it.
		var role *clusterpb.NodeRoles_ConsensusMember
		eventually(t, 30*time.Second, "ConsensusMember role of "+name, func() error {
			if role = c.getNode(a, m.id).Roles.GetConsensusMember(); role == nil {
				return errors.New("no role yet (pending)")
			}
			return nil
		})
		if len(role.CaCertificate) == 0 || len(role.NodeCertificate) == 0 || len(role.InitialCrl) == 0 {
			t.Fatalf("%s: ConsensusMember role without join data: %v", name, role)
		}
		peers := map[string]string{}
		for _, p := range role.Peers {
			peers[p.Name] = p.Url
		}
		if peers[m.id] != "https://127.0.0.1:"+itoa(m.peerPort) || peers[a.id] != "https://127.0.0.1:"+itoa(a.peerPort) {
			t.Fatalf("%s: peers %v", name, peers)
		}
		// Added as a learner; it becomes a voter once it caught up.
		ml, err := a.running(time.Second).ClusterClient().MemberList(ctx)
		mustOK(t, "MemberList", err)
		learner := false
		for _, mem := range ml.Members {
			learner = learner || (mem.IsLearner && len(mem.PeerURLs) == 1 && mem.PeerURLs[0] == peers[m.id])
		}
		if !learner {
			t.Fatalf("%s is not a learner after UpdateNodeRoles: %v", name, ml.Members)
		}
		jc, err := JoinClusterFromRole(role)
		mustOK(t, "JoinClusterFromRole", err)
		m.startConsensus(jc)
		st := m.running(time.Minute) // only reported once promoted from learner
		ml, err = st.ClusterClient().MemberList(ctx)
		mustOK(t, "MemberList", err)
		voter := false
		for _, mem := range ml.Members {
			voter = voter || (mem.Name == m.id && !mem.IsLearner)
		}
		if !voter {
			t.Fatalf("%s is not a voting member once running: %v", name, ml.Members)
		}
		m.startCurator(c.peerPort)
		// The node can still rejoin with its join key, through the leader.
		got, err := join(t, a.addr(), c.ca, joinKey)
		if err != nil || !bytes.Equal(got, cuk) {
			t.Fatalf("%s: JoinNode = %x, %v", name, got, err)
		}
	}
	// The leader is normally a, which leads since it bootstrapped; under
	// load (race detector, the test's one-second lease) its leadership
	// may have moved meanwhile. From here on, a is whoever leads.
	lr := nextLeader(t, c.leaderStream(c.members[0]), 30*time.Second, func(r *clusterpb.GetCurrentLeaderResponse) bool { return r.Id != "" })
	var others []*member
	for _, m := range c.members {
		if m.id == lr.Id {
			a = m
		} else {
			others = append(others, m)
		}
	}
	b, cc := others[0], others[1]

	// Every curator names the same leader; only the leader says so.
	for _, m := range c.members {
		r := c.waitLeader(m, a.id)
		if r.Host != "127.0.0.1" || r.Port != int32(a.curatorPort) || r.ThisIsLeader != (m == a) {
			t.Errorf("GetCurrentLeader on %s = %v", m.name, r)
		}
	}
	// The leader's new address reaches a stream already open on a
	// follower (which waits on a watch of the leader's node record), and
	// so does the old one again.
	onB := c.leaderStream(b)
	nextLeader(t, onB, 30*time.Second, func(r *clusterpb.GetCurrentLeaderResponse) bool { return r.Id == a.id })
	for _, host := range []string{"127.0.0.2", "127.0.0.1"} {
		_, err := clusterpb.NewCuratorClient(withCreds(t, a.addr(), a.creds)).UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{
			NodeId: a.id, Status: &clusterpb.NodeStatus{Addresses: []string{host}, Version: "test"}})
		mustOK(t, "UpdateNodeStatus of the leader", err)
		nextLeader(t, onB, 30*time.Second, func(r *clusterpb.GetCurrentLeaderResponse) bool { return r.Id == a.id && r.Host == host })
	}

	info, err := mg.GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
	mustOK(t, "GetClusterInfo", err)
	if n := len(info.Directory.GetNodes()); n != 3 {
		t.Errorf("directory has %d nodes, want 3", n)
	}

	// Followers refuse the calls of running nodes, naming the leader, but
	// serve Management and registration (a registering node knows only
	// the curators in its parameters).
	_, k, _ := generateKey()
	conn, _ := ephemeral(t, b.addr(), c.ca, k)
	_, err = clusterpb.NewCuratorClient(conn).RegisterNode(ctx, &clusterpb.RegisterNodeRequest{RegisterTicket: c.ticket(a), TpmUsage: clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED})
	mustOK(t, "RegisterNode on a follower", err)
	if n := c.getNode(a, identity.NodeID(k.Public().(ed25519.PublicKey))); n == nil || n.State != clusterpb.NodeState_NODE_STATE_NEW {
		t.Errorf("registered through a follower: %v", n)
	}
	_, err = clusterpb.NewCuratorClient(withCreds(t, b.addr(), b.creds)).UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{NodeId: b.id})
	wantCode(t, "UpdateNodeStatus on a follower", err, codes.Unavailable, a.id)
	if n := c.getNode(cc, a.id); n.State != clusterpb.NodeState_NODE_STATE_UP {
		t.Errorf("GetNodes on a follower: %v", n)
	}

	// The leader goes away: another takes over, and the stream on a
	// surviving curator says so.
	stream := c.leaderStream(b)
	nextLeader(t, stream, 10*time.Second, func(r *clusterpb.GetCurrentLeaderResponse) bool { return r.Id == a.id })
	stopped := time.Now()
	a.stopCurator()
	a.stopConsensus()
	r := nextLeader(t, stream, 30*time.Second, func(r *clusterpb.GetCurrentLeaderResponse) bool { return r.Id != a.id })
	t.Logf("new leader %s after %v", r.Id, time.Since(stopped))
	var leader, follower *member
	switch r.Id {
	case b.id:
		leader, follower = b, cc
	case cc.id:
		leader, follower = cc, b
	default:
		t.Fatalf("new leader %q is neither b nor c", r.Id)
	}
	if r.ThisIsLeader != (leader == b) || r.Port != int32(leader.curatorPort) || r.Host != "127.0.0.1" {
		t.Errorf("new leader response on b: %v", r)
	}
	c.waitLeader(follower, leader.id)

	// The new leader serves node-facing calls; the follower refuses them.
	lc := clusterpb.NewCuratorClient(withCreds(t, leader.addr(), follower.creds))
	eventually(t, 10*time.Second, "UpdateNodeStatus on the new leader", func() error {
		_, err := lc.UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{
			NodeId: follower.id, Status: &clusterpb.NodeStatus{Addresses: []string{"127.0.0.1"}, Version: "after-failover"},
		})
		return err
	})
	if n := c.getNode(follower, follower.id); n.Status.GetVersion() != "after-failover" {
		t.Errorf("status after failover: %v", n.Status)
	}
	_, err = clusterpb.NewCuratorClient(withCreds(t, follower.addr(), follower.creds)).UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{NodeId: follower.id})
	wantCode(t, "UpdateNodeStatus on the new follower", err, codes.Unavailable, leader.id)

	// Taking the consensus role from the dead node works with two of
	// three members up.
	fm := clusterpb.NewManagementClient(withCreds(t, leader.addr(), c.ownerCreds(leader)))
	_, err = fm.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{
		Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: a.id}, ConsensusMember: proto.Bool(false), KubernetesController: proto.Bool(false),
	})
	mustOK(t, "removing the dead node's consensus role", err)
	if n := c.getNode(leader, a.id); n.Roles.GetConsensusMember() != nil {
		t.Errorf("roles after removal: %v", n.Roles)
	}
	ml, err := leader.running(time.Second).ClusterClient().MemberList(ctx)
	mustOK(t, "MemberList", err)
	if len(ml.Members) != 2 {
		t.Errorf("%d etcd members after removal, want 2", len(ml.Members))
	}
}
