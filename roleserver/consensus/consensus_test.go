package consensus

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/consensus/client"
)

func mustPut(t *testing.T, ctx context.Context, kv clientv3.KV, k, v string) {
	t.Helper()
	if _, err := kv.Put(ctx, k, v); err != nil {
		t.Fatalf("put %s: %v", k, err)
	}
}

func get(ctx context.Context, kv clientv3.KV, k string, opts ...clientv3.OpOption) (string, error) {
	resp, err := kv.Get(ctx, k, opts...)
	if err != nil {
		return "", err
	}
	if len(resp.Kvs) != 1 {
		return "", fmt.Errorf("%s: %d values", k, len(resp.Kvs))
	}
	return string(resp.Kvs[0].Value), nil
}

func namespacedClients(t *testing.T, st *Status) (cur, k8s client.Namespaced) {
	t.Helper()
	cur, err := st.CuratorClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cur.Close() })
	k8s, err = st.KubernetesClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k8s.Close() })
	return cur, k8s
}

func TestBootstrapNamespaces(t *testing.T) {
	ctx := ctxTimeout(t, 2*time.Minute)
	a := newMember(t, "node-a")
	a.start(nil)
	st := a.running(time.Minute)
	if err := a.sup.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	cur, k8s := namespacedClients(t, st)

	mustPut(t, ctx, cur, "key", "curator")
	mustPut(t, ctx, k8s, "key", "kubernetes")
	if v, err := get(ctx, cur, "key"); err != nil || v != "curator" {
		t.Errorf("curator key = %q, %v", v, err)
	}
	if v, err := get(ctx, k8s, "key"); err != nil || v != "kubernetes" {
		t.Errorf("kubernetes key = %q, %v", v, err)
	}
	// Nothing outside its prefix is visible to a namespace, not even the
	// consensus service's own keys (the CA key among them).
	resp, err := cur.Get(ctx, "", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != "key" {
		t.Errorf("curator sees %v, %v; want only its own key", resp, err)
	}
	if _, err := k8s.Delete(ctx, "key"); err != nil {
		t.Fatal(err)
	}
	if v, err := get(ctx, cur, "key"); err != nil || v != "curator" {
		t.Errorf("kubernetes delete reached the curator's key: %q, %v", v, err)
	}
	if v, err := get(ctx, st.be, curatorPrefix+"key"); err != nil || v != "curator" {
		t.Errorf("raw %skey = %q, %v", curatorPrefix, v, err)
	}

	// Watches are confined too.
	// Watching from an explicit revision: a watch registers
	// asynchronously and would miss puts made right after Watch returns.
	head, err := cur.Get(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	wch := cur.Watch(wctx, "w", clientv3.WithRev(head.Header.Revision+1))
	mustPut(t, ctx, k8s, "w", "other")
	mustPut(t, ctx, cur, "w", "mine")
	select {
	case wr := <-wch:
		if len(wr.Events) != 1 || string(wr.Events[0].Kv.Value) != "mine" {
			t.Errorf("curator watch got %+v", wr.Events)
		}
	case <-wctx.Done():
		t.Fatal("no watch event")
	}
	// Closing one namespaced client leaves others working.
	k8s.Close()
	mustPut(t, ctx, cur, "after-close", "ok")

	ml, err := st.ClusterClient().MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ml.Members) != 1 || GetEtcdMemberNodeId(ml.Members[0]) != "node-a" || ml.Members[0].IsLearner ||
		ml.Members[0].PeerURLs[0] != "https://"+a.peerAddr() {
		t.Errorf("members: %+v", ml.Members)
	}
	// Nobody can reach the member from outside the process: its client
	// socket is unlinked, and dialling its path fails.
	sock := a.root.Ephemeral.Consensus.ClientSocket.Path()
	if fi, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("client socket %s: %v, %v; want it gone", sock, fi, err)
	}
	if err := dialEtcd(ctx, "unix://"+sock); err == nil {
		t.Error("a client reached the member through its socket path")
	}
	if !a.logged("logger=etcd") {
		t.Error("no etcd log entries in the log tree")
	}

	// A restart comes back from disk with the same data. The previous
	// run's Status is not running any more (its in-process clients are
	// closed): users must get the new one.
	old := st
	a.stop()
	a.start(nil)
	st = a.running(time.Minute)
	if old.Running() {
		t.Error("the previous run's Status is still running")
	}
	if err := old.ServeKubernetes(ctx, filepath.Join(t.TempDir(), "k8s.sock"), os.Getuid()); !errors.Is(err, errNotRunning) {
		t.Errorf("ServeKubernetes on the previous run's Status: %v", err)
	}
	cur, _ = namespacedClients(t, st)
	if v, err := get(ctx, cur, "key"); err != nil || v != "curator" {
		t.Errorf("after restart: %q, %v", v, err)
	}
}

