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

// health fills in a node's health and last heartbeat. hb is its last
// heartbeat (Unix nanoseconds, 0: none), since when the current leader
// was elected (zero: no leader known).
func (s *Service) health(n *clusterpb.Node, hb int64, since time.Time, now time.Time) {
	n.Health, n.LastHeartbeatUnixNanos = clusterpb.NodeHealth_NODE_HEALTH_UNSPECIFIED, 0
	if n.State != clusterpb.NodeState_NODE_STATE_UP {
		return // only members heartbeat
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

// heartbeats is what health is computed from: the nodes' last
// heartbeats (Unix nanoseconds, by node ID) and since when the leader
// leads.
type heartbeats struct {
	last  map[string]int64
	since time.Time
}

// heartbeats reads the last heartbeats of the nodes (of all of them if
// ids is empty). The leading curator received every heartbeat of its
// term itself and reads nothing from etcd: every Watch asks again each
// healthTick, and a linearizable range read per watch per tick was the
// consensus' most frequent slow read under load. Any other curator reads
// what the leader wrote.
func (s *Service) heartbeats(ctx context.Context, kv clientv3.KV, ids ...string) (heartbeats, error) {
	s.mu.Lock()
	t := s.term
	s.mu.Unlock()
	if t != nil {
		h := heartbeats{last: map[string]int64{}, since: t.since}
		s.hbMu.Lock()
		for id, st := range s.hb {
			h.last[id] = st.seen.UnixNano()
		}
		s.hbMu.Unlock()
		return h, nil
	}
	h := heartbeats{since: s.leaderSince()}
	if len(ids) != 1 {
		var err error
		h.last, err = storedHeartbeats(ctx, kv)
		return h, err
	}
	v, _, err := getValue(ctx, kv, heartbeatKey(ids[0]))
	if err != nil {
		return h, etcdErr("reading heartbeat", err)
	}
	h.last = map[string]int64{ids[0]: parseNanos(v)}
	return h, nil
}

// withHealth fills in health for a list of nodes.
func (s *Service) withHealth(ctx context.Context, kv clientv3.KV, nodes ...*clusterpb.Node) error {
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.Id
	}
	h, err := s.heartbeats(ctx, kv, ids...)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, n := range nodes {
		s.health(n, h.last[n.Id], h.since, now)
	}
	return nil
}
