package consensus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/v3/namespace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/platform/supervisor"
)

// The Kubernetes API server is a separate process that wants an etcd
// endpoint. The member itself has none (its clients are in-process), and
// the whole keyspace would be too much anyway: the curator's keys, the
// cluster CA key, the unlock keys. So the API server gets an endpoint of
// its own, confined to the /kubernetes/ prefix and to one peer UID:
//
//	kube-apiserver (uid peerUID)
//	   │ unix socket, owned by peerUID, 0600; SO_PEERCRED uid checked
//	   ▼ on every connection (peerUIDListener)
//	ServeKubernetes (gRPC, in the core; a handler's panic becomes
//	   │             codes.Internal, recoverUnary/recoverStream)
//	   │  KV          namespaced to /kubernetes/ (kubeKV): requests validated
//	   │              first (no empty or unknown txn op or compare); Compact
//	   │              refused (the consensus service compacts); a Put's lease
//	   │              must be one this endpoint may use
//	   │  Watch       namespaced (watchProxy); progress requests answered (the
//	   │              API server needs them)
//	   │  Lease       namespaced (kubeLease); no client-chosen IDs, no listing;
//	   │              revoke, keep-alive and time-to-live only for leases it
//	   │              granted or whose keys all lie in /kubernetes/
//	   │  Maintenance Status only (no Snapshot, Defragment, Alarm, MoveLeader…)
//	   │  nothing else (Cluster, Auth, Election, Lock)
//	   ▼ in-process backend (function calls)
//	 etcd
//
// Lease IDs are global in etcd, not keys: without the lease checks, the
// API server could revoke the curator leader's lease and with it the
// leadership key, or tie its own keys to it.

// ServeKubernetes serves the /kubernetes/ namespace on a unix socket at
// path until ctx ends or the member stops (the socket file is replaced if
// it exists). Only processes running as peerUID may connect: the socket
// is chowned to it with mode 0600, and connections from any other UID
// (root's included) are closed at once.
func (s *Status) ServeKubernetes(ctx context.Context, path string, peerUID int) error {
	if !s.Running() {
		return errNotRunning
	}
	log := supervisor.Logger(ctx)
	leases := newKubeLease(s.be.newLease(), kubernetesPrefix)
	defer leases.close()

	srv := grpc.NewServer(
		// The API server's etcd client pings every 30 s or so; a server
		// with gRPC's default policy would send it away for that.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(recoverUnary(log)),
		grpc.ChainStreamInterceptor(recoverStream(log)),
	)
	pb.RegisterKVServer(srv, &kubeKV{kv: namespace.NewKV(s.be.KV, kubernetesPrefix), leases: leases})
	pb.RegisterWatchServer(srv, &watchProxy{newWatcher: s.be.newWatcher, prefix: kubernetesPrefix})
	pb.RegisterLeaseServer(srv, leases)
	pb.RegisterMaintenanceServer(srv, statusOnly{status: s.be.memberStatus})

	lis, err := listenUnixFor(path, peerUID, log)
	if err != nil {
		return fmt.Errorf("consensus: Kubernetes endpoint: %w", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	sweep := time.NewTicker(leaseSweepInterval)
	defer sweep.Stop()
	for {
		select {
		case <-sweep.C:
			leases.prune()
		case <-ctx.Done():
			srv.Stop()
			<-errc
			return ctx.Err()
		case <-s.be.done:
			srv.Stop()
			<-errc
			return errors.New("consensus: Kubernetes endpoint: the member stopped")
		case err := <-errc:
			return fmt.Errorf("consensus: Kubernetes endpoint: %w", err)
		}
	}
}

// errHandlerPanic is what a client sees of a panic in a handler: the
// details are in the core's log, not for the client.
var errHandlerPanic = status.Error(codes.Internal, "internal error in the consensus service's Kubernetes endpoint")

// recoverUnary keeps a panic in a handler (ours, or etcd's code below it)
// from taking down the core, and with it the node's etcd member: a client
// must never be able to crash it.
func recoverUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in Kubernetes endpoint handler", "method", info.FullMethod, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				resp, err = nil, errHandlerPanic
			}
		}()
		return handler(ctx, req)
	}
}

// recoverStream is recoverUnary for streams. Goroutines a handler starts
// are not covered: they must not panic (watchProxy checks its input).
func recoverStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in Kubernetes endpoint handler", "method", info.FullMethod, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				err = errHandlerPanic
			}
		}()
		return handler(srv, ss)
	}
}

// statusOnly is the Maintenance service with Status alone: the others
// would snapshot, defragment or move the whole store.
type statusOnly struct {
	pb.UnimplementedMaintenanceServer
	status func(context.Context) (*pb.StatusResponse, error)
}

func (s statusOnly) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	resp, err := s.status(ctx)
	if err != nil {
		return nil, grpcError(err)
	}
	return resp, nil
}

// grpcError turns an error of the clientv3 API back into the gRPC status
// etcd itself would have answered. clientv3 turns statuses into
// rpctypes.EtcdError, which gRPC would send as codes.Unknown; the API
// server's client maps errors back by code and message (ErrCompacted,
// ErrFutureRev…), so both must survive.
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return status.Error(ee.Code(), ee.Error())
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Unknown, err.Error())
}
