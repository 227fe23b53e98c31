package roleserver

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/localstorage"
)

// errMembershipChanged makes the supervisor restart the controlplane
// runnable, which stops its etcd and curator children and starts them
// again (or not) for the new roles.
var errMembershipChanged = fmt.Errorf("consensus_member role changed: %w", supervisor.ErrRestart)

var nonNilRoles = event.Filter(func(r *clusterpb.NodeRoles) bool { return r != nil })

// runControlPlane runs etcd and the curator while the node's roles make it
// a consensus member, and bootstraps the cluster when told to.
func (s *Service) runControlPlane(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	defer s.ControlPlane.Set(&ControlPlane{})
	nd, err := wait(ctx, &s.node)
	if err != nil {
		return err
	}
	if nd.bootstrap != nil && get(&s.Credentials) == nil {
		return s.bootstrap(ctx, nd)
	}
	creds, err := wait(ctx, &s.Credentials)
	if err != nil {
		return err
	}
	rw := s.Roles.Watch()
	defer rw.Close()
	roles, err := rw.Get(ctx, nonNilRoles)
	if err != nil {
		return err
	}
	member := roles.GetConsensusMember() != nil
	if member {
		if err := s.keepClusterKeyLocally(true); err != nil {
			return err
		}
	}
	if !member {
		if s.hasEtcdData() {
			// A former member: its etcd data belongs to a member ID the
			// cluster removed. Kept (never deleted) but moved aside, so
			// that the role given again starts a fresh learner instead of
			// crash-looping on the removed member's log.
			to, err := s.retireEtcdData()
			if err != nil {
				return fmt.Errorf("moving the former member's etcd data aside: %w", err)
			}
			log.Warn("no longer a consensus member: etcd data moved aside", "to", to)
		}
		log.Info("not a consensus member: no local etcd or curator")
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		return s.watchMembership(ctx, rw, false)
	}
	jc, err := joinCluster(roles.GetConsensusMember(), nd.nodeID)
	if err != nil {
		return err
	}
	if jc == nil && !s.hasEtcdData() {
		// Starting etcd now would bootstrap a new, separate cluster.
		log.Error("consensus_member role carries no join data and this node has no etcd data: not starting etcd until the role changes")
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		for {
			next, err := rw.Get(ctx, nonNilRoles)
			if err != nil {
				return err
			}
			if !proto.Equal(next.GetConsensusMember(), roles.GetConsensusMember()) {
				return errMembershipChanged
			}
		}
	}
	if jc != nil {
		log.Info("consensus member: starting etcd and curator", "join_peers", len(jc.ExistingNodes))
	} else {
		log.Info("consensus member: starting etcd and curator")
	}
	var curators activity
	cons, err := s.startConsensus(ctx, creds.PrivateKey, nd.nodeID, jc, &curators)
	if err != nil {
		return err
	}
	if err := s.startCurator(ctx, creds, cons, &curators); err != nil {
		return err
	}
	s.ControlPlane.Set(&ControlPlane{Running: true, Consensus: cons})
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	return s.watchMembership(ctx, rw, true)
}

// keepClusterKeyLocally tells enrolment whether this node must be able to
// open its data volume without the cluster: a consensus member must, or a
// cluster whose members all reboot could never start again (each would
// wait for a curator that needs the others). Kept before etcd starts, so a
// member never runs without it; dropped only when the curator's roles say
// so (setRoles), never on a guess from local files.
func (s *Service) keepClusterKeyLocally(member bool) error {
	if s.LocalClusterKey == nil {
		return nil
	}
	if err := s.LocalClusterKey(member); err != nil {
		return fmt.Errorf("sealing the cluster unlock key locally: %w", err)
	}
	return nil
}

// bootstrap creates a new cluster: etcd from nothing, the curator's
// initial state, this node's credentials saved to disk; then it runs the
// control plane like on any consensus member.
func (s *Service) bootstrap(ctx context.Context, nd *nodeData) error {
	log := supervisor.Logger(ctx)
	bd := nd.bootstrap
	log.Info("bootstrapping cluster", "node", nd.nodeID)
	var curators activity
	cons, err := s.startConsensus(ctx, bd.NodeKey, nd.nodeID, nil, &curators)
	if err != nil {
		return err
	}
	w := cons.Watch()
	defer w.Close()
	st, err := w.Get(ctx, consensus.FilterRunning)
	if err != nil {
		return err
	}
	if _, err := s.waitAddresses(ctx); err != nil {
		return err
	}
	log.Info("consensus running: writing the initial cluster state")
	creds, err := bootstrapCluster(ctx, st, bd, s.status())
	if err != nil {
		return err
	}
	// Roles first: saved credentials make the next boot a restart, which
	// must find the consensus_member role to start etcd.
	roles := bootstrapRoles(bd)
	if err := s.saveRoles(roles); err != nil {
		return fmt.Errorf("saving roles: %w", err)
	}
	dir := s.StorageRoot.Data.Node.Credentials.Path()
	if err := creds.Save(dir); err != nil {
		return fmt.Errorf("saving node credentials: %w", err)
	}
	// The owner compares this with what plinthctl takeownership prints
	// (or passes it as -ca-fingerprint): the console is the channel that
	// needs no trust in the network.
	log.Info("cluster bootstrapped: node certificate issued and saved", "credentials", dir, "ca-sha256", pki.Fingerprint(creds.CA))
	s.Roles.Set(roles)
	s.Credentials.Set(creds)
	if err := s.startCurator(ctx, creds, cons, &curators); err != nil {
		return err
	}
	s.ControlPlane.Set(&ControlPlane{Running: true, Consensus: cons})
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	rw := s.Roles.Watch()
	defer rw.Close()
	return s.watchMembership(ctx, rw, true)
}

