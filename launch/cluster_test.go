//go:build built

package launch

import (
	"net/netip"
	"testing"

	"plinth.dev/plinth/api/clusterpb"
)

// logWriter sends progress lines to the test log.
func TestClusterMatch(t *testing.T) {
	c := &Cluster{}
	a := &ClusterNode{Name: "node0", Addr: netip.MustParseAddr("10.42.0.10"), used: true, id: "plinth-a"}
	b := &ClusterNode{Name: "node1", Addr: netip.MustParseAddr("10.42.0.11"), used: true}
	c.slots = []*ClusterNode{a, b}
	recA := &clusterpb.Node{Id: "plinth-a", State: clusterpb.NodeState_NODE_STATE_UP, Status: &clusterpb.NodeStatus{Addresses: []string{"10.42.0.11"}}}
	recB := &clusterpb.Node{Id: "plinth-b", State: clusterpb.NodeState_NODE_STATE_NEW, Status: &clusterpb.NodeStatus{Addresses: []string{"10.42.0.11"}}}
	noAddr := &clusterpb.Node{Id: "plinth-c", State: clusterpb.NodeState_NODE_STATE_NEW}
	gone := &clusterpb.Node{Id: "plinth-d", State: clusterpb.NodeState_NODE_STATE_DECOMMISSIONED}

	// A known ID wins over addresses (addresses can move).
	if got := c.match(a, []*clusterpb.Node{recB, recA}); got != recA {
		t.Errorf("node0 matched %v", got)
	}
	// By address; node0's stale address claim does not count for node1.
	if got := c.match(b, []*clusterpb.Node{recA, recB, noAddr}); got != recB {
		t.Errorf("node1 matched %v", got)
	}
	// No address reported: the one unclaimed live node.
	if got := c.match(b, []*clusterpb.Node{recA, noAddr, gone}); got != noAddr {
		t.Errorf("node1 without address matched %v", got)
	}
	// Two candidates: no guess.
	if got := c.match(b, []*clusterpb.Node{recA, noAddr, {Id: "plinth-e", State: clusterpb.NodeState_NODE_STATE_NEW}}); got != nil {
		t.Errorf("ambiguous match %v", got)
	}
	// Two nodes registering side by side: the only unclaimed record is
	// the other one's (it names the other's address), not node2's.
	n2 := &ClusterNode{Name: "node2", Addr: netip.MustParseAddr("10.42.0.12"), used: true}
	c.slots = append(c.slots, n2)
	if got := c.match(n2, []*clusterpb.Node{recA, recB}); got != nil {
		t.Errorf("node2 took node1's record %v", got)
	}
}
