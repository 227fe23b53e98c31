package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"

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
// the leader's host:port. When the stream breaks (keepalive: a vanished
// peer is noticed within seconds), or does not answer within
// followAnswerTimeout, it moves on to the next endpoint.
//
// Users of a ClientConn from Dial need not do anything when the leader
// dies: a failed leader connection (gRPC asks for re-resolution), a call
// answered NOT_LEADER or UNAVAILABLE, and an explicit Recheck all make the
// resolver drop a GetCurrentLeader stream that runs to the leader itself
// and learn the leader afresh from another endpoint. A stream to another
// curator is kept: it reports the new leader the moment that curator sees
// it.
//
// It must be used with credentials that authenticate as a node or the
// owner (GetCurrentLeader needs READ_CLUSTER_STATUS).
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
	changedAt time.Time     // when the leader last changed

	// The GetCurrentLeader stream in use (see Recheck).
	follow followState

	wake   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	// retry bounds the pause after every endpoint failed in a row.
	retryMin, retryMax time.Duration
	// answerTimeout bounds the wait for a GetCurrentLeader stream's first
	// answer.
	answerTimeout time.Duration
}

// followState is the GetCurrentLeader stream in use, guarded by
// Resolver.mu.
type followState struct {
	ep       string
	cancel   context.CancelFunc // nil while no stream runs
	started  time.Time
	answered bool // at least one answer arrived
	onLeader bool // the endpoint is the leader (it said so, or its address is the leader's)
}

// followAnswerTimeout is how long a GetCurrentLeader stream may go without
// its first answer before the next endpoint is tried: a curator answers at
// once when it knows the leader.
const followAnswerTimeout = 10 * time.Second

// recheckMinAge keeps Recheck from dropping a stream that has only just
// started (failing calls ask again and again while the leader is gone).
const recheckMinAge = time.Second

// recheckGrace is how long after a leader change Recheck does nothing:
// what fails then are the calls and the connection of the old leader.
const recheckGrace = 3 * time.Second

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
		answerTimeout: followAnswerTimeout,
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

// LeaderChanged returns a channel that is closed when the leader changes
// next (for a caller that retries: a new leader is worth trying at once).
func (r *Resolver) LeaderChanged() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leaderSet
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

// Recheck asks the resolver to make sure it still follows the leader, for
// a caller whose call on the leader connection failed in a way that says
// the leader may be gone (no heartbeat answer, UNAVAILABLE, NOT_LEADER).
// If the GetCurrentLeader stream in use runs to the leader itself, it is
// dropped and the next endpoint is asked; a stream to another curator is
// kept, as it reports a new leader as soon as there is one (one that has
// not answered yet is left to followAnswerTimeout). Cheap; never blocks.
func (r *Resolver) Recheck() {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := &r.follow
	if f.cancel == nil || !f.answered || !f.onLeader || time.Since(f.started) < recheckMinAge || time.Since(r.changedAt) < recheckGrace {
		return
	}
	r.log.Info("resolver: leader connection failed, asking another curator", "dropping", f.ep)
	f.cancel()
	f.cancel = nil
}

// Dial makes a client connection to the curator leader, with the
// cluster's keepalives and interceptors that Recheck on calls failing
// with UNAVAILABLE or NOT_LEADER. opts come after the resolver's own
// (transport credentials from creds), so they may override them.
func (r *Resolver) Dial(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	o := []grpc.DialOption{
		grpc.WithResolvers(r),
		ClientKeepalive(),
		ClientConnectParams(),
		grpc.WithChainUnaryInterceptor(r.unaryRecheck),
		grpc.WithChainStreamInterceptor(r.streamRecheck),
	}
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

// ResolveNow is gRPC's signal that the connection to the address given
// failed or was lost.
func (c *ccResolver) ResolveNow(resolver.ResolveNowOptions) { c.r.Recheck() }

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
		}
		r.mu.Unlock()
		if ep == "" {
			select {
			case <-r.wake:
			case <-r.ctx.Done():
			}
			continue
		}
		got, err := r.followEndpoint(ep)
		if r.ctx.Err() != nil {
			return
		}
		// The next endpoint is the one after ep in the list as it is now
		// (it may have grown while ep was followed): never ep again right
		// away when there are others.
		r.mu.Lock()
		if i := slices.Index(r.endpoints, ep); i >= 0 {
			r.next = (i + 1) % len(r.endpoints)
		}
		n = len(r.endpoints)
		r.mu.Unlock()
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

// errNoAnswer ends a GetCurrentLeader stream that did not answer in time.
var errNoAnswer = errors.New("no answer to GetCurrentLeader in time")

// errRecheck ends a GetCurrentLeader stream dropped by Recheck.
var errRecheck = errors.New("dropped: the leader connection failed")

// followEndpoint streams GetCurrentLeader from ep until the stream fails,
// does not answer within answerTimeout, or Recheck drops it. got says
// whether at least one answer arrived.
func (r *Resolver) followEndpoint(ep string) (got bool, err error) {
	opts := []grpc.DialOption{ClientKeepalive(), ClientConnectParams()}
	if r.creds != nil {
		opts = append(opts, grpc.WithTransportCredentials(r.creds()))
	}
	conn, err := grpc.NewClient("passthrough:///"+ep, opts...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancelCause(r.ctx)
	defer cancel(nil)
	r.mu.Lock()
	r.follow = followState{ep: ep, cancel: func() { cancel(errRecheck) }, started: time.Now()}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.follow.cancel = nil
		r.mu.Unlock()
	}()
	first := time.AfterFunc(r.answerTimeout, func() { cancel(errNoAnswer) })
	defer first.Stop()
	stream, err := clusterpb.NewCuratorClient(conn).GetCurrentLeader(ctx, &clusterpb.GetCurrentLeaderRequest{})
	for err == nil {
		var resp *clusterpb.GetCurrentLeaderResponse
		if resp, err = stream.Recv(); err == nil {
			first.Stop()
			got = true
			r.setLeader(ep, resp)
		}
	}
	if c := context.Cause(ctx); c != nil && r.ctx.Err() == nil {
		err = c
	}
	return got, err
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
	if r.follow.ep == ep {
		r.follow.answered = true
		r.follow.onLeader = resp.GetThisIsLeader() || ep == addr
	}
	if addr == r.leader && resp.GetId() == r.leaderID {
		r.mu.Unlock()
		return
	}
	r.leader, r.leaderID = addr, resp.GetId()
	r.changedAt = time.Now()
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

// recheckOn reports whether a call's failure may mean the leader moved.
func recheckOn(err error) bool {
	return status.Code(err) == codes.Unavailable || Reason(err) == clusterpb.ErrorReason_NOT_LEADER
}

func (r *Resolver) unaryRecheck(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil && (recheckOn(err) || (status.Code(err) == codes.DeadlineExceeded && ctx.Err() != nil)) {
		r.Recheck()
	}
	return err
}

func (r *Resolver) streamRecheck(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		if recheckOn(err) {
			r.Recheck()
		}
		return nil, err
	}
	return &recheckStream{ClientStream: s, r: r}, nil
}

// recheckStream rechecks when a stream ends with UNAVAILABLE or NOT_LEADER.
type recheckStream struct {
	grpc.ClientStream
	r *Resolver
}

func (s *recheckStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil && recheckOn(err) {
		s.r.Recheck()
	}
	return err
}
