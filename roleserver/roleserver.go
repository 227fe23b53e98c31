package roleserver

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/network"
	"plinth.dev/plinth/platform/nodenames"
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
	// Names receives the node ID → address map; the process resolves node
	// IDs through it (init installs its resolver as net.DefaultResolver:
	// platform/nodenames). nil: a table of the Role Server's own that
	// nothing resolves through (tests, whose etcd members use addresses).
	Names *nodenames.Table
	// Power reboots (true) or powers off (false) the node, for
	// NodeManagement.Reboot/PowerOff. nil: those RPCs fail.
	Power func(reboot bool)
	// CuratorEndpoints (host:port, from the node parameters) seed the
	// curator resolver next to the cluster directory.
	CuratorEndpoints []string
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

	// For enrolment, which keeps the node's sealed join state (a
	// registered node's) in step with the cluster:
	//
	// Directory is the cluster's curators (its consensus members, sorted
	// by node ID) as the hosts worker last saw them, every time it sees
	// them; nil before. Sealed into the join state, it lets the node find
	// the cluster after a reboot even when the curators it registered
	// with have moved.
	Directory memory.Value[*clusterpb.ClusterDirectory]
	// ClusterKey is the latest request to keep or drop the cluster unlock
	// key sealed locally (clusterkey.go); nil before the first. Something
	// must answer every request: the controlplane waits for the answer
	// before it starts etcd. enrolment.Service does; tests answer
	// themselves.
	ClusterKey memory.Value[*ClusterKeyRequest]

	// kubernetesControllers are the API servers the cluster lists, for
	// the Kubernetes worker's local proxy.
	kubernetesControllers memory.Value[[]string]
	// policy is the cluster policy as the curator last sent it
	// (policyfetch), for the Kubernetes worker's image registries.
	policy memory.Value[*clusterpb.ClusterConfiguration]

	node memory.Value[*nodeData]

	// State shared by workers (and kept across restarts of Run), each
	// with its own lock.
	problems   problems
	endpoints  resolverEndpoints
	rolesFile  rolesFile
	hosts      hostsFile
	clusterKey clusterKeyRequests
	// releaseTrust is where the node stands in the chain of release
	// keys (releasetrust.go).
	releaseTrust releaseTrust
}

// New makes a Role Server; nothing runs until Run and a Provide*Data call.
func New(c Config) *Service {
	if c.Names == nil {
		c.Names = nodenames.NewTable()
	}
	if c.ResolvConf == "" {
		c.ResolvConf = "/run/resolv.conf"
	}
	s := &Service{Config: c}
	s.rolesFile = rolesFile{root: c.StorageRoot, problems: &s.problems}
	if c.knobs != nil {
		s.rolesFile.beforeWrite, s.rolesFile.retryEvery = c.knobs.saveRoles, c.knobs.retryInterval
	}
	s.hosts = hostsFile{names: c.Names, root: c.StorageRoot, addresses: s.addresses}
	s.clusterKey = clusterKeyRequests{value: &s.ClusterKey}
	if c.StorageRoot != nil {
		s.releaseTrust.file = &c.StorageRoot.Data.Node.ReleaseTrust
	}
	// Every value starts set (to nil where unknown), so that get never
	// blocks; wait filters for non-nil.
	s.Roles.Set(nil)
	s.Credentials.Set(nil)
	s.CuratorConnection.Set(nil)
	s.ControlPlane.Set(&ControlPlane{})
	s.KubernetesStatus.Set(nil)
	s.kubernetesControllers.Set(nil)
	s.policy.Set(nil)
	s.node.Set(nil)
	s.Directory.Set(nil)
	s.ClusterKey.Set(nil)
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

// Run is the Role Server's supervised runnable: it starts the workers
// (see the package documentation), then runs the curator connection
// (workerCurator) itself.
func (s *Service) Run(ctx context.Context) error {
	if s.StorageRoot == nil {
		return errors.New("roleserver: Config.StorageRoot is required")
	}
	for _, w := range []struct {
		name string
		fn   supervisor.Runnable
	}{
		{"controlplane", (&workerControlPlane{
			root: s.StorageRoot, node: &s.node, credentials: &s.Credentials, roles: &s.Roles,
			addresses: s.waitAddresses, status: s.status,
			consensusTuning: s.consensusTuning(), curatorSettings: s.curatorSettings(),
			controlPlane: &s.ControlPlane, rolesFile: &s.rolesFile, hosts: &s.hosts,
			clusterKey: &s.clusterKey,
		}).run},
		{"nodemgmt", (&workerNodeMgmt{
			credentials: &s.Credentials, listen: s.listenAddress(s.nodeMgmtPort()),
			logTree: s.LogTree, auditDir: s.StorageRoot.Data.Kubernetes.Audit.Path(), status: s.status, power: s.Power, updates: s.Updates,
			curator: &s.CuratorConnection, releaseTrust: &s.releaseTrust,
		}).run},
		{"rolefetch", (&workerRoleFetch{
			node: &s.node, curator: &s.CuratorConnection,
			roles: &s.Roles, rolesFile: &s.rolesFile, clusterKey: &s.clusterKey,
		}).run},
		{"statuspush", (&workerStatusPush{
			node: &s.node, curator: &s.CuratorConnection, addresses: s.waitAddresses, status: s.status,
		}).run},
		{"heartbeat", (&workerHeartbeat{
			curator: &s.CuratorConnection, acceptCRL: s.acceptCRL,
		}).run},
		{"hosts", (&workerHosts{
			node: &s.node, curator: &s.CuratorConnection, curatorPort: s.curatorPort(),
			hosts: &s.hosts, endpoints: &s.endpoints, directory: &s.Directory, controllers: &s.kubernetesControllers,
		}).run},
		{"policyfetch", (&workerPolicyFetch{curator: &s.CuratorConnection, policy: &s.policy, releaseTrust: &s.releaseTrust}).run},
		{"kubernetes", (&workerKubernetes{
			root: s.StorageRoot, node: &s.node, roles: &s.Roles, controlPlane: &s.ControlPlane,
			curator: &s.CuratorConnection, controllers: &s.kubernetesControllers, policy: &s.policy,
			address: s.waitAddress, resolvConf: s.ResolvConf, loadModules: s.LoadKubernetesModules, stopPods: s.StopPods,
			status: &s.KubernetesStatus,
		}).run},
	} {
		if err := supervisor.Run(ctx, w.name, w.fn); err != nil {
			return err
		}
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	return (&workerCurator{
		node: &s.node, credentials: &s.Credentials, controlPlane: &s.ControlPlane,
		fallback: s.CuratorEndpoints, curatorPort: s.curatorPort(), localCurator: s.localCurator(),
		curator: &s.CuratorConnection, endpoints: &s.endpoints,
	}).run(ctx)
}
