package launch

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/owner"
)

// ClusterOptions describe a cluster for LaunchCluster.
type ClusterOptions struct {
	// Nodes is how many nodes to bring UP (at least 1: the bootstrap node).
	Nodes int
	// Image is the image every node boots. Required.
	Image *Image
	// Dir holds each node's directory (disk, TPM state, one console log
	// per boot), the router log and the owner configuration (Dir/owner).
	// Required.
	Dir string
	// Subnet is the switch network; default 10.42.0.0/24.
	Subnet netip.Prefix
	// SpareSlots is how many more nodes AddNode can add without restarting
	// the router (see Router); default 2.
	SpareSlots int
	// DiskSizeBytes is each node's data disk; default 2 GiB.
	DiskSizeBytes int64
	// Parameters, if set, may change a node's parameters before they are
	// written (e.g. a TPM-less development cluster).
	Parameters func(name string, p *nodepb.Parameters)
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
	// Console, if set, returns a writer for a node's live serial console.
	Console func(name string) io.Writer
	// StepTimeout bounds each wait (curator up, node registered, node UP);
	// default 10 minutes, which TCG needs for a cold boot and join.
	StepTimeout time.Duration
	// NetBoot serves the cluster's network-boot UKI to nodes added with
	// AddNode(NetBoot()) (see cluster_netboot.go).
	NetBoot bool
	// DiskBoot boots every node through OVMF from its own copy of the
	// image's disk.img (grown to DiskSizeBytes), with its parameters on
	// the ESP, instead of QEMU's -kernel with fw_cfg parameters
	// (AddNode(FromDisk()) does so for one node).
	DiskBoot bool
	// Registry, if set, is reachable from the nodes at its guest
	// addresses (Registry.MirrorHost and co.).
	Registry *Registry
	// Kubernetes makes the bootstrap node a Kubernetes controller and
	// worker, gives every node AddNode brings in the worker role, and
	// forwards each node's API server and KubernetesNodePort from the
	// host.
	Kubernetes bool
}

// DefaultSubnet is a cluster's switch network unless ClusterOptions say
// otherwise.
var DefaultSubnet = netip.MustParsePrefix("10.42.0.0/24")

// KubernetesNodePort is the NodePort the router forwards to every node of
// a Kubernetes cluster (tests create their Services with it).
const KubernetesNodePort = 30080

// Cluster is a set of nodes on one Switch, reachable from the host through
// a Router, owned by the test: LaunchCluster took ownership with the
// bootstrap node's owner key and keeps the owner configuration in
// OwnerDir, so plinthctl works against it too (-config OwnerDir).
//
//	host                                        Switch (10.42.0.0/24, DHCP)
//	Client() / plinthctl ─► 127.0.0.1:P ─► Router ─┬─ node0 .10  bootstrap
//	(owner config: curators =                      ├─ node1 .11  registered, approved
//	 forwarded :7835 of started nodes,             ├─ ...
//	 NodeManagement = forwarded :7836)             └─ spare slots: address and
//	                                                  forwards reserved for AddNode
//
// A node that reboots (QEMU runs with -no-reboot, so QEMU exits) is
// started again with the same disk and TPM, unless the harness stopped it.
type Cluster struct {
	opts   ClusterOptions
	swDir  string
	Switch *Switch
	Router *Router

	mu      sync.Mutex
	slots   []*ClusterNode // every switch port made, used or spare
	cfg     *owner.Config
	client  *owner.Client
	closed  bool
	netboot *netbootServer
}

// ClusterNode is one machine of a Cluster: a switch port with its address,
// a disk and a TPM, and the QEMU of its current boot.
type ClusterNode struct {
	Name string
	Addr netip.Addr // the address the switch gives it
	Dir  string

	c        *Cluster
	portArgs []string
	params   string

	mu       sync.Mutex
	used     bool
	id       string
	vm       *Node
	boots    int
	stopping bool
	netboot  bool // booted by UEFI HTTP boot (AddNode(NetBoot()))
	diskBoot bool // booted through OVMF from its disk (DiskBoot or AddNode(FromDisk()))
	times    NodeTimes
}

