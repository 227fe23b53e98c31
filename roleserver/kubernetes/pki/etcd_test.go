package pki

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"

	"plinth.dev/plinth/roleserver/internal/testutil"
)

// The tests run against one real etcd, embedded in the test process and
// reached through an in-process client; each test gets its own key
// prefix, as the curator gets its namespace.
var (
	etcdClient *clientv3.Client
	prefixes   atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(testutil.MainWithEtcd(m, func(c *clientv3.Client) { etcdClient = c }))
}

// newKV is an empty etcd namespace, as the curator's is before anybody
// used the Kubernetes PKI.
func newKV(t *testing.T) clientv3.KV {
	t.Helper()
	return namespace.NewKV(etcdClient.KV, fmt.Sprintf("/test-%d/curator", prefixes.Add(1)))
}
