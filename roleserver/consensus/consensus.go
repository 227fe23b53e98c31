package consensus

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/localstorage"
)

// Config describes the startup configuration of a consensus instance.
type Config struct {
	// Data directory (persistent, encrypted storage) for etcd.
	Data *localstorage.DataEtcdDirectory
	// Ephemeral directory for etcd.
	Ephemeral *localstorage.EphemeralConsensusDirectory

	// JoinCluster is set if this instance is to join an existing cluster for the
	// first time. If not set, it's assumed this instance has ran before and has all
	// the state on disk required to become part of whatever cluster it was before.
	// If that data is not present, a new cluster will be bootstrapped.
	JoinCluster *JoinCluster

	// NodeID is the node ID, which is also used to identify consensus nodes.
	NodeID string

	// NodePrivateKey is the node's main private key which is also used for
	// Metropolis PKI. The same key will be used for consensus nodes, but
	// different certificates will be used.
	NodePrivateKey ed25519.PrivateKey

	// Tuning changes settings that production leaves at their defaults;
	// its zero value is what every node runs with.
	Tuning Tuning
}

// Tuning holds the member settings a node never changes: each zero field
// means the default below. They exist so that tests and benchmarks can run
// several members in one process on loopback ports, with short raft
// timings and without fsync (roleserver/internal/testutil has the loopback
// values); /init sets none of them.
type Tuning struct {
	// PeerListen is the host:port the peer listener binds (default
	// 0.0.0.0:7834).
	PeerListen string
	// PeerAdvertise is the host:port other members dial. The default host
	// is the node ID, which the cluster's name resolution maps to the node.
	PeerAdvertise string
	// TickMs and ElectionMs are etcd's heartbeat interval and election
	// timeout (default etcd's own, 100 and 1000).
	TickMs, ElectionMs uint
	// ReadyTimeout bounds how long a started member may take to become
	// part of its cluster before the runnable gives up (default 2 min).
	ReadyTimeout time.Duration
	// PromoteInterval is how often the autopromoter looks at learners
	// (default 5 s).
	PromoteInterval time.Duration
	// NoFsync trades durability for speed; never set on a node.
	NoFsync bool
}

const (
	// defaultPeerPort is the TCP port of the peer (raft) listener.
	defaultPeerPort = 7834
	// Production raft timings: etcd's own defaults, which tolerate a
	// loaded node or a slow network link.
	defaultTickMs          = 100
	defaultElectionMs      = 1000
	defaultReadyTimeout    = 2 * time.Minute
	defaultPromoteInterval = 5 * time.Second
)

func (k Tuning) withDefaults(nodeID string) Tuning {
	if k.PeerListen == "" {
		k.PeerListen = fmt.Sprintf("0.0.0.0:%d", defaultPeerPort)
	}
	if k.PeerAdvertise == "" {
		k.PeerAdvertise = fmt.Sprintf("%s:%d", nodeID, defaultPeerPort)
	}
	if k.TickMs == 0 {
		k.TickMs = defaultTickMs
	}
	if k.ElectionMs == 0 {
		k.ElectionMs = defaultElectionMs
	}
	if k.ReadyTimeout == 0 {
		k.ReadyTimeout = defaultReadyTimeout
	}
	if k.PromoteInterval == 0 {
		k.PromoteInterval = defaultPromoteInterval
	}
	return k
}

// ExistingNode is the peer URL and name of an already running consensus instance.
type ExistingNode struct {
	Name string
	URL  string
}

// JoinCluster is all the data required for a node to join (for the first time)
// an already running cluster. This data is available from an already running
// consensus member by performing AddNode, which is called by the Curator when
// new etcd nodes are added to the cluster.
type JoinCluster struct {
	CACertificate   *x509.Certificate
	NodeCertificate *x509.Certificate
	// ExistingNodes are an arbitrarily ordered list of other consensus members
	// that the node should attempt to contact.
	ExistingNodes []ExistingNode
	// InitialCRL is a certificate revocation list for this cluster. After the
	// node starts, a CRL on disk will be maintained reflecting the PKI state
	// within etcd.
	InitialCRL *pki.CRL
}

// Service is the etcd cluster member service. See package-level
// documentation for more information.
type Service struct {
	config Config
	value  memory.Value[*Status]
}

// New creates a consensus service; nothing happens until Run.
func New(config Config) *Service {
	s := &Service{config: config}
	// A watcher must not block forever just because Run has not started
	// yet: it gets a stopped status at once.
	s.value.Set(&Status{})
	return s
}