// NodeTimes are when the harness launched a node's first boot and saw it
// reach each step of joining (zero: not seen). The cluster is polled about
// every 2 seconds, so the steps are seen up to a poll late.
type NodeTimes struct {
	Launched   time.Time // first boot: just before swtpm and QEMU started
	Registered time.Time // listed by the cluster (AddNode)
	Approved   time.Time // the owner's Approve returned (AddNode, if NEW)
	Up         time.Time // listed UP
	Healthy    time.Time // listed UP and HEALTHY
}

// Times returns the node's NodeTimes.
func (n *ClusterNode) Times() NodeTimes {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.times
}

// mark sets each of fields (in n.times) to now.
func (n *ClusterNode) mark(fields ...*time.Time) {
	now := time.Now()
	n.mu.Lock()
	for _, f := range fields {
		*f = now
	}
	n.mu.Unlock()
}

// ID is the node's ID once the cluster knows it ("" before).
func (n *ClusterNode) ID() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.id
}

// Boots is how many boots of n the harness started.
func (n *ClusterNode) Boots() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.boots
}

// VM is the QEMU of the node's current (or last) boot.
func (n *ClusterNode) VM() *Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.vm
}

// BootstrapParametersWithOwner is BootstrapParameters that also returns
// the owner's private key, for a harness that takes ownership.
func BootstrapParametersWithOwner() (*nodepb.Parameters, ed25519.PrivateKey) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	p := BootstrapParameters()
	p.GetBootstrap().OwnerPublicKey = pub
	return p, key
}

