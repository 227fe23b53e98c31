package curator

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/releasekeys"
	"plinth.dev/plinth/roleserver/consensus/client"
)

// The cluster policy (clusterpb.ClusterConfiguration at keyConfiguration)
// is set at bootstrap and changed by the owner only:
//
//	UpdateClusterPolicy          Kubernetes admission (Pod Security level,
//	                             allowed host paths, external IPs), the
//	                             next signed release key set
//	RevokeKubernetesCredentials  kubernetes_owner_epoch + 1
//
// Each change is a compare-and-swap on the record, so two owners' tools
// cannot lose one another's change. The controllers follow the record
// (WatchConfiguration): a new admission policy restarts their control
// plane, a new epoch rebinds cluster-admin to its group at once.

// UpdateClusterPolicy replaces the Kubernetes policy (if given) and
// appends the next version of the release key set (if given). The
// curator checks that the statement extends the chain as every node
// will (releasekeys.CheckNext), so that a statement no node would take
// is refused here, with the reason; it cannot make one itself.
func (m managementServer) UpdateClusterPolicy(ctx context.Context, req *clusterpb.UpdateClusterPolicyRequest) (*clusterpb.UpdateClusterPolicyResponse, error) {
	if k := req.GetKubernetes(); k != nil {
		if err := k.Check(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "kubernetes: %v", err)
		}
	}
	cfg, err := m.updateConfiguration(ctx, func(cfg *clusterpb.ClusterConfiguration) error {
		if k := req.GetKubernetes(); k != nil {
			cfg.Kubernetes = k
		}
		if next := req.GetReleaseKeys(); next != nil {
			chain := cfg.ReleaseKeyChainSigned()
			keys, err := releasekeys.CheckNext(chain, next.Signed())
			if err != nil {
				return status.Errorf(codes.FailedPrecondition, "the release key set is not the next of the cluster's %d: %v", len(chain), err)
			}
			cfg.ReleaseKeyChain = append(cfg.ReleaseKeyChain, next)
			cfg.ReleaseKeys = keys
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &clusterpb.UpdateClusterPolicyResponse{Configuration: cfg}, nil
}

// RevokeKubernetesCredentials moves the owner's Kubernetes credentials
// to a new epoch.
func (m managementServer) RevokeKubernetesCredentials(ctx context.Context, _ *clusterpb.RevokeKubernetesCredentialsRequest) (*clusterpb.RevokeKubernetesCredentialsResponse, error) {
	cfg, err := m.updateConfiguration(ctx, func(cfg *clusterpb.ClusterConfiguration) error {
		cfg.KubernetesOwnerEpoch++
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &clusterpb.RevokeKubernetesCredentialsResponse{Epoch: cfg.GetKubernetesOwnerEpoch()}, nil
}

// updateConfiguration applies change to the stored configuration with a
// compare-and-swap, again on a concurrent change.
func (m managementServer) updateConfiguration(ctx context.Context, change func(*clusterpb.ClusterConfiguration) error) (*clusterpb.ClusterConfiguration, error) {
	kv, _, err := m.backend()
	if err != nil {
		return nil, err
	}
	for {
		raw, rev, err := getValue(ctx, kv, keyConfiguration)
		if err != nil {
			return nil, etcdErr("reading the cluster configuration", err)
		}
		if rev == 0 {
			return nil, status.Error(codes.FailedPrecondition, "no cluster configuration: cluster not bootstrapped")
		}
		cfg := &clusterpb.ClusterConfiguration{}
		if err := proto.Unmarshal(raw, cfg); err != nil {
			return nil, internalErr("corrupt cluster configuration", err)
		}
		if err := change(cfg); err != nil {
			return nil, err
		}
		b, err := proto.Marshal(cfg)
		if err != nil {
			return nil, internalErr("encoding the cluster configuration", err)
		}
		resp, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(keyConfiguration), "=", rev)).
			Then(clientv3.OpPut(keyConfiguration, string(b))).Commit()
		if err != nil {
			return nil, etcdErr("writing the cluster configuration", err)
		}
		if resp.Succeeded {
			return cfg, nil
		}
	}
}

// WatchConfiguration calls set with the cluster configuration in kv (the
// curator's namespace of a running consensus member), then again with
// every new version, until ctx ends or the watch fails. A consumer on a
// controller node (the Kubernetes control plane) follows the policy with
// it.
func WatchConfiguration(ctx context.Context, kv client.Namespaced, set func(*clusterpb.ClusterConfiguration)) error {
	raw, _, rev, err := getValueAt(ctx, kv, keyConfiguration)
	if err != nil {
		return etcdErr("reading the cluster configuration", err)
	}
	cfg := &clusterpb.ClusterConfiguration{}
	if err := proto.Unmarshal(raw, cfg); err != nil {
		return internalErr("corrupt cluster configuration", err)
	}
	set(cfg)
	err = client.FollowKey(ctx, kv, kv, keyConfiguration, rev, raw != nil, func(v *mvccpb.KeyValue) error {
		cfg := &clusterpb.ClusterConfiguration{}
		if v != nil && proto.Unmarshal(v.Value, cfg) == nil {
			set(cfg)
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		return etcdErr("watching the cluster configuration", err)
	}
	return ctx.Err()
}

// WatchClusterPolicy streams the cluster configuration to a node: the
// current one, then every new version (see curator.proto). Like Watch it
// is the leader's, and ends with its leadership.
func (c curatorServer) WatchClusterPolicy(_ *clusterpb.WatchClusterPolicyRequest, srv clusterpb.Curator_WatchClusterPolicyServer) error {
	t, err := c.leaderTerm()
	if err != nil {
		return err
	}
	kv, _, err := c.backend()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(srv.Context())
	defer cancel()
	stop := context.AfterFunc(t.ctx, cancel)
	defer stop()
	var sendErr error
	err = WatchConfiguration(ctx, kv, func(cfg *clusterpb.ClusterConfiguration) {
		if sendErr == nil {
			if sendErr = srv.Send(&clusterpb.WatchClusterPolicyEvent{Configuration: cfg}); sendErr != nil {
				cancel()
			}
		}
	})
	switch {
	case sendErr != nil:
		return sendErr
	case t.ctx.Err() != nil:
		return errNotLeader("not the leader any more")
	case srv.Context().Err() != nil:
		return status.FromContextError(srv.Context().Err()).Err()
	}
	return err
}