// Watch returns a watcher of the service's Status. Use FilterRunning to wait
// for a running member.
func (s *Service) Watch() event.Watcher[*Status] {
	return s.value.Watch()
}

func (c *Config) validate() error {
	switch {
	case c.Data == nil || c.Data.Data.Path() == "" || c.Data.PeerPKI.Path() == "":
		return errors.New("consensus: Config.Data is not a placed localstorage directory")
	case c.Ephemeral == nil || c.Ephemeral.ClientSocket.Path() == "":
		return errors.New("consensus: Config.Ephemeral is not a placed localstorage directory")
	case c.NodeID == "":
		return errors.New("consensus: Config.NodeID is empty")
	case len(c.NodePrivateKey) != ed25519.PrivateKeySize:
		return fmt.Errorf("consensus: Config.NodePrivateKey has %d bytes, want %d", len(c.NodePrivateKey), ed25519.PrivateKeySize)
	}
	return nil
}

// Run is a Supervisor runnable that starts the etcd member service. It will
// become healthy once the member joins the cluster successfully. A joining
// member counts as joined once it has been promoted from learner to voter,
// as only then can it serve clients.
func (s *Service) Run(ctx context.Context) error {
	if err := s.config.validate(); err != nil {
		return err
	}
	k := s.config.Tuning.withDefaults(s.config.NodeID)
	lg := newZapLogger(supervisor.Logger(ctx), ctx.Done())
	d := newDisk(s.config.Data)

	join, err := s.prepareDisk(ctx, lg, k, d)
	if err != nil {
		return err
	}
	cfg, err := s.etcdConfig(lg, k, d, join)
	if err != nil {
		return err
	}
	e, err := startEtcd(cfg)
	if err != nil {
		if join != nil {
			return fmt.Errorf("consensus: joining the cluster through %s: %w", describePeers(join.ExistingNodes), err)
		}
		return fmt.Errorf("consensus: starting etcd: %w", err)
	}
	defer closeEtcd(e)

	if err := waitReady(ctx, e, k.ReadyTimeout); err != nil {
		return err
	}
	if err := waitPromoted(ctx, e); err != nil {
		return err
	}
	// Made only once the member is ready and promoted: in-process calls
	// skip etcd's gRPC interceptors, the ones that refuse a learner's
	// clients among them. It is closed before etcd (defers run in
	// reverse).
	be := newServerBackend(e.Server)
	defer be.close()

	if err := supervisor.Run(ctx, "autopromoter", autopromoter(e, be.Cluster, k.PromoteInterval)); err != nil {
		return err
	}
	if err := supervisor.Run(ctx, "crl", d.crlWatcher(be)); err != nil {
		return err
	}
	if err := supervisor.Run(ctx, "compactor", compactor(be.KV, compactInterval)); err != nil {
		return err
	}

	s.value.Set(&Status{running: true, be: be})
	// Consumers must stop using the backend before it is closed.
	defer s.value.Set(&Status{})
	supervisor.Logger(ctx).Info("consensus member running", "member", e.Server.MemberID().String())
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	return waitStopped(ctx, e)
}

// prepareDisk makes the data directory ready for etcd and returns the
// JoinCluster etcd is to start with: nil for a restart (the data on disk
// decides) and for a new cluster, which it bootstraps.
func (s *Service) prepareDisk(ctx context.Context, lg *zap.Logger, k Tuning, d disk) (*JoinCluster, error) {
	hasWAL, err := d.hasWAL()
	if err != nil {
		return nil, err
	}
	join := s.config.JoinCluster
	switch {
	case hasWAL:
		// Restart: whatever is on disk decides which cluster this is. A
		// JoinCluster handed in again (the caller does not know whether a
		// previous join got far enough) is stale by now.
		if join != nil {
			supervisor.Logger(ctx).Info("etcd data present, ignoring JoinCluster and rejoining with the state on disk")
		}
		return nil, s.checkRestart(lg, d)
	case join != nil:
		if err := validateJoin(join, s.config.NodePrivateKey); err != nil {
			return nil, err
		}
		if err := d.writePKI(join.CACertificate, join.NodeCertificate, s.config.NodePrivateKey, join.InitialCRL); err != nil {
			return nil, err
		}
		return join, nil
	}
	if d.hasPKI() && !d.hasUnfinishedBootstrap() {
		// Peer certificates without etcd data mean the data vanished
		// (or a join never finished): bootstrapping would silently
		// fork off a new cluster next to the real one.
		return nil, fmt.Errorf("consensus: peer PKI in %s but no etcd data in %s, and no JoinCluster: refusing to bootstrap a new cluster over a member's leftovers", d.pkiDir(), d.dataDir())
	}
	if err := s.bootstrap(ctx, k, d); err != nil {
		return nil, fmt.Errorf("consensus: bootstrapping a new cluster: %w", err)
	}
	return nil, nil
}

