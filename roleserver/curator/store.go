package curator

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/consensus/client"
)

// Keys in the curator's etcd namespace (consensus Status.CuratorClient).
// Every record is its own key so that a watcher of node records is not
// woken by heartbeats, and so that secrets (CA key, unlock keys) are never
// part of a record that is streamed to anybody.
const (
	keyCACert        = "/cluster/ca.pem"        // cluster CA certificate, PEM
	keyCAKey         = "/cluster/ca-key.pem"    // cluster CA key, PEM
	keyOwnerKey      = "/cluster/owner-key"     // owner ed25519 public key, raw
	keyTicket        = "/cluster/ticket"        // register ticket, raw
	keyConfiguration = "/cluster/configuration" // clusterpb.ClusterConfiguration
	keyLeader        = "/leader"                // clusterpb.GetCurrentLeaderResponse{id, port}, leased
	keyLeaderSince   = "/leader-since"          // election time, unix nanos (decimal), same lease

	prefixNodes      = "/nodes/"               // + node ID: clusterpb.Node without health
	prefixJoinKeys   = "/join-keys/"           // + hex(join public key): node ID
	prefixUnlockKeys = "/cluster-unlock-keys/" // + node ID: 32 raw bytes
	prefixHeartbeats = "/heartbeats/"          // + node ID: unix nanos (decimal)
)

func nodeKey(id string) string                { return prefixNodes + id }
func joinKeyKey(pub ed25519.PublicKey) string { return prefixJoinKeys + hex.EncodeToString(pub) }
func unlockKeyKey(id string) string           { return prefixUnlockKeys + id }
func heartbeatKey(id string) string           { return prefixHeartbeats + id }
func formatNanos(n int64) string              { return strconv.FormatInt(n, 10) }
func parseNanos(b []byte) int64               { n, _ := strconv.ParseInt(string(b), 10, 64); return n }
func etcdErr(what string, err error) error {
	return status.Errorf(codes.Unavailable, "%s: etcd: %v", what, err)
}
func internalErr(what string, err error) error {
	return status.Errorf(codes.Internal, "%s: %v", what, err)
}
func isStatus(err error) bool { _, ok := status.FromError(err); return ok }

// getValue reads one key; nil, 0 if it does not exist. The revision is
// the key's ModRevision, for a compare-and-swap.
func getValue(ctx context.Context, kv clientv3.KV, key string) ([]byte, int64, error) {
	v, modRev, _, err := getValueAt(ctx, kv, key)
	return v, modRev, err
}

// getValueAt is getValue that also returns the store's revision as of
// the read: where a watch of the key starts (client.FollowKey), not its
// ModRevision, which the compactor passes once the key is old.
func getValueAt(ctx context.Context, kv clientv3.KV, key string) (v []byte, modRev, storeRev int64, err error) {
	resp, err := kv.Get(ctx, key)
	if err != nil {
		return nil, 0, 0, err
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, resp.Header.Revision, nil
	}
	return resp.Kvs[0].Value, resp.Kvs[0].ModRevision, resp.Header.Revision, nil
}

// getNode reads a node record; nil, 0 if there is none. The revision is
// the record's ModRevision, for a compare-and-swap.
func getNode(ctx context.Context, kv clientv3.KV, id string) (*clusterpb.Node, int64, error) {
	v, rev, err := getValue(ctx, kv, nodeKey(id))
	if err != nil || v == nil {
		return nil, 0, err
	}
	n, err := unmarshalNode(v)
	return n, rev, err
}

func unmarshalNode(b []byte) (*clusterpb.Node, error) {
	n := &clusterpb.Node{}
	if err := proto.Unmarshal(b, n); err != nil {
		return nil, fmt.Errorf("curator: corrupt node record: %w", err)
	}
	return n, nil
}

// marshalNode stores a node without what is computed at read time.
func marshalNode(n *clusterpb.Node) (string, error) {
	c := proto.Clone(n).(*clusterpb.Node)
	c.Health = clusterpb.NodeHealth_NODE_HEALTH_UNSPECIFIED
	c.LastHeartbeatUnixNanos = 0
	b, err := proto.Marshal(c)
	return string(b), err
}

func loadCA(ctx context.Context, kv clientv3.KV) (*pki.CA, error) {
	resp, err := kv.Txn(ctx).Then(clientv3.OpGet(keyCACert), clientv3.OpGet(keyCAKey)).Commit()
	if err != nil {
		return nil, etcdErr("reading the cluster CA", err)
	}
	c, k := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(c) != 1 || len(k) != 1 {
		return nil, status.Error(codes.FailedPrecondition, "cluster CA missing from etcd: cluster not bootstrapped")
	}
	ca, err := pki.LoadCA(c[0].Value, k[0].Value)
	if err != nil {
		return nil, internalErr("loading the cluster CA", err)
	}
	return ca, nil
}

