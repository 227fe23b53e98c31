package consensus

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// The fuzz input is a sequence of requests to the Kubernetes endpoint,
// each: one byte choosing the RPC, two bytes (little endian) of length,
// and that many bytes of the request's protobuf encoding (what does not
// unmarshal is sent as an empty request).
const (
	fuzzRange byte = iota
	fuzzPut
	fuzzDelete
	fuzzTxn
	fuzzCompact
	fuzzLeaseGrant
	fuzzLeaseRevoke
	fuzzLeaseTTL
	fuzzLeaseLeases
	fuzzKeepAlive
	fuzzWatch
	fuzzStatus
	fuzzRPCs
)

// fuzzMaxRequests bounds the requests per input, so that each runs fast.
const fuzzMaxRequests = 16

func fuzzEncode(rpc byte, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	out := []byte{rpc, 0, 0}
	binary.LittleEndian.PutUint16(out[1:], uint16(len(b)))
	return append(out, b...)
}

// FuzzKubernetesEndpoint sends arbitrary sequences of KV, Txn, Lease,
// Watch and Status requests through the Kubernetes endpoint of one
// member (started once for all inputs). After each sequence the endpoint
// still answers, the member still runs, and no key outside /kubernetes/
// changed (the curator's leased key among them: its lease survived).
func FuzzKubernetesEndpoint(f *testing.F) {
	ctx := context.Background()
	a := newMember(f, "node-a")
	a.start(nil)
	st := a.running(time.Minute)
	cur, err := st.CuratorClient()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { cur.Close() })
	curLease, err := cur.Grant(ctx, 3600)
	if err != nil {
		f.Fatal(err)
	}
	if _, err := cur.Put(ctx, "leader", "a", clientv3.WithLease(curLease.ID)); err != nil {
		f.Fatal(err)
	}
	_, conn := serveKube(f, ctx, st)
	before := outsideKubernetes(f, ctx, st)

	put := func(k, v string, lease int64) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k), Value: []byte(v), Lease: lease}}}
	}
	seeds := [][][]byte{
		{fuzzEncode(fuzzPut, &pb.PutRequest{Key: []byte("registry/pods/a"), Value: []byte("pod")}),
			fuzzEncode(fuzzRange, &pb.RangeRequest{Key: []byte("registry/"), RangeEnd: []byte("registry0")})},
		{fuzzEncode(fuzzTxn, &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: []byte("registry/pods/a"), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: 0}}},
			Success: []*pb.RequestOp{put("registry/pods/a", "new", 0)},
			Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("registry/pods/a")}}}},
		})},
		{fuzzEncode(fuzzTxn, &pb.TxnRequest{Success: []*pb.RequestOp{{}}})},
		{fuzzEncode(fuzzLeaseGrant, &pb.LeaseGrantRequest{TTL: 60}),
			fuzzEncode(fuzzKeepAlive, &pb.LeaseKeepAliveRequest{ID: int64(curLease.ID)}),
			fuzzEncode(fuzzLeaseRevoke, &pb.LeaseRevokeRequest{ID: int64(curLease.ID)}),
			fuzzEncode(fuzzPut, &pb.PutRequest{Key: []byte("x"), Lease: int64(curLease.ID)})},
		{fuzzEncode(fuzzWatch, &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("registry/"), RangeEnd: []byte{0}, ProgressNotify: true}}}),
			fuzzEncode(fuzzWatch, &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})},
		{fuzzEncode(fuzzDelete, &pb.DeleteRangeRequest{Key: []byte{0}, RangeEnd: []byte{0}}),
			fuzzEncode(fuzzCompact, &pb.CompactionRequest{Revision: 1}),
			fuzzEncode(fuzzLeaseLeases, &pb.LeaseLeasesRequest{}),
			fuzzEncode(fuzzLeaseTTL, &pb.LeaseTimeToLiveRequest{ID: int64(curLease.ID), Keys: true}),
			fuzzEncode(fuzzStatus, &pb.StatusRequest{})},
	}
	for _, s := range seeds {
		f.Add(bytes.Join(s, nil))
	}

	kv := pb.NewKVClient(conn)
	f.Fuzz(func(t *testing.T, data []byte) {
		for n := 0; len(data) >= 3 && n < fuzzMaxRequests; n++ {
			rpc := data[0] % fuzzRPCs
			size := min(int(binary.LittleEndian.Uint16(data[1:3])), len(data)-3)
			msg := data[3 : 3+size]
			data = data[3+size:]
			fuzzRequest(ctx, conn, rpc, msg)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := kv.Range(rctx, &pb.RangeRequest{Key: []byte("registry/")}); err != nil {
			t.Fatalf("the endpoint no longer answers a Range: %v", err)
		}
		for _, s := range a.sup.Snapshot() {
			if s.Restarts > 0 {
				t.Fatalf("%s restarted: %s", s.DN, s.LastErr)
			}
		}
		after := outsideKubernetes(t, ctx, st)
		for k, v := range before {
			if after[k] != v {
				t.Errorf("key %q outside %s: %s, was %s", k, kubernetesPrefix, after[k], v)
			}
		}
		for k, v := range after {
			if _, ok := before[k]; !ok {
				t.Errorf("new key %q outside %s: %s", k, kubernetesPrefix, v)
			}
		}
	})
}

