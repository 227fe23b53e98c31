package roleserver

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/network"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/kubernetes"
	"plinth.dev/plinth/roleserver/localstorage"
	"plinth.dev/plinth/roleserver/rpc"
)

// Config is what the Role Server needs from the rest of the node.
type Config struct {
	// StorageRoot is the node's storage tree; /data must be mounted before
	// any Provide*Data call.
	StorageRoot *localstorage.Root
	// Network gives the node's address (for its status, the hosts file and
	// the bootstrap record). May be nil in tests.
	Network *network.Service
	// LogTree is the node's log tree, served by NodeManagement.Logs.
	LogTree *logtree.Tree
	// BootProblems are problems found at boot that last the whole boot
	// (an unmeasured boot), listed in the node's status with the others.
	BootProblems []*clusterpb.NodeProblem
	// Version, BootCount and BootTime go into the node's status.
	Version   string
	BootCount int64
	BootTime  time.Time
	// HostsPath is where the node ID → address map is written; default
	// "/run/hosts" (the system image links /etc/hosts there).
	HostsPath string
	// Power reboots (true) or powers off (false) the node, for
	// NodeManagement.Reboot/PowerOff. nil: those RPCs fail.
	Power func(reboot bool)
	// Runnables returns the supervisor's state, for NodeManagement.Status
	// (typically (*supervisor.Supervisor).Snapshot).
	Runnables func() []supervisor.Status
	// CuratorEndpoints (host:port, from the node parameters) seed the
	// curator resolver next to the cluster directory.
	CuratorEndpoints []string
	// DirectoryChanged, if set, is given the curators' directory whenever
	// it changes (see enrolment.Config.UpdateDirectory).
	DirectoryChanged func(*clusterpb.ClusterDirectory) error
	// ResolvConf is the node's resolver configuration (default
	// /run/resolv.conf), for Kubernetes' DNS server and pods.
	ResolvConf string
	// LoadKubernetesModules loads the kernel modules the Kubernetes worker
	// needs (nil: none are loaded, e.g. in tests).
	LoadKubernetesModules func() error
	// StopPods ends the containers a stopped Kubernetes worker left
	// running (kubernetes.StopPods), on a node without the
	// KubernetesWorker role (nil: nothing is stopped, e.g. in tests).
	StopPods func() (int, error)
	// LocalClusterKey, if set, is called with true before this node starts
	// etcd as a consensus member and with false when it is not one: see
	// enrolment.Config.KeepClusterKeyLocally.
	LocalClusterKey func(keep bool) error
	// Updates installs A/B updates (NodeManagement.Update) and reports
	// the node's slot and updates in its status; nil: Update fails.
	Updates Updater

	// knobs are test seams; nil in production.
	knobs *knobs
}

// knobs let an in-process test run Services on loopback ports. They are
// plain settings handed to consensus and the curator; the test values
// come from the tests (roleserver/internal/testutil).
type knobs struct {
	curatorPort, nodeMgmtPort int
	// listenHost is the host the servers bind ("" = all interfaces).
	listenHost string
	// addresses replace the network service's.
	addresses []string
	// consensusTuning is the consensus member's consensus.Config.Tuning.
	consensusTuning consensus.Tuning
	// addNodeOptions is the curator's curator.Config.AddNodeOptions.
	addNodeOptions func(nodeID string) []*consensus.AddNodeOption
	// curatorLeaderTTL and curatorHeartbeatTimeout shorten the curator's.
	curatorLeaderTTL, curatorHeartbeatTimeout time.Duration
	// saveRoles, if set, runs before every write of the roles file; an
	// error fails the write (a full or failing disk).
	saveRoles func(*clusterpb.NodeRoles) error
	// retryInterval replaces rolesRetry.
	retryInterval time.Duration
}

func (c *Config) curatorPort() int {
	if c.knobs != nil && c.knobs.curatorPort != 0 {
		return c.knobs.curatorPort
	}
	return layout.CuratorPort
}

// consensusTuning is the local etcd member's consensus.Config.Tuning.
func (c *Config) consensusTuning() consensus.Tuning {
	if c.knobs != nil {
		return c.knobs.consensusTuning
	}
	return consensus.Tuning{}
}

func (c *Config) nodeMgmtPort() int {
	if c.knobs != nil && c.knobs.nodeMgmtPort != 0 {
		return c.knobs.nodeMgmtPort
	}
	return layout.NodeManagementPort
}

