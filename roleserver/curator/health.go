package curator

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"plinth.dev/plinth/api/clusterpb"
)

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

// healthTick is how often a Watch checks the health of the nodes it
// sent (health changes with heartbeats and time, not with records).
func (s *Service) healthTick() time.Duration {
	return min(HeartbeatInterval, s.cfg.HeartbeatTimeout/4)
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
