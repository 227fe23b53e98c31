package consensus

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

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

	sock := filepath.Join(t.TempDir(), "k8s.sock")
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go st.ServeKubernetes(pctx, sock)
	var cl *clientv3.Client
	eventually(t, 10*time.Second, "endpoint up", func() error {
		var err error
		cl, err = clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + sock}, DialTimeout: time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		_, err = cl.Get(ctx, "registry/pods/x")
		if err != nil {
			cl.Close()
		}
		return err
	})
	defer cl.Close()

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