// LaunchCluster boots the bootstrap node, takes ownership, then adds the
// other nodes one by one (ticket → register parameters → boot → NEW →
// approve → UP). On error everything is stopped again.
func LaunchCluster(ctx context.Context, o ClusterOptions) (_ *Cluster, err error) {
	c, err := NewCluster(ctx, o)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	o = c.opts
	boot := c.slots[0]
	params, key := BootstrapParametersWithOwner()
	if err := c.setParams(boot, params); err != nil {
		return nil, err
	}
	boot.mu.Lock()
	boot.used = true
	boot.mu.Unlock()
	c.logf("%s (%s): booting as the bootstrap node", boot.Name, boot.Addr)
	if err := c.start(ctx, boot); err != nil {
		return nil, err
	}
	if err := c.takeOwnership(ctx, boot, key); err != nil {
		return nil, err
	}
	up, err := c.WaitNode(ctx, boot, "UP and HEALTHY", UpAndHealthy)
	if err != nil {
		return nil, err
	}
	boot.mark(&boot.times.Up, &boot.times.Healthy)
	if err := c.known(boot, up.GetId()); err != nil {
		return nil, err
	}
	c.logf("%s is %s: UP and HEALTHY, the cluster is bootstrapped", boot.Name, up.GetId())
	// The other nodes boot and register side by side: each AddNode waits
	// for its own record (matched by the address the node registers
	// with), and a boot under TCG is mostly the booting guest's own work
	// while the bootstrap node idles (one after another, three members
	// took ~1.5 min).
	// The first failure stops the others; theirs would only say so.
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for range o.Nodes - 1 {
		wg.Go(func() {
			if _, err := c.AddNode(actx); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(actx); err != nil {
		return nil, err
	}
	return c, nil
}

// NewCluster makes the switch with a slot for every node and spare, and
// the router with their forwards; no node is started.
func NewCluster(ctx context.Context, o ClusterOptions) (_ *Cluster, err error) {
	switch {
	case o.Image == nil:
		return nil, errors.New("launch: ClusterOptions.Image is required")
	case o.Dir == "":
		return nil, errors.New("launch: ClusterOptions.Dir is required")
	case o.Nodes < 1:
		return nil, errors.New("launch: a cluster needs at least one node")
	}
	if !o.Subnet.IsValid() {
		o.Subnet = DefaultSubnet
	}
	if o.SpareSlots <= 0 {
		o.SpareSlots = 2
	}
	if o.DiskSizeBytes <= 0 {
		o.DiskSizeBytes = 2 << 30
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.StepTimeout <= 0 {
		o.StepTimeout = 10 * time.Minute
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	c := &Cluster{opts: o}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if c.swDir, err = shortTempDir(); err != nil {
		return nil, err
	}
	if c.Switch, err = NewSwitch(c.swDir, o.Subnet); err != nil {
		return nil, err
	}
	var forwards []netip.AddrPort
	for range o.Nodes + o.SpareSlots {
		n, err := c.newSlot()
		if err != nil {
			return nil, err
		}
		forwards = append(forwards, c.nodeForwards(n)...)
	}
	toHost, err := c.setUpNetboot()
	if err != nil {
		return nil, err
	}
	if o.Registry != nil {
		for _, f := range o.Registry.forwards() {
			if !o.Subnet.Contains(f.Guest.Addr()) {
				return nil, fmt.Errorf("launch: the registry is at %v, outside the cluster's network %v", f.Guest.Addr(), o.Subnet)
			}
			toHost = append(toHost, f)
		}
	}
	if c.Router, err = StartRouter(ctx, c.Switch, o.Dir, forwards, toHost...); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) nodeForwards(n *ClusterNode) []netip.AddrPort {
	f := []netip.AddrPort{
		netip.AddrPortFrom(n.Addr, layout.CuratorPort),
		netip.AddrPortFrom(n.Addr, layout.NodeManagementPort),
	}
	if c.opts.Kubernetes {
		f = append(f, netip.AddrPortFrom(n.Addr, layout.KubernetesAPIPort), netip.AddrPortFrom(n.Addr, KubernetesNodePort))
	}
	return f
}

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.opts.Progress, "cluster: "+format+"\n", args...)
}

// newSlot makes a switch port (reserving its address) and the directory
// for one more node; the node is not started.
func (c *Cluster) newSlot() (*ClusterNode, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	name := "node" + strconv.Itoa(len(c.slots))
	args, err := c.Switch.Port(name)
	if err != nil {
		return nil, err
	}
	addr, err := c.Switch.PortAddr(name)
	if err != nil {
		return nil, err
	}
	n := &ClusterNode{Name: name, Addr: addr, Dir: filepath.Join(c.opts.Dir, name), c: c, portArgs: args, diskBoot: c.opts.DiskBoot}
	c.slots = append(c.slots, n)
	return n, nil
}

func (c *Cluster) setParams(n *ClusterNode, p *nodepb.Parameters) error {
	if c.opts.Kubernetes {
		WithKubernetes(p)
	}
	// A direct kernel boot is unmeasured; a disk boot through OVMF is not.
	if p.Tpm == nil {
		p.Tpm = &nodepb.NodeTPM{}
	}
	n.mu.Lock()
	p.Tpm.AllowUnmeasuredBoot = !n.diskBoot
	n.mu.Unlock()
	if c.opts.Parameters != nil {
		c.opts.Parameters(n.Name, p)
	}
	if err := os.MkdirAll(filepath.Join(n.Dir, "tpm"), 0o755); err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	var err error
	n.params, err = WriteParameters(filepath.Join(n.Dir, "parameters.pb"), p)
	return err
}

// StartWith boots slot n (from FreeSlot, or a stopped node) with the
// parameters p instead of those the cluster would write: a node with a
// wrong ticket, a bootstrap of its own. The cluster's own additions
// (Kubernetes, the TPM's measured-boot setting, ClusterOptions.Parameters)
// apply as to every node.
func (c *Cluster) StartWith(ctx context.Context, n *ClusterNode, p *nodepb.Parameters) error {
	if err := c.setParams(n, p); err != nil {
		return err
	}
	n.mu.Lock()
	n.used = true
	n.mu.Unlock()
	return c.start(ctx, n)
}

// Slots are the cluster's slots in address order: its nodes and the
// spares not started yet.
func (c *Cluster) Slots() []*ClusterNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.slots)
}

// OwnerDir is the owner configuration directory (plinthctl --config).
func (c *Cluster) OwnerDir() string { return filepath.Join(c.opts.Dir, "owner") }

// Client is the owner's client for the cluster.
func (c *Cluster) Client() *owner.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.client
}

// Nodes are the nodes started so far, in order (the bootstrap node first).
func (c *Cluster) Nodes() []*ClusterNode {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*ClusterNode
	for _, n := range c.slots {
		n.mu.Lock()
		if n.used && n.vm != nil {
			out = append(out, n)
		}
		n.mu.Unlock()
	}
	return out
}

