package consensus

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"plinth.dev/plinth/platform/supervisor"
)

// autopromoter turns learners that have caught up into voting members.
// It runs on every member but only acts while its member leads: the
// leader is the one that knows how far each learner got, and one promoter
// at a time keeps the logs readable.
func autopromoter(e *embed.Etcd, cl clientv3.Cluster, interval time.Duration) supervisor.Runnable {
	return func(ctx context.Context) error {
		log := supervisor.Logger(ctx)
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
			if e.Server.Leader() != e.Server.MemberID() {
				continue
			}
			for _, m := range e.Server.Cluster().Members() {
				if !m.IsLearner {
					continue
				}
				_, err := cl.MemberPromote(ctx, uint64(m.ID))
				switch {
				case err == nil:
					log.Info("promoted learner", "member", m.ID.String(), "name", m.Name)
				case errors.Is(err, rpctypes.ErrMemberLearnerNotReady):
					// Still catching up: the usual case for a fresh learner.
				case ctx.Err() != nil:
					return ctx.Err()
				default:
					log.Warn("promoting learner failed", "member", m.ID.String(), "name", m.Name, "err", err)
				}
			}
		}
	}
}