func (c *Config) listenAddress(port int) string {
	host := ""
	if c.knobs != nil {
		host = c.knobs.listenHost
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// localCurator is how this node reaches its own curator.
func (c *Config) localCurator() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.curatorPort()))
}

// BootstrapData is what enrolment hands over to bootstrap a new cluster.
type BootstrapData struct {
	// NodeKey is this node's private key.
	NodeKey ed25519.PrivateKey
	// JoinKey is the public join key (the node rejoins with it after a
	// reboot); OwnerKey the owner's public key from the parameters.
	JoinKey  ed25519.PublicKey
	OwnerKey ed25519.PublicKey
	// Configuration is the initial cluster policy.
	Configuration *clusterpb.ClusterConfiguration
	TPMUsage      clusterpb.NodeTPMUsage
	// KubernetesController and KubernetesWorker are the first node's
	// Kubernetes roles.
	KubernetesController, KubernetesWorker bool
}

// nodeData is the input of one Provide*Data call.
type nodeData struct {
	bootstrap *BootstrapData
	// directory is the cluster's curators as known at enrolment (nil on
	// bootstrap).
	directory *clusterpb.ClusterDirectory
	nodeID    string
}

// CuratorConnection is a connection to the curator leader, authenticated
// with this node's credentials.
type CuratorConnection struct {
	Credentials *identity.Credentials
	Resolver    *rpc.Resolver
	Conn        *grpc.ClientConn
}

// Curator is a Curator client on the connection.
func (c *CuratorConnection) Curator() clusterpb.CuratorClient {
	return clusterpb.NewCuratorClient(c.Conn)
}

// ControlPlane is the state of the local consensus member and curator.
type ControlPlane struct {
	// Running says whether this node runs etcd and a curator.
	Running bool
	// Consensus is the local etcd member while Running.
	Consensus *consensus.Service
}

// Service is the Role Server. See the package documentation.
type Service struct {
	Config

	// Roles are this node's roles: from /data/node/roles at enrolment, then
	// from the curator; nil before enrolment.
	Roles memory.Value[*clusterpb.NodeRoles]
	// Credentials are this node's cluster credentials; nil until known.
	Credentials memory.Value[*identity.Credentials]
	// CuratorConnection is set (non-nil) once the node has credentials.
	CuratorConnection memory.Value[*CuratorConnection]
	// ControlPlane reports the local consensus member and curator.
	ControlPlane memory.Value[*ControlPlane]
	// KubernetesStatus is set while the local Kubernetes API server serves
	// (nodes with the KubernetesController role).
	KubernetesStatus memory.Value[*kubernetes.Status]

	// kubernetesControllers are the API servers the cluster lists, for
	// the Kubernetes worker's local proxy.
	kubernetesControllers memory.Value[[]string]

	node memory.Value[*nodeData]

	// State shared by workers (and kept across restarts of Run), each
	// with its own lock.
	problems  problems
	endpoints resolverEndpoints
	rolesFile rolesFile
	hosts     hostsFile
	directory directorySaver
}

// New makes a Role Server; nothing runs until Run and a Provide*Data call.
func New(c Config) *Service {
	if c.HostsPath == "" {
		c.HostsPath = "/run/hosts"
	}
	if c.ResolvConf == "" {
		c.ResolvConf = "/run/resolv.conf"
	}
	s := &Service{Config: c}
	s.rolesFile = rolesFile{root: c.StorageRoot, problems: &s.problems}
	if c.knobs != nil {
		s.rolesFile.beforeWrite, s.rolesFile.retryEvery = c.knobs.saveRoles, c.knobs.retryInterval
	}
	s.hosts = hostsFile{path: c.HostsPath, root: c.StorageRoot, addresses: s.addresses}
	s.directory = directorySaver{save: c.DirectoryChanged}
	// Every value starts set (to nil where unknown), so that get never
	// blocks; wait filters for non-nil.
	s.Roles.Set(nil)
	s.Credentials.Set(nil)
	s.CuratorConnection.Set(nil)
	s.ControlPlane.Set(&ControlPlane{})
	s.KubernetesStatus.Set(nil)
	s.kubernetesControllers.Set(nil)
	s.node.Set(nil)
	return s
}

