package curator

import (
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
)

// TestHeartbeat: a node that heartbeats is HEALTHY (and its heartbeat
// reaches etcd for the other members); one that stops is
// HEARTBEAT_TIMEOUT no sooner than the timeout allows, as is one that
// never sent any once the leader is old enough. A Watch of the node
// says so as it happens, though its record does not change.
func TestHeartbeat(t *testing.T) {
	f := newSingle(t)
	a, ctx := f.a, f.ctx
	b, _ := f.committed("b")
	bc := clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds))
	wctx, wcancel := ctxTimeoutCancel(t, time.Minute)
	defer wcancel()
	watch, err := bc.Watch(wctx, &clusterpb.WatchRequest{Kind: &clusterpb.WatchRequest_NodeInCluster_{NodeInCluster: &clusterpb.WatchRequest_NodeInCluster{NodeId: b.id}}})
	mustOK(t, "Watch", err)
	watched := make(chan clusterpb.NodeHealth, 100)
	go func() {
		for {
			ev, err := watch.Recv()
			if err != nil {
				close(watched)
				return
			}
			for _, n := range ev.Nodes {
				watched <- n.Health
			}
		}
	}()
	watchSays := func(want clusterpb.NodeHealth) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case h, ok := <-watched:
				if !ok {
					t.Fatalf("the Watch ended before it said %v", want)
				}
				if h == want {
					return
				}
			case <-timeout:
				t.Fatalf("the Watch did not say %v", want)
			}
		}
	}
	hctx, stop := ctxTimeoutCancel(t, time.Minute)
	hb, err := bc.Heartbeat(hctx)
	mustOK(t, "Heartbeat", err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if hb.Send(&clusterpb.HeartbeatRequest{}) != nil {
				return
			}
			if _, err := hb.Recv(); err != nil {
				return
			}
			select {
			case <-hctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	eventually(t, 10*time.Second, "HEALTHY after heartbeats", func() error {
		n := f.getNode(a, b.id)
		if n.Health != clusterpb.NodeHealth_NODE_HEALTH_HEALTHY || n.LastHeartbeatUnixNanos == 0 {
			return errorf("health %v, last heartbeat %d", n.Health, n.LastHeartbeatUnixNanos)
		}
		return nil
	})
	watchSays(clusterpb.NodeHealth_NODE_HEALTH_HEALTHY)
	// Written to etcd for the other members (rate-limited).
	eventually(t, 10*time.Second, "heartbeat stored in etcd", func() error {
		kv, _, err := a.cur.backend()
		if err != nil {
			return err
		}
		if v, _, err := getValue(ctx, kv, heartbeatKey(b.id)); err != nil || parseNanos(v) == 0 {
			return errorf("stored heartbeat = %q, %v", v, err)
		}
		return nil
	})
	stop()
	<-done
	stopped := time.Now()
	eventually(t, 10*time.Second, "HEARTBEAT_TIMEOUT after heartbeats stop", func() error {
		n := f.getNode(a, b.id)
		if n.Health != clusterpb.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT {
			return errorf("health %v", n.Health)
		}
		return nil
	})
	if d := time.Since(stopped); d < testHeartbeatTimeout-testHeartbeatTimeout/3-100*time.Millisecond {
		t.Errorf("HEARTBEAT_TIMEOUT only %v after the last heartbeat", d)
	}
	watchSays(clusterpb.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT)
	// Node a never sent a heartbeat and the leader is old by now.
	if n := f.getNode(a, a.id); n.Health != clusterpb.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT || n.LastHeartbeatUnixNanos != 0 {
		t.Errorf("a: health %v, last heartbeat %d", n.Health, n.LastHeartbeatUnixNanos)
	}
}