// Node returns the node with this name or ID, or nil.
func (c *Cluster) Node(nameOrID string) *ClusterNode {
	if nameOrID == "" {
		return nil
	}
	for _, n := range c.Nodes() {
		if n.Name == nameOrID || n.ID() == nameOrID {
			return n
		}
	}
	return nil
}

// CuratorEndpoint is the host's 127.0.0.1:port forwarded to the node's
// curator port.
func (c *Cluster) CuratorEndpoint(n *ClusterNode) string {
	return c.Router.Endpoint(netip.AddrPortFrom(n.Addr, layout.CuratorPort))
}

// KubernetesAPIEndpoint is the host's 127.0.0.1:port forwarded to the
// node's Kubernetes API server (ClusterOptions.Kubernetes).
func (c *Cluster) KubernetesAPIEndpoint(n *ClusterNode) string {
	return c.Router.Endpoint(netip.AddrPortFrom(n.Addr, layout.KubernetesAPIPort))
}

// NodePortEndpoint is the host's 127.0.0.1:port forwarded to the node's
// KubernetesNodePort.
func (c *Cluster) NodePortEndpoint(n *ClusterNode) string {
	return c.Router.Endpoint(netip.AddrPortFrom(n.Addr, KubernetesNodePort))
}

// NodeManagementEndpoint is the host's 127.0.0.1:port forwarded to the
// node's NodeManagement port.
func (c *Cluster) NodeManagementEndpoint(n *ClusterNode) string {
	return c.Router.Endpoint(netip.AddrPortFrom(n.Addr, layout.NodeManagementPort))
}

// match finds n's record: by ID once known, else by its address, else the
// one node no ClusterNode claims yet that names no other machine's
// address (a node that reported no address). Several nodes may register
// at once (LaunchCluster adds them side by side).
func (c *Cluster) match(n *ClusterNode, nodes []*clusterpb.Node) *clusterpb.Node {
	if id := n.ID(); id != "" {
		for _, r := range nodes {
			if r.GetId() == id {
				return r
			}
		}
		return nil
	}
	c.mu.Lock()
	var others []string
	for _, o := range c.slots {
		if o != n {
			others = append(others, o.Addr.String())
		}
	}
	c.mu.Unlock()
	var unclaimed []*clusterpb.Node
	for _, r := range nodes {
		if c.claimed(r.GetId()) || r.GetState() == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
			continue // another machine's record, whatever addresses it names
		}
		addrs := r.GetStatus().GetAddresses()
		if slices.Contains(addrs, n.Addr.String()) {
			return r
		}
		if slices.ContainsFunc(addrs, func(a string) bool { return slices.Contains(others, a) }) {
			continue // another machine's, registering beside n
		}
		unclaimed = append(unclaimed, r)
	}
	if len(unclaimed) == 1 {
		return unclaimed[0]
	}
	return nil
}

// claimed reports whether a machine of the cluster is known as node id.
func (c *Cluster) claimed(id string) bool {
	c.mu.Lock()
	slots := c.slots
	c.mu.Unlock()
	for _, n := range slots {
		if id != "" && n.ID() == id {
			return true
		}
	}
	return false
}

// known records n's ID and its NodeManagement forward in the owner
// configuration.
func (c *Cluster) known(n *ClusterNode, id string) error {
	n.mu.Lock()
	n.id = id
	n.mu.Unlock()
	ep := c.NodeManagementEndpoint(n)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cfg.NodeEndpoints[id] = ep
	return c.updateOwnerLocked()
}

// AddNodeOption changes how AddNode brings a node in.
type AddNodeOption func(*addNodeOptions)

type addNodeOptions struct{ powerCutBeforeApproval, netboot, diskBoot bool }

// FromDisk makes AddNode boot the node as ClusterOptions.DiskBoot boots
// every node: through OVMF from its disk, measured (a node that can be
// updated, in a cluster whose other nodes boot faster by -kernel).
func FromDisk() AddNodeOption {
	return func(o *addNodeOptions) { o.diskBoot = true }
}

// PowerCutBeforeApproval cuts the new node's power (SIGKILL of QEMU) once
// it registered, starts it again and makes sure it comes back with the
// same identity (no second NEW record) before approving it.
func PowerCutBeforeApproval() AddNodeOption {
	return func(o *addNodeOptions) { o.powerCutBeforeApproval = true }
}

