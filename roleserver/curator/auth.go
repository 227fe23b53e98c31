package curator

import (
	"context"
	"crypto/ed25519"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

// checkCaller is the curator's rpc.CallerCheck, run by the one
// authorization interceptor on every call after the permission check: a
// node caller must be on record for exactly the key it presented (not
// only the ID derived from it), UP, and never decommissioned, for reads
// too. Handlers get the caller from rpc.PeerFrom and never decide again
// who may call them.
func (s *Service) checkCaller(ctx context.Context, p *identity.Peer) error {
	if p.Kind != identity.KindNode {
		return nil
	}
	kv, _, err := s.backend()
	if err != nil {
		return err
	}
	n, _, err := getNode(ctx, kv, p.NodeID)
	if err != nil {
		if isStatus(err) {
			return err
		}
		return etcdErr("reading the caller's record", err)
	}
	switch {
	case n == nil:
		return status.Errorf(codes.PermissionDenied, "caller %s has no node record", p.NodeID)
	case !p.PublicKey.Equal(ed25519.PublicKey(n.PublicKey)):
		return status.Errorf(codes.Unauthenticated, "caller %s presented a key other than the one on record", p.NodeID)
	case n.State == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED:
		return rpc.Error(codes.PermissionDenied, clusterpb.ErrorReason_NODE_DECOMMISSIONED, "caller %s is decommissioned", p.NodeID)
	case n.State != clusterpb.NodeState_NODE_STATE_UP:
		return status.Errorf(codes.FailedPrecondition, "caller %s is %s, not UP", p.NodeID, n.State)
	}
	return nil
}

// callerRecord is the record of the node calling (checkCaller already
// made sure it is UP and for the caller's key).
func callerRecord(ctx context.Context, kv clientv3.KV, p *identity.Peer) (*clusterpb.Node, error) {
	n, _, err := getNode(ctx, kv, p.NodeID)
	if err != nil {
		if isStatus(err) {
			return nil, err
		}
		return nil, etcdErr("reading the caller's record", err)
	}
	if n == nil || n.State != clusterpb.NodeState_NODE_STATE_UP {
		return nil, status.Errorf(codes.FailedPrecondition, "caller %s is not UP", p.NodeID)
	}
	return n, nil
}
