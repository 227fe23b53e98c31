package consensus

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// kubeKV is the KV service of the Kubernetes endpoint, on a namespaced KV.
// Not etcd's grpcproxy KV: its request conversion panics on a transaction
// op without a request, and its cache of serializable reads is only
// invalidated by writes through itself (not by other members' API
// servers). Its exported conversions are used, on validated requests
// only.
type kubeKV struct {
	// RangeStream stays Unimplemented: the API server falls back to Range.
	pb.UnimplementedKVServer
	kv     clientv3.KV // namespaced
	leases *kubeLease
}

// maxTxnDepth bounds the nesting of transactions: etcd bounds their ops
// per level but not their depth, and the API server never nests them.
const maxTxnDepth = 8

func (k *kubeKV) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	resp, err := k.kv.Do(ctx, grpcproxy.RangeRequestToOp(r))
	if err != nil {
		return nil, grpcError(err)
	}
	return (*pb.RangeResponse)(resp.Get()), nil
}

func (k *kubeKV) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := k.leases.checkAttach(ctx, r.Lease); err != nil {
		return nil, err
	}
	resp, err := k.kv.Do(ctx, grpcproxy.PutRequestToOp(r))
	if err != nil {
		return nil, grpcError(err)
	}
	return (*pb.PutResponse)(resp.Put()), nil
}

func (k *kubeKV) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	resp, err := k.kv.Do(ctx, grpcproxy.DelRequestToOp(r))
	if err != nil {
		return nil, grpcError(err)
	}
	return (*pb.DeleteRangeResponse)(resp.Del()), nil
}

func (k *kubeKV) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	var leases []int64
	if err := validateTxn(r, 0, &leases); err != nil {
		return nil, err
	}
	for _, id := range leases {
		if err := k.leases.checkAttach(ctx, id); err != nil {
			return nil, err
		}
	}
	resp, err := k.kv.Do(ctx, grpcproxy.TxnRequestToOp(r))
	if err != nil {
		return nil, grpcError(err)
	}
	return (*pb.TxnResponse)(resp.Txn()), nil
}

var errCompactRefused = status.Error(codes.PermissionDenied, "compaction is the consensus service's job (the API server must not compact: run it with a --etcd-compaction-interval longer than its uptime)")

// Compact is refused: a compaction is of the whole store, every
// namespace's history, and the consensus service already compacts
// periodically (baseConfig).
func (k *kubeKV) Compact(context.Context, *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	return nil, errCompactRefused
}

func invalid(msg string) error { return status.Error(codes.InvalidArgument, msg) }

// validateTxn checks what etcd's own checks let through, or panic on:
// every op has exactly one known, non-nil request (an unknown or empty one
// crashes the proxy's conversion and, nested, etcd's checks), and every
// compare a known target and result (an unknown result compares true).
// It collects the leases of the transaction's puts, for checkAttach.
func validateTxn(r *pb.TxnRequest, depth int, leases *[]int64) error {
	if r == nil {
		return invalid("empty transaction")
	}
	if depth > maxTxnDepth {
		return invalid("transactions nested too deeply")
	}
	for _, c := range r.Compare {
		if err := validateCompare(c); err != nil {
			return err
		}
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if err := validateOp(op, depth, leases); err != nil {
				return err
			}
		}
	}
	return nil
}

func validateOp(op *pb.RequestOp, depth int, leases *[]int64) error {
	if op == nil {
		return invalid("empty transaction op")
	}
	switch u := op.Request.(type) {
	case *pb.RequestOp_RequestRange:
		if u.RequestRange == nil {
			return invalid("empty range op")
		}
	case *pb.RequestOp_RequestPut:
		if u.RequestPut == nil {
			return invalid("empty put op")
		}
		if u.RequestPut.Lease != 0 {
			*leases = append(*leases, u.RequestPut.Lease)
		}
	case *pb.RequestOp_RequestDeleteRange:
		if u.RequestDeleteRange == nil {
			return invalid("empty delete op")
		}
	case *pb.RequestOp_RequestTxn:
		return validateTxn(u.RequestTxn, depth+1, leases)
	default:
		// nil (no request set) or a type this package does not know
		return invalid("transaction op without a known request")
	}
	return nil
}

func validateCompare(c *pb.Compare) error {
	if c == nil {
		return invalid("empty compare")
	}
	if _, ok := pb.Compare_CompareResult_name[int32(c.Result)]; !ok {
		return invalid("compare with an unknown result")
	}
	// The target union, if set, must be of the target's kind: etcd would
	// compare against zero instead.
	ok := false
	switch c.Target {
	case pb.Compare_VERSION:
		_, ok = c.TargetUnion.(*pb.Compare_Version)
	case pb.Compare_CREATE:
		_, ok = c.TargetUnion.(*pb.Compare_CreateRevision)
	case pb.Compare_MOD:
		_, ok = c.TargetUnion.(*pb.Compare_ModRevision)
	case pb.Compare_VALUE:
		_, ok = c.TargetUnion.(*pb.Compare_Value)
	case pb.Compare_LEASE:
		_, ok = c.TargetUnion.(*pb.Compare_Lease)
	default:
		return invalid("compare with an unknown target")
	}
	if !ok && c.TargetUnion != nil {
		return invalid("compare target and value of different kinds")
	}
	return nil
}
