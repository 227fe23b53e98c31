package curator

import (
	"bytes"
	"context"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/consensus/client"
)

// The cluster policy (clusterpb.ClusterConfiguration at keyConfiguration)
// is set at bootstrap and changed by the owner only:
//
//	UpdateClusterPolicy          Kubernetes admission (Pod Security level,
//	                             allowed host paths), release keys
//	RevokeKubernetesCredentials  kubernetes_owner_epoch + 1
//
// Each change is a compare-and-swap on the record, so two owners' tools
// cannot lose one another's change. The controllers follow the record
// (WatchConfiguration): a new admission policy restarts their control
// plane, a new epoch rebinds cluster-admin to its group at once.

// UpdateClusterPolicy replaces the Kubernetes policy (if given) and adds
// and removes release keys.
func (m managementServer) UpdateClusterPolicy(ctx context.Context, req *clusterpb.UpdateClusterPolicyRequest) (*clusterpb.UpdateClusterPolicyResponse, error) {
	if k := req.GetKubernetes(); k != nil {
		if err := k.Check(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "kubernetes: %v", err)
		}
	}
	for _, k := range append(slices.Clone(req.GetAddReleaseKeys()), req.GetRemoveReleaseKeys()...) {
		if err := clusterpb.CheckReleaseKey(k); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	cfg, err := m.updateConfiguration(ctx, func(cfg *clusterpb.ClusterConfiguration) error {
		if k := req.GetKubernetes(); k != nil {
			cfg.Kubernetes = k
		}
		for _, k := range req.GetAddReleaseKeys() {
			if !slices.ContainsFunc(cfg.ReleaseKeys, func(o []byte) bool { return bytes.Equal(o, k) }) {
				cfg.ReleaseKeys = append(cfg.ReleaseKeys, k)
			}
		}
		had := len(cfg.ReleaseKeys)
		cfg.ReleaseKeys = slices.DeleteFunc(cfg.ReleaseKeys, func(o []byte) bool {
			return slices.ContainsFunc(req.GetRemoveReleaseKeys(), func(k []byte) bool { return bytes.Equal(o, k) })
		})
		if had > 0 && len(cfg.ReleaseKeys) == 0 {
			return status.Error(codes.FailedPrecondition, "refusing to remove the last release key: no node could install an update again (add the new key first)")
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
