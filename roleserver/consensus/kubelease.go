package consensus

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// kubeLease is the Lease service of the Kubernetes endpoint. Lease IDs are
// global in etcd, so it lets a client use only leases it granted through
// this endpoint, or (after a restart of the endpoint, which forgets those)
// leases whose attached keys all lie in the namespace. Not etcd's
// grpcproxy lease proxy: that one needs a gRPC connection, which the
// in-process backend does not have.
type kubeLease struct {
	pb.UnimplementedLeaseServer
	raw    clientv3.Lease // the backend's: sees every key of a lease
	ns     clientv3.Lease // raw, namespaced
	prefix string
	now    func() time.Time

	mu sync.Mutex
	// granted maps the leases this endpoint granted to when it may
	// forget them: their last known expiry plus leaseGrace. Expired
	// entries are dropped (prune), so the map is no bigger than the set
	// of live leases.
	granted map[int64]time.Time
	// pruneAt is the size of granted at which a grant prunes first.
	pruneAt int
}

const (
	// leaseGrace is how long past its expiry as last seen here a lease
	// is still taken for this endpoint's: etcd extends every lease by
	// an election timeout when the leader changes.
	leaseGrace = time.Minute
	// leaseSweepInterval is how often ServeKubernetes prunes.
	leaseSweepInterval = time.Minute
	minPruneAt         = 1024
)

var (
	errForeignLease = status.Error(codes.PermissionDenied, "lease belongs to another namespace")
	errLeaseID      = status.Error(codes.InvalidArgument, "lease IDs are chosen by etcd: a chosen one could be the ID another namespace is about to get")
	errLeaseList    = status.Error(codes.PermissionDenied, "listing leases would show other namespaces' leases")
)

func newKubeLease(raw clientv3.Lease, prefix string) *kubeLease {
	return &kubeLease{
		raw:     raw,
		ns:      namespace.NewLease(raw, prefix),
		prefix:  prefix,
		now:     time.Now,
		granted: map[int64]time.Time{},
		pruneAt: minPruneAt,
	}
}

func (l *kubeLease) close() error { return l.raw.Close() }

// mine reports whether this endpoint granted id (and it has not expired).
func (l *kubeLease) mine(id int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	until, ok := l.granted[id]
	return ok && l.now().Before(until)
}

// remember records id as granted here, with ttl seconds to live.
func (l *kubeLease) remember(id, ttl int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.granted) >= l.pruneAt {
		l.pruneLocked()
		l.pruneAt = max(minPruneAt, 2*len(l.granted))
	}
	l.granted[id] = l.until(ttl)
}

// until is when a lease with ttl seconds left may be forgotten.
func (l *kubeLease) until(ttl int64) time.Time {
	// etcd's longest TTL (9e9 s) just fits a Duration; more would not.
	const maxTTL = int64(1) << 32
	return l.now().Add(time.Duration(min(ttl, maxTTL))*time.Second + leaseGrace)
}

// extend moves the expiry of a lease granted here after a keep-alive or
// time-to-live told its remaining ttl; a negative ttl (etcd: no such
// lease) or zero (keep-alive: no such lease) forgets it.
func (l *kubeLease) extend(id, ttl int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.granted[id]; !ok {
		return
	}
	if ttl <= 0 {
		delete(l.granted, id)
		return
	}
	l.granted[id] = l.until(ttl)
}

func (l *kubeLease) forget(id int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.granted, id)
}

func (l *kubeLease) prune() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pruneLocked()
}

func (l *kubeLease) pruneLocked() {
	now := l.now()
	for id, until := range l.granted {
		if !now.Before(until) {
			delete(l.granted, id)
		}
	}
}

// check decides whether the client may use lease id.
func (l *kubeLease) check(ctx context.Context, id int64) error {
	if l.mine(id) {
		return nil
	}
	ttl, err := l.raw.TimeToLive(ctx, clientv3.LeaseID(id), clientv3.WithAttachedKeys())
	if err != nil {
		return grpcError(err)
	}
	if ttl.TTL == -1 {
		// No such lease: etcd answers that itself.
		return nil
	}
	if len(ttl.Keys) == 0 {
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

// checkAttach is check for a lease a put attaches its key to (0: none).
// A key of the namespace on another namespace's lease would vanish with
// that namespace's lease, and keep it alive as a Kubernetes key.
func (l *kubeLease) checkAttach(ctx context.Context, id int64) error {
	if id == 0 {
		return nil
	}
	return l.check(ctx, id)
}

func (l *kubeLease) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	if r.ID != 0 {
		return nil, errLeaseID
	}
	resp, err := l.ns.Grant(ctx, r.TTL)
	if err != nil {
		return nil, grpcError(err)
	}
	l.remember(int64(resp.ID), resp.TTL)
	return &pb.LeaseGrantResponse{Header: resp.ResponseHeader, ID: int64(resp.ID), TTL: resp.TTL, Error: resp.Error}, nil
}

func (l *kubeLease) LeaseRevoke(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	if err := l.check(ctx, r.ID); err != nil {
		return nil, err
	}
	resp, err := l.ns.Revoke(ctx, clientv3.LeaseID(r.ID))
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			l.forget(r.ID)
		}
		return nil, grpcError(err)
	}
	l.forget(r.ID)
	return (*pb.LeaseRevokeResponse)(resp), nil
}

func (l *kubeLease) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	if err := l.check(ctx, r.ID); err != nil {
		return nil, err
	}
	var opts []clientv3.LeaseOption
	if r.Keys {
		opts = append(opts, clientv3.WithAttachedKeys())
	}
	resp, err := l.ns.TimeToLive(ctx, clientv3.LeaseID(r.ID), opts...)
	if err != nil {
		return nil, grpcError(err)
	}
	l.extend(r.ID, resp.TTL)
	return &pb.LeaseTimeToLiveResponse{Header: resp.ResponseHeader, ID: int64(resp.ID), TTL: resp.TTL, GrantedTTL: resp.GrantedTTL, Keys: resp.Keys}, nil
}

func (l *kubeLease) LeaseLeases(context.Context, *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	return nil, errLeaseList
}

// LeaseKeepAlive answers each request of the stream with one keep-alive:
// the client's stream sets the pace, as with etcd's own server.
func (l *kubeLease) LeaseKeepAlive(srv pb.Lease_LeaseKeepAliveServer) error {
	ctx := srv.Context()
	for {
		r, err := srv.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := l.check(ctx, r.ID); err != nil {
			return err
		}
		resp := &pb.LeaseKeepAliveResponse{Header: &pb.ResponseHeader{}, ID: r.ID}
		ka, err := l.ns.KeepAliveOnce(ctx, clientv3.LeaseID(r.ID))
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			// etcd's answer for a lease that is gone: TTL 0.
			l.forget(r.ID)
		case err != nil:
			return grpcError(err)
		default:
			resp.Header, resp.TTL = ka.ResponseHeader, ka.TTL
			l.extend(r.ID, ka.TTL)
		}
		if err := srv.Send(resp); err != nil {
			return err
		}
	}
}
