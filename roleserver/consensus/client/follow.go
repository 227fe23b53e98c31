package client

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// FollowKey calls changed with every version of key written after
// revision rev, and with nil when the key is deleted, until ctx ends,
// changed returns an error (which FollowKey returns), or the watch fails
// for another reason than compaction.
//
// rev is the store's revision as of the caller's read of key (a Get's
// Header.Revision), and existed says whether that read found it. Not the
// key's ModRevision: a key written once (the cluster's configuration, its
// CRL) keeps an old ModRevision that the consensus service's compactor
// passes a few minutes later, and a watch from there would fail forever.
//
//	read key ──► rev ──► watch key from rev+1 ──► changed(each version)
//	                         │ compacted (a slow start between the read
//	                         ▼ and the watch, a long-lived watch resumed)
//	                     read key again ──► changed(it) if newer than the
//	                     last version seen, or nil if it went ──► watch on
//
// Across a compaction only the latest version is certain to be seen:
// what a follower of one key's current value needs.
func FollowKey(ctx context.Context, kv clientv3.KV, w clientv3.Watcher, key string, rev int64, existed bool, changed func(*mvccpb.KeyValue) error) error {
	// last is the ModRevision of the version changed saw last; a version
	// of at most rev was the caller's.
	last, exists := rev, existed
	for {
		compacted, err := followFrom(ctx, w, key, rev, func(kv *mvccpb.KeyValue, modRev int64) error {
			last, exists = modRev, kv != nil
			return changed(kv)
		})
		if err != nil || !compacted {
			return err
		}
		resp, err := kv.Get(ctx, key)
		if err != nil {
			return err
		}
		switch {
		case len(resp.Kvs) > 0 && resp.Kvs[0].ModRevision > last:
			last, exists = resp.Kvs[0].ModRevision, true
			if err := changed(resp.Kvs[0]); err != nil {
				return err
			}
		case len(resp.Kvs) == 0 && exists:
			last, exists = resp.Header.Revision, false
			if err := changed(nil); err != nil {
				return err
			}
		}
		rev = resp.Header.Revision
	}
}

// followFrom watches key after rev, passing each event on, until ctx
// ends (nil), changed fails, or the watch fails: compacted if rev+1 was
// compacted away.
func followFrom(ctx context.Context, w clientv3.Watcher, key string, rev int64, changed func(kv *mvccpb.KeyValue, modRev int64) error) (compacted bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range w.Watch(ctx, key, clientv3.WithRev(rev+1)) {
		if wr.CompactRevision != 0 {
			return true, nil
		}
		if err := wr.Err(); err != nil {
			return false, err
		}
		for _, ev := range wr.Events {
			kv := ev.Kv
			if ev.Type == clientv3.EventTypeDelete {
				kv = nil
			}
			if err := changed(kv, ev.Kv.ModRevision); err != nil {
				return false, err
			}
		}
	}
	return false, ctx.Err()
}
