package curator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/consensus/client"
	"plinth.dev/plinth/roleserver/rpc"
)

// leaderInfo is who leads, as read from /leader.
type leaderInfo struct {
	ID    string
	Port  int32
	Since time.Time // when that leader was elected
}

// term is one leadership of this curator. Its context ends when the
// leadership does. Writes of leader-only RPCs are guarded by the creation
// revision of /leader, so a curator that lost its lease without noticing
// yet can never write.
type term struct {
	ctx   context.Context
	rev   int64 // CreateRevision of /leader
	since time.Time
	kv    client.Namespaced
}

func (t *term) cmps() []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(keyLeader), "=", t.rev)}
}

// lost reports an error if the term is over (after a failed guarded
// transaction).
func (t *term) lost() error {
	if t.ctx.Err() != nil {
		return errNotLeader("not the leader any more (leadership lost during the call)")
	}
	resp, err := t.kv.Get(t.ctx, keyLeader)
	if err != nil {
		return etcdErr("checking leadership", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != t.rev {
		return errNotLeader("not the leader any more (leadership lost during the call)")
	}
	return nil
}

func errUnavailable(format string, args ...any) error {
	return status.Errorf(codes.Unavailable, format, args...)
}

// errNotLeader is the refusal of a leader-only call by a curator that
// does not lead (any more): UNAVAILABLE with reason NOT_LEADER, on which
// clients re-learn the leader (rpc.Resolver).
func errNotLeader(format string, args ...any) error {
	return rpc.Error(codes.Unavailable, clusterpb.ErrorReason_NOT_LEADER, format, args...)
}

// currentLeader is the leader as last seen, nil if unknown.
func (s *Service) currentLeader() *leaderInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leaderNow
}

// setLeader publishes who leads (nil: unknown).
func (s *Service) setLeader(li *leaderInfo) {
	s.mu.Lock()
	s.leaderNow = li
	s.mu.Unlock()
	s.leader.Set(li)
}

// leaderTerm returns this curator's term, or an Unavailable error naming
// the leader for a follower.
func (s *Service) leaderTerm() (*term, error) {
	s.mu.Lock()
	t := s.term
	s.mu.Unlock()
	if t != nil && t.ctx.Err() == nil {
		return t, nil
	}
	if li := s.currentLeader(); li != nil && li.ID != s.nodeID {
		return nil, errNotLeader("not the leader, leader is %s (curator port %d)", li.ID, li.Port)
	}
	return nil, errNotLeader("not the leader, and no leader is elected at the moment")
}

// elect takes part in leader election until ctx ends.
func (s *Service) elect(ctx context.Context, kv client.Namespaced, log *slog.Logger) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := s.electOnce(ctx, kv, log)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			backoff = 100 * time.Millisecond
			continue
		}
		log.Warn("leader election", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// electOnce tries to become leader once. It returns when this curator
// stops leading, or, as a follower, when the leadership key goes away.
func (s *Service) electOnce(ctx context.Context, kv client.Namespaced, log *slog.Logger) error {
	ttl := max(int64(math.Ceil(s.cfg.LeaderTTL.Seconds())), 1)
	lease, err := kv.Grant(ctx, ttl)
	if err != nil {
		return fmt.Errorf("granting lease: %w", err)
	}
	val, err := proto.Marshal(&clusterpb.GetCurrentLeaderResponse{Id: s.nodeID, Port: int32(s.cfg.AdvertisePort)})
	if err != nil {
		return err
	}
	since := time.Now()
	resp, err := kv.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(keyLeader), "=", 0)).
		Then(clientv3.OpPut(keyLeader, string(val), clientv3.WithLease(lease.ID)),
			clientv3.OpPut(keyLeaderSince, formatNanos(since.UnixNano()), clientv3.WithLease(lease.ID))).
		Else(clientv3.OpGet(keyLeader), clientv3.OpGet(keyLeaderSince)).
		Commit()
	if err != nil {
		revokeLease(kv, lease.ID)
		return fmt.Errorf("leadership transaction: %w", err)
	}
	if resp.Succeeded {
		return s.lead(ctx, kv, log, lease.ID, resp.Header.Revision, since)
	}
	revokeLease(kv, lease.ID)

	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil // gone meanwhile: try again
	}
	li, err := parseLeader(kvs[0].Value, resp.Responses[1].GetResponseRange().Kvs)
	if err != nil {
		return err
	}
	if li.ID == s.nodeID {
		// Our own leadership from before a restart: nobody keeps it alive
		// any more, so give it up now rather than wait for its TTL.
		log.Info("revoking this node's leadership lease left over from a previous run")
		if _, err := kv.Revoke(ctx, clientv3.LeaseID(kvs[0].Lease)); err != nil {
			return fmt.Errorf("revoking stale leadership: %w", err)
		}
		return nil
	}
	s.publishLeader(li, log)
	return s.follow(ctx, kv, resp.Header.Revision)
}

