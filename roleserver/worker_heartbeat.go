package roleserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/identity"
)

// heartbeatAnswerTimeout is how long the heartbeat worker waits for the
// curator's answer to a heartbeat. The curator answers every one; a
// stream that stays silent for two intervals runs to a leader that is
// gone (or hangs), however healthy its TCP connection may look.
const heartbeatAnswerTimeout = 2 * heartbeatInterval

// errNoHeartbeatAnswer ends a heartbeat stream whose answers stopped.
var errNoHeartbeatAnswer = fmt.Errorf("the curator leader did not answer a heartbeat within %v", heartbeatAnswerTimeout)

// workerHeartbeat keeps a Heartbeat stream to the curator leader, sending
// every curator.HeartbeatInterval. A stream whose answers stop is given up
// (heartbeatAnswerTimeout) and the resolver is told to re-check the
// leader, so that the node follows a new leader instead of talking to a
// dead one.
//
// It consumes the curator connection (and its credentials' trust, whose
// CRL number each heartbeat carries). It produces the heartbeats, the
// resolver's re-checks, and the cluster CRLs of the answers, handed to
// acceptCRL.
type workerHeartbeat struct {
	// input
	curator *memory.Value[*CuratorConnection]
	// output: acceptCRL installs a CRL from the curator leader in trust
	// and keeps it on /data (Service.acceptCRL).
	acceptCRL func(trust *identity.Trust, der []byte, log *slog.Logger) error
}

func (w *workerHeartbeat) run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	conn, err := wait(ctx, w.curator)
	if err != nil {
		return err
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	var b backoff
	for {
		err := w.heartbeat(ctx, conn, &b)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.Warn("lost the curator leader, reconnecting", "err", err)
		if errors.Is(err, errNoHeartbeatAnswer) {
			conn.Resolver.Recheck()
		}
		if err := retrySleep(ctx, conn, b.next()); err != nil {
			return err
		}
	}
}

func (w *workerHeartbeat) heartbeat(ctx context.Context, conn *CuratorConnection, b *backoff) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := conn.Curator().Heartbeat(ctx)
	if err != nil {
		return err
	}
	acks := make(chan error, 1)
	var trust *identity.Trust // nil: no CRL to keep (tests)
	if conn.Credentials != nil {
		trust = conn.Credentials.Trust
	}
	answered := make(chan struct{}, 1)
	go func() {
		first := true
		for {
			resp, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = errors.New("curator closed the heartbeat stream")
				}
				acks <- err
				return
			}
			select {
			case answered <- struct{}{}:
			default:
			}
			if first {
				leader, addr := conn.Resolver.Leader()
				supervisor.Logger(ctx).Info("connected to curator leader "+leader, "address", addr)
				first = false
				b.reset()
			}
			if len(resp.GetCrl()) > 0 && trust != nil {
				if err := w.acceptCRL(trust, resp.GetCrl(), supervisor.Logger(ctx)); err != nil {
					supervisor.Logger(ctx).Warn("cluster CRL", "err", err)
				}
			}
		}
	}()
	t := time.NewTicker(heartbeatInterval)
	defer t.Stop()
	// The next answer is due heartbeatAnswerTimeout after the last one
	// (or after the stream started).
	due := time.NewTimer(heartbeatAnswerTimeout)
	defer due.Stop()
	for {
		if err := stream.Send(&clusterpb.HeartbeatRequest{CrlNumber: trust.CRLNumber()}); err != nil {
			// The real reason comes from Recv.
			select {
			case err := <-acks:
				return err
			case <-time.After(time.Second):
				return err
			}
		}
	wait:
		for {
			select {
			case <-t.C:
				break wait
			case <-answered:
				due.Reset(heartbeatAnswerTimeout)
			case <-due.C:
				return errNoHeartbeatAnswer
			case err := <-acks:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}
