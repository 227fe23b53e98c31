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

func (p *watchProxy) Watch(srv pb.Watch_WatchServer) error {
	ctx, cancel := context.WithCancel(srv.Context())
	defer cancel()
	w := namespace.NewWatcher(p.newWatcher(), p.prefix)
	// mu guards watches, next and closed. The receiving goroutine may
	// outlive this handler (Recv returns only when the client's stream
	// ends), and the namespaced watcher must not start a watch once
	// Close began (its WaitGroup would race): it starts them under mu
	// and only while !closed.
	var mu sync.Mutex
	closed := false
	defer func() {
		mu.Lock()
		closed = true
		mu.Unlock()
		w.Close()
	}()

	var sendMu sync.Mutex
	send := func(r *pb.WatchResponse) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return srv.Send(r)
	}
	watches := map[int64]context.CancelFunc{}
	next := int64(0)
	errc := make(chan error, 1)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
		cancel()
	}
	go func() {
		for {
			req, err := srv.Recv()
			if err != nil {
				fail(err)
				return
			}
			switch r := req.RequestUnion.(type) {
			case *pb.WatchRequest_CreateRequest:
				cr := r.CreateRequest
				if cr == nil {
					// Only a Go caller can send this (the wire has no
					// nil message); the interceptor's recover does not
					// reach this goroutine.
					continue
				}
				mu.Lock()
				if closed {
					mu.Unlock()
					return
				}
				id := cr.WatchId
				if id == clientv3.AutoWatchID {
					id = next
				}
				if _, dup := watches[id]; dup || id < 0 {
					// etcd refuses these too: a second watch under
					// one ID could never be cancelled.
					mu.Unlock()
					if err := send(&pb.WatchResponse{Header: &pb.ResponseHeader{}, WatchId: id, Created: true, Canceled: true, CancelReason: "watch ID in use or invalid"}); err != nil {
						fail(err)
						return
					}
					continue
				}
				next = max(next, id) + 1
				wctx, wcancel := context.WithCancel(ctx)
				watches[id] = wcancel
				// The handler returns only once ctx is done, so this
				// does not hold up its Close for long.
				ch := w.Watch(wctx, string(cr.Key), watchOptions(cr)...)
				mu.Unlock()
				go p.forward(id, ch, send, fail)
			case *pb.WatchRequest_CancelRequest:
				if r.CancelRequest == nil {
					continue
				}
				id := r.CancelRequest.WatchId
				mu.Lock()
				wcancel := watches[id]
				delete(watches, id)
				mu.Unlock()
				if wcancel != nil {
					wcancel()
				}
			case *pb.WatchRequest_ProgressRequest:
				if err := w.RequestProgress(ctx); err != nil {
					fail(err)
					return
				}
			}
		}
	}()
	<-ctx.Done()
	select {
	case err := <-errc:
		return err
	default:
		return ctx.Err()
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
