package consensus

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/platform/logtree"
)

// TestRecoverInterceptors: a panicking handler becomes codes.Internal,
// logged, and the process goes on.
func TestRecoverInterceptors(t *testing.T) {
	lt := logtree.New(100)
	log := lt.Logger("test")
	_, err := recoverUnary(log)(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/etcdserverpb.KV/Txn"},
		func(context.Context, any) (any, error) { panic("boom") })
	if status.Code(err) != codes.Internal {
		t.Errorf("unary: %v, want Internal", err)
	}
	err = recoverStream(log)(nil, nil, &grpc.StreamServerInfo{FullMethod: "/etcdserverpb.Watch/Watch"},
		func(any, grpc.ServerStream) error { panic("boom") })
	if status.Code(err) != codes.Internal {
		t.Errorf("stream: %v, want Internal", err)
	}
	// A handler that does not panic is left alone.
	resp, err := recoverUnary(log)(context.Background(), nil, &grpc.UnaryServerInfo{},
		func(context.Context, any) (any, error) { return "ok", nil })
	if resp != "ok" || err != nil {
		t.Errorf("unary without panic: %v, %v", resp, err)
	}
	if !logged(lt, "panic in Kubernetes endpoint handler") {
		t.Error("panic not logged")
	}
}

// TestValidateTxn: what is refused before it reaches the conversion (which
// panics on an op without request) or etcd, including what only a Go
// caller can build (nil messages).
func TestValidateTxn(t *testing.T) {
	putOp := func(lease int64) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k"), Lease: lease}}}
	}
	txnOp := func(r *pb.TxnRequest) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: r}}
	}
	for name, tc := range map[string]struct {
		r      *pb.TxnRequest
		ok     bool
		leases []int64
	}{
		"empty txn":          {r: &pb.TxnRequest{}, ok: true},
		"nil txn":            {r: nil},
		"put and range":      {r: &pb.TxnRequest{Success: []*pb.RequestOp{putOp(0), {Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}}}}, ok: true},
		"leases collected":   {r: &pb.TxnRequest{Success: []*pb.RequestOp{putOp(7)}, Failure: []*pb.RequestOp{txnOp(&pb.TxnRequest{Success: []*pb.RequestOp{putOp(9)}})}}, ok: true, leases: []int64{7, 9}},
		"empty op":           {r: &pb.TxnRequest{Success: []*pb.RequestOp{{}}}},
		"nil op":             {r: &pb.TxnRequest{Failure: []*pb.RequestOp{nil}}},
		"nil put":            {r: &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{}}}}},
		"nil range":          {r: &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{}}}}},
		"nil delete":         {r: &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{}}}}},
		"nil nested txn":     {r: &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{}}}}},
		"nested empty op":    {r: &pb.TxnRequest{Success: []*pb.RequestOp{txnOp(&pb.TxnRequest{Failure: []*pb.RequestOp{{}}})}}},
		"nil compare":        {r: &pb.TxnRequest{Compare: []*pb.Compare{nil}}},
		"compare ok":         {r: &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("k"), Target: pb.Compare_VALUE, TargetUnion: &pb.Compare_Value{}}}}, ok: true},
		"compare no union":   {r: &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("k"), Target: pb.Compare_LEASE}}}, ok: true},
		"compare bad target": {r: &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("k"), Target: -1}}}},
		"compare bad result": {r: &pb.TxnRequest{Compare: []*pb.Compare{{Key: []byte("k"), Result: 4}}}},
		"too deep":           {r: deepTxn(maxTxnDepth + 1)},
		"deep enough":        {r: deepTxn(maxTxnDepth), ok: true},
	} {
		var leases []int64
		err := validateTxn(tc.r, 0, &leases)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", name, err)
		case !tc.ok && status.Code(err) != codes.InvalidArgument:
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		case tc.ok && len(leases) != len(tc.leases):
			t.Errorf("%s: leases %v, want %v", name, leases, tc.leases)
		}
	}
}

// TestKubeLeaseBookkeeping: granted leases are remembered until their
// expiry (plus grace), extended by keep-alives, and dropped on revoke,
// expiry and a zero TTL, so that the set stays as small as the set of
// live leases.
func TestKubeLeaseBookkeeping(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newKubeLease(nil, kubernetesPrefix)
	l.now = func() time.Time { return now }

	l.remember(1, 10)
	l.remember(2, 100)
	if !l.mine(1) || !l.mine(2) || l.mine(3) {
		t.Fatal("granted leases not remembered")
	}
	now = now.Add(10*time.Second + leaseGrace)
	if l.mine(1) || !l.mine(2) {
		t.Error("lease 1 not expired after its TTL and the grace, or lease 2 too")
	}
	l.extend(2, 1000)
	l.extend(3, 1000) // not ours: stays not ours
	now = now.Add(500 * time.Second)
	if !l.mine(2) || l.mine(3) {
		t.Error("keep-alive did not extend lease 2, or made 3 ours")
	}
	l.prune()
	if _, ok := l.granted[1]; ok || len(l.granted) != 1 {
		t.Errorf("after prune: %v", l.granted)
	}
	l.extend(2, 0)
	if l.mine(2) {
		t.Error("a lease that is gone (TTL 0) still ours")
	}
	l.remember(4, 10)
	l.forget(4)
	if len(l.granted) != 0 {
		t.Errorf("after forget: %v", l.granted)
	}
	// Grants alone prune once the map grows: expired leases do not pile
	// up between sweeps.
	for i := range int64(10 * minPruneAt) {
		l.remember(100+i, 1)
		now = now.Add(time.Second)
	}
	if n := len(l.granted); n > 2*minPruneAt+int(leaseGrace/time.Second)+2 {
		t.Errorf("%d leases remembered, most of them expired", n)
	}
	// etcd's longest TTL does not overflow the expiry.
	l.remember(5, 9_000_000_000)
	if !l.mine(5) {
		t.Error("a lease with etcd's longest TTL is not ours")
	}
}