// AddNode boots one more node with register parameters from the cluster,
// approves it when it shows up NEW and waits until it is UP.
func (c *Cluster) AddNode(ctx context.Context, opts ...AddNodeOption) (*ClusterNode, error) {
	var o addNodeOptions
	for _, opt := range opts {
		opt(&o)
	}
	n, err := c.FreeSlot(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	reg, err := c.RegisterParameters(ctx)
	if err != nil {
		return nil, err
	}
	p := BootstrapParameters()
	p.Cluster = &nodepb.Parameters_Register{Register: reg}
	if o.diskBoot {
		n.mu.Lock()
		n.diskBoot = true
		n.mu.Unlock()
	}
	if err := c.setParams(n, p); err != nil {
		return nil, err
	}
	if o.netboot {
		// The parameters are the UKI's, shared by every node booting it.
		if err := c.buildNetbootUKI(reg); err != nil {
			return nil, err
		}
		n.mu.Lock()
		n.netboot = true
		n.mu.Unlock()
	}
	c.logf("%s (%s): booting to register with %v", n.Name, n.Addr, reg.GetCuratorEndpoints())
	if err := c.start(ctx, n); err != nil {
		return nil, err
	}
	c.mu.Lock()
	err = c.updateOwnerLocked()
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	rec, err := c.WaitNode(ctx, n, "registered", func(r *clusterpb.Node) bool { return r.GetState() != clusterpb.NodeState_NODE_STATE_UNSPECIFIED })
	if err != nil {
		return nil, err
	}
	n.mark(&n.times.Registered)
	if err := c.known(n, rec.GetId()); err != nil {
		return nil, err
	}
	if rec.GetState() == clusterpb.NodeState_NODE_STATE_NEW && o.powerCutBeforeApproval {
		if err := c.powerCutWhileNew(ctx, n, rec); err != nil {
			return nil, err
		}
	}
	if rec.GetState() == clusterpb.NodeState_NODE_STATE_NEW {
		c.logf("%s is %s: NEW, approving", n.Name, rec.GetId())
		if err := c.retry(ctx, n, "approving", func(ctx context.Context) error {
			return c.Client().Approve(ctx, rec.GetPublicKey())
		}); err != nil {
			return nil, err
		}
		n.mark(&n.times.Approved)
	}
	if _, err := c.WaitNode(ctx, n, "UP", func(r *clusterpb.Node) bool { return r.GetState() == clusterpb.NodeState_NODE_STATE_UP }); err != nil {
		return nil, err
	}
	n.mark(&n.times.Up)
	c.logf("%s is UP (%s after boot)", n.Name, time.Since(start).Round(time.Second))
	// UP is the curator's record; HEALTHY means the node's own Role Server
	// runs (its data volume is open and it sends heartbeats).
	if _, err := c.WaitNode(ctx, n, "HEALTHY", UpAndHealthy); err != nil {
		return nil, err
	}
	n.mark(&n.times.Healthy)
	c.logf("%s is HEALTHY (%s after boot)", n.Name, time.Since(start).Round(time.Second))
	if c.opts.Kubernetes {
		c.logf("%s: giving it the KubernetesWorker role", n.Name)
		on := true
		if err := c.retry(ctx, n, "giving the worker role", func(ctx context.Context) error {
			return c.Client().UpdateRoles(ctx, &clusterpb.UpdateNodeRolesRequest{
				Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: n.ID()}, KubernetesWorker: &on})
		}); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// powerCutWhileNew kills n while it waits for approval, starts it again
// and checks that it resumes its registration: the same node ID, still
// NEW, and no other NEW record appeared.
func (c *Cluster) powerCutWhileNew(ctx context.Context, n *ClusterNode, rec *clusterpb.Node) error {
	newRecords := func() (int, error) {
		nodes, err := c.Client().Nodes(ctx)
		count := 0
		for _, r := range nodes {
			if r.GetState() == clusterpb.NodeState_NODE_STATE_NEW {
				count++
			}
		}
		return count, err
	}
	before, err := newRecords()
	if err != nil {
		return err
	}
	c.logf("%s: power cut while it waits for approval", n.Name)
	if err := c.KillNode(n); err != nil {
		return err
	}
	if err := c.StartNode(ctx, n); err != nil {
		return err
	}
	// Its console is the only witness: a NEW node has no credentials for
	// an API the owner could ask, and its RegisterNode of a known key
	// changes nothing in its record.
	if _, err := n.VM().WaitForLine(ctx, regexp.MustCompile(`I root\.enrolment: resuming the registration begun before a reboot node=`+regexp.QuoteMeta(rec.GetId()))); err != nil {
		return fmt.Errorf("launch: %s did not resume its registration as %s: %w", n.Name, rec.GetId(), err)
	}
	if _, err := n.VM().WaitForLine(ctx, regexp.MustCompile(`I root\.enrolment: registered: waiting for the owner to approve this node`)); err != nil {
		return err
	}
	after, err := newRecords()
	if err != nil {
		return err
	}
	if after != before {
		return fmt.Errorf("launch: %d NEW records after %s's power cut, %d before: it registered a second identity", after, n.Name, before)
	}
	return nil
}

// UpAndHealthy is the WaitNode condition of a node that serves: UP, and
// HEALTHY by its heartbeats.
func UpAndHealthy(r *clusterpb.Node) bool {
	return r.GetState() == clusterpb.NodeState_NODE_STATE_UP && r.GetHealth() == clusterpb.NodeHealth_NODE_HEALTH_HEALTHY
}

// FreeSlot returns an unused slot, making a new one (and restarting the
// router with its forwards) when the spares are used up.
func (c *Cluster) FreeSlot(ctx context.Context) (*ClusterNode, error) {
	c.mu.Lock()
	for _, n := range c.slots {
		n.mu.Lock()
		free := !n.used
		n.used = n.used || free
		n.mu.Unlock()
		if free {
			c.mu.Unlock()
			return n, nil
		}
	}
	c.mu.Unlock()
	n, err := c.newSlot()
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	n.used = true
	n.mu.Unlock()
	c.logf("no spare router forwards left: restarting the router with forwards for %s", n.Name)
	if err := c.Router.AddForwards(ctx, c.nodeForwards(n)); err != nil {
		return nil, err
	}
	return n, nil
}

// RegisterParameters are the CA and ticket from the cluster, with the
// curators of the directory (addresses on the switch network), or the
// bootstrap node's address if the directory names none there.
func (c *Cluster) RegisterParameters(ctx context.Context) (*nodepb.Register, error) {
	boot := c.slots[0]
	var info *clusterpb.GetClusterInfoResponse
	var ticket []byte
	err := c.retry(ctx, boot, "fetching register parameters", func(ctx context.Context) error {
		var err error
		if info, err = c.Client().ClusterInfo(ctx); err != nil {
			return err
		}
		ticket, err = c.Client().Ticket(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	r := &nodepb.Register{ClusterCaCertificate: info.GetCaCertificate(), RegisterTicket: ticket}
	for _, d := range info.GetDirectory().GetNodes() {
		for _, a := range d.GetAddresses() {
			if ip, err := netip.ParseAddr(a); err == nil && c.Switch.Subnet().Contains(ip) {
				r.CuratorEndpoints = append(r.CuratorEndpoints, net.JoinHostPort(a, strconv.Itoa(layout.CuratorPort)))
			}
		}
	}
	if len(r.CuratorEndpoints) == 0 {
		r.CuratorEndpoints = []string{netip.AddrPortFrom(boot.Addr, layout.CuratorPort).String()}
	}
	return r, nil
}

// Close kills every node and stops the router and switch. Node
// directories stay.
func (c *Cluster) Close() error {
	c.mu.Lock()
	c.closed = true
	slots := c.slots
	client := c.client
	c.mu.Unlock()
	var errs []error
	for _, n := range slots {
		n.mu.Lock()
		n.stopping = true
		vm := n.vm
		n.mu.Unlock()
		if vm != nil {
			errs = append(errs, vm.Close())
		}
	}
	if client != nil {
		client.Close()
	}
	if c.Router != nil {
		errs = append(errs, c.Router.Close())
	}
	errs = append(errs, c.netboot.close())
	if c.Switch != nil {
		errs = append(errs, c.Switch.Close())
	}
	if c.swDir != "" {
		errs = append(errs, os.RemoveAll(c.swDir))
	}
	return errors.Join(errs...)
}
