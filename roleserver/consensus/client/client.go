// Package client holds the namespaced etcd client handed out by the
// consensus service. It lives in its own package so that consumers of a
// namespace (the curator, the Kubernetes control plane) depend on a small
// interface instead of on the consensus service and embedded etcd.
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
	// client. It does not close the underlying connection, which is shared
	// and owned by the consensus service.
	Close() error
}

type namespaced struct {
	clientv3.KV
	clientv3.Watcher
	clientv3.Lease
}

// New wraps cl so that every key is relative to prefix. The prefix must not
// be empty: an empty prefix would hand out the whole keyspace.
//
// Every call creates its own Watcher and Lease on top of cl, because
// namespace.NewWatcher/NewLease forward Close to what they wrap: sharing
// cl.Watcher would let one consumer's Close cancel every other consumer's
// watches.
func New(cl *clientv3.Client, prefix string) (Namespaced, error) {
	if cl == nil {
		return nil, errors.New("client: nil etcd client")
	}
	if strings.TrimSpace(prefix) == "" {
		return nil, errors.New("client: empty namespace prefix")
	}
	return &namespaced{
		KV:      namespace.NewKV(cl.KV, prefix),
		Watcher: namespace.NewWatcher(clientv3.NewWatcher(cl), prefix),
		Lease:   namespace.NewLease(clientv3.NewLease(cl), prefix),
	}, nil
}

func (n *namespaced) Close() error {
	return errors.Join(n.Watcher.Close(), n.Lease.Close())
}
