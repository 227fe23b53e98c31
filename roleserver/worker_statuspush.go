package roleserver

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/supervisor"
)

// statusRefresh is how often the status worker looks for changes, and
// statusResend how often it pushes an unchanged status anyway.
const (
	statusRefresh = 2 * time.Second
	statusResend  = time.Minute
)

// workerStatusPush keeps this node's status at the curator current.
//
// It consumes the node data, the curator connection, the node's
// addresses and its status (addresses, version, boot count and time,
// problems); it produces the node's status at the curator
// (Curator.UpdateNodeStatus), pushed when it changes and every
// statusResend.
type workerStatusPush struct {
	// inputs
	node    *memory.Value[*nodeData]
	curator *memory.Value[*CuratorConnection]
	// addresses waits for the node's addresses; status is the node's
	// status, given the supervisor's runnables.
	addresses func(ctx context.Context) ([]string, error)
	status    func([]supervisor.Status) *clusterpb.NodeStatus
}

func (w *workerStatusPush) run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	nd, err := wait(ctx, w.node)
	if err != nil {
		return err
	}
	conn, err := wait(ctx, w.curator)
	if err != nil {
		return err
	}
	// A status without addresses would erase the ones the cluster knows
	// (other nodes find this node's etcd and curator through them).
	if _, err := w.addresses(ctx); err != nil {
		return err
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	var pushed *clusterpb.NodeStatus
	var pushedAt time.Time
	failing := false
	for {
		st := w.status(supervisor.Snapshot(ctx))
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
		if err := supervisor.Sleep(ctx, statusRefresh); err != nil {
			return err
		}
	}
}
