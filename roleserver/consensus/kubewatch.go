package consensus

import (
	"context"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
)

// watchProxy is the Watch service of the Kubernetes endpoint: each
// watch of a client stream is a watch of a namespaced client. Unlike
// etcd's gRPC proxy it answers progress requests, which the API server
// sends to read consistently from its watch cache (without them every
// list waits forever).
type watchProxy struct {
	pb.UnimplementedWatchServer
	// newWatcher returns a Watcher of the stream's own (backend).
	newWatcher func() clientv3.Watcher
	prefix     string
}

// Watch serves one client stream: a goroutine receives its requests
// (watchStream.receive) while the handler waits for the stream to end.
func (p *watchProxy) Watch(srv pb.Watch_WatchServer) error {
	ctx, cancel := context.WithCancel(srv.Context())
	defer cancel()
	s := &watchStream{
		p:       p,
		srv:     srv,
		w:       namespace.NewWatcher(p.newWatcher(), p.prefix),
		cancel:  cancel,
		watches: map[int64]context.CancelFunc{},
		errc:    make(chan error, 1),
	}
	defer s.close()
	go s.receive(ctx)
	<-ctx.Done()
	select {
	case err := <-s.errc:
		return err
	default:
		return ctx.Err()
	}
}

// watchStream is one client stream of watchProxy: its namespaced watcher
// and the watches it started, by ID.
//
// The receiving goroutine may outlive the handler (Recv returns only when
// the client's stream ends), and the namespaced watcher must not start a
// watch once Close began (its WaitGroup would race): watches start under
// mu and only while !closed.
type watchStream struct {
	p      *watchProxy
	srv    pb.Watch_WatchServer
	w      clientv3.Watcher
	cancel context.CancelFunc // ends the stream's context
	errc   chan error         // the first error, which the handler returns

	// mu guards watches, next and closed.
	mu      sync.Mutex
	watches map[int64]context.CancelFunc
	next    int64
	closed  bool

	sendMu sync.Mutex // one Send at a time
}

// close stops new watches, then closes the watcher and with it the
// watches it started.
func (s *watchStream) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.w.Close()
}

// send sends r; forward goroutines and receive send concurrently.
func (s *watchStream) send(r *pb.WatchResponse) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.srv.Send(r)
}

// fail ends the stream with err, unless it ends with another already.
func (s *watchStream) fail(err error) {
	select {
	case s.errc <- err:
	default:
	}
	s.cancel()
}

// receive handles the client's requests until its stream ends or a
// request fails.
func (s *watchStream) receive(ctx context.Context) {
	for {
		req, err := s.srv.Recv()
		if err != nil {
			s.fail(err)
			return
		}
		switch r := req.RequestUnion.(type) {
		case *pb.WatchRequest_CreateRequest:
			// A nil request only a Go caller can send (the wire has no
			// nil message); the interceptor's recover does not reach this
			// goroutine.
			if r.CreateRequest != nil && !s.create(ctx, r.CreateRequest) {
				return
			}
		case *pb.WatchRequest_CancelRequest:
			if r.CancelRequest != nil {
				s.cancelWatch(r.CancelRequest.WatchId)
			}
		case *pb.WatchRequest_ProgressRequest:
			if err := s.w.RequestProgress(ctx); err != nil {
				s.fail(err)
				return
			}
		}
	}
}

// create starts the watch cr asks for and forwards it to the client; it
// returns false when the stream is over (closing, or the refusal could
// not be sent).
func (s *watchStream) create(ctx context.Context, cr *pb.WatchCreateRequest) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	id := cr.WatchId
	if id == clientv3.AutoWatchID {
		id = s.next
	}
	if _, dup := s.watches[id]; dup || id < 0 {
		// etcd refuses these too: a second watch under one ID could never
		// be cancelled.
		s.mu.Unlock()
		if err := s.send(&pb.WatchResponse{Header: &pb.ResponseHeader{}, WatchId: id, Created: true, Canceled: true, CancelReason: "watch ID in use or invalid"}); err != nil {
			s.fail(err)
			return false
		}
		return true
	}
	s.next = max(s.next, id) + 1
	wctx, wcancel := context.WithCancel(ctx)
	s.watches[id] = wcancel
	// The handler returns only once ctx is done, so this does not hold
	// up its close for long.
	ch := s.w.Watch(wctx, string(cr.Key), watchOptions(cr)...)
	s.mu.Unlock()
	go s.p.forward(id, ch, s.send, s.fail)
	return true
}

// cancelWatch ends the watch the client started under id, if any.
func (s *watchStream) cancelWatch(id int64) {
	s.mu.Lock()
	wcancel := s.watches[id]
	delete(s.watches, id)
	s.mu.Unlock()
	if wcancel != nil {
		wcancel()
	}
}

// watchOptions turn a create request into client options. The created
// notification is asked for: its header is what the client's Created
// response carries.
func watchOptions(cr *pb.WatchCreateRequest) []clientv3.OpOption {
	opts := []clientv3.OpOption{clientv3.WithCreatedNotify()}
	if cr.StartRevision != 0 {
		opts = append(opts, clientv3.WithRev(cr.StartRevision))
	}
	switch {
	case len(cr.RangeEnd) == 1 && cr.RangeEnd[0] == 0:
		opts = append(opts, clientv3.WithFromKey())
	case len(cr.RangeEnd) > 0:
		opts = append(opts, clientv3.WithRange(string(cr.RangeEnd)))
	}
	if cr.PrevKv {
		opts = append(opts, clientv3.WithPrevKV())
	}
	if cr.ProgressNotify {
		opts = append(opts, clientv3.WithProgressNotify())
	}
	for _, f := range cr.Filters {
		switch f {
		case pb.WatchCreateRequest_NOPUT:
			opts = append(opts, clientv3.WithFilterPut())
		case pb.WatchCreateRequest_NODELETE:
			opts = append(opts, clientv3.WithFilterDelete())
		}
	}
	return opts
}

// forward sends one watch's responses to the client under its ID.
func (p *watchProxy) forward(id int64, ch clientv3.WatchChan, send func(*pb.WatchResponse) error, fail func(error)) {
	canceled := false
	for wr := range ch {
		hdr := wr.Header
		if hdr == nil {
			hdr = &pb.ResponseHeader{}
		}
		resp := &pb.WatchResponse{Header: hdr, WatchId: id, Created: wr.Created, CompactRevision: wr.CompactRevision}
		if wr.Canceled || wr.Err() != nil {
			resp.Canceled, canceled = true, true
			if wr.Err() != nil {
				resp.CancelReason = wr.Err().Error()
			}
		}
		resp.Events = make([]*mvccpb.Event, len(wr.Events))
		for i, e := range wr.Events {
			resp.Events[i] = (*mvccpb.Event)(e)
		}
		if err := send(resp); err != nil {
			fail(err)
			return
		}
		if canceled {
			return
		}
	}
	// The channel closed (the watch was cancelled by the client or the
	// stream ends): tell the client, as etcd does.
	_ = send(&pb.WatchResponse{Header: &pb.ResponseHeader{}, WatchId: id, Canceled: true})
}
