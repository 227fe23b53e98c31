package testutil

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
)

// StartEtcd starts a bare one-member etcd with its data in dir (no
// fsync, peer on a free loopback port, clients on a unix socket in dir),
// for tests of code that takes a clientv3.KV (reach it in-process with
// v3client.New(e.Server)). The caller closes it.
func StartEtcd(dir string) (*embed.Etcd, error) {
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

// MainWithEtcd is a TestMain for a package whose tests share one
// StartEtcd member: it starts it in a temporary directory, hands use an
// in-process client, runs the tests and removes it all. It returns the
// exit code for os.Exit.
func MainWithEtcd(m *testing.M, use func(*clientv3.Client)) int {
	dir, err := os.MkdirTemp("", "etcd")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	e, err := StartEtcd(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting etcd:", err)
		return 1
	}
	defer e.Close()
	c := v3client.New(e.Server)
	defer c.Close()
	use(c)
	return m.Run()
}
