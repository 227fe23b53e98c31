// Package client holds the namespaced etcd client handed out by the
// consensus service, and FollowKey, how its consumers follow one key
// across the service's compactions. It lives in its own package so that
// consumers of a namespace (the curator, the Kubernetes control plane)
// depend on a small interface instead of on the consensus service and
// embedded etcd.
package client

import (
	"errors"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
)

// Namespaced is an etcd client confined to one key prefix: keys passed in
// and returned are relative to the prefix, and nothing outside it can be
// read, written, watched or leased through it.
type Namespaced interface {
	clientv3.KV
	clientv3.Watcher
	clientv3.Lease

	// Close releases the watch streams and lease keep-alives of this
	// client. It does not close what the KV talks to, which is shared and
	// owned by the consensus service.
	Close() error
}

type namespaced struct {
	clientv3.KV
	clientv3.Watcher
	clientv3.Lease
}

// New confines kv, w and l to prefix: every key is relative to it. The
// prefix must not be empty: an empty prefix would hand out the whole
// keyspace.
//
// w and l become the returned client's own, and its Close closes them:
// they must not be shared with anybody else, because
// namespace.NewWatcher/NewLease forward Close to what they wrap, and a
// shared Watcher would let one consumer's Close cancel every other
// consumer's watches. kv is shared (it has no Close).
func New(kv clientv3.KV, w clientv3.Watcher, l clientv3.Lease, prefix string) (Namespaced, error) {
	if kv == nil || w == nil || l == nil {
		return nil, errors.New("client: nil etcd KV, Watcher or Lease")
	}
	if strings.TrimSpace(prefix) == "" {
		return nil, errors.New("client: empty namespace prefix")
	}
	return &namespaced{
		KV:      namespace.NewKV(kv, prefix),
		Watcher: namespace.NewWatcher(w, prefix),
		Lease:   namespace.NewLease(l, prefix),
	}, nil
}

func (n *namespaced) Close() error {
	return errors.Join(n.Watcher.Close(), n.Lease.Close())
}