// ProvideBootstrapData starts a new cluster with this node as its first
// member.
func (s *Service) ProvideBootstrapData(d BootstrapData) {
	s.loadRoles()
	s.node.Set(&nodeData{bootstrap: &d, nodeID: identity.NodeID(d.NodeKey.Public().(ed25519.PublicKey))})
}

// ProvideRegisterData hands over the credentials of a node that has just
// registered and committed.
func (s *Service) ProvideRegisterData(creds *identity.Credentials, dir *clusterpb.ClusterDirectory) {
	s.provide(creds, dir)
}

// ProvideJoinData hands over the credentials of a node that rejoined the
// cluster after a reboot.
func (s *Service) ProvideJoinData(creds *identity.Credentials, dir *clusterpb.ClusterDirectory) {
	s.provide(creds, dir)
}

func (s *Service) provide(creds *identity.Credentials, dir *clusterpb.ClusterDirectory) {
	s.loadRoles()
	s.node.Set(&nodeData{directory: dir, nodeID: identity.NodeID(creds.PublicKey())})
	if creds.Trust == nil {
		creds.Trust = identity.NewTrust(creds.CA)
	}
	var log *slog.Logger
	if s.LogTree != nil {
		log = s.LogTree.Logger("roleserver")
	}
	s.restoreCRL(creds.Trust, log)
	s.Credentials.Set(creds)
}

// loadRoles sets Roles from /data/node/roles, once, unless something set
// them already. The file alone never retires a consensus member: if etcd
// data is on disk, the node was a member, and stays one until the
// curator says otherwise — even when the file is missing, damaged, or
// stale because a write of newer roles failed. It may be the member the
// cluster needs before any curator can tell it its roles; the curator's
// word (rolefetch) is the only thing that moves the etcd data aside.
func (s *Service) loadRoles() {
	if get(&s.Roles) != nil || s.StorageRoot == nil {
		return
	}
	roles := &clusterpb.NodeRoles{}
	b, err := s.StorageRoot.Data.Node.Roles.Read()
	if err == nil {
		err = proto.Unmarshal(b, roles)
	}
	var log *slog.Logger
	if s.LogTree != nil {
		log = s.LogTree.Logger("roleserver")
	}
	if err != nil {
		roles = &clusterpb.NodeRoles{}
		if !errors.Is(err, fs.ErrNotExist) && log != nil {
			log.Error("persisted roles unreadable; waiting for the curator's", "file", s.StorageRoot.Data.Node.Roles.Path(), "err", err)
		}
	}
	if roles.ConsensusMember == nil && hasEtcdData(s.StorageRoot) {
		roles.ConsensusMember = &clusterpb.NodeRoles_ConsensusMember{}
		if log != nil {
			log.Warn("etcd data on disk but no consensus_member role saved: staying a member until the curator says otherwise",
				"file", s.StorageRoot.Data.Node.Roles.Path())
		}
	}
	s.Roles.Set(roles)
}

// keepClusterKeyLocally tells enrolment whether this node must be able to
// open its data volume without the cluster: a consensus member must, or a
// cluster whose members all reboot could never start again (each would
// wait for a curator that needs the others). Kept before etcd starts, so a
// member never runs without it; dropped only when the curator's roles say
// so (the rolefetch worker's setRoles), never on a guess from local
// files.
func (c *Config) keepClusterKeyLocally(member bool) error {
	if c.LocalClusterKey == nil {
		return nil
	}
	if err := c.LocalClusterKey(member); err != nil {
		return fmt.Errorf("sealing the cluster unlock key locally: %w", err)
	}
	return nil
}

