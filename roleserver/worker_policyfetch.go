package roleserver

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/supervisor"
)

// workerPolicyFetch follows the cluster policy at the curator
// (Curator.WatchClusterPolicy) for what the node applies itself: a
// worker's image registries (kubernetes.Worker.Policy), and the chain of
// release keys it verifies and moves its trust forward along
// (releasetrust.go). The controllers' control plane reads the policy
// from its own etcd member instead.
//
// It consumes the curator connection and produces the policy, published
// only when it changed, so that a new leader's replay restarts nothing.
// Until the first answer the value stays unset, and what waits on it
// (the kubelet) waits: a node that starts without the cluster cannot
// know which registries need credentials.
type workerPolicyFetch struct {
	// inputs
	curator *memory.Value[*CuratorConnection]

	// releaseTrust follows the policy's release keys (nil: not).
	releaseTrust *releaseTrust

	// outputs
	policy *memory.Value[*clusterpb.ClusterConfiguration]
}

// unimplementedRetry is how often a node asks a curator that does not
// serve WatchClusterPolicy again.
const unimplementedRetry = time.Minute

func (w *workerPolicyFetch) run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	conn, err := wait(ctx, w.curator)
	if err != nil {
		return err
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	var b backoff
	for {
		err := w.follow(ctx, conn, &b)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := b.next()
		if status.Code(err) == codes.Unimplemented {
			// A curator from before WatchClusterPolicy (a cluster being
			// updated node by node) has no policy for nodes to apply:
			// the node runs as those curators expect, and asks again
			// now and then.
			if get(w.policy) == nil {
				w.policy.Set(&clusterpb.ClusterConfiguration{})
			}
			wait = unimplementedRetry
		}
		log.Warn("following the cluster policy at the curator failed, retrying", "err", err, "in", wait)
		if err := retrySleep(ctx, conn, wait); err != nil {
			return err
		}
	}
}

func (w *workerPolicyFetch) follow(ctx context.Context, conn *CuratorConnection, b *backoff) error {
	stream, err := conn.Curator().WatchClusterPolicy(ctx, &clusterpb.WatchClusterPolicyRequest{})
	if err != nil {
		return err
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return err
		}
		b.reset()
		cfg := ev.GetConfiguration()
		if cfg == nil {
			cfg = &clusterpb.ClusterConfiguration{}
		}
		if cur := get(w.policy); cur == nil || !proto.Equal(cur, cfg) {
			w.policy.Set(cfg)
			w.followReleaseKeys(ctx, cfg)
		}
	}
}

// followReleaseKeys moves the node's release trust along cfg's chain. A
// chain it refuses is logged and changes nothing: the next update is
// refused with the same reason.
func (w *workerPolicyFetch) followReleaseKeys(ctx context.Context, cfg *clusterpb.ClusterConfiguration) {
	if w.releaseTrust == nil || len(cfg.GetReleaseKeyChain()) == 0 {
		return
	}
	log := supervisor.Logger(ctx)
	if _, err := w.releaseTrust.follow(cfg.ReleaseKeyChainSigned(), log); err != nil {
		log.Error("the cluster's release keys are refused: no update will be installed until they lead on from this node's", "err", err)
	}
}
