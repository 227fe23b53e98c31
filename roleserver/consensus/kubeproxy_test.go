package consensus

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// serveKube runs ServeKubernetes for this test's UID until the test ends
// and returns an etcd client and a raw gRPC connection (for requests the
// client cannot make) to it.
func serveKube(tb testing.TB, ctx context.Context, st *Status) (*clientv3.Client, *grpc.ClientConn) {
	tb.Helper()
	sock := filepath.Join(tb.TempDir(), "k8s.sock")
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		st.ServeKubernetes(pctx, sock, os.Getuid())
	}()
	tb.Cleanup(func() { cancel(); <-done })
	var cl *clientv3.Client
	eventually(tb, 10*time.Second, "endpoint up", func() error {
		var err error
		cl, err = clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + sock}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		_, err = cl.Get(ctx, "registry/")
		if err != nil {
			cl.Close()
		}
		return err
	})
	tb.Cleanup(func() { cl.Close() })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	return cl, conn
}

// TestKubernetesEndpoint: the API server's etcd endpoint sees and writes
// only /kubernetes/, cannot touch another namespace's lease (the curator
// leader's), and has no Snapshot of the whole store.
func TestKubernetesEndpoint(t *testing.T) {
	ctx := ctxTimeout(t, 2*time.Minute)
	a := newMember(t, "node-a")
	a.start(nil)
	st := a.running(time.Minute)
	if err := a.sup.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	cur, k8s := namespacedClients(t, st)
	// The curator's leadership key, on a lease, as the curator keeps it.
	curLease, err := cur.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cur.Put(ctx, "leader", "a", clientv3.WithLease(curLease.ID)); err != nil {
		t.Fatal(err)
	}
	mustPut(t, ctx, k8s, "registry/pods/x", "pod")

	cl, _ := serveKube(t, ctx, st)

	// Only /kubernetes/ is there, without its prefix.
	resp, err := cl.Get(ctx, "", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != "registry/pods/x" {
		t.Fatalf("the endpoint sees %v", resp.Kvs)
	}
	for _, k := range []string{"/curator/leader", "../curator/leader", "\x00"} {
		if r, err := cl.Get(ctx, k); err != nil || len(r.Kvs) != 0 {
			t.Errorf("Get %q = %v, %v", k, r.Kvs, err)
		}
	}
	if _, err := cl.Put(ctx, "/curator/leader", "evil"); err != nil {
		t.Fatal(err)
	}
	if v, _ := get(ctx, cur, "leader"); v != "a" {
		t.Fatalf("a write through the endpoint reached the curator's key: %q", v)
	}
	// Another namespace's lease: neither revoked, nor kept alive, nor listed.
	if _, err := cl.Revoke(ctx, curLease.ID); status.Code(err) != codes.PermissionDenied {
		t.Errorf("revoking the curator's lease: %v", err)
	}
	if v, _ := get(ctx, cur, "leader"); v != "a" {
		t.Fatal("the curator's leased key is gone")
	}
	if _, err := cl.Leases(ctx); status.Code(err) != codes.PermissionDenied {
		t.Errorf("listing leases: %v", err)
	}
	// Its own leases work.
	own, err := cl.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Put(ctx, "events/e", "1", clientv3.WithLease(own.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.KeepAliveOnce(ctx, own.ID); err != nil {
		t.Errorf("keep-alive of its own lease: %v", err)
	}
	if _, err := cl.Revoke(ctx, own.ID); err != nil {
		t.Errorf("revoking its own lease: %v", err)
	}
	// Watches are confined, and progress requests are answered (the API
	// server's consistent reads from its cache wait for them).
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := cl.Watch(wctx, "registry/", clientv3.WithPrefix())
	mustPut(t, ctx, cur, "registry/x", "curator")
	mustPut(t, ctx, k8s, "registry/pods/y", "pod")
	if wr := <-wch; len(wr.Events) != 1 || string(wr.Events[0].Kv.Key) != "registry/pods/y" {
		t.Fatalf("watch through the endpoint: %+v", wr.Events)
	}
	if err := cl.RequestProgress(wctx); err != nil {
		t.Fatal(err)
	}
	select {
	case wr := <-wch:
		if !wr.IsProgressNotify() {
			t.Fatalf("after a progress request: %+v", wr)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to a progress request")
	}
	// Status works (the API server asks), a snapshot of the store does not.
	if _, err := cl.Status(ctx, cl.Endpoints()[0]); err != nil {
		t.Errorf("Status: %v", err)
	}
	rc, err := cl.Snapshot(ctx)
	if err == nil {
		buf := make([]byte, 1)
		_, err = rc.Read(buf)
		rc.Close()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("Snapshot: %v, want Unimplemented", err)
	}
}

// TestKubernetesEndpointRefusals: each request the endpoint must refuse,
// with its status code, and the endpoint and member still serving after
// them all.
func TestKubernetesEndpointRefusals(t *testing.T) {
	ctx := ctxTimeout(t, 2*time.Minute)
	a := newMember(t, "node-a")
	a.start(nil)
	st := a.running(time.Minute)
	cur, k8s := namespacedClients(t, st)
	// The curator leader's lease and key, and a lease of the curator's
	// that has no key yet.
	curLease, err := cur.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cur.Put(ctx, "leader", "a", clientv3.WithLease(curLease.ID)); err != nil {
		t.Fatal(err)
	}
	bareLease, err := cur.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	cl, conn := serveKube(t, ctx, st)
	kv, lease := pb.NewKVClient(conn), pb.NewLeaseClient(conn)
	foreign := []int64{int64(curLease.ID), int64(bareLease.ID)}

	want := func(t *testing.T, what string, err error, code codes.Code) {
		t.Helper()
		if status.Code(err) != code {
			t.Errorf("%s: %v, want %v", what, err, code)
		}
	}
	put := func(k string) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k)}}}
	}
	t.Run("txn", func(t *testing.T) {
		for name, r := range map[string]*pb.TxnRequest{
			"empty-success-op": {Success: []*pb.RequestOp{put("a"), {}}},
			"empty-failure-op": {Failure: []*pb.RequestOp{{}}},
			"nested-empty-op": {Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
				Failure: []*pb.RequestOp{put("b"), {}},
			}}}}},
			"unknown-compare-target": {Compare: []*pb.Compare{{Key: []byte("a"), Target: 42}}, Success: []*pb.RequestOp{put("a")}},
			"unknown-compare-result": {Compare: []*pb.Compare{{Key: []byte("a"), Result: 42, Target: pb.Compare_MOD, TargetUnion: &pb.Compare_ModRevision{}}}},
			"compare-kinds-differ":   {Compare: []*pb.Compare{{Key: []byte("a"), Target: pb.Compare_MOD, TargetUnion: &pb.Compare_Value{Value: []byte("x")}}}},
			"too-deep":               deepTxn(maxTxnDepth + 2),
		} {
			_, err := kv.Txn(ctx, r)
			want(t, name, err, codes.InvalidArgument)
		}
		if r, err := get(ctx, k8s, "a"); err == nil {
			t.Errorf("a refused transaction wrote: %q", r)
		}
		// Nested within the limit is fine.
		if _, err := kv.Txn(ctx, deepTxn(maxTxnDepth)); err != nil {
			t.Errorf("nested txn: %v", err)
		}
	})
	t.Run("compact", func(t *testing.T) {
		_, err := cl.Compact(ctx, 1)
		want(t, "Compact", err, codes.PermissionDenied)
	})
	t.Run("range-stream", func(t *testing.T) {
		s, err := kv.RangeStream(ctx, &pb.RangeRequest{Key: []byte("a")})
		if err == nil {
			_, err = s.Recv()
		}
		want(t, "RangeStream", err, codes.Unimplemented)
	})
	t.Run("lease-grant-with-id", func(t *testing.T) {
		_, err := lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{ID: 4242, TTL: 60})
		want(t, "LeaseGrant with ID", err, codes.InvalidArgument)
	})
	t.Run("lease-leases", func(t *testing.T) {
		_, err := lease.LeaseLeases(ctx, &pb.LeaseLeasesRequest{})
		want(t, "LeaseLeases", err, codes.PermissionDenied)
	})
	t.Run("foreign-lease", func(t *testing.T) {
		for _, id := range foreign {
			_, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("x"), Lease: id})
			want(t, "Put with the curator's lease", err, codes.PermissionDenied)
			_, err = kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{
				Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("x"), Lease: id}}}},
			}}}}})
			want(t, "nested Txn Put with the curator's lease", err, codes.PermissionDenied)
			_, err = lease.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: id})
			want(t, "LeaseRevoke", err, codes.PermissionDenied)
			_, err = lease.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: id, Keys: true})
			want(t, "LeaseTimeToLive", err, codes.PermissionDenied)
			s, err := lease.LeaseKeepAlive(ctx)
			if err == nil {
				if err = s.Send(&pb.LeaseKeepAliveRequest{ID: id}); err == nil {
					_, err = s.Recv()
				}
			}
			want(t, "LeaseKeepAlive", err, codes.PermissionDenied)
		}
		if r, err := k8s.Get(ctx, "x"); err != nil || len(r.Kvs) != 0 {
			t.Errorf("a put on a foreign lease wrote: %v, %v", r, err)
		}
		if v, err := get(ctx, cur, "leader"); err != nil || v != "a" {
			t.Errorf("the curator's leased key: %q, %v", v, err)
		}
		for _, id := range foreign {
			if ttl, err := cur.TimeToLive(ctx, clientv3.LeaseID(id)); err != nil || ttl.TTL <= 0 {
				t.Errorf("curator lease %x: %v, %v", id, ttl, err)
			}
		}
	})
	t.Run("own-lease", func(t *testing.T) {
		own, err := lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Txn(ctx, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("leased"), Lease: own.ID}}}}}); err != nil {
			t.Fatalf("Put on its own lease: %v", err)
		}
		s, err := lease.LeaseKeepAlive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := s.Send(&pb.LeaseKeepAliveRequest{ID: own.ID}); err != nil {
				t.Fatal(err)
			}
			if r, err := s.Recv(); err != nil || r.ID != own.ID || r.TTL <= 0 {
				t.Fatalf("keep-alive: %v, %v", r, err)
			}
		}
		s.CloseSend()
		ttl, err := lease.LeaseTimeToLive(ctx, &pb.LeaseTimeToLiveRequest{ID: own.ID, Keys: true})
		if err != nil || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != "leased" {
			t.Errorf("time-to-live: %v, %v; want the key without prefix", ttl, err)
		}
		if _, err := lease.LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: own.ID}); err != nil {
			t.Errorf("revoking its own lease: %v", err)
		}
		// Gone: a keep-alive answers TTL 0, as etcd's does.
		if _, err := cl.KeepAliveOnce(ctx, clientv3.LeaseID(own.ID)); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			t.Errorf("keep-alive of a revoked lease: %v", err)
		}
		// etcd's error codes and messages survive the endpoint.
		if _, err := cl.Get(ctx, "a", clientv3.WithRev(1<<40)); !errors.Is(err, rpctypes.ErrFutureRev) {
			t.Errorf("Get of a future revision: %v, want ErrFutureRev", err)
		}
	})
	t.Run("after-restart", func(t *testing.T) {
		// A second endpoint (as after a restart) has not granted the
		// first one's leases: it takes those with keys all in the
		// namespace, not a bare one.
		withKey, err := lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, &pb.PutRequest{Key: []byte("k"), Lease: withKey.ID}); err != nil {
			t.Fatal(err)
		}
		bare, err := lease.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: 60})
		if err != nil {
			t.Fatal(err)
		}
		cl2, _ := serveKube(t, ctx, st)
		if _, err := cl2.KeepAliveOnce(ctx, clientv3.LeaseID(withKey.ID)); err != nil {
			t.Errorf("keep-alive of a namespace lease through another endpoint: %v", err)
		}
		if _, err := cl2.KeepAliveOnce(ctx, clientv3.LeaseID(bare.ID)); status.Code(err) != codes.PermissionDenied {
			t.Errorf("keep-alive of a bare lease through another endpoint: %v", err)
		}
	})
	// Still serving, the member too.
	mustPut(t, ctx, cl, "still", "here")
	if v, err := get(ctx, k8s, "still"); err != nil || v != "here" {
		t.Errorf("after the refusals: %q, %v", v, err)
	}
}

// deepTxn nests n transactions, each with one put of its own key.
func deepTxn(n int) *pb.TxnRequest {
	r := &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("deep")}}}}}
	for range n {
		r = &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestTxn{RequestTxn: r}}}}
	}
	return r
}