func parseLeader(v []byte, sinceKVs []*mvccpb.KeyValue) (*leaderInfo, error) {
	r := &clusterpb.GetCurrentLeaderResponse{}
	if err := proto.Unmarshal(v, r); err != nil || r.Id == "" {
		return nil, fmt.Errorf("corrupt leadership key: %v", err)
	}
	li := &leaderInfo{ID: r.Id, Port: r.Port}
	if len(sinceKVs) == 1 {
		li.Since = time.Unix(0, parseNanos(sinceKVs[0].Value))
	}
	return li, nil
}

func (s *Service) publishLeader(li *leaderInfo, log *slog.Logger) {
	if old := s.currentLeader(); old == nil || li == nil || old.ID != li.ID || old.Since != li.Since {
		if li != nil {
			log.Info("curator leader", "leader", li.ID, "this", li.ID == s.nodeID)
		}
		s.setLeader(li)
	}
}

// follow waits for the leadership key to be deleted (its lease expired or
// was revoked).
func (s *Service) follow(ctx context.Context, kv client.Namespaced, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range kv.Watch(wctx, keyLeader, clientv3.WithRev(rev+1)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watching leadership: %w", err)
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				s.setLeader(nil)
				return nil
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("leadership watch closed")
}

// lead holds the leadership until the lease is lost or ctx ends.
func (s *Service) lead(ctx context.Context, kv client.Namespaced, log *slog.Logger, lease clientv3.LeaseID, rev int64, since time.Time) error {
	tctx, cancel := context.WithCancel(ctx)
	t := &term{ctx: tctx, rev: rev, since: since, kv: kv}
	defer func() {
		s.mu.Lock()
		if s.term == t {
			s.term = nil
		}
		s.mu.Unlock()
		cancel()
		s.setLeader(nil)
		revokeLease(kv, lease)
		log.Info("no longer curator leader")
	}()
	ka, err := kv.KeepAlive(tctx, lease)
	if err != nil {
		return fmt.Errorf("keeping the leadership lease alive: %w", err)
	}
	s.hbMu.Lock()
	clear(s.hb)
	s.hbMu.Unlock()
	s.mu.Lock()
	s.term = t
	s.mu.Unlock()
	s.publishLeader(&leaderInfo{ID: s.nodeID, Port: int32(s.cfg.AdvertisePort), Since: since}, log)

	wch := kv.Watch(tctx, keyLeader, clientv3.WithRev(rev+1))
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-ka:
			if !ok {
				return errors.New("leadership lease lost")
			}
		case wr, ok := <-wch:
			if !ok {
				return errors.New("leadership watch closed")
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("watching leadership: %w", err)
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != rev {
					return errors.New("leadership key removed")
				}
			}
		}
	}
}

// revokeLease gives a lease up (best effort: it expires anyway).
func revokeLease(kv clientv3.Lease, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv.Revoke(ctx, id)
}
