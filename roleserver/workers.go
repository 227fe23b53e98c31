package roleserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

// runRoleFetch follows this node's record at the curator: new roles are
// persisted and published in Roles; health changes are logged.
func (s *Service) runRoleFetch(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	nd, err := wait(ctx, &s.node)
	if err != nil {
		return err
	}
	conn, err := wait(ctx, &s.CuratorConnection)
	if err != nil {
		return err
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	go s.retrySaveRoles(ctx)
	var b backoff
	health := clusterpb.NodeHealth_NODE_HEALTH_UNSPECIFIED
	for {
		err := s.watchOwnNode(ctx, conn, nd.nodeID, &health, &b)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if rpc.Reason(err) == clusterpb.ErrorReason_NODE_DECOMMISSIONED {
			// The curator refuses a decommissioned node everything, so
			// its tombstone may never arrive on a watch: the refusal is
			// the tombstone. Dropping the roles also drops a locally
			// sealed cluster unlock key (retried on every refusal).
			log.Warn("the cluster says this node is decommissioned: dropping all roles")
			s.setRoles(ctx, &clusterpb.NodeRoles{})
			if err := s.keepClusterKeyLocally(false); err != nil {
				log.Error("removing the locally sealed cluster unlock key", "err", err)
			}
		}
		log.Warn("watching this node at the curator failed, retrying", "err", err)
		if err := retrySleep(ctx, conn, b.next()); err != nil {
			return err
		}
	}
}

func (s *Service) watchOwnNode(ctx context.Context, conn *CuratorConnection, id string, health *clusterpb.NodeHealth, b *backoff) error {
	log := supervisor.Logger(ctx)
	stream, err := conn.Curator().Watch(ctx, &clusterpb.WatchRequest{
		Kind: &clusterpb.WatchRequest_NodeInCluster_{NodeInCluster: &clusterpb.WatchRequest_NodeInCluster{NodeId: id}},
	})
	if err != nil {
		return err
	}
	first := true
	for {
		ev, err := stream.Recv()
		if err != nil {
			return err
		}
		if first {
			leader, addr := conn.Resolver.Leader()
			log.Info("watching this node at curator leader "+leader, "address", addr)
			first = false
			b.reset()
		}
		for _, t := range ev.GetTombstones() {
			if t.GetNodeId() == id {
				log.Warn("this node was decommissioned: dropping all roles")
				s.setRoles(ctx, &clusterpb.NodeRoles{})
			}
		}
		for _, n := range ev.GetNodes() {
			if n.GetId() != id {
				continue
			}
			roles := n.GetRoles()
			if roles == nil {
				roles = &clusterpb.NodeRoles{}
			}
			s.setRoles(ctx, roles)
			if h := n.GetHealth(); h != *health {
				*health = h
				log.Info("node is " + healthName(h))
			}
		}
	}
}

// setRoles publishes roles (the curator's word) if they differ from the
// current ones, and persists them. A failed write does not hold the roles
// back — the curator decides what runs — but is retried until it works
// (retrySaveRoles) and shown in the node's status meanwhile, so that the
// file does not stay stale unnoticed.
func (s *Service) setRoles(ctx context.Context, roles *clusterpb.NodeRoles) {
	if cur := get(&s.Roles); cur != nil && proto.Equal(cur, roles) {
		return
	}
	log := supervisor.Logger(ctx)
	s.persistRoles(log, roles)
	log.Info("roles changed",
		"consensus_member", roles.GetConsensusMember() != nil,
		"kubernetes_controller", roles.GetKubernetesController() != nil,
		"kubernetes_worker", roles.GetKubernetesWorker() != nil)
	s.Roles.Set(roles)
	if roles.GetConsensusMember() == nil {
		if err := s.keepClusterKeyLocally(false); err != nil {
			log.Error("removing the locally sealed cluster unlock key", "err", err)
		}
	}
}

// rolesRetry is how often a failed write of the roles file is retried.
const rolesRetry = 5 * time.Second

// persistRoles writes roles to /data/node/roles; on failure it keeps them
// for retrySaveRoles and reports the problem in the node status.
func (s *Service) persistRoles(log *slog.Logger, roles *clusterpb.NodeRoles) {
	err := s.saveRoles(roles)
	s.mu.Lock()
	if err != nil {
		s.unsavedRoles = roles
	} else {
		s.unsavedRoles = nil
	}
	s.mu.Unlock()
	if err != nil {
		log.Error("saving roles failed; retrying", "file", s.StorageRoot.Data.Node.Roles.Path(), "err", err)
		s.setProblem("roles", fmt.Sprintf("saving roles to %s failed (retrying every %v): %v", s.StorageRoot.Data.Node.Roles.Path(), rolesRetry, err))
		return
	}
	if s.clearProblem("roles") {
		log.Info("roles saved", "file", s.StorageRoot.Data.Node.Roles.Path())
	}
}

// retrySaveRoles retries a failed write of the roles file until ctx ends.
func (s *Service) retrySaveRoles(ctx context.Context) {
	every := rolesRetry
	if s.knobs != nil && s.knobs.retryInterval != 0 {
		every = s.knobs.retryInterval
	}
	for sleep(ctx, every) == nil {
		s.mu.Lock()
		roles := s.unsavedRoles
		s.mu.Unlock()
		if roles != nil {
			s.persistRoles(supervisor.Logger(ctx), roles)
		}
	}
}

func healthName(h clusterpb.NodeHealth) string {
	if n, ok := clusterpb.NodeHealth_name[int32(h)]; ok {
		if len(n) > len("NODE_HEALTH_") {
			return n[len("NODE_HEALTH_"):]
		}
		return n
	}
	return h.String()
}

// statusRefresh is how often the status worker looks for changes, and
// statusResend how often it pushes an unchanged status anyway.
const (
	statusRefresh = 2 * time.Second
	statusResend  = time.Minute
)

// runStatusPush keeps this node's status at the curator current.
func (s *Service) runStatusPush(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	nd, err := wait(ctx, &s.node)
	if err != nil {
		return err
	}
	conn, err := wait(ctx, &s.CuratorConnection)
	if err != nil {
		return err
	}
	// A status without addresses would erase the ones the cluster knows
	// (other nodes find this node's etcd and curator through them).
	if _, err := s.waitAddresses(ctx); err != nil {
		return err
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	var pushed *clusterpb.NodeStatus
	var pushedAt time.Time
	failing := false
	for {
		st := s.status()
		if len(st.GetAddresses()) == 0 && pushed != nil {
			st.Addresses = pushed.GetAddresses() // the link went away: keep the last known
		}
		if !proto.Equal(st, pushed) || time.Since(pushedAt) > statusResend {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := conn.Curator().UpdateNodeStatus(cctx, &clusterpb.UpdateNodeStatusRequest{NodeId: nd.nodeID, Status: st})
			cancel()
			switch {
			case err != nil && ctx.Err() == nil:
				if !failing {
					log.Warn("pushing status failed, retrying", "err", err)
				}
				failing = true
			case err == nil:
				if !proto.Equal(st, pushed) {
					log.Info("status pushed", "addresses", fmt.Sprint(st.GetAddresses()), "version", st.GetVersion(), "boot_count", st.GetBootCount())
				}
				failing = false
				pushed, pushedAt = st, time.Now()
			}
		}
		if err := sleep(ctx, statusRefresh); err != nil {
			return err
		}
	}
}

// heartbeatAnswerTimeout is how long the heartbeat worker waits for the
// curator's answer to a heartbeat. The curator answers every one; a
// stream that stays silent for two intervals runs to a leader that is
// gone (or hangs), however healthy its TCP connection may look.
const heartbeatAnswerTimeout = 2 * heartbeatInterval

// errNoHeartbeatAnswer ends a heartbeat stream whose answers stopped.
var errNoHeartbeatAnswer = fmt.Errorf("the curator leader did not answer a heartbeat within %v", heartbeatAnswerTimeout)

// retrySleep waits d before a retry at the curator leader, or less if the
// resolver learns of a new leader meanwhile: after a failover the retry
// goes there at once instead of after the backoff.
func retrySleep(ctx context.Context, conn *CuratorConnection, d time.Duration) error {
	changed := conn.Resolver.LeaderChanged()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-changed:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// runHeartbeat keeps a Heartbeat stream to the curator leader, sending
// every curator.HeartbeatInterval. A stream whose answers stop is given up
// (heartbeatAnswerTimeout) and the resolver is told to re-check the
// leader, so that the node follows a new leader instead of talking to a
// dead one.
func (s *Service) runHeartbeat(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	conn, err := wait(ctx, &s.CuratorConnection)
	if err != nil {
		return err
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	var b backoff
	for {
		err := s.heartbeat(ctx, conn, &b)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.Warn("lost the curator leader, reconnecting", "err", err)
		if errors.Is(err, errNoHeartbeatAnswer) {
			conn.Resolver.Recheck()
		}
		if err := retrySleep(ctx, conn, b.next()); err != nil {
			return err
		}
	}
}

func (s *Service) heartbeat(ctx context.Context, conn *CuratorConnection, b *backoff) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := conn.Curator().Heartbeat(ctx)
	if err != nil {
		return err
	}
	acks := make(chan error, 1)
	var trust *identity.Trust // nil: no CRL to keep (tests)
	if conn.Credentials != nil {
		trust = conn.Credentials.Trust
	}
	answered := make(chan struct{}, 1)
	go func() {
		first := true
		for {
			resp, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = errors.New("curator closed the heartbeat stream")
				}
				acks <- err
				return
			}
			select {
			case answered <- struct{}{}:
			default:
			}
			if first {
				leader, addr := conn.Resolver.Leader()
				supervisor.Logger(ctx).Info("connected to curator leader "+leader, "address", addr)
				first = false
				b.reset()
			}
			if len(resp.GetCrl()) > 0 && trust != nil {
				if err := s.acceptCRL(trust, resp.GetCrl(), supervisor.Logger(ctx)); err != nil {
					supervisor.Logger(ctx).Warn("cluster CRL", "err", err)
				}
			}
		}
	}()
	t := time.NewTicker(heartbeatInterval)
	defer t.Stop()
	// The next answer is due heartbeatAnswerTimeout after the last one
	// (or after the stream started).
	due := time.NewTimer(heartbeatAnswerTimeout)
	defer due.Stop()
	for {
		if err := stream.Send(&clusterpb.HeartbeatRequest{CrlNumber: trust.CRLNumber()}); err != nil {
			// The real reason comes from Recv.
			select {
			case err := <-acks:
				return err
			case <-time.After(time.Second):
				return err
			}
		}
	wait:
		for {
			select {
			case <-t.C:
				break wait
			case <-answered:
				due.Reset(heartbeatAnswerTimeout)
			case <-due.C:
				return errNoHeartbeatAnswer
			case err := <-acks:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}
