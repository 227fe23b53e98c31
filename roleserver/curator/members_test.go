package curator

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
)

// TestPendingConsensusMembers gives the ConsensusMember role to two nodes
// back to back: both calls succeed although etcd admits one learner at a
// time. The second node is pending until the first one has joined and
// been promoted; then the leader adds it by itself, and both end as
// voters. A third node's pending role is taken back before it is added:
// pending is cleared and it never becomes a member.
func TestPendingConsensusMembers(t *testing.T) {
	c := newCluster(t)
	a := c.members[0]
	ctx := ctxTimeout(t, 3*time.Minute)
	mg := c.mgmt(a)
	b, cc, d := c.newMember("b"), c.newMember("c"), c.newMember("d")
	for _, m := range []*member{b, cc, d} {
		c.addNode(a, m)
	}
	setConsensus := func(m *member, on bool) error {
		_, err := mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{
			Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: m.id}, ConsensusMember: proto.Bool(on),
		})
		return err
	}
	// A fresh single-member etcd refuses additions for a moment (not yet
	// connected to a quorum long enough): that is pending too, so the
	// first call may already queue b.
	mustOK(t, "consensus member b", setConsensus(b, true))
	mustOK(t, "consensus member c, while b is a learner", setConsensus(cc, true))
	mustOK(t, "consensus member d", setConsensus(d, true))

	// b gets its role first (at once, or from the leader's loop).
	var roleB *clusterpb.NodeRoles_ConsensusMember
	eventually(t, 30*time.Second, "b's consensus role", func() error {
		n := c.getNode(a, b.id)
		if roleB = n.GetRoles().GetConsensusMember(); roleB == nil || n.ConsensusMemberPending {
			return fmt.Errorf("b: role %v pending %v", roleB, n.ConsensusMemberPending)
		}
		return nil
	})
	// c waits behind b's learner (which has not even started yet).
	if n := c.getNode(a, cc.id); !n.ConsensusMemberPending || n.GetRoles().GetConsensusMember() != nil {
		t.Fatalf("c while b is a learner: pending %v, role %v", n.ConsensusMemberPending, n.GetRoles().GetConsensusMember())
	}
	// Taking d's role back clears its pending membership.
	mustOK(t, "removing d's pending role", setConsensus(d, false))
	if n := c.getNode(a, d.id); n.ConsensusMemberPending || n.GetRoles().GetConsensusMember() != nil {
		t.Fatalf("d after removal: pending %v, role %v", n.ConsensusMemberPending, n.GetRoles().GetConsensusMember())
	}

	startMember := func(m *member, role *clusterpb.NodeRoles_ConsensusMember) {
		t.Helper()
		jc, err := JoinClusterFromRole(role)
		mustOK(t, "JoinClusterFromRole "+m.name, err)
		m.startConsensus(jc)
		m.running(2 * time.Minute) // only reported once promoted
	}
	startMember(b, roleB)

	// b was promoted: the leader adds c by itself.
	var roleC *clusterpb.NodeRoles_ConsensusMember
	eventually(t, time.Minute, "c's consensus role, added by the leader", func() error {
		n := c.getNode(a, cc.id)
		if roleC = n.GetRoles().GetConsensusMember(); roleC == nil || n.ConsensusMemberPending {
			return fmt.Errorf("c: role %v pending %v", roleC, n.ConsensusMemberPending)
		}
		return nil
	})
	startMember(cc, roleC)

	eventually(t, time.Minute, "b and c voters", func() error {
		for _, m := range []*member{a, b, cc} {
			if got := c.getNode(a, m.id).ConsensusMembership; got != clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER {
				return fmt.Errorf("%s is %v", m.name, got)
			}
		}
		return nil
	})
	ml, err := a.running(time.Second).ClusterClient().MemberList(ctx)
	mustOK(t, "MemberList", err)
	if len(ml.Members) != 3 {
		t.Errorf("%d etcd members, want 3 (d's pending role was taken back): %v", len(ml.Members), ml.Members)
	}
	if n := c.getNode(a, d.id); n.ConsensusMemberPending || n.ConsensusMembership != clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_NONE {
		t.Errorf("d: pending %v membership %v", n.ConsensusMemberPending, n.ConsensusMembership)
	}
}
