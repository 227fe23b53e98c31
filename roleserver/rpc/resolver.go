package rpc

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/resolver"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/layout"
)

// Scheme is the gRPC target scheme the Resolver serves.
const Scheme = "plinth-curator"

// Target is what Dial connects to: whichever curator is the leader.
const Target = Scheme + ":///leader"

// Resolver is a grpc resolver.Builder that follows the curator leader. It
// keeps one GetCurrentLeader stream open to one of its endpoints (any
// curator, leader or not) and points every ClientConn built through it at
// the leader's host:port. When the stream breaks it moves on to the next
// endpoint. It must be used with credentials that authenticate as a node
// or the owner (GetCurrentLeader needs READ_CLUSTER_STATUS).
type Resolver struct {
	log   *slog.Logger
	creds func() credentials.TransportCredentials

	mu        sync.Mutex
	endpoints []string
	next      int // index of the endpoint to try next
	leaderID  string
	leader    string // host:port, "" while unknown
	conns     map[*ccResolver]struct{}
	started   bool
	closed    bool
	leaderSet chan struct{} // closed and replaced whenever the leader changes

	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	// retry bounds the pause after every endpoint failed in a row.
	retryMin, retryMax time.Duration
}

// NewResolver makes a resolver; it starts following the leader with the
// first Dial. creds is called whenever it dials an endpoint.
func NewResolver(log *slog.Logger, creds func() credentials.TransportCredentials) *Resolver {
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Resolver{
		log: log, creds: creds,
		conns:     map[*ccResolver]struct{}{},
		leaderSet: make(chan struct{}),
		wake:      make(chan struct{}, 1),
		ctx:       ctx, cancel: cancel,
		done:     make(chan struct{}),
		retryMin: 200 * time.Millisecond, retryMax: 5 * time.Second,
	}
}

// AddEndpoint adds a curator host:port to try, if not known yet.
func (r *Resolver) AddEndpoint(hostport string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if hostport == "" || slices.Contains(r.endpoints, hostport) {
		return
	}
	r.endpoints = append(r.endpoints, hostport)
	r.poke()
}

// RemoveEndpoint forgets a host:port (e.g. the local curator once it is
// stopped). A stream open to it is kept until it fails.
func (r *Resolver) RemoveEndpoint(hostport string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endpoints = slices.DeleteFunc(r.endpoints, func(e string) bool { return e == hostport })
}

// SetEndpoints replaces the endpoints. The stream in use is kept even if
// its endpoint is no longer listed; the new list is used from the next
// failure on.
func (r *Resolver) SetEndpoints(hostports []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var eps []string
	for _, e := range hostports {
		if e != "" && !slices.Contains(eps, e) {
			eps = append(eps, e)
		}
	}
	if slices.Equal(eps, r.endpoints) {
		return
	}
	r.endpoints = eps
	r.next = 0
	r.poke()
}

// Endpoints returns the current endpoint list.
func (r *Resolver) Endpoints() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.endpoints)
}

// Leader returns the current leader's node ID and host:port ("" while
// unknown).
func (r *Resolver) Leader() (id, hostport string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leaderID, r.leader
}

// WaitLeader blocks until a leader is known or ctx ends.
func (r *Resolver) WaitLeader(ctx context.Context) (id, hostport string, err error) {
	for {
		r.mu.Lock()
		id, hp, ch := r.leaderID, r.leader, r.leaderSet
		r.mu.Unlock()
		if hp != "" {
			return id, hp, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return "", "", ctx.Err()
		}
	}
}

// poke wakes the follower loop; r.mu held or not, never blocks.
func (r *Resolver) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Dial makes a client connection to the curator leader. opts come after
// the resolver's own (transport credentials from creds), so they may
// override them.
func (r *Resolver) Dial(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	o := []grpc.DialOption{grpc.WithResolvers(r)}
	if r.creds != nil {
		o = append(o, grpc.WithTransportCredentials(r.creds()))
	}
	conn, err := grpc.NewClient(Target, append(o, opts...)...)
	if err != nil {
		return nil, err
	}
	// A new ClientConn only builds its resolver when it leaves idle mode;
	// follow the leader from now on so the first call finds it known.
	r.start()
	conn.Connect()
	return conn, nil
}

// start runs the follower loop once.
func (r *Resolver) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.started && !r.closed {
		r.started = true
		go r.run()
	}
}

// Close stops following the leader. Connections built from it keep their
// last address.
func (r *Resolver) Close() {
	r.mu.Lock()
	started := r.started
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	if started {
		<-r.done
	}
}

