// Package enrolment decides how this node becomes part of a cluster and
// hands the result to the Role Server ("Cluster Enrolment" in the seed).
//
//	node parameters          data disk header          → what happens
//	────────────────────────────────────────────────────────────────────────
//	bootstrap                /data has credentials     restart as a member
//	bootstrap                /data has none            bootstrap a new cluster
//	register                 no header / not ready     register: ticket → NEW
//	                                                   → owner approves → commit
//	                                                   → credentials + cluster
//	                                                   unlock key → set up /data
//	register                 ready, enrolment blob     join: join key → cluster
//	                                                   unlock key → open /data
//
// The node that bootstraps the cluster keeps its volume key TPM-sealed
// only, so that a whole cluster can cold-start from it. A registered node
// mixes the cluster unlock key (held by the curator) into its volume key,
// so its disk and TPM together are still not enough: the cluster must
// agree (and refuses a decommissioned node). Such a node cannot read its
// node key before its volume is open, so it rejoins with a separate join
// key, sealed in the TPM together with the cluster CA and the curator
// directory, in the data disk header (storage.Header.Enrolment).
//
// A Service is built with the Role Server it feeds (New), and talks to it
// only through the Role Server's methods and event values:
//
//	                         Provide{Bootstrap,Register,Join}Data
//	enrolment (runnable) ──────────────────────────────────────────► Role Server
//	 ├── clusterkey  ◄── ClusterKey: keep the cluster unlock key (a member,  │
//	 │                   before etcd starts) or drop it ─────────────────────┤
//	 │               ──► Done(err): the Role Server waits for a keep's ────► │
//	 └── directory   ◄── Directory: the curators, as the cluster lists them ─┘
//
// Both children reseal the join state in the disk header when it changes,
// so that after a reboot a consensus member opens its volume without the
// cluster and every node looks for the curators where they are now. On
// the node that bootstrapped the cluster (no join state) they change
// nothing. Why values and not calls: the Role Server then needs nothing
// from enrolment, which exists only once the Role Server does, and the
// boot wires no callback between the two.
package enrolment

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/platform/atomicfile"
	"plinth.dev/plinth/platform/network"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/localstorage"
)

// Config is what enrolment needs from the boot.
type Config struct {
	Parameters *nodepb.Parameters
	Root       *localstorage.Root
	// Keys seal the join state (the TPM, or the development stand-in).
	Keys     storage.KeyProtector
	TPMUsage clusterpb.NodeTPMUsage
	// Disk opens the data volume of a registering node; enrolment fills
	// in ClusterUnlockKey and Enrolment. Unused with bootstrap parameters,
	// whose volume init opened before the network came up.
	Disk storage.Config
	// VolumeOpened runs once enrolment opened the data volume: it locks
	// the sealed keys and counts the boot, as init does for a bootstrap
	// node.
	VolumeOpened func(*storage.Result) error
	Network      *network.Service
	Version      string
	BootTime     time.Time

	// curatorPort replaces layout.CuratorPort in tests.
	curatorPort int
	// releaseKeyFile and releaseGenesisFile replace
	// layout.ReleaseKeyPath and layout.ReleaseGenesisPath in tests.
	releaseKeyFile, releaseGenesisFile string
}

// Service is enrolment: the runnable that makes the node part of its
// cluster, and the keeper of its sealed join state afterwards.
type Service struct {
	Config
	// rs is the Role Server it hands the node's identity to and whose
	// ClusterKey and Directory it follows.
	rs *roleserver.Service

	// What enrolment learnt (a registered node's): the sealed join state
	// and the cluster unlock key it may keep sealed locally.
	mu         sync.Mutex
	joined     *joinState
	clusterKey []byte
}

// New makes enrolment for the Role Server rs; nothing runs until Run.
func New(c Config, rs *roleserver.Service) *Service {
	return &Service{Config: c, rs: rs}
}

// Run is the enrolment runnable. Once the Role Server has its data it
// starts the children that follow the Role Server (see the package
// documentation) and is done; errors before that are retried by the
// supervisor.
func (s *Service) Run(ctx context.Context) error {
	l := supervisor.Logger(ctx)
	var err error
	switch {
	case s.Parameters.GetBootstrap() != nil:
		err = s.bootstrapOrRestart(ctx, l)
	case s.Parameters.GetRegister() != nil:
		err = s.registerOrJoin(ctx, l)
	default:
		return errors.New("node parameters say neither bootstrap nor register")
	}
	if err != nil {
		return err
	}
	for _, r := range []struct {
		name string
		run  supervisor.Runnable
	}{
		{"clusterkey", s.followClusterKey},
		{"directory", s.followDirectory},
	} {
		if err := supervisor.Run(ctx, r.name, r.run); err != nil {
			return err
		}
	}
	supervisor.Signal(ctx, supervisor.SignalDone)
	return nil
}

// bootstrapOrRestart: the volume is open (init opened it).
func (s *Service) bootstrapOrRestart(ctx context.Context, l *slog.Logger) error {
	dir := s.Root.Data.Node.Credentials.Path()
	creds, err := identity.Load(dir)
	if err == nil {
		l.Info("node credentials found: rejoining the cluster as a consensus member", "node", creds.ID())
		s.rs.ProvideJoinData(creds, nil)
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("node credentials in %s are unusable (nothing is overwritten): %w", dir, err)
	}
	// The node key is written before anything else, so a bootstrap cut
	// short resumes with the same identity (the curator's bootstrap is
	// idempotent for one node key) instead of founding a second cluster.
	key, err := loadOrCreateKey(filepath.Join(dir, "key.pem"))
	if err != nil {
		return err
	}
	owner := ed25519.PublicKey(s.Parameters.GetBootstrap().GetOwnerPublicKey())
	_, join, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	policy := s.Parameters.GetBootstrap().GetInitialPolicy()
	chain, releaseKeys, keySource, err := s.bootstrapReleaseKeys()
	if err != nil {
		return err
	}
	var releaseKeyChain []*clusterpb.SignedStatement
	for _, st := range chain {
		releaseKeyChain = append(releaseKeyChain, clusterpb.NewSignedStatement(st))
	}
	l.Info("bootstrapping a new cluster", "node", identity.NodeID(key.Public().(ed25519.PublicKey)),
		"allow_nodes_without_tpm", policy.GetAllowNodesWithoutTpm(), "release_keys", len(releaseKeys), "release_keys_from", keySource)
	s.rs.ProvideBootstrapData(roleserver.BootstrapData{
		NodeKey:  key,
		JoinKey:  join.Public().(ed25519.PublicKey),
		OwnerKey: owner,
		Configuration: &clusterpb.ClusterConfiguration{
			AllowNodesWithoutTpm:   policy.GetAllowNodesWithoutTpm(),
			MinimumStorageSecurity: clusterpb.StorageSecurity(policy.GetStorageSecurity()),
			Kubernetes: &clusterpb.KubernetesPolicy{
				PodSecurityLevel: policy.GetPodSecurityLevel(),
				AllowedHostPaths: policy.GetAllowedHostPaths(),
			},
			ReleaseKeys:     releaseKeys,
			ReleaseKeyChain: releaseKeyChain,
		},
		TPMUsage:             s.TPMUsage,
		KubernetesController: !s.Parameters.GetBootstrap().GetNoKubernetesController(),
		KubernetesWorker:     !s.Parameters.GetBootstrap().GetNoKubernetesWorker(),
	})
	return nil
}

func loadOrCreateKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		return pki.ParsePrivateKeyPEM(b)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	pem, err := pki.PrivateKeyPEM(key)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	return key, atomicfile.Write(path, pem, 0o600)
}
