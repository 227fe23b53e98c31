package roleserver

import (
	"context"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/rpc"
)

// workerRoleFetch follows this node's record at the curator: new roles are
// persisted and published in Roles; health changes are logged.
//
// It consumes the node data and the curator connection, and watches this
// node at the curator. It produces the roles (Roles, and the roles file
// through rolesFile, whose failed writes it retries) and asks for the
// locally sealed cluster unlock key to be dropped when the curator says
// the node is no consensus member (clusterKey).
type workerRoleFetch struct {
	// inputs
	node    *memory.Value[*nodeData]
	curator *memory.Value[*CuratorConnection]

	// outputs
	roles      *memory.Value[*clusterpb.NodeRoles]
	rolesFile  *rolesFile
	clusterKey *clusterKeyRequests
}

func (w *workerRoleFetch) run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	nd, err := wait(ctx, w.node)
	if err != nil {
		return err
	}
	conn, err := wait(ctx, w.curator)
	if err != nil {
		return err
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	go w.rolesFile.retry(ctx)
	var b backoff
	health := clusterpb.NodeHealth_NODE_HEALTH_UNSPECIFIED
	for {
		err := w.watchOwnNode(ctx, conn, nd.nodeID, &health, &b)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if rpc.Reason(err) == clusterpb.ErrorReason_NODE_DECOMMISSIONED {
			// The curator refuses a decommissioned node everything, so
			// its tombstone may never arrive on a watch: the refusal is
			// the tombstone. Dropping the roles also drops a locally
			// sealed cluster unlock key (asked again on every refusal).
			log.Warn("the cluster says this node is decommissioned: dropping all roles")
			w.setRoles(ctx, &clusterpb.NodeRoles{})
			w.clusterKey.drop()
		}
		log.Warn("watching this node at the curator failed, retrying", "err", err)
		if err := retrySleep(ctx, conn, b.next()); err != nil {
			return err
		}
	}
}

func (w *workerRoleFetch) watchOwnNode(ctx context.Context, conn *CuratorConnection, id string, health *clusterpb.NodeHealth, b *backoff) error {
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
				w.setRoles(ctx, &clusterpb.NodeRoles{})
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
			w.setRoles(ctx, roles)
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
// (rolesFile.retry) and shown in the node's status meanwhile, so that the
// file does not stay stale unnoticed.
func (w *workerRoleFetch) setRoles(ctx context.Context, roles *clusterpb.NodeRoles) {
	if cur := get(w.roles); cur != nil && proto.Equal(cur, roles) {
		return
	}
	log := supervisor.Logger(ctx)
	w.rolesFile.persist(log, roles)
	log.Info("roles changed",
		"consensus_member", roles.GetConsensusMember() != nil,
		"kubernetes_controller", roles.GetKubernetesController() != nil,
		"kubernetes_worker", roles.GetKubernetesWorker() != nil)
	w.roles.Set(roles)
	if roles.GetConsensusMember() == nil {
		w.clusterKey.drop()
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