// Scheme implements resolver.Builder.
func (r *Resolver) Scheme() string { return Scheme }

// Build implements resolver.Builder.
func (r *Resolver) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	c := &ccResolver{r: r, cc: cc}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, fmt.Errorf("rpc: resolver closed")
	}
	r.conns[c] = struct{}{}
	leader, leaderID := r.leader, r.leaderID
	r.mu.Unlock()
	r.start()
	if leader != "" {
		c.update(leader, leaderID)
	}
	return c, nil
}

// ccResolver is the resolver.Resolver of one ClientConn.
type ccResolver struct {
	r  *Resolver
	cc resolver.ClientConn
}

// update points the connection at the leader. The leader's node ID goes
// in as the TLS server name, which identity.ClientTLSConfig checks against
// the server's certificate: whoever answers at that address must be that
// node, not merely some node of the cluster.
func (c *ccResolver) update(addr, id string) {
	// Errors only say the balancer did not like the update; the next one
	// will be tried anyway.
	_ = c.cc.UpdateState(resolver.State{Addresses: []resolver.Address{{Addr: addr, ServerName: id}}})
}

func (c *ccResolver) ResolveNow(resolver.ResolveNowOptions) {}

func (c *ccResolver) Close() {
	c.r.mu.Lock()
	delete(c.r.conns, c)
	c.r.mu.Unlock()
}

// run follows the leader until Close.
func (r *Resolver) run() {
	defer close(r.done)
	failures := 0
	backoff := r.retryMin
	// lastErr per endpoint: the same failure is logged once, not on
	// every retry.
	lastErr := map[string]string{}
	for r.ctx.Err() == nil {
		r.mu.Lock()
		var ep string
		n := len(r.endpoints)
		if n > 0 {
			r.next %= n
			ep = r.endpoints[r.next]
			r.next = (r.next + 1) % n
		}
		r.mu.Unlock()
		if ep == "" {
			select {
			case <-r.wake:
			case <-r.ctx.Done():
			}
			continue
		}
		got, err := r.follow(ep)
		if r.ctx.Err() != nil {
			return
		}
		if got {
			failures, backoff = 0, r.retryMin
			delete(lastErr, ep)
		}
		if msg := fmt.Sprint(err); lastErr[ep] != msg {
			if got {
				r.log.Warn("resolver: lost curator endpoint", "endpoint", ep, "err", err)
			} else {
				r.log.Warn("resolver: cannot reach curator endpoint", "endpoint", ep, "err", err)
			}
			lastErr[ep] = msg
		}
		failures++
		if failures >= max(n, 1) {
			// Every endpoint failed in a row: pause before going round again.
			failures = 0
			select {
			case <-time.After(backoff):
			case <-r.wake:
			case <-r.ctx.Done():
			}
			backoff = min(backoff*2, r.retryMax)
		}
	}
}

// follow streams GetCurrentLeader from ep until the stream fails. got says
// whether at least one answer arrived.
func (r *Resolver) follow(ep string) (got bool, err error) {
	var opts []grpc.DialOption
	if r.creds != nil {
		opts = append(opts, grpc.WithTransportCredentials(r.creds()))
	}
	conn, err := grpc.NewClient("passthrough:///"+ep, opts...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	stream, err := clusterpb.NewCuratorClient(conn).GetCurrentLeader(ctx, &clusterpb.GetCurrentLeaderRequest{})
	if err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, err
		}
		got = true
		r.setLeader(ep, resp)
	}
}

func (r *Resolver) setLeader(ep string, resp *clusterpb.GetCurrentLeaderResponse) {
	host, port := resp.GetHost(), int(resp.GetPort())
	if host == "" {
		if !resp.GetThisIsLeader() {
			r.log.Info("resolver: curator does not know the leader's address yet", "endpoint", ep, "leader", resp.GetId())
			return
		}
		host, _, _ = net.SplitHostPort(ep)
	}
	if port == 0 {
		port = layout.CuratorPort
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	r.mu.Lock()
	if addr == r.leader && resp.GetId() == r.leaderID {
		r.mu.Unlock()
		return
	}
	r.leader, r.leaderID = addr, resp.GetId()
	close(r.leaderSet)
	r.leaderSet = make(chan struct{})
	conns := make([]*ccResolver, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	r.log.Info("resolver: curator leader is "+resp.GetId(), "address", addr, "via", ep)
	for _, c := range conns {
		c.update(addr, resp.GetId())
	}
}
