package rpc

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/identity"
)

// fakeCurator answers GetCurrentLeader with its current idea of the leader
// and every later change, and UpdateNodeStatus by counting.
type fakeCurator struct {
	clusterpb.UnimplementedCuratorServer
	name string
	addr string
	srv  *grpc.Server

	mu        sync.Mutex
	leader    *clusterpb.GetCurrentLeaderResponse
	changed   chan struct{}
	calls     int
	advertise string // host:port others are told to reach f at ("" = addr)
	notLeader bool   // UpdateNodeStatus answers NOT_LEADER
}

func newFakeCurator(t *testing.T, p *testPKI, name string) *fakeCurator {
	f := &fakeCurator{name: name, changed: make(chan struct{})}
	f.srv = NewServer(p.curator(), nil)
	clusterpb.RegisterCuratorServer(f.srv, f)
	f.addr = serve(t, f.srv)
	return f
}

func (f *fakeCurator) hostPort() (string, int32) {
	f.mu.Lock()
	addr := f.advertise
	f.mu.Unlock()
	if addr == "" {
		addr = f.addr
	}
	h, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return h, int32(n)
}

// setLeader makes f report l as the leader.
func (f *fakeCurator) setLeader(l *fakeCurator) {
	h, p := l.hostPort()
	f.mu.Lock()
	f.leader = &clusterpb.GetCurrentLeaderResponse{Id: l.name, Host: h, Port: p, ThisIsLeader: l == f}
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeCurator) GetCurrentLeader(_ *clusterpb.GetCurrentLeaderRequest, srv grpc.ServerStreamingServer[clusterpb.GetCurrentLeaderResponse]) error {
	var sent *clusterpb.GetCurrentLeaderResponse
	for {
		f.mu.Lock()
		l, ch := f.leader, f.changed
		f.mu.Unlock()
		if l != nil && l != sent {
			if err := srv.Send(l); err != nil {
				return err
			}
			sent = l
		}
		select {
		case <-ch:
		case <-srv.Context().Done():
			return srv.Context().Err()
		}
	}
}

func (f *fakeCurator) UpdateNodeStatus(context.Context, *clusterpb.UpdateNodeStatusRequest) (*clusterpb.UpdateNodeStatusResponse, error) {
	f.mu.Lock()
	f.calls++
	notLeader := f.notLeader
	f.mu.Unlock()
	if notLeader {
		return nil, Error(codes.Unavailable, clusterpb.ErrorReason_NOT_LEADER, "%s: not the leader", f.name)
	}
	return &clusterpb.UpdateNodeStatusResponse{}, nil
}

// servedBy calls UpdateNodeStatus until it is answered by want.
func servedBy(t *testing.T, conn *grpc.ClientConn, want *fakeCurator) {
	t.Helper()
	servedAt(t, conn, want, want.addr, 15*time.Second)
}

// servedAt calls UpdateNodeStatus until a call to addr succeeds.
func servedAt(t *testing.T, conn *grpc.ClientConn, want *fakeCurator, addr string, timeout time.Duration) {
	t.Helper()
	cl := clusterpb.NewCuratorClient(conn)
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		var p peer.Peer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := cl.UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{}, grpc.Peer(&p), grpc.WaitForReady(true))
		cancel()
		if err == nil && p.Addr != nil && p.Addr.String() == addr {
			return
		}
		if p.Addr != nil {
			last = p.Addr.String()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("calls never reached %s at %s (last answered by %s)", want.name, addr, last)
}

func waitLeader(t *testing.T, r *Resolver, want *fakeCurator) {
	t.Helper()
	waitLeaderAt(t, r, want, want.addr, 15*time.Second)
}

// waitLeaderAt waits until r names want at addr as the leader.
func waitLeaderAt(t *testing.T, r *Resolver, want *fakeCurator, wantAddr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if id, addr := r.Leader(); id == want.name && addr == wantAddr {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	id, addr := r.Leader()
	t.Fatalf("resolver leader is %s at %s, want %s at %s", id, addr, want.name, wantAddr)
}

func newTestResolver(t *testing.T, p *testPKI) *Resolver {
	node := p.node()
	r := NewResolver(slog.New(slog.DiscardHandler), func() credentials.TransportCredentials {
		return credentials.NewTLS(node.ClientTLSConfig(identity.ServerCurator))
	})
	r.retryMin, r.retryMax = 20*time.Millisecond, 100*time.Millisecond
	t.Cleanup(r.Close)
	return r
}

// TestResolverFollowsLeader: the connection goes to whoever the
// GetCurrentLeader stream names, and moves when the stream reports a
// change, without the caller doing anything.
func TestResolverFollowsLeader(t *testing.T) {
	p := newTestPKI(t)
	a := newFakeCurator(t, p, "node-a")
	b := newFakeCurator(t, p, "node-b")
	a.setLeader(a)
	b.setLeader(a)

	r := newTestResolver(t, p)
	// Only b is known: the resolver must learn about a from b.
	r.AddEndpoint(b.addr)
	conn, err := r.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	waitLeader(t, r, a)
	servedBy(t, conn, a)

	// Leadership moves to b; the stream (from b) says so.
	b.setLeader(b)
	a.setLeader(b)
	waitLeader(t, r, b)
	servedBy(t, conn, b)

	// And back.
	b.setLeader(a)
	waitLeader(t, r, a)
	servedBy(t, conn, a)

	// A second connection built later starts at the current leader.
	conn2, err := r.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	servedBy(t, conn2, a)
}

// TestResolverFailover: an endpoint that does not answer is skipped, and
// when the endpoint in use dies the resolver moves to the next one.
func TestResolverFailover(t *testing.T) {
	p := newTestPKI(t)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()

	a := newFakeCurator(t, p, "node-a")
	b := newFakeCurator(t, p, "node-b")
	a.setLeader(a)
	b.setLeader(a)

	r := newTestResolver(t, p)
	r.SetEndpoints([]string{deadAddr, a.addr})
	conn, err := r.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitLeader(t, r, a)
	servedBy(t, conn, a)

	// New endpoints can be added while running.
	r.AddEndpoint(b.addr)
	if eps := r.Endpoints(); len(eps) != 3 || eps[2] != b.addr {
		t.Fatalf("endpoints %v", eps)
	}
	// a dies; b takes over and is the only one left to tell.
	b.setLeader(b)
	stopFake(t, a)
	waitLeader(t, r, b)
	servedBy(t, conn, b)
}

func stopFake(t *testing.T, f *fakeCurator) {
	t.Helper()
	f.srv.Stop()
}