// TestCluster grows a cluster to three members, restarts one, refuses an
// unsafe removal, removes one and checks that its certificate is dead.
func TestCluster(t *testing.T) {
	ctx := ctxTimeout(t, 3*time.Minute)
	a, b, c := newMember(t, "node-a"), newMember(t, "node-b"), newMember(t, "node-c")
	a.start(nil)
	stA := a.running(time.Minute)
	cl := stA.ClusterClient()

	memberOf := func(n *member) (isLearner bool, err error) {
		ml, err := cl.MemberList(ctx)
		if err != nil {
			return false, err
		}
		m := findMember(ml.Members, n.name, "https://"+n.peerAddr())
		if m == nil {
			return false, fmt.Errorf("%s not a member", n.name)
		}
		return m.IsLearner, nil
	}
	join := func(n *member) *JoinCluster {
		t.Helper()
		// etcd adds members only once the cluster has been connected for
		// a while (5s): retry like the curator would.
		var jc *JoinCluster
		eventually(t, 30*time.Second, "AddNode("+n.name+")", func() (err error) {
			jc, err = stA.AddNode(ctx, n.name, n.pub(), n.addOption())
			return err
		})
		if learner, err := memberOf(n); err != nil || !learner {
			t.Fatalf("%s after AddNode: learner %v, %v", n.name, learner, err)
		}
		again, err := stA.AddNode(ctx, n.name, n.pub(), n.addOption())
		if err != nil || again.NodeCertificate.SerialNumber.Cmp(jc.NodeCertificate.SerialNumber) != 0 ||
			len(again.ExistingNodes) != len(jc.ExistingNodes) {
			t.Fatalf("repeated AddNode(%s) = %+v, %v; want the same answer", n.name, again, err)
		}
		n.start(jc)
		n.running(time.Minute)
		eventually(t, time.Minute, n.name+" promoted", func() error {
			if learner, err := memberOf(n); err != nil || learner {
				return fmt.Errorf("learner %v, %v", learner, err)
			}
			return nil
		})
		return jc
	}
	jcB := join(b)
	_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	if _, err := stA.AddNode(ctx, b.name, otherKey.Public().(ed25519.PublicKey), b.addOption()); err == nil {
		t.Error("AddNode accepted a member's node ID with another key")
	}
	join(c)

	// Everybody sees everybody's writes.
	clients := map[*member]client.Namespaced{}
	for _, n := range []*member{a, b, c} {
		cur, _ := namespacedClients(t, n.running(time.Minute))
		clients[n] = cur
		mustPut(t, ctx, cur, "from-"+n.name, n.name)
	}
	for _, n := range []*member{a, b, c} {
		for _, from := range []*member{a, b, c} {
			if v, err := get(ctx, clients[n], "from-"+from.name); err != nil || v != from.name {
				t.Errorf("%s reads from-%s = %q, %v", n.name, from.name, v, err)
			}
		}
	}

	// B restarts from its data (the JoinCluster handed in again is stale
	// and ignored) and catches up on what happened meanwhile.
	b.stop()
	mustPut(t, ctx, clients[a], "while-b-down", "1")
	b.start(jcB)
	curB, _ := namespacedClients(t, b.running(time.Minute))
	eventually(t, time.Minute, "B catches up", func() error {
		if v, err := get(ctx, curB, "while-b-down", clientv3.WithSerializable()); err != nil || v != "1" {
			return fmt.Errorf("%q, %v", v, err)
		}
		return nil
	})

	// With C down, removing B would leave A alone with a dead member.
	c.stop()
	err := stA.RemoveNode(ctx, b.name)
	if err == nil {
		t.Fatal("unsafe RemoveNode(B) succeeded")
	}
	if !errors.Is(err, rpctypes.ErrUnhealthy) && !errors.Is(err, rpctypes.ErrMemberNotEnoughStarted) || !strings.Contains(err.Error(), "quorum") {
		t.Errorf("unsafe RemoveNode(B): %v; want a quorum refusal", err)
	}
	if _, err := memberOf(b); err != nil {
		t.Errorf("B after refused removal: %v", err)
	}

	// Removing the stopped C is safe; its certificate gets revoked.
	cCert, err := os.ReadFile(c.disk().certPath())
	if err != nil {
		t.Fatal(err)
	}
	certC, _ := pki.ParseCertificatePEM(cCert)
	eventually(t, 30*time.Second, "RemoveNode(C)", func() error { return stA.RemoveNode(ctx, c.name) })
	if _, err := memberOf(c); err == nil {
		t.Error("C still a member")
	}
	ca, err := stA.loadCA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []*member{a, b} {
		eventually(t, 30*time.Second, n.name+" CRL file", func() error {
			der, err := os.ReadFile(n.disk().crlPath())
			if err != nil {
				return err
			}
			crl, err := pki.ParseCRL(der, ca.Certificate)
			if err != nil {
				return err
			}
			if !crl.IsRevoked(certC.SerialNumber) {
				return errors.New("C not revoked")
			}
			return nil
		})
	}

	// At the TLS layer: B's credentials are welcome, C's revoked ones and
	// a certificate from another CA are not.
	bCert, _ := os.ReadFile(b.disk().certPath())
	certB, _ := pki.ParseCertificatePEM(bCert)
	if err := peerAccepts(a.peerAddr(), tlsCert(certB, b.priv), ca.Certificate); err != nil {
		t.Errorf("A refuses B: %v", err)
	}
	for _, n := range []*member{a, b} {
		if err := peerAccepts(n.peerAddr(), tlsCert(certC, c.priv), ca.Certificate); err == nil {
			t.Errorf("%s accepts C's revoked certificate", n.name)
		}
	}
	otherCA, _ := pki.NewCA("other", time.Hour)
	foreign, err := issueMemberCertificate(otherCA, "node-x", otherKey.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	if err := peerAccepts(a.peerAddr(), tlsCert(foreign, otherKey), ca.Certificate); err == nil {
		t.Error("A accepts a certificate from another CA")
	}
	eventually(t, 10*time.Second, "A logs the revoked certificate", func() error {
		if !a.logged("revoked") {
			return errors.New("not logged")
		}
		return nil
	})

	// C restarted with its data cannot get back in.
	c.start(nil)
	wctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	w := c.svc.Watch()
	_, err = w.Get(wctx, FilterRunning)
	w.Close()
	cancel()
	if err == nil {
		t.Error("removed C is running again")
	}
	c.stop()

	// The other two kept quorum.
	mustPut(t, ctx, clients[a], "after-removal", "ok")
	if v, err := get(ctx, curB, "after-removal"); err != nil || v != "ok" {
		t.Errorf("B after removal: %q, %v", v, err)
	}
	if err := stA.RemoveNode(ctx, c.name); err != nil {
		t.Errorf("repeated RemoveNode(C): %v", err)
	}
}

func TestBadJoin(t *testing.T) {
	ca, _ := pki.NewCA("test", time.Hour)
	crl, _ := ca.NewCRL()
	deadPort := uniquePort(t)
	peers := []ExistingNode{{Name: "node-a", URL: fmt.Sprintf("https://127.0.0.1:%d", deadPort)}}

	t.Run("foreign-certificate", func(t *testing.T) {
		x := newMember(t, "node-x")
		_, other, _ := ed25519.GenerateKey(rand.Reader)
		cert, _ := issueMemberCertificate(ca, "node-x", other.Public().(ed25519.PublicKey))
		x.start(&JoinCluster{CACertificate: ca.Certificate, NodeCertificate: cert, ExistingNodes: peers, InitialCRL: crl})
		if err := x.failure(30 * time.Second); !strings.Contains(err, "not for this node's key") {
			t.Errorf("error %q", err)
		}
		if x.disk().hasPKI() {
			t.Error("PKI written for a foreign JoinCluster")
		}
	})
	t.Run("unreachable-peers", func(t *testing.T) {
		y := newMember(t, "node-y")
		cert, _ := issueMemberCertificate(ca, "node-y", y.pub())
		y.start(&JoinCluster{CACertificate: ca.Certificate, NodeCertificate: cert, ExistingNodes: peers, InitialCRL: crl})
		if err := y.failure(60 * time.Second); !strings.Contains(err, "joining the cluster through") {
			t.Errorf("error %q", err)
		}
		y.stop()
		// Without JoinCluster, its certificates must not become a new
		// cluster of its own.
		y.start(nil)
		if err := y.failure(30 * time.Second); !strings.Contains(err, "refusing to bootstrap") {
			t.Errorf("error %q", err)
		}
	})
	t.Run("bad-config", func(t *testing.T) {
		z := newMember(t, "node-z")
		cfg := z.config(nil)
		cfg.NodeID = ""
		z.startConfig(cfg)
		if err := z.failure(30 * time.Second); !strings.Contains(err, "NodeID is empty") {
			t.Errorf("error %q", err)
		}
	})
}

func TestCorruptedDataDir(t *testing.T) {
	ctx := ctxTimeout(t, 2*time.Minute)
	a := newMember(t, "node-a")
	a.start(nil)
	cur, _ := namespacedClients(t, a.running(time.Minute))
	mustPut(t, ctx, cur, "precious", "data")
	cur.Close()
	a.stop()

	dataDir := a.root.Data.Etcd.Path()
	wals, _ := filepath.Glob(filepath.Join(a.disk().dataDir(), "member", "wal", "*.wal"))
	if len(wals) == 0 {
		t.Fatal("no WAL")
	}
	db := filepath.Join(a.disk().dataDir(), "member", "snap", "db")
	walBytes, err := os.ReadFile(wals[0])
	if err != nil {
		t.Fatal(err)
	}
	// Inside the record of the put above: a CRC mismatch mid-WAL, which
	// (unlike a torn tail) etcd must not silently truncate away.
	walOff := int64(bytes.Index(walBytes, []byte("precious")))
	if walOff < 0 {
		t.Fatal("put not found in WAL")
	}
	for _, tc := range []struct {
		name string
		path string
		off  int64
		n    int
	}{
		// Both bbolt meta pages: bbolt would fall back to a single good one.
		{"backend", db, 0, 8192},
		{"wal", wals[0], walOff, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig, err := os.ReadFile(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			bad := append([]byte(nil), orig...)
			for i := tc.off; i < tc.off+int64(tc.n); i++ {
				bad[i] ^= 0xa5
			}
			if err := os.WriteFile(tc.path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			defer os.WriteFile(tc.path, orig, 0o600)
			before := hashTree(t, dataDir)
			a.start(nil)
			if err := a.failure(30 * time.Second); !strings.Contains(err, "damaged data directory") {
				t.Errorf("error %q", err)
			}
			a.stop()
			if after := hashTree(t, dataDir); after != before {
				t.Error("data directory changed")
			}
		})
	}

	// Nothing was lost: repaired, the member starts with its data.
	a.start(nil)
	cur, _ = namespacedClients(t, a.running(time.Minute))
	if v, err := get(ctx, cur, "precious"); err != nil || v != "data" {
		t.Errorf("after repair: %q, %v", v, err)
	}
}

func TestGetEtcdMemberNodeId(t *testing.T) {
	for _, tc := range []struct {
		m    *etcdserverpb.Member
		want string
	}{
		{&etcdserverpb.Member{Name: "node-a", PeerURLs: []string{"https://10.0.0.1:7834"}}, "node-a"},
		// Not started yet: the name is only in the peer URL.
		{&etcdserverpb.Member{PeerURLs: []string{"https://node-b:7834"}}, "node-b"},
		{&etcdserverpb.Member{}, ""},
		{nil, ""},
	} {
		if got := GetEtcdMemberNodeId(tc.m); got != tc.want {
			t.Errorf("GetEtcdMemberNodeId(%v) = %q, want %q", tc.m, got, tc.want)
		}
	}
}