// checkRestart checks a member's data before etcd starts on it again.
func (s *Service) checkRestart(lg *zap.Logger, d disk) error {
	if err := verifyDataDir(lg, d.dataDir()); err != nil {
		return fmt.Errorf("consensus: refusing to start on a damaged data directory %s (left untouched): %w", d.dataDir(), err)
	}
	if err := d.checkPKI(s.config.NodePrivateKey); err != nil {
		return err
	}
	// Only a bootstrap that got as far as moving its data into place
	// leaves this behind; what is left in it is garbage.
	return os.RemoveAll(d.bootstrapDir())
}

// waitStopped waits until ctx ends or etcd fails or stops.
func waitStopped(ctx context.Context, e *embed.Etcd) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-e.Err():
		return fmt.Errorf("consensus: etcd failed: %w", err)
	case <-e.Server.StopNotify():
		return errors.New("consensus: etcd stopped (was this member removed from the cluster?)")
	}
}

// startEtcd turns a panic of etcd's startup (a zap Fatal, see newZapLogger)
// into an error, and unlinks the client sockets etcd just created.
//
// embed insists on a client listener, but this package's clients are all
// in-process (backend): a socket file would let anyone who can reach it
// (a pod with a hostPath, say) read the whole keyspace, the CA key
// included. A listening socket without a path cannot be connected to.
// etcd only accepts on it once the member is ready, so a connection made
// before the unlink waits in the backlog until then; closing that window
// would need etcd to take a listener made by us.
func startEtcd(cfg *embed.Config) (e *embed.Etcd, err error) {
	defer func() {
		if r := recover(); r != nil {
			e, err = nil, fmt.Errorf("etcd panicked while starting: %v", r)
		}
	}()
	e, err = embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	for _, u := range cfg.ListenClientUrls {
		if u.Scheme != "unix" && u.Scheme != "unixs" {
			continue
		}
		// etcd's own listener address for unix URLs.
		if err := os.Remove(u.Host + u.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			closeEtcd(e)
			return nil, fmt.Errorf("unlinking etcd's client socket: %w", err)
		}
	}
	return e, nil
}

// closeEtcd stops e whether or not it ever became ready: embed.Etcd.Close
// alone waits for its client servers, which only start once the member is
// ready, so closing a member that never got a quorum would hang forever.
func closeEtcd(e *embed.Etcd) {
	select {
	case <-e.Server.ReadyNotify():
	default:
		e.Server.HardStop()
	}
	e.Close()
}

// waitReady waits until the member has published itself to the cluster,
// which needs a quorum: a member whose peers are all unreachable or refuse
// its certificate never gets there, and must fail instead of hanging.
func waitReady(ctx context.Context, e *embed.Etcd, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("consensus: etcd failed while starting: %w", err)
	case <-e.Server.StopNotify():
		return errors.New("consensus: etcd stopped while starting (was this member removed from the cluster?)")
	case <-t.C:
		return fmt.Errorf("consensus: member not ready after %v: no quorum reachable (peers down, unreachable, or refusing this member's certificate)", timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitPromoted holds a learner back from being reported running: a learner
// serves no linearizable reads or writes, so neither the namespaced clients
// nor the CRL watcher would work yet. There is no timeout: a learner that
// is still catching up is making progress.
func waitPromoted(ctx context.Context, e *embed.Etcd) error {
	if !e.Server.IsLearner() {
		return nil
	}
	supervisor.Logger(ctx).Info("joined as learner, waiting to be promoted")
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for e.Server.IsLearner() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-e.Err():
			return fmt.Errorf("consensus: etcd failed: %w", err)
		case <-e.Server.StopNotify():
			return errors.New("consensus: etcd stopped while a learner (was this member removed from the cluster?)")
		case <-t.C:
		}
	}
	return nil
}

func describePeers(nodes []ExistingNode) string {
	s := ""
	for i, n := range nodes {
		if i > 0 {
			s += ", "
		}
		s += n.Name + "=" + n.URL
	}
	return "[" + s + "]"
}
