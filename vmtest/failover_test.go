//go:build built

package vmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/identity"
)

// failoverBound is how long the survivors of a power cut of the curator
// leader may take to be HEALTHY at a new leader. Generous: three TCG
// guests share two cores here. Measured times are logged.
const failoverBound = 90 * time.Second

// failover cuts the power of the curator leader of c, three voting
// members, as a power cut does:
//   - the curator leader's QEMU is killed (no shutdown, no FIN: its
//     packets just stop): within failoverBound `plinthctl node list`
//     shows both survivors HEALTHY at a new leader (heartbeats since that
//     leader was elected; before keepalives they stayed attached to the
//     dead leader and showed HEARTBEAT_TIMEOUT, last seen "never");
//   - `plinthctl role add SURVIVOR kubernetes-worker` reaches a survivor
//     that was no worker (its role watch follows the new leader);
//   - the killed node boots again from the same disk and TPM (its boot
//     counter one up) and comes back HEALTHY, an etcd voter again.
//
// TestRollingUpdateAndFailover runs it on a cluster it has just updated.
func failover(t *testing.T, ctx context.Context, c *launch.Cluster, ctl plinthctl) {
	t.Helper()
	nodes := c.Nodes()
	cfg := c.OwnerDir()

	leaderID, err := curatorLeader(ctx, c, nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	dead := c.Node(leaderID)
	if dead == nil {
		t.Fatalf("curator leader %s is none of the nodes", leaderID)
	}
	var survivors []*launch.ClusterNode
	for _, n := range nodes {
		if n != dead {
			survivors = append(survivors, n)
		}
	}
	bootAfter := nodeRecord(t, ctx, c, leaderID).GetStatus().GetBootCount() + 1
	t.Logf("curator leader is %s (%s): cutting its power", dead.Name, leaderID)
	marks := map[*launch.ClusterNode]int{}
	for _, n := range survivors {
		marks[n] = len(n.VM().Lines())
	}
	cut := time.Now()
	if err := c.KillNode(dead); err != nil {
		t.Fatal(err)
	}

	// A new leader among the survivors, then both survivors HEALTHY at it.
	fctx, fcancel := context.WithTimeout(ctx, failoverBound)
	defer fcancel()
	var newLeader string
	for newLeader == "" || newLeader == leaderID {
		if supervisor.Sleep(fctx, time.Second) != nil {
			t.Fatalf("no new curator leader %v after the power cut (last: %q)", failoverBound, newLeader)
		}
		lctx, lcancel := context.WithTimeout(fctx, 10*time.Second)
		newLeader, _ = curatorLeader(lctx, c, survivors[0])
		lcancel()
	}
	t.Logf("new curator leader %s after %v", c.Node(newLeader).Name, time.Since(cut).Round(100*time.Millisecond))
	var last string
	for {
		listed, err := ctl.listJSON(cfg)
		last = fmt.Sprint(err)
		for _, r := range listed {
			last += fmt.Sprintf("\n%s %s %s", r.GetId(), r.GetHealth(), r.GetConsensusMembership())
		}
		healthy := 0
		for _, r := range listed {
			for _, s := range survivors {
				if r.GetId() == s.ID() && launch.UpAndHealthy(r) {
					healthy++
				}
			}
		}
		if err == nil && healthy == len(survivors) {
			break
		}
		if supervisor.Sleep(fctx, 2*time.Second) != nil {
			t.Fatalf("survivors not HEALTHY at the new leader %v after the power cut; last nodes list:\n%s", failoverBound, last)
		}
	}
	t.Logf("survivors HEALTHY at the new leader %v after the power cut (plinthctl polls, each first trying the dead node's curator)", time.Since(cut).Round(100*time.Millisecond))
	t.Log(ctl.run(t, "node", "list", "--config", cfg))
	// What the survivors did, from their consoles (guest clock).
	follow := regexp.MustCompile(`resolver: |lost the curator leader|connected to curator leader|watching this node at curator leader`)
	for _, n := range survivors {
		var seen []string
		for _, l := range n.VM().Lines()[marks[n]:] {
			if follow.MatchString(l) {
				seen = append(seen, l)
			}
		}
		t.Logf("%s after the power cut (host clock at the cut: %s):\n%s", n.Name, cut.UTC().Format("15:04:05.000"), strings.Join(seen, "\n"))
	}

	// A role change reaches a survivor through its role watch.
	var target *launch.ClusterNode
	for _, n := range survivors {
		if nodeRecord(t, ctx, c, n.ID()).GetRoles().GetKubernetesWorker() == nil {
			target = n
		}
	}
	if target == nil {
		t.Fatal("every survivor is a Kubernetes worker already: no role to add")
	}
	t.Log(ctl.run(t, "role", "add", "--config", cfg, target.ID(), "kubernetes-worker"))
	rctx, rcancel := context.WithTimeout(ctx, failoverBound)
	defer rcancel()
	// The role reached the node when it runs the role's runnable (its
	// kubernetes worker restarts with the worker below it).
	if _, err := c.WaitStatus(rctx, target, "its kubernetes-worker role running", func(st *clusterpb.StatusResponse) bool {
		return launch.HasRunnable(st, kubernetesWorkerDN)
	}); err != nil {
		t.Fatalf("%s never saw its kubernetes-worker role: %v", target.Name, err)
	}
	t.Logf("%s got its new role %v after the power cut", target.Name, time.Since(cut).Round(100*time.Millisecond))

	// The killed node comes back: same disk, same TPM, its etcd data.
	if err := c.StartNode(ctx, dead); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if _, err := c.WaitNode(ctx, n, "a HEALTHY voter after the leader came back", voter); err != nil {
			t.Fatal(err)
		}
	}
	wantNodeBootCount(t, ctx, c, dead, bootAfter)
	t.Log(ctl.run(t, "node", "list", "--config", cfg))
}

