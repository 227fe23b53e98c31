package curator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/consensus/client"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

// HeartbeatInterval is how often nodes send a heartbeat.
const HeartbeatInterval = 3 * time.Second

// maxRequestSize bounds every request the curator reads (gRPC's default
// is 4 MiB): nothing a node or the owner sends needs more, and a
// registering node must not be able to make the curator buffer much.
const maxRequestSize = 256 << 10

// Defaults of Config. The leader TTL bounds how long the cluster goes
// without a curator leader after the leader lost power: its lease
// expires TTL after etcd (re)elected its own leader (etcd renews every
// lease when its leadership moves), then another curator takes over at
// once. Five seconds is five etcd election timeouts, and the lease is
// renewed every TTL/3.
const (
	defaultLeaderTTL        = 5 * time.Second
	defaultHeartbeatTimeout = 15 * time.Second
)

// Config configures a curator.
type Config struct {
	// Credentials are this node's. The curator serves with a curator
	// certificate it issues itself for the same key, and classifies
	// callers against Credentials.Trust (the CA and the cluster CRL, which
	// the curator keeps current from etcd).
	Credentials *identity.Credentials
	// Consensus is the local consensus member: its Status gives the
	// curator's namespaced etcd client and AddNode/RemoveNode.
	Consensus consensus.ServiceHandle
	// ListenAddress of the gRPC server; default ":7835".
	ListenAddress string
	// AdvertisePort is the curator port sent in GetCurrentLeader; default
	// layout.CuratorPort.
	AdvertisePort int
	// LeaderTTL is the lease TTL of the leadership key (rounded up to whole
	// seconds); default 5s.
	LeaderTTL time.Duration
	// HeartbeatTimeout is how long a node may go without heartbeat before
	// it is HEARTBEAT_TIMEOUT; default 15s.
	HeartbeatTimeout time.Duration
	// AddNodeOptions are passed to consensus AddNode (e.g. an explicit
	// peer address, consensus.PeerAddress, where node IDs do not resolve).
	AddNodeOptions func(nodeID string) []*consensus.AddNodeOption
	// Observe maps the source address of a node's authenticated
	// connection to the addresses the curator records it was seen at
	// (Node.observed_addresses); nil: observeAddress. Tests, whose nodes
	// all dial from 127.0.0.1, put their own in.
	Observe func(nodeID string, source net.IP) []net.IP
	// ServerOptions are added to the gRPC server's options (after the TLS
	// credentials and the authorization interceptor of roleserver/rpc,
	// which the curator always installs itself).
	ServerOptions []grpc.ServerOption
}

// Service is one curator. See the package documentation.
type Service struct {
	cfg    Config
	nodeID string

	mu      sync.Mutex
	kv      client.Namespaced // nil while not running
	cstatus *consensus.Status // the consensus status kv came from
	term    *term             // non-nil while this curator leads
	crl     *pki.CRL          // the cluster CRL as last read from etcd

	// leader is who leads, as this curator last saw it (nil: unknown).
	leader    memory.Value[*leaderInfo]
	leaderNow *leaderInfo // guarded by mu, the value last Set

	hbMu sync.Mutex
	hb   map[string]*heartbeatState

	// membersWake wakes the leader's pending member loop (members.go).
	membersWake chan struct{}
}

// New creates a curator; nothing happens until Run.
func New(cfg Config) *Service {
	if cfg.ListenAddress == "" {
		cfg.ListenAddress = fmt.Sprintf(":%d", layout.CuratorPort)
	}
	if cfg.AdvertisePort == 0 {
		cfg.AdvertisePort = layout.CuratorPort
	}
	if cfg.LeaderTTL <= 0 {
		cfg.LeaderTTL = defaultLeaderTTL
	}
	if cfg.HeartbeatTimeout <= 0 {
		cfg.HeartbeatTimeout = defaultHeartbeatTimeout
	}
	s := &Service{cfg: cfg, hb: map[string]*heartbeatState{}, membersWake: make(chan struct{}, 1)}
	if cfg.Credentials != nil {
		s.nodeID = identity.NodeID(cfg.Credentials.PublicKey())
	}
	if s.cfg.Observe == nil {
		s.cfg.Observe = func(id string, source net.IP) []net.IP {
			return observeAddress(s.nodeID, id, source, interfaceAddresses)
		}
	}
	return s
}

