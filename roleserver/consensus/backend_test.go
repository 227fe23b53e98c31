package consensus

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// dialEtcd reports whether an etcd client reaches a member at endpoint.
func dialEtcd(ctx context.Context, endpoint string) error {
	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = cl.Get(ctx, "x")
	return err
}

// bareEtcd starts a plain etcd on a unix socket, as the users of
// serviceHandleOf have, and returns a client of
// it.
func bareEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	dir := t.TempDir()
	cfg := embed.NewConfig()
	cfg.Name = "bare"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.UnsafeNoFsync = true
	sock, _ := url.Parse("unix://" + filepath.Join(dir, "etcd.sock"))
	cfg.ListenClientUrls = []url.URL{*sock}
	cfg.AdvertiseClientUrls = []url.URL{*sock}
	cfg.ListenClientHttpUrls = nil
	cfg.ListenMetricsUrls = nil
	port := uniquePort(t)
	peer, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", port))
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("bare etcd not ready")
	}
	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{sock.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// TestServiceHandleBareClient: a fake service around a bare client (the client
// backend) hands out working namespaced clients, with watches and leases
// of their own.
func TestServiceHandleBareClient(t *testing.T) {
	ctx := ctxTimeout(t, time.Minute)
	cl := bareEtcd(t)
	w := serviceHandleOf(t, cl).Watch()
	st, err := w.Get(ctx, FilterRunning)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	cur, k8s := namespacedClients(t, st)
	mustPut(t, ctx, cur, "key", "curator")
	if v, err := get(ctx, cl, curatorPrefix+"key"); err != nil || v != "curator" {
		t.Errorf("raw %skey = %q, %v", curatorPrefix, v, err)
	}
	if r, err := k8s.Get(ctx, "key"); err != nil || len(r.Kvs) != 0 {
		t.Errorf("kubernetes sees the curator's key: %v, %v", r, err)
	}
	l, err := cur.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cur.KeepAliveOnce(ctx, l.ID); err != nil {
		t.Errorf("keep-alive: %v", err)
	}
	head, _ := cur.Get(ctx, "w")
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	wch := cur.Watch(wctx, "w", clientv3.WithRev(head.Header.Revision+1))
	// Closing the other namespace's client ends none of this one's.
	k8s.Close()
	mustPut(t, ctx, cur, "w", "v")
	if wr := <-wch; len(wr.Events) != 1 {
		t.Errorf("watch: %+v, %v", wr.Events, wr.Err())
	}
	if ms, err := st.be.memberStatus(ctx); err != nil || ms.Header == nil {
		t.Errorf("member status: %v, %v", ms, err)
	}
}

// TestInProcessWatchersOfOneKey: namespaced watchers of the same key on
// the in-process backend each get the key once unprefixed. The watch
// server shares events between watchers, and the namespace wrapper strips
// its prefix in place: without a copy per stream the second watcher saw
// the key with the prefix removed twice.
func TestInProcessWatchersOfOneKey(t *testing.T) {
	ctx := ctxTimeout(t, time.Minute)
	a := newMember(t, "node-a")
	a.start(nil)
	st := a.running(time.Minute)
	var chans []clientv3.WatchChan
	head, err := st.be.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		cur, _ := namespacedClients(t, st)
		chans = append(chans, cur.Watch(ctx, "nodes/plinth-1", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(head.Header.Revision+1)))
	}
	cur, _ := namespacedClients(t, st)
	mustPut(t, ctx, cur, "nodes/plinth-1", "a")
	mustPut(t, ctx, cur, "nodes/plinth-1", "b")
	for i, ch := range chans {
		for n := 0; n < 2; {
			wr := <-ch
			if err := wr.Err(); err != nil {
				t.Fatal(err)
			}
			for _, ev := range wr.Events {
				n++
				if string(ev.Kv.Key) != "nodes/plinth-1" || (ev.PrevKv != nil && string(ev.PrevKv.Key) != "nodes/plinth-1") {
					t.Errorf("watcher %d: event for %q (previous %v)", i, ev.Kv.Key, ev.PrevKv)
				}
			}
		}
	}
}
