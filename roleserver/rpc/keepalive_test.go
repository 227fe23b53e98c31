package rpc

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
)

// blackhole is a TCP proxy to a server that can be made to lose every
// packet from then on, the way a peer that lost power does: it stops
// forwarding in both directions and never closes anything (no FIN, no
// RST), and later connections are accepted and never answered.
type blackhole struct {
	addr   string
	target string
	dead   atomic.Bool

	mu    sync.Mutex
	conns []net.Conn
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{addr: lis.Addr().String(), target: target}
	t.Cleanup(func() {
		lis.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			b.keep(c)
			if b.dead.Load() {
				continue // held open, never answered
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				continue
			}
			b.keep(s)
			go b.pipe(c, s)
			go b.pipe(s, c)
		}
	}()
	return b
}

func (b *blackhole) keep(c net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.conns = append(b.conns, c)
}

// pipe copies from → to until the hole opens; from then on it reads and
// drops. It never closes either side: the end of one direction (e.g. the
// server giving up on its silent client) does not reach the other.
func (b *blackhole) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && !b.dead.Load() {
			if _, werr := to.Write(buf[:n]); werr != nil {
				io.Copy(io.Discard, from)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestKeepaliveDetectsVanishedLeader: the leader is reached through a
// proxy that turns into a black hole (the leader "loses power"). A stream
// that waits for answers on the leader connection fails by the keepalive
// although no FIN or RST ever arrives; the resolver's GetCurrentLeader
// stream to the same place fails the same way, it asks the other curator,
// and calls go to the new leader. Without keepalives both streams would
// wait forever: nothing is ever sent on them.
func TestKeepaliveDetectsVanishedLeader(t *testing.T) {
	p := newTestPKI(t)
	a := newFakeCurator(t, p, "node-a")
	b := newFakeCurator(t, p, "node-b")
	hole := newBlackhole(t, a.addr)
	a.mu.Lock()
	a.advertise = hole.addr // everybody reaches a through the proxy
	a.mu.Unlock()
	a.setLeader(a)
	b.setLeader(a)

	r := newTestResolver(t, p)
	r.SetEndpoints([]string{hole.addr, b.addr})
	conn, err := r.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitLeaderAt(t, r, a, hole.addr, 15*time.Second)
	servedAt(t, conn, a, hole.addr, 15*time.Second)

	// A long-lived stream on the leader connection that only receives,
	// like a node's Watch.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := clusterpb.NewCuratorClient(conn).GetCurrentLeader(ctx, &clusterpb.GetCurrentLeaderRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()

	// Power cut: a says nothing any more; b takes over.
	cut := time.Now()
	hole.dead.Store(true)
	b.setLeader(b)

	// Bounds are generous (a loaded machine); the keepalive needs
	// ClientTime + ClientTimeout.
	const bound = 45 * time.Second
	select {
	case err := <-ended:
		if status.Code(err) != codes.Unavailable {
			t.Errorf("stream to the vanished leader ended with %v, want UNAVAILABLE", err)
		}
		t.Logf("stream to the vanished leader failed after %v: %v", time.Since(cut).Round(100*time.Millisecond), err)
	case <-time.After(bound):
		t.Fatalf("stream to the vanished leader still open after %v", bound)
	}
	waitLeaderAt(t, r, b, b.addr, bound)
	servedBy(t, conn, b)
	t.Logf("calls reach the new leader %v after the cut", time.Since(cut).Round(100*time.Millisecond))
}

// TestResolverRechecksOnNotLeader: the curator the resolver follows keeps
// naming itself leader (its stream is stale), but refuses calls with
// NOT_LEADER. The refusal makes the resolver drop that stream and ask the
// next curator, which names the real leader.
func TestResolverRechecksOnNotLeader(t *testing.T) {
	p := newTestPKI(t)
	a := newFakeCurator(t, p, "node-a")
	b := newFakeCurator(t, p, "node-b")
	a.setLeader(a)
	b.setLeader(b)

	r := newTestResolver(t, p)
	r.SetEndpoints([]string{a.addr, b.addr})
	conn, err := r.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitLeader(t, r, a)
	servedBy(t, conn, a)

	a.mu.Lock()
	a.notLeader = true
	a.mu.Unlock()
	servedAt(t, conn, b, b.addr, 30*time.Second)
	waitLeader(t, r, b)
}