func loadConfiguration(ctx context.Context, kv clientv3.KV) (*clusterpb.ClusterConfiguration, error) {
	v, _, err := getValue(ctx, kv, keyConfiguration)
	if err != nil {
		return nil, etcdErr("reading the cluster configuration", err)
	}
	cfg := &clusterpb.ClusterConfiguration{}
	if err := proto.Unmarshal(v, cfg); err != nil {
		return nil, internalErr("corrupt cluster configuration", err)
	}
	return cfg, nil
}

// errNoChange makes updateNode return the record as it is, writing nothing.
var errNoChange = errors.New("no change")

// guard is a condition under which a write may happen: the leadership of
// the term that makes it (nil: any member may write).
type guard interface {
	cmps() []clientv3.Cmp
	lost() error
}

// updateNode is a compare-and-swap loop on one node record: fn gets the
// current record (nil if there is none) to modify in place and may return
// extra operations to commit in the same transaction, errNoChange, or an
// error to abort with. The record is written only if neither it nor the
// guard changed meanwhile.
//
// extra comparisons must also hold; when they fail, fn runs again and is
// expected to notice why.
func updateNode(ctx context.Context, kv clientv3.KV, g guard, id string,
	fn func(n *clusterpb.Node) ([]clientv3.Op, error), extra ...clientv3.Cmp) (*clusterpb.Node, error) {
	for attempt := 0; attempt < 20; attempt++ {
		cur, rev, err := getNode(ctx, kv, id)
		if err != nil {
			if isStatus(err) {
				return nil, err
			}
			return nil, etcdErr("reading node "+id, err)
		}
		var n *clusterpb.Node
		if cur != nil {
			n = proto.Clone(cur).(*clusterpb.Node)
		}
		ops, err := fn(n)
		if errors.Is(err, errNoChange) {
			return cur, nil
		}
		if err != nil {
			return nil, err
		}
		if n == nil {
			return nil, status.Errorf(codes.Internal, "node %s: nothing to write", id)
		}
		val, err := marshalNode(n)
		if err != nil {
			return nil, internalErr("encoding node", err)
		}
		cmps := append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(nodeKey(id)), "=", rev)}, extra...)
		if g != nil {
			cmps = append(cmps, g.cmps()...)
		}
		resp, err := kv.Txn(ctx).If(cmps...).Then(append([]clientv3.Op{clientv3.OpPut(nodeKey(id), val)}, ops...)...).Commit()
		if err != nil {
			return nil, etcdErr("writing node "+id, err)
		}
		if resp.Succeeded {
			return n, nil
		}
		if g != nil {
			if err := g.lost(); err != nil {
				return nil, err
			}
		}
	}
	return nil, status.Errorf(codes.Aborted, "node %s kept changing while being updated; retry", id)
}

// listNodes returns every node record and the revision of the read.
func listNodes(ctx context.Context, kv clientv3.KV, opts ...clientv3.OpOption) ([]*clusterpb.Node, int64, error) {
	resp, err := kv.Get(ctx, prefixNodes, append([]clientv3.OpOption{clientv3.WithPrefix()}, opts...)...)
	if err != nil {
		return nil, 0, etcdErr("listing nodes", err)
	}
	out := make([]*clusterpb.Node, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		n, err := unmarshalNode(kv.Value)
		if err != nil {
			return nil, 0, internalErr(string(kv.Key), err)
		}
		out = append(out, n)
	}
	return out, resp.Header.Revision, nil
}

// storedHeartbeats returns the heartbeat times written by leaders.
func storedHeartbeats(ctx context.Context, kv clientv3.KV) (map[string]int64, error) {
	resp, err := kv.Get(ctx, prefixHeartbeats, clientv3.WithPrefix())
	if err != nil {
		return nil, etcdErr("reading heartbeats", err)
	}
	out := make(map[string]int64, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key[len(prefixHeartbeats):])] = parseNanos(kv.Value)
	}
	return out, nil
}

// DecommissionedNodes are the IDs of the nodes decommissioned in kv (the
// curator's namespace of a running consensus member): a controller node
// deletes what Kubernetes keeps of them (their local volumes).
func DecommissionedNodes(ctx context.Context, kv client.Namespaced) ([]string, error) {
	nodes, _, err := listNodes(ctx, kv)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range nodes {
		if n.GetState() == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
			out = append(out, n.GetId())
		}
	}
	return out, nil
}
