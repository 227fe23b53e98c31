package pki

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
)

// The tests run against one real etcd, embedded in the test process and
// reached through an in-process client; each test gets its own key
// prefix, as the curator gets its namespace.
var (
	etcdClient *clientv3.Client
	prefixes   atomic.Int64
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kpki")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	e, err := startEtcd(dir)
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "starting etcd:", err)
		os.Exit(1)
	}
	etcdClient = v3client.New(e.Server)
	code := m.Run()
	etcdClient.Close()
	e.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

func startEtcd(dir string) (*embed.Etcd, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	peer := url.URL{Scheme: "http", Host: l.Addr().String()}
	l.Close()
	client := url.URL{Scheme: "unix", Host: filepath.Join(dir, "client.sock")}
	cfg := embed.NewConfig()
	cfg.Name = "test"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.LogLevel = "fatal" // start errors are returned; shutdown is noisy
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, err
	case <-time.After(time.Minute):
		e.Close()
		return nil, fmt.Errorf("etcd not ready after a minute")
	}
}

// newKV is an empty etcd namespace, as the curator's is before anybody
// used the Kubernetes PKI.
func newKV(t *testing.T) clientv3.KV {
	t.Helper()
	return namespace.NewKV(etcdClient.KV, fmt.Sprintf("/test-%d/curator", prefixes.Add(1)))
}
