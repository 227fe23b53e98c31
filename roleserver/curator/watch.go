package curator

import (
	"context"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/consensus/client"
)

// watchBatch is how many nodes one replay event carries at most.
const watchBatch = 64

// watchMethod names Watch in its errors.
const watchMethod = "Watch"

// Watch streams node records: first the ones there are (replay), then
// every change to them (follow), for as long as this curator leads.
func (c curatorServer) Watch(req *clusterpb.WatchRequest, srv clusterpb.Curator_WatchServer) error {
	t, err := c.leaderTerm()
	if err != nil {
		return err
	}
	kv, _, err := c.backend()
	if err != nil {
		return err
	}
	w, err := newNodeWatch(req)
	if err != nil {
		return err
	}
	w.c, w.t, w.kv, w.srv = c, t, kv, srv

	// The stream ends with the leadership: clients then follow the new
	// leader.
	ctx, cancel := context.WithCancel(srv.Context())
	defer cancel()
	stop := context.AfterFunc(t.ctx, cancel)
	defer stop()

	rev, sent, err := w.replay(ctx)
	if err != nil {
		return err
	}
	return w.follow(ctx, rev, sent)
}

// nodeWatch is one Watch stream: what it watches (key and opts; single is
// the node ID of a NodeInCluster watch) and where it sends.
type nodeWatch struct {
	key    string
	single string
	opts   []clientv3.OpOption

	c   curatorServer
	t   *term
	kv  client.Namespaced
	srv clusterpb.Curator_WatchServer
}

// newNodeWatch is the watch a request asks for: one node's key, or the
// prefix of all nodes.
func newNodeWatch(req *clusterpb.WatchRequest) (*nodeWatch, error) {
	switch k := req.Kind.(type) {
	case *clusterpb.WatchRequest_NodeInCluster_:
		single := k.NodeInCluster.GetNodeId()
		if single == "" {
			return nil, status.Error(codes.InvalidArgument, "node_in_cluster.node_id is empty")
		}
		return &nodeWatch{key: nodeKey(single), single: single}, nil
	case *clusterpb.WatchRequest_NodesInCluster_:
		return &nodeWatch{key: prefixNodes, opts: []clientv3.OpOption{clientv3.WithPrefix()}}, nil
	}
	return nil, status.Error(codes.InvalidArgument, "WatchRequest.kind is not set")
}

// ended is the error a stream ends with: the lost leadership or the
// client's going away explain a failed etcd call better than its own
// error does.
func (w *nodeWatch) ended(err error) error {
	if w.t.ctx.Err() != nil {
		return errNotLeader("not the leader any more")
	}
	if w.srv.Context().Err() != nil {
		return status.FromContextError(w.srv.Context().Err()).Err()
	}
	return err
}

// replay sends the nodes as they are, in events of at most watchBatch
// nodes, the last one marked PROGRESS_LAST_BACKLOGGED, and returns the
// revision they were read at and the nodes sent, by ID.
func (w *nodeWatch) replay(ctx context.Context) (int64, map[string]*clusterpb.Node, error) {
	resp, err := w.kv.Get(ctx, w.key, w.opts...)
	if err != nil {
		return 0, nil, w.ended(etcdErr(watchMethod, err))
	}
	ev, err := w.backlog(resp.Kvs)
	if err != nil {
		return 0, nil, err
	}
	if err := w.c.withHealth(ctx, w.kv, ev.Nodes...); err != nil {
		return 0, nil, w.ended(err)
	}
	sent := map[string]*clusterpb.Node{}
	for _, n := range ev.Nodes {
		sent[n.Id] = n
	}
	all := ev.Nodes
	for len(all) > watchBatch {
		if err := w.srv.Send(&clusterpb.WatchEvent{Nodes: all[:watchBatch]}); err != nil {
			return 0, nil, err
		}
		all = all[watchBatch:]
	}
	ev.Nodes = all
	ev.Progress = clusterpb.WatchEvent_PROGRESS_LAST_BACKLOGGED
	if err := w.srv.Send(ev); err != nil {
		return 0, nil, err
	}
	return resp.Header.Revision, sent, nil
}