// kubernetesWorkerDN is the supervisor runnable a node runs while it has
// the KubernetesWorker role.
const kubernetesWorkerDN = "root.roleserver.kubernetes.worker"

// voter: UP, HEALTHY and a voting etcd member.
func voter(r *clusterpb.Node) bool {
	return launch.UpAndHealthy(r) && r.GetConsensusMembership() == clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER && !r.GetConsensusMemberPending()
}

// launchMembers launches a three-node cluster with o and makes the two
// registered nodes consensus members, back to back without waiting for
// the first learner (etcd admits one at a time: the second is pending
// until the first is promoted), then waits until all three are voters.
func launchMembers(t *testing.T, ctx context.Context, ctl plinthctl, o launch.ClusterOptions) *launch.Cluster {
	t.Helper()
	o.Nodes = 3
	c, err := launch.LaunchCluster(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	nodes, cfg := c.Nodes(), c.OwnerDir()
	for _, n := range nodes[1:] {
		t.Log(ctl.run(t, "role", "add", "--config", cfg, n.ID(), "consensus-member"))
	}
	t.Log(ctl.run(t, "node", "list", "--config", cfg))
	for _, n := range nodes {
		if _, err := c.WaitNode(ctx, n, "an etcd voter", voter); err != nil {
			c.Close()
			t.Fatal(err)
		}
	}
	t.Log(ctl.run(t, "node", "list", "--config", cfg))
	return c
}

// curatorLeader asks n's curator (through the router) who leads, with the
// owner's credentials.
func curatorLeader(ctx context.Context, c *launch.Cluster, n *launch.ClusterNode) (string, error) {
	cc, err := c.Dial(c.CuratorEndpoint(n), identity.ServerCurator, "")
	if err != nil {
		return "", err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := clusterpb.NewCuratorClient(cc).GetCurrentLeader(ctx, &clusterpb.GetCurrentLeaderRequest{})
	if err != nil {
		return "", err
	}
	r, err := s.Recv()
	if err != nil {
		return "", fmt.Errorf("GetCurrentLeader on %s: %w", n.Name, err)
	}
	return r.GetId(), nil
}

// listJSON runs `plinthctl node list -o json` without failing the test.
func (p plinthctl) listJSON(cfg string) ([]*clusterpb.Node, error) {
	out, err := exec.Command(string(p), "node", "list", "--config", cfg, "-o", "json").Output()
	if err != nil {
		return nil, err
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	var nodes []*clusterpb.Node
	for _, r := range raw {
		n := &clusterpb.Node{}
		if err := protojson.Unmarshal(r, n); err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}
