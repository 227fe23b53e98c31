package curator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/consensus/client"
)

// Pending consensus members.
//
// etcd admits one learner at a time: a second MemberAddAsLearner while
// the first learner is still catching up fails ("too many learner
// members"). An owner who gives the ConsensusMember role to two nodes back
// to back must not see that; UpdateNodeRoles records the second one as
// pending instead (Node.consensus_member_pending) and the leader adds
// pending members one after the other:
//
//	UpdateNodeRoles(consensus_member) ─► learner in progress? ─no─► AddNode, role now
//	                                        │ yes (or etcd: not yet safe)
//	                                        ▼
//	                          record: consensus_member_pending
//	                                        │
//	leader only, every memberAddInterval:   ▼
//	  no learner left (the last one was promoted) ─► AddNode(next pending)
//	    ─► record: roles.consensus_member = join data, pending cleared
//	       (guarded by the term; the node then starts etcd as a learner,
//	        and the autopromoter promotes it once it caught up)
//
// A learner that belongs to a pending node is an addition this loop (or a
// previous leader's) made but could not record: AddNode is idempotent, so
// it is finished first. Removing the role or decommissioning the node
// clears pending; an addition that finds pending cleared meanwhile removes
// its etcd member again.

// memberAddInterval is how often the leader looks for pending members;
// UpdateNodeRoles also wakes it.
const memberAddInterval = 2 * time.Second

// errPendingDropped: the node's pending membership went away while the
// leader was adding it.
var errPendingDropped = errors.New("consensus membership no longer pending")

// wakeMembers makes the leader's member loop look at once.
func (s *Service) wakeMembers() {
	select {
	case s.membersWake <- struct{}{}:
	default:
	}
}

// runMembers is a child runnable of Run: during each term of this
// curator's leadership it adds pending consensus members.
func (s *Service) runMembers(ctx context.Context) error {
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	w := s.leader.Watch()
	defer w.Close()
	for {
		if _, err := w.Get(ctx); err != nil {
			return err
		}
		if t, err := s.leaderTerm(); err == nil {
			s.addPendingMembers(t, supervisor.Logger(ctx))
		}
	}
}