// hasEtcdData reports whether the local etcd data directory has anything
// in it (a member that ran before).
func (s *Service) hasEtcdData() bool {
	entries, err := os.ReadDir(s.StorageRoot.Data.Etcd.Data.Path())
	return err == nil && len(entries) > 0
}

// retireEtcdData renames the etcd data and peer PKI directories to
// <name>.removed-<unix time> next to them and recreates them empty.
func (s *Service) retireEtcdData() (string, error) {
	suffix := fmt.Sprintf(".removed-%d", time.Now().Unix())
	var moved string
	for _, d := range []string{s.StorageRoot.Data.Etcd.Data.Path(), s.StorageRoot.Data.Etcd.PeerPKI.Path()} {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			continue
		}
		if err := os.Rename(d, d+suffix); err != nil {
			return "", err
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", err
		}
		if moved == "" {
			moved = d + suffix
		}
	}
	return moved, nil
}

// watchMembership returns errMembershipChanged once the roles stop (or
// start) making this node a consensus member.
func (s *Service) watchMembership(ctx context.Context, rw event.Watcher[*clusterpb.NodeRoles], member bool) error {
	for {
		roles, err := rw.Get(ctx, nonNilRoles)
		if err != nil {
			return err
		}
		if now := roles.GetConsensusMember() != nil; now != member {
			if now {
				supervisor.Logger(ctx).Info("consensus_member role added: starting etcd and curator")
			} else {
				supervisor.Logger(ctx).Info("consensus_member role removed: stopping etcd and curator")
			}
			return errMembershipChanged
		}
	}
}

// startConsensus starts the local etcd member as a child runnable. When
// the control plane stops, etcd stops only once the curators counted in
// users have returned, so they can still give up their leadership lease
// instead of retrying against a closed client.
func (s *Service) startConsensus(ctx context.Context, key ed25519.PrivateKey, nodeID string, jc *consensus.JoinCluster, users *activity) (*consensus.Service, error) {
	root := s.StorageRoot
	if err := localstorage.Create(&root.Data.Etcd, 0o700); err != nil {
		return nil, err
	}
	if err := localstorage.Create(&root.Ephemeral.Consensus, 0o700); err != nil {
		return nil, err
	}
	// Members advertise https://<node ID>:7834: this node's own name must
	// resolve before etcd starts.
	if err := s.refreshHosts(nodeID); err != nil {
		supervisor.Logger(ctx).Warn("writing hosts file", "err", err)
	}
	cfg := consensus.Config{
		Data:           &root.Data.Etcd,
		Ephemeral:      &root.Ephemeral.Consensus,
		JoinCluster:    jc,
		NodeID:         nodeID,
		NodePrivateKey: key,
	}
	if s.knobs != nil {
		cfg.Tuning = s.knobs.consensusTuning
	}
	cons := consensus.New(cfg)
	run := func(ctx context.Context) error {
		inner, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-ctx.Done():
				users.waitIdle(consensusStopWait)
			case <-done:
			}
			cancel()
		}()
		return cons.Run(inner)
	}
	if err := supervisor.Run(ctx, "consensus", run); err != nil {
		return nil, err
	}
	return cons, nil
}

// consensusStopWait bounds how long etcd waits for its curator to stop.
const consensusStopWait = 5 * time.Second

// activity counts running users of something.
type activity struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0
}

func (a *activity) enter() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n == 0 {
		a.idle = make(chan struct{})
	}
	a.n++
}

func (a *activity) leave() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n--
	if a.n == 0 {
		close(a.idle)
	}
}

// waitIdle waits until nothing runs, at most d.
func (a *activity) waitIdle(d time.Duration) {
	a.mu.Lock()
	if a.n == 0 {
		a.mu.Unlock()
		return
	}
	ch := a.idle
	a.mu.Unlock()
	select {
	case <-ch:
	case <-time.After(d):
	}
}

// joinCluster converts the ConsensusMember role into what etcd needs to
// join. A role without certificates (the bootstrap node's) gives nil:
// such a member always has its etcd data on disk.
func joinCluster(cm *clusterpb.NodeRoles_ConsensusMember, self string) (*consensus.JoinCluster, error) {
	if cm == nil || len(cm.GetCaCertificate()) == 0 {
		return nil, nil
	}
	ca, err := x509.ParseCertificate(cm.GetCaCertificate())
	if err != nil {
		return nil, fmt.Errorf("consensus_member role: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(cm.GetNodeCertificate())
	if err != nil {
		return nil, fmt.Errorf("consensus_member role: node certificate: %w", err)
	}
	jc := &consensus.JoinCluster{CACertificate: ca, NodeCertificate: cert}
	if len(cm.GetInitialCrl()) > 0 {
		if jc.InitialCRL, err = pki.ParseCRL(cm.GetInitialCrl(), ca); err != nil {
			return nil, fmt.Errorf("consensus_member role: %w", err)
		}
	}
	for _, p := range cm.GetPeers() {
		// The list includes this node; etcd gets itself from its own config.
		if p.GetName() == self {
			continue
		}
		jc.ExistingNodes = append(jc.ExistingNodes, consensus.ExistingNode{Name: p.GetName(), URL: p.GetUrl()})
	}
	if len(jc.ExistingNodes) == 0 {
		return nil, errors.New("consensus_member role names no other member to join")
	}
	return jc, nil
}