// fuzzRequest sends one request; its answer does not matter, only that
// the endpoint and the member survive it.
func fuzzRequest(ctx context.Context, conn *grpc.ClientConn, rpc byte, msg []byte) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	kv, lease := pb.NewKVClient(conn), pb.NewLeaseClient(conn)
	decode := func(m proto.Message) {
		if proto.Unmarshal(msg, m) != nil {
			proto.Reset(m)
		}
	}
	switch rpc {
	case fuzzRange:
		r := &pb.RangeRequest{}
		decode(r)
		kv.Range(ctx, r)
	case fuzzPut:
		r := &pb.PutRequest{}
		decode(r)
		kv.Put(ctx, r)
	case fuzzDelete:
		r := &pb.DeleteRangeRequest{}
		decode(r)
		kv.DeleteRange(ctx, r)
	case fuzzTxn:
		r := &pb.TxnRequest{}
		decode(r)
		kv.Txn(ctx, r)
	case fuzzCompact:
		r := &pb.CompactionRequest{}
		decode(r)
		kv.Compact(ctx, r)
	case fuzzLeaseGrant:
		r := &pb.LeaseGrantRequest{}
		decode(r)
		lease.LeaseGrant(ctx, r)
	case fuzzLeaseRevoke:
		r := &pb.LeaseRevokeRequest{}
		decode(r)
		lease.LeaseRevoke(ctx, r)
	case fuzzLeaseTTL:
		r := &pb.LeaseTimeToLiveRequest{}
		decode(r)
		lease.LeaseTimeToLive(ctx, r)
	case fuzzLeaseLeases:
		r := &pb.LeaseLeasesRequest{}
		decode(r)
		lease.LeaseLeases(ctx, r)
	case fuzzKeepAlive:
		r := &pb.LeaseKeepAliveRequest{}
		decode(r)
		if s, err := lease.LeaseKeepAlive(ctx); err == nil {
			if s.Send(r) == nil {
				s.Recv()
			}
			s.CloseSend()
		}
	case fuzzWatch:
		r := &pb.WatchRequest{}
		decode(r)
		// A watch may well wait for ever (a future revision): one answer,
		// or a short while, is enough to have had it handled.
		wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer wcancel()
		if s, err := pb.NewWatchClient(conn).Watch(wctx); err == nil {
			if s.Send(r) == nil {
				s.Recv()
			}
		}
	case fuzzStatus:
		r := &pb.StatusRequest{}
		decode(r)
		pb.NewMaintenanceClient(conn).Status(ctx, r)
	}
}

// outsideKubernetes describes every key outside the Kubernetes prefix
// (value, revisions, lease), as the member itself sees them.
func outsideKubernetes(tb testing.TB, ctx context.Context, st *Status) map[string]string {
	tb.Helper()
	keys := map[string]string{}
	for _, r := range [][2]string{{"\x00", kubernetesPrefix}, {clientv3.GetPrefixRangeEnd(kubernetesPrefix), "\x00"}} {
		resp, err := st.be.Get(ctx, r[0], clientv3.WithRange(r[1]))
		if err != nil {
			tb.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			keys[string(kv.Key)] = fmt.Sprintf("%x (mod %d, create %d, version %d, lease %x)", sha256.Sum256(kv.Value), kv.ModRevision, kv.CreateRevision, kv.Version, kv.Lease)
		}
	}
	if len(keys) == 0 {
		tb.Fatal("no keys outside the Kubernetes prefix: the snapshot is broken")
	}
	return keys
}