// addPendingMembers works through the pending members until the term
// ends. While none is pending it lists nothing: it waits for a node
// record to change (an etcd watch from the revision it listed at) or a
// wake; while one is, it tries again every memberAddInterval (etcd admits
// a learner only when the previous one caught up).
func (s *Service) addPendingMembers(t *term, log *slog.Logger) {
	tick := time.NewTicker(memberAddInterval)
	defer tick.Stop()
	var lastErr string
	for {
		idle, rev, err := s.addNextPending(t, log)
		if t.ctx.Err() != nil {
			return
		}
		if msg := fmt.Sprint(err); err != nil && msg != lastErr {
			log.Warn("adding a pending consensus member failed, retrying", "err", err)
		}
		lastErr = fmt.Sprint(err)
		var changed clientv3.WatchChan
		ctx, cancel := context.WithCancel(t.ctx)
		if idle {
			changed = t.kv.Watch(ctx, prefixNodes, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
			tick.Stop()
		} else {
			tick.Reset(memberAddInterval)
		}
		select {
		case <-t.ctx.Done():
		case <-tick.C:
		case wr, ok := <-changed:
			if !ok || wr.Err() != nil { // the watch failed: list again after a pause
				tick.Reset(memberAddInterval)
				select {
				case <-t.ctx.Done():
				case <-tick.C:
				}
			}
		case <-s.membersWake:
		}
		cancel()
	}
}

// addNextPending adds one pending member if etcd admits one now. idle:
// no node was pending in the records read at revision rev.
func (s *Service) addNextPending(t *term, log *slog.Logger) (idle bool, rev int64, err error) {
	ctx := t.ctx
	kv, st, err := s.backend()
	if err != nil {
		return false, 0, err
	}
	nodes, rev, err := listNodes(ctx, kv)
	if err != nil {
		return false, 0, err
	}
	pending := slices.DeleteFunc(nodes, func(n *clusterpb.Node) bool {
		return !n.GetConsensusMemberPending() || n.GetState() != clusterpb.NodeState_NODE_STATE_UP
	})
	if len(pending) == 0 {
		return true, rev, nil
	}
	return false, rev, s.addOnePending(t, log, kv, st, pending)
}

// addOnePending adds the next of the pending nodes to etcd and records
// its consensus role.
func (s *Service) addOnePending(t *term, log *slog.Logger, kv clientv3.KV, st *consensus.Status, pending []*clusterpb.Node) error {
	ctx := t.ctx
	next, wait, err := nextToAdd(ctx, st, pending)
	if err != nil || wait {
		return err
	}
	member, err := s.addConsensusMember(ctx, st, next)
	if errors.Is(err, consensus.ErrLearnerInProgress) || errors.Is(err, consensus.ErrNotYetSafe) {
		return nil // next round
	}
	if err != nil {
		return fmt.Errorf("node %s: %w", next.Id, err)
	}
	_, err = updateNode(ctx, kv, t, next.Id, func(n *clusterpb.Node) ([]clientv3.Op, error) {
		if n == nil || n.State != clusterpb.NodeState_NODE_STATE_UP || !n.ConsensusMemberPending {
			return nil, errPendingDropped
		}
		if n.Roles == nil {
			n.Roles = &clusterpb.NodeRoles{}
		}
		n.Roles.ConsensusMember = member
		n.ConsensusMemberPending = false
		return nil, nil
	})
	switch {
	case errors.Is(err, errPendingDropped):
		// The owner took the role back (or decommissioned the node)
		// while it was being added.
		if rerr := st.RemoveNode(ctx, next.Id); rerr != nil {
			return fmt.Errorf("node %s: its pending membership was dropped, and removing the etcd member added meanwhile failed: %w", next.Id, rerr)
		}
		log.Info("pending consensus member dropped meanwhile; etcd member removed again", "node", next.Id)
		return nil
	case err != nil:
		// Leadership lost, or etcd failed: the member stays a learner of
		// a pending node, which the next attempt finishes (AddNode is
		// idempotent).
		return fmt.Errorf("node %s: recording its consensus role: %w", next.Id, err)
	}
	log.Info("pending consensus member added to etcd; it joins as a learner", "node", next.Id)
	return nil
}

// nextToAdd picks the pending node to add now: one that already has an
// etcd member (an addition that was not recorded), else the first, unless
// another learner is still catching up (wait).
func nextToAdd(ctx context.Context, st *consensus.Status, pending []*clusterpb.Node) (next *clusterpb.Node, wait bool, err error) {
	if st == nil || st.ClusterClient() == nil {
		return nil, false, errUnavailable("consensus member not running")
	}
	ml, err := st.ClusterClient().MemberList(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("listing etcd members: %w", err)
	}
	byID := map[string]*clusterpb.Node{}
	for _, n := range pending {
		byID[n.Id] = n
	}
	for _, m := range ml.Members {
		if n := byID[consensus.GetEtcdMemberNodeId(m)]; n != nil {
			return n, false, nil
		}
	}
	for _, m := range ml.Members {
		if m.IsLearner {
			return nil, true, nil
		}
	}
	return pending[0], false, nil
}

// learnerInProgress reports whether etcd has a learner other than node id,
// or another node waits for its membership already (it goes first).
func learnerInProgress(ctx context.Context, kv client.Namespaced, st *consensus.Status, id string) (bool, error) {
	nodes, _, err := listNodes(ctx, kv)
	if err != nil {
		return false, err
	}
	for _, n := range nodes {
		if n.Id != id && n.GetConsensusMemberPending() && n.GetState() == clusterpb.NodeState_NODE_STATE_UP {
			return true, nil
		}
	}
	if st == nil || st.ClusterClient() == nil {
		return false, errUnavailable("curator is not connected to its consensus member")
	}
	ml, err := st.ClusterClient().MemberList(ctx)
	if err != nil {
		return false, etcdErr("listing consensus members", err)
	}
	for _, m := range ml.Members {
		if m.IsLearner && consensus.GetEtcdMemberNodeId(m) != id {
			return true, nil
		}
	}
	return false, nil
}

// addNodeErr turns an AddNode failure into what the owner sees: never
// etcd's bare message.
func addNodeErr(id string, err error) error {
	if isStatus(err) {
		return err
	}
	return status.Errorf(codes.Unavailable, "could not add node %s to the consensus (etcd) cluster, nothing was changed; retry: %v", id, err)
}