// Run is the Role Server's supervised runnable: it starts the workers
// (see the package documentation), then builds the curator connection
// once the node has credentials.
func (s *Service) Run(ctx context.Context) error {
	if s.StorageRoot == nil {
		return errors.New("roleserver: Config.StorageRoot is required")
	}
	log := supervisor.Logger(ctx)
	for _, w := range []struct {
		name string
		fn   supervisor.Runnable
	}{
		{"controlplane", (&workerControlPlane{
			root: s.StorageRoot, node: &s.node, credentials: &s.Credentials, roles: &s.Roles,
			addresses: s.waitAddresses, status: s.status,
			consensusTuning: s.consensusTuning(), curatorSettings: s.curatorSettings(),
			controlPlane: &s.ControlPlane, rolesFile: &s.rolesFile, hosts: &s.hosts,
			keepClusterKey: s.keepClusterKeyLocally,
		}).run},
		{"nodemgmt", (&workerNodeMgmt{
			credentials: &s.Credentials, listen: s.listenAddress(s.nodeMgmtPort()),
			logTree: s.LogTree, status: s.status, runnables: s.Runnables, power: s.Power, updates: s.Updates,
			curator: &s.CuratorConnection,
		}).run},
		{"rolefetch", (&workerRoleFetch{
			node: &s.node, curator: &s.CuratorConnection,
			roles: &s.Roles, rolesFile: &s.rolesFile, keepClusterKey: s.keepClusterKeyLocally,
		}).run},
		{"statuspush", (&workerStatusPush{
			node: &s.node, curator: &s.CuratorConnection, addresses: s.waitAddresses, status: s.status,
		}).run},
		{"heartbeat", (&workerHeartbeat{
			curator: &s.CuratorConnection, acceptCRL: s.acceptCRL,
		}).run},
		{"hosts", (&workerHosts{
			node: &s.node, curator: &s.CuratorConnection, curatorPort: s.curatorPort(),
			hosts: &s.hosts, endpoints: &s.endpoints, directory: &s.directory, controllers: &s.kubernetesControllers,
		}).run},
		{"kubernetes", (&workerKubernetes{
			root: s.StorageRoot, node: &s.node, roles: &s.Roles, controlPlane: &s.ControlPlane,
			curator: &s.CuratorConnection, controllers: &s.kubernetesControllers,
			address: s.waitAddress, resolvConf: s.ResolvConf, loadModules: s.LoadKubernetesModules, stopPods: s.StopPods,
			status: &s.KubernetesStatus,
		}).run},
	} {
		if err := supervisor.Run(ctx, w.name, w.fn); err != nil {
			return err
		}
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)

	if get(&s.node) == nil {
		log.Info("waiting for cluster enrolment (bootstrap, register or join)")
	}
	nd, err := wait(ctx, &s.node)
	if err != nil {
		return err
	}
	log.Info("node identity known", "node", nd.nodeID)
	creds, err := wait(ctx, &s.Credentials)
	if err != nil {
		return err
	}
	res := rpc.NewResolver(log, func() credentials.TransportCredentials {
		return credentials.NewTLS(creds.ClientTLSConfig(identity.ServerCurator))
	})
	defer res.Close()
	// The directory saved at registration first, then the parameters'
	// endpoints: the directory may name only curators that have since
	// moved or lost the role.
	s.endpoints.update(res, func(e *curatorEndpoints) {
		e.directory = s.directoryEndpoints(nd.directory)
		e.fallback = s.CuratorEndpoints
	})
	conn, err := res.Dial()
	if err != nil {
		return fmt.Errorf("roleserver: curator connection: %w", err)
	}
	defer conn.Close()
	s.CuratorConnection.Set(&CuratorConnection{Credentials: creds, Resolver: res, Conn: conn})
	defer s.CuratorConnection.Set(nil)

	// The local curator is an endpoint while it runs.
	w := s.ControlPlane.Watch()
	defer w.Close()
	var logged string
	for {
		cp, err := w.Get(ctx)
		if err != nil {
			return err
		}
		s.endpoints.update(res, func(e *curatorEndpoints) {
			e.local = ""
			if cp != nil && cp.Running {
				e.local = s.localCurator()
			}
		})
		if eps := fmt.Sprint(res.Endpoints()); eps != logged {
			log.Info("looking for the curator leader", "endpoints", eps)
			logged = eps
		}
	}
}

// directoryEndpoints are the curator endpoints of a directory.
func (s *Service) directoryEndpoints(dir *clusterpb.ClusterDirectory) []string {
	var out []string
	for _, n := range dir.GetNodes() {
		for _, a := range n.GetAddresses() {
			out = append(out, net.JoinHostPort(a, strconv.Itoa(s.curatorPort())))
		}
	}
	return out
}

var nonNilRoles = event.Filter(func(r *clusterpb.NodeRoles) bool { return r != nil })

// wait returns the first non-nil value of v.
func wait[T any](ctx context.Context, v *memory.Value[*T]) (*T, error) {
	w := v.Watch()
	defer w.Close()
	return w.Get(ctx, event.Filter(func(t *T) bool { return t != nil }))
}

