package roleserver

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/supervisor"
)

// hostsRefresh is how often the hosts worker picks up a changed own
// address.
const hostsRefresh = 5 * time.Second

// workerHosts keeps the node's map (Config.Names and its cache on /data)
// of every node ID of the cluster to its address, so etcd peer URLs
// https://<node ID>:7834 resolve, also on a cold start before any curator
// is reachable. It also makes every consensus member's curator an
// endpoint of the resolver.
//
// It consumes the node data and the curator connection, and watches all
// of the cluster's nodes at the curator. It produces the node map
// (hosts), the resolver's directory and former-node endpoints
// (endpoints), the curators' directory for enrolment (directory:
// Service.Directory) and the cluster's Kubernetes API servers
// (controllers).
type workerHosts struct {
	// inputs
	node    *memory.Value[*nodeData]
	curator *memory.Value[*CuratorConnection]
	// curatorPort is the port of every node's curator.
	curatorPort int

	// outputs
	hosts       *hostsFile
	endpoints   *resolverEndpoints
	directory   *memory.Value[*clusterpb.ClusterDirectory]
	controllers *memory.Value[[]string]
}

func (w *workerHosts) run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	nd, err := wait(ctx, w.node)
	if err != nil {
		return err
	}
	if err := w.hosts.refresh(nd.nodeID); err != nil {
		log.Warn("saving the node map", "err", err)
	} else if n := w.hosts.known(); n > 0 {
		log.Info("node map restored from cache", "nodes", n)
	}
	go func() {
		for supervisor.Sleep(ctx, hostsRefresh) == nil {
			if err := w.hosts.refresh(nd.nodeID); err != nil {
				log.Warn("saving the node map", "err", err)
			}
		}
	}()
	conn, err := wait(ctx, w.curator)
	if err != nil {
		return err
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	var b backoff
	for {
		err := w.watchAllNodes(ctx, conn, nd.nodeID, &b)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.Warn("watching the cluster's nodes failed, retrying", "err", err)
		if err := supervisor.Sleep(ctx, b.next()); err != nil {
			return err
		}
	}
}

func (w *workerHosts) watchAllNodes(ctx context.Context, conn *CuratorConnection, self string, b *backoff) error {
	log := supervisor.Logger(ctx)
	stream, err := conn.Curator().Watch(ctx, &clusterpb.WatchRequest{
		Kind: &clusterpb.WatchRequest_NodesInCluster_{NodesInCluster: &clusterpb.WatchRequest_NodesInCluster{}},
	})
	if err != nil {
		return err
	}
	nodes := map[string]*clusterpb.Node{}
	backlogged := false
	for {
		ev, err := stream.Recv()
		if err != nil {
			return err
		}
		b.reset()
		for _, n := range ev.GetNodes() {
			nodes[n.GetId()] = n
		}
		for _, t := range ev.GetTombstones() {
			delete(nodes, t.GetNodeId())
		}
		if ev.GetProgress() == clusterpb.WatchEvent_PROGRESS_LAST_BACKLOGGED {
			backlogged = true
		}
		if !backlogged {
			continue // only the full picture may drop entries
		}
		addrs := map[string]string{}
		dir := &clusterpb.ClusterDirectory{}
		former := map[string]bool{}
		var curators []string
		for id, n := range nodes {
			a := n.GetStatus().GetAddresses()
			if n.GetState() == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
				for _, addr := range a {
					former[addr] = true
				}
				continue
			}
			if len(a) > 0 {
				addrs[id] = a[0]
				if n.GetRoles().GetConsensusMember() != nil {
					dir.Nodes = append(dir.Nodes, &clusterpb.DirectoryNode{Id: id, PublicKey: n.GetPublicKey(), Addresses: a})
					if id != self {
						curators = append(curators, net.JoinHostPort(a[0], strconv.Itoa(w.curatorPort)))
					}
				}
			}
		}
		// A decommissioned node's address is an endpoint no more, also
		// where the node parameters name it.
		for _, addr := range addrs {
			delete(former, addr) // an address now used by a live node
		}
		slices.Sort(curators)
		apis := apiServerAddresses(nodes)
		slices.Sort(apis)
		if cur := get(w.controllers); !slices.Equal(cur, apis) {
			w.controllers.Set(apis)
		}
		w.endpoints.update(conn.Resolver, func(e *curatorEndpoints) {
			e.directory, e.former = curators, former
		})
		if len(dir.GetNodes()) > 0 {
			slices.SortFunc(dir.Nodes, func(a, b *clusterpb.DirectoryNode) int { return strings.Compare(a.Id, b.Id) })
			w.directory.Set(dir)
		}
		changed := w.hosts.setNodes(addrs)
		if err := w.hosts.refresh(self); err != nil {
			log.Warn("saving the node map", "err", err)
		} else if changed {
			log.Info("node map updated", "nodes", len(addrs))
		}
	}
}
