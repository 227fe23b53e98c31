package curator

import (
	"context"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/identity"
)

// caller classifies the caller and refuses kinds the method does not
// accept. The permission interceptor (roleserver/rpc) does the same
// from the .proto options; this is a second, cheap line of defence that
// also works without it.
func (s *Service) caller(ctx context.Context, method string, kinds ...identity.Kind) (*identity.Peer, error) {
	p, err := identity.PeerFromContext(ctx, s.cfg.Credentials.CA)
	if err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "%s: %v", method, err)
	}
	if !slices.Contains(kinds, p.Kind) {
		names := make([]string, len(kinds))
		for i, k := range kinds {
			names[i] = k.String()
		}
		return nil, status.Errorf(codes.PermissionDenied, "%s: caller is %s, only %s may call it",
			method, p.Kind, strings.Join(names, " or "))
	}
	if p.Kind == identity.KindNode {
		// Certificates from the cluster CA are not revoked; the record
		// is what locks a decommissioned node out, reads included.
		kv, _, err := s.backend()
		if err != nil {
			return nil, err
		}
		n, _, err := getNode(ctx, kv, p.NodeID)
		if err != nil {
			if isStatus(err) {
				return nil, err
			}
			return nil, etcdErr(method, err)
		}
		if n != nil && n.State == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
			return nil, status.Errorf(codes.PermissionDenied, "%s: caller %s is decommissioned", method, p.NodeID)
		}
	}
	return p, nil
}

// callerNode is the record of a KindNode caller, which must be UP: a
// decommissioned node keeps a certificate from the CA, but the cluster
// no longer talks to it.
func (s *Service) callerNode(ctx context.Context, kv clientv3.KV, method string, p *identity.Peer) (*clusterpb.Node, error) {
	n, _, err := getNode(ctx, kv, p.NodeID)
	if err != nil {
		if isStatus(err) {
			return nil, err
		}
		return nil, etcdErr(method, err)
	}
	switch {
	case n == nil:
		return nil, status.Errorf(codes.PermissionDenied, "%s: caller %s has no node record", method, p.NodeID)
	case n.State == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED:
		return nil, status.Errorf(codes.PermissionDenied, "%s: caller %s is decommissioned", method, p.NodeID)
	case n.State != clusterpb.NodeState_NODE_STATE_UP:
		return nil, status.Errorf(codes.FailedPrecondition, "%s: caller %s is %s, not UP", method, p.NodeID, n.State)
	}
	return n, nil
}

// heartbeatState is what the leader knows of one node's heartbeats in
// its current term.
type heartbeatState struct {
	seen    time.Time // last heartbeat received
	written time.Time // last time it was written to etcd
}

// heartbeatWriteInterval rate-limits heartbeat writes: at most one per
// HeartbeatInterval per node, more often only if a (test) timeout is so
// short that the stored time would otherwise go stale.
func (s *Service) heartbeatWriteInterval() time.Duration {
	return min(HeartbeatInterval, s.cfg.HeartbeatTimeout/3)
}

// health fills in a node's health and last heartbeat. stored is the
// heartbeat time in etcd (0: none), since when the current leader was
// elected (zero: no leader known).
func (s *Service) health(n *clusterpb.Node, stored int64, since time.Time, now time.Time) {
	n.Health, n.LastHeartbeatUnixNanos = clusterpb.NodeHealth_NODE_HEALTH_UNSPECIFIED, 0
	if n.State != clusterpb.NodeState_NODE_STATE_UP {
		return // only members heartbeat
	}
	hb := stored
	s.mu.Lock()
	leading := s.term != nil
	s.mu.Unlock()
	if leading {
		s.hbMu.Lock()
		if h := s.hb[n.Id]; h != nil && h.seen.UnixNano() > hb {
			hb = h.seen.UnixNano()
		}
		s.hbMu.Unlock()
	}
	if since.IsZero() {
		n.Health = clusterpb.NodeHealth_NODE_HEALTH_UNKNOWN
		return
	}
	if hb < since.UnixNano() {
		hb = 0 // from before this leader: "never since this leader was elected"
	}
	n.LastHeartbeatUnixNanos = hb
	switch {
	case hb != 0 && now.Sub(time.Unix(0, hb)) <= s.cfg.HeartbeatTimeout:
		n.Health = clusterpb.NodeHealth_NODE_HEALTH_HEALTHY
	case now.Sub(since) < s.cfg.HeartbeatTimeout:
		n.Health = clusterpb.NodeHealth_NODE_HEALTH_UNKNOWN
	default:
		n.Health = clusterpb.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT
	}
}

// leaderSince is when the current leader was elected (zero if unknown).
func (s *Service) leaderSince() time.Time {
	if li := s.currentLeader(); li != nil {
		return li.Since
	}
	return time.Time{}
}

// withHealth fills in health for a list of nodes.
func (s *Service) withHealth(ctx context.Context, kv clientv3.KV, nodes []*clusterpb.Node) error {
	hbs, err := storedHeartbeats(ctx, kv)
	if err != nil {
		return err
	}
	since, now := s.leaderSince(), time.Now()
	for _, n := range nodes {
		s.health(n, hbs[n.Id], since, now)
	}
	return nil
}

// withHealthOne fills in health for one node.
func (s *Service) withHealthOne(ctx context.Context, kv clientv3.KV, n *clusterpb.Node) error {
	v, _, err := getValue(ctx, kv, heartbeatKey(n.Id))
	if err != nil {
		return etcdErr("reading heartbeat", err)
	}
	s.health(n, parseNanos(v), s.leaderSince(), time.Now())
	return nil
}
