package podcidr

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"

	"plinth.dev/plinth/roleserver/internal/testutil"
)

func TestFree(t *testing.T) {
	a := Allocations{Nodes: map[string]string{"a": "10.244.0.0/24", "b": "10.244.2.0/24"}}
	if c, err := Free("10.244.0.0/16", 24, a); err != nil || c != "10.244.1.0/24" {
		t.Errorf("got %q, %v; want the gap 10.244.1.0/24", c, err)
	}
	full := Allocations{Nodes: map[string]string{"a": "10.0.0.0/25", "b": "10.0.0.128/25"}}
	if c, err := Free("10.0.0.0/24", 25, full); err == nil {
		t.Errorf("a full range gave %q", c)
	}
	for _, bad := range []struct {
		cluster string
		size    int
	}{{"10.0.0.0/24", 16}, {"fd00::/64", 80}, {"nonsense", 24}} {
		if c, err := Free(bad.cluster, bad.size, Allocations{}); err == nil {
			t.Errorf("%s /%d: %q, no error", bad.cluster, bad.size, c)
		}
	}
}

// TestAllocate: against a real etcd, a node keeps its CIDR however often
// it asks (the curator with each certificate, the node IPAM with its
// Node), two nodes never share one, a recorded CIDR (the controller
// manager's, from before) is never handed out again, and two allocators
// at once (curator and IPAM, or two controllers) still give every node
// its own.
func TestAllocate(t *testing.T) {
	dir := t.TempDir()
	e, err := testutil.StartEtcd(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	kv := v3client.New(e.Server)
	defer kv.Close()
	ctx := context.Background()

	if _, err := Record(ctx, kv, "old", "10.244.0.0/24"); err != nil {
		t.Fatal(err)
	}
	a, _, err := Allocate(ctx, kv, "a")
	if err != nil || a == "10.244.0.0/24" {
		t.Fatalf("a: %q, %v (the recorded CIDR handed out again?)", a, err)
	}
	again, all, err := Allocate(ctx, kv, "a")
	if err != nil || again != a || all["a"] != a || all["old"] != "10.244.0.0/24" {
		t.Fatalf("a again: %q, %v, %v; want %q", again, all, err, a)
	}
	var wg sync.WaitGroup
	got := make([]string, 20)
	for i := range got {
		wg.Go(func() {
			c, _, err := Allocate(ctx, kv, fmt.Sprintf("n%d", i%10))
			if err != nil {
				t.Error(err)
			}
			got[i] = c
		})
	}
	wg.Wait()
	seen := map[string]int{}
	for i, c := range got {
		if j, ok := seen[c]; ok && j%10 != i%10 {
			t.Errorf("n%d and n%d share %s", i%10, j%10, c)
		}
		if c == a || c == "10.244.0.0/24" {
			t.Errorf("n%d got %s, which is taken", i%10, c)
		}
		seen[c] = i
		if _, n, err := net.ParseCIDR(c); err != nil || c != n.String() {
			t.Errorf("n%d: %q is not a CIDR", i%10, c)
		}
	}
	if len(seen) != 10 {
		t.Errorf("%d CIDRs for 10 nodes: %v", len(seen), got)
	}
}
