package curator

import (
	"context"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
)

// watchBatch is how many nodes one replay event carries at most.
const watchBatch = 64

func (c curatorServer) Watch(req *clusterpb.WatchRequest, srv clusterpb.Curator_WatchServer) error {
	const method = "Watch"
	t, err := c.leaderTerm()
	if err != nil {
		return err
	}
	kv, _, err := c.backend()
	if err != nil {
		return err
	}
	var key, single string
	var opts []clientv3.OpOption
	switch k := req.Kind.(type) {
	case *clusterpb.WatchRequest_NodeInCluster_:
		single = k.NodeInCluster.GetNodeId()
		if single == "" {
			return status.Error(codes.InvalidArgument, "node_in_cluster.node_id is empty")
		}
		key = nodeKey(single)
	case *clusterpb.WatchRequest_NodesInCluster_:
		key, opts = prefixNodes, []clientv3.OpOption{clientv3.WithPrefix()}
	default:
		return status.Error(codes.InvalidArgument, "WatchRequest.kind is not set")
	}

	// The stream ends with the leadership: clients then follow the new
	// leader.
	ctx, cancel := context.WithCancel(srv.Context())
	defer cancel()
	stop := context.AfterFunc(t.ctx, cancel)
	defer stop()
	ended := func(err error) error {
		if t.ctx.Err() != nil {
			return errNotLeader("not the leader any more")
		}
		if srv.Context().Err() != nil {
			return status.FromContextError(srv.Context().Err()).Err()
		}
		return err
	}

	resp, err := kv.Get(ctx, key, opts...)
	if err != nil {
		return ended(etcdErr(method, err))
	}
	ev := &clusterpb.WatchEvent{}
	for _, kvp := range resp.Kvs {
		n, err := unmarshalNode(kvp.Value)
		if err != nil {
			return internalErr(string(kvp.Key), err)
		}
		if n.State == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
			if single != "" {
				ev.Tombstones = append(ev.Tombstones, &clusterpb.NodeTombstone{NodeId: n.Id})
			}
			continue
		}
		ev.Nodes = append(ev.Nodes, n)
	}
	if single != "" && len(resp.Kvs) == 0 {
		ev.Tombstones = append(ev.Tombstones, &clusterpb.NodeTombstone{NodeId: single})
	}
	if err := c.withHealth(ctx, kv, ev.Nodes); err != nil {
		return ended(err)
	}
	all := ev.Nodes
	for len(all) > watchBatch {
		if err := srv.Send(&clusterpb.WatchEvent{Nodes: all[:watchBatch]}); err != nil {
			return err
		}
		all = all[watchBatch:]
	}
	ev.Nodes = all
	ev.Progress = clusterpb.WatchEvent_PROGRESS_LAST_BACKLOGGED
	if err := srv.Send(ev); err != nil {
		return err
	}

	for wr := range kv.Watch(ctx, key, append(opts, clientv3.WithRev(resp.Header.Revision+1))...) {
		if err := wr.Err(); err != nil {
			return ended(status.Errorf(codes.Unavailable, "%s: etcd watch: %v", method, err))
		}
		ev := &clusterpb.WatchEvent{}
		for _, e := range wr.Events {
			id := strings.TrimPrefix(string(e.Kv.Key), prefixNodes)
			if e.Type == clientv3.EventTypeDelete {
				ev.Tombstones = append(ev.Tombstones, &clusterpb.NodeTombstone{NodeId: id})
				continue
			}
			n, err := unmarshalNode(e.Kv.Value)
			if err != nil {
				return internalErr(string(e.Kv.Key), err)
			}
			if n.State == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
				ev.Tombstones = append(ev.Tombstones, &clusterpb.NodeTombstone{NodeId: id})
				continue
			}
			if err := c.withHealthOne(ctx, kv, n); err != nil {
				return ended(err)
			}
			ev.Nodes = append(ev.Nodes, n)
		}
		if len(ev.Nodes)+len(ev.Tombstones) == 0 {
			continue
		}
		if err := srv.Send(ev); err != nil {
			return err
		}
	}
	return ended(errUnavailable("%s: etcd watch closed", method))
}
