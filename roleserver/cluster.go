package roleserver

// Everything that depends on roleserver/curator is in this file.

import (
	"context"
	"crypto/ed25519"
	"fmt"

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

// startCurator runs this node's curator as a child runnable (it installs
// the authorization interceptor of roleserver/rpc itself).
func (s *Service) startCurator(ctx context.Context, creds *identity.Credentials, cons consensus.ServiceHandle, running *activity) error {
	cfg := curator.Config{
		Credentials:   creds,
		Consensus:     cons,
		ListenAddress: s.listenAddress(s.curatorPort()),
		AdvertisePort: s.curatorPort(),
	}
	if k := s.knobs; k != nil {
		cfg.LeaderTTL, cfg.HeartbeatTimeout = k.curatorLeaderTTL, k.curatorHeartbeatTimeout
		cfg.AddNodeOptions = k.addNodeOptions
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
