// Package podcidr keeps the cluster's pod CIDR allocations: one
// /layout.NodeCIDRMaskSize of layout.ClusterCIDR per node, in etcd (the
// curator's namespace), keyed by node name.
//
//	curator IssueCertificate ──Allocate──┐
//	                                     ▼
//	                     /kubernetes-ipam/pod-cidrs  (one key, compare-and-swap)
//	                                     ▲
//	API servers' node IPAM ──Allocate / Record──┘ ──► Node.spec.podCIDR
//
// Why one key for both: the curator hands a worker its CIDR with its
// certificates, so the worker configures its pod network before any API
// server serves, and the node IPAM sets the same CIDR on the Node the
// kubelet registers. A node registered again gets its CIDR back, and two
// allocators at once cannot hand one CIDR to two nodes.
package podcidr

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"

	clientv3 "go.etcd.io/etcd/client/v3"

	"plinth.dev/plinth/platform/layout"
)

// Key holds the allocations (Allocations, JSON).
const Key = "/kubernetes-ipam/pod-cidrs"

// Allocations are node name → CIDR.
type Allocations struct {
	Nodes map[string]string `json:"nodes"`
}

// Allocate returns node's CIDR, allocating the lowest free one if it has
// none yet. all are the allocations as written or read (for a caller
// that keeps them to skip known nodes).
func Allocate(ctx context.Context, kv clientv3.KV, node string) (cidr string, all map[string]string, err error) {
	return Update(ctx, kv, func(a *Allocations) (string, bool, error) {
		if c, ok := a.Nodes[node]; ok {
			return c, false, nil
		}
		c, err := Free(layout.ClusterCIDR, layout.NodeCIDRMaskSize, *a)
		if err != nil {
			return "", false, err
		}
		a.Nodes[node] = c
		return c, true, nil
	})
}

// Record makes cidr node's allocation (a CIDR the Node already has, set
// before these allocations existed), so it is never handed out again.
func Record(ctx context.Context, kv clientv3.KV, node, cidr string) (map[string]string, error) {
	_, all, err := Update(ctx, kv, func(a *Allocations) (string, bool, error) {
		if a.Nodes[node] == cidr {
			return cidr, false, nil
		}
		a.Nodes[node] = cidr
		return cidr, true, nil
	})
	return all, err
}

// Update applies change to the allocations in etcd (compare-and-swap,
// retried when another allocator changed them meanwhile) and returns the
// CIDR change names and the allocations after it; change says whether it
// changed anything.
func Update(ctx context.Context, kv clientv3.KV, change func(*Allocations) (string, bool, error)) (string, map[string]string, error) {
	for range 10 {
		resp, err := kv.Get(ctx, Key)
		if err != nil {
			return "", nil, err
		}
		a := Allocations{Nodes: map[string]string{}}
		var rev int64
		if len(resp.Kvs) > 0 {
			if err := json.Unmarshal(resp.Kvs[0].Value, &a); err != nil {
				return "", nil, fmt.Errorf("%s: %w", Key, err)
			}
			rev = resp.Kvs[0].ModRevision
			if a.Nodes == nil {
				a.Nodes = map[string]string{}
			}
		}
		c, changed, err := change(&a)
		if err != nil {
			return "", nil, err
		}
		if changed {
			b, _ := json.Marshal(&a)
			txn, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(Key), "=", rev)).
				Then(clientv3.OpPut(Key, string(b))).Commit()
			if err != nil {
				return "", nil, err
			}
			if !txn.Succeeded {
				continue
			}
		}
		return c, a.Nodes, nil
	}
	return "", nil, errors.New("pod CIDRs: the allocations kept changing")
}

// Free is the lowest /size of cluster that a does not hold.
func Free(cluster string, size int, a Allocations) (string, error) {
	_, n, err := net.ParseCIDR(cluster)
	if err != nil {
		return "", err
	}
	ones, bits := n.Mask.Size()
	if bits != 32 || size < ones || size > 30 {
		return "", fmt.Errorf("pod CIDRs of /%d in %s", size, cluster)
	}
	taken := map[string]bool{}
	for _, c := range a.Nodes {
		taken[c] = true
	}
	base := binary.BigEndian.Uint32(n.IP.To4())
	for i := uint32(0); i < 1<<(size-ones); i++ {
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, base+i<<(32-size))
		c := (&net.IPNet{IP: ip, Mask: net.CIDRMask(size, 32)}).String()
		if !taken[c] {
			return c, nil
		}
	}
	return "", fmt.Errorf("no pod CIDR left in %s (/%d each)", cluster, size)
}