// get returns the current value of v. New sets every value, so this
// never blocks.
func get[T any](v *memory.Value[*T]) *T { return current(v) }

// current returns the current value of v (set at New, so it never blocks).
func current[T any](v *memory.Value[T]) T {
	w := v.Watch()
	defer w.Close()
	t, _ := w.Get(context.Background())
	return t
}

// addresses are the node's current addresses, most preferred first.
func (s *Service) addresses() []string {
	if s.knobs != nil && s.knobs.addresses != nil {
		return append([]string(nil), s.knobs.addresses...)
	}
	if s.Network == nil {
		return nil
	}
	st, ok := s.Network.Status()
	if !ok || !st.Address.IsValid() {
		return nil
	}
	return []string{st.Address.Addr().String()}
}

// waitAddresses blocks until the node has an address.
func (s *Service) waitAddresses(ctx context.Context) ([]string, error) {
	if a := s.addresses(); len(a) > 0 || s.Network == nil {
		return a, nil
	}
	supervisor.Logger(ctx).Info("waiting for a network address")
	if _, err := s.Network.WaitAddress(ctx); err != nil {
		return nil, err
	}
	return s.addresses(), nil
}

// waitAddress is the node's preferred address, once it has one.
func (s *Service) waitAddress(ctx context.Context) (net.IP, error) {
	a, err := s.waitAddresses(ctx)
	if err != nil {
		return nil, err
	}
	for _, x := range a {
		if ip := net.ParseIP(x); ip != nil {
			return ip, nil
		}
	}
	return nil, errors.New("roleserver: the node has no address")
}

// status is the node's own status, as pushed to the curator.
func (s *Service) status() *clusterpb.NodeStatus {
	st := &clusterpb.NodeStatus{Addresses: s.addresses(), Version: s.Version, BootCount: s.bootCount(), Problems: s.currentProblems()}
	if !s.BootTime.IsZero() {
		st.BootTimeUnixNanos = s.BootTime.UnixNano()
	}
	if s.Updates != nil {
		st.Software = software(s.Updates.Status())
	}
	return st
}

// bootCount is Config.BootCount or, when that is unset, the counter init
// keeps on the data volume (a registering node opens it only after the
// Role Server started).
func (s *Service) bootCount() int64 {
	if s.BootCount != 0 || s.StorageRoot == nil {
		return s.BootCount
	}
	b, err := s.StorageRoot.Data.Node.BootCount.Read()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// currentProblems are the ongoing problems, by component: those the
// workers set and the runnables in a crash loop.
func (s *Service) currentProblems() []*clusterpb.NodeProblem {
	out := s.problems.list()
	for _, p := range s.BootProblems {
		out = append(out, proto.CloneOf(p))
	}
	if s.Runnables != nil {
		out = append(out, crashLoops(s.Runnables())...)
	}
	slices.SortFunc(out, func(a, b *clusterpb.NodeProblem) int { return strings.Compare(a.Component, b.Component) })
	return out
}

// crashLoopFailures is how many failures in a row make a runnable a
// problem of the node (a Kubernetes component that keeps crashing).
const crashLoopFailures = 3

// crashLoops are the runnables that failed crashLoopFailures times in a
// row without staying healthy in between.
func crashLoops(runnables []supervisor.Status) []*clusterpb.NodeProblem {
	var out []*clusterpb.NodeProblem
	for _, r := range runnables {
		if r.Failures < crashLoopFailures {
			continue
		}
		out = append(out, &clusterpb.NodeProblem{
			Component: r.DN,
			Message:   fmt.Sprintf("failed %d times in a row, last: %s", r.Failures, r.LastErr),
		})
	}
	return out
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// backoff is a retry delay doubling from 250ms up to 5s.
type backoff time.Duration

func (b *backoff) next() time.Duration {
	d := time.Duration(*b)
	if d == 0 {
		d = 250 * time.Millisecond
	}
	*b = backoff(min(2*d, 5*time.Second))
	return d
}

func (b *backoff) reset() { *b = 0 }

// retrySleep waits d before a retry at the curator leader, or less if the
// resolver learns of a new leader meanwhile: after a failover the retry
// goes there at once instead of after the backoff.
func retrySleep(ctx context.Context, conn *CuratorConnection, d time.Duration) error {
	changed := conn.Resolver.LeaderChanged()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-changed:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
