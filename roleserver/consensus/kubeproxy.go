package consensus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// The Kubernetes API server is a separate process that wants an etcd
// endpoint. Handing it the member's client socket would hand it the whole
// keyspace: the curator's keys, the cluster CA key, the unlock keys. So it
// gets an endpoint of its own that is confined to the /kubernetes/ prefix:
//
//	kube-apiserver ──unix socket──► ServeKubernetes (gRPC, in the core)
//	                                  KV, Watch   namespaced to /kubernetes/ (progress
//	                                              requests answered: the API server needs them)
//	                                  Lease       namespaced; revoke, keep-alive and
//	                                              time-to-live only for leases whose
//	                                              keys all lie in /kubernetes/
//	                                  Maintenance Status only (no Snapshot, Defragment,
//	                                              Alarm, MoveLeader, Hash…)
//	                                  nothing else (Cluster, Auth, Election, Lock)
//	                                       │
//	                                       ▼ a client of the member's own socket
//	                                     etcd
//
// Lease IDs are global in etcd, not keys: without the check, the API
// server could revoke the curator leader's lease and with it the
// leadership key.

// ServeKubernetes serves the /kubernetes/ namespace on a unix socket at
// path until ctx ends (the socket file is replaced if it exists).
func (s *Status) ServeKubernetes(ctx context.Context, path string) error {
	if !s.Running() {
		return errNotRunning
	}
	cl, err := clientv3.New(clientv3.Config{
		Endpoints: s.cl.Endpoints(),
		Context:   ctx,
		Logger:    zap.NewNop(),
	})
	if err != nil {
		return fmt.Errorf("consensus: client for the Kubernetes endpoint: %w", err)
	}
	defer cl.Close()
	raw := cl.Lease
	cl.KV = namespace.NewKV(cl.KV, kubernetesPrefix)
	cl.Lease = namespace.NewLease(cl.Lease, kubernetesPrefix)

	kv, _ := grpcproxy.NewKvProxy(cl)
	lease, _ := grpcproxy.NewLeaseProxy(ctx, cl)
	// The API server's etcd client pings every 30 s or so; a server with
	// gRPC's default policy would send it away for that.
	srv := grpc.NewServer(grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}))
	pb.RegisterKVServer(srv, kv)
	pb.RegisterWatchServer(srv, &watchProxy{cl: cl, prefix: kubernetesPrefix})
	pb.RegisterLeaseServer(srv, &confinedLease{LeaseServer: lease, raw: raw, prefix: kubernetesPrefix, granted: map[int64]bool{}})
	pb.RegisterMaintenanceServer(srv, statusOnly{m: grpcproxy.NewMaintenanceProxy(cl)})

	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("consensus: Kubernetes endpoint: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case <-ctx.Done():
		srv.Stop()
		<-errc
		return ctx.Err()
	case err := <-errc:
		return fmt.Errorf("consensus: Kubernetes endpoint: %w", err)
	}
}

// confinedLease lets a client use only leases that carry no key outside
// the namespace (and leases it granted itself, before a key is attached).
type confinedLease struct {
	pb.LeaseServer
	raw    clientv3.Lease // not namespaced: sees every key of a lease
	prefix string

	mu      sync.Mutex
	granted map[int64]bool
}

var errForeignLease = status.Error(codes.PermissionDenied, "lease belongs to another namespace")

func (l *confinedLease) check(ctx context.Context, id int64) error {
	l.mu.Lock()
	mine := l.granted[id]
	l.mu.Unlock()
	ttl, err := l.raw.TimeToLive(ctx, clientv3.LeaseID(id), clientv3.WithAttachedKeys())
	if err != nil {
		return err
	}
	if len(ttl.Keys) == 0 && !mine && ttl.TTL != -1 {
		// A live lease with no keys that this endpoint did not grant:
		// someone else's, just granted.
		return errForeignLease
	}
	for _, k := range ttl.Keys {
		if !strings.HasPrefix(string(k), l.prefix) {
			return errForeignLease
		}
	}
	return nil
}

func (l *confinedLease) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	resp, err := l.LeaseServer.LeaseGrant(ctx, r)
	if err == nil {
		l.mu.Lock()
		l.granted[resp.ID] = true
		l.mu.Unlock()
	}
	return resp, err
}

func (l *confinedLease) LeaseRevoke(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	if err := l.check(ctx, r.ID); err != nil {
		return nil, err
	}
	resp, err := l.LeaseServer.LeaseRevoke(ctx, r)
	if err == nil {
		l.mu.Lock()
		delete(l.granted, r.ID)
		l.mu.Unlock()
	}
	return resp, err
}

func (l *confinedLease) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	if err := l.check(ctx, r.ID); err != nil {
		return nil, err
	}
	return l.LeaseServer.LeaseTimeToLive(ctx, r)
}

func (l *confinedLease) LeaseLeases(context.Context, *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	return nil, status.Error(codes.PermissionDenied, "listing leases would show other namespaces' leases")
}

func (l *confinedLease) LeaseKeepAlive(srv pb.Lease_LeaseKeepAliveServer) error {
	return l.LeaseServer.LeaseKeepAlive(&checkedKeepAlive{Lease_LeaseKeepAliveServer: srv, l: l})
}

// checkedKeepAlive refuses keep-alives of leases the client may not use.
type checkedKeepAlive struct {
	pb.Lease_LeaseKeepAliveServer
	l *confinedLease
}

func (s *checkedKeepAlive) Recv() (*pb.LeaseKeepAliveRequest, error) {
	r, err := s.Lease_LeaseKeepAliveServer.Recv()
	if err != nil {
		return nil, err
	}
	if err := s.l.check(s.Context(), r.ID); err != nil {
		return nil, err
	}
	return r, nil
}

// statusOnly is the Maintenance service with Status alone: the others
// would snapshot, defragment or move the whole store.
type statusOnly struct {
	pb.UnimplementedMaintenanceServer
	m pb.MaintenanceServer
}

func (s statusOnly) Status(ctx context.Context, r *pb.StatusRequest) (*pb.StatusResponse, error) {
	return s.m.Status(ctx, r)
}
