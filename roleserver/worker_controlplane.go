package roleserver

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/localstorage"
)

// errMembershipChanged makes the supervisor restart the controlplane
// runnable, which stops its etcd and curator children and starts them
// again (or not) for the new roles.
var errMembershipChanged = fmt.Errorf("consensus_member role changed: %w", supervisor.ErrRestart)

// workerControlPlane runs etcd and the curator while the node's roles
// make it a consensus member, and bootstraps the cluster when told to. A
// change of the consensus_member role restarts it (errMembershipChanged).
//
// It consumes the node data, the credentials and the roles (and the
// node's addresses and status when it bootstraps). It produces the
// control plane (ControlPlane: running, with the local consensus member)
// and its child runnables consensus and curator, the hosts file before
// etcd starts, and the request that a consensus member keeps the cluster
// unlock key sealed locally (clusterKey: answered before etcd starts); on
// bootstrap also the node's first credentials and roles, saved to
// /data/node.
type workerControlPlane struct {
	// root holds etcd's data and, after a bootstrap, the credentials.
	root *localstorage.Root
	// inputs
	node        *memory.Value[*nodeData]
	credentials *memory.Value[*identity.Credentials] // also an output on bootstrap
	roles       *memory.Value[*clusterpb.NodeRoles]  // also an output on bootstrap
	// addresses waits for the node's addresses; status is the node's
	// status (the bootstrap node's first one), given the supervisor's
	// runnables.
	addresses func(ctx context.Context) ([]string, error)
	status    func([]supervisor.Status) *clusterpb.NodeStatus
	// consensusTuning and curatorSettings are the settings of the local
	// etcd member and curator.
	consensusTuning consensus.Tuning
	curatorSettings curatorSettings

	// outputs
	controlPlane *memory.Value[*ControlPlane]
	// rolesFile saves the bootstrap node's roles; hosts is written before
	// etcd starts (it names the etcd peers).
	rolesFile *rolesFile
	hosts     *hostsFile
	// clusterKey asks enrolment to keep the cluster unlock key sealed
	// locally, and waits for the answer.
	clusterKey *clusterKeyRequests
}

func (w *workerControlPlane) run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	defer w.controlPlane.Set(&ControlPlane{})
	nd, err := wait(ctx, w.node)
	if err != nil {
		return err
	}
	if nd.bootstrap != nil && get(w.credentials) == nil {
		return w.bootstrap(ctx, nd)
	}
	creds, err := wait(ctx, w.credentials)
	if err != nil {
		return err
	}
	rw := w.roles.Watch()
	defer rw.Close()
	roles, err := rw.Get(ctx, nonNilRoles)
	if err != nil {
		return err
	}
	member := roles.GetConsensusMember() != nil
	if member {
		if err := w.clusterKey.keep(ctx); err != nil {
			return err
		}
	}
	if !member {
		if hasEtcdData(w.root) || hasRetiredEtcdData(w.root) {
			// A former member: its etcd data belongs to a member ID the
			// cluster removed (the curator removes the member before it
			// clears the role: the node's word never does, loadRoles).
			// It holds every key of the cluster (the CA keys, every
			// node's cluster unlock key), which a node that is no member
			// must not keep: erased, so that neither the node nor whoever
			// takes its disk with its TPM reads them, and so that the role
			// given again starts a fresh learner.
			n, err := eraseEtcdData(w.root)
			if err != nil {
				return fmt.Errorf("erasing the former member's etcd data: %w", err)
			}
			log.Warn("no longer a consensus member: etcd data erased", "bytes", n)
		}
		log.Info("not a consensus member: no local etcd or curator")
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		return watchMembership(ctx, rw, false)
	}
	jc, err := joinCluster(roles.GetConsensusMember(), nd.nodeID)
	if err != nil {
		return err
	}
	if jc == nil && !hasEtcdData(w.root) {
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
	cons, err := w.startConsensus(ctx, creds.PrivateKey, nd.nodeID, jc, &curators)
	if err != nil {
		return err
	}
	if err := startCurator(ctx, w.curatorSettings, creds, cons, &curators); err != nil {
		return err
	}
	w.controlPlane.Set(&ControlPlane{Running: true, Consensus: cons})
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	return watchMembership(ctx, rw, true)
}

