package consensus

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestCompactionProtocol: of two members' compactors, one compacts per
// round and the other adopts the key's version (and takes over in the
// next round); the API server's endpoint sees compact_rev_key with the
// compacted revision, as its watch cache needs, and a read below it fails
// with ErrCompacted (which the API server turns into 410 Gone).
func TestCompactionProtocol(t *testing.T) {
	ctx := ctxTimeout(t, 2*time.Minute)
	m := newMember(t, "node-a")
	m.start(nil)
	st := m.running(time.Minute)
	cl, _ := serveKube(t, ctx, st)

	put, err := cl.Put(ctx, "registry/pods/x", "1")
	if err != nil {
		t.Fatal(err)
	}
	var a, b compactionClock
	tick := func(c *compactionClock, want bool) int64 {
		t.Helper()
		rev, err := c.tick(ctx, st.be.KV)
		if err != nil {
			t.Fatal(err)
		}
		if (rev != 0) != want {
			t.Fatalf("compacted to %d, want a compaction: %v", rev, want)
		}
		return rev
	}
	// Round 1: nothing to compact yet; a wins the key, b adopts it.
	tick(&a, false)
	tick(&b, false)
	if a.version != 1 || b.version != 1 {
		t.Fatalf("versions after round 1: a %d, b %d", a.version, b.version)
	}
	if _, err := cl.Put(ctx, "registry/pods/x", "2"); err != nil {
		t.Fatal(err)
	}
	// Round 2: a compacts to its round-1 revision; b lost the race.
	rev := tick(&a, true)
	tick(&b, false)
	if rev <= put.Header.Revision {
		t.Fatalf("compacted to %d, not past the first put (%d)", rev, put.Header.Revision)
	}
	r, err := cl.Get(ctx, "compact_rev_key")
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("the API server's compact_rev_key: %v, %v", r, err)
	}
	if got := string(r.Kvs[0].Value); got != strconv.FormatInt(rev, 10) {
		t.Fatalf("compact_rev_key = %s, want %d", got, rev)
	}
	_, err = cl.Get(ctx, "registry/pods/x", clientv3.WithRev(put.Header.Revision))
	if !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("reading a compacted revision through the endpoint: %v, want ErrCompacted", err)
	}
	if v, err := get(ctx, cl, "registry/pods/x"); err != nil || v != "2" {
		t.Fatalf("the current value: %q, %v", v, err)
	}
	// Round 3: b, now in step, wins; a adopts (a member that stopped
	// compacting is replaced within a round).
	tick(&b, true)
	tick(&a, false)
	if a.version != 3 || b.version != 3 {
		t.Fatalf("versions after round 3: a %d, b %d", a.version, b.version)
	}
}
