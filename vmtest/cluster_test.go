//go:build built

package vmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/internal/testutil/netprobe"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/owner"
)

// TestClusterNodeLifecycle runs the harness side of a cluster without the
// role server: a node on the cluster's switch gets its reserved address,
// is reachable through the router (its kernel refuses a closed port), is
// started again after a guest reboot, and stays off after StopNode.
func TestClusterNodeLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	c, err := launch.NewCluster(ctx, launch.ClusterOptions{Nodes: 1, SpareSlots: 1, Image: testImage(t), Dir: testDir(t),
		DiskSizeBytes: testDiskSize, Progress: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slots := c.Slots()
	if len(slots) != 2 || slots[0].Addr != netip.MustParseAddr("10.42.0.10") || slots[1].Addr != netip.MustParseAddr("10.42.0.11") {
		t.Fatalf("slots %v %v", slots[0].Addr, slots[1].Addr)
	}
	for _, n := range slots {
		if c.CuratorEndpoint(n) == "" || c.NodeManagementEndpoint(n) == "" || c.CuratorEndpoint(n) == c.NodeManagementEndpoint(n) {
			t.Fatalf("%s: endpoints %q %q", n.Name, c.CuratorEndpoint(n), c.NodeManagementEndpoint(n))
		}
	}
	n := slots[0]
	probe := netip.AddrPortFrom(n.Addr, netprobe.ClosedPort)
	if err := c.Router.AddForwards(ctx, []netip.AddrPort{probe}); err != nil {
		t.Fatal(err)
	}
	params, _ := launch.BootstrapParametersWithOwner()
	if err := c.StartWith(ctx, n, params); err != nil {
		t.Fatal(err)
	}
	if got := c.Nodes(); len(got) != 1 || got[0] != n || c.Node("node0") != n {
		t.Fatalf("Nodes() = %v", got)
	}
	first := n.VM()
	mustLine(t, ctx, first, `I root.network: configured address .*address=10\.42\.0\.10/24`)
	if !netprobe.ClosedByPeer(t, c.Router.Endpoint(probe), 30*time.Second) {
		t.Fatal("the node is not reachable through the router")
	}
	mustLine(t, ctx, first, `I init: node ready`)

	if err := first.CtrlAltDel(ctx); err != nil {
		t.Fatal(err)
	}
	for n.VM() == first {
		if supervisor.Sleep(ctx, 100*time.Millisecond) != nil {
			t.Fatal("the harness did not start the node again after its reboot")
		}
	}
	second := n.VM()
	wantBootCount(t, ctx, second, "2")
	if !strings.HasSuffix(second.WorkDir(), "boot2") {
		t.Errorf("second boot's work dir %s", second.WorkDir())
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

// TestCluster is the end-to-end cluster test, one cluster for all steps
// because forming it is the slow part under TCG:
//   - a node bootstraps; `plinthctl cluster takeownership` (the real binary, from
//     a fresh config dir holding only the owner key) and `plinthctl node
//     list` show it UP, HEALTHY, with its address, an etcd voter;
//   - a second node registers (NEW), is approved, commits (UP) and runs
//     (HEALTHY); its logs come through NodeManagement;
//   - `plinthctl role add` makes it a consensus member: etcd learner, then
//     promoted: two voters;
//   - rebooted through NodeManagement, it rejoins with its sealed join key
//     (the curator hands back its cluster unlock key): HEALTHY, boot
//     counter 2;
//   - rebooted again as a consensus member, it opens its disk on its own
//     locally sealed keys (a cold start must not need a curator): boot
//     counter 3, both still voters;
//   - both nodes power off and start again (a cold start of the whole
//     cluster, no curator anywhere): both come back HEALTHY voters;
//   - a third node with a wrong ticket is refused and says why, and never
//     appears in the cluster;
//   - a worker decommissioned with `plinthctl node decommission` cannot open its
//     data volume after a reboot: the cluster refuses its join.
func TestCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	ctl := buildPlinthctl(t)
	c, err := launch.LaunchCluster(ctx, launch.ClusterOptions{Nodes: 1, Image: testImage(t), Dir: testDir(t), DiskSizeBytes: testDiskSize, Progress: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first := c.Nodes()[0]
	// Set by one step, used by the later ones.
	var (
		second    *launch.ClusterNode
		twoVoters func(r *clusterpb.Node) bool
	)

	step(t, "take-ownership", func(t *testing.T) {
		// The owner's CLI from scratch: only the owner key in a new config dir.
		cfg := filepath.Join(t.TempDir(), "owner")
		if err := os.MkdirAll(cfg, 0o700); err != nil {
			t.Fatal(err)
		}
		key, err := os.ReadFile(filepath.Join(c.OwnerDir(), owner.KeyFile))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cfg, owner.KeyFile), key, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Log(ctl.run(t, "cluster", "takeownership", "--config", cfg, "--endpoint", c.CuratorEndpoint(first)))
		var listed []*clusterpb.Node
		ctl.runJSON(t, &listed, "node", "list", "--config", cfg, "-o", "json")
		if len(listed) != 1 || listed[0].GetId() != first.ID() || listed[0].GetHealth() != clusterpb.NodeHealth_NODE_HEALTH_HEALTHY ||
			listed[0].GetStatus().GetAddresses()[0] != first.Addr.String() ||
			listed[0].GetConsensusMembership() != clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER {
			t.Fatalf("plinthctl node list: %v", listed)
		}
		t.Log(ctl.run(t, "node", "list", "--config", cfg))
	})

	step(t, "power-cut-before-approval", func(t *testing.T) {
		// A power cut while it waits for approval: it comes back as the same
		// node (its keys are sealed in its disk header), not as a second one.
		var err error
		second, err = c.AddNode(ctx, launch.PowerCutBeforeApproval())
		if err != nil {
			t.Fatal(err)
		}
		// What a node does before it is approved only its console says: a
		// NEW node has no credentials for an API the owner could ask.
		mustLine(t, ctx, second.VM(), `I root.enrolment: registered: waiting for the owner to approve this node`)
		lines := 0
		err = c.Client().Logs(ctx, second.ID(), &clusterpb.LogsRequest{Recursive: true, Backlog: -1}, func(*clusterpb.LogEntry) error {
			lines++
			return nil
		})
		if err != nil || lines == 0 {
			t.Fatalf("logs of %s: %d entries, %v", second.ID(), lines, err)
		}
	})

	step(t, "worker-rejoin", func(t *testing.T) {
		// A worker's volume key needs the cluster: it rejoins with its sealed
		// join key and gets the cluster unlock key from the curator.
		rebootAndWait(t, ctx, c, second, 2, launch.UpAndHealthy)
		// How a node came by its cluster unlock key (from the curator, or
		// sealed locally) is in no API: enrolment says it on the console.
		mustLine(t, ctx, second.VM(), `I root.enrolment: cluster unlock key received`)
	})

	step(t, "add-consensus-member", func(t *testing.T) {
		t.Log(ctl.run(t, "role", "add", "--config", c.OwnerDir(), second.ID(), "consensus-member"))
		twoVoters = func(r *clusterpb.Node) bool {
			return launch.UpAndHealthy(r) && r.GetConsensusMembership() == clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER
		}
		if _, err := c.WaitNode(ctx, second, "promoted to etcd voter", twoVoters); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WaitNode(ctx, first, "still an etcd voter", twoVoters); err != nil {
			t.Fatal(err)
		}
		// Enrolment's, like the key received above: on the console only.
		mustLine(t, ctx, second.VM(), `consensus member: cluster unlock key now sealed locally`)
		t.Log(ctl.run(t, "node", "list", "--config", c.OwnerDir()))
	})

	step(t, "consensus-member-reboot", func(t *testing.T) {
		// A consensus member opens its volume without asking the cluster.
		rebootAndWait(t, ctx, c, second, 3, twoVoters)
		// Which key opened the volume: on the console only (see above).
		mustLine(t, ctx, second.VM(), `I root.enrolment: consensus member: the cluster unlock key is sealed locally`)
	})

	step(t, "cold-start", func(t *testing.T) {
		// Cold start: the whole cluster goes down and comes back with no
		// curator anywhere to ask — each member opens its disk on its own
		// sealed keys and etcd finds its peers through the cached node map.
		for _, n := range []*launch.ClusterNode{first, second} {
			if err := c.StopNode(ctx, n, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range []*launch.ClusterNode{first, second} {
			if err := c.StartNode(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range []*launch.ClusterNode{first, second} {
			if _, err := c.WaitNode(ctx, n, "back after a cold start of the whole cluster", twoVoters); err != nil {
				t.Fatal(err)
			}
		}
		wantNodeBootCount(t, ctx, c, second, 4)
		if _, err := c.WaitNode(ctx, first, "HEALTHY voter", twoVoters); err != nil {
			t.Fatal(err)
		}
	})

	step(t, "wrong-ticket", func(t *testing.T) {
		wrong, err := c.FreeSlot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		reg, err := c.RegisterParameters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		reg.RegisterTicket = []byte("not the ticket of this cluster")
		p := launch.BootstrapParameters()
		p.Cluster = &nodepb.Parameters_Register{Register: reg}
		if err := c.StartWith(ctx, wrong, p); err != nil {
			t.Fatal(err)
		}
		// A node the cluster refuses has no API anyone could ask: its console
		// is where it says why (the owner sees that no node was added).
		refused := mustLine(t, ctx, wrong.VM(), `E root.enrolment: registration refused by the cluster .*code=PermissionDenied reason=.*(ticket.*)`)
		t.Logf("wrong ticket refused: %s", refused[0])
		nodes, err := c.Client().Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) != 2 {
			t.Fatalf("the cluster lists %d nodes after a refused registration: %v", len(nodes), nodes)
		}
		if err := c.KillNode(wrong); err != nil {
			t.Fatal(err)
		}
	})

	step(t, "decommissioned-worker", func(t *testing.T) {
		// A decommissioned worker is locked out of its own disk: after a
		// reboot the cluster refuses to hand back its cluster unlock key.
		third, err := c.AddNode(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Log(ctl.run(t, "node", "decommission", "--config", c.OwnerDir(), "--yes", third.ID()))
		before := third.VM()
		if err := c.RebootNode(ctx, third); err != nil {
			t.Fatal(err)
		}
		if third.VM() == before {
			t.Fatal("the decommissioned node did not reboot")
		}
		// Refused, it never opens its data volume nor starts the Role Server
		// that serves NodeManagement: its console is the only channel left.
		mustLine(t, ctx, third.VM(), `E root.enrolment: join refused by the cluster .*code=PermissionDenied reason=.*decommissioned`)
		for _, l := range third.VM().Lines() {
			if strings.Contains(l, "data volume open") {
				t.Fatalf("a decommissioned node opened its data volume: %s", l)
			}
		}
	})
}

// rebootAndWait reboots n through NodeManagement and waits until the
// curator sees it back with the given boot count and ok, and the node
// itself reports that boot count.
func rebootAndWait(t *testing.T, ctx context.Context, c *launch.Cluster, n *launch.ClusterNode, bootCount int64, ok func(*clusterpb.Node) bool) {
	t.Helper()
	before := n.VM()
	if err := c.RebootNode(ctx, n); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitNode(ctx, n, fmt.Sprintf("back after the reboot (boot %d)", bootCount), func(r *clusterpb.Node) bool {
		return ok(r) && r.GetStatus().GetBootCount() == bootCount
	}); err != nil {
		t.Fatal(err)
	}
	if n.VM() == before {
		t.Fatal("the node did not reboot")
	}
	wantNodeBootCount(t, ctx, c, n, bootCount)
}

// wantNodeBootCount fails unless n's current boot is its boot want, as
// the node's own status reports it (asked of the node: the curator's
// copy may still be the last boot's).
func wantNodeBootCount(t *testing.T, ctx context.Context, c *launch.Cluster, n *launch.ClusterNode, want int64) {
	t.Helper()
	st, err := c.WaitStatus(ctx, n, "its boot count", func(*clusterpb.StatusResponse) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	if got := st.GetStatus().GetBootCount(); got != want {
		t.Fatalf("%s reports boot %d, want %d", n.Name, got, want)
	}
}

// plinthctl is the operator CLI, built from this tree.
type plinthctl string

func buildPlinthctl(t *testing.T) plinthctl {
	t.Helper()
	plinthctlOnce.Do(func() { plinthctlBin, plinthctlErr = findPlinthctl() })
	if plinthctlErr != nil {
		t.Fatal(plinthctlErr)
	}
	return plinthctl(plinthctlBin)
}

var (
	plinthctlOnce sync.Once
	plinthctlBin  string
	plinthctlErr  error
)

// findPlinthctl returns $PLINTH_PLINTHCTL (make exports the plinthctl it
// built from this tree) or builds one, once per test process, as make
// does (CGO off, -trimpath: the compiled packages are shared with /init's
// and the tests').
func findPlinthctl() (string, error) {
	if p := os.Getenv("PLINTH_PLINTHCTL"); p != "" {
		return p, nil
	}
	root, err := launch.RepoRoot()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "vmtest-plinthctl")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "plinthctl")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/plinthctl")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building plinthctl: %v\n%s", err, out)
	}
	return bin, nil
}

func (p plinthctl) run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(string(p), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("plinthctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// output runs plinthctl and returns its output and error, without failing
// the test.
func (p plinthctl) output(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, string(p), args...).CombinedOutput()
	return string(out), err
}

func (p plinthctl) runJSON(t *testing.T, v *[]*clusterpb.Node, args ...string) {
	t.Helper()
	out := p.run(t, args...)
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("plinthctl %s: not JSON: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, r := range raw {
		n := &clusterpb.Node{}
		if err := protojson.Unmarshal(r, n); err != nil {
			t.Fatalf("plinthctl JSON node: %v\n%s", err, r)
		}
		*v = append(*v, n)
	}
}

// builtPath is the path of what make built for the tests: env's value,
// else rel under the repository's out/ (FromEnv).
func builtPath(t *testing.T, env, rel string) string {
	t.Helper()
	p, err := launch.FromEnv(env, rel)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// testpodProgram is the test image's program (make builds it).
func testpodProgram(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(builtPath(t, "PLINTH_TESTPOD", "bin/testpod"))
	if err != nil {
		t.Fatalf("the test image's program: %v (make builds it)", err)
	}
	return b
}
