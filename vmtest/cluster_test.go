package vmtest

import (
	"context"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
)

// logWriter sends progress lines to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

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
}

// TestClusterNodeLifecycle runs the harness side of a cluster without the
// role server: a node on the cluster's switch gets its reserved address,
// is reachable through the router (its kernel refuses a closed port), is
// started again after a guest reboot, and stays off after StopNode.
func TestClusterNodeLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	c, err := newCluster(ctx, ClusterOptions{Nodes: 1, SpareSlots: 1, Image: testImage(t), Dir: TestDir(t),
		DiskSizeBytes: testDiskSize, Progress: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(c.slots) != 2 || c.slots[0].Addr != netip.MustParseAddr("10.42.0.10") || c.slots[1].Addr != netip.MustParseAddr("10.42.0.11") {
		t.Fatalf("slots %v %v", c.slots[0].Addr, c.slots[1].Addr)
	}
	for _, n := range c.slots {
		if c.CuratorEndpoint(n) == "" || c.NodeManagementEndpoint(n) == "" || c.CuratorEndpoint(n) == c.NodeManagementEndpoint(n) {
			t.Fatalf("%s: endpoints %q %q", n.Name, c.CuratorEndpoint(n), c.NodeManagementEndpoint(n))
		}
	}
	n := c.slots[0]
	probe := netip.AddrPortFrom(n.Addr, closedPort)
	if err := c.Router.AddForwards(ctx, []netip.AddrPort{probe}); err != nil {
		t.Fatal(err)
	}
	params, _ := BootstrapParametersWithOwner()
	if err := c.setParams(n, params); err != nil {
		t.Fatal(err)
	}
	n.used = true
	if err := c.start(ctx, n); err != nil {
		t.Fatal(err)
	}
	if got := c.Nodes(); len(got) != 1 || got[0] != n || c.Node("node0") != n {
		t.Fatalf("Nodes() = %v", got)
	}
	first := n.VM()
	mustLine(t, ctx, first, `I root.network: configured address .*address=10\.42\.0\.10/24`)
	if !closedByPeer(t, c.Router.Endpoint(probe), 30*time.Second) {
		t.Fatal("the node is not reachable through the router")
	}
	mustLine(t, ctx, first, `I init: node ready`)

	if err := first.CtrlAltDel(ctx); err != nil {
		t.Fatal(err)
	}
	for n.VM() == first {
		if !sleepCtx(ctx, 100*time.Millisecond) {
			t.Fatal("the harness did not start the node again after its reboot")
		}
	}
	second := n.VM()
	wantBootCount(t, ctx, second, "2")
	if !strings.HasSuffix(second.opts.WorkDir, "boot2") {
		t.Errorf("second boot's work dir %s", second.opts.WorkDir)
	}
	if b, err := os.ReadFile(first.ConsolePath()); err != nil || !regexp.MustCompile(`action=reboot`).Match(b) {
		t.Errorf("first boot's console log kept? %v", err)
	}

	mustLine(t, ctx, second, `listening for the power button`)
	if err := c.StopNode(ctx, n, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := second.Wait(ctx); err != nil {
		t.Fatalf("power-off: %v", err)
	}
	time.Sleep(2 * time.Second)
	if n.VM() != second {
		t.Fatal("a stopped node was started again")
	}
}

// TestClusterJoin is the end-to-end cluster test: bootstrap, ownership,
// a second node registered, approved and UP, logs through NodeManagement,
// a reboot through NodeManagement. It needs the role server in the image.
// TODO(integrator): drop the gate once the role server is wired into init.
func TestClusterJoin(t *testing.T) {
	if os.Getenv("PLINTH_VMTEST_CLUSTER") == "" {
		t.Skip("set PLINTH_VMTEST_CLUSTER=1 (needs the role server in the image)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	c, err := LaunchCluster(ctx, ClusterOptions{Nodes: 2, Image: testImage(t), Dir: TestDir(t), DiskSizeBytes: testDiskSize, Progress: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nodes, err := c.Client().Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 {
		t.Fatalf("cluster lists %d nodes: %v", len(nodes), nodes)
	}
	for _, rec := range nodes {
		if rec.GetState() != clusterpb.NodeState_NODE_STATE_UP || c.Node(rec.GetId()) == nil {
			t.Errorf("node %s: %v", rec.GetId(), rec.GetState())
		}
	}
	joined := c.Nodes()[1]
	lines := 0
	err = c.Client().Logs(ctx, joined.ID(), &clusterpb.LogsRequest{Recursive: true, Backlog: -1}, func(*clusterpb.LogEntry) error {
		lines++
		return nil
	})
	if err != nil || lines == 0 {
		t.Fatalf("logs of %s: %d entries, %v", joined.ID(), lines, err)
	}
	if err := c.RebootNode(ctx, joined); err != nil {
		t.Fatal(err)
	}
	if _, err := c.waitNode(ctx, joined, "UP and healthy after the reboot", func(r *clusterpb.Node) bool {
		return r.GetState() == clusterpb.NodeState_NODE_STATE_UP && r.GetHealth() == clusterpb.NodeHealth_NODE_HEALTH_HEALTHY && r.GetStatus().GetBootCount() == 2
	}); err != nil {
		t.Fatal(err)
	}
}
