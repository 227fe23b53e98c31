package consensus

import (
	"context"
	"errors"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"plinth.dev/plinth/platform/supervisor"
)

// The consensus service compacts etcd's history, not the Kubernetes API
// server: a compaction is of the whole store, every namespace's history,
// so the API server's endpoint refuses Compact.
//
// The API server must still learn of each compaction. Its watch cache
// serves paginated lists from snapshots, and drops the snapshots older
// than the revision it reads from one key, compact_rev_key at the root of
// its keyspace, which its compactor gets and watches. Were the key never
// written, a list continued from an expired token would be served from
// the cache forever instead of failing with 410 Gone (the conformance
// suite's API chunking spec waits for that). The API server starts that
// compactor only for a non-zero --etcd-compaction-interval, so it runs
// with a year (kubernetes.apiServerCompactionInterval): it watches, and
// never compacts itself.
//
// So every member runs the API server's own protocol on that key; the
// key's version is the logical clock, and only the member whose
// compare-and-swap succeeds compacts:
//
//	every compactInterval, on every member:
//	  txn if version(/kubernetes/compact_rev_key) == version seen last
//	      then put(key, revision seen at the previous tick) ─► Compact(it)
//	      else get(key)                                     ─► adopt its version
//
// History is kept for one to two intervals: enough for watchers that
// reconnect (the curator's watchers start from a revision they have just
// read, and re-read when theirs was compacted away).

// compactInterval is a minute shorter than the API server's default
// --etcd-compaction-interval (5 min). A revision is compacted away one
// to two intervals after it was current, and the API server's watch
// cache notices within 15 s: at five minutes, a list continuation could
// outlive the ten minutes within which Kubernetes promises (and the
// conformance suite checks) that it expires; at four it expires within
// eight.
const compactInterval = 4 * time.Minute

// compactRevKey is the API server's compact_rev_key, in the raw keyspace.
const compactRevKey = kubernetesPrefix + "compact_rev_key"

// compactor runs compactionClock.tick every interval.
func compactor(kv clientv3.KV, interval time.Duration) supervisor.Runnable {
	return func(ctx context.Context) error {
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		var c compactionClock
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
			}
			rev, err := c.tick(ctx, kv)
			switch {
			case err != nil:
				// The next tick tries again, as the API server's
				// compactor does.
				supervisor.Logger(ctx).Warn("compaction failed", "err", err)
			case rev != 0:
				supervisor.Logger(ctx).Info("history compacted", "revision", rev)
			}
		}
	}
}

// compactionClock is one member's view of the protocol: the key's version
// it last saw and the store's revision at its last tick.
type compactionClock struct {
	version, rev int64
}

// tick is one round of the protocol. It returns the revision it compacted
// to, 0 if it compacted nothing (another member won the round, or this is
// the first round, which has no earlier revision to compact to).
func (c *compactionClock) tick(ctx context.Context, kv clientv3.KV) (int64, error) {
	resp, err := kv.Txn(ctx).If(
		clientv3.Compare(clientv3.Version(compactRevKey), "=", c.version),
	).Then(
		clientv3.OpPut(compactRevKey, strconv.FormatInt(c.rev, 10)),
	).Else(
		clientv3.OpGet(compactRevKey),
	).Commit()
	if err != nil {
		return 0, err
	}
	prev := c.rev
	c.rev = resp.Header.Revision
	if !resp.Succeeded {
		c.version = 0
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			c.version = kvs[0].Version
		}
		return 0, nil
	}
	c.version++
	if prev == 0 {
		return 0, nil
	}
	if _, err := kv.Compact(ctx, prev); err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			// Already compacted past it: nothing lost.
			return 0, nil
		}
		return 0, err
	}
	return prev, nil
}
