package roleserver

// The cluster unlock key a consensus member keeps sealed locally: the
// Role Server decides, enrolment (which holds the node's sealed join
// state) does it.
//
//	controlplane ── keep, before etcd starts ──┐               ┌─► enrolment seals the join state
//	                (waits for the answer)     ├─► ClusterKey ─┤   again, with or without the key
//	rolefetch ───── drop (the curator's roles) ┘               └─◄ Done(err)
//
// Why a member keeps it: a registered node's volume key needs the cluster
// unlock key, which the curator hands out. If every consensus member
// needed a curator to open its volume, a cluster whose members all went
// down could never start again (each would wait for the others). Why the
// Role Server waits before etcd starts: a member must never run without
// the key sealed, or a cold start right after it became one could find
// it missing.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/event/memory"
)

// ClusterKeyRequest is one word of the Role Server on the locally sealed
// cluster unlock key (Service.ClusterKey). Whoever keeps the join state
// (enrolment.Service) answers each request it sees with Done.
type ClusterKeyRequest struct {
	// Keep: the node is a consensus member (or about to start etcd as
	// one): the key must be sealed locally. Otherwise the curator's roles
	// say it is no member (or it was decommissioned): the key goes.
	Keep bool

	once sync.Once
	done chan struct{}
	err  error
}

// Done answers the request: nil once the join state holds the key (Keep)
// or no longer does, or why it could not be sealed. Only the first answer
// counts.
func (r *ClusterKeyRequest) Done(err error) {
	r.once.Do(func() {
		r.err = err
		close(r.done)
	})
}

// wait returns the answer, once there is one.
func (r *ClusterKeyRequest) wait(ctx context.Context) error {
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// NonNilClusterKey skips the value ClusterKey has before any request.
var NonNilClusterKey = event.Filter(func(r *ClusterKeyRequest) bool { return r != nil })

// errSuperseded answers a request that a newer one replaced before it was
// answered: a watcher sees only the latest value, so nobody else would.
var errSuperseded = errors.New("a newer request replaced this one (the roles changed)")

// clusterKeyRequests publishes the requests in Service.ClusterKey.
type clusterKeyRequests struct {
	value *memory.Value[*ClusterKeyRequest]

	mu   sync.Mutex
	last *ClusterKeyRequest
}

// ask publishes a request; the one it replaces is answered with
// errSuperseded if it was not yet.
func (c *clusterKeyRequests) ask(keep bool) *ClusterKeyRequest {
	r := &ClusterKeyRequest{Keep: keep, done: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last != nil {
		c.last.Done(errSuperseded)
	}
	c.last = r
	c.value.Set(r)
	return r
}

// keep asks for the key to be sealed locally and waits until it is: the
// controlplane calls it before this node starts etcd as a member.
func (c *clusterKeyRequests) keep(ctx context.Context) error {
	if err := c.ask(true).wait(ctx); err != nil {
		return fmt.Errorf("sealing the cluster unlock key locally: %w", err)
	}
	return nil
}

// drop asks for the locally sealed key to go, on the curator's word
// alone (never on a guess from local files). Nobody waits: enrolment
// reports a failure, and the next drop tries again.
func (c *clusterKeyRequests) drop() { c.ask(false) }
