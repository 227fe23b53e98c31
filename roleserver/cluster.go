package roleserver

// Everything that depends on roleserver/curator is in this file.

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/curator"
	"plinth.dev/plinth/roleserver/identity"
)

// heartbeatInterval is how often the heartbeat worker sends.
const heartbeatInterval = curator.HeartbeatInterval

// bootstrapCluster writes the initial cluster state into the running
// consensus member and returns this node's credentials.
func bootstrapCluster(ctx context.Context, st *consensus.Status, bd *BootstrapData, status *clusterpb.NodeStatus) (*identity.Credentials, error) {
	cl, err := st.CuratorClient()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ca, cert, err := curator.Bootstrap(ctx, cl, curator.BootstrapRequest{
		NodePublicKey:        bd.NodeKey.Public().(ed25519.PublicKey),
		JoinPublicKey:        bd.JoinKey,
		OwnerPublicKey:       bd.OwnerKey,
		Configuration:        bd.Configuration,
		TPMUsage:             bd.TPMUsage,
		Status:               status,
		KubernetesController: bd.KubernetesController,
		KubernetesWorker:     bd.KubernetesWorker,
	})
	if err != nil {
		return nil, fmt.Errorf("bootstrapping the curator: %w", err)
	}
	creds, err := identity.NewCredentials(bd.NodeKey, cert.Raw, ca.Raw)
	if err != nil {
		return nil, fmt.Errorf("bootstrap returned unusable credentials: %w", err)
	}
	return creds, nil
}

// curatorSettings are the local curator's settings from the Role
// Server's Config.
type curatorSettings struct {
	// listen is the address the curator serves on; port the one it
	// advertises.
	listen string
	port   int
	// leaderTTL, heartbeatTimeout and addNodeOptions are test settings
	// (zero: the curator's defaults).
	leaderTTL, heartbeatTimeout time.Duration
	addNodeOptions              func(nodeID string) []*consensus.AddNodeOption
}

func (c *Config) curatorSettings() curatorSettings {
	set := curatorSettings{listen: c.listenAddress(c.curatorPort()), port: c.curatorPort()}
	if k := c.knobs; k != nil {
		set.leaderTTL, set.heartbeatTimeout = k.curatorLeaderTTL, k.curatorHeartbeatTimeout
		set.addNodeOptions = k.addNodeOptions
	}
	return set
}

// startCurator runs this node's curator as a child runnable (it installs
// the authorization interceptor of roleserver/rpc itself).
func startCurator(ctx context.Context, set curatorSettings, creds *identity.Credentials, cons consensus.ServiceHandle, running *activity) error {
	cfg := curator.Config{
		Credentials:      creds,
		Consensus:        cons,
		ListenAddress:    set.listen,
		AdvertisePort:    set.port,
		LeaderTTL:        set.leaderTTL,
		HeartbeatTimeout: set.heartbeatTimeout,
		AddNodeOptions:   set.addNodeOptions,
	}
	cur := curator.New(cfg)
	return supervisor.Run(ctx, "curator", func(ctx context.Context) error {
		running.enter()
		defer running.leave()
		return cur.Run(ctx)
	})
}

// bootstrapRoles are the roles curator.Bootstrap gives the first node.
func bootstrapRoles(bd *BootstrapData) *clusterpb.NodeRoles {
	return curator.FirstNodeRoles(bd.KubernetesController, bd.KubernetesWorker)
}
