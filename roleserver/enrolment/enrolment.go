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
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

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
	RoleServer   *roleserver.Service
	Version      string
	BootTime     time.Time

	// curatorPort replaces layout.CuratorPort in tests.
	curatorPort int
	// releaseKeyFile replaces layout.ReleaseKeyPath in tests.
	releaseKeyFile string

	// What enrolment learnt, for KeepClusterKeyLocally.
	mu         sync.Mutex
	joined     *joinState
	clusterKey []byte
}

// remember keeps the join state and cluster unlock key of a registered
// node for KeepClusterKeyLocally.
func (c *Config) remember(js *joinState, cuk []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.joined, c.clusterKey = js, cuk
}

// UpdateDirectory replaces the curator directory in the sealed join state
// (a no-op unless this node registered), so that after a reboot it looks
// for the cluster where the curators are now, not where they were when it
// registered.
func (c *Config) UpdateDirectory(dir *clusterpb.ClusterDirectory) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.joined == nil || proto.Equal(sortedDirectory(c.joined.Directory), sortedDirectory(dir)) {
		return nil
	}
	next := *c.joined
	next.Directory = dir
	if err := c.reseal(&next); err != nil {
		return err
	}
	if c.Disk.Log != nil {
		c.Disk.Log.Info("cluster directory saved for the next boot", "curators", len(dir.GetNodes()))
	}
	return nil
}

func sortedDirectory(d *clusterpb.ClusterDirectory) *clusterpb.ClusterDirectory {
	if d == nil {
		return &clusterpb.ClusterDirectory{}
	}
	out := proto.Clone(d).(*clusterpb.ClusterDirectory)
	slices.SortFunc(out.Nodes, func(a, b *clusterpb.DirectoryNode) int { return strings.Compare(a.Id, b.Id) })
	return out
}

// reseal writes js as the header's join state and remembers it.
func (c *Config) reseal(js *joinState) error {
	blob, err := js.seal(c.Keys)
	if err != nil {
		return err
	}
	if err := storage.UpdateEnrolment(c.Disk.Disk, blob); err != nil {
		return err
	}
	c.joined = js
	return nil
}

// Reseal seals the join state in the data disk header again with Keys,
// which an A/B update changes to seal to the new slot's PCRs as well (and,
// once it is confirmed, to them alone). A no-op on a node that did not
// register (its header holds no join state).
func (c *Config) Reseal() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.joined == nil {
		return nil
	}
	return c.reseal(c.joined)
}

// KeepClusterKeyLocally adds the cluster unlock key to the sealed join
// state in the data disk header (keep) or removes it (!keep). A consensus
// member keeps it so that its volume opens without a curator: otherwise
// a cluster whose members all went down could never come back, each
// member waiting for a curator that needs the others. Still sealed in the
// TPM to this node's measured boot, so a stolen disk gains nothing. A
// no-op on the node that bootstrapped the cluster, whose volume key never
// involved the cluster.
func (c *Config) KeepClusterKeyLocally(keep bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.joined == nil || c.clusterKey == nil {
		return nil
	}
	if keep == (c.joined.ClusterUnlockKey != nil) {
		return nil
	}
	next := *c.joined
	next.ClusterUnlockKey = nil
	if keep {
		next.ClusterUnlockKey = c.clusterKey
	}
	if err := c.reseal(&next); err != nil {
		return err
	}
	if c.Disk.Log != nil {
		if keep {
			c.Disk.Log.Info("consensus member: cluster unlock key now sealed locally, so this node can start without the cluster")
		} else {
			c.Disk.Log.Info("no longer a consensus member: locally sealed cluster unlock key removed")
		}
	}
	return nil
}

// Run is the enrolment runnable. It returns nil (done) once the Role
// Server has its data; errors are retried by the supervisor.
func (c *Config) Run(ctx context.Context) error {
	l := supervisor.Logger(ctx)
	var err error
	switch {
	case c.Parameters.GetBootstrap() != nil:
		err = c.bootstrapOrRestart(ctx, l)
	case c.Parameters.GetRegister() != nil:
		err = c.registerOrJoin(ctx, l)
	default:
		return errors.New("node parameters say neither bootstrap nor register")
	}
	if err != nil {
		return err
	}
	supervisor.Signal(ctx, supervisor.SignalDone)
	return nil
}

// bootstrapOrRestart: the volume is open (init opened it).
func (c *Config) bootstrapOrRestart(ctx context.Context, l *slog.Logger) error {
	dir := c.Root.Data.Node.Credentials.Path()
	creds, err := identity.Load(dir)
	if err == nil {
		l.Info("node credentials found: rejoining the cluster as a consensus member", "node", creds.ID())
		c.RoleServer.ProvideJoinData(creds, nil)
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
	owner := ed25519.PublicKey(c.Parameters.GetBootstrap().GetOwnerPublicKey())
	_, join, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	policy := c.Parameters.GetBootstrap().GetInitialPolicy()
	releaseKeys, keySource, err := c.bootstrapReleaseKeys(policy.GetReleaseKeys())
	if err != nil {
		return err
	}
	l.Info("bootstrapping a new cluster", "node", identity.NodeID(key.Public().(ed25519.PublicKey)),
		"allow_nodes_without_tpm", policy.GetAllowNodesWithoutTpm(), "release_keys", len(releaseKeys), "release_keys_from", keySource)
	c.RoleServer.ProvideBootstrapData(roleserver.BootstrapData{
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
			ReleaseKeys: releaseKeys,
		},
		TPMUsage:             c.TPMUsage,
		KubernetesController: !c.Parameters.GetBootstrap().GetNoKubernetesController(),
		KubernetesWorker:     !c.Parameters.GetBootstrap().GetNoKubernetesWorker(),
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
