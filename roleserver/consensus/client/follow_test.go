package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"plinth.dev/plinth/roleserver/consensus/client"
	"plinth.dev/plinth/roleserver/internal/testutil"
)

// etcdClient reaches one embedded etcd, each test under keys of its own.
var etcdClient *clientv3.Client

func TestMain(m *testing.M) {
	os.Exit(testutil.MainWithEtcd(m, func(c *clientv3.Client) { etcdClient = c }))
}

// errSeen ends a FollowKey once the test saw what it waited for.
var errSeen = errors.New("seen")

// compactPast writes another key n times and compacts the store up to
// its current revision: every revision a watch could start from before
// is gone.
func compactPast(t *testing.T, ctx context.Context, key string) {
	t.Helper()
	var rev int64
	for i := range 3 {
		resp, err := etcdClient.Put(ctx, key+"/other", fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	if _, err := etcdClient.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
}

// read is what a follower does first: the key and the store's revision.
func read(t *testing.T, ctx context.Context, key string) (rev int64, existed bool) {
	t.Helper()
	resp, err := etcdClient.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision, len(resp.Kvs) > 0
}

// follow runs FollowKey until changed has seen want (nil: a deletion),
// and fails the test on anything else it sees first.
func follow(t *testing.T, ctx context.Context, key string, rev int64, existed bool, want *string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := client.FollowKey(ctx, etcdClient, etcdClient, key, rev, existed, func(kv *mvccpb.KeyValue) error {
		switch {
		case want == nil && kv == nil, want != nil && kv != nil && string(kv.Value) == *want:
			return errSeen
		case kv == nil:
			return errors.New("deleted, want " + *want)
		default:
			return fmt.Errorf("saw %q", kv.Value)
		}
	})
	if !errors.Is(err, errSeen) {
		t.Fatalf("FollowKey: %v", err)
	}
}

func ptr(s string) *string { return &s }

// TestFollowKeyAcrossCompaction: a follower whose read of a key was
// compacted away before it watched (what the configuration's followers
// met once the cluster ran longer than the compactor's interval: their
// watch from the key's old ModRevision failed forever) sees the key's
// next version; a version written between the read and the compaction
// it sees from its second read; a deletion likewise.
func TestFollowKeyAcrossCompaction(t *testing.T) {
	ctx := context.Background()
	key := "/" + t.Name()
	if _, err := etcdClient.Put(ctx, key, "v1"); err != nil {
		t.Fatal(err)
	}

	// Unchanged across the compaction: nothing to report until v2.
	rev, existed := read(t, ctx, key)
	compactPast(t, ctx, key)
	go func() {
		time.Sleep(200 * time.Millisecond)
		etcdClient.Put(ctx, key, "v2")
	}()
	follow(t, ctx, key, rev, existed, ptr("v2"))

	// Changed between the read and the compaction: the second read has it.
	rev, existed = read(t, ctx, key)
	if _, err := etcdClient.Put(ctx, key, "v3"); err != nil {
		t.Fatal(err)
	}
	compactPast(t, ctx, key)
	follow(t, ctx, key, rev, existed, ptr("v3"))

	// Deleted likewise.
	rev, existed = read(t, ctx, key)
	if _, err := etcdClient.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	compactPast(t, ctx, key)
	follow(t, ctx, key, rev, existed, nil)
}

// TestFollowKeyPassesEachVersion: without a compaction every version
// after the read comes, in order, and the follower's error ends it.
func TestFollowKeyPassesEachVersion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := "/" + t.Name()
	if _, err := etcdClient.Put(ctx, key, "v0"); err != nil {
		t.Fatal(err)
	}
	rev, existed := read(t, ctx, key)
	for _, v := range []string{"v1", "v2"} {
		if _, err := etcdClient.Put(ctx, key, v); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	err := client.FollowKey(ctx, etcdClient, etcdClient, key, rev, existed, func(kv *mvccpb.KeyValue) error {
		got = append(got, string(kv.Value))
		if len(got) == 2 {
			return errSeen
		}
		return nil
	})
	if !errors.Is(err, errSeen) || fmt.Sprint(got) != "[v1 v2]" {
		t.Fatalf("FollowKey: %v, saw %v, want [v1 v2]", err, got)
	}
}
