package consensus

import (
	"context"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3rpc"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy/adapter"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// backend is how this package reaches etcd. On a node that is the member
// in this very process, through function calls: no socket anyone else
// could connect to (etcd's keyspace holds the cluster CA key and the
// unlock keys). Tests may build one on a real client instead
// (serviceHandleOf, in the tests).
//
// KV, Cluster and Maintenance are shared. Watchers and Leases are made
// per consumer: the namespaced wrappers forward Close to what they wrap,
// so a shared one would let one consumer's Close end everybody's watches
// and keep-alives. clientv3.NewWatcher/NewLease cannot make them, as they
// need a gRPC connection, which the in-process client does not have.
type backend struct {
	clientv3.KV
	clientv3.Cluster
	clientv3.Maintenance

	// newWatcher and newLease return a Watcher or Lease of the caller's
	// own, to be closed by it.
	newWatcher func() clientv3.Watcher
	newLease   func() clientv3.Lease
	// statusEndpoint is what Maintenance.Status is asked about (ignored
	// by the in-process client, which has only its own member).
	statusEndpoint string
	// done is closed once the backend is closed: whatever serves on top
	// of it (ServeKubernetes) has to stop then.
	done <-chan struct{}
	// closer closes what the backend owns (nothing for a client backend:
	// the client is the caller's).
	closer func() error
}

// newServerBackend talks to s in-process, as etcd's v3client does, with
// the same adapters for the extra Watchers and Leases.
func newServerBackend(s *etcdserver.EtcdServer) *backend {
	c := v3client.New(s)
	wc := copyingWatchClient{adapter.WatchServerToWatchClient(v3rpc.NewWatchServer(s))}
	lc := adapter.LeaseServerToLeaseClient(v3rpc.NewQuotaLeaseServer(s))
	return &backend{
		KV:          c.KV,
		Cluster:     c.Cluster,
		Maintenance: c.Maintenance,
		newWatcher: func() clientv3.Watcher {
			return blankWatcher{clientv3.NewWatchFromWatchClient(wc, c)}
		},
		newLease: func() clientv3.Lease {
			// One second means the default first keep-alive timeout,
			// as in v3client.
			return clientv3.NewLeaseFromLeaseClient(lc, c, time.Second)
		},
		done:   c.Ctx().Done(),
		closer: c.Close,
	}
}

func (b *backend) close() error { return b.closer() }

// closed reports whether b was closed (for a client backend: its client).
func (b *backend) closed() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// memberStatus is Maintenance.Status of the member behind b.
func (b *backend) memberStatus(ctx context.Context) (*pb.StatusResponse, error) {
	r, err := b.Maintenance.Status(ctx, b.statusEndpoint)
	return (*pb.StatusResponse)(r), err
}

// blankWatcher hides the watch context's String from the in-process
// watch server: it would print the context's values (x/net/trace data
// among them) while others write them, a data race. v3client does the
// same for its own Watcher.
type blankWatcher struct{ clientv3.Watcher }

func (w blankWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	return w.Watcher.Watch(blankContext{ctx}, key, opts...)
}

type blankContext struct{ context.Context }

func (blankContext) String() string { return "(blankCtx)" }

// copyingWatchClient gives every in-process watch stream responses of its
// own, as a gRPC connection does by unmarshalling. The watch server hands
// the same events to every watcher of a key, and namespace.NewWatcher
// strips its prefix from the keys in place: shared, one namespaced
// watcher's events would lose their prefix twice when another watched the
// same key, and race with it.
type copyingWatchClient struct{ pb.WatchClient }

func (c copyingWatchClient) Watch(ctx context.Context, opts ...grpc.CallOption) (pb.Watch_WatchClient, error) {
	s, err := c.WatchClient.Watch(ctx, opts...)
	if err != nil {
		return nil, err
	}
	return copyingWatchStream{s}, nil
}

type copyingWatchStream struct{ pb.Watch_WatchClient }

func (s copyingWatchStream) Recv() (*pb.WatchResponse, error) {
	r, err := s.Watch_WatchClient.Recv()
	if err != nil {
		return nil, err
	}
	return proto.Clone(r).(*pb.WatchResponse), nil
}