// backlog is the event of the records there are. Decommissioned nodes
// are left out; a single-node watch gets a tombstone for its node if it
// is decommissioned or has no record.
func (w *nodeWatch) backlog(kvs []*mvccpb.KeyValue) (*clusterpb.WatchEvent, error) {
	ev := &clusterpb.WatchEvent{}
	for _, kvp := range kvs {
		n, err := unmarshalNode(kvp.Value)
		if err != nil {
			return nil, internalErr(string(kvp.Key), err)
		}
		if n.State == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
			if w.single != "" {
				ev.Tombstones = append(ev.Tombstones, &clusterpb.NodeTombstone{NodeId: n.Id})
			}
			continue
		}
		ev.Nodes = append(ev.Nodes, n)
	}
	if w.single != "" && len(kvs) == 0 {
		ev.Tombstones = append(ev.Tombstones, &clusterpb.NodeTombstone{NodeId: w.single})
	}
	return ev, nil
}

// follow sends every change after revision rev, one event per etcd
// watch response that changed something, until the stream or the
// leadership ends. A node's health is not in its record (it follows from
// its heartbeats and the time): every healthTick the nodes sent (by ID)
// are checked again, and a node whose health changed is sent again.
func (w *nodeWatch) follow(ctx context.Context, rev int64, sent map[string]*clusterpb.Node) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	records := w.kv.Watch(ctx, w.key, append(w.opts, clientv3.WithRev(rev+1))...)
	tick := time.NewTicker(w.c.healthTick())
	defer tick.Stop()
	for {
		var ev *clusterpb.WatchEvent
		var err error
		select {
		case wr, ok := <-records:
			if !ok {
				return w.ended(errUnavailable("%s: etcd watch closed", watchMethod))
			}
			if err := wr.Err(); err != nil {
				return w.ended(status.Errorf(codes.Unavailable, "%s: etcd watch: %v", watchMethod, err))
			}
			ev, err = w.changes(ctx, wr.Events)
		case <-tick.C:
			ev, err = w.healthChanges(ctx, sent)
		}
		if err != nil {
			return err
		}
		if len(ev.Nodes)+len(ev.Tombstones) == 0 {
			continue
		}
		for _, n := range ev.Nodes {
			sent[n.Id] = n
		}
		for _, t := range ev.Tombstones {
			delete(sent, t.NodeId)
		}
		if err := w.srv.Send(ev); err != nil {
			return err
		}
	}
}

// healthChanges is the event of the nodes in sent whose health is not
// what was sent.
func (w *nodeWatch) healthChanges(ctx context.Context, sent map[string]*clusterpb.Node) (*clusterpb.WatchEvent, error) {
	nodes := make([]*clusterpb.Node, 0, len(sent))
	for _, n := range sent {
		nodes = append(nodes, proto.Clone(n).(*clusterpb.Node))
	}
	if err := w.c.withHealth(ctx, w.kv, nodes...); err != nil {
		return nil, w.ended(err)
	}
	ev := &clusterpb.WatchEvent{}
	for _, n := range nodes {
		if n.Health != sent[n.Id].Health {
			ev.Nodes = append(ev.Nodes, n)
		}
	}
	slices.SortFunc(ev.Nodes, func(a, b *clusterpb.Node) int { return strings.Compare(a.Id, b.Id) })
	return ev, nil
}

// changes is the event of one etcd watch response: deleted and
// decommissioned nodes as tombstones, the others with their health.
func (w *nodeWatch) changes(ctx context.Context, events []*clientv3.Event) (*clusterpb.WatchEvent, error) {
	ev := &clusterpb.WatchEvent{}
	for _, e := range events {
		id := strings.TrimPrefix(string(e.Kv.Key), prefixNodes)
		if e.Type == clientv3.EventTypeDelete {
			ev.Tombstones = append(ev.Tombstones, &clusterpb.NodeTombstone{NodeId: id})
			continue
		}
		n, err := unmarshalNode(e.Kv.Value)
		if err != nil {
			return nil, internalErr(string(e.Kv.Key), err)
		}
		if n.State == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
			ev.Tombstones = append(ev.Tombstones, &clusterpb.NodeTombstone{NodeId: id})
			continue
		}
		if err := w.c.withHealth(ctx, w.kv, n); err != nil {
			return nil, w.ended(err)
		}
		ev.Nodes = append(ev.Nodes, n)
	}
	return ev, nil
}