// Run is a supervisor runnable: it waits for the local consensus member,
// serves Curator, Management and AAA, and takes part in leader election.
// It fails (to be restarted) when the consensus member stops or changes.
func (s *Service) Run(ctx context.Context) error {
	if s.cfg.Credentials == nil || s.cfg.Consensus == nil {
		return errors.New("curator: Config.Credentials and Config.Consensus are required")
	}
	log := supervisor.Logger(ctx)
	w := s.cfg.Consensus.Watch()
	defer w.Close()
	st, err := w.Get(ctx, consensus.FilterRunning)
	if err != nil {
		return err
	}
	kv, err := st.CuratorClient()
	if err != nil {
		return fmt.Errorf("curator: etcd client: %w", err)
	}
	defer kv.Close()
	if err := checkBootstrapped(ctx, kv); err != nil {
		return err
	}

	s.attach(kv, st)
	defer s.detach()
	creds, err := s.curatorCredentials(ctx, kv)
	if err != nil {
		return fmt.Errorf("curator: issuing this curator's certificate: %w", err)
	}
	lis, srv, err := s.newServer(creds, log)
	if err != nil {
		return err
	}
	if err := supervisor.Run(ctx, "members", s.runMembers); err != nil {
		lis.Close()
		return err
	}
	return s.serve(ctx, w, kv, creds.Trust, lis, srv)
}

// checkBootstrapped fails unless etcd holds a cluster (its CA
// certificate): a curator has nothing to serve before Bootstrap.
func checkBootstrapped(ctx context.Context, kv client.Namespaced) error {
	if v, _, err := getValue(ctx, kv, keyCACert); err != nil {
		return fmt.Errorf("curator: reading cluster state: %w", err)
	} else if v == nil {
		return errors.New("curator: no cluster state in etcd (Bootstrap was not run)")
	}
	return nil
}

// attach makes kv and st the backend the gRPC methods use; detach ends
// that, and this curator's view of the leader.
func (s *Service) attach(kv client.Namespaced, st *consensus.Status) {
	s.mu.Lock()
	s.kv, s.cstatus = kv, st
	s.mu.Unlock()
}

func (s *Service) detach() {
	s.mu.Lock()
	s.kv, s.cstatus = nil, nil
	s.mu.Unlock()
	s.setLeader(nil)
}

// newServer listens and makes the gRPC server of the three services,
// with this curator's certificate and the callers classified against
// creds.Trust.
func (s *Service) newServer(creds *identity.Credentials, log *slog.Logger) (net.Listener, *grpc.Server, error) {
	lis, err := net.Listen("tcp", s.cfg.ListenAddress)
	if err != nil {
		return nil, nil, fmt.Errorf("curator: %w", err)
	}
	// Keepalives on every curator, so that a node's stream to a curator
	// that lost power fails in seconds (see rpc.ServerKeepalive).
	authz := rpc.NewAuthorizer(creds.Trust, log, s.checkCaller)
	opts := append([]grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(creds.ServerTLSConfig())),
		grpc.MaxRecvMsgSize(maxRequestSize),
	}, authz.ServerOptions()...)
	opts = append(opts, rpc.ServerKeepalive()...)
	srv := grpc.NewServer(append(opts, s.cfg.ServerOptions...)...)
	clusterpb.RegisterCuratorServer(srv, curatorServer{Service: s})
	clusterpb.RegisterManagementServer(srv, managementServer{Service: s})
	clusterpb.RegisterAAAServer(srv, aaaServer{Service: s})
	return lis, srv, nil
}

// serve runs the curator's four loops (the CRL, the gRPC server, the
// election, the watch of the consensus status) until ctx ends or one of
// them fails, then stops them all.
func (s *Service) serve(ctx context.Context, w event.Watcher[*consensus.Status], kv client.Namespaced, trust *identity.Trust, lis net.Listener, srv *grpc.Server) error {
	log := supervisor.Logger(ctx)
	inner, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	wg.Add(4)
	go func() {
		defer wg.Done()
		s.followCRL(inner, kv, trust, log)
	}()
	go func() {
		defer wg.Done()
		if err := srv.Serve(lis); err != nil {
			errc <- fmt.Errorf("curator: gRPC server: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		s.elect(inner, kv, log)
	}()
	go func() {
		defer wg.Done()
		// Any new consensus status means the client above is stale.
		if _, err := w.Get(inner); err == nil {
			errc <- errors.New("curator: consensus member stopped or restarted")
		}
	}()
	log.Info("curator serving", "address", lis.Addr().String(), "node", s.nodeID)
	supervisor.Signal(ctx, supervisor.SignalHealthy)

	var err error
	select {
	case <-ctx.Done():
		err = ctx.Err()
	case err = <-errc:
	}
	cancel()
	srv.Stop()
	w.Close()
	wg.Wait()
	return err
}

// backend is the etcd client and consensus status while running.
func (s *Service) backend() (client.Namespaced, *consensus.Status, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kv == nil {
		return nil, nil, errUnavailable("curator is not connected to its consensus member")
	}
	return s.kv, s.cstatus, nil
}

// curatorServer, managementServer and aaaServer are the three gRPC
// services of one Service.
// Every method is implemented; the embedded Unimplemented types only
// satisfy the generated interfaces.
type curatorServer struct {
	clusterpb.UnimplementedCuratorServer
	*Service
}
type managementServer struct {
	clusterpb.UnimplementedManagementServer
	*Service
}
type aaaServer struct {
	clusterpb.UnimplementedAAAServer
	*Service
}