// bootstrap creates a new cluster: etcd from nothing, the curator's
// initial state, this node's credentials saved to disk; then it runs the
// control plane like on any consensus member.
func (w *workerControlPlane) bootstrap(ctx context.Context, nd *nodeData) error {
	log := supervisor.Logger(ctx)
	bd := nd.bootstrap
	log.Info("bootstrapping cluster", "node", nd.nodeID)
	var curators activity
	cons, err := w.startConsensus(ctx, bd.NodeKey, nd.nodeID, nil, &curators)
	if err != nil {
		return err
	}
	cw := cons.Watch()
	defer cw.Close()
	st, err := cw.Get(ctx, consensus.FilterRunning)
	if err != nil {
		return err
	}
	if _, err := w.addresses(ctx); err != nil {
		return err
	}
	log.Info("consensus running: writing the initial cluster state")
	creds, err := bootstrapCluster(ctx, st, bd, w.status(supervisor.Snapshot(ctx)))
	if err != nil {
		return err
	}
	// Roles first: saved credentials make the next boot a restart, which
	// must find the consensus_member role to start etcd.
	roles := bootstrapRoles(bd)
	if err := w.rolesFile.save(roles); err != nil {
		return fmt.Errorf("saving roles: %w", err)
	}
	dir := w.root.Data.Node.Credentials.Path()
	if err := creds.Save(dir); err != nil {
		return fmt.Errorf("saving node credentials: %w", err)
	}
	// The owner compares this with what plinthctl cluster takeownership
	// prints (or passes it as --ca-fingerprint): the console is the
	// channel that needs no trust in the network.
	log.Info("cluster bootstrapped: node certificate issued and saved", "credentials", dir, "ca-sha256", pki.Fingerprint(creds.CA))
	w.roles.Set(roles)
	w.credentials.Set(creds)
	if err := startCurator(ctx, w.curatorSettings, creds, cons, &curators); err != nil {
		return err
	}
	w.controlPlane.Set(&ControlPlane{Running: true, Consensus: cons})
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	rw := w.roles.Watch()
	defer rw.Close()
	return watchMembership(ctx, rw, true)
}

// hasEtcdData reports whether the local etcd data directory has anything
// in it (a member that ran before).
func hasEtcdData(root *localstorage.Root) bool {
	entries, err := os.ReadDir(root.Data.Etcd.Data.Path())
	return err == nil && len(entries) > 0
}

// eraseEtcdData erases the etcd data and peer PKI directories: each is
// renamed to <name>.removed-<unix time> and recreated empty first (so
// that a crash halfway leaves no half store where etcd looks), then every
// file in it is overwritten with zeros, synced and removed, as is every
// such directory an earlier erasure (or an earlier version, which kept
// them) left. It returns how many bytes were overwritten. Zeros and not
// just an unlink: the filesystem would keep the blocks until reused, and
// the volume key still opens them.
func eraseEtcdData(root *localstorage.Root) (int64, error) {
	suffix := fmt.Sprintf(".removed-%d", time.Now().Unix())
	for _, d := range []string{root.Data.Etcd.Data.Path(), root.Data.Etcd.PeerPKI.Path()} {
		if _, err := os.Stat(d); os.IsNotExist(err) {
			continue
		}
		if err := os.Rename(d, d+suffix); err != nil {
			return 0, err
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return 0, err
		}
	}
	var total int64
	for _, d := range retiredEtcdData(root) {
		n, err := zeroAndRemove(d)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// retiredEtcdData are the renamed etcd directories eraseEtcdData (or an
// earlier version) left.
func retiredEtcdData(root *localstorage.Root) []string {
	var out []string
	for _, d := range []string{root.Data.Etcd.Data.Path(), root.Data.Etcd.PeerPKI.Path()} {
		m, _ := filepath.Glob(d + ".removed-*")
		out = append(out, m...)
	}
	return out
}

func hasRetiredEtcdData(root *localstorage.Root) bool { return len(retiredEtcdData(root)) > 0 }

// zeroAndRemove overwrites every regular file below dir with zeros,
// syncs it, and removes dir.
func zeroAndRemove(dir string) (int64, error) {
	var total int64
	zeros := make([]byte, 1<<20)
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		for left := st.Size(); left > 0; {
			k, err := f.Write(zeros[:min(left, int64(len(zeros)))])
			if err != nil {
				return err
			}
			left -= int64(k)
			total += int64(k)
		}
		return f.Sync()
	})
	if err != nil {
		return total, err
	}
	return total, os.RemoveAll(dir)
}

// watchMembership returns errMembershipChanged once the roles stop (or
// start) making this node a consensus member.
func watchMembership(ctx context.Context, rw event.Watcher[*clusterpb.NodeRoles], member bool) error {
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
func (w *workerControlPlane) startConsensus(ctx context.Context, key ed25519.PrivateKey, nodeID string, jc *consensus.JoinCluster, users *activity) (*consensus.Service, error) {
	root := w.root
	if err := localstorage.Create(&root.Data.Etcd, 0o700); err != nil {
		return nil, err
	}
	if err := localstorage.Create(&root.Ephemeral.Consensus, 0o700); err != nil {
		return nil, err
	}
	// Members advertise https://<node ID>:7834: this node's own name must
	// resolve before etcd starts.
	if err := w.hosts.refresh(nodeID); err != nil {
		supervisor.Logger(ctx).Warn("saving the node map", "err", err)
	}
	cfg := consensus.Config{
		Data:           &root.Data.Etcd,
		Ephemeral:      &root.Ephemeral.Consensus,
		JoinCluster:    jc,
		NodeID:         nodeID,
		NodePrivateKey: key,
		Tuning:         w.consensusTuning,
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
